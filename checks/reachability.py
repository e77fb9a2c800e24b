"""A private cluster the deployer cannot reach must not get Kubernetes objects: one named rule.

`pulumi up` creates the cluster, then every Kubernetes object through the cluster's endpoint, from wherever
`pulumi up` runs (a laptop, a CI runner). The stack creates the VPC itself, so nothing is inside it yet. With
`privateNodes` the stack turns master authorized networks on (components/gke_cluster.py): an empty
`authorizedNetworks` admits only the VPC, and with `privateEndpoint` the endpoint has no public address at all.
Such a stack would create its GCP resources and then fail on every Kubernetes object. A way in is one of:
- the fleet's Connect Gateway (`cluster.fleet.enabled`): reachable from anywhere with IAM, the provider uses it;
- a public endpoint whose authorized networks list the deployer's network (`cluster.authorizedNetworks`);
- public nodes and endpoint (dev stacks only: the policy pack requires private nodes elsewhere).
"""

from __future__ import annotations

from checks.common import Check
from model.fabric import fabric_sets
from model.problems import Problem
from model.types import StackConfig

FLEET_FIX = ("`pulumi config set --path cluster.fleet.enabled true` (the Connect Gateway: reachable with IAM from "
             "anywhere)")
NETWORK_FIX = ("list the deployer's network in cluster.authorizedNetworks (`pulumi config set --path "
               "'cluster.authorizedNetworks[0].cidr' 203.0.113.0/24`, your own range)")


def kubernetes_objects(m: StackConfig) -> list[str]:
    """The config keys that make the stack create objects inside the cluster, for the message."""
    found = [f"workloads.{name}" for name in m.workloads]
    found += [f"ncclTests.{name}" for name in m.nccl_tests]
    found += [key for key, on in (("mpiOperator.install", m.mpi_operator.install),
                                  ("nfsProvisioner.install", m.nfs_provisioner.install),
                                  ("kueue.install", m.kueue.install)) if on]
    if fabric_sets(m):
        found.append("a GPU fabric's networks and installers (nodePools[].fabric)")
    return found


def _named(objects: list[str]) -> str:
    more = len(objects) - 3
    return ", ".join(objects[:3]) + (f" and {more} more" if more > 0 else "")


def check_cluster_reachable(m: StackConfig) -> list[Problem]:
    c = m.cluster
    if c is None or c.fleet.enabled or not c.private_nodes:
        return []
    objects = kubernetes_objects(m)
    if not objects:
        return []
    what = (f"the stack creates Kubernetes objects in it ({_named(objects)}), and `pulumi up`"
            " would create the cluster and then fail on each of them")
    if c.private_endpoint:
        return [Problem("cluster.privateEndpoint", f"the control plane has only a private address in the VPC the stack "
                f"creates, so nothing outside that VPC reaches it, but {what}. Set {FLEET_FIX}, or "
                "`pulumi config set --path cluster.privateEndpoint false` and " + NETWORK_FIX)]
    if not c.authorized_networks:
        return [Problem("cluster.authorizedNetworks",
                        f"empty on a private cluster (privateNodes), so only the VPC the stack "
                        f"creates may reach the control plane, but {what}. Set {FLEET_FIX}, or {NETWORK_FIX}")]
    return []


CHECKS: list[Check] = [check_cluster_reachable]
