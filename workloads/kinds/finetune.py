"""kind finetune: fine-tune a Hugging Face model on your data with workloads/scripts/finetune.py, as an NVIDIA MPIJob.

Config: FinetuneWorkloadConfig (model/workload_types.py; its keys: the common ones, `finetune`, `launch`,
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

from pathlib import PurePosixPath

import pulumi

from model import chat_templates
from model.config import workload_default
from model.types import FinetuneWorkloadConfig, StackConfig
from model.validators import at
from workloads import finetune, finetune_progress, gcs_fuse
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


def check_on_nvidia(m: StackConfig, w: FinetuneWorkloadConfig) -> list[str]:
    if w.on_nvidia:
        return []
    return [f"{_key(w, 'accelerator', 'kind')}: a finetune workload runs on NVIDIA GPUs of a GKE pool "
            "(finetune.py under DeepSpeed's CUDA path); for Gaudi use kind mpijob with `training`"]


def _one_of(w: FinetuneWorkloadConfig, hub_key: str, path_key: str, what: str, example: str) -> list[str]:
    f = w.finetune
    hub, path = getattr(f, hub_key), getattr(f, f"{hub_key}_path")
    camel = f"{hub_key}Path"
    if hub and path:
        return [f"{_key(w, 'finetune', camel)}: give {_key(w, 'finetune', hub_key)} (a Hugging Face id) or "
                f"{camel} (a folder of the bucket), not both"]
    if not hub and not path:
        return [f"{_key(w, 'finetune', hub_key)}: required: the {what} to train on, a Hugging Face id (e.g. "
                f"{example}), or {_key(w, 'finetune', camel)}: {path_key} of the stack's bucket"]
    return []


def check_model_and_data(m: StackConfig, w: FinetuneWorkloadConfig) -> list[str]:
    """A Hugging Face id or a bucket path for each of the model and the data, and the bucket mounted for a path."""
    problems = [*_one_of(w, "model", "a folder", "model", "Qwen/Qwen2.5-7B-Instruct"),
                *_one_of(w, "dataset", "a file or folder", "data", "tatsu-lab/alpaca")]
    f = w.finetune
    for camel, value in (("modelPath", f.model_path), ("datasetPath", f.dataset_path)):
        if value and not w.gcs_fuse.enabled:
            problems.append(f"{_key(w, 'finetune', camel)}: {value} is read from the stack's bucket through the "
                            f"pods' GCS FUSE mount; set {_key(w, 'gcsFuse', 'enabled')}: true (and storage.enabled: "
                            "true)")
    return problems


def _data_format(w: FinetuneWorkloadConfig) -> str | None:
    """The format the script reads the data in: `format`, else by the bucket file's ending (None: a folder or a
    Hugging Face dataset, decided by what is there)."""
    f = w.finetune
    if f.format != "auto":
        return f.format
    suffix = PurePosixPath(f.dataset_path or "").suffix.lower()
    return finetune.script_module("finetune_data").SUFFIXES.get(suffix)


def check_data_format(m: StackConfig, w: FinetuneWorkloadConfig) -> list[str]:
    """What finetune.py can read (its SUFFIXES and FORMATS) and which fields its records have."""
    f, ft = w.finetune, finetune.script_module("finetune_data")
    problems = []
    suffix = PurePosixPath(f.dataset_path or "").suffix.lower()
    readable = ", ".join(ft.SUFFIXES)
    if f.dataset_path and suffix and suffix not in ft.SUFFIXES and f.format == "auto":
        problems.append(f"{_key(w, 'finetune', 'datasetPath')}: finetune.py cannot read {suffix} files (it reads "
                        f"{readable}: JSON lines, Parquet, text); convert the data, or set "
                        f"{_key(w, 'finetune', 'format')} if the file is one of them under another name")
    elif f.dataset_path and suffix in ft.SUFFIXES and f.format not in ("auto", ft.SUFFIXES[suffix]):
        problems.append(f"{_key(w, 'finetune', 'format')}: {f.format}, but {f.dataset_path} is "
                        f"{ft.SUFFIXES[suffix]} by its name; set format auto or {ft.SUFFIXES[suffix]}")
    if f.dataset and f.format != "auto":
        problems.append(f"{_key(w, 'finetune', 'format')}: {f.format} is for files of the bucket "
                        f"({_key(w, 'finetune', 'datasetPath')}); a Hugging Face dataset brings its own: set auto")
    if bool(f.prompt_field) != bool(f.response_field):
        given = "promptField" if f.prompt_field else "responseField"
        missing = "responseField" if f.prompt_field else "promptField"
        problems.append(f"{_key(w, 'finetune', given)}: goes with {_key(w, 'finetune', missing)} (or neither: "
                        "textField)")
    if _data_format(w) == "text":
        if f.prompt_field:
            problems.append(f"{_key(w, 'finetune', 'promptField')}: a text file's records have one field, `text` "
                            "(a line each); use JSON lines or Parquet for prompt/response pairs")
        elif f.text_field not in (None, "text"):
            problems.append(f"{_key(w, 'finetune', 'textField')}: a text file's records have one field, `text`, "
                            f"not {f.text_field!r}")
    return problems


# The field keys each record format reads (finetune.py's READS, by key).
RECORD_FIELD_KEYS = {
    "text": {"textField"},
    "prompt-completion": {"promptField", "responseField", "roleField", "contentField", "roles"},
    "messages": {"messagesField", "roleField", "contentField", "roles"},
    "sharegpt": {"messagesField", "roleField", "contentField", "roles"},
    "alpaca": set(),
}
FIELD_KEYS = {"textField": "text_field", "promptField": "prompt_field", "responseField": "response_field",
              "messagesField": "messages_field", "roleField": "role_field", "contentField": "content_field",
              "roles": "roles"}
CHAT_FORMATS = ("messages", "sharegpt")  # records that are conversations whatever the model


def check_record_fields(m: StackConfig, w: FinetuneWorkloadConfig) -> list[str]:
    """The field keys the record format reads: one it never reads would be dropped without a word (finetune.py
    refuses it too); with `auto`, the field keys of one format only, since the first one given decides."""
    f = w.finetune
    if _data_format(w) == "text" and f.record_format not in ("auto", "text"):
        return [f"{_key(w, 'finetune', 'recordFormat')}: {f.record_format}, but a text file's records are its lines "
                "(format text); use JSON lines or Parquet"]
    given = [key for key, attr in FIELD_KEYS.items() if getattr(f, attr)]
    if f.record_format != "auto":
        return [f"{_key(w, 'finetune', key)}: not read with {_key(w, 'finetune', 'recordFormat')} {f.record_format} "
                f"(it reads {', '.join(sorted(RECORD_FIELD_KEYS[f.record_format])) or 'instruction, input, output'}); "
                "remove it, or set the format that has this field" for key in given
                if key not in RECORD_FIELD_KEYS[f.record_format]]
    # textField beside promptField: check_text_field_or_prompt's.
    others = [key for key in ("textField", "promptField") if key in given]
    if "messagesField" in given and others:
        return [f"{_key(w, 'finetune', 'messagesField')}: messagesField and {' and '.join(others)} are fields of "
                "different record formats; keep the one of your records, or set "
                f"{_key(w, 'finetune', 'recordFormat')}"]
    return []


def check_chat_template(m: StackConfig, w: FinetuneWorkloadConfig) -> list[str]:
    """`chatTemplate` is auto, raw or a template the stack ships; conversations need a template: `raw` renders none,
    and a model known to ship none (data/chat_templates.yaml) needs one named. Other models, and a bucket modelPath,
    are found out by the launcher's data check (it loads the tokenizer)."""
    f = w.finetune
    key, names = _key(w, "finetune", "chatTemplate"), chat_templates.names()
    if f.chat_template not in (chat_templates.AUTO, chat_templates.RAW, *names):
        return [f"{key}: {f.chat_template!r} is not a template the stack knows: auto (the model's own), raw (none), "
                f"or one of data/chat_templates.yaml: {', '.join(names)}"]
    chat = f.record_format in CHAT_FORMATS
    if chat and f.chat_template == chat_templates.RAW:
        return [f"{key}: raw renders text and plain prompt/completion records only; {f.record_format} records are "
                "conversations and go through a chat template: auto (the model's own) or a name "
                f"({', '.join(names)})"]
    if chat and f.chat_template == chat_templates.AUTO and f.model and chat_templates.ships_template(f.model) is False:
        return [f"{key}: {f.model}'s tokenizer has no chat template (data/chat_templates.yaml), and {f.record_format} "
                f"records are rendered through one: name one the stack ships ({', '.join(names)}; it is saved with "
                "the tuned model, so the server renders requests the same way), or fine-tune its Instruct model"]
    return []


def check_eval_split(m: StackConfig, w: FinetuneWorkloadConfig) -> list[str]:
    """`evalSplit`: a fraction between 0 and 1, or a file or folder of the bucket finetune.py can read."""
    f, key = w.finetune, _key(w, "finetune", "evalSplit")
    if f.eval_split is None:
        return []
    fraction = finetune.eval_fraction(w)
    if fraction is not None:
        return [] if 0 < fraction < 1 else [f"{key}: {f.eval_split}: a fraction of the records is between 0 and 1 "
                                            "(e.g. 0.05), or name a file of the bucket"]
    problems = []
    if not w.gcs_fuse.enabled:
        problems.append(f"{key}: {f.eval_split} is read from the stack's bucket through the pods' GCS FUSE mount; "
                        f"set {_key(w, 'gcsFuse', 'enabled')}: true")
    suffix = PurePosixPath(str(f.eval_split)).suffix.lower()
    suffixes = finetune.script_module("finetune_data").SUFFIXES
    if suffix and suffix not in suffixes:
        problems.append(f"{key}: finetune.py cannot read {suffix} files (it reads {', '.join(suffixes)})")
    return problems


def check_epochs_or_max_steps(m: StackConfig, w: FinetuneWorkloadConfig) -> list[str]:
    """finetune.py trains for --epochs or --max-steps and refuses both ("give --epochs or --max-steps, not both");
    the stack passed --max-steps and dropped `epochs` without a word."""
    f = w.finetune
    if f.epochs is None or f.max_steps is None:
        return []
    return [f"{_key(w, 'finetune', 'epochs')}: {f.epochs:g} epochs and {_key(w, 'finetune', 'maxSteps')} "
            f"{f.max_steps}: the run stops at one or the other, not both (finetune.py: \"give --epochs or "
            "--max-steps, not both\"); remove one"]


def check_text_field_or_prompt(m: StackConfig, w: FinetuneWorkloadConfig) -> list[str]:
    """`textField` names what is learned, unless `promptField`/`responseField` do (the prompt masked, the response
    learned): with both, the stack passes only the prompt fields and the text field is silently ignored."""
    f = w.finetune
    if f.text_field is None or not (f.prompt_field or f.response_field):
        return []
    pair = _key(w, "finetune", "promptField" if f.prompt_field else "responseField")
    return [f"{_key(w, 'finetune', 'textField')}: {f.text_field!r} is not used with {pair}: the records' prompt and "
            "response are what the run learns; remove textField, or the prompt and response fields"]


def check_model_sequence_length(m: StackConfig, w: FinetuneWorkloadConfig) -> list[str]:
    """The run trains at `finetune.sequenceLength` (--seq-len); a `model` block set to another length sizes a run
    that never happens. The block's default (never set) is left alone."""
    if w.model is None:
        return []
    given, trained = w.model.sequence_length, w.finetune.sequence_length
    if given in (trained, workload_default(w.kind, "model", "sequenceLength")):
        return []
    return [f"{_key(w, 'model', 'sequenceLength')}: {given}, but the run trains at "
            f"{_key(w, 'finetune', 'sequenceLength')} {trained} tokens (--seq-len); set both the same"]


def warn_lora_unused(m: StackConfig, w: FinetuneWorkloadConfig) -> list[str]:
    """LoRA's settings when LoRA is off: every parameter trains and no adapter is made, so they go nowhere."""
    lora = w.finetune.lora
    if lora.enabled:
        return []
    defaults = workload_default(w.kind, "finetune", "lora")
    return [f"{_key(w, 'finetune', 'lora', key)}: not used: {_key(w, 'finetune', 'lora', 'enabled')} is false, so "
            "every parameter trains and no adapter is made" for key in changed_keys(lora, defaults, ("enabled",))]


def warn_dataset_tokens_unread(m: StackConfig, w: FinetuneWorkloadConfig) -> list[str]:
    """`datasetTokens` counts the tokens of `epochs` passes; with `maxSteps` the run trains maxSteps x the global
    batch, and the estimate reads that instead (planner/run_estimate.py)."""
    f = w.finetune
    if f.dataset_tokens is None or f.max_steps is None:
        return []
    return [f"{_key(w, 'finetune', 'datasetTokens')}: not used: with {_key(w, 'finetune', 'maxSteps')} the run "
            "trains maxSteps x the global batch x sequenceLength tokens, what the preview's estimate counts"]


def warn_command_replaces_finetune_keys(m: StackConfig, w: FinetuneWorkloadConfig) -> list[str]:
    """`launch.command` replaces the DeepSpeed command line, the one that passes the `finetune` keys."""
    if not w.launch.command:
        return []
    return [f"{_key(w, 'launch', 'command')}: replaces the DeepSpeed command line that passes the `finetune` keys "
            f"(model, data, fields, sequenceLength, epochs or maxSteps, saveSteps, LoRA) to {w.launch.script}: your "
            "command must pass them itself; CHECKPOINT_DIR, MODEL_DIR, the token file and the wait for the bucket's "
            "inputs stay"]


def check_lora_combination(m: StackConfig, w: FinetuneWorkloadConfig) -> list[str]:
    """The LoRA/ZeRO/precision combinations finetune.py refuses at start-up (its own combination_problems), refused
    here before anything is created."""
    ds = w.deepspeed
    found = finetune.script_module("finetune_config").combination_problems(
        w.finetune.lora.enabled, ds.zero_stage, ds.precision, False, ds.offload_params != "none")
    return [f"{_key(w, 'finetune', 'lora', 'enabled')}: {problem} (finetune.py would stop at start-up; see "
            f"{_key(w, 'deepspeed')})" for problem in found]


def _passed_flags(m: StackConfig, w: FinetuneWorkloadConfig) -> dict[str, str]:
    """The flags every rank gets besides `launch.args`, each with who passes it (the stack from a key, or DeepSpeed's
    launcher)."""
    args = finetune.script_args(w)
    own = args[:len(args) - len(w.launch.args)]
    passed = {a: f"the stack (from {_key(w, *finetune.STACK_FLAGS[a])})" for a in own if a.startswith("--")}
    return {**passed, **launcher_flags(m, w)}


def check_bucket_model_shape(m: StackConfig, w: FinetuneWorkloadConfig) -> list[str]:
    """The planner sizes every run: a model from a bucket folder (modelPath) names no shape, so `model.name` (a
    model of data/models.yaml) or `model.parameters` must say what it is."""
    f, mb = w.finetune, w.model
    if not f.model_path or f.model or (mb is not None and (mb.name or mb.parameters is not None)):
        return []
    return [f"{_key(w, 'finetune', 'modelPath')}: {f.model_path} is a folder of the bucket, whose shape the planner "
            f"cannot read: give {_key(w, 'model', 'name')} (the model of data/models.yaml it holds, or one of the "
            f"same shape) or {_key(w, 'model', 'parameters')} (billions) for the memory check"]


def check_sized_as_training(m: StackConfig, w: FinetuneWorkloadConfig) -> list[str]:
    """The planner sizes the run from the `finetune` keys (finetune.model, LoRA, sequenceLength, gradient
    checkpointing; planner/requests.py): a `model` block may name the shape, never make it a server."""
    if w.model is None or w.model.mode == "training":
        return []
    return [f"{_key(w, 'model', 'mode')}: a finetune workload trains (ZeRO model states, LoRA adapters, "
            f"activations), got {w.model.mode}; set mode: training, or leave the model block out (the run is sized "
            f"from {_key(w, 'finetune', 'model')})"]


def check_launch(m: StackConfig, w: FinetuneWorkloadConfig) -> list[str]:
    """The script is one the ranks can run; `launch.args` repeats no flag the stack sets from a key, and has only
    flags the script's parser has (workloads/kinds/shared.py), which in turn takes every flag the stack passes."""
    problems = script_source.problems(m, w)
    for i, arg in enumerate(w.launch.args):
        flag, key = arg.split("=", 1)[0], _key(w, "launch", "args", i)
        source = finetune.STACK_FLAGS.get(flag)
        if source is None:
            continue
        if flag in ("--checkpoint-dir", "--model-dir"):
            problems.append(f"{key}: {flag} is the stack's (CHECKPOINT_DIR and MODEL_DIR under the bucket's mount, "
                            "else the claim's: the contract a server of the result reads); remove it")
        else:
            problems.append(f"{key}: {flag} is set by the stack from {_key(w, *source)}; change it there instead")
    return problems + script_flag_problems(w, _passed_flags(m, w), frozenset(finetune.STACK_FLAGS))


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
               **finetune.where_to_look(w)}
    summary = job.summary.apply(lambda s: {**s, **outputs})
    return Built(job, summary, queued_namespace=job.namespace.metadata.name if queue else None)


KIND: Kind[FinetuneWorkloadConfig] = Kind(
    name="finetune",
    config=FinetuneWorkloadConfig,
    rules=(check_on_nvidia, check_model_and_data, check_data_format, check_record_fields, check_chat_template,
           check_eval_split, check_epochs_or_max_steps, check_text_field_or_prompt, check_model_sequence_length,
           check_lora_combination, check_bucket_model_shape, check_sized_as_training, check_launch,
           check_mpijob_name, check_mpijob_storage),
    build=build,
    warnings=(warn_lora_unused, warn_command_replaces_finetune_keys, warn_dataset_tokens_unread),
)
