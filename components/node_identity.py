"""NodeIdentity: a dedicated node service account with only the roles GKE nodes need.

Never the Compute Engine default account (Editor on the whole project). Artifact Registry read access
is granted on the stack's repository only, by the ArtifactRegistry component.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

NODE_ROLES = (
    "roles/logging.logWriter",
    "roles/monitoring.metricWriter",
    "roles/monitoring.viewer",
)


@dataclass(frozen=True)
class NodeIdentityArgs:
    project: str
    cluster_name: str


def account_id(prefix: str, suffix: str) -> str:
    """A service account id (6-30 characters: lowercase letters, digits, hyphens, a letter first) from a
    prefix and a name such as the cluster's or the stack's, cut to fit."""
    cleaned = re.sub(r"[^a-z0-9-]+", "-", suffix.lower()).strip("-")
    head = re.sub(r"[^a-z0-9-]+", "-", prefix.lower()).strip("-")
    return f"{head}-{cleaned}"[:30].rstrip("-")


class NodeIdentity(pulumi.ComponentResource):
    account: gcp.serviceaccount.Account
    email: pulumi.Output[str]

    def __init__(self, name: str, args: NodeIdentityArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepspeed-stack:gcp:NodeIdentity", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.account = gcp.serviceaccount.Account(
            f"{name}-sa",
            project=args.project,
            account_id=account_id(args.cluster_name[:24], "nodes"),
            display_name=f"GKE nodes of {args.cluster_name} (deepspeed-stack)",
            opts=child,
        )
        self.email = self.account.email
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
