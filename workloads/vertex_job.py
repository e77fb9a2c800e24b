"""The Vertex AI CustomJob spec for multi-node DeepSpeed with the stack's image.

A CustomJob is a run, not a long-lived resource, so the stack renders its spec (a stack output and,
in the offline preview, `vertex-customjob.yaml`) for `gcloud ai custom-jobs create --config`.
The image's Vertex entrypoint builds the hostfile from CLUSTER_SPEC and exchanges SSH keys itself.

With `vertex.finetune` every replica runs the stack's recipe, finetune.py, with the arguments the same keys give on
GKE and Gaudi (workloads/recipe.py): the stack uploads the script, its modules and ds_config.json to the bucket
(`recipe_files`, the GKE ConfigMap's counterpart), and Vertex's /gcs/<bucket> mount is the data and output root.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from model.types import VertexConfig
from model.yamlio import load_yaml
from workloads import finetune_progress, recipe, recovery
from workloads.ds_config import build_ds_config

# Installed by workloads/images/deepspeed/Dockerfile.
VERTEX_ENTRYPOINT = "/opt/deepspeed/vertex/vertex_start.sh"
VERTEX_OUTPUT_DIR = "vertex"
VERTEX_MOUNT = "/gcs"  # Vertex AI mounts every bucket the job may read at /gcs/<bucket> (Cloud Storage FUSE)
RECIPE_PREFIX = "deepspeed-stack/scripts"  # the bucket's folder of finetune.py, its modules and ds_config.json
STACK_PREFIX = ("vertex",)  # where the recipe's keys are: vertex.finetune, vertex.deepspeed


LAUNCHER_PATH = Path(__file__).resolve().parent.parent / "data" / "deepspeed_launcher.yaml"


@functools.cache
def deepspeed_launcher() -> dict[str, Any]:
    """data/deepspeed_launcher.yaml: the `deepspeed` launcher's own options, and what it passes every rank."""
    return load_yaml(LAUNCHER_PATH)


def launcher_arg_problem(flag: str) -> str | None:
    """Why a flag in `vertex.launch.args` cannot do what it says: vertex_start.sh runs `deepspeed [--hostfile=H]
    SCRIPT ARGS`, so ARGS are the script's, and the launcher passes --local_rank before them."""
    facts = deepspeed_launcher()
    if flag in facts["rankFlags"]:
        return ("is passed to every rank by DeepSpeed's launcher (--local_rank=N, before these arguments: this one "
                "would win and every rank on a host would take the same GPU); remove it")
    if flag in facts["launcherFlags"]:
        return ("is an option of the deepspeed launcher, which vertex_start.sh runs itself (the hostfile from "
                "Vertex's CLUSTER_SPEC, a rank per GPU): after the script's name it reaches the script, not the "
                "launcher; remove it")
    return None


def replicas(cfg: VertexConfig) -> int:
    """The primary and the worker pool's replicas: the DeepSpeed hosts."""
    return 1 + cfg.workers


def roots(cfg: VertexConfig, bucket: str) -> recipe.RecipeRoots:
    """The recipe's roots on Vertex AI: the bucket's mount for data and outputs, the uploaded recipe's folder."""
    mounted = f"{VERTEX_MOUNT}/{bucket}"
    return recipe.RecipeRoots(data=mounted, output=mounted, config=f"{mounted}/{RECIPE_PREFIX}",
                              name=cfg.display_name)


def recipe_argv(cfg: VertexConfig, bucket: str) -> list[str]:
    """What every replica's vertex_start.sh runs under `deepspeed --hostfile`: finetune.py from the bucket with the
    recipe's arguments, then `vertex.launch.args`."""
    assert cfg.finetune is not None
    run = recipe_launch(cfg, bucket)
    return [run.script, *run.args]


def recipe_launch(cfg: VertexConfig, bucket: str) -> recipe.RecipeLaunch:
    """The recipe's launch on Vertex AI (workloads/recipe.py `launch`, as on GKE and Gaudi)."""
    assert cfg.finetune is not None
    return recipe.launch(cfg.finetune, cfg.deepspeed.learning_rate, roots(cfg, bucket), STACK_PREFIX, cfg.launch.args)


def ds_config_text(cfg: VertexConfig) -> str:
    """ds_config.json of the recipe's run: every replica's GPUs, the Trainer filling what it owns."""
    config = build_ds_config(cfg.deepspeed, replicas(cfg), cfg.gpu.count, hf_trainer=True)
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


def recipe_files(cfg: VertexConfig) -> dict[str, str]:
    """The bucket's objects the run reads (object name -> text): the script, its modules, ds_config.json and a
    named chat template, under RECIPE_PREFIX."""
    assert cfg.finetune is not None
    files = recipe.recipe_files(cfg.finetune, ds_config_text(cfg))
    return {f"{RECIPE_PREFIX}/{name}": text for name, text in files.items()}


def stop_ranks_path(bucket: str) -> str:
    """Where every replica reads the stack's stop_ranks.py (vertex_start.sh runs it on SIGTERM)."""
    return f"{VERTEX_MOUNT}/{bucket}/{RECIPE_PREFIX}/{recovery.STOP_RANKS_KEY}"


def vertex_files(cfg: VertexConfig) -> dict[str, str]:
    """Every object the stack writes to the bucket for its runs: stop_ranks.py (Vertex AI sends SIGTERM to each
    replica's main process only: vertex_start.sh passes it on to the ranks with it, so that they save first), and
    with `vertex.finetune` the recipe's files."""
    files = {f"{RECIPE_PREFIX}/{name}": text for name, text in recovery.stop_ranks_file().items()}
    return {**files, **(recipe_files(cfg) if cfg.finetune is not None else {})}


def recipe_env(cfg: VertexConfig, bucket: str) -> list[dict[str, str]]:
    """The container's environment: the stack's key for each flag (the script's errors name `vertex.finetune.*`)."""
    return [{"name": name, "value": value} for name, value in recipe_launch(cfg, bucket).env.items()]


def vertex_accelerator(gpu_type: str) -> str:
    """GKE names (nvidia-tesla-t4) map one to one onto Vertex's AcceleratorType enum (NVIDIA_TESLA_T4)."""
    return gpu_type.upper().replace("-", "_")


def _container(cfg: VertexConfig, image: str, bucket: str) -> dict[str, Any]:
    stop = [{"name": "VERTEX_STOP_RANKS", "value": stop_ranks_path(bucket)}]
    if cfg.finetune is None:
        return {"imageUri": image, "command": [VERTEX_ENTRYPOINT], "args": [cfg.launch.script, *cfg.launch.args],
                "env": stop}
    progress = [{"name": k, "value": v} for k, v in sorted(finetune_progress.vertex_env(cfg).items())]
    return {"imageUri": image, "command": [VERTEX_ENTRYPOINT], "args": recipe_argv(cfg, bucket),
            "env": [*recipe_env(cfg, bucket), *progress, *stop]}


def _pool(cfg: VertexConfig, image: str, replicas: int, bucket: str = "") -> dict[str, Any]:
    return {
        "machineSpec": {
            "machineType": cfg.machine_type,
            "acceleratorType": vertex_accelerator(cfg.gpu.type),
            "acceleratorCount": cfg.gpu.count,
        },
        "replicaCount": replicas,
        "diskSpec": {"bootDiskType": cfg.boot_disk_type, "bootDiskSizeGb": cfg.boot_disk_gb},
        # The entrypoint counts each host's GPUs itself (nvidia-smi -L) for the hostfile's slots.
        "containerSpec": _container(cfg, image, bucket),
    }


def customjob_spec(cfg: VertexConfig, image: str, bucket: str, service_account: str,
                   tensorboard: str | None = None) -> dict[str, Any]:
    """workerPoolSpecs[0] is the primary (one replica); workerPoolSpecs[1] holds `workers` replicas."""
    pools = [_pool(cfg, image, 1, bucket)]
    if cfg.workers:
        pools.append(_pool(cfg, image, cfg.workers, bucket))
    spec: dict[str, Any] = {
        "workerPoolSpecs": pools,
        "serviceAccount": service_account,
        # Vertex sets AIP_MODEL_DIR, AIP_CHECKPOINT_DIR and AIP_TENSORBOARD_LOG_DIR under this prefix.
        "baseOutputDirectory": {"outputUriPrefix": f"gs://{bucket}/{VERTEX_OUTPUT_DIR}"},
    }
    if tensorboard:
        spec["tensorboard"] = tensorboard
    scheduling = _scheduling(cfg)
    if scheduling:
        spec["scheduling"] = scheduling
    return spec


def _scheduling(cfg: VertexConfig) -> dict[str, Any]:
    """Vertex AI restarts a replica whose VM goes to maintenance or whose container exits non-zero (a preempted run
    exits 143 once saved), under the same host name. A multi-node DeepSpeed run cannot take one host back: the
    primary's SSH sessions to it are gone and its key exchange is over. So the whole job restarts
    (restartJobOnWorkerRestart), every replica exchanges keys again, and the recipe resumes from its newest
    checkpoint on the bucket."""
    scheduling: dict[str, Any] = {}
    if cfg.spot:
        scheduling["strategy"] = "SPOT"
    if cfg.workers:
        scheduling["restartJobOnWorkerRestart"] = True
    return scheduling
