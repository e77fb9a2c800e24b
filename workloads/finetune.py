"""The `finetune` kind's launch: workloads/scripts/finetune.py on every rank of an NVIDIA MPIJob, its arguments from
the typed `finetune` keys (the fine-tuning contract), CHECKPOINT_DIR and MODEL_DIR in the environment, the token as
a mounted file, the launcher's data check before the ranks, and the rules that mirror what the script refuses.

The script is the contract's one source: its pure parts (formats, file endings, the LoRA/ZeRO/precision
combinations it cannot run) are read from its own modules (`script_module`), not copied here, so the stack refuses
exactly what the script would refuse at start-up, before anything is created. finetune.py is a small package of flat
modules (finetune_*.py beside it): the job's ConfigMap ships them all (a ConfigMap key has no '/'), and Python finds
them in the script's own folder.
"""

from __future__ import annotations

import functools
import importlib
import json
import sys
from pathlib import Path
from types import ModuleType

from model import chat_templates
from model.types import FinetuneWorkloadConfig
from model.validators import at
from workloads.mpijob import script_source
from workloads.mpijob.nvidia import NvidiaLaunch, output_env
from workloads.mpijob.shape import CONFIG_DIR, DS_CONFIG_KEY, HF_TOKEN_KEY, TOKEN_DIR, TOKEN_VOLUME, token_secret_name

SCRIPTS = Path(__file__).resolve().parent / "scripts"
SCRIPT = SCRIPTS / "finetune.py"
LIBRARY_GLOB = "finetune_*.py"  # finetune.py's modules, shipped beside it
TEMPLATE_KEY = "chat_template.jinja"  # the named chat template's file in the ConfigMap
TOKEN_PATH_ENV = "HF_TOKEN_PATH"  # the contract: the ranks read a gated model's token from this file
STACK_KEYS_ENV = "FINETUNE_STACK_KEYS"  # finetune_config.STACK_KEYS_ENV: the stack's key for each flag it sets
# A worker whose sshd died restarts in place, and the launcher (OnFailure, up to runPolicy.backoffLimit) resumes the
# run from the newest checkpoint: the script finds it by itself (workloads/recovery.py).
WORKER_RESTART_POLICY = "OnFailure"


@functools.cache
def script_module(name: str) -> ModuleType:
    """One of finetune.py's modules (`finetune_data`, `finetune_config`, ...), imported by its own name as the script
    imports it on the cluster; their tops import only the standard library (tests/test_finetune_script.py holds them
    to that). The scripts' folder is on sys.path only while it loads."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(SCRIPTS))


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
    "--model-dir": ("gcsFuse", "enabled"), "--records": ("finetune", "recordFormat"),
    "--messages-field": ("finetune", "messagesField"), "--role-field": ("finetune", "roleField"),
    "--content-field": ("finetune", "contentField"), "--roles": ("finetune", "roles"),
    "--chat-template": ("finetune", "chatTemplate"), "--eval-split": ("finetune", "evalSplit"),
}


def eval_fraction(w: FinetuneWorkloadConfig) -> float | None:
    """`evalSplit` as a fraction of the records (a number, or text that reads as one: `pulumi config set` may store
    0.05 as text); None for a file of the bucket (w.eval_path) or none."""
    value = w.finetune.eval_split
    if value is None or w.eval_path is not None:
        return None
    return float(value)


def eval_split_arg(w: FinetuneWorkloadConfig) -> str | None:
    """--eval-split: the fraction, or the held-out file as the pods see it."""
    if w.eval_path is not None:
        return in_bucket(w, w.eval_path)
    fraction = eval_fraction(w)
    return None if fraction is None else _number(fraction)


def chat_template_arg(w: FinetuneWorkloadConfig) -> str:
    """--chat-template: auto and raw as they are; a named template is shipped as a file beside the script."""
    name = w.finetune.chat_template
    return name if name in (chat_templates.AUTO, chat_templates.RAW) else f"{CONFIG_DIR}/{TEMPLATE_KEY}"


def script_args(w: FinetuneWorkloadConfig) -> list[str]:
    """finetune.py's arguments from the typed keys, then `launch.args`. The precision, batch sizes and clipping are
    ds_config.json's (the script sets the Trainer to match); CHECKPOINT_DIR and MODEL_DIR come from the environment."""
    f = w.finetune
    args = ["--deepspeed", f"{CONFIG_DIR}/{DS_CONFIG_KEY}", "--model", model_arg(w), "--dataset", dataset_arg(w),
            "--format", f.format]
    if f.record_format != "auto":
        args += ["--records", f.record_format]
    if f.prompt_field:
        args += ["--prompt-field", f.prompt_field, "--response-field", f.response_field or ""]
    elif f.text_field is not None:
        args += ["--text-field", f.text_field]
    for flag, value in (("--messages-field", f.messages_field), ("--role-field", f.role_field),
                        ("--content-field", f.content_field)):
        if value is not None:
            args += [flag, value]
    if f.roles:
        args += ["--roles", *(f"{name}={role}" for name, role in sorted(f.roles.items()))]
    if f.chat_template != chat_templates.AUTO:
        args += ["--chat-template", chat_template_arg(w)]
    if (split := eval_split_arg(w)) is not None:
        args += ["--eval-split", split]
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


def stack_keys(w: FinetuneWorkloadConfig) -> dict[str, str]:
    """Each flag the stack sets from a key of this workload -> that key, as `pulumi config set --path` spells it:
    the script's errors name the key to change (FINETUNE_STACK_KEYS)."""
    f = w.finetune
    keys = {flag: at("workloads", w.name, *path) for flag, path in STACK_FLAGS.items()
            if path[0] in ("finetune", "deepspeed") and len(path) > 1}
    keys["--model"] = at("workloads", w.name, "finetune", "model" if f.model else "modelPath")
    keys["--dataset"] = at("workloads", w.name, "finetune", "dataset" if f.dataset else "datasetPath")
    return keys


def env(w: FinetuneWorkloadConfig, has_token: bool) -> dict[str, str]:
    """The contract's environment: where checkpoints and the model go, the stack's keys for the script's errors;
    the token's file with a token."""
    out = {**output_env(w), STACK_KEYS_ENV: json.dumps(stack_keys(w), sort_keys=True, separators=(",", ":"))}
    if has_token:
        out[TOKEN_PATH_ENV] = f"{TOKEN_DIR}/{HF_TOKEN_KEY}"
    return out


def files(w: FinetuneWorkloadConfig) -> dict[str, str]:
    """What the job's ConfigMap ships beside ds_config.json: the script (when it is the project's or yours under
    workloads/scripts/user), finetune.py's modules beside it, and the named chat template."""
    shipped = script_source.source(w).files
    if not shipped:  # a script of the bucket or the image, or `launch.command`: nothing of ours to ship
        return {}
    library = {p.name: p.read_text(encoding="utf-8") for p in sorted(SCRIPTS.glob(LIBRARY_GLOB))}
    text = chat_templates.template(w.finetune.chat_template)
    return {**shipped, **library, **({TEMPLATE_KEY: text} if text is not None else {})}


def data_check_command(w: FinetuneWorkloadConfig) -> list[str]:
    """The launcher's data check before the ranks (finetune.py --check-data, finetune_check.py): the project's
    script only, with the ranks' arguments (a copy of yours may not have the flag; `launch.command` runs its own)."""
    if w.launch.command or w.launch.script != SCRIPT.name:
        return []
    return ["python", script_source.source(w).path, "--check-data", *script_args(w)]


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
        worker_restart_policy=WORKER_RESTART_POLICY, wait_for=bucket_inputs(w), check=data_check_command(w))


def bucket_inputs(w: FinetuneWorkloadConfig) -> list[str]:
    """The inputs in the bucket, as the pods see them: the launcher waits for them (uploaded after `pulumi up`)."""
    f = w.finetune
    return [in_bucket(w, path) for path in (f.model_path, f.dataset_path, w.eval_path) if path]
