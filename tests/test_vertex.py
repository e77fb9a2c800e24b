"""Storage and Vertex AI: the CustomJob spec against Vertex's fields, the rules, and what the stack declares."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from conftest import model, problems, stack_yaml

from model import catalog
from model.types import VertexConfig, VertexGpuConfig, VertexLaunchConfig
from workloads.vertex_job import customjob_spec, vertex_accelerator, vertex_files

SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "workloads" / "vertex_customjob.schema.json").read_text())
IMAGE = "us-west1-docker.pkg.dev/p/deepspeed/deepspeed@sha256:" + "b" * 64
SA = "deepspeed-vertex@p.iam.gserviceaccount.com"


def vertex(**changes) -> VertexConfig:
    base = dict(enabled=True, display_name="ds", machine_type="n1-standard-4",
                gpu=VertexGpuConfig("nvidia-tesla-t4", 1), workers=1, boot_disk_type="pd-ssd", boot_disk_gb=1000,
                spot=False, tensorboard=False,
                launch=VertexLaunchConfig("train.py", ["--zero_stage", "3"]),
                deepspeed=model("vertex").vertex.deepspeed)  # the schema's defaults: read only with finetune
    return VertexConfig(**{**base, **changes})


def test_two_pool_spec_matches_the_original_example_and_vertex_fields() -> None:
    # The original example: two pools of one n1-standard-4 with one T4 each, 1000 GB boot disks.
    spec = customjob_spec(vertex(), IMAGE, "bkt", SA)
    jsonschema.validate(spec, SCHEMA)
    primary, workers = spec["workerPoolSpecs"]
    assert primary["replicaCount"] == 1 and workers["replicaCount"] == 1
    for pool in (primary, workers):
        assert pool["machineSpec"] == {"machineType": "n1-standard-4", "acceleratorType": "NVIDIA_TESLA_T4",
                                       "acceleratorCount": 1}
        assert pool["diskSpec"] == {"bootDiskType": "pd-ssd", "bootDiskSizeGb": 1000}
        assert pool["containerSpec"]["imageUri"] == IMAGE
        assert pool["containerSpec"]["args"] == ["train.py", "--zero_stage", "3"]
    assert spec["baseOutputDirectory"] == {"outputUriPrefix": "gs://bkt/vertex"}
    assert spec["serviceAccount"] == SA
    # A restarted replica restarts the whole job: DeepSpeed's SSH launch cannot take one host back.
    assert spec["scheduling"] == {"restartJobOnWorkerRestart": True} and "tensorboard" not in spec


def test_single_node_spot_with_tensorboard() -> None:
    tb = "projects/p/locations/us-west1/tensorboards/123"
    spec = customjob_spec(vertex(workers=0, spot=True), IMAGE, "bkt", SA, tb)
    jsonschema.validate(spec, SCHEMA)
    assert len(spec["workerPoolSpecs"]) == 1
    assert spec["scheduling"] == {"strategy": "SPOT"}
    assert spec["tensorboard"] == tb


def test_a_misspelt_field_fails_the_schema() -> None:
    spec = customjob_spec(vertex(), IMAGE, "bkt", SA)
    spec["workerPoolSpecs"][0]["machineSpec"]["acceleratorCnt"] = 1
    with pytest.raises(jsonschema.ValidationError, match="acceleratorCnt"):
        jsonschema.validate(spec, SCHEMA)


@pytest.mark.parametrize("gpu", sorted(catalog.load().gpus))
def test_every_catalog_gpu_maps_to_a_vertex_accelerator(gpu: str) -> None:
    allowed = SCHEMA["$defs"]["WorkerPoolSpec"]["properties"]["machineSpec"]["properties"]["acceleratorType"]["enum"]
    assert vertex_accelerator(gpu) in allowed


def test_known_vertex_names() -> None:
    assert vertex_accelerator("nvidia-l4") == "NVIDIA_L4"
    assert vertex_accelerator("nvidia-a100-80gb") == "NVIDIA_A100_80GB"


# --- rules ---------------------------------------------------------------------------------------

def test_vertex_needs_storage() -> None:
    assert problems("dev", {"vertex.enabled": True}) == [
        "vertex.enabled: Vertex AI runs read and write through the stack's bucket; set storage.enabled: true"]


def test_vertex_machine_must_fit_gpu() -> None:
    found = problems("dev", {"storage.enabled": True, "vertex.enabled": True, "vertex.machineType": "g2-standard-8"})
    assert found == ["vertex.machineType: nvidia-tesla-t4 needs an n1 machine type, got g2-standard-8 "
                     "(n1 types that take 1 nvidia-tesla-t4: n1-standard-4, n1-standard-8, n1-highmem-8, "
                     "n1-standard-16)"]


def test_vertex_gpu_must_be_offered_in_region() -> None:
    found = problems("dev", {"storage.enabled": True, "vertex.enabled": True,
                             "vertex.gpu.type": "nvidia-a100-80gb", "vertex.machineType": "a2-ultragpu-1g"})
    # data/gpu_catalog.yaml (its zone source's a2-ultragpu rows): A100 80GB in no us-west1 zone.
    assert found == ["vertex.gpu.type: nvidia-a100-80gb is not offered in us-west1"]


def test_storage_names() -> None:
    found = problems("dev", {"storage.enabled": True, "storage.bucketName": "Has_Caps",
                             "storage.kubernetesServiceAccount": "Bad_KSA"})
    assert any(p.startswith("storage.kubernetesServiceAccount: 'Bad_KSA' is not a Kubernetes name") for p in found)
    assert any(p.startswith("storage.bucketName: 'Has_Caps' is not a valid bucket name") for p in found)
    assert len(found) == 2


def test_vertex_config_defaults_come_from_the_schema() -> None:
    from checks import load
    from preview.engine import engine_config_from_yaml

    m = load(engine_config_from_yaml(stack_yaml("dev"))[0], set())
    assert (m.vertex.enabled, m.storage.enabled, m.storage.soft_delete_days) == (False, False, 7)


def test_job_command_is_where_the_image_installs_the_entrypoint() -> None:
    from workloads.vertex_job import VERTEX_ENTRYPOINT

    dockerfile = (Path(__file__).resolve().parent.parent / "workloads/images/deepspeed/Dockerfile").read_text()
    copy = next(line for line in dockerfile.splitlines() if line.startswith("COPY") and "vertex_start.sh" in line)
    assert copy.split()[-1].rstrip("/") == str(Path(VERTEX_ENTRYPOINT).parent)


@pytest.mark.parametrize(("days", "ok"), [(0, True), (3, False), (7, True), (90, True)])
def test_soft_delete_days_are_0_or_7_to_90(days: int, ok: bool) -> None:
    found = problems("dev", {"storage.enabled": True, "storage.softDeleteDays": days})
    assert found == ([] if ok else [
        f"storage.softDeleteDays: Cloud Storage keeps deleted objects 7 to 90 days (or 0: off), got {days}"])


def test_every_replica_is_told_where_stop_ranks_py_is_and_the_stack_uploads_it() -> None:
    """Vertex AI sends SIGTERM to each replica's vertex_start.sh only: it passes it on to the ranks with the stack's
    stop_ranks.py, read from the bucket (the GKE ConfigMap's counterpart), with or without the recipe."""
    spec = customjob_spec(vertex(), IMAGE, "bkt", SA)
    for pool in spec["workerPoolSpecs"]:
        assert pool["containerSpec"]["env"] == [
            {"name": "VERTEX_STOP_RANKS", "value": "/gcs/bkt/deepspeed-stack/scripts/stop_ranks.py"}]
    hook = (Path(__file__).resolve().parent.parent / "recipes" / "stop_ranks.py").read_text()
    assert vertex_files(vertex()) == {"deepspeed-stack/scripts/stop_ranks.py": hook}


def test_a_single_replica_job_restarts_alone() -> None:
    """restartJobOnWorkerRestart only where there are hosts to restart together."""
    assert "scheduling" not in customjob_spec(vertex(workers=0), IMAGE, "bkt", SA)
