"""Inputs that can never work, refused at preview (issue 32 item 6): paths that leave the stack's bucket.

Expected messages are written out here; the bucket-relative keys are found in model/schema.yaml, not in the code
under test."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import DELETE, problems

from model.config import kind_branches, schema

TUNE = "workloads.tune"
CHAT = "workloads.chat"
MOUNT_NOTE = "(the pods see the bucket at /gcs, and nothing outside it is uploaded)"
CLIMBS = "has a '..' part, which climbs out of the bucket; write the path from the bucket's root"


# --- paths that leave the bucket ---------------------------------------------------------------------------------

def _bucket_keys() -> set[tuple[str, str]]:
    """(kind, key) of every workload key whose value is a path in the stack's bucket, by the schema's own words."""
    branches = kind_branches(schema()["properties"]["workloads"]["additionalProperties"])
    found = set()

    def walk(kind: str, node: dict[str, Any], path: str) -> None:
        for key, sub in (node.get("properties") or {}).items():
            where = f"{path}.{key}" if path else key
            text = f"{sub.get('x-form', '')} {sub.get('description', '')}"
            if sub.get("type") == "string" and ("of the bucket" in text or "of the stack's bucket" in text
                                                or "in the bucket" in text):
                found.add((kind, where))
            walk(kind, sub, where)

    for kind, branch in branches.items():
        walk(kind, branch, "")
    return found


# Each bucket-relative key: a stack, its workload, what else it needs, and a value that climbs out of the bucket
# (with the path in the bucket the message names).
BUCKET_KEYS = {
    ("finetune", "finetune.datasetPath"): ("finetune", TUNE, {}, "../x.jsonl", "../x.jsonl"),
    ("finetune", "finetune.modelPath"): ("finetune", TUNE, {f"{TUNE}.finetune.model": DELETE}, "../m", "../m"),
    ("finetune", "launch.script"): ("finetune", TUNE, {"storage.bucketName": "my-data"}, "gs://my-data/../x.py",
                                    "../x.py"),
    ("mpijob", "launch.script"): ("h100", "workloads.smoke", {}, "/gcs/../x.py", "../x.py"),
    ("serve", "serving.modelPath"): ("finetune", CHAT, {f"{CHAT}.serving.fromWorkload": DELETE}, "../m", "../m"),
}


# helm's `launch` is the mpijob's (one YAML anchor, one description), but its client runs only a file of
# workloads/scripts (workloads/kinds/shared.py refuses any path).
SHARED_DESCRIPTION = {("helm", "launch.script")}


def test_every_bucket_path_key_of_the_schema_is_covered() -> None:
    assert _bucket_keys() == set(BUCKET_KEYS) | SHARED_DESCRIPTION


@pytest.mark.parametrize(("kind", "key"), sorted(BUCKET_KEYS))
def test_each_bucket_path_key_is_held_in_the_bucket(kind: str, key: str) -> None:
    stack, workload, changes, value, path = BUCKET_KEYS[(kind, key)]
    found = problems(stack, {**changes, f"{workload}.{key}": value})
    assert f"{workload}.{key}: the bucket path {path!r} {CLIMBS} {MOUNT_NOTE}" in found


def test_helm_takes_no_script_path() -> None:
    (found,) = problems("dev", {"workloads.smoke.launch.script": "gs://b/../x.py"})
    assert found.startswith("workloads.smoke.launch.script: no file 'gs://b/../x.py' in workloads/scripts")


@pytest.mark.parametrize(("key", "value", "expected"), [
    (f"{TUNE}.finetune.datasetPath", "../x.jsonl", f"'../x.jsonl' {CLIMBS}"),
    (f"{TUNE}.finetune.datasetPath", "data/../../etc/x.jsonl", f"'data/../../etc/x.jsonl' {CLIMBS}"),
    (f"{TUNE}.finetune.datasetPath", "./train.jsonl",
     "'./train.jsonl' has a '.' part, which names no object of the bucket; write the path from the bucket's root"),
])
def test_a_dataset_path_that_leaves_the_bucket_is_refused(key: str, value: str, expected: str) -> None:
    assert problems("finetune", {key: value}) == [f"{key}: the bucket path {expected} {MOUNT_NOTE}"]


def test_a_model_path_that_leaves_the_bucket_is_refused() -> None:
    key = f"{TUNE}.finetune.modelPath"
    assert problems("finetune", {f"{TUNE}.finetune.model": DELETE, key: "models/../../base"}) == [
        f"{key}: the bucket path 'models/../../base' {CLIMBS} {MOUNT_NOTE}"]


def test_a_served_model_path_that_leaves_the_bucket_is_refused() -> None:
    key = f"{CHAT}.serving.modelPath"
    found = problems("finetune", {f"{CHAT}.serving.fromWorkload": DELETE, key: "../models/tune"})
    assert f"{key}: the bucket path '../models/tune' {CLIMBS} {MOUNT_NOTE}" in found


def test_a_script_in_the_bucket_that_leaves_it_is_refused() -> None:
    key = f"{TUNE}.launch.script"
    assert problems("finetune", {"storage.bucketName": "my-data", key: "gs://my-data/../other/train.py"}) == [
        f"{key}: the bucket path '../other/train.py' {CLIMBS} {MOUNT_NOTE}"]
    assert problems("finetune", {key: "/gcs/code/../../etc/train.py"}) == [
        f"{key}: the bucket path 'code/../../etc/train.py' {CLIMBS} {MOUNT_NOTE}"]
    assert problems("finetune", {key: "/gcs/code//train.py"}) == [
        f"{key}: the bucket path 'code//train.py' has an empty part (//), which no object of the bucket has "
        f"{MOUNT_NOTE}"]


@pytest.mark.parametrize("value", ["data/train.jsonl", "data/v1.2/train..jsonl", "data/.hidden/x.jsonl", "a"])
def test_paths_inside_the_bucket_pass(value: str) -> None:
    assert problems("finetune", {f"{TUNE}.finetune.datasetPath": value}) == []


def test_an_absolute_or_empty_part_path_is_the_schemas() -> None:
    """The schema's pattern already refuses these (its x-form says what is valid); the bucket rule adds nothing."""
    for value in ("/etc/passwd", "data//train.jsonl"):
        (found,) = problems("finetune", {f"{TUNE}.finetune.datasetPath": value})
        assert found.startswith(f"{TUNE}.finetune.datasetPath: ") and "a file or folder of the bucket" in found


# --- a shared claim is not re-owned at every pod start -------------------------------------------------------------

def _pod_specs(node: Any) -> list[dict[str, Any]]:
    """Every pod spec in a resource's inputs (a dict with containers), however deep (MPIJob, Deployment, ...)."""
    if isinstance(node, list):
        return [spec for item in node for spec in _pod_specs(item)]
    if not isinstance(node, dict):
        return []
    own = [node] if "containers" in node else []
    return own + [spec for value in node.values() for spec in _pod_specs(value)]


@pytest.mark.parametrize("stack", ["h100", "finetune", "gaudi", "dws"])
def test_pods_mounting_a_claim_skip_the_recursive_chown(stack: str) -> None:
    """Kubernetes' default with fsGroup (Always) re-owns every file of the claim at each mount; OnRootMismatch only
    when its root lacks the group (kubernetes.io, "Configure volume permission and ownership change policy for
    Pods")."""
    from conftest import stack_run

    specs = [spec for r in stack_run(stack).resources for spec in _pod_specs(r.inputs)
             if any("persistentVolumeClaim" in v for v in spec.get("volumes", []))]
    assert specs, f"{stack}: no pod mounts a claim"
    for spec in specs:
        context = spec["securityContext"]
        assert "fsGroup" in context
        assert context["fsGroupChangePolicy"] == "OnRootMismatch"


# --- NVMe offload needs the image's async_io op ------------------------------------------------------------------

NVME = {"workloads.smoke.deepspeed.zeroStage": 3, "workloads.smoke.deepspeed.offloadParams": "nvme"}


def test_nvme_offload_previews_on_the_image_that_builds_async_io() -> None:
    assert problems("dev", NVME) == []  # data/versions.yaml: the image builds async_io (and libaio is in it)


def test_nvme_offload_is_refused_on_an_image_without_async_io(monkeypatch: pytest.MonkeyPatch) -> None:
    import msgspec

    from model import versions

    shipped = versions.load()
    without = msgspec.structs.replace(shipped, deepspeed_ops={"fused_adam": "DS_BUILD_FUSED_ADAM"})
    monkeypatch.setattr(versions, "load", lambda *_: without)
    assert problems("dev", NVME) == [
        "workloads.smoke.deepspeed.offloadParams: nvme offload runs DeepSpeed's async_io op, which the stack's image "
        "does not build (data/versions.yaml image.deepspeedOps; it needs libaio-dev in "
        "workloads/images/deepspeed/Dockerfile and DS_BUILD_AIO=1); offload to cpu, or run an image with it (the "
        "workload's `image`, or image.prebuilt)"]
    assert problems("dev", {**NVME, "workloads.smoke.deepspeed.offloadParams": "cpu"}) == []
    # An image of the user's may have it: nothing here can see inside.
    assert problems("dev", {**NVME, "image.prebuilt": "registry.example.com/ml/deepspeed:1"}) == []
