"""kind finetune: fine-tune a Hugging Face model on your data with recipes/finetune.py, as an NVIDIA MPIJob.

Config: FinetuneWorkloadConfig (model/workload_training.py; its keys: the common ones, `finetune`, `launch`,
`deepspeed`, `storage`, `hfHome`, `proxy`). Builder: the TrainingJob component (workloads/training_job.py) with the
kind's own launch (workloads/finetune.py): the NVIDIA MPIJob's shape, image, hardening, placement, fabric and token
as an `mpijob` has them, plus:

- every rank runs `launch.script` (finetune.py) with the `finetune` keys as arguments, under ds_config.json with the
  Hugging Face Trainer's values "auto";
- CHECKPOINT_DIR and MODEL_DIR on the bucket's GCS FUSE mount (data/gcs_fuse.yaml's checkpointing options) with
  `gcsFuse.enabled`, else on the shared claim; HF_TOKEN_PATH names the mounted token file with `hfToken`;
- restarts: the launcher OnFailure and the workers OnFailure (in place), up to runPolicy.backoffLimit
  (workloads/recovery.py); the script resumes from the newest checkpoint by itself, and a SIGTERM saves one first;
  bad arguments or data (exit 2) are final: the launcher's later attempts stop at once (workloads/mpijob/nvidia.py).

Summary (`workloads.<name>`): the MPIJob's, plus checkpointDir, modelDir and the model.
"""

from __future__ import annotations

import pulumi

from model.config_schema import workload_default
from model.fabric import pool_local_ssds
from model.problems import Problem
from model.types import FinetuneWorkloadConfig, StackConfig
from model.validators import at
from workloads import finetune, finetune_progress, gcs_fuse, recipe_rules
from workloads.kinds.kind import Built, Kind, Platform
from workloads.kinds.mpijob import check_mpijob_name, check_mpijob_storage
from workloads.kinds.shared import changed_keys, launcher_flags, script_flag_problems
from workloads.kueue import queue_name
from workloads.mpijob import script_source
from workloads.placement import placement
from workloads.training_job import TrainingJob, TrainingJobArgs

CHECKPOINT_PROFILE = "checkpointing"  # data/gcs_fuse.yaml


def _key(w: FinetuneWorkloadConfig, *path: str | int) -> str:
    return at("workloads", w.name, *path)


def site(w: FinetuneWorkloadConfig) -> recipe_rules.RecipeSite:
    """The workload's `finetune` block for the recipe's rules (workloads/recipe_rules.py): paths are the bucket's."""
    return recipe_rules.RecipeSite(run=w.finetune, prefix=("workloads", w.name), deepspeed=w.deepspeed,
                             data_where="the bucket")


def check_on_nvidia(m: StackConfig, w: FinetuneWorkloadConfig) -> list[Problem]:
    if w.on_nvidia:
        return []
    return [Problem(_key(w, 'accelerator', 'kind'), "a finetune workload runs on NVIDIA GPUs of a GKE pool "
            "(finetune.py under DeepSpeed's CUDA path); on Gaudi the same `finetune` keys go into a kind mpijob "
            "(workloads.<name>.finetune: finetune.py on HPU, data on the shared claim)")]


def check_model_and_data(m: StackConfig, w: FinetuneWorkloadConfig) -> list[Problem]:
    """A Hugging Face id or a bucket path for each of the model and the data, and the bucket mounted for a path."""
    problems = recipe_rules.check_model_and_data(site(w))
    f = w.finetune
    for camel, value in (("modelPath", f.model_path), ("datasetPath", f.dataset_path)):
        if value and not w.gcs_fuse.enabled:
            problems.append(Problem(_key(w, 'finetune', camel), f"{value} is read from the stack's bucket through the "
                            f"pods' GCS FUSE mount; set {_key(w, 'gcsFuse', 'enabled')}: true (and storage.enabled: "
                            "true)"))
    return problems


def check_data_format(m: StackConfig, w: FinetuneWorkloadConfig) -> list[Problem]:
    return recipe_rules.check_data_format(site(w))


# The shared tables, under the names this kind's tests and the docs know.
RECORD_FIELD_KEYS = recipe_rules.RECORD_FIELD_KEYS
FIELD_KEYS = recipe_rules.FIELD_KEYS
CHAT_FORMATS = recipe_rules.CHAT_FORMATS


def check_record_fields(m: StackConfig, w: FinetuneWorkloadConfig) -> list[Problem]:
    return recipe_rules.check_record_fields(site(w))


def check_chat_template(m: StackConfig, w: FinetuneWorkloadConfig) -> list[Problem]:
    return recipe_rules.check_chat_template(site(w))


def check_eval_split(m: StackConfig, w: FinetuneWorkloadConfig) -> list[Problem]:
    """`evalSplit`: a fraction between 0 and 1, or a file or folder of the bucket, read through the GCS FUSE mount."""
    f, key = w.finetune, _key(w, "finetune", "evalSplit")
    mount = ([Problem(key, f"{f.eval_split} is read from the stack's bucket through the pods' GCS FUSE mount; set "
              f"{_key(w, 'gcsFuse', 'enabled')}: true")] if w.eval_path is not None and not w.gcs_fuse.enabled else [])
    return [*mount, *recipe_rules.check_eval_split(site(w))]


def check_epochs_or_max_steps(m: StackConfig, w: FinetuneWorkloadConfig) -> list[Problem]:
    return recipe_rules.check_epochs_or_max_steps(site(w))


def check_text_field_or_prompt(m: StackConfig, w: FinetuneWorkloadConfig) -> list[Problem]:
    return recipe_rules.check_text_field_or_prompt(site(w))


def check_model_sequence_length(m: StackConfig, w: FinetuneWorkloadConfig) -> list[Problem]:
    """The run trains at `finetune.sequenceLength` (--seq-len); a `model` block set to another length sizes a run
    that never happens. The block's default (never set) is left alone."""
    if w.model is None:
        return []
    given, trained = w.model.sequence_length, w.finetune.sequence_length
    if given in (trained, workload_default(w.kind, "model", "sequenceLength")):
        return []
    return [Problem(_key(w, 'model', 'sequenceLength'), f"{given}, but the run trains at "
            f"{_key(w, 'finetune', 'sequenceLength')} {trained} tokens (--seq-len); set both the same")]


def warn_lora_unused(m: StackConfig, w: FinetuneWorkloadConfig) -> list[Problem]:
    """LoRA's settings when LoRA is off: every parameter trains and no adapter is made, so they go nowhere."""
    lora = w.finetune.lora
    if lora.enabled:
        return []
    defaults = workload_default(w.kind, "finetune", "lora")
    return [Problem(_key(w, 'finetune', 'lora', key),
                    f"not used: {_key(w, 'finetune', 'lora', 'enabled')} is false, so "
            "every parameter trains and no adapter is made") for key in changed_keys(lora, defaults, ("enabled",))]


def warn_dataset_tokens_unread(m: StackConfig, w: FinetuneWorkloadConfig) -> list[Problem]:
    """`datasetTokens` counts the tokens of `epochs` passes; with `maxSteps` the run trains maxSteps x the global
    batch, and the estimate reads that instead (planner/run_estimate.py)."""
    f = w.finetune
    if f.dataset_tokens is None or f.max_steps is None:
        return []
    return [Problem(_key(w, 'finetune', 'datasetTokens'), f"not used: with {_key(w, 'finetune', 'maxSteps')} the run "
            "trains maxSteps x the global batch x sequenceLength tokens, what the preview's estimate counts")]


def warn_command_replaces_finetune_keys(m: StackConfig, w: FinetuneWorkloadConfig) -> list[Problem]:
    """`launch.command` replaces the DeepSpeed command line, the one that passes the `finetune` keys."""
    if not w.launch.command:
        return []
    return [Problem(_key(w, 'launch', 'command'),
                    f"replaces the DeepSpeed command line that passes the `finetune` keys "
            f"(model, data, fields, sequenceLength, epochs or maxSteps, saveSteps, LoRA) to {w.launch.script}: your "
            "command must pass them itself; CHECKPOINT_DIR, MODEL_DIR, the token file and the wait for the bucket's "
            "inputs stay")]


def check_lora_combination(m: StackConfig, w: FinetuneWorkloadConfig) -> list[Problem]:
    return recipe_rules.check_lora_combination(site(w))


def _passed_flags(m: StackConfig, w: FinetuneWorkloadConfig) -> dict[str, str]:
    """The flags every rank gets besides `launch.args`, each with who passes it (the stack from a key, or DeepSpeed's
    launcher)."""
    args = finetune.script_args(w)
    own = args[:len(args) - len(w.launch.args)]
    passed = {a: f"the stack (from {_key(w, *finetune.STACK_FLAGS[a])})" for a in own if a.startswith("--")}
    return {**passed, **launcher_flags(m, w)}


def check_bucket_model_shape(m: StackConfig, w: FinetuneWorkloadConfig) -> list[Problem]:
    """The planner sizes every run: a model from a bucket folder (modelPath) names no shape, so `model.name` (a
    model of data/models.yaml) or `model.parameters` must say what it is."""
    f, mb = w.finetune, w.model
    if not f.model_path or f.model or (mb is not None and (mb.name or mb.parameters is not None)):
        return []
    return [Problem(_key(w, 'finetune', 'modelPath'),
                    f"{f.model_path} is a folder of the bucket, whose shape the planner "
            f"cannot read: give {_key(w, 'model', 'name')} (the model of data/models.yaml it holds, or one of the "
            f"same shape) or {_key(w, 'model', 'parameters')} (billions) for the memory check")]


def check_sized_as_training(m: StackConfig, w: FinetuneWorkloadConfig) -> list[Problem]:
    """The planner sizes the run from the `finetune` keys (finetune.model, LoRA, sequenceLength, gradient
    checkpointing; planner/requests.py): a `model` block may name the shape, never make it a server."""
    if w.model is None or w.model.mode == "training":
        return []
    return [Problem(_key(w, 'model', 'mode'), f"a finetune workload trains (ZeRO model states, LoRA adapters, "
            f"activations), got {w.model.mode}; set mode: training, or leave the model block out (the run is sized "
            f"from {_key(w, 'finetune', 'model')})")]


def check_launch(m: StackConfig, w: FinetuneWorkloadConfig) -> list[Problem]:
    """The script is one the ranks can run; `launch.args` repeats no flag the stack sets from a key, and has only
    flags the script's parser has (workloads/kinds/shared.py), which in turn takes every flag the stack passes."""
    problems = script_source.problems(m, w)
    for i, arg in enumerate(w.launch.args):
        flag, key = arg.split("=", 1)[0], _key(w, "launch", "args", i)
        source = finetune.STACK_FLAGS.get(flag)
        if source is None:
            continue
        if flag in ("--checkpoint-dir", "--model-dir"):
            problems.append(Problem(key,
                                    f"{flag} is the stack's (CHECKPOINT_DIR and MODEL_DIR under the bucket's mount, "
                                    "else the claim's: the contract a server of the result reads); remove it"))
        else:
            problems.append(Problem(key,
                                    f"{flag} is set by the stack from {_key(w, *source)}; change it there instead"))
    return problems + script_flag_problems(w, _passed_flags(m, w), frozenset(finetune.STACK_FLAGS))


def check_local_checkpoints(m: StackConfig, w: FinetuneWorkloadConfig) -> list[Problem]:
    """Tiered saves write to the node's local SSDs first: the pool must have them (else the emptyDir is the boot
    disk, no faster than the bucket), and the ranks must run the project's finetune.py (its copy to the bucket)."""
    if not w.local_checkpoints:
        return []
    problems, key = [], _key(w, "localCheckpoints")
    pool = m.pool(w.pool or "")
    if pool is not None and pool_local_ssds(pool) == 0:
        index = m.node_pools.index(pool)
        problems.append(Problem(key,
                                f"pool {pool.name} has no local SSDs, so a local save would go to the boot disk; set "
                                f"{at('nodePools', index, 'localSsdCount')} to a count {pool.machine_type} takes (1 or "
                                "more), or set localCheckpoints to false"))
    if w.launch.command or w.launch.script != finetune.SCRIPT.name:
        problems.append(Problem(key, f"the copy to the bucket is finetune.py's own (--local-checkpoint-dir); "
                        f"{_key(w, 'launch', 'command' if w.launch.command else 'script')} runs something else, "
                        "which would leave the saves on the node's disk: set localCheckpoints to false"))
    return problems


def build(name: str, w: FinetuneWorkloadConfig, platform: Platform, opts: pulumi.ResourceOptions) -> Built:
    cfg = platform.cfg
    queue = queue_name(cfg, w)
    job = TrainingJob(name, TrainingJobArgs(
        config=w, placement=placement(cfg, w), stack_image=platform.image, hf_token=platform.hf_token,
        claim_depends_on=platform.claim_depends_on, bucket=platform.bucket,
        operator_version=cfg.mpi_operator.version, retain_on_delete=not platform.own_cluster,
        adopt_provider=platform.adopt_with, queue=queue,
        launch=finetune.launch(w, has_token=platform.hf_token is not None, run_env=finetune_progress.run_env(cfg, w)),
        gcs_mount_options=gcs_fuse.mount_options(CHECKPOINT_PROFILE),
        admitted_by=platform.mpijob_admitted_by(queue is not None)), opts)
    outputs = {"checkpointDir": w.checkpoint_dir, "modelDir": w.model_dir, "model": finetune.model_arg(w),
               **finetune_progress.where_to_watch(w),
               **finetune.where_to_look(cfg, w)}
    summary = job.summary.apply(lambda s: {**s, **outputs})
    return Built(job, summary, queued_namespace=job.namespace.metadata.name if queue else None)


KIND: Kind[FinetuneWorkloadConfig] = Kind(
    name="finetune",
    config=FinetuneWorkloadConfig,
    rules=(check_on_nvidia, check_model_and_data, check_data_format, check_record_fields, check_chat_template,
           check_eval_split, check_epochs_or_max_steps, check_text_field_or_prompt, check_model_sequence_length,
           check_lora_combination, check_bucket_model_shape, check_sized_as_training, check_launch,
           check_local_checkpoints, check_mpijob_name, check_mpijob_storage),
    build=build,
    warnings=(warn_lora_unused, warn_command_replaces_finetune_keys, warn_dataset_tokens_unread),
)
