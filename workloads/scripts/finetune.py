#!/usr/bin/env python3
"""Fine-tune a causal language model with the Hugging Face Trainer under DeepSpeed ZeRO 0-3.

Run on every rank by the DeepSpeed launcher, as the stack's MPIJob and Helm release do::

    deepspeed --hostfile HOSTFILE finetune.py --deepspeed_config ds_config.json \\
        --model meta-llama/Llama-3.1-8B --dataset /gcs/bucket/data --seq-len 2048 --max-steps 1000

- Model: a Hugging Face id or a local folder (--model, FINETUNE_MODEL). A gated model's token is read from
  the file named by HF_TOKEN_PATH (never from an environment value).
- Data (--dataset, FINETUNE_DATASET): a .jsonl/.json, .parquet or .txt file, a folder of them, or a Hugging
  Face dataset id. Each record's --text-field (default `text`), or its --prompt-field and --response-field:
  prompt and response are tokenized together and only the response is learned (the prompt's labels are
  masked). A text file's lines are records with the field `text`.
- DeepSpeed: ds_config.json from --deepspeed (the launcher's --deepspeed_config). Values the Trainer owns may
  be "auto" there; where the file gives a batch size, accumulation, clipping or precision, the Trainer is set
  to the same value, so the two never disagree.
- Optional LoRA (peft): --lora with --lora-rank/--lora-alpha/--lora-dropout/--lora-target-modules; at export
  MODEL_DIR gets the adapter alone (--lora-export adapter, the default: peft's adapter_config.json and
  adapter_model.safetensors, a few MB, served on the base model by vLLM's LoRA support) or the base model with the
  adapter merged in (--lora-export merged).
- Checkpoints: the Trainer's checkpoint-N folders in --checkpoint-dir (CHECKPOINT_DIR), every --save-steps
  (CHECKPOINT_EVERY_STEPS) steps and when any rank gets SIGTERM (the ranks agree on it every step, then all
  save and stop with exit status 143). A restarted run resumes from the newest complete checkpoint by itself.
- Export: rank 0 writes the consolidated model (safetensors, config, tokenizer; ZeRO-3 gathers the weights), or
  the adapter and the tokenizer, into --model-dir (MODEL_DIR), then MODEL_DIR/.complete, last: {"step": N,
  "model": ..., "export": "adapter" | "merged" | "full", ...}: what a server waiting on it loads.

`DS_ACCELERATOR=cpu` runs the same path on CPUs with gloo: that is how `make e2e` runs it across
network-namespace hosts. torch, transformers, peft, datasets and deepspeed are imported inside functions:
everything above `_configure_cpu_deepspeed` is plain Python, unit-tested without them
(tests/test_finetune_script.py); the run functions and `main` are unit-tested under stand-ins for those modules,
each rank a thread (tests/test_finetune_run.py).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import sys
import tempfile
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

EXIT_USAGE = 2
EXIT_PREEMPTED = 143  # 128 + SIGTERM, as a shell reports it: stopped on notice, after saving a checkpoint
MARKER = ".complete"
IGNORE_INDEX = -100  # labels the loss skips (the Trainer's models' CrossEntropyLoss ignore_index)
CHECKPOINT_PREFIX = "checkpoint-"  # the Trainer's PREFIX_CHECKPOINT_DIR
# What the Trainer writes last into a checkpoint folder: a folder without it was cut off while saving.
CHECKPOINT_DONE_FILE = "trainer_state.json"

# The contract's environment variables, each the default of its argument (the argument wins).
ENV_DEFAULTS = {
    "model": "FINETUNE_MODEL",
    "dataset": "FINETUNE_DATASET",
    "save_steps": "CHECKPOINT_EVERY_STEPS",
    "checkpoint_dir": "CHECKPOINT_DIR",
    "model_dir": "MODEL_DIR",
}
REQUIRED = ("model", "dataset", "checkpoint_dir", "model_dir")
FORMATS = ("auto", "jsonl", "parquet", "text")
PRECISIONS = ("bf16", "fp16", "fp32")
LORA_EXPORTS = ("adapter", "merged")
# What MODEL_DIR holds, as the marker says: a LoRA adapter, the base with the adapter merged in, or every weight.
ADAPTER, MERGED, FULL = "adapter", "merged", "full"
# peft's adapter folder (PeftModel.save_pretrained: SAFETENSORS_WEIGHTS_NAME, CONFIG_NAME) and a whole model's
# files (transformers' save_pretrained): an export of one kind removes the other's, so that MODEL_DIR never holds
# both a stale model and a new adapter.
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")
MODEL_FILE_GLOBS = ("config.json", "generation_config.json", "model*.safetensors", "model.safetensors.index.json",
                    "pytorch_model*.bin")
# File name endings of each format (a folder's files decide its format).
SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".txt": "text", ".text": "text"}
# The loader `datasets.load_dataset` names for each format.
LOADERS = {"jsonl": "json", "parquet": "parquet", "text": "text"}
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
DEFAULT_SAVE_STEPS = 500
DEFAULT_SEQ_LEN = 1024
DEFAULT_LEARNING_RATE = 2e-5


class UsageError(ValueError):
    """Bad arguments, environment or input files: reported in one message, exit status 2."""


# --- arguments ----------------------------------------------------------------------------------------------

def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    env = ENV_DEFAULTS
    parser.add_argument("--model", help=f"a Hugging Face model id or a local folder ({env['model']})")
    parser.add_argument("--dataset", help=f"a file, a folder of files or a Hugging Face dataset id ({env['dataset']})")
    parser.add_argument("--format", choices=FORMATS, default="auto", help="the dataset's format (default: by suffix)")
    parser.add_argument("--text-field", default="text", help="the records' text field (default text)")
    parser.add_argument("--prompt-field", help="with --response-field: learn the response to the prompt")
    parser.add_argument("--response-field", help="with --prompt-field")
    parser.add_argument("--seq-len", type=int, default=DEFAULT_SEQ_LEN, help=f"tokens per sample ({DEFAULT_SEQ_LEN})")
    parser.add_argument("--epochs", type=float, help="passes over the data (default 1; or --max-steps)")
    parser.add_argument("--max-steps", type=int, help="optimizer steps in all (instead of --epochs)")
    parser.add_argument("--learning-rate", type=float, default=DEFAULT_LEARNING_RATE,
                        help=f"peak learning rate ({DEFAULT_LEARNING_RATE})")
    parser.add_argument("--lora", action="store_true", help="train a LoRA adapter (merged into the model at export)")
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--lora-alpha", type=float, default=32.0)
    parser.add_argument("--lora-dropout", type=float, default=0.05)
    parser.add_argument("--lora-target-modules", nargs="+", default=["all-linear"],
                        help="module names, or all-linear (default)")
    parser.add_argument("--lora-export", choices=LORA_EXPORTS, default=ADAPTER,
                        help="MODEL_DIR gets the adapter alone (default) or the model with it merged in")
    parser.add_argument("--deepspeed", "--deepspeed_config", "--deepspeed-config", dest="deepspeed",
                        help="ds_config.json (the launcher passes --deepspeed_config)")
    parser.add_argument("--save-steps", type=int, help=f"checkpoint every N steps ({env['save_steps']}, "
                        f"default {DEFAULT_SAVE_STEPS})")
    parser.add_argument("--save-total-limit", type=int, default=2, help="checkpoints kept (default 2, the newest)")
    parser.add_argument("--checkpoint-dir", help=f"the checkpoint-N folders ({env['checkpoint_dir']})")
    parser.add_argument("--model-dir", help=f"where the final model goes ({env['model_dir']})")
    parser.add_argument("--precision", choices=PRECISIONS, help="default: ds_config.json's, else fp32")
    parser.add_argument("--logging-steps", type=int, default=10)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--gradient-checkpointing", action="store_true", help="recompute activations (less memory)")
    # The DeepSpeed launcher appends --local_rank=N; LOCAL_RANK says the same.
    parser.add_argument("--local_rank", "--local-rank", type=int, default=-1, help=argparse.SUPPRESS)
    return parser


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
    if args.save_steps is None:
        args.save_steps = DEFAULT_SAVE_STEPS
    problems = argument_problems(args)
    if problems:
        raise UsageError("; ".join(problems))
    return args


def argument_problems(args: argparse.Namespace) -> list[str]:
    problems = [f"{_flag(name)} (or {ENV_DEFAULTS[name]}) is required" for name in REQUIRED
                if not getattr(args, name)]
    if bool(args.prompt_field) != bool(args.response_field):
        problems.append("--prompt-field and --response-field go together (or neither: --text-field)")
    if args.epochs is not None and args.max_steps is not None:
        problems.append("give --epochs or --max-steps, not both")
    if args.epochs is not None and args.epochs <= 0:
        problems.append(f"--epochs must be more than 0, got {args.epochs}")
    if args.max_steps is not None and args.max_steps < 1:
        problems.append(f"--max-steps must be 1 or more, got {args.max_steps}")
    if args.seq_len < 8:
        problems.append(f"--seq-len must be 8 or more, got {args.seq_len}")
    if args.learning_rate <= 0:
        problems.append(f"--learning-rate must be more than 0, got {args.learning_rate}")
    if args.save_steps < 1:
        problems.append(f"--save-steps must be 1 or more, got {args.save_steps}")
    if args.save_total_limit < 1:
        problems.append(f"--save-total-limit must be 1 or more, got {args.save_total_limit}")
    if args.lora:
        problems += lora_problems(args.lora_rank, args.lora_alpha, args.lora_dropout, args.lora_target_modules)
    return problems


def lora_problems(rank: int, alpha: float, dropout: float, targets: Sequence[str]) -> list[str]:
    problems = []
    if rank < 1:
        problems.append(f"--lora-rank must be 1 or more, got {rank}")
    if alpha <= 0:
        problems.append(f"--lora-alpha must be more than 0, got {alpha}")
    if not 0 <= dropout < 1:
        problems.append(f"--lora-dropout must be in [0, 1), got {dropout}")
    if not targets or any(not t.strip() for t in targets):
        problems.append("--lora-target-modules needs module names (or all-linear)")
    return problems


def hf_token(environ: Mapping[str, str]) -> str | None:
    """The token in the file HF_TOKEN_PATH names (the stack mounts the Secret there), or None without one."""
    path = environ.get("HF_TOKEN_PATH", "").strip()
    if not path:
        return None
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except OSError as error:
        raise UsageError(f"HF_TOKEN_PATH={path}: cannot read the token file ({error.strerror})") from None
    if not token:
        raise UsageError(f"HF_TOKEN_PATH={path}: the token file is empty")
    return token


# --- DeepSpeed config and the Trainer's matching arguments ---------------------------------------------------

def load_ds_config(path: str | None) -> dict[str, Any] | None:
    if path is None:
        return None
    try:
        config = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise UsageError(f"--deepspeed {path}: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise UsageError(f"--deepspeed {path}: not JSON ({error})") from None
    if not isinstance(config, dict):
        raise UsageError(f"--deepspeed {path}: expected a JSON object")
    return config


def _concrete(value: Any) -> bool:
    return value is not None and value != "auto"


def zero_stage(ds: Mapping[str, Any] | None) -> int:
    if not ds:
        return 0
    stage = (ds.get("zero_optimization") or {}).get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise UsageError(f"ds_config.json: zero_optimization.stage must be 0-3, got {stage!r}")
    return int(stage)


def ds_precision(ds: Mapping[str, Any] | None) -> str | None:
    """The precision ds_config.json fixes: bf16/fp16 when enabled is true, None when it leaves it to the Trainer
    ("auto" or absent sections mean fp32 unless the Trainer enables one)."""
    if not ds:
        return None
    for name in ("bf16", "fp16"):
        if (ds.get(name) or {}).get("enabled") is True:
            return name
    has_auto = any((ds.get(name) or {}).get("enabled") == "auto" for name in ("bf16", "fp16"))
    return None if has_auto else "fp32"


def resolve_precision(requested: str | None, ds: Mapping[str, Any] | None) -> str:
    """--precision, or ds_config.json's; the two must agree where both say one."""
    fixed = ds_precision(ds)
    if requested and fixed and requested != fixed:
        raise UsageError(f"--precision {requested} but ds_config.json trains in {fixed}: the Trainer would refuse "
                         "to start; drop --precision or make them the same")
    return requested or fixed or "fp32"


def combination_problems(lora: bool, stage: int, precision: str, cpu: bool,
                         offload_params: bool = False) -> list[str]:
    """What this script cannot run, whatever the model: checked before anything is loaded (the stack's checks
    refuse the same combinations before anything is created)."""
    problems = []
    if cpu and precision == "fp16":
        # DeepSpeed's CPU accelerator: is_fp16_supported() is False (accelerator/cpu_accelerator.py).
        problems.append("fp16 does not run on CPUs (DeepSpeed's CPU accelerator has no fp16): use bf16 or fp32")
    if lora and offload_params and stage == 3:
        # peft wraps modules after ZeRO-3 partitioned them; with parameter offload the base weights live on the
        # host and merging the adapter at export needs them gathered twice: not supported here.
        problems.append("LoRA with ZeRO-3 parameter offload (offload_param) is not supported: offload the "
                        "optimizer only, or train without LoRA")
    return problems


def trainer_ds_args(ds: Mapping[str, Any] | None, precision: str) -> dict[str, Any]:
    """TrainingArguments that must match ds_config.json's concrete values (the Trainer refuses to start on a
    mismatch): micro batch, accumulation, clipping; and the precision."""
    out: dict[str, Any] = {"bf16": precision == "bf16", "fp16": precision == "fp16"}
    if not ds:
        return out
    pairs = (("train_micro_batch_size_per_gpu", "per_device_train_batch_size"),
             ("gradient_accumulation_steps", "gradient_accumulation_steps"),
             ("gradient_clipping", "max_grad_norm"))
    for ds_key, arg in pairs:
        if _concrete(ds.get(ds_key)):
            out[arg] = ds[ds_key]
    return out


def prepared_ds_config(ds: dict[str, Any] | None) -> dict[str, Any] | None:
    """ds_config.json as the Trainer gets it: under ZeRO-3 the weights are gathered at save time, so the model
    saved at export (and each checkpoint's model files) is whole, not a shard per rank."""
    if ds is None:
        return None
    out = json.loads(json.dumps(ds))
    zero = out.get("zero_optimization") or {}
    if zero.get("stage") == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    return out


def offloads_params(ds: Mapping[str, Any] | None) -> bool:
    device = ((ds or {}).get("zero_optimization") or {}).get("offload_param", {}).get("device", "none")
    return device not in (None, "none")


# --- data ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DataSource:
    """Where the records come from: `datasets.load_dataset(loader, data_files=files)` or a hub id."""

    loader: str  # json | parquet | text | hub
    files: tuple[str, ...] = ()
    hub_id: str | None = None


def data_source(dataset: str, fmt: str = "auto") -> DataSource:
    """The format of a file or folder (by suffix unless --format says), or a Hugging Face dataset id."""
    path = Path(dataset)
    if path.is_dir():
        files = sorted(str(p) for p in path.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        if not files:
            raise UsageError(f"--dataset {dataset}: no {', '.join(SUFFIXES)} files in the folder")
        kinds = sorted({SUFFIXES[Path(f).suffix.lower()] for f in files})
        if fmt == "auto" and len(kinds) > 1:
            raise UsageError(f"--dataset {dataset}: the folder mixes formats ({', '.join(kinds)}): give --format "
                             "or keep one kind of file")
        kind = kinds[0] if fmt == "auto" else fmt
        if fmt != "auto":
            files = [f for f in files if SUFFIXES[Path(f).suffix.lower()] == fmt]
            if not files:
                raise UsageError(f"--dataset {dataset}: no {fmt} files in the folder (found {', '.join(kinds)})")
        return DataSource(LOADERS[kind], tuple(files))
    if path.is_file():
        kind = SUFFIXES.get(path.suffix.lower()) if fmt == "auto" else fmt
        if kind is None:
            raise UsageError(f"--dataset {dataset}: unknown suffix {path.suffix!r}: give --format "
                             f"({', '.join(FORMATS[1:])})")
        return DataSource(LOADERS[kind], (str(path),))
    if dataset.startswith(("/", "./", "../")) or not HUB_ID.match(dataset):
        raise UsageError(f"--dataset {dataset}: no such file or folder (and not a Hugging Face dataset id)")
    return DataSource("hub", hub_id=dataset)


def record_problems(columns: Sequence[str], text_field: str, prompt_field: str | None,
                    response_field: str | None) -> list[str]:
    """The fields the records must have."""
    wanted = [prompt_field, response_field] if prompt_field else [text_field]
    missing = [f for f in wanted if f not in columns]
    if not missing:
        return []
    return [f"the records have no field {', '.join(repr(f) for f in missing)} (they have {', '.join(columns)}): "
            "set --text-field, or --prompt-field and --response-field"]


def build_example(prompt_ids: Sequence[int], response_ids: Sequence[int], eos_id: int | None,
                  seq_len: int, mask_prompt: bool = True) -> dict[str, list[int]]:
    """One training sample: prompt + response (+ EOS), cut at seq_len; the prompt's labels masked so only the
    response is learned. A text record is a response without a prompt."""
    ids = [*prompt_ids, *response_ids, *([eos_id] if eos_id is not None else [])][:seq_len]
    prompt_len = min(len(prompt_ids), len(ids)) if mask_prompt else 0
    labels = [IGNORE_INDEX] * prompt_len + ids[prompt_len:]
    return {"input_ids": ids, "attention_mask": [1] * len(ids), "labels": labels}


def learns_something(example: Mapping[str, Sequence[int]]) -> bool:
    """A sample whose labels are all masked (a prompt longer than seq_len) adds nothing but a NaN-free zero."""
    return any(label != IGNORE_INDEX for label in example["labels"][1:])


def pad_batch(examples: Sequence[Mapping[str, Sequence[int]]], pad_id: int) -> dict[str, list[list[int]]]:
    """Right-padded to the longest sample: pad ids, attention 0, labels masked."""
    longest = max(len(e["input_ids"]) for e in examples)
    out: dict[str, list[list[int]]] = {"input_ids": [], "attention_mask": [], "labels": []}
    for e in examples:
        pad = longest - len(e["input_ids"])
        out["input_ids"].append([*e["input_ids"], *[pad_id] * pad])
        out["attention_mask"].append([*e["attention_mask"], *[0] * pad])
        out["labels"].append([*e["labels"], *[IGNORE_INDEX] * pad])
    return out


# --- checkpoints and the marker -----------------------------------------------------------------------------

def checkpoint_step(name: str) -> int | None:
    match = re.fullmatch(rf"{CHECKPOINT_PREFIX}(\d+)", name)
    return int(match.group(1)) if match else None


def newest_checkpoint(directory: str | Path) -> Path | None:
    """The checkpoint-N folder with the highest N that was saved to the end (it holds trainer_state.json, which
    the Trainer writes after the model, optimizer and scheduler); None when there is none."""
    root = Path(directory)
    if not root.is_dir():
        return None
    found = [(step, p) for p in root.iterdir() if p.is_dir() and (step := checkpoint_step(p.name)) is not None
             and (p / CHECKPOINT_DONE_FILE).is_file()]
    return max(found)[1] if found else None


def export_kind(lora: bool, lora_export: str) -> str:
    """What MODEL_DIR holds: ADAPTER, MERGED (LoRA merged into the base) or FULL (every weight trained)."""
    return FULL if not lora else (ADAPTER if lora_export == ADAPTER else MERGED)


def marker_text(step: int, model: str, *, lora: bool, dataset: str, precision: str, world_size: int,
                finished: datetime.datetime, export: str = FULL, lora_rank: int | None = None) -> str:
    """MODEL_DIR/.complete: what a server waiting on it (and a person) wants to know; written last. `export` says
    what the folder holds; an adapter's marker also has its rank (vLLM's --max-lora-rank must hold it) and its base
    is `model`."""
    fields: dict[str, Any] = {"step": step, "model": model, "lora": lora, "export": export, "dataset": dataset,
                              "precision": precision, "world_size": world_size,
                              "finished": finished.isoformat(timespec="seconds")}
    if export == ADAPTER and lora_rank is not None:
        fields["lora_rank"] = lora_rank
    return json.dumps(fields, sort_keys=True) + "\n"


def stale_files(model_dir: Path, export: str) -> list[Path]:
    """Files of the other kind of export in MODEL_DIR (an adapter's beside a new whole model, or the reverse)."""
    if not model_dir.is_dir():
        return []
    if export == ADAPTER:
        return sorted({p for pattern in MODEL_FILE_GLOBS for p in model_dir.glob(pattern) if p.is_file()})
    return sorted(p for name in ADAPTER_FILES if (p := model_dir / name).is_file())


def cpu_run(environ: Mapping[str, str]) -> bool:
    return environ.get("DS_ACCELERATOR", "").strip().lower() == "cpu"


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


def _tokenized(args: argparse.Namespace, tokenizer: Any, token: str | None) -> Any:
    import datasets

    source = data_source(args.dataset, args.format)
    if source.loader == "hub":
        data = datasets.load_dataset(source.hub_id, split="train", token=token)
    else:
        # Each rank's Arrow cache on its own local disk: not shared between ranks (their locks would race) nor on
        # the bucket's FUSE mount (no file locks there).
        cache = tempfile.mkdtemp(prefix="finetune-data-")
        data = datasets.load_dataset(source.loader, data_files=list(source.files), split="train", cache_dir=cache)
    problems = record_problems(list(data.column_names), args.text_field, args.prompt_field, args.response_field)
    if problems:
        raise UsageError("; ".join(problems))
    eos = tokenizer.eos_token_id

    def encode(record: dict[str, Any]) -> dict[str, list[int]]:
        if args.prompt_field:
            prompt = tokenizer(str(record[args.prompt_field]), add_special_tokens=True)["input_ids"]
            response = tokenizer(str(record[args.response_field]), add_special_tokens=False)["input_ids"]
        else:
            prompt, response = [], tokenizer(str(record[args.text_field]), add_special_tokens=True)["input_ids"]
        return build_example(prompt, response, eos, args.seq_len)

    encoded = data.map(encode, remove_columns=list(data.column_names), desc="tokenize")
    kept = encoded.filter(learns_something)
    if len(kept) == 0:
        raise UsageError(f"--dataset {args.dataset}: no record has anything to learn within --seq-len {args.seq_len}")
    return kept


def _progress_callbacks(args: argparse.Namespace) -> list[Any]:
    """Progress and metrics (finetune_progress.py, shipped beside this file), then TensorBoard's writer where
    TENSORBOARD_LOGGING_DIR names its folder: in that order, so the tokens/s and MFU the first adds to the logs are
    written with the loss."""
    import importlib

    folder = str(Path(__file__).parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    progress = importlib.import_module("finetune_progress")
    out = [progress.progress_callback(progress.RunFacts.from_env(os.environ), args.checkpoint_dir, args.model_dir,
                                      say)]
    if os.environ.get("TENSORBOARD_LOGGING_DIR", "").strip():
        from transformers.integrations import TensorBoardCallback

        try:
            out.append(TensorBoardCallback())
        except RuntimeError as error:  # an image without tensorboard: the run goes on, the log says why
            say(f"no TensorBoard event files: {error}")
    return out


def _collator(pad_id: int) -> Any:
    import torch

    def collate(examples: list[dict[str, list[int]]]) -> dict[str, Any]:
        return {k: torch.tensor(v) for k, v in pad_batch(examples, pad_id).items()}

    return collate


def _export(trainer: Any, args: argparse.Namespace, tokenizer: Any, token: str | None, precision: str,
            step: int) -> None:
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
    trainer.save_model(str(saved))
    trainer.accelerator.wait_for_everyone()
    if trainer.is_world_process_zero():
        if export == MERGED:
            _merge_adapter(args, saved, token, precision)
            shutil.rmtree(saved, ignore_errors=True)
        tokenizer.save_pretrained(str(model_dir))
        world = trainer.args.world_size
        text = marker_text(step, args.model, lora=args.lora, dataset=args.dataset, precision=precision,
                           world_size=world, finished=datetime.datetime.now(datetime.UTC), export=export,
                           lora_rank=args.lora_rank if args.lora else None)
        (model_dir / MARKER).write_text(text, encoding="utf-8")
        say(f"exported step {step} to {model_dir} ({export})")
    trainer.accelerator.wait_for_everyone()


def _merge_adapter(args: argparse.Namespace, adapter: Path, token: str | None,
                   precision: str) -> None:
    """The base model, whole on this host's CPU (outside ZeRO-3's partitioning), with the adapter merged in."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()  # else from_pretrained would partition the base model across the ranks again
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[precision]
    base = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype, token=token)
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
        token = hf_token(os.environ)
        ds = prepared_ds_config(load_ds_config(args.deepspeed))
        precision = resolve_precision(args.precision, ds)
        cpu = cpu_run(os.environ)
        problems = combination_problems(args.lora, zero_stage(ds), precision, cpu, offloads_params(ds))
        if problems:
            raise UsageError("; ".join(problems))
        data_source(args.dataset, args.format)  # a missing file or mixed folder: said before anything loads
    except UsageError as error:
        say(f"FAILED: {error}")
        return EXIT_USAGE

    import signal

    sys.stdout, sys.stderr = ForgivingStream(sys.stdout), ForgivingStream(sys.stderr)
    stop = StopRequest()
    signal.signal(signal.SIGTERM, stop)
    cpu_deepspeed = cpu and ds is not None
    if cpu_deepspeed:
        _configure_cpu_deepspeed()

    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

    # TrainingArguments first: under ZeRO-3 it makes from_pretrained load the model partitioned (zero.Init).
    training = TrainingArguments(
        output_dir=args.checkpoint_dir,
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
        include_num_input_tokens_seen="non_padding",  # every rank's tokens, summed: tokens/s and MFU
        gradient_checkpointing=args.gradient_checkpointing,
        use_cpu=cpu and not cpu_deepspeed,
        accelerator_config={"use_configured_state": cpu_deepspeed},
        **trainer_ds_args(ds, precision),
    )
    tokenizer = AutoTokenizer.from_pretrained(args.model, token=token)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    try:
        data = _tokenized(args, tokenizer, token)
    except UsageError as error:
        say(f"FAILED: {error}")
        return EXIT_USAGE
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[precision]
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype, token=token)
    if args.lora:
        model = _lora(model, args)
    callback = _stop_callback(stop)
    trainer = Trainer(model=model, args=training, train_dataset=data, data_collator=_collator(tokenizer.pad_token_id),
                      processing_class=tokenizer, callbacks=[*_progress_callbacks(args), callback])
    resume = newest_checkpoint(args.checkpoint_dir)
    say(f"rank {training.process_index}/{training.world_size}: {len(data)} samples, ZeRO-{zero_stage(ds)}, "
        f"{precision}{', LoRA' if args.lora else ''}; " + (f"resuming from {resume}" if resume else "from the start"))
    try:
        trainer.train(resume_from_checkpoint=str(resume) if resume else None)
        step = trainer.state.global_step
        if callback.stopped_at is not None:
            say(f"rank {training.process_index}: stopped at step {step} on SIGTERM, checkpoint saved")
            return EXIT_PREEMPTED
        _export(trainer, args, tokenizer, token, precision, step)
        say(f"rank {training.process_index}: done at step {step}")
        return 0
    finally:
        # PyTorch's shutdown rule: destroy the process group before exit. It unregisters the groups but cannot stop
        # their threads (see exit_without_teardown).
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


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
