"""The VPC policies: intranode visibility, flow logs on production subnets, no ingress open to the internet."""

from __future__ import annotations

import ipaddress

from pulumi_policy import ReportViolation, ResourceValidationArgs

from policy.rules_support import CLUSTER, is_prod, props_of, stack_name

SUBNETWORK = "gcp:compute/subnetwork:Subnetwork"
FIREWALL = "gcp:compute/firewall:Firewall"


def intranode_visibility(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """Pod-to-pod traffic on one node goes through the VPC, where flow logs and firewall rules see it
    (checkov CKV_GCP_61)."""
    if args.resource_type == CLUSTER and props_of(args).get("enableIntranodeVisibility") is not True:
        report("enableIntranodeVisibility must be true: same-node pod traffic would bypass flow logs and firewalls")


def subnet_flow_logs_on_prod(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """Production subnets keep a sample of their flows (checkov CKV_GCP_26)."""
    if args.resource_type == SUBNETWORK and is_prod(args) and not props_of(args).get("logConfig"):
        report(f"logConfig is unset on stack {stack_name(args)!r}: set network.flowLogs.enabled: true")


def firewall_ingress_not_open(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """No ingress rule allows anything from the whole internet (checkov CKV_GCP_2, CKV_GCP_3, CKV_GCP_88 and
    their siblings check this per port)."""
    props = props_of(args)
    if args.resource_type != FIREWALL or str(props.get("direction") or "INGRESS") != "INGRESS":
        return
    if not props.get("allows"):
        return
    for cidr in props.get("sourceRanges") or []:
        try:
            open_to_all = ipaddress.ip_network(str(cidr), strict=False).prefixlen == 0
        except ValueError:
            continue
        if open_to_all:
            report(f"sourceRanges has {cidr} on an allow rule: the internet could reach the nodes; list only "
                   "the ranges that need to")
