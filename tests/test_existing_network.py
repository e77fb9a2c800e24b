"""`network.existing`: the cluster (and so every internal endpoint) in a VPC the stack does not create, your own or a
Shared VPC host project's (issue 42 item 5): the cluster takes its network, subnet and secondary ranges, the stack
creates no VPC, subnet, firewall rule or NAT; the paths' project and region are checked; what the owner must provide
is said."""

from __future__ import annotations

from conftest import changed, config_model, problems

from checks import warnings
from preview import engine

EXISTING = {"network.existing.network": "projects/host-project-1/global/networks/shared",
            "network.existing.subnetwork": "projects/host-project-1/regions/us-central1/subnetworks/gke-serving",
            "network.existing.podsRange": "gke-pods", "network.existing.servicesRange": "gke-services"}


def test_the_cluster_lands_in_the_existing_subnet() -> None:
    run = engine.run_program(*engine.engine_config_from_yaml(changed("serve", EXISTING)), stack="serve")
    cluster = run.one("gcp:container/cluster:Cluster").inputs
    assert cluster["network"] == "projects/host-project-1/global/networks/shared"
    assert cluster["subnetwork"] == "projects/host-project-1/regions/us-central1/subnetworks/gke-serving"
    assert cluster["ipAllocationPolicy"] == {"clusterSecondaryRangeName": "gke-pods",
                                             "servicesSecondaryRangeName": "gke-services"}
    made = {r.type for r in run.resources}
    assert not made & {"gcp:compute/network:Network", "gcp:compute/subnetwork:Subnetwork",
                       "gcp:compute/firewall:Firewall", "gcp:compute/routerNat:RouterNat"}


def test_project_and_region_are_checked() -> None:
    wrong = {"network.existing.subnetwork": "projects/other-project/regions/europe-west4/subnetworks/s"}
    found = problems("serve", {**EXISTING, **wrong})
    assert any(p.startswith("network.existing.subnetwork: is in project other-project, its network in "
                            "host-project-1") for p in found), found
    assert any(p.startswith("network.existing.subnetwork: is in region europe-west4, the stack in us-central1")
               for p in found), found
    assert any(p.startswith('network.existing.network: "shared" is not of the form projects/HOST_PROJECT/global/'
                            "networks/NAME") for p in problems("serve", {**EXISTING, "network.existing.network":
                                                                         "shared"}))


def test_what_the_owner_must_provide_is_said() -> None:
    found = warnings(config_model(changed("serve", EXISTING)))
    # serve's nodes are private: their NAT is the network owner's.
    assert any(w.startswith("network.existing: private nodes pull images and models through Cloud NAT") for w in found)
    assert not any(w.startswith("network.existing") for w in warnings(config_model(changed("serve", {}))))
