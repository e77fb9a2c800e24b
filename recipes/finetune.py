#!/usr/bin/env python3
"""Fine-tune a causal language model with the Hugging Face Trainer under DeepSpeed ZeRO 0-3.

Run on every rank by the DeepSpeed launcher, as the stack's MPIJob and Helm release do::

    deepspeed --hostfile HOSTFILE finetune.py --deepspeed_config ds_config.json \\
        --model meta-llama/Llama-3.1-8B-Instruct --dataset /gcs/bucket/chats.jsonl --seq-len 2048 --max-steps 1000

- Model: a Hugging Face id or a local folder (--model, FINETUNE_MODEL). A gated model's token is read from
  the file named by HF_TOKEN_PATH (never from an environment value).
- Data (--dataset, FINETUNE_DATASET): a .jsonl/.json, .parquet or .txt file, a folder of them, or a Hugging
  Face dataset id, in one of the formats people bring (--records: text, prompt-completion, messages, alpaca,
  sharegpt, or auto from the fields; finetune_data.py), rendered as the model will be used (finetune_render.py):
  conversations through the chat template with the loss on every assistant turn, plain prompt/completion records
  through it too on a model that has one (--chat-template raw: joined as text), text as it is.
- --check-data: read the first records, check and render them as the ranks would, print what was found and the
  first record as trained, and exit (2 on a data error): the launcher runs it before the ranks
  (finetune_check.py).
- --prepare-data: the data check, then every record tokenized once into --tokenized-dir (default
  CHECKPOINT_DIR/tokenized/<fingerprint>, finetune_tokenized.py), or found there from an earlier start: the
  launcher's step before the ranks, which then memory-map that folder (rank 0 makes it first where it is missing).
- --packing: text records packed into --seq-len blocks (auto, the default, and on); chat and prompt/completion
  records in padding-free batches (on only); off: one record a sample, padded (finetune_tokenized.py says why).
- --eval-split: a held-out fraction of the records, or a file of them; the eval loss is logged at every save.
- DeepSpeed: ds_config.json from --deepspeed (the launcher's --deepspeed_config). Values the Trainer owns may
  be "auto" there; where the file gives a batch size, accumulation, clipping or precision, the Trainer is set
  to the same value, so the two never disagree.
- Optional LoRA (peft): --lora with --lora-rank/--lora-alpha/--lora-dropout/--lora-target-modules; at export
  MODEL_DIR gets the adapter alone (--lora-export adapter, the default: peft's adapter_config.json and
  adapter_model.safetensors, a few MB, served on the base model by vLLM's LoRA support) or the base model with the
  adapter merged in (--lora-export merged).
- On Vertex AI: --checkpoint-dir and --model-dir default to AIP_CHECKPOINT_DIR and AIP_MODEL_DIR, TensorBoard's
  folder to AIP_TENSORBOARD_LOG_DIR (gs:// read as the /gcs mount) where the stack's variables are not set.
- Checkpoints: the Trainer's checkpoint-N folders in --checkpoint-dir (CHECKPOINT_DIR), every --save-steps
  (CHECKPOINT_EVERY_STEPS) steps and when any rank gets SIGTERM (the ranks agree on it every step, then all
  save and stop with exit status 143). A restarted run resumes from the newest complete checkpoint by itself.
  Rank 0 writes the first record as trained into CHECKPOINT_DIR/rendered-sample.json (ids, labels, text).
- Export: rank 0 writes the consolidated model (safetensors, config, tokenizer with its chat template; ZeRO-3
  gathers the weights), or the adapter and the tokenizer, into --model-dir (MODEL_DIR), then MODEL_DIR/.complete,
  last: {"step": N, "model": ..., "export": "adapter" | "merged" | "full", ...}: what a server waiting on it loads.
- Errors in the arguments or the data exit 2, naming the stack's key where FINETUNE_STACK_KEYS gives it.

The script is a small package of flat modules shipped beside it (the stack's ConfigMap ships every finetune_*.py;
Python finds them in the script's own folder): finetune_config.py (errors, ds_config.json), finetune_data.py
(sources and record formats), finetune_read.py (the first records), finetune_render.py (tokens and labels),
finetune_check.py (the data check), finetune_checkpoints.py (resuming). `DS_ACCELERATOR=cpu` runs the same path on
CPUs with gloo: that is how `make e2e` runs it across network-namespace hosts. torch, transformers, peft, datasets
and deepspeed are imported inside functions: the modules' tops are plain Python, unit-tested without them
(tests/test_finetune_script.py, tests/test_finetune_data.py); the run functions and `main` are unit-tested under
stand-ins for those modules, each rank a thread (tests/test_finetune_run.py), and with the real libraries on a tiny
model (tests/recipe).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

from recipes import finetune_tiered as tiered
from recipes.contract import EXIT_PREEMPTED, EXIT_USAGE, FINETUNE, MARKER
from recipes.finetune_check import Plan, check, check_fields, encode_record, plan, report_lines
from recipes.finetune_checkpoints import newest_checkpoint
from recipes.finetune_config import (
    StackKeys,
    UsageError,
    combination_problems,
    cpu_run,
    hf_token,
    load_ds_config,
    offloads_params,
    prepared_ds_config,
    resolve_precision,
    trainer_ds_args,
    zero_stage,
)
from recipes.finetune_data import (
    DataSource,
    FieldSpec,
    RecordError,
    data_source,
    parse_roles,
)
from recipes.finetune_fabric import fabric_refusal, nccl_divert
from recipes.finetune_hpu import (
    dtype_keyword,
    hpu_run,
    logging_dir_arguments,
    padding_free_problem,
    token_ids_feature,
    tokenizer_keyword,
    tokens_seen,
    trainer_classes,
)
from recipes.finetune_read import first_records
from recipes.finetune_render import (
    CHAT_TEMPLATE_AUTO,
    CHAT_TEMPLATE_RAW,
    IGNORE_INDEX,
    Encoded,
    learns_something,
    pad_batch,
    template_file,
)
from recipes.finetune_tokenized import (
    BLOCKS,
    EVAL,
    MARKER_FILE,
    PADDING_FREE,
    TOKENIZED_FOLDER,
    TRAIN,
    code_identity,
    describe,
    fingerprint,
    made_line,
    pack_blocks,
    packing_for,
    read_marker,
    reused_line,
    source_identity,
    this_host_procs,
    tokenized_marker_text,
    tokenizer_identity,
)

SAMPLE_FILE = "rendered-sample.json"  # in CHECKPOINT_DIR: the first record as trained

# The contract's environment variables (recipes/contract.py: each option's `env`), each the default of its argument
# (the argument wins).
ENV_DEFAULTS = FINETUNE.env_defaults()
# Vertex AI's own variables (a CustomJob with baseOutputDirectory sets them, as gs:// URIs, on every replica; its
# TensorBoard uploads what lands under AIP_TENSORBOARD_LOG_DIR): the fall-back where neither the argument nor the
# contract's variable is given, so the same argv runs on Vertex AI and the files land where Vertex looks.
VERTEX_DEFAULTS = {"checkpoint_dir": "AIP_CHECKPOINT_DIR", "model_dir": "AIP_MODEL_DIR"}
LOGS_ENV, VERTEX_LOGS_ENV = "TENSORBOARD_LOGGING_DIR", "AIP_TENSORBOARD_LOG_DIR"
GCS_URI, GCS_FUSE_ROOT = "gs://", "/gcs"  # Vertex AI mounts every bucket the job may read at /gcs/<bucket>
REQUIRED = ("model", "dataset", "checkpoint_dir", "model_dir")
# What MODEL_DIR holds, as the marker says: a LoRA adapter, the base with the adapter merged in, or every weight.
ADAPTER, MERGED, FULL = "adapter", "merged", "full"
# peft's adapter folder (PeftModel.save_pretrained: SAFETENSORS_WEIGHTS_NAME, CONFIG_NAME) and a whole model's
# files (transformers' save_pretrained): an export of one kind removes the other's, so that MODEL_DIR never holds
# both a stale model and a new adapter.
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")
MODEL_FILE_GLOBS = ("config.json", "generation_config.json", "model*.safetensors", "model.safetensors.index.json",
                    "pytorch_model*.bin")
# The field flags each record format reads (finetune_data.py); `auto` takes one family of them.
FIELD_FLAGS = ("text_field", "prompt_field", "response_field", "messages_field", "role_field", "content_field",
               "roles")
READS = {"text": {"text_field"},
         "prompt-completion": {"prompt_field", "response_field", "role_field", "content_field", "roles"},
         "messages": {"messages_field", "role_field", "content_field", "roles"},
         "sharegpt": {"messages_field", "role_field", "content_field", "roles"},
         "alpaca": set()}
DEFAULT_SAVE_STEPS = FINETUNE.option("save_steps").default
DEFAULT_EVAL_BATCH = 8  # the Trainer's per_device_eval_batch_size, where ds_config.json gives no micro batch


# --- arguments ----------------------------------------------------------------------------------------------

def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def build_parser() -> argparse.ArgumentParser:
    """finetune.py's parser: every option as recipes/contract.py declares it."""
    return FINETUNE.parser(description=__doc__.splitlines()[0])


def parse_args(argv: Sequence[str] | None, environ: Mapping[str, str]) -> argparse.Namespace:
    """The arguments, the contract's environment variables filling what was not given; UsageError lists every
    problem at once."""
    args = build_parser().parse_args(argv)
    for name, variable in ENV_DEFAULTS.items():
        if getattr(args, name) is None and environ.get(variable, "").strip():
            value = environ[variable].strip()
            if name == "save_steps":
                if not value.isdigit():
                    raise UsageError(f"{variable}={value!r}: expected a whole number of steps")
                setattr(args, name, int(value))
            else:
                setattr(args, name, value)
    for name, variable in VERTEX_DEFAULTS.items():
        if getattr(args, name) is None and environ.get(variable, "").strip():
            setattr(args, name, fuse_path(environ[variable].strip()))
    if args.save_steps is None:
        args.save_steps = DEFAULT_SAVE_STEPS
    problems = argument_problems(args)
    if problems:
        raise UsageError("; ".join(problems))
    return args


def fuse_path(value: str) -> str:
    """A gs://BUCKET/PATH URI (Vertex AI's AIP_* variables) as the path of Vertex AI's FUSE mount; a path as is."""
    if value.startswith(GCS_URI):
        return f"{GCS_FUSE_ROOT}/{value[len(GCS_URI):]}"
    return value


def tensorboard_dir(environ: Mapping[str, str]) -> str | None:
    """Where TensorBoard's event files go: TENSORBOARD_LOGGING_DIR (the stack's, on GKE), else Vertex AI's
    AIP_TENSORBOARD_LOG_DIR (set when the CustomJob names a TensorBoard); None: no event files."""
    for variable in (LOGS_ENV, VERTEX_LOGS_ENV):
        if environ.get(variable, "").strip():
            return fuse_path(environ[variable].strip())
    return None


def _variables(name: str) -> str:
    return " or ".join(v for v in (ENV_DEFAULTS[name], VERTEX_DEFAULTS.get(name)) if v)


def argument_problems(args: argparse.Namespace) -> list[str]:
    # The data check alone (make check-data on a laptop) needs the data; a model only to render it.
    required = ("dataset",) if args.check_data and not args.prepare_data else REQUIRED
    problems = [f"{_flag(name)} (or {_variables(name)}) is required" for name in required
                if not getattr(args, name)]
    problems += FINETUNE.problems(args)  # each option's bounds (recipes/contract.py)
    if bool(args.prompt_field) != bool(args.response_field):
        problems.append("--prompt-field and --response-field go together (or neither: --text-field)")
    problems += record_flag_problems(args)
    if args.epochs is not None and args.max_steps is not None:
        problems.append("give --epochs or --max-steps, not both")
    problem = eval_split(args.eval_split)[1]
    if problem:
        problems.append(problem)
    if args.lora and any(not t.strip() for t in args.lora_target_modules):
        problems.append("--lora-target-modules needs module names (or all-linear)")
    return problems


def record_flag_problems(args: argparse.Namespace) -> list[str]:
    """The field flags the record format reads (a flag it never reads would be dropped without a word), and --roles
    pairs."""
    given = [name for name in FIELD_FLAGS if getattr(args, name)]
    problems = parse_roles(args.roles)[1]
    if args.records != "auto":
        problems += [f"{_flag(name)} is not read with --records {args.records}" for name in given
                     if name not in READS[args.records]]
        return problems
    families = {"--text-field": args.text_field, "--prompt-field": args.prompt_field,
                "--messages-field": args.messages_field}
    named = [flag for flag, value in families.items() if value]
    if len(named) > 1:
        problems.append(f"{' and '.join(named)} name fields of different record formats: give one (or --records)")
    return problems


def eval_split(value: str | None) -> tuple[float | str | None, str | None]:
    """--eval-split: a fraction of the records in (0, 1), or a path (a file or folder of held-out records); with
    what is wrong with it."""
    if value is None:
        return None, None
    try:
        fraction = float(value)
    except ValueError:
        return value, None
    if not 0 < fraction < 1:
        return None, f"--eval-split {value}: a fraction of the records must be between 0 and 1 (e.g. 0.05)"
    return fraction, None


def field_spec(args: argparse.Namespace) -> FieldSpec:
    return FieldSpec(args.records, args.text_field, args.prompt_field, args.response_field, args.messages_field,
                     args.role_field, args.content_field, parse_roles(args.roles)[0])


def named_template(args: argparse.Namespace) -> str | None:
    """The template --chat-template names by its file; None for auto and raw."""
    if args.chat_template in (CHAT_TEMPLATE_AUTO, CHAT_TEMPLATE_RAW):
        return None
    return template_file(args.chat_template)


def export_kind(lora: bool, lora_export: str) -> str:
    """What MODEL_DIR holds: ADAPTER, MERGED (LoRA merged into the base) or FULL (every weight trained)."""
    return FULL if not lora else (ADAPTER if lora_export == ADAPTER else MERGED)


def marker_text(step: int, model: str, *, lora: bool, dataset: str, precision: str, world_size: int,
                finished: datetime.datetime, export: str = FULL, lora_rank: int | None = None,
                rendering: Mapping[str, str] | None = None) -> str:
    """MODEL_DIR/.complete: what a server waiting on it (and a person) wants to know; written last. `export` says
    what the folder holds; an adapter's marker also has its rank (vLLM's --max-lora-rank must hold it) and its base
    is `model`. `rendering` (marker_rendering) says how the records were rendered: what evaluate.py renders its
    task with, without being told."""
    fields: dict[str, Any] = {"step": step, "model": model, "lora": lora, "export": export, "dataset": dataset,
                              "precision": precision, "world_size": world_size,
                              "finished": finished.isoformat(timespec="seconds"), **(rendering or {})}
    if export == ADAPTER and lora_rank is not None:
        fields["lora_rank"] = lora_rank
    return json.dumps(fields, sort_keys=True) + "\n"


def marker_rendering(the_plan: Plan, chat_template: str) -> dict[str, str]:
    """The marker's account of how the model learned its records: `rendering` chat (through the chat template
    saved with the export: the model is asked on /v1/chat/completions) or raw (prompt text: /v1/completions),
    `chatTemplate` (--chat-template: auto, raw or the named template's file) and the records' `recordFormat`."""
    return {"rendering": "chat" if the_plan.rendering.chat else "raw", "chatTemplate": chat_template,
            "recordFormat": the_plan.layout.format}


def stale_files(model_dir: Path, export: str) -> list[Path]:
    """Files of the other kind of export in MODEL_DIR (an adapter's beside a new whole model, or the reverse)."""
    if not model_dir.is_dir():
        return []
    if export == ADAPTER:
        return sorted({p for pattern in MODEL_FILE_GLOBS for p in model_dir.glob(pattern) if p.is_file()})
    return sorted(p for name in ADAPTER_FILES if (p := model_dir / name).is_file())


def say(text: str) -> None:
    """Print, surviving a closed stdout: on preemption the ssh session that carries it may be gone first."""
    with contextlib.suppress(OSError):
        print(f"[finetune] {text}", flush=True)


class ForgivingStream:
    """stdout/stderr that survive the reader going away: on preemption the ssh session carrying a rank's output may
    close before the rank has saved its checkpoint, and a log line must not kill the save (BrokenPipeError)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except OSError:
            return len(text)

    def flush(self) -> None:
        with contextlib.suppress(OSError):
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class StopRequest:
    """Set by SIGTERM (Kubernetes' preemption notice: the grace period has started)."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def __call__(self, signum: int, _frame: object) -> None:
        self.signal = signum


# --- the run (torch, transformers, peft, datasets, deepspeed) -----------------------------------------------

def _configure_cpu_deepspeed() -> None:
    """DeepSpeed on CPUs: accelerate's state set up for DeepSpeed over gloo before the Trainer's arguments. Left
    to the Trainer, accelerate finds no GPU backend, inits DeepSpeed's comm without one and counts one process
    (DeepSpeed's train_batch_size assertion follows); TrainingArguments then takes this state as it is
    (accelerator_config use_configured_state)."""
    from accelerate import PartialState

    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    try:
        PartialState(backend="gloo")
    finally:
        del os.environ["ACCELERATE_USE_DEEPSPEED"]


def _stop_callback(stop: StopRequest) -> Any:
    import torch
    import torch.distributed as dist
    from transformers import TrainerCallback

    class StopOnSignal(TrainerCallback):  # type: ignore[misc]
        """After each step the ranks agree (one all-reduce) whether any got SIGTERM; then all save and stop."""

        stopped_at: int | None = None

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> Any:
            flag = torch.tensor([1.0 if stop.signal is not None else 0.0], device=args.device)
            if dist.is_available() and dist.is_initialized():
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item() > 0:
                control.should_save = True
                control.should_training_stop = True
                self.stopped_at = state.global_step
            return control

    return StopOnSignal()


class AtLastStep(Exception):  # noqa: N818 (an outcome, not an error)
    """The run resumed at (or past) its last step: nothing is left to train."""


def _last_step_callback() -> Any:
    from transformers import TrainerCallback

    class StopAtLastStep(TrainerCallback):  # type: ignore[misc]
        """Ends train() before its first step when the checkpoint it resumed is at max_steps: the Trainer checks
        max_steps only after a step (transformers 5.19, DefaultFlowCallback.on_step_end), so it would train one
        more (step 21 of 20). on_train_begin comes once the checkpoint is loaded (the weights, DeepSpeed's engine),
        so what it holds is exported as it is."""

        def on_train_begin(self, args: Any, state: Any, control: Any, **_: Any) -> Any:
            if state.max_steps > 0 and state.global_step >= state.max_steps:
                raise AtLastStep(state.global_step)
            return control

    return StopAtLastStep()


def _load_records(source: DataSource, token: str | None, what: str, cache: str | None = None) -> Any:
    """The whole data set (`datasets`, its train split), or UsageError naming `what` (--dataset, --eval-split)."""
    import datasets

    try:
        if source.loader == "hub":
            return datasets.load_dataset(source.hub_id, split="train", token=token)
        # The Arrow cache on this host's own disk: not shared between hosts (their locks would race) nor on the
        # bucket's FUSE mount (no file locks there).
        cache = cache or tempfile.mkdtemp(prefix="finetune-data-")
        return datasets.load_dataset(source.loader, data_files=list(source.files), split="train", cache_dir=cache)
    except (ValueError, TypeError, datasets.exceptions.DatasetGenerationError) as error:
        # A file Arrow cannot read as one table (a line that is not JSON, a field of two types, ...).
        cause = error.__cause__ or error
        raise UsageError(f"{what}: cannot read the records ({type(cause).__name__}: {cause})") from None


def _encoded(data: Any, the_plan: Plan, tokenizer: Any, seq_len: int | None, keys: StackKeys, what: str) -> Any:
    """Every record as trained (finetune_check.encode_record), ids and labels as int32 (half of Python's int64 on
    disk: 8 bytes a token); the samples with nothing to learn left out. seq_len None: not cut (packed into blocks
    after)."""
    import datasets

    cut = sys.maxsize if seq_len is None else seq_len

    def encode(record: dict[str, Any], index: int) -> dict[str, Any]:
        try:
            encoded = encode_record(record, index + 1, the_plan, tokenizer, cut)
        except RecordError as error:
            raise UsageError(error.named(keys)) from None
        if encoded is None:  # a blank text record
            return {"input_ids": [], "labels": [], "length": 0}
        return {"input_ids": encoded.input_ids, "labels": encoded.labels, "length": encoded.length}

    ids = token_ids_feature(datasets)  # datasets' own List or, before 4.0 (the Gaudi image's), Sequence
    features = datasets.Features({"input_ids": ids, "labels": ids, "length": datasets.Value("int64")})
    cpus, procs = this_host_procs()
    # One process a usable CPU (finetune_tokenized.data_procs): on a GPU worker's 100-200 CPUs the step takes
    # minutes, not hours. `datasets` brings a failing record's UsageError back from its process.
    say(f"tokenizing {what} in {procs} process{'es' if procs > 1 else ''} ({cpus} CPUs usable here)")
    encoded = data.map(encode, with_indices=True, remove_columns=list(data.column_names), features=features,
                       desc=f"tokenize {what}", num_proc=procs if procs > 1 else None)
    longer = 0 if seq_len is None else sum(1 for length in encoded["length"] if length > seq_len)
    kept = encoded.filter(learns_something).remove_columns(["length"])
    if len(kept) == 0:
        raise UsageError(f"{keys.of('--seq-len')}: no record of {what} has anything to learn within {cut} tokens")
    cut_said = "" if seq_len is None else f" ({longer} longer than {seq_len} tokens, cut;"
    say(f"{what}: {len(kept)} samples of {len(data)} records{cut_said or ' ('}"
        f"{' ' if cut_said else ''}{len(data) - len(kept)} with nothing to learn, left out)")
    return kept


def _blocks(encoded: Any, seq_len: int, cache: str) -> Any:
    """Text samples packed (finetune_tokenized.pack_blocks), written by `datasets` as they come: memory holds one
    block and one batch of documents, whatever the data's size. Text learns every token: the labels are the ids
    (the collator's), so only the ids are kept."""
    import datasets

    def documents() -> Iterator[list[int]]:
        for batch in encoded.iter(batch_size=1000):
            yield from batch["input_ids"]

    def blocks() -> Iterator[dict[str, list[int]]]:
        for block in pack_blocks(documents(), seq_len):
            yield {"input_ids": block}

    features = datasets.Features({"input_ids": token_ids_feature(datasets)})
    return datasets.Dataset.from_generator(blocks, features=features, cache_dir=cache)


class Head(NamedTuple):
    """What the first record settles for the whole run: how records are read and rendered, the first as trained,
    the packing, and the named chat template (None: the model's own or none)."""

    plan: Plan
    first: Encoded | None
    packing: str
    named: str | None


def _head(args: argparse.Namespace, tokenizer: Any, token: str | None, keys: StackKeys) -> Head:
    """The first record read (without loading the whole data set), its plan and rendering. The tokenizer gets
    the named chat template afterwards, so the export saves the template the model was trained with."""
    source = data_source(args.dataset, args.format)
    named = named_template(args)
    try:
        head = first_records(source, 1, token)
        if not head:
            raise UsageError(f"{keys.of('--dataset')}: no records")
        the_plan = plan(head[0], field_spec(args), args.chat_template, tokenizer.chat_template, named)
        first = encode_record(head[0], 1, the_plan, tokenizer, args.seq_len)
    except RecordError as error:
        raise UsageError(error.named(keys)) from None
    packing = packing_for(args.packing, the_plan.data_kind)
    if packing == PADDING_FREE:
        import transformers

        problem = padding_free_problem(transformers.__version__, hpu_run(os.environ))
        if problem:
            raise UsageError(f"{keys.of('--packing')}: {problem}")
    return Head(the_plan, first, packing, named)


def tokenized_root(args: argparse.Namespace) -> Path:
    return Path(args.tokenized_dir) if args.tokenized_dir else Path(args.checkpoint_dir) / TOKENIZED_FOLDER


def fingerprint_parts(args: argparse.Namespace, source: DataSource, tokenizer: Any, head: Head,
                      data_fingerprint: str | None) -> dict[str, Any]:
    """Everything that decides the tokenized data (finetune_tokenized.py): its folder's name."""
    identity = source_identity(source)
    if data_fingerprint is not None:
        identity["datasets"] = data_fingerprint
    return {"data": identity, "tokenizer": tokenizer_identity(tokenizer), "records": args.records,
            "fields": [getattr(args, name) for name in FIELD_FLAGS], "format": args.format,
            "chatTemplate": args.chat_template, "namedTemplate": head.named, "seqLen": args.seq_len,
            "packing": head.packing, "evalSplit": args.eval_split, "seed": args.seed,
            "code": code_identity(Path(__file__).resolve().parent)}


def _datasets(args: argparse.Namespace, tokenizer: Any, token: str | None, keys: StackKeys, head: Head,
              talk: bool = True, load: bool = True) -> tuple[Any, Any]:
    """(train, eval or None): the tokenized folder of these settings memory-mapped where it is complete; else the
    records read, rendered, split and packed, saved there (the marker last) and memory-mapped. `datasets` is
    imported only to make or read the folder: the launcher's step on a restart finds it complete and stops there."""
    source = data_source(args.dataset, args.format)
    data = None
    if source.loader == "hub":  # a hub dataset's id does not name its revision: its download's fingerprint does
        data = _load_records(source, token, keys.of("--dataset"))
    parts = fingerprint_parts(args, source, tokenizer, head, None if data is None else data._fingerprint)
    if head.named is not None:
        tokenizer.chat_template = head.named
    folder = tokenized_root(args) / fingerprint(parts)
    marker = read_marker(folder)
    if marker is None:
        started = time.monotonic()
        marker = _make_tokenized(args, head, tokenizer, token, keys, data, source, folder, parts)
        say(made_line(folder, marker["records"], marker["samples"], marker["tokens"], time.monotonic() - started))
    elif talk:
        say(reused_line(folder, marker))
    if not load:
        return None, None
    import datasets

    train = datasets.load_from_disk(str(folder / TRAIN))
    held_out = datasets.load_from_disk(str(folder / EVAL)) if marker.get("heldOut") is not None else None
    return train, held_out


def _make_tokenized(args: argparse.Namespace, head: Head, tokenizer: Any, token: str | None, keys: StackKeys,
                    data: Any, source: DataSource, folder: Path, parts: dict[str, Any]) -> dict[str, Any]:
    """Every record read, split, rendered and packed; saved into `folder` with `datasets`' save_to_disk, then the
    marker, last. The working copies go into a temporary folder of this host's disk, removed afterwards."""
    cache = tempfile.mkdtemp(prefix="finetune-data-")
    started = time.monotonic()
    try:
        if data is None:
            data = _load_records(source, token, keys.of("--dataset"), cache)
        if len(data) == 0:
            raise UsageError(f"{keys.of('--dataset')}: no records")
        records = len(data)
        held_out = None
        fraction, _ = eval_split(args.eval_split)
        if isinstance(fraction, float):
            split = data.train_test_split(test_size=fraction, seed=args.seed)
            data, held_out = split["train"], split["test"]
        elif fraction is not None:
            held_out = _load_records(data_source(fraction), token, keys.of("--eval-split"), cache)
        seq_len = None if head.packing == BLOCKS else args.seq_len
        train = _encoded(data, head.plan, tokenizer, seq_len, keys, "the training records")
        evaluation = (None if held_out is None
                      else _encoded(held_out, head.plan, tokenizer, seq_len, keys, "the held-out records"))
        if head.packing == BLOCKS:
            train = _blocks(train, args.seq_len, cache)
            evaluation = None if evaluation is None else _blocks(evaluation, args.seq_len, cache)
        folder.mkdir(parents=True, exist_ok=True)
        train.save_to_disk(str(folder / TRAIN))
        if evaluation is not None:
            evaluation.save_to_disk(str(folder / EVAL))
        tokens = sum(len(ids) for batch in train.iter(batch_size=1000) for ids in batch["input_ids"])
        marker = {"records": records, "samples": len(train), "tokens": tokens, "packing": head.packing,
                  "heldOut": None if evaluation is None else len(evaluation)}
        (folder / MARKER_FILE).write_text(tokenized_marker_text(
            marker, seconds=time.monotonic() - started, parts=parts, made=datetime.datetime.now(datetime.timezone.utc)),
            encoding="utf-8")
        return marker
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _progress_callbacks(args: argparse.Namespace) -> list[Any]:
    """Progress and metrics (finetune_progress.py, shipped beside this file), then TensorBoard's writer where
    TENSORBOARD_LOGGING_DIR (or Vertex AI's AIP_TENSORBOARD_LOG_DIR) names its folder, then what closes its file at
    each logging step: in that order, so the tokens/s and MFU the first adds to the logs are written with the loss,
    and the file is in the bucket (GCS FUSE uploads it on close) while the run lasts."""
    from recipes import finetune_progress as progress

    out = [progress.progress_callback(progress.RunFacts.from_env(os.environ), args.checkpoint_dir, args.model_dir,
                                      say)]
    logs = tensorboard_dir(os.environ)
    if logs is not None:
        from transformers.integrations import TensorBoardCallback

        os.environ[LOGS_ENV] = logs  # the writer reads its folder from there
        try:
            writer = TensorBoardCallback()
        except RuntimeError as error:  # an image without tensorboard: the run goes on, the log says why
            say(f"no TensorBoard event files: {error}")
        else:  # each logging step's points in a file of their own, closed: in the bucket while the run lasts
            out += [writer, progress.event_file_closer(writer)]
    return out


def _write_sample(checkpoint_dir: str, first: Any, tokenizer: Any) -> None:
    """CHECKPOINT_DIR/rendered-sample.json: the first record as the ranks train on it (make e2e compares it with
    the tokenizer's own rendering; a person reads what the model learns)."""
    path = Path(checkpoint_dir) / SAMPLE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    learned = [t for t, label in zip(first.input_ids, first.labels, strict=True) if label != -100]
    path.write_text(json.dumps({"record": 1, "input_ids": first.input_ids,
                                "labels": first.labels, "text": tokenizer.decode(first.input_ids),
                                "learned": tokenizer.decode(learned)}, indent=1) + "\n", encoding="utf-8")


def _check_data(args: argparse.Namespace, token: str | None, keys: StackKeys) -> Any:
    """--check-data: the first records (and the held-out file's) read, checked and rendered as the ranks will;
    what was found printed; the tokenizer, or None where it cannot be loaded here. A data error is a UsageError
    (exit 2, final at the launcher)."""
    sources = [("--dataset", data_source(args.dataset, args.format))]
    fraction, _ = eval_split(args.eval_split)
    if isinstance(fraction, str):
        sources.append(("--eval-split", data_source(fraction)))
    named = named_template(args)
    tokenizer = _check_tokenizer(args, token, keys)
    limit, read_all = args.check_records or None, not args.check_records
    for flag, source in sources:
        try:
            records = first_records(source, limit, token, keep_broken=True)
        except RecordError as error:
            raise UsageError(error.named(keys)) from None
        if tokenizer is None:
            say(f"data check, {keys.of(flag)}: {check_fields(records, field_spec(args), keys, read_all)}")
            continue
        report = check(records, field_spec(args), tokenizer, args.chat_template, named, args.seq_len, keys,
                       read_all)
        first, *rest = report_lines(report, tokenizer, args.seq_len, keys)
        say(f"data check, {keys.of(flag)}: {first}")
        for line in rest:
            say(f"  {line}")
    return tokenizer


def _check_tokenizer(args: argparse.Namespace, token: str | None, keys: StackKeys) -> Any:
    """The model's tokenizer for the data check, or None (the fields are then checked without rendering): no
    --model given, transformers not installed here (a laptop), or a hub model that cannot be fetched now."""
    if not args.model:
        say("no --model: the records' formats and fields are checked, not rendered (give the model, a local "
            "folder or a Hugging Face id in this machine's cache, for the first record as trained)")
        return None
    try:
        return _tokenizer(args.model, token)
    except ModuleNotFoundError as error:
        say(f"{error.name} is not installed in this python: the records' fields are checked without rendering them "
            "(`make check-data` installs it)")
    except OSError as error:
        if Path(args.model).exists():  # the bucket's folder: no restart brings its tokenizer
            raise UsageError(f"{keys.of('--model')}: cannot load its tokenizer ({error})") from None
        if os.environ.get("HF_HUB_OFFLINE") == "1":  # make check-data: nothing is downloaded there
            raise UsageError(f"{keys.of('--model')}: {args.model} is neither a local folder nor in this machine's "
                             "Hugging Face cache, and nothing is downloaded here (HF_HUB_OFFLINE=1): give a local "
                             "folder, or download the model first (`hf download MODEL`)") from None
        # A hub model the launcher cannot fetch now (the network, the hub): the ranks will try again.
        say(f"the tokenizer of {args.model} cannot be loaded here ({error}): the records' fields are checked "
            "without rendering them")
    return None


def _prepare_data(args: argparse.Namespace, token: str | None, keys: StackKeys) -> int:
    """--prepare-data: the check, then the tokenized folder made (or found): the ranks then only memory-map it."""
    tokenizer = _check_data(args, token, keys)
    if tokenizer is None:
        say("the ranks tokenize the data (rank 0 first, the others wait)")
        return 0
    head = _head(args, tokenizer, token, keys)
    say(f"records: {head.plan.layout.format}; {describe(head.packing, args.seq_len)}")
    _datasets(args, tokenizer, token, keys, head, load=False)
    return 0


def _tokenizer(model: str, token: str | None) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model, token=token)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def padding_free_line(examples: Sequence[Mapping[str, Sequence[int]]], row: int) -> str:
    longest = max(len(e["input_ids"]) for e in examples)
    return (f"padding-free batch: {len(examples)} records in one row of {row} tokens (padded, "
            f"{len(examples)} x {longest} = {len(examples) * longest})")


def _collator(pad_id: int, packing: str) -> Any:
    """Padding-free: transformers' DataCollatorWithFlattening (a micro batch's records in one row, position ids
    restarting at each, the first label of each masked); else right-padded to the longest sample (text blocks are
    all full but the last)."""
    if packing == PADDING_FREE:
        from transformers import DataCollatorWithFlattening

        flatten = DataCollatorWithFlattening(return_position_ids=True, separator_id=IGNORE_INDEX)
        said: list[bool] = []

        def flattened(examples: list[dict[str, list[int]]]) -> dict[str, Any]:
            batch = flatten(examples)
            if not said:  # the first batch, as the model gets it (the log shows the packing at work)
                said.append(True)
                say(padding_free_line(examples, int(batch["input_ids"].shape[-1])))
            return batch

        return flattened
    import torch

    def collate(examples: list[dict[str, list[int]]]) -> dict[str, Any]:
        return {k: torch.tensor(v) for k, v in pad_batch(examples, pad_id).items()}

    return collate


def _export(trainer: Any, args: argparse.Namespace, tokenizer: Any, token: str | None, precision: str,
            step: int, the_plan: Plan | None = None) -> None:
    """Every rank takes part in saving (ZeRO-3 gathers the weights); rank 0 writes MODEL_DIR and the marker. An
    adapter export is the Trainer's own save of the peft model (adapter_config.json, adapter_model.safetensors);
    a merged one saves the adapter aside first and merges it into the base on rank 0."""
    import shutil

    model_dir = Path(args.model_dir)
    export = export_kind(args.lora, args.lora_export)
    if trainer.is_world_process_zero():
        model_dir.mkdir(parents=True, exist_ok=True)
        (model_dir / MARKER).unlink(missing_ok=True)  # an older model's marker: not this one's
        for stale in stale_files(model_dir, export):
            stale.unlink()
    saved = Path(args.checkpoint_dir) / "adapter-export" if export == MERGED else model_dir
    # MODEL_DIR is shared: only rank 0 writes it. Tiered saves had every node write its own checkpoint files
    # (save_on_each_node); here the other nodes would overwrite rank 0's gathered weights with their empty shards.
    trainer.args.save_on_each_node = False
    trainer.save_model(str(saved))
    trainer.accelerator.wait_for_everyone()
    if trainer.is_world_process_zero():
        if export == MERGED:
            _merge_adapter(args, saved, token, precision)
            shutil.rmtree(saved, ignore_errors=True)
        tokenizer.save_pretrained(str(model_dir))
        world = trainer.args.world_size
        text = marker_text(step, args.model, lora=args.lora, dataset=args.dataset, precision=precision,
                           world_size=world, finished=datetime.datetime.now(datetime.timezone.utc), export=export,
                           lora_rank=args.lora_rank if args.lora else None,
                           rendering=marker_rendering(the_plan, args.chat_template) if the_plan else None)
        (model_dir / MARKER).write_text(text, encoding="utf-8")
        say(f"exported step {step} to {model_dir} ({export})")
    trainer.accelerator.wait_for_everyone()


def _merge_adapter(args: argparse.Namespace, adapter: Path, token: str | None,
                   precision: str) -> None:
    """The base model, whole on this host's CPU (outside ZeRO-3's partitioning), with the adapter merged in."""
    import torch
    import transformers
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()  # else from_pretrained would partition the base model across the ranks again
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[precision]
    base = AutoModelForCausalLM.from_pretrained(args.model, token=token,
                                                **{dtype_keyword(transformers.__version__): dtype})
    merged = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
    merged.save_pretrained(args.model_dir, safe_serialization=True)


def _lora(model: Any, args: argparse.Namespace) -> Any:
    from peft import LoraConfig, get_peft_model

    targets: Any = args.lora_target_modules
    if targets == ["all-linear"]:
        targets = "all-linear"
    config = LoraConfig(r=args.lora_rank, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout,
                        target_modules=targets, task_type="CAUSAL_LM")
    if args.gradient_checkpointing:
        model.enable_input_require_grads()
    return get_peft_model(model, config)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv, os.environ)
        keys = StackKeys.from_env(os.environ)
        token = hf_token(os.environ)
        if args.prepare_data:
            return _prepare_data(args, token, keys)
        if args.check_data:
            _check_data(args, token, keys)
            return 0
        ds = prepared_ds_config(load_ds_config(args.deepspeed))
        if args.local_checkpoint_dir:
            ds = tiered.local_ds_config(ds)
        precision = resolve_precision(args.precision, ds)
        cpu = cpu_run(os.environ)
        problems = combination_problems(args.lora, zero_stage(ds), precision, cpu, offloads_params(ds))
        if problems:
            raise UsageError("; ".join(problems))
        data_source(args.dataset, args.format)  # a missing file or mixed folder: said before anything loads
        named_template(args)  # and a template file that cannot be read
    except UsageError as error:
        say(f"FAILED: {error}")
        return EXIT_USAGE

    import signal

    sys.stdout, sys.stderr = ForgivingStream(sys.stdout), ForgivingStream(sys.stderr)
    stop = StopRequest()
    signal.signal(signal.SIGTERM, stop)
    net, nccl_log = nccl_divert(os.environ)  # before NCCL starts: its init lines into a file this rank reads
    cpu_deepspeed = cpu and ds is not None
    if cpu_deepspeed:
        _configure_cpu_deepspeed()

    import transformers

    # The Gaudi image's transformers is older (finetune_hpu.py): four keywords by its version.
    version = transformers.__version__
    # transformers' Trainer, or on Intel Gaudi optimum-habana's GaudiTrainer (finetune_hpu.py): the same keywords.
    Trainer, TrainingArguments = trainer_classes(os.environ)  # noqa: N806 (classes)

    tokenizer = _tokenizer(args.model, token)
    try:
        head = _head(args, tokenizer, token, keys)
    except UsageError as error:
        say(f"FAILED: {error}")
        return EXIT_USAGE
    say(f"records: {head.plan.layout.format}; {head.plan.rendering.describe()}; {describe(head.packing, args.seq_len)}")
    # TrainingArguments before the model: under ZeRO-3 it makes from_pretrained load the model partitioned
    # (zero.Init).
    ds_args = trainer_ds_args(ds, precision)
    training = TrainingArguments(
        # Tiered: the Trainer saves to the node's local disk, every node its own files (finetune_tiered.py).
        output_dir=args.local_checkpoint_dir or args.checkpoint_dir,
        save_on_each_node=bool(args.local_checkpoint_dir),
        deepspeed=ds,
        learning_rate=args.learning_rate,
        num_train_epochs=args.epochs if args.epochs is not None else 1.0,
        max_steps=args.max_steps if args.max_steps is not None else -1,
        save_strategy="steps",
        save_steps=args.save_steps,
        save_total_limit=args.save_total_limit,
        logging_steps=args.logging_steps,
        seed=args.seed,
        report_to="none",  # TensorBoard's writer is among the callbacks below, after the progress callback
        disable_tqdm=True,  # one line per logging step (the log dicts), not progress bars in a pod log
        # Every rank's tokens, summed: tokens/s and MFU. Padding-free batches have no padding and no attention mask
        # (the Trainer would count the tokens that are not the pad id, and EOS is the pad id here).
        include_num_input_tokens_seen=tokens_seen(version, padding_free=head.packing == PADDING_FREE),
        gradient_checkpointing=args.gradient_checkpointing,
        use_cpu=cpu and not cpu_deepspeed,
        accelerator_config={"use_configured_state": cpu_deepspeed},
        **logging_dir_arguments(version, tensorboard_dir(os.environ)),
        **eval_args(args, ds_args),
        **ds_args,
    )
    import torch

    _ = training.process_index  # the process group starts here (DeepSpeed's init_distributed, through accelerate)
    refused = fabric_refusal(net, nccl_log, os.environ, torch, torch.distributed, say)
    if refused:  # NCCL is not on the GPU fabric's network: final (finetune_fabric.py)
        say(f"FAILED: {refused}")
        torch.distributed.destroy_process_group()
        return EXIT_USAGE
    try:
        # Rank 0 first (the others wait at a barrier): it makes the tokenized folder where the launcher's
        # --prepare-data has not, then every rank memory-maps it.
        with training.main_process_first(local=False, desc="the tokenized data"):
            data, held_out = _datasets(args, tokenizer, token, keys, head, talk=training.process_index == 0)
    except UsageError as error:
        say(f"FAILED: {error}")
        return EXIT_USAGE
    if training.process_index == 0 and head.first is not None:
        _write_sample(args.checkpoint_dir, head.first, tokenizer)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[precision]
    model, use_cache = training_model(args.model, token, version, dtype)
    if args.lora:
        model = _lora(model, args)
    callback = _stop_callback(stop)
    copier, copies = None, []
    if args.local_checkpoint_dir:
        copier = tiered.start(args.local_checkpoint_dir, args.checkpoint_dir, training.process_index,
                              training.local_process_index, training.world_size, args.save_total_limit,
                              lambda: stop.signal is not None, args.copy_rate_mb, say)
        copies = [tiered.copy_callback(copier)]
    trainer = Trainer(model=model, args=training, train_dataset=data, eval_dataset=held_out,
                      data_collator=_collator(tokenizer.pad_token_id, head.packing),
                      **{tokenizer_keyword(version): tokenizer},
                      callbacks=[_last_step_callback(), *_progress_callbacks(args), callback, *copies])
    # Tiered: only a copy every node finished counts (its marker); a local save may be on one node only.
    resume = newest_checkpoint(args.checkpoint_dir, tiered.COPIED_MARKER if args.local_checkpoint_dir else None)
    say(f"rank {training.process_index}/{training.world_size}: {len(data)} samples"
        f"{f', {len(held_out)} held out' if held_out is not None else ''}, ZeRO-{zero_stage(ds)}, "
        f"{precision}{', LoRA' if args.lora else ''}; " + (f"resuming from {resume}" if resume else "from the start"))
    try:
        try:
            trainer.train(resume_from_checkpoint=str(resume) if resume else None)
        except AtLastStep:
            say(f"rank {training.process_index}: {resume} is the last step ({trainer.state.max_steps}): "
                "nothing to train, exporting it")
        step = trainer.state.global_step
        if callback.stopped_at is not None:
            _finish_copies(copier)
            say(f"rank {training.process_index}: stopped at step {step} on SIGTERM, checkpoint saved")
            return EXIT_PREEMPTED
        if held_out is not None and step % args.save_steps:
            trainer.evaluate()  # the last step's eval loss too (the saves' steps had theirs)
        trainer.model.config.use_cache = use_cache  # the model's own setting again, in what the export saves
        _export(trainer, args, tokenizer, token, precision, step, head.plan)
        _finish_copies(copier)
        say(f"rank {training.process_index}: done at step {step}")
        return 0
    finally:
        # PyTorch's shutdown rule: destroy the process group before exit. It unregisters the groups but cannot stop
        # their threads (see exit_without_teardown).
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _finish_copies(copier: tiered.Copier | None) -> None:
    """Tiered: the last save's copy finishes before the rank exits (on SIGTERM, within the pods' grace period)."""
    if copier is not None:
        say("waiting for the last save's copy to the bucket")
        copier.drain()


def training_model(name: str, token: str | None, version: str, dtype: Any) -> tuple[Any, bool]:
    """The model to train, its KV cache off. Training never reads the cache, and with it on (config.use_cache, a
    causal LM's default) transformers builds the attention mask without looking for packed rows: masking_utils
    finds the records of a padding-free batch from the restarting position ids only when past_key_values is None,
    so each record would attend to the ones before it in the row (measured on make e2e's tiny Llama: flattened
    logits off by 0.26 in fp32 with the cache, 1.5e-7 without; gradient checkpointing turned it off, so only runs
    without it were hit). Returned with the model's own setting, which the export puts back."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(name, token=token, **{dtype_keyword(version): dtype})
    use_cache = bool(model.config.use_cache)
    model.config.use_cache = False
    return model, use_cache


def eval_args(args: argparse.Namespace, ds_args: Mapping[str, Any]) -> dict[str, Any]:
    """With held-out records: the eval loss at every save (the same steps), the loss only (no logits gathered)."""
    if args.eval_split is None:
        return {}
    return {"eval_strategy": "steps", "eval_steps": args.save_steps, "prediction_loss_only": True,
            "per_device_eval_batch_size": ds_args.get("per_device_train_batch_size", DEFAULT_EVAL_BATCH)}


def finalize_mpi() -> None:
    """MPI_Finalize where mpi4py started MPI (DeepSpeed's OpenMPI launcher): mpi4py calls it at exit, which
    os._exit skips, and mpirun fails a job whose rank exits without it ("exiting improperly")."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()


def exit_without_teardown(run: Callable[[], int], exit_now: Callable[[int], Any] = os._exit) -> NoReturn:
    """Run `run` and end the process with its status, flushing the output but skipping the interpreter's teardown.

    Why: after destroy_process_group() a rank still holds two gloo process groups, each with its TCP loop and two
    worker threads (gloo_tcp_loop, pt_gloo_runloop; seen in /proc/self/task at exit on every rank of `make e2e`'s
    finetune scenario). destroy_process_group() only unregisters them: DeepSpeed keeps them referenced (its
    groups module's _WORLD_GROUP, the engine's data_parallel_group, the ZeRO-3 optimizer's dp_process_group and
    every partitioned parameter's ds_process_group), so their threads run until the process ends, racing Python's
    teardown, the C++ destructors that exit() runs, and the peer rank closing its sockets. One run in four of that
    scenario ended a finished rank there with "terminate called without an active exception" (SIGABRT, exit -6,
    after "done at step 40" and the export): on a cluster a finished job marked failed and run again. os._exit
    ends the process without that teardown; the kernel stops the threads. Everything the run wrote is closed by
    then (checkpoints, the model, the marker), and the output is flushed here."""
    try:
        code = run()
    except SystemExit as stop:  # argparse's own usage errors
        code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    except BaseException:  # a crash still prints its traceback and fails the rank
        traceback.print_exc()
        code = 1
    finalize_mpi()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    exit_now(code)
    raise SystemExit(code)  # only when exit_now returned (a test's stand-in)


if __name__ == "__main__":
    exit_without_teardown(main)
