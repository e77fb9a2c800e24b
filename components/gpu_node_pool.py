"""GpuNodePool: one auto-named GKE node pool of NVIDIA GPUs, per `nodePools` entry."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from model.types import NodePoolConfig

GPU_SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]
POOL_LABEL = "deepspeed-stack/pool"


@dataclass(frozen=True)
class GpuNodePoolArgs:
    project: str
    location: str
    cluster_name: pulumi.Input[str]
    node_service_account: pulumi.Input[str]
    config: NodePoolConfig
    zones: list[str]


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
        image_type="COS_CONTAINERD",
        disk_size_gb=cfg.disk_size_gb,
        disk_type=cfg.disk_type,
        ephemeral_storage_local_ssd_config=(
            gcp.container.NodePoolNodeConfigEphemeralStorageLocalSsdConfigArgs(local_ssd_count=cfg.local_ssd_count)
            if cfg.local_ssd_count else None
        ),
        # Image streaming: multi-GB CUDA images start in seconds instead of minutes.
        gcfs_config=gcp.container.NodePoolNodeConfigGcfsConfigArgs(enabled=True),
        shielded_instance_config=gcp.container.NodePoolNodeConfigShieldedInstanceConfigArgs(
            enable_secure_boot=True, enable_integrity_monitoring=True
        ),
        workload_metadata_config=gcp.container.NodePoolNodeConfigWorkloadMetadataConfigArgs(mode="GKE_METADATA"),
        service_account=args.node_service_account,
        oauth_scopes=GPU_SCOPES,
        labels={**cfg.labels, POOL_LABEL: cfg.name},
        resource_labels={"deepspeed-stack-pool": cfg.name},
    )


class GpuNodePool(pulumi.ComponentResource):
    node_pool: gcp.container.NodePool
    config: NodePoolConfig

    def __init__(self, name: str, args: GpuNodePoolArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepspeed-stack:gcp:GpuNodePool", name, None, opts)
        cfg = args.config
        self.config = cfg
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
                # Spot capacity comes and goes per zone; ANY takes it wherever it is.
                location_policy="ANY" if cfg.spot else "BALANCED",
            ),
            management=gcp.container.NodePoolManagementArgs(auto_repair=True, auto_upgrade=True),
            node_config=_node_config(args),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"name": self.node_pool.name, "gpuType": cfg.gpu.type})
