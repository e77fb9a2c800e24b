"""NfsProvisioner: nfs-subdir-external-provisioner (Helm, pinned), the `nfs-client` storage class.

It gives ReadWriteMany claims (a subdirectory of one NFS export per claim), which the MPIJob's shared
claim needs: the launcher and the workers on different nodes mount it at the same time.
"""

from __future__ import annotations

import msgspec
import pulumi
import pulumi_kubernetes as k8s

from model.types import NfsProvisionerConfig

CHART = "nfs-subdir-external-provisioner"
REPOSITORY = "https://kubernetes-sigs.github.io/nfs-subdir-external-provisioner/"
NAMESPACE = "nfs-provisioner"


class NfsProvisionerArgs(msgspec.Struct, frozen=True):
    config: NfsProvisionerConfig


def values(cfg: NfsProvisionerConfig) -> dict:
    """The chart's values: the export and the storage class it provides."""
    if not cfg.server:
        raise ValueError("nfsProvisioner.server is required when nfsProvisioner.install is true")
    return {
        "nfs": {"server": cfg.server, "path": cfg.path},
        "storageClass": {"name": cfg.storage_class},
    }


class NfsProvisioner(pulumi.ComponentResource):
    def __init__(self, name: str, args: NfsProvisionerArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepspeed-stack:workloads:NfsProvisioner", name, None, opts)
        cfg = args.config
        self.storage_class: str = cfg.storage_class
        self.release = k8s.helm.v3.Release(
            f"{name}-release",
            name=CHART,
            chart=CHART,
            version=cfg.chart_version,
            repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=REPOSITORY),
            namespace=NAMESPACE,
            create_namespace=True,
            values=values(cfg),
            # A failed install is rolled back instead of leaving a storage class that binds nothing.
            atomic=True,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"storageClass": cfg.storage_class, "chartVersion": cfg.chart_version})
