"""LeaderWorkerSetController: the kubernetes-sigs/lws release the stack's multi-node servers run on (issue 42 item 3).

Installed on the stack's own cluster when a `serve` workload spans nodes (`serving.nodesPerReplica` > 1): the
release's manifest (its CRD, RBAC, webhooks with their internal certificate, and the controller in lws-system),
pinned by tag (data/serving.yaml leaderWorkerSet), as its installation guide installs it (`kubectl apply
--server-side -f https://github.com/kubernetes-sigs/lws/releases/download/$VERSION/manifests.yaml`: the CRD is
too big for a client-side apply's annotation; the Pulumi Kubernetes provider applies server-side). As for the MPI
operator (workloads/mpi_operator.py), `yaml.v2.ConfigFile` lets the provider fetch the manifest during `pulumi up`,
and the CRD outlives the stack: deleting it would delete every LeaderWorkerSet of the cluster.
"""

from __future__ import annotations

import msgspec
import pulumi
import pulumi_kubernetes as k8s

from model.serving_engines import leader_worker_set
from model.types import ServeWorkloadConfig, StackConfig
from workloads.mpi_operator import keep_crds


def group_servers(cfg: StackConfig) -> list[str]:
    """The serve workloads whose replicas span nodes (each a LeaderWorkerSet): the controller is installed for them."""
    return [name for name, w in cfg.workloads.items() if isinstance(w, ServeWorkloadConfig) and w.multi_node]


class LeaderWorkerSetControllerArgs(msgspec.Struct, frozen=True):
    version: str  # a released tag, e.g. v0.10.0

    @classmethod
    def pinned(cls) -> LeaderWorkerSetControllerArgs:
        return cls(version=leader_worker_set().version)


def manifest_url(version: str) -> str:
    return leader_worker_set().manifest_url.format(version=version)


class LeaderWorkerSetController(pulumi.ComponentResource):
    def __init__(self, name: str, args: LeaderWorkerSetControllerArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepspeed-stack:workloads:LeaderWorkerSetController", name, None, opts)
        url = manifest_url(args.version)
        self.manifest = k8s.yaml.v2.ConfigFile(
            f"{name}-manifest", file=url, opts=pulumi.ResourceOptions(parent=self, transforms=[keep_crds]))
        self.register_outputs({"version": args.version, "manifest": url})
