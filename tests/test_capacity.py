"""Pool capacity options (reservation, flex-start, queued provisioning, spot) as registered under mocks."""

from __future__ import annotations

import pytest
from conftest import stack_run

from model import capacity
from preview.engine import RunResult

NODE_POOL = "gcp:container/nodePool:NodePool"


@pytest.fixture(scope="module")
def dws() -> RunResult:
    return stack_run("dws")


def test_capacity_facts_pinned() -> None:
    facts = capacity.load()
    # cloud.google.com/kubernetes-engine/docs/concepts/dws: flex-start from 1.32.2-gke.1652000, 7 days at most.
    assert facts.flex_start_min_gke == "1.32.2-gke.1652000"
    assert facts.flex_start_max_run_seconds == 7 * 24 * 3600
    # GKE's queued-provisioning taint and ProvisioningRequest class (FACTS.md section 2 and 3, CT dws example).
    assert facts.queued_taint == "cloud.google.com/gke-queued"
    assert facts.provisioning_class == "queued-provisioning.gke.io"
    assert facts.kueue_manifest_url == (
        "https://github.com/kubernetes-sigs/kueue/releases/download/v0.19.2/manifests.yaml")
    assert facts.order == ("reservation", "dws", "on-demand", "spot")


def test_gke_version_parsing() -> None:
    assert capacity.gke_version("1.32.2-gke.1652000") == (1, 32, 2, 1652000)
    assert capacity.gke_version("1.33") == (1, 33, 0, 0)
    assert capacity.gke_version("1.32.2-gke.1651999") < capacity.gke_version("1.32.2-gke.1652000")
    assert capacity.gke_version("latest") is None


def test_reservation_pool_consumes_its_specific_reservation(dws: RunResult) -> None:
    pool = dws.one(NODE_POOL, "h100-reserved").inputs
    assert pool["nodeConfig"]["reservationAffinity"] == {
        "consumeReservationType": "SPECIFIC_RESERVATION", "key": "compute.googleapis.com/reservation-name",
        "values": ["h100-reservation"]}
    assert pool["nodeLocations"] == ["us-central1-a"]
    assert pool["management"] == {"autoRepair": True, "autoUpgrade": True}
    assert "flexStart" not in pool["nodeConfig"] and "queuedProvisioning" not in pool
    assert pool["autoscaling"]["locationPolicy"] == "BALANCED"


def test_queued_provisioning_pool(dws: RunResult) -> None:
    pool = dws.one(NODE_POOL, "h100-dws").inputs
    node = pool["nodeConfig"]
    assert pool["queuedProvisioning"] == {"enabled": True}
    assert node["flexStart"] is True
    assert node["maxRunDuration"] == "86400s"
    assert node["reservationAffinity"] == {"consumeReservationType": "NO_RESERVATION"}
    assert node["spot"] is False
    assert pool["management"] == {"autoRepair": False, "autoUpgrade": True}
    assert pool["autoscaling"] == {"totalMinNodeCount": 0, "totalMaxNodeCount": 4, "locationPolicy": "ANY"}


def test_cluster_min_master_version(dws: RunResult) -> None:
    assert dws.one("gcp:container/cluster:Cluster").inputs["minMasterVersion"] == "1.33"


def test_plain_pools_keep_their_fields(dev: RunResult) -> None:
    # Nothing new on an existing spot pool: a new node_config field would replace it.
    pool = dev.one(NODE_POOL, "t4").inputs
    assert {"reservationAffinity", "flexStart", "maxRunDuration"}.isdisjoint(pool["nodeConfig"])
    assert "queuedProvisioning" not in pool
