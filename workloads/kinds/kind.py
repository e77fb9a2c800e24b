"""What a workload kind is: its config class, its rules, its builder and what it exports.

A kind lives in one module of this package (helm.py, mpijob.py, serve.py) that builds one `Kind`, listed in the
registry (workloads/kinds/__init__.py). `__main__.py` and checks/ ask the registry; nothing else names kinds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

import msgspec
import pulumi

from model.problems import Problem
from model.types import StackConfig, WorkloadConfig
from workloads.gcs_fuse import BucketAccess
from workloads.pull_secret import RegistryLogin

W = TypeVar("W", bound=WorkloadConfig)

# A kind's rule: every problem of one workload of that kind, each starting with its key
# (`workloads.<name>.<key>`, model/validators.py `at`). The stack is there for what the workload refers to (its
# pool, the region, the bucket).
Rule = Callable[[StackConfig, W], list[Problem]]


class Platform(msgspec.Struct, frozen=True):
    """What the stack built that a workload's builder may use; None where the stack has none."""

    cfg: StackConfig
    image: pulumi.Output[str] | None = None  # the stack's built image (pinned by digest)
    hf_token: pulumi.Output[str] | None = None  # the secret `hfToken`
    bucket: BucketAccess | None = None  # the stack's bucket and the accounts that reach it
    gaudi_image: pulumi.Output[str] | None = None  # the stack's Gaudi image (pinned by digest)
    gaudi_login: RegistryLogin | None = None  # the login the Gaudi image is pulled with, when its registry wants one
    claim_depends_on: list[pulumi.Resource] = msgspec.field(default_factory=list)  # e.g. the NFS provisioner
    own_cluster: bool = True  # the stack's own GKE cluster; False: an existing cluster (nothing adopted is deleted)
    # On an existing cluster, the provider that adopts what exists (the namespace and the claim): see target.py.
    adopt_with: pulumi.ProviderResource | None = None
    mpi_operator: pulumi.Resource | None = None  # the MPI operator the stack installs (the MPIJob CRD, its controller)
    kueue: pulumi.Resource | None = None  # Kueue's release (its CRDs, controller and MPIJob webhooks)
    # The LeaderWorkerSet controller (its CRD): what a server of one replica across nodes is created after.
    leader_worker_set: pulumi.Resource | None = None

    @property
    def protect(self) -> bool:
        """The cluster's deletion protection, which a production endpoint shares."""
        return bool(self.cfg.cluster and self.cfg.cluster.deletion_protection)

    def mpijob_admitted_by(self, queued: bool) -> list[pulumi.Resource]:
        """What an MPIJob is created after: the controller that runs it (the stack's MPI operator: its CRD must exist),
        and for a job Kueue queues, Kueue's release, whose MPIJob webhooks fail closed in the job's namespace."""
        return [r for r in (self.mpi_operator, self.kueue if queued else None) if r is not None]


class Built(msgspec.Struct, frozen=True):
    """What the builder made: the component, the `workloads.<name>` output, and the extras a kind may export."""

    resource: pulumi.ComponentResource
    summary: pulumi.Output[dict[str, Any]]
    endpoint: pulumi.Output[dict[str, Any]] | None = None  # `servingEndpoints.<name>`: how to reach a server
    queued_namespace: pulumi.Output[str] | None = None  # Kueue queues it: the namespace that needs a LocalQueue


# Builds one workload: (name, its config, the platform, options with the provider and what it waits for).
Builder = Callable[[str, W, Platform, pulumi.ResourceOptions], Built]


class Kind(msgspec.Struct, Generic[W], frozen=True):
    name: str  # the `kind` value in the config
    config: type[W]  # its typed class (model/workload_types.py WORKLOAD_TYPES), built from its schema branch
    rules: tuple[Rule[W], ...]  # its own rules (rules across kinds stay in checks/)
    build: Builder[W]
    warnings: tuple[Rule[W], ...] = ()  # what deploys but deserves a reviewer's eye
    max_name: int = 63  # longest workload name its objects allow (a DNS-1123 label; Helm releases less)
    sizes_its_model: bool = False  # its rules check the model's fit; the planner's generic fit rule stays silent
    checks_its_gpu: bool = False  # its rules refuse the GPUs its engine cannot run; the image's GPU rule stays silent

    def problems(self, m: StackConfig, w: W) -> list[Problem]:
        return [p for rule in self.rules for p in rule(m, w)]
