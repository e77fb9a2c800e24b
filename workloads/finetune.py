"""The `finetune` kind's launch: recipes/finetune.py on every rank of an NVIDIA MPIJob, its arguments from
the typed `finetune` keys (the fine-tuning contract), CHECKPOINT_DIR and MODEL_DIR in the environment, the token as
a mounted file, the launcher's data check before the ranks, and the rules that mirror what the script refuses.

The recipe is the one source of what it reads: its pure parts (formats, file endings, the LoRA/ZeRO/precision
combinations it cannot run) are imported from the recipes package, not copied here, so the stack refuses exactly what
the script would refuse at start-up, before anything is created. finetune.py and its modules (finetune_*.py,
contract.py) are the recipes package: the job's ConfigMap ships them flat (a ConfigMap key has no '/') with the
package's __init__ as recipes.py (recipes/contract.py `sources`).
"""

from __future__ import annotations

from model import chat_templates, training_speed
from model.types import FinetuneWorkloadConfig, MpiJobWorkloadConfig, StackConfig
from model.validators import at
from planner import run_hours
from recipes import contract
from workloads import recipe
from workloads.mpijob import script_source
from workloads.mpijob.nvidia import NvidiaLaunch, output_env
from workloads.mpijob.shape import CONFIG_DIR, HF_TOKEN_KEY, TOKEN_DIR, TOKEN_VOLUME, token_secret_name

# Tiered saves (`localCheckpoints`): the workers' emptyDir for the local saves, on the pool's local SSDs (GKE puts
# emptyDir volumes on them with ephemeral storage on local SSD), and finetune.py's variable naming it
# (finetune_tiered.py copies each save from there to CHECKPOINT_DIR).
LOCAL_CHECKPOINTS_VOLUME = "local-checkpoints"
LOCAL_CHECKPOINTS_DIR = "/local-checkpoints"
LOCAL_CHECKPOINT_ENV = "LOCAL_CHECKPOINT_DIR"
SCRIPTS = recipe.SCRIPTS
SCRIPT = recipe.SCRIPT
LIBRARY_GLOB = recipe.LIBRARY_GLOB  # finetune.py's modules, shipped beside it
TEMPLATE_KEY = recipe.TEMPLATE_NAME  # the named chat template's file in the ConfigMap
TOKEN_PATH_ENV = contract.HF_TOKEN_PATH_ENV  # the ranks read a gated model's token from this file
POOLS_ENV = "FINETUNE_POOLS"  # finetune_fabric.POOLS_ENV: the run's pool, then its fallbackPool
STACK_KEYS_ENV = contract.STACK_KEYS_ENV  # the stack's key for each flag it sets
# A worker whose sshd died restarts in place, and the launcher (OnFailure, up to runPolicy.backoffLimit) resumes the
# run from the newest checkpoint: the script finds it by itself (workloads/recovery.py).
WORKER_RESTART_POLICY = "OnFailure"
STACK_FLAGS = recipe.STACK_FLAGS
script_module = recipe.script_module


def roots(w: FinetuneWorkloadConfig) -> recipe.RecipeRoots:
    """The GKE run's roots: data under the bucket's GCS FUSE mount, outputs there (or on the claim without one),
    ds_config.json and a named template in the job's ConfigMap."""
    return recipe.RecipeRoots(data=w.gcs_fuse.mount_path.rstrip("/"), output=w.output_root, config=CONFIG_DIR,
                              name=w.name)


def in_bucket(w: FinetuneWorkloadConfig, path: str) -> str:
    """A bucket path as the pods see it (the workload's GCS FUSE mount)."""
    return roots(w).under(path)


def model_arg(w: FinetuneWorkloadConfig) -> str:
    return recipe.model_arg(w.finetune, roots(w))


def dataset_arg(w: FinetuneWorkloadConfig) -> str:
    return recipe.dataset_arg(w.finetune, roots(w))


def data_step(w: FinetuneWorkloadConfig | MpiJobWorkloadConfig, cpus: run_hours.DataCpus,
              speed: training_speed.TrainingSpeed | None = None) -> str:
    """How long the data step (finetune.py --prepare-data) takes on `cpus` for `datasetTokens` (planner/run_hours.py:
    the characters over the measured rate per CPU of the records' kind, data/training_speed.yaml `tokenization`,
    times the processes; both kinds where the record format is found at run time), in words. On GKE the launcher
    runs it on the first worker over ssh (run_hours.first_worker); a Gaudi job's launcher runs it itself."""
    speed = speed or training_speed.load()
    assert w.finetune is not None
    where = (f"once, before the ranks start: finetune.py --prepare-data in {cpus.on}, into "
             f"{w.checkpoint_dir}/tokenized/, reused on every restart and resume, while the GPU nodes wait (counted "
             "in the run's hours)")
    step = run_hours.data_step(w, cpus, speed)
    if step is None:
        return f"{where}; set {at('workloads', w.name, 'finetune', 'datasetTokens')} for how long it takes"
    rates = speed.tokenize_chars_per_second
    took = " to ".join(f"{_duration(h * 3600)} ({kind} records)" for kind, h in step.by_kind.items())
    return (f"about {took} for {w.finetune.dataset_tokens:,} tokens, {where} (data/training_speed.yaml: "
            f"{', '.join(f'{rates[k]:,.0f} characters/s a CPU for {k}' for k in step.kinds)}, "
            f"{speed.chars_per_token:g} characters a token)")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def where_to_look(cfg: StackConfig, w: FinetuneWorkloadConfig) -> dict[str, str]:
    """What a person needs to start and follow the run (the preview's "Training" section): where the data goes in
    the bucket (or the Hugging Face dataset the ranks download), the launcher Job whose log is the run's output (the
    MPI operator names it <job>-launcher), and where the model lands, in the bucket or on the claim."""
    f = w.finetune
    data = {"datasetInBucket": f.dataset_path} if f.dataset_path else {"datasetHub": f.dataset or ""}
    lands = {"modelInBucket": w.model_folder} if w.gcs_fuse.enabled else {"modelOnClaim": w.model_dir}
    return {**data, **lands, "launcherJob": f"{w.name}-launcher",
            "dataStep": data_step(w, run_hours.first_worker(cfg, w))}


def eval_fraction(w: FinetuneWorkloadConfig) -> float | None:
    """`evalSplit` as a fraction of the records; None for a file of the bucket (w.eval_path) or none."""
    return recipe.eval_fraction(w.finetune)


def script_args(w: FinetuneWorkloadConfig) -> list[str]:
    """finetune.py's arguments: the recipe's (workloads/recipe.py, the same on every platform), then `launch.args`.
    CHECKPOINT_DIR and MODEL_DIR are in the environment too, with the same folders."""
    return recipe_launch(w).args


def recipe_launch(w: FinetuneWorkloadConfig) -> recipe.RecipeLaunch:
    """The recipe's launch on GKE (workloads/recipe.py `launch`, as on Gaudi and Vertex AI)."""
    return recipe.launch(w.finetune, w.deepspeed.learning_rate, roots(w), ("workloads", w.name), w.launch.args)


def stack_keys(w: FinetuneWorkloadConfig) -> dict[str, str]:
    """Each flag the stack sets from a key of this workload -> that key, as `pulumi config set --path` spells it:
    the script's errors name the key to change (FINETUNE_STACK_KEYS)."""
    return recipe.stack_keys(w.finetune, ("workloads", w.name))


def env(w: FinetuneWorkloadConfig, has_token: bool) -> dict[str, str]:
    """The contract's environment: where checkpoints and the model go, the stack's keys for the script's errors;
    the token's file with a token."""
    out = {**output_env(w), **recipe_launch(w).env}
    pools = [p for p in (w.pool, w.fallback_pool) if p]
    if pools:  # the pools the run may land on, for finetune_fabric.py's refusal
        out[POOLS_ENV] = ",".join(pools)
    if has_token:
        out[TOKEN_PATH_ENV] = f"{TOKEN_DIR}/{HF_TOKEN_KEY}"
    if w.local_checkpoints:
        out[LOCAL_CHECKPOINT_ENV] = LOCAL_CHECKPOINTS_DIR
    return out


def files(w: FinetuneWorkloadConfig) -> dict[str, str]:
    """What the job's ConfigMap ships beside ds_config.json: the script (when it is the project's or yours under
    recipes/user), finetune.py's modules beside it, and the named chat template."""
    shipped = script_source.source(w).files
    if not shipped:  # a script of the bucket or the image, or `launch.command`: nothing of ours to ship
        return {}
    library = contract.sources(*sorted(p.name for p in SCRIPTS.glob(LIBRARY_GLOB)), *contract.COMMON)
    text = chat_templates.template(w.finetune.chat_template)
    return {**shipped, **library, **({TEMPLATE_KEY: text} if text is not None else {})}


def data_check_command(w: FinetuneWorkloadConfig) -> list[str]:
    """The launcher's data step before the ranks (finetune.py --prepare-data): the data check (finetune_check.py),
    then every record tokenized once into the folder beside the checkpoints the ranks memory-map, or found there
    from an earlier start (finetune_tokenized.py). The project's script only, with the ranks' arguments (a copy of
    yours may not have the flag; `launch.command` runs its own)."""
    if w.launch.command or w.launch.script != SCRIPT.name:
        return []
    return ["python", script_source.source(w).path, "--prepare-data", *script_args(w)]


def launch(w: FinetuneWorkloadConfig, has_token: bool, run_env: dict[str, str] | None = None) -> NvidiaLaunch:
    """What the MPIJob runs (workloads/mpijob/nvidia.py renders the rest): the script on every rank with its
    arguments; the launcher has the token's file already (the shape mounts it), the workers, where the ranks run,
    get it here. `run_env`: the progress callback's facts and TensorBoard's folder (workloads/finetune_progress.py)."""
    script = script_source.source(w)
    worker_volumes, worker_mounts = [], []
    if has_token:
        # Group-readable for fsGroup: the image's user reads it, nobody else.
        worker_volumes.append({"name": TOKEN_VOLUME, "secret": {"secretName": token_secret_name(w.name),
                                                                "defaultMode": 0o440}})
        worker_mounts.append({"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True})
    if w.local_checkpoints:  # on the workers only: the ranks save there; the launcher saves nothing
        worker_volumes.append({"name": LOCAL_CHECKPOINTS_VOLUME, "emptyDir": {}})
        worker_mounts.append({"name": LOCAL_CHECKPOINTS_VOLUME, "mountPath": LOCAL_CHECKPOINTS_DIR})
    return NvidiaLaunch(
        rank_command=[script.path, *script_args(w)], env={**env(w, has_token), **(run_env or {})}, files=files(w),
        hf_trainer=True,
        command=w.launch.command, worker_volumes=worker_volumes, worker_mounts=worker_mounts,
        worker_restart_policy=WORKER_RESTART_POLICY, wait_for=bucket_inputs(w), check=data_check_command(w),
        check_on_first_worker=True)


def bucket_inputs(w: FinetuneWorkloadConfig) -> list[str]:
    """The inputs in the bucket, as the pods see them: the launcher waits for them (uploaded after `pulumi up`)."""
    return [in_bucket(w, path) for path in recipe.data_paths(w.finetune)]
