"""The firewall rules of the stack's VPC: what the cluster's nodes need inside it, nothing else in.

GKE adds its own rules (priority 1000) for what it runs; these make the VPC's intent explicit (checkov
CKV2_GCP_18: a network without explicit firewall rules) and deny every other ingress above GCE's implied rule.
"""

from __future__ import annotations

import msgspec
import pulumi_gcp as gcp

# GCE's implied deny-ingress sits at 65535; an explicit one just above it shows up in reviews and audits.
DENY_PRIORITY = 65534
ALLOW_PRIORITY = 1000
# The control plane of a private cluster reaches the nodes' kubelet (10250) and webhook/API-server-proxied
# services on 443; 9443 is the webhook port of controller-runtime operators such as Kueue, which GKE's own
# master rule does not open (GKE "Add firewall rules for specific use cases").
CONTROL_PLANE_PORTS = ["443", "10250", "9443"]


class Rule(msgspec.Struct, frozen=True):
    suffix: str
    description: str
    direction: str
    priority: int
    source_ranges: list[str]
    allows: list[gcp.compute.FirewallAllowArgs]
    denies: list[gcp.compute.FirewallDenyArgs]


def rules(subnet_cidr: str, pods_cidr: str, master_cidr: str | None) -> list[Rule]:
    """Node and pod ranges talk to each other on every port (NCCL picks its ports, the workers' sshd listens on
    2222, DNS, kubelet); a private cluster's control plane reaches the nodes; every other ingress is denied."""
    out = [Rule(
        "internal", "Nodes and pods of the cluster: NCCL (any TCP port), SSH to workers, DNS (deepspeed-stack)",
        "INGRESS", ALLOW_PRIORITY, [subnet_cidr, pods_cidr],
        [gcp.compute.FirewallAllowArgs(protocol="tcp"), gcp.compute.FirewallAllowArgs(protocol="udp"),
         gcp.compute.FirewallAllowArgs(protocol="icmp")], [])]
    if master_cidr:
        out.append(Rule(
            "control-plane", "The private control plane to kubelets and webhooks (deepspeed-stack)",
            "INGRESS", ALLOW_PRIORITY, [master_cidr],
            [gcp.compute.FirewallAllowArgs(protocol="tcp", ports=CONTROL_PLANE_PORTS)], []))
    out.append(Rule(
        "deny-ingress", "Everything else in is denied (deepspeed-stack)", "INGRESS", DENY_PRIORITY,
        ["0.0.0.0/0"], [], [gcp.compute.FirewallDenyArgs(protocol="all")]))
    return out
