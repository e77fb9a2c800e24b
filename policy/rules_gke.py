"""The GKE policies: a private, hardened cluster and node pools (Workload Identity, shielded COS nodes, a
least-privilege node service account, a release channel, auto-repair and auto-upgrade)."""

from __future__ import annotations

import ipaddress
import re

from pulumi_policy import ReportViolation, ResourceValidationArgs

from policy.rules_support import (
    CLUSTER,
    NODE_POOL,
    get,
    hardened_node_configs,
    is_dev,
    is_prod,
    node_configs,
    props_of,
    stack_name,
)

RELEASE_CHANNELS = ("RAPID", "REGULAR", "STABLE", "EXTENDED")
DEFAULT_COMPUTE_SA = re.compile(r"-compute@developer\.gserviceaccount\.com$")


def private_nodes(args: ResourceValidationArgs, report: ReportViolation) -> None:
    props = props_of(args)
    if args.resource_type != CLUSTER or is_dev(args):
        return
    if get(props, "privateClusterConfig.enablePrivateNodes") is not True:
        report(f"privateClusterConfig.enablePrivateNodes must be true on stack {stack_name(args)!r} "
               "(only dev stacks may have nodes with public IPs); set cluster.privateNodes: true")


def authorized_networks_not_open(args: ResourceValidationArgs, report: ReportViolation) -> None:
    props = props_of(args)
    if args.resource_type != CLUSTER:
        return
    for i, block in enumerate(get(props, "masterAuthorizedNetworksConfig.cidrBlocks") or []):
        cidr = str(block.get("cidrBlock", ""))
        try:
            open_to_all = ipaddress.ip_network(cidr, strict=False).prefixlen == 0
        except ValueError:
            continue
        if open_to_all:
            report(f"masterAuthorizedNetworksConfig.cidrBlocks[{i}].cidrBlock is {cidr}: the control plane would "
                   "be open to the whole internet; list only your networks")


def workload_identity(args: ResourceValidationArgs, report: ReportViolation) -> None:
    props = props_of(args)
    if args.resource_type == CLUSTER:
        pool = get(props, "workloadIdentityConfig.workloadPool")
        if not pool or not str(pool).endswith(".svc.id.goog"):
            report(f"workloadIdentityConfig.workloadPool must be PROJECT.svc.id.goog, got {pool!r}")
    for path, node in hardened_node_configs(args, props):
        mode = get(node, "workloadMetadataConfig.mode")
        if mode not in (None, "GKE_METADATA"):
            report(f"{path}.workloadMetadataConfig.mode is {mode}: pods would see the node's credentials; "
                   "use GKE_METADATA")


def shielded_nodes(args: ResourceValidationArgs, report: ReportViolation) -> None:
    props = props_of(args)
    if args.resource_type == CLUSTER and props.get("enableShieldedNodes") is False:
        report("enableShieldedNodes is false")
    for path, node in hardened_node_configs(args, props):
        shielded = node.get("shieldedInstanceConfig") or {}
        for key in ("enableSecureBoot", "enableIntegrityMonitoring"):
            if shielded.get(key) is not True:
                report(f"{path}.shieldedInstanceConfig.{key} must be true")


def node_service_account(args: ResourceValidationArgs, report: ReportViolation) -> None:
    props = props_of(args)
    # The default pool's account matters even when the pool is removed right after creation.
    configs = list(node_configs(args, props))
    if args.resource_type == CLUSTER and props.get("removeDefaultNodePool"):
        configs.append(("nodeConfig", props.get("nodeConfig") or {}))
    for path, node in configs:
        account = node.get("serviceAccount")
        if not account or account == "default" or DEFAULT_COMPUTE_SA.search(str(account)):
            report(f"{path}.serviceAccount is {account or 'unset (the Compute Engine default account)'}: "
                   "nodes must run as a dedicated least-privilege service account")


def release_channel(args: ResourceValidationArgs, report: ReportViolation) -> None:
    props = props_of(args)
    if args.resource_type != CLUSTER:
        return
    channel = get(props, "releaseChannel.channel")
    if channel not in RELEASE_CHANNELS:
        report(f"releaseChannel.channel is {channel or 'unset'}; use one of {', '.join(RELEASE_CHANNELS)}")


def auto_repair_upgrade(args: ResourceValidationArgs, report: ReportViolation) -> None:
    props = props_of(args)
    if args.resource_type != NODE_POOL:
        return
    # GKE requires auto-repair off on Dynamic Workload Scheduler pools (flex-start, queued provisioning):
    # the waiver is GKE's own rule (cloud.google.com/kubernetes-engine/docs/concepts/dws; data/capacity.yaml).
    dws = get(props, "nodeConfig.flexStart") is True or get(props, "queuedProvisioning.enabled") is True
    for key in ("autoUpgrade",) if dws else ("autoRepair", "autoUpgrade"):
        if get(props, f"management.{key}") is not True:
            report(f"management.{key} must be true")
    if dws and get(props, "management.autoRepair") is not False:
        report("management.autoRepair must be false on a flex-start or queued-provisioning pool (GKE refuses it)")


def cos_containerd(args: ResourceValidationArgs, report: ReportViolation) -> None:
    props = props_of(args)
    for path, node in node_configs(args, props):
        image = node.get("imageType")
        if str(image or "").upper() != "COS_CONTAINERD":
            report(f"{path}.imageType is {image or 'unset'}; use COS_CONTAINERD")


def no_legacy_abac(args: ResourceValidationArgs, report: ReportViolation) -> None:
    props = props_of(args)
    if args.resource_type == CLUSTER and props.get("enableLegacyAbac") is True:
        report("enableLegacyAbac is true; authorize with RBAC only")


def no_client_certificate(args: ResourceValidationArgs, report: ReportViolation) -> None:
    props = props_of(args)
    if args.resource_type == CLUSTER and get(
            props, "masterAuth.clientCertificateConfig.issueClientCertificate") is True:
        report("masterAuth.clientCertificateConfig.issueClientCertificate is true; a client certificate "
               "is a credential that cannot be revoked")


def deletion_protection_on_prod(args: ResourceValidationArgs, report: ReportViolation) -> None:
    props = props_of(args)
    # Unset means the provider's default, true.
    if args.resource_type == CLUSTER and is_prod(args) and props.get("deletionProtection") is False:
        report(f"deletionProtection is false on stack {stack_name(args)!r}; set cluster.deletionProtection: true")
