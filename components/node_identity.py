"""NodeIdentity: a dedicated node service account with only the roles GKE nodes need.

Never the Compute Engine default account (Editor on the whole project). Artifact Registry read access
is granted on the stack's repository only, by the ArtifactRegistry component.
"""

from __future__ import annotations

import re

import msgspec
import pulumi
import pulumi_gcp as gcp

NODE_ROLES = (
    # The minimum a node account needs (logs, metrics, autoscaling metrics), as GKE's "Configure node service
    # accounts" page and CIS GKE Benchmark 2.0 (5.2.1) name it; it replaces logWriter + metricWriter + viewer.
    "roles/container.defaultNodeServiceAccount",
    # Image streaming (gcfsConfig on the GPU pools) with a custom node account: GKE's "Use Image streaming"
    # page asks for Service Usage Consumer on the project, so the node may call the Container File System API.
    "roles/serviceusage.serviceUsageConsumer",
)


class NodeIdentityArgs(msgspec.Struct, frozen=True):
    project: str
    cluster_name: str


def account_id(prefix: str, suffix: str) -> str:
    """A service account id (6-30 characters: lowercase letters, digits, hyphens, a letter first) from a
    prefix and a name such as the cluster's or the stack's, cut to fit."""
    cleaned = re.sub(r"[^a-z0-9-]+", "-", suffix.lower()).strip("-")
    head = re.sub(r"[^a-z0-9-]+", "-", prefix.lower()).strip("-")
    return f"{head}-{cleaned}"[:30].rstrip("-")


class NodeIdentity(pulumi.ComponentResource):
    def __init__(self, name: str, args: NodeIdentityArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepspeed-stack:gcp:NodeIdentity", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.account = gcp.serviceaccount.Account(
            f"{name}-sa",
            project=args.project,
            account_id=account_id(args.cluster_name[:24], "nodes"),
            display_name=f"GKE nodes of {args.cluster_name} (deepspeed-stack)",
            # accountId is a fixed name: a replacement must delete the old account before creating the new one.
            opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True),
        )
        self.email: pulumi.Output[str] = self.account.email
        member = self.email.apply(lambda email: f"serviceAccount:{email}")
        for role in NODE_ROLES:
            gcp.projects.IAMMember(
                f"{name}-{role.split('/')[1].replace('.', '-').lower()}",
                project=args.project,
                role=role,
                member=member,
                opts=child,
            )
        self.register_outputs({"email": self.email})
