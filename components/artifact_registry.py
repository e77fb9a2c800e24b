"""ArtifactRegistry: the Docker repository for the stack's images, readable by the node service account."""

from __future__ import annotations

import msgspec
import pulumi
import pulumi_gcp as gcp

from model.types import RegistryConfig

# Untagged or old versions go after 30 days, unless they are among the newest `keepVersions`.
DELETE_AFTER = "2592000s"


class ArtifactRegistryArgs(msgspec.Struct, frozen=True):
    project: str
    region: str
    config: RegistryConfig
    # GKE's node service account; None for a Vertex-only stack (Vertex's account gets its own grant).
    reader_service_account: pulumi.Input[str] | None = None


class ArtifactRegistry(pulumi.ComponentResource):
    def __init__(self, name: str, args: ArtifactRegistryArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepspeed-stack:gcp:ArtifactRegistry", name, None, opts)
        self.repository = gcp.artifactregistry.Repository(
            f"{name}-repo",
            project=args.project,
            location=args.region,
            repository_id=args.config.name,
            format="DOCKER",
            description="DeepSpeed images (deepspeed-stack)",
            cleanup_policy_dry_run=False,
            cleanup_policies=[
                gcp.artifactregistry.RepositoryCleanupPolicyArgs(
                    id="keep-newest",
                    action="KEEP",
                    most_recent_versions=gcp.artifactregistry.RepositoryCleanupPolicyMostRecentVersionsArgs(
                        keep_count=args.config.keep_versions
                    ),
                ),
                gcp.artifactregistry.RepositoryCleanupPolicyArgs(
                    id="delete-old",
                    action="DELETE",
                    condition=gcp.artifactregistry.RepositoryCleanupPolicyConditionArgs(
                        tag_state="ANY", older_than=DELETE_AFTER
                    ),
                ),
            ],
            # repositoryId is fixed: a replacement (e.g. a new format) must delete the old repository first.
            opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True),
        )
        # The node account's read grant: workloads that pull the stack's image wait for it.
        self.reader = self._reader(name, args) if args.reader_service_account is not None else None
        self.host: str = f"{args.region}-docker.pkg.dev"
        self.url = self.repository.repository_id.apply(lambda repo: f"{self.host}/{args.project}/{repo}")
        self.register_outputs({"url": self.url})

    def _reader(self, name: str, args: ArtifactRegistryArgs) -> gcp.artifactregistry.RepositoryIamMember:
        return gcp.artifactregistry.RepositoryIamMember(
            f"{name}-node-reader",
            project=args.project,
            location=args.region,
            repository=self.repository.repository_id,
            role="roles/artifactregistry.reader",
            member=pulumi.Output.from_input(args.reader_service_account).apply(lambda e: f"serviceAccount:{e}"),
            opts=pulumi.ResourceOptions(parent=self),
        )
