"""Realistic fake outputs for the offline run: what GCP, Kubernetes and BuildKit would return.

Values are derived from the resource's name and inputs by hashing, so two runs of the same stack give
the same plan (diffs between a base and a head plan show only real changes).
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pulumi

PROJECT_FALLBACK = "my-gcp-project"


def _digest(*parts: str) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()


def _ip(*parts: str) -> str:
    h = _digest(*parts)
    return f"34.{int(h[0:2], 16) % 120 + 1}.{int(h[2:4], 16)}.{int(h[4:6], 16) % 250 + 2}"


def _fake_ca(name: str) -> str:
    pem = f"-----BEGIN CERTIFICATE-----\nMOCK-CA-FOR-{name}\n-----END CERTIFICATE-----\n"
    return base64.b64encode(pem.encode()).decode()


def _cluster(args: pulumi.runtime.MockResourceArgs) -> dict[str, Any]:
    name, location = args.inputs.get("name", args.name), args.inputs.get("location", "")
    project = args.inputs.get("project", PROJECT_FALLBACK)
    return {
        "endpoint": _ip("cluster", name),
        "masterAuth": {**args.inputs.get("masterAuth", {}), "clusterCaCertificate": _fake_ca(name)},
        "selfLink": f"https://container.googleapis.com/v1/projects/{project}/locations/{location}/clusters/{name}",
        "id": f"projects/{project}/locations/{location}/clusters/{name}",
        **_fleet_membership(args.inputs.get("fleet"), name, location),
    }


def _fleet_membership(fleet: dict[str, Any] | None, name: str, location: str) -> dict[str, Any]:
    """GKE registers a cluster created with `fleet.project` as membership <cluster name> in the cluster's location."""
    if not fleet:
        return {}
    host = fleet.get("project", PROJECT_FALLBACK)
    return {"fleet": {**fleet, "membership": f"//gkehub.googleapis.com/projects/{host}/locations/{location}/"
                                             f"memberships/{name}",
                      "membershipId": name, "membershipLocation": location, "preRegistered": False}}


def _auto_name(args: pulumi.runtime.MockResourceArgs) -> dict[str, Any]:
    # Pulumi auto-names: the logical name, a hyphen and seven random characters.
    return {"name": args.inputs.get("name") or f"{args.name}-{_digest('name', args.name)[:7]}"}


def _service_account(args: pulumi.runtime.MockResourceArgs) -> dict[str, Any]:
    project = args.inputs.get("project", PROJECT_FALLBACK)
    email = f"{args.inputs['accountId']}@{project}.iam.gserviceaccount.com"
    return {"email": email, "member": f"serviceAccount:{email}", "uniqueId": str(int(_digest(email)[:15], 16)),
            "name": f"projects/{project}/serviceAccounts/{email}"}


def _image(args: pulumi.runtime.MockResourceArgs) -> dict[str, Any]:
    tags = args.inputs.get("tags") or [f"example.invalid/{args.name}:latest"]
    digest = f"sha256:{_digest('image', *tags)}"
    # Like docker-build: `ref` is the first tag with the digest appended.
    return {"digest": digest, "ref": f"{tags[0]}@{digest}"}


def _repository(args: pulumi.runtime.MockResourceArgs) -> dict[str, Any]:
    project = args.inputs.get("project", PROJECT_FALLBACK)
    repo_id = args.inputs.get("repositoryId", args.name)
    return {"name": f"projects/{project}/locations/{args.inputs.get('location')}/repositories/{repo_id}"}


def _bucket(args: pulumi.runtime.MockResourceArgs) -> dict[str, Any]:
    name = args.inputs.get("name") or f"{args.name}-{_digest('bucket', args.name)[:7]}"
    return {"name": name, "url": f"gs://{name}", "selfLink": f"https://www.googleapis.com/storage/v1/b/{name}"}


def _k8s_object(args: pulumi.runtime.MockResourceArgs) -> dict[str, Any]:
    meta = dict(args.inputs.get("metadata") or {})
    meta.setdefault("name", f"{args.name}-{_digest('k8s', args.name)[:8]}")
    return {"metadata": meta}


def _helm_release(args: pulumi.runtime.MockResourceArgs) -> dict[str, Any]:
    # What the provider reports after a successful install: the release's first revision, deployed.
    name = args.inputs.get("name") or f"{args.name}-{_digest('release', args.name)[:8]}"
    chart = str(args.inputs.get("chart", "")).rsplit("/", 1)[-1]
    return {"name": name, "status": {"name": name, "namespace": args.inputs.get("namespace", "default"),
                                     "chart": chart, "version": args.inputs.get("version", ""),
                                     "revision": 1, "status": "deployed"}}


def _tensorboard(args: pulumi.runtime.MockResourceArgs) -> dict[str, Any]:
    project, region = args.inputs.get("project", PROJECT_FALLBACK), args.inputs.get("region", "us-central1")
    number = str(int(_digest("tensorboard", args.name)[:12], 16))
    return {"id": f"projects/{project}/locations/{region}/tensorboards/{number}", "name": number}


OUTPUTS = {
    "gcp:vertex/aiTensorboard:AiTensorboard": _tensorboard,
    "gcp:container/cluster:Cluster": _cluster,
    "gcp:container/nodePool:NodePool": _auto_name,
    "gcp:serviceaccount/account:Account": _service_account,
    "gcp:artifactregistry/repository:Repository": _repository,
    "gcp:storage/bucket:Bucket": _bucket,
    "docker-build:index:Image": _image,
    "kubernetes:helm.sh/v3:Release": _helm_release,
}


class StackMocks(pulumi.runtime.Mocks):
    def __init__(self, project: str = PROJECT_FALLBACK, region: str = "us-central1"):
        self.project, self.region = project, region

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict]:
        maker = OUTPUTS.get(args.typ)
        extra = maker(args) if maker else {}
        if maker is None and args.typ.startswith("kubernetes:") and not args.typ.startswith("kubernetes:helm"):
            extra = _k8s_object(args)
        state = {**args.inputs, **extra}
        if args.typ.startswith("gcp:") and args.custom and "name" not in state and maker is None:
            state.update(_auto_name(args))  # the provider auto-names GCP resources (a Router, say) that set none
        resource_id = state.get("id") or f"{args.name}-{_digest('id', args.typ, args.name)[:10]}"
        return resource_id, state

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict:
        if args.token == "gcp:organizations/getClientConfig:getClientConfig":
            return {"accessToken": "mock-oauth-access-token", "project": self.project, "region": self.region,
                    "zone": "", "id": "mock-client-config"}
        if args.token == "gcp:organizations/getProject:getProject":
            project = args.args.get("projectId") or self.project
            return {"projectId": project, "number": str(int(_digest(project)[:11], 16)), "name": project}
        return {}
