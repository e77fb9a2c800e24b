"""How long a training run takes and what it costs, before it starts: a range, from measured runs
(data/training_speed.yaml `throughput`, planner/throughput.py) and the GPUs' peak dense TFLOPS
(data/gpu_catalog.yaml peakTflops).

    model FLOPs per token = N x (forward 2 + inputs' gradients 2 [+ weights' gradients 2 unless LoRA]): 6N or 4N
    MFU                   = the measured rows' MFU on those FLOPs, interpolated by log(N) (planner/throughput.py)
    seconds               = tokens x model FLOPs per token / (GPUs x peak x MFU)

The rows ran with activation checkpointing (their recomputed forward pass is in their time, not in their MFU), so
the estimate is the same with or without it [assumption: without it a run is faster than estimated]. The executed
FLOPs (with the recomputation: 8N, 6N) are reported beside the model's.

The tokens of a run: `datasetTokens x epochs`, or `maxSteps x global batch x sequence length` (every sample full:
an upper bound). The saves, the data step and the nodes that wait are planner/run_hours.py's; padding to the longest
sample of a micro batch, restarts after preemption and the model's download are not in it. `stack_runs(cfg)` is the
`costs` output's `runs`: each finetune workload's estimate, or why there is none; the preview's headline and
"Estimated cost" section render it (planner/cost.py, planner/cost_markdown.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

from model import catalog as gpu_catalog
from model import training_speed
from model.training_speed import TrainingSpeed
from model.types import FinetuneWorkloadConfig, StackConfig
from planner import throughput
from planner.requests import workload_request, workload_strategy
from planner.sizing_types import Request, Strategy
from recipes import finetune_data

SECONDS_PER_HOUR = 3600
TERA = 1e12
DATA_SUFFIXES = (".jsonl", ".json", ".txt")  # what `make gpus DATA=` counts (finetune.py also reads .parquet)


class Factor(msgspec.Struct, frozen=True):
    """One named conversion of the rows' MFU for this run (1.0: none), and where it comes from."""

    what: str
    value: float
    why: str = ""


class RunEstimate(msgspec.Struct, frozen=True):
    """A run's time as a range: `hours_fast` at the high end of the evidence's MFU, `hours_slow` at the low end;
    `evidence` the ids of the measured rows it rests on (data/training_speed.yaml), `notes` what it assumes beyond
    them."""

    tokens: float
    parameters: float  # N
    gpus: int
    peak_tflops: float  # per GPU, in the run's precision
    model_flops_per_token: float
    executed_flops_per_token: float
    factors: tuple[Factor, ...]
    mfu_low: float  # what the GPUs reach of their peak on the model's FLOPs
    mfu_high: float
    hours_fast: float
    hours_slow: float
    evidence: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def cost(self, per_hour: float) -> tuple[float, float]:
        """$ for the run at this $/h: (fast, slow)."""
        return self.hours_fast * per_hour, self.hours_slow * per_hour

    @property
    def tokens_per_second_per_gpu(self) -> tuple[float, float]:
        """(low, high): what the MFU range means in tokens/s per GPU."""
        per = self.peak_tflops * TERA / self.model_flops_per_token
        return self.mfu_low * per, self.mfu_high * per


# --- FLOPs and the evidence --------------------------------------------------------------------------------------

def flops_per_token(parameters: float, lora: bool, checkpointing: bool,
                    speed: TrainingSpeed | None = None) -> tuple[float, float]:
    """(model FLOPs, executed FLOPs) per token trained: 6N and 8N for full fine-tuning with recomputation, 4N and
    6N for LoRA with it."""
    f = (speed or training_speed.load()).flops_per_token
    model = f.forward + f.backward_inputs + (0.0 if lora else f.backward_weights)
    executed = model + (f.recompute if checkpointing else 0.0)
    return model * parameters, executed * parameters


def estimate(tokens: float, request: Request, strategy: Strategy, gpus: int, peak_tflops: float,
             speed: TrainingSpeed | None = None, gpu_type: str = "",
             stack: str = throughput.DEEPSPEED) -> RunEstimate:
    """The run's hours, fast and slow, training `tokens` tokens of `request` with `strategy` on `gpus` GPUs of type
    `gpu_type` ("cpu": CPU ranks, the toy rows; "": unknown, every GPU's rows) of `peak_tflops` each (in the
    request's precision), on `stack` (this stack: DeepSpeed). Raises ValueError where no row fits."""
    speed = speed or training_speed.load()
    lora = request.lora is not None
    model, executed = flops_per_token(request.model.parameters, lora, request.gradient_checkpointing, speed)
    offload = strategy.offload_params or (strategy.offload_optimizer and not lora)
    ev = throughput.evidence(request.model.parameters, lora, gpu_type, offload, stack, speed)
    factors = (Factor("the rows' conversion", ev.scale, "; ".join(ev.notes)),) if ev.scale != 1.0 else ()
    per_second = gpus * peak_tflops * TERA / model  # tokens per second at an MFU of 1

    def hours(mfu: float) -> float:
        return tokens / (per_second * mfu) / SECONDS_PER_HOUR

    return RunEstimate(tokens, request.model.parameters, gpus, peak_tflops, model, executed, factors,
                       ev.mfu_low, ev.mfu_high, hours(ev.mfu_high), hours(ev.mfu_low), ev.rows, ev.notes)


def peak(cat: gpu_catalog.Catalog, gpu_type: str, precision: str) -> float | None:
    """The GPU's peak dense TFLOPS in the precision; None where the catalog has none (no such precision, Gaudi)."""
    gpu = cat.gpus.get(gpu_type)
    return gpu.peak_tflops.get(precision) if gpu else None


# --- the tokens of a run -------------------------------------------------------------------------------------------

def count_file_tokens(path: Path, fields: Iterable[str] | None = None,
                      speed: TrainingSpeed | None = None) -> tuple[float, int, str]:
    """(tokens, records, what was counted) of a local .jsonl/.json/.txt data file, without its model's tokenizer:
    the characters of the text a record trains on (`fields`; None: its format's text fields, recognised as
    finetune.py recognises them; a text file's lines) over charsPerToken. Raises ValueError for another suffix, a
    record that is not JSON, or records of no format finetune.py reads."""
    chars_per_token = (speed or training_speed.load()).chars_per_token
    suffix = path.suffix.lower()
    if suffix not in DATA_SUFFIXES:
        raise ValueError(f"DATA={path}: counts {', '.join(DATA_SUFFIXES)} files (got {suffix or 'no suffix'}); give "
                         "TOKENS= (the data's token count) instead")
    with path.open(encoding="utf-8") as fh:
        text = fh.read()
    if suffix == ".txt":
        lines = [line for line in text.splitlines() if line.strip()]
        return sum(len(line) for line in lines) / chars_per_token, len(lines), "lines"
    records = _json_records(path, text)
    if fields is None:
        chars, fmt = record_characters(path, records)
        return chars / chars_per_token, len(records), f"{fmt} records"
    wanted = list(fields)
    chars = sum(len(v) for r in records for k, v in r.items() if isinstance(v, str) and k in wanted)
    return chars / chars_per_token, len(records), f"fields {', '.join(wanted)}"


def record_characters(path: Path, records: list[dict[str, Any]]) -> tuple[int, str]:
    """The characters records train on, and their format, recognised as finetune.py recognises them (the first
    record's fields: messages, sharegpt conversations, alpaca, prompt + completion, text): a conversation's turns,
    alpaca's instruction, input and output, a prompt and its completion, a text. Records of no such format are an
    error naming the fields seen (never 0 tokens)."""
    fd = finetune_data  # the recipe's own record reading
    if not records:
        raise ValueError(f"DATA={path}: no records")
    try:
        lay = fd.layout(fd.FieldSpec(), records[0])
    except fd.RecordError:
        raise ValueError(f"DATA={path}: record 1 has the fields {', '.join(sorted(records[0])) or 'none'}: none of a "
                         "format finetune.py reads (messages, conversations, instruction + output, prompt + "
                         "completion, text); give FIELDS= the fields that train (finetune.promptField and "
                         "responseField's), or TOKENS=") from None
    chars = 0
    for number, record in enumerate(records, 1):
        try:
            found = fd.sample(record, lay, number)
        except fd.RecordError as error:
            raise ValueError(f"DATA={path}: {error.text} (read as {lay.format} records, as record 1 is)") from None
        if found is None:
            continue
        parts = [m["content"] for m in found.messages] or [found.text or "", found.prompt or "",
                                                           found.completion or ""]
        chars += sum(len(p) for p in parts)
    return chars, lay.format


def _json_records(path: Path, text: str) -> list[dict[str, Any]]:
    """A .json file's list of records (or one record), or a .jsonl file's lines."""
    if path.suffix.lower() == ".json":
        try:
            loaded = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"DATA={path}: not JSON (line {err.lineno}: {err.msg})") from None
        records = loaded if isinstance(loaded, list) else [loaded]
    else:
        records = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"DATA={path}: not JSON lines (line {number}: {err.msg})") from None
    return [r for r in records if isinstance(r, dict)]


class GivenTokens(msgspec.Struct, frozen=True):
    """The tokens `make gpus` was given (TOKENS=, or DATA= counted) and the epochs: what the run trains."""

    per_epoch: float
    epochs: float
    said: str  # how they were counted, in words

    @property
    def total(self) -> float:
        return self.per_epoch * self.epochs


def given_tokens(tokens: float | None, data: Path | None, fields: str | None = None,
                 epochs: float = 1.0) -> GivenTokens | None:
    """TOKENS= x EPOCHS=, or DATA='s count (of FIELDS=, comma-separated; default every string field) x EPOCHS=;
    None without either. Raises ValueError (and OSError) for a file it cannot read."""
    times = f" x {epochs:g} epoch(s)"
    if tokens is not None:
        return GivenTokens(tokens, epochs, f"TOKENS={tokens:,.0f}{times}")
    if data is None:
        return None
    wanted = [f.strip() for f in fields.split(",") if f.strip()] if fields else None
    counted, records, which = count_file_tokens(data, wanted)
    return GivenTokens(counted, epochs, f"DATA={data}: {records:,} records, {counted:,.0f} tokens counted as "
                                        f"characters / {training_speed.load().chars_per_token:g} ({which}){times}; "
                                        f"set finetune.datasetTokens: {counted:.0f}")


# --- a stack's finetune workloads --------------------------------------------------------------------------------

class WorkloadRun(msgspec.Struct, frozen=True):
    """A finetune workload's run as the stack declares it: its estimate, or why there is none (`missing`)."""

    name: str
    pool: str
    nodes: int
    gpus: int
    gpu_type: str
    precision: str
    strategy: str  # "ZeRO-3", "ZeRO-2 + optimizer offload"
    training: str  # "LoRA rank 16 on all-linear (...), with gradient checkpointing"
    tokens_from: str = ""  # how the tokens were counted, in words with their keys
    estimate: RunEstimate | None = None
    missing: str = ""


def _key(name: str, *path: str) -> str:
    return ".".join(("workloads", name, *path))  # workload names are plain keys (model/schema.yaml)


def run_tokens(w: FinetuneWorkloadConfig, gpus: int) -> tuple[float | None, str]:
    """The tokens the run trains and how they were counted; None (and what to set) where the keys do not say."""
    f = w.finetune
    if f.max_steps is not None:
        batch = gpus * w.deepspeed.micro_batch_per_gpu * w.deepspeed.gradient_accumulation
        return (float(f.max_steps * batch * f.sequence_length),
                f"{_key(w.name, 'finetune', 'maxSteps')} {f.max_steps:,} x global batch {batch} ({gpus} GPUs x micro "
                f"batch {w.deepspeed.micro_batch_per_gpu} x accumulation {w.deepspeed.gradient_accumulation}) x "
                f"sequenceLength {f.sequence_length:,}: every sample full, an upper bound")
    if f.dataset_tokens is None:
        return None, (f"set {_key(w.name, 'finetune', 'datasetTokens')} (the data's token count) or "
                      f"{_key(w.name, 'finetune', 'maxSteps')}")
    epochs = f.epochs if f.epochs is not None else 1.0
    said = "" if f.epochs is not None else " (finetune.py's default)"
    return (f.dataset_tokens * epochs,
            f"{_key(w.name, 'finetune', 'datasetTokens')} {f.dataset_tokens:,} x {epochs:g} epoch(s){said}")


def workload_run(cfg: StackConfig, w: FinetuneWorkloadConfig, cat: gpu_catalog.Catalog | None = None,
                 speed: TrainingSpeed | None = None) -> WorkloadRun | None:
    """The finetune workload's estimate on its pool; None off a GKE pool of the stack (nothing it can price)."""
    cat = cat or gpu_catalog.load()
    pool = cfg.pool(w.pool) if w.pool else None
    if pool is None or not w.on_nvidia:
        return None
    per_worker = w.accelerator.count or pool.gpu.count
    gpus = per_worker * w.workers
    request, strategy = workload_request(w), workload_strategy(w)
    precision = w.deepspeed.precision
    run = WorkloadRun(w.name, pool.name, w.workers, gpus, pool.gpu.type, precision, strategy.label,
                      request.training_label if request else "")
    tokens, said = run_tokens(w, gpus)
    top = peak(cat, pool.gpu.type, precision)
    if request is None:
        missing = f"give {_key(w.name, 'model', 'parameters')} (the model's size is unknown)"
    elif top is None:
        missing = f"add {pool.gpu.type}'s {precision} peak to data/gpu_catalog.yaml peakTflops"
    elif tokens is None:
        missing = said
    else:
        return msgspec.structs.replace(run, tokens_from=said, estimate=estimate(tokens, request, strategy, gpus,
                                                                                top, speed, pool.gpu.type))
    return msgspec.structs.replace(run, missing=missing)


def stack_runs(cfg: StackConfig, cat: gpu_catalog.Catalog | None = None) -> list[WorkloadRun]:
    """Every finetune workload of the stack on one of its pools, in the stack's order."""
    runs = [workload_run(cfg, w, cat) for w in cfg.workloads.values() if isinstance(w, FinetuneWorkloadConfig)]
    return [r for r in runs if r is not None]


def format_hours(hours: float) -> str:
    """Two significant figures or so: 0.13, 3.2, 7.0, 18, 310, 4,300."""
    if hours < 1:
        return f"{hours:.2f}"
    if hours < 10:
        return f"{hours:.1f}"
    if hours < 100:
        return f"{hours:.0f}"
    return f"{round(hours, -1 if hours < 1000 else -2):,.0f}"


def hours_range(e: RunEstimate) -> str:
    return f"{format_hours(e.hours_fast)}–{format_hours(e.hours_slow)} h"


def mfu_range(e: RunEstimate) -> str:
    return f"{e.mfu_low:.0%}–{e.mfu_high:.0%}" if e.mfu_low >= 0.01 else f"{e.mfu_low:.1%}–{e.mfu_high:.1%}"
