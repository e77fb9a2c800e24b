"""The `finetune` kind's launch: workloads/scripts/finetune.py on every rank of an NVIDIA MPIJob, its arguments from
the typed `finetune` keys (the fine-tuning contract), CHECKPOINT_DIR and MODEL_DIR in the environment, the token as
a mounted file, and the rules that mirror what the script itself refuses.

The script is the contract's one source: its pure parts (formats, file endings, the LoRA/ZeRO/precision
combinations it cannot run) are read from the script file itself (`contract()`), not copied here, so the stack
refuses exactly what the script would refuse at start-up, before anything is created.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from model.types import FinetuneWorkloadConfig
from workloads.mpijob import script_source
from workloads.mpijob.nvidia import NvidiaLaunch, output_env
from workloads.mpijob.shape import CONFIG_DIR, DS_CONFIG_KEY, HF_TOKEN_KEY, TOKEN_DIR, TOKEN_VOLUME, token_secret_name

SCRIPT = Path(__file__).resolve().parent / "scripts" / "finetune.py"
PROGRESS = SCRIPT.with_name("finetune_progress.py")  # its progress callback, shipped beside it (it imports it)
TOKEN_PATH_ENV = "HF_TOKEN_PATH"  # the contract: the ranks read a gated model's token from this file
# A worker whose sshd died restarts in place, and the launcher (OnFailure, up to runPolicy.backoffLimit) resumes the
# run from the newest checkpoint: the script finds it by itself (workloads/recovery.py).
WORKER_RESTART_POLICY = "OnFailure"


@functools.cache
def contract() -> ModuleType:
    """workloads/scripts/finetune.py as a module: its top level imports only the standard library (torch and the
    rest load inside its run functions; tests/test_finetune_script.py holds it to that)."""
    spec = importlib.util.spec_from_file_location("deepspeed_stack_finetune_contract", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def in_bucket(w: FinetuneWorkloadConfig, path: str) -> str:
    """A bucket path as the pods see it (the workload's GCS FUSE mount)."""
    return f"{w.gcs_fuse.mount_path.rstrip('/')}/{path}"


def model_arg(w: FinetuneWorkloadConfig) -> str:
    f = w.finetune
    return f.model if f.model else in_bucket(w, f.model_path or "")


def dataset_arg(w: FinetuneWorkloadConfig) -> str:
    f = w.finetune
    return f.dataset if f.dataset else in_bucket(w, f.dataset_path or "")


def where_to_look(w: FinetuneWorkloadConfig) -> dict[str, str]:
    """What a person needs to start and follow the run (the preview's "Training" section): where the data goes in
    the bucket (or the Hugging Face dataset the ranks download), the launcher Job whose log is the run's output (the
    MPI operator names it <job>-launcher), and where the model lands, in the bucket or on the claim."""
    f = w.finetune
    data = {"datasetInBucket": f.dataset_path} if f.dataset_path else {"datasetHub": f.dataset or ""}
    lands = {"modelInBucket": w.model_folder} if w.gcs_fuse.enabled else {"modelOnClaim": w.model_dir}
    return {**data, **lands, "launcherJob": f"{w.name}-launcher"}


def _number(value: float) -> str:
    """A float argument as the script's argparse reads it: 1.0 -> 1, 0.0003 -> 0.0003."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


# The script's flags the stack sets, with the workload keys they come from (`launch.args` may not repeat them:
# argparse would take the last one and the key would silently lose).
STACK_FLAGS: dict[str, tuple[str, ...]] = {
    "--deepspeed": ("deepspeed",), "--deepspeed_config": ("deepspeed",), "--deepspeed-config": ("deepspeed",),
    "--model": ("finetune", "model"), "--dataset": ("finetune", "dataset"), "--format": ("finetune", "format"),
    "--text-field": ("finetune", "textField"), "--prompt-field": ("finetune", "promptField"),
    "--response-field": ("finetune", "responseField"), "--seq-len": ("finetune", "sequenceLength"),
    "--epochs": ("finetune", "epochs"), "--max-steps": ("finetune", "maxSteps"),
    "--learning-rate": ("deepspeed", "learningRate"), "--save-steps": ("finetune", "saveSteps"),
    "--gradient-checkpointing": ("finetune", "gradientCheckpointing"), "--lora": ("finetune", "lora", "enabled"),
    "--lora-rank": ("finetune", "lora", "rank"), "--lora-alpha": ("finetune", "lora", "alpha"),
    "--lora-dropout": ("finetune", "lora", "dropout"), "--lora-target-modules": ("finetune", "lora", "targetModules"),
    "--lora-export": ("finetune", "lora", "export"),
    "--precision": ("deepspeed", "precision"), "--checkpoint-dir": ("gcsFuse", "enabled"),
    "--model-dir": ("gcsFuse", "enabled"),
}


def script_args(w: FinetuneWorkloadConfig) -> list[str]:
    """finetune.py's arguments from the typed keys, then `launch.args`. The precision, batch sizes and clipping are
    ds_config.json's (the script sets the Trainer to match); CHECKPOINT_DIR and MODEL_DIR come from the environment."""
    f = w.finetune
    args = ["--deepspeed", f"{CONFIG_DIR}/{DS_CONFIG_KEY}", "--model", model_arg(w), "--dataset", dataset_arg(w),
            "--format", f.format]
    if f.prompt_field:
        args += ["--prompt-field", f.prompt_field, "--response-field", f.response_field or ""]
    elif f.text_field is not None:
        args += ["--text-field", f.text_field]
    args += ["--seq-len", str(f.sequence_length)]
    # One or the other (the rules refuse both); neither: the script's own default, one pass over the data.
    if f.max_steps is not None:
        args += ["--max-steps", str(f.max_steps)]
    elif f.epochs is not None:
        args += ["--epochs", _number(f.epochs)]
    args += ["--learning-rate", _number(w.deepspeed.learning_rate), "--save-steps", str(f.save_steps)]
    if f.gradient_checkpointing:
        args.append("--gradient-checkpointing")
    if f.lora.enabled:
        lora = f.lora
        args += ["--lora", "--lora-rank", str(lora.rank), "--lora-alpha", _number(lora.alpha),
                 "--lora-dropout", _number(lora.dropout), "--lora-export", lora.export,
                 "--lora-target-modules", *lora.target_modules]
    return [*args, *w.launch.args]


def env(w: FinetuneWorkloadConfig, has_token: bool) -> dict[str, str]:
    """The contract's environment: where checkpoints and the model go; the token's file with a token."""
    out = output_env(w)
    if has_token:
        out[TOKEN_PATH_ENV] = f"{TOKEN_DIR}/{HF_TOKEN_KEY}"
    return out


def files(w: FinetuneWorkloadConfig) -> dict[str, str]:
    """What the job's ConfigMap ships for the ranks: the script (the project's or yours under workloads/scripts/user)
    and finetune_progress.py beside it; nothing for a script of the bucket or the image, or `launch.command`."""
    shipped = script_source.source(w).files
    return {**shipped, PROGRESS.name: PROGRESS.read_text(encoding="utf-8")} if shipped else {}


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
    return NvidiaLaunch(
        rank_command=[script.path, *script_args(w)], env={**env(w, has_token), **(run_env or {})}, files=files(w),
        hf_trainer=True,
        command=w.launch.command, worker_volumes=worker_volumes, worker_mounts=worker_mounts,
        worker_restart_policy=WORKER_RESTART_POLICY, wait_for=bucket_inputs(w))


def bucket_inputs(w: FinetuneWorkloadConfig) -> list[str]:
    """The inputs in the bucket, as the pods see them: the launcher waits for them (uploaded after `pulumi up`)."""
    f = w.finetune
    return [in_bucket(w, path) for path in (f.model_path, f.dataset_path) if path]
