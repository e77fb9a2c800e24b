"""A private cluster with Kubernetes objects must have a way in (issue 19.5): the stack creates its VPC, so with
private nodes and no authorized network, or a private endpoint, nothing outside reaches the control plane and every
Kubernetes object fails after the cluster is created."""

from __future__ import annotations

import pytest
from conftest import DELETE, problems

FIX = "`pulumi config set --path cluster.fleet.enabled true`"


def test_h100_without_its_fleet_is_refused() -> None:
    (msg,) = problems("h100", {"cluster.fleet": DELETE})
    assert msg.startswith("cluster.authorizedNetworks: empty on a private cluster (privateNodes)")
    assert "workloads.smoke, ncclTests.bandwidth, mpiOperator.install and 1 more" in msg
    assert FIX in msg and "cluster.authorizedNetworks[0].cidr" in msg


def test_serve_without_its_fleet_is_refused() -> None:
    (msg,) = problems("serve", {"cluster.fleet.enabled": False})
    assert msg.startswith("cluster.authorizedNetworks:") and FIX in msg


def test_a_private_endpoint_needs_the_fleet() -> None:
    # prod lists an authorized network, but with a private endpoint that network cannot reach it from outside.
    (msg,) = problems("prod", {"cluster.fleet.enabled": False, "cluster.privateEndpoint": True})
    assert msg.startswith("cluster.privateEndpoint: the control plane has only a private address")
    assert FIX in msg and "cluster.privateEndpoint false" in msg


@pytest.mark.parametrize(("stack", "changes"), [
    ("prod", {"cluster.fleet.enabled": False}),  # an authorized network on the public endpoint
    ("prod", {"cluster.privateEndpoint": True}),  # the fleet
    ("dws", {}),  # an authorized network
    ("dev", {}),  # public nodes and endpoint
    ("h100", {"cluster.fleet": DELETE, "workloads": DELETE, "ncclTests": DELETE, "mpiOperator": DELETE,
              "nodePools[0].fabric": {"enabled": False}}),  # nothing inside the cluster
])
def test_a_way_in_or_nothing_to_reach(stack: str, changes: dict) -> None:
    assert [p for p in problems(stack, changes) if "reach" in p] == []
