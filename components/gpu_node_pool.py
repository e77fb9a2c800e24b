"""GpuNodePool: one auto-named GKE node pool of NVIDIA GPUs, per `nodePools` entry."""

from __future__ import annotations

import msgspec
import pulumi
import pulumi_gcp as gcp

from components import pool_capacity
from model import capacity
from model.fabric import Fabric
from model.fabric import load as load_fabrics
from model.types import NodePoolConfig

GPU_SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]
POOL_LABEL = "deepspeed-stack/pool"


class GpuNodePoolArgs(msgspec.Struct, frozen=True):
    project: str
    location: str
    cluster_name: pulumi.Input[str]
    node_service_account: pulumi.Input[str]
    config: NodePoolConfig
    zones: list[str]
    # A3/A4 fabric: its contract, and the extra NICs' (network, subnetwork) in the contract's order.
    fabric: Fabric | None = None
    additional_networks: list[tuple[pulumi.Input[str], pulumi.Input[str]]] = msgspec.field(default_factory=list)
    # The GKE ComputeClass the pool joins (a workload's pool then fallbackPool, workloads/compute_class.py).
    compute_class: str | None = None


def _network_config(args: GpuNodePoolArgs) -> gcp.container.NodePoolNetworkConfigArgs | None:
    if not args.additional_networks:
        return None
    return gcp.container.NodePoolNetworkConfigArgs(additional_node_network_configs=[
        gcp.container.NodePoolNetworkConfigAdditionalNodeNetworkConfigArgs(network=network, subnetwork=subnetwork)
        for network, subnetwork in args.additional_networks])


def _taints(args: GpuNodePoolArgs) -> list[gcp.container.NodePoolNodeConfigTaintArgs] | None:
    """CT's GPU taint on fabric pools: only pods that tolerate it (the GPU workloads) land on 8-GPU nodes. A
    pool in a ComputeClass carries the class's taint, as GKE requires of manually created pools
    (data/capacity.yaml computeClass)."""
    taints = []
    if args.fabric is not None:
        taint = load_fabrics().gpu_taint
        taints.append(gcp.container.NodePoolNodeConfigTaintArgs(key=taint["key"], value=taint["value"],
                                                                 effect=taint["effect"]))
    if args.compute_class is not None:
        taints.append(gcp.container.NodePoolNodeConfigTaintArgs(
            key=capacity.load().compute_class.label_key, value=args.compute_class, effect="NO_SCHEDULE"))
    return taints or None


def _labels(args: GpuNodePoolArgs) -> dict[str, str]:
    cfg = args.config
    joined = {capacity.load().compute_class.label_key: args.compute_class} if args.compute_class else {}
    return {**cfg.labels, POOL_LABEL: cfg.name, **joined}


def _local_ssds(args: GpuNodePoolArgs) -> int:
    # A3/A4 bundle their local SSDs (16 or 32): a fabric pool takes them all unless the config says otherwise.
    return args.config.local_ssd_count or (args.fabric.local_ssds if args.fabric else 0)


def _node_config(args: GpuNodePoolArgs) -> gcp.container.NodePoolNodeConfigArgs:
    cfg = args.config
    return gcp.container.NodePoolNodeConfigArgs(
        machine_type=cfg.machine_type,
        guest_accelerators=[gcp.container.NodePoolNodeConfigGuestAcceleratorArgs(
            type=cfg.gpu.type,
            count=cfg.gpu.count,
            gpu_driver_installation_config=(
                gcp.container.NodePoolNodeConfigGuestAcceleratorGpuDriverInstallationConfigArgs(
                    gpu_driver_version=cfg.gpu.driver_version
                )
            ),
        )],
        spot=cfg.spot,
        flex_start=pool_capacity.flex_start(cfg),
        max_run_duration=cfg.max_run_duration,
        reservation_affinity=pool_capacity.reservation_affinity(cfg),
        image_type="COS_CONTAINERD",
        disk_size_gb=cfg.disk_size_gb,
        disk_type=cfg.disk_type,
        ephemeral_storage_local_ssd_config=(
            gcp.container.NodePoolNodeConfigEphemeralStorageLocalSsdConfigArgs(local_ssd_count=_local_ssds(args))
            if _local_ssds(args) else None
        ),
        # gVNIC: the fabric's NICs are gVNIC (and the primary must be too, CT gke-node-pool).
        gvnic=gcp.container.NodePoolNodeConfigGvnicArgs(enabled=True) if args.fabric else None,
        taints=_taints(args),
        # Image streaming: multi-GB CUDA images start in seconds instead of minutes.
        gcfs_config=gcp.container.NodePoolNodeConfigGcfsConfigArgs(enabled=True),
        shielded_instance_config=gcp.container.NodePoolNodeConfigShieldedInstanceConfigArgs(
            enable_secure_boot=True, enable_integrity_monitoring=True
        ),
        workload_metadata_config=gcp.container.NodePoolNodeConfigWorkloadMetadataConfigArgs(mode="GKE_METADATA"),
        service_account=args.node_service_account,
        oauth_scopes=GPU_SCOPES,
        labels=_labels(args),
        resource_labels={"deepspeed-stack-pool": cfg.name},
    )


class GpuNodePool(pulumi.ComponentResource):
    def __init__(self, name: str, args: GpuNodePoolArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepspeed-stack:gcp:GpuNodePool", name, None, opts)
        cfg = args.config
        self.config: NodePoolConfig = cfg
        # No `name`: Pulumi auto-names the pool `<pool name>-<7 random characters>`, so a change that forces
        # replacement creates the new pool beside the old one instead of failing on a name clash. The logical
        # name is the config's pool name alone, so that auto-name fits GKE's 40 characters (checks.POOL_NAME_MAX).
        self.node_pool = gcp.container.NodePool(
            cfg.name,
            project=args.project,
            cluster=args.cluster_name,
            location=args.location,
            node_locations=args.zones,
            autoscaling=gcp.container.NodePoolAutoscalingArgs(
                total_min_node_count=cfg.min_nodes,
                total_max_node_count=cfg.max_nodes,
                location_policy=pool_capacity.location_policy(cfg),
            ),
            management=gcp.container.NodePoolManagementArgs(auto_repair=pool_capacity.auto_repair(cfg),
                                                            auto_upgrade=True),
            queued_provisioning=pool_capacity.queued_provisioning(cfg),
            node_config=_node_config(args),
            network_config=_network_config(args),
            # COMPACT: nodes close together for NCCL latency; single zone only (checks/fabric.py).
            placement_policy=gcp.container.NodePoolPlacementPolicyArgs(type="COMPACT")
            if cfg.compact_placement else None,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"name": self.node_pool.name, "gpuType": cfg.gpu.type})
