"""Pre-deploy checks for storage and Vertex AI, one function per rule."""

from __future__ import annotations

import json
import re

from checks.common import Check
from checks.platform import machine_problems
from components.storage import CHECKPOINT_PREFIX
from model import catalog as gpu_catalog
from model.config import schema
from model.suggest import did_you_mean
from model.types import StackConfig
from model.validators import bucket_name_problem

K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def check_vertex_needs_storage(m: StackConfig) -> list[str]:
    if m.vertex.enabled and not m.storage.enabled:
        return ["vertex.enabled: Vertex AI runs read and write through the stack's bucket; set storage.enabled: true"]
    return []


def check_vertex_machine(m: StackConfig) -> list[str]:
    if not m.vertex.enabled:
        return []
    v = m.vertex
    if v.gpu.type not in gpu_catalog.load().gpus:
        known = gpu_catalog.load().gpus
        return [f"vertex.gpu.type: unknown GPU type {v.gpu.type!r}; known: {', '.join(known)}"
                f"{did_you_mean(v.gpu.type, known)}"]
    problems = machine_problems(["vertex"], v.gpu.type, v.machine_type, v.gpu.count)
    if m.region and not gpu_catalog.load().zones(v.gpu.type, m.region):
        problems.append(f"vertex.gpu.type: {v.gpu.type} is not offered in {m.region}")
    return problems


def check_gcs_fuse_needs_storage_and_gke(m: StackConfig) -> list[str]:
    problems = []
    for name, w in m.workloads.items():
        if not w.gcs_fuse.enabled:
            continue
        if not m.storage.enabled:
            problems.append(f"workloads.{name}.gcsFuse.enabled: needs the stack's bucket; set storage.enabled: true")
        if m.cluster is None:
            problems.append(f"workloads.{name}.gcsFuse.enabled: the GCS FUSE CSI driver and Workload Identity "
                            "are GKE features; this stack has no `cluster`")
    return problems


# Paths every workload's pods may use: the chart's source at /app, scratch, shared memory (and each workload's own:
# its claim, the offload path: `mount_paths`).
RESERVED_MOUNTS = ("/app", "/tmp", "/dev/shm", "/job", "/etc/deepspeed")


def check_gcs_fuse_mount_path(m: StackConfig) -> list[str]:
    problems = []
    for name, w in m.workloads.items():
        path = w.gcs_fuse.mount_path.rstrip("/") or "/"
        taken = {*RESERVED_MOUNTS, *(p.rstrip("/") for p in w.mount_paths)}
        if w.gcs_fuse.enabled and path in taken | {"/"}:
            problems.append(f"workloads.{name}.gcsFuse.mountPath: {path} is already used by the workload's pods; "
                            "pick another path such as /gcs")
    return problems


def check_storage_names(m: StackConfig) -> list[str]:
    if not m.storage.enabled:
        return []
    problems = []
    if not K8S_NAME.match(m.storage.kubernetes_service_account):
        problems.append(f"storage.kubernetesServiceAccount: {m.storage.kubernetes_service_account!r} is not a "
                        "Kubernetes name (lowercase letters, digits, hyphens)")
    for key, name in (("bucketName", m.storage.bucket_name), ("existingBucket", m.storage.existing_bucket)):
        why = bucket_name_problem(name) if name is not None else None
        if why:
            problems.append(f"storage.{key}: {name!r} is not a valid bucket name: {why} (Cloud Storage's naming rules)")
    return problems


# The settings of a bucket the stack creates; an existing bucket keeps its own (the stack changes none of them).
OWN_BUCKET_SETTINGS = {"bucketName": "bucket_name", "location": "location", "versioning": "versioning",
                       "softDeleteDays": "soft_delete_days", "checkpointRetentionDays": "checkpoint_retention_days"}


def check_existing_bucket_settings(m: StackConfig) -> list[str]:
    """`existingBucket` names a bucket the stack did not create: a setting of the stack's own bucket given with it
    would be silently ignored (the stack never changes that bucket), so it is refused. Defaults stand for unset."""
    if not (m.storage.enabled and m.storage.existing_bucket):
        return []
    keys = schema()["properties"]["storage"]["properties"]
    problems = []
    for key, field in OWN_BUCKET_SETTINGS.items():
        value = getattr(m.storage, field)
        if value is not None and value != keys[key].get("default"):
            problems.append(f"storage.{key}: a setting of a bucket the stack creates, but storage.existingBucket "
                            f"names {m.storage.existing_bucket!r}, whose settings the stack never changes; remove "
                            f"{key} (or set it on the bucket yourself)")
    return problems


def _own_bucket_default(key: str) -> int:
    return schema()["properties"]["storage"]["properties"][key]["default"]


def warn_existing_bucket_lifecycle(m: StackConfig) -> list[str]:
    """A bucket the stack did not create gets none of its own bucket's housekeeping (components/storage.py): no
    rule deletes old checkpoints, and soft delete stays as the bucket has it. Nothing fails, but checkpoints of
    every run pile up and are billed; the warning says what the stack would have set and the gcloud command that
    sets it (the stack never changes a bucket it does not own)."""
    bucket = m.storage.existing_bucket
    if not (m.storage.enabled and bucket):
        return []
    days, soft = _own_bucket_default("checkpointRetentionDays"), _own_bucket_default("softDeleteDays")
    rule = json.dumps({"rule": [{"action": {"type": "Delete"},
                                 "condition": {"age": days, "matchesPrefix": [CHECKPOINT_PREFIX]}}]},
                      separators=(",", ":"))
    return [f"storage.existingBucket: the stack applies no retention or lifecycle setting to {bucket!r}, a bucket it "
            f"did not create: no rule deletes objects under {CHECKPOINT_PREFIX} (its own bucket deletes them after "
            f"storage.checkpointRetentionDays, {days} days), and soft delete and versioning stay as the bucket has "
            f"them (its own: {soft} days, off). To set the same yourself: `echo '{rule}' "
            f"> lifecycle.json && gcloud storage buckets update gs://{bucket} --lifecycle-file=lifecycle.json "
            f"--soft-delete-duration={soft}d` (--lifecycle-file replaces the bucket's rules: add those it has, from "
            f"`gcloud storage buckets describe gs://{bucket} --format='default(lifecycle_config)'`)"]


def warnings(m: StackConfig) -> list[str]:
    return warn_existing_bucket_lifecycle(m)


def check_soft_delete_days(m: StackConfig) -> list[str]:
    days = m.storage.soft_delete_days
    if m.storage.enabled and 0 < days < 7:
        return [f"storage.softDeleteDays: Cloud Storage keeps deleted objects 7 to 90 days (or 0: off), got {days}"]
    return []


def check_storage_needs_project(m: StackConfig) -> list[str]:
    if (m.storage.enabled or m.vertex.enabled) and not (m.project and m.region):
        return ["storage.enabled: the bucket and Vertex AI need gcp:project and gcp:region"]
    return []


CHECKS: list[Check] = [
    check_vertex_needs_storage,
    check_vertex_machine,
    check_gcs_fuse_needs_storage_and_gke,
    check_gcs_fuse_mount_path,
    check_storage_names,
    check_existing_bucket_settings,
    check_storage_needs_project,
    check_soft_delete_days,
]
