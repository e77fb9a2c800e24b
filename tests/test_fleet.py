"""`cluster.fleet`: fleet registration through the cluster's own `fleet` setting, and the Connect Gateway
kubeconfig (a secret output, and what the Kubernetes provider uses) that reaches a private control plane."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import set_path, stack_yaml

from checks import ConfigError, load
from components.gke_cluster import connect_gateway_kubeconfig
from preview.engine import SECRET, RunResult, engine_config_from_yaml, run_program
from preview.mocks import StackMocks

CLUSTER = "gcp:container/cluster:Cluster"
PROVIDER = "pulumi:providers:kubernetes"
# gcloud's GetConnectGatewayServiceName (googlecloudsdk/command_lib/container/fleet/memberships/util.py): a
# membership in location L goes through https://L-connectgateway.googleapis.com; only `global` uses the bare host.
GATEWAY = "https://us-central1-connectgateway.googleapis.com/v1"
GLOBAL_GATEWAY = "https://connectgateway.googleapis.com/v1"
# Project numbers the test's mocks hand out: not what the code computes, what GCP would return.
NUMBERS = {"my-gcp-project": "123456789012", "fleet-host": "210987654321"}


class FleetMocks(StackMocks):
    """The preview's mocks, with known project numbers and a look at the values the program sends in plain
    text (the recorder only keeps "[secret]")."""

    def __init__(self) -> None:
        super().__init__("my-gcp-project", "us-central1")
        self.provider_kubeconfig: str | None = None
        self.projects_asked: list[str] = []

    def new_resource(self, args: Any) -> tuple[str | None, dict]:
        if args.typ == PROVIDER:
            value = args.inputs.get("kubeconfig")
            self.provider_kubeconfig = value.get("value") if isinstance(value, dict) else value
        return super().new_resource(args)

    def call(self, args: Any) -> dict:
        if args.token == "gcp:organizations/getProject:getProject":
            project = args.args.get("projectId")
            self.projects_asked.append(project)
            return {"projectId": project, "number": NUMBERS[project], "name": project}
        return super().call(args)


def run_prod_with_fleet(fleet: dict[str, Any]) -> tuple[RunResult, FleetMocks]:
    config = stack_yaml("prod")
    set_path(config, "cluster.fleet", fleet)
    engine_cfg, secret_keys = engine_config_from_yaml(config)
    mocks = FleetMocks()
    return run_program(engine_cfg, secret_keys, stack="prod", mocks=mocks), mocks


@pytest.fixture(scope="module")
def fleet_run() -> tuple[RunResult, FleetMocks]:
    return run_prod_with_fleet({"enabled": True})


def test_fleet_is_off_by_default(dev: RunResult) -> None:
    assert "fleet" not in dev.one(CLUSTER).inputs
    assert "connectGatewayKubeconfig" not in dev.outputs


def test_prod_reaches_its_private_control_plane_through_the_gateway(prod: RunResult) -> None:
    # The private prod cluster is deployed from CI, which only the Connect Gateway lets in.
    assert prod.one(CLUSTER).inputs["fleet"] == {"project": "my-gcp-project"}
    assert prod.outputs["connectGatewayKubeconfig"] == SECRET


def test_cluster_registers_itself_to_the_stack_project(fleet_run: tuple[RunResult, FleetMocks]) -> None:
    run, _ = fleet_run
    assert run.one(CLUSTER).inputs["fleet"] == {"project": "my-gcp-project"}
    assert run.by_type("gcp:gkehub/membership:Membership") == []  # the cluster-native setting, no extra resource


def test_connect_gateway_kubeconfig_is_a_secret_output_and_the_provider_uses_it(
        fleet_run: tuple[RunResult, FleetMocks]) -> None:
    run, mocks = fleet_run
    assert run.outputs["connectGatewayKubeconfig"] == SECRET
    provider = run.one(PROVIDER)
    assert provider.inputs["kubeconfig"] == SECRET and "kubeconfig" in provider.secret_paths
    doc = json.loads(mocks.provider_kubeconfig or "{}")
    # The membership GKE creates is named after the cluster, in the cluster's location (prod: us-central1).
    assert doc["clusters"][0]["cluster"] == {
        "server": f"{GATEWAY}/projects/123456789012/locations/us-central1/gkeMemberships/deepspeed-prod"}
    assert doc["users"][0]["user"]["exec"]["command"] == "gke-gcloud-auth-plugin"
    assert mocks.projects_asked == ["my-gcp-project"]


def test_fleet_host_project_can_differ() -> None:
    run, mocks = run_prod_with_fleet({"enabled": True, "project": "fleet-host"})
    assert run.one(CLUSTER).inputs["fleet"] == {"project": "fleet-host"}
    assert mocks.projects_asked == ["fleet-host"]
    server = json.loads(mocks.provider_kubeconfig or "{}")["clusters"][0]["cluster"]["server"]
    assert server == f"{GATEWAY}/projects/210987654321/locations/us-central1/gkeMemberships/deepspeed-prod"


def test_gateway_kubeconfig_holds_no_credential() -> None:
    doc = json.loads(connect_gateway_kubeconfig("42", "global", "c1"))
    assert doc["clusters"][0]["cluster"] == {
        "server": f"{GLOBAL_GATEWAY}/projects/42/locations/global/gkeMemberships/c1"}
    assert set(doc["users"][0]["user"]) == {"exec"}
    assert doc["current-context"] == doc["contexts"][0]["name"]


@pytest.mark.parametrize(("location", "server"), [
    ("global", "https://connectgateway.googleapis.com/v1/projects/42/locations/global/gkeMemberships/c1"),
    ("europe-west4", "https://europe-west4-connectgateway.googleapis.com/v1/projects/42/locations/europe-west4"
                     "/gkeMemberships/c1"),
])
def test_gateway_host_is_regional_unless_global(location: str, server: str) -> None:
    assert json.loads(connect_gateway_kubeconfig("42", location, "c1"))["clusters"][0]["cluster"]["server"] == server


@pytest.mark.parametrize(("fleet", "message"), [
    ({"enabled": "yes"}, 'cluster.fleet.enabled: expected boolean, got "yes"'),
    ({"enabled": True, "projet": "x"}, "cluster.fleet.projet: unknown key; did you mean `project`?"),
])
def test_fleet_config_errors(fleet: dict[str, Any], message: str) -> None:
    config = stack_yaml("prod")
    set_path(config, "cluster.fleet", fleet)
    engine_cfg, secret_keys = engine_config_from_yaml(config)
    with pytest.raises(ConfigError) as err:
        load(engine_cfg, set(secret_keys))
    assert message in err.value.problems
