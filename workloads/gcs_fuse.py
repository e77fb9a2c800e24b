"""Mount the stack's bucket in GKE pods with the GCS FUSE CSI driver, as a Workload Identity account.

The pod runs as a Kubernetes service account annotated with the bucket's Google service account
(components/storage.py binds the two), carries the `gke-gcsfuse/volumes` annotation that makes GKE
inject the FUSE sidecar, and mounts an ephemeral CSI volume of the bucket.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import msgspec
import pulumi
import pulumi_kubernetes as k8s

from model.yamlio import load_yaml

DRIVER = "gcsfuse.csi.storage.gke.io"
VOLUME = "gcs"
POD_ANNOTATIONS = {
    "gke-gcsfuse/volumes": "true",
    # The injected sidecar asks 250m CPU, 256Mi and 5Gi by default, on top of pods fitted to a whole GPU node:
    # ask little, and set no limit ("0") so reads are not throttled.
    "gke-gcsfuse/cpu-request": "100m",
    "gke-gcsfuse/memory-request": "128Mi",
    "gke-gcsfuse/ephemeral-storage-request": "1Gi",
    "gke-gcsfuse/cpu-limit": "0",
    "gke-gcsfuse/memory-limit": "0",
    "gke-gcsfuse/ephemeral-storage-limit": "0",
}
WORKLOAD_IDENTITY_ANNOTATION = "iam.gke.io/gcp-service-account"
DATA_PATH = Path(__file__).resolve().parent.parent / "data" / "gcs_fuse.yaml"


@functools.cache
def mount_options(profile: str = "default") -> str:
    """The mount options of a use of the bucket (data/gcs_fuse.yaml: `default`, `checkpointing`), as the CSI
    ephemeral volume takes them: one string, comma-separated, no spaces."""
    return ",".join(str(o) for o in load_yaml(DATA_PATH)["profiles"][profile])


# implicit-dirs: folders that exist only as object prefixes (how gsutil/gcloud upload) are visible.
MOUNT_OPTIONS = mount_options("default")


class BucketAccess(msgspec.Struct, frozen=True):
    """What a workload component needs to mount the bucket (Pulumi values)."""

    bucket: pulumi.Input[str]
    google_service_account: pulumi.Input[str]
    kubernetes_service_account: str


class GcsMount(msgspec.Struct, frozen=True):
    """The resolved values the pod spec is rendered from."""

    bucket: str
    mount_path: str
    service_account: str
    mount_options: str = MOUNT_OPTIONS  # data/gcs_fuse.yaml: a profile's options


def volume(m: GcsMount) -> dict[str, Any]:
    return {"name": VOLUME, "csi": {"driver": DRIVER, "volumeAttributes": {
        "bucketName": m.bucket, "mountOptions": m.mount_options}}}


def volume_mount(m: GcsMount) -> dict[str, Any]:
    return {"name": VOLUME, "mountPath": m.mount_path}


def service_account(name: str, namespace: pulumi.Input[str], access: BucketAccess,
                    opts: pulumi.ResourceOptions) -> k8s.core.v1.ServiceAccount:
    """The Kubernetes service account the workload's pods run as, mapped to the bucket's Google account."""
    return k8s.core.v1.ServiceAccount(
        name,
        metadata=k8s.meta.v1.ObjectMetaArgs(
            name=access.kubernetes_service_account, namespace=namespace,
            annotations={WORKLOAD_IDENTITY_ANNOTATION: access.google_service_account}),
        opts=opts,
    )
