"""ExistingCluster: the Kubernetes provider for a cluster the stack does not create (Gaudi/Omnia, or any).

Credentials come from the secret config value `kubeconfig` (a Pulumi secret end to end) and/or the
context named in `kubernetes.context`; with neither kubeconfig nor context the provider would fall
back to whatever `KUBECONFIG` points at on the deploying machine, so a config check requires one.
"""

from __future__ import annotations

import msgspec
import pulumi
import pulumi_kubernetes as k8s

from model.types import StackConfig


class ExistingClusterArgs(msgspec.Struct, frozen=True):
    kubeconfig: pulumi.Input[str] | None = None
    context: str | None = None


def needs_kubernetes(cfg: StackConfig) -> bool:
    """Whether the stack deploys anything that may go to an existing cluster: MPIJob workloads, the MPI
    operator, the NFS provisioner (helm workloads run on the stack's own GKE cluster only)."""
    return (any(w.runs_as_mpijob for w in cfg.workloads.values())
            or cfg.mpi_operator.install or cfg.nfs_provisioner.install)


class ExistingCluster(pulumi.ComponentResource):
    def __init__(self, name: str, args: ExistingClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepspeed-stack:k8s:ExistingCluster", name, None, opts)
        kubeconfig = pulumi.Output.secret(args.kubeconfig) if args.kubeconfig is not None else None
        self.provider = k8s.Provider(
            f"{name}-k8s",
            kubeconfig=kubeconfig,
            context=args.context,
            enable_server_side_apply=True,
            # Adopt the namespace and the claim (TrainingJobArgs.adopt_provider; nothing else): Omnia's guide has users
            # create them by hand, and pulumi-kubernetes 4.34 refuses to create an object that exists unless this is
            # on (server-side apply then takes over the fields the stack sets). The stack never deletes what it
            # adopted: those objects are retained on delete (TrainingJobArgs.retain_on_delete).
            upsert_existing_objects=True,
            opts=pulumi.ResourceOptions(parent=self),
        )
        # Everything else goes through a provider without upsert: an existing object of the same name makes
        # `pulumi up` stop with Kubernetes' AlreadyExists and stay as it is (pulumi-kubernetes 4.29+: "By default,
        # Pulumi will error if a resource already exists in the cluster to prevent accidental data loss"). The MPIJob
        # first (Omnia's by-hand run of the same name: adopted, destroy would delete it with its logs) and the MPI
        # operator (install: true over a cluster's own operator would replace it, and destroy remove it).
        self.create_only = k8s.Provider(
            f"{name}-k8s-create-only",
            kubeconfig=kubeconfig,
            context=args.context,
            enable_server_side_apply=True,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"context": args.context})
