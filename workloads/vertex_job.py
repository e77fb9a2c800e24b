"""The Vertex AI CustomJob spec for multi-node DeepSpeed with the stack's image.

A CustomJob is a run, not a long-lived resource, so the stack renders its spec (a stack output and,
in the offline preview, `vertex-customjob.yaml`) for `gcloud ai custom-jobs create --config`.
The image's Vertex entrypoint builds the hostfile from CLUSTER_SPEC and exchanges SSH keys itself.
"""

from __future__ import annotations

from typing import Any

from model.types import VertexConfig

# Installed by workloads/images/deepspeed/Dockerfile.
VERTEX_ENTRYPOINT = "/opt/deepspeed/vertex/vertex_start.sh"
VERTEX_OUTPUT_DIR = "vertex"


def vertex_accelerator(gpu_type: str) -> str:
    """GKE names (nvidia-tesla-t4) map one to one onto Vertex's AcceleratorType enum (NVIDIA_TESLA_T4)."""
    return gpu_type.upper().replace("-", "_")


def _pool(cfg: VertexConfig, image: str, replicas: int) -> dict[str, Any]:
    return {
        "machineSpec": {
            "machineType": cfg.machine_type,
            "acceleratorType": vertex_accelerator(cfg.gpu.type),
            "acceleratorCount": cfg.gpu.count,
        },
        "replicaCount": replicas,
        "diskSpec": {"bootDiskType": cfg.boot_disk_type, "bootDiskSizeGb": cfg.boot_disk_gb},
        "containerSpec": {
            "imageUri": image,
            "command": [VERTEX_ENTRYPOINT],
            # The entrypoint counts each host's GPUs itself (nvidia-smi -L) for the hostfile's slots.
            "args": [cfg.launch.script, *cfg.launch.args],
        },
    }


def customjob_spec(cfg: VertexConfig, image: str, bucket: str, service_account: str,
                   tensorboard: str | None = None) -> dict[str, Any]:
    """workerPoolSpecs[0] is the primary (one replica); workerPoolSpecs[1] holds `workers` replicas."""
    pools = [_pool(cfg, image, 1)]
    if cfg.workers:
        pools.append(_pool(cfg, image, cfg.workers))
    spec: dict[str, Any] = {
        "workerPoolSpecs": pools,
        "serviceAccount": service_account,
        # Vertex sets AIP_MODEL_DIR, AIP_CHECKPOINT_DIR and AIP_TENSORBOARD_LOG_DIR under this prefix.
        "baseOutputDirectory": {"outputUriPrefix": f"gs://{bucket}/{VERTEX_OUTPUT_DIR}"},
    }
    if tensorboard:
        spec["tensorboard"] = tensorboard
    if cfg.spot:
        spec["scheduling"] = {"strategy": "SPOT"}
    return spec
