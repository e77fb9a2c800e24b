"""Storage: one bucket for datasets, checkpoints and logs, and the identities that may use it.

GKE pods reach it through the GCS FUSE CSI driver as a Kubernetes service account that Workload
Identity maps to the bucket's Google service account; Vertex AI reaches it through its /gcs mount.
Both get object access on this bucket only, never a project-wide storage role.

With `storage.existingBucket` the stack creates no bucket: it grants its account object access on that bucket (an
additive bucket-level IAM member, never the bucket's whole policy) and registers nothing else on it, so it never
changes, protects or deletes a bucket it did not create.
"""

from __future__ import annotations

import msgspec
import pulumi
import pulumi_gcp as gcp

from components.node_identity import account_id
from model.types import StorageConfig

CHECKPOINT_PREFIX = "checkpoints/"
OBJECT_ROLE = "roles/storage.objectUser"
DAY_SECONDS = 86400


class StorageArgs(msgspec.Struct, frozen=True):
    project: str
    location: str
    config: StorageConfig
    # (namespace, Kubernetes service account) pairs of GKE workloads that mount the bucket.
    kubernetes_accounts: list[tuple[str, str]]
    workload_identity: bool
    protect: bool
    # The PROJECT.svc.id.goog identity pool exists only once a cluster with Workload Identity does:
    # the bindings wait for it (the bucket itself does not).
    identity_pool_ready: list[pulumi.Resource] = msgspec.field(default_factory=list)
    # Service account ids are per project: the stack name keeps two stacks in one project apart.
    stack: str = "dev"


def lifecycle_rules(cfg: StorageConfig) -> list[gcp.storage.BucketLifecycleRuleArgs]:
    rules = []
    if cfg.checkpoint_retention_days:
        rules.append(gcp.storage.BucketLifecycleRuleArgs(
            action=gcp.storage.BucketLifecycleRuleActionArgs(type="Delete"),
            condition=gcp.storage.BucketLifecycleRuleConditionArgs(
                age=cfg.checkpoint_retention_days, matches_prefixes=[CHECKPOINT_PREFIX]),
        ))
    if cfg.versioning:
        # Noncurrent versions cost as much as live ones; keep the last three.
        rules.append(gcp.storage.BucketLifecycleRuleArgs(
            action=gcp.storage.BucketLifecycleRuleActionArgs(type="Delete"),
            condition=gcp.storage.BucketLifecycleRuleConditionArgs(num_newer_versions=3, with_state="ARCHIVED"),
        ))
    return rules


class Storage(pulumi.ComponentResource):
    def __init__(self, name: str, args: StorageArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepspeed-stack:gcp:Storage", name, None, opts)
        cfg, child = args.config, pulumi.ResourceOptions(parent=self)
        self.bucket: gcp.storage.Bucket | None = self._bucket(name, args) if cfg.existing_bucket is None else None
        self.bucket_name: pulumi.Output[str] = self.bucket.name if self.bucket is not None \
            else pulumi.Output.from_input(cfg.existing_bucket)
        self.account = gcp.serviceaccount.Account(
            f"{name}-sa", project=args.project, account_id=account_id("ds-data", args.stack),
            display_name="DeepSpeed data access (deepspeed-stack)",
            opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True))  # accountId is fixed
        self.email: pulumi.Output[str] = self.account.email
        # Additive (BucketIAMMember, not BucketIAMBinding/Policy): the bucket's other members stay as they are.
        gcp.storage.BucketIAMMember(
            f"{name}-objects", bucket=self.bucket_name, role=OBJECT_ROLE,
            member=self.email.apply(lambda e: f"serviceAccount:{e}"), opts=child)
        for namespace, ksa in args.kubernetes_accounts if args.workload_identity else []:
            gcp.serviceaccount.IAMMember(
                f"{name}-wi-{namespace}-{ksa}",
                service_account_id=self.account.name,
                role="roles/iam.workloadIdentityUser",
                member=f"serviceAccount:{args.project}.svc.id.goog[{namespace}/{ksa}]",
                opts=pulumi.ResourceOptions(parent=self, depends_on=args.identity_pool_ready),
            )
        self.register_outputs({"bucket": self.bucket_name, "serviceAccount": self.email})

    def _bucket(self, name: str, args: StorageArgs) -> gcp.storage.Bucket:
        cfg = args.config
        return gcp.storage.Bucket(
            f"{name}-bucket",
            name=cfg.bucket_name,
            project=args.project,
            location=args.location,
            uniform_bucket_level_access=True,
            public_access_prevention="enforced",
            versioning=gcp.storage.BucketVersioningArgs(enabled=cfg.versioning),
            soft_delete_policy=gcp.storage.BucketSoftDeletePolicyArgs(
                retention_duration_seconds=cfg.soft_delete_days * DAY_SECONDS),
            lifecycle_rules=lifecycle_rules(cfg),
            labels={"managed-by": "pulumi", "stack": "deepspeed-stack"},
            # A bucket with objects is never emptied by `pulumi destroy`.
            force_destroy=False,
            # The name is fixed (global namespace): a replacement (e.g. a new location) must delete first.
            opts=pulumi.ResourceOptions(parent=self, protect=args.protect, delete_before_replace=True),
        )
