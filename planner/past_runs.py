"""Earlier runs of the same shape, and how far their estimates were off (`make gpus ... RUNS=<folder>`).

A finished finetune run writes MODEL_DIR/run.json (recipes/finetune_progress.py run_record): the
measured tokens/s per GPU, MFU, training hours and $, beside the estimate the stack rendered before the run
(FINETUNE_ESTIMATE), whose `shape` says what ran: the model as the planner resolves it, the GPU type and count, LoRA
or full, the ZeRO stage. The planner has no bucket access: the user copies the records into a folder
(copy_command, which the preview's Training section prints with the stack's bucket) and passes it. A record of the
same model and LoRA/full is shown against the options of its GPU type, count and ZeRO stage; the ratio is measured
over estimated (tokens/s per GPU: above 1, faster than estimated; hours: above 1, longer).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

RUN_FILE = "run.json"
FOLDER = "runs"  # where copy_command puts them: RUNS=runs


def copy_command(pattern: str) -> str:
    """The records matching `pattern` (gs://BUCKET/models/*/run.json) into runs/<workload>/run.json: one folder
    each, since `gcloud storage cp` of a wildcard into one folder would keep only the last run.json."""
    return (f"for f in $(gcloud storage ls '{pattern}'); do d=\"{FOLDER}/$(basename \"$(dirname \"$f\")\")\"; "
            'mkdir -p "$d" && gcloud storage cp "$f" "$d/"; done')


class Shape(msgspec.Struct, frozen=True):
    model: str
    gpu: str
    gpus: int
    lora: bool
    zero_stage: int

    def said(self) -> str:
        return (f"{self.model}, {self.gpus} x {self.gpu}, {'LoRA' if self.lora else 'full'}, "
                f"ZeRO-{self.zero_stage}")

    def record(self) -> dict[str, Any]:
        """As run.json carries it (estimate.shape)."""
        return {"model": self.model, "gpu": self.gpu, "gpus": self.gpus, "lora": self.lora,
                "zeroStage": self.zero_stage}


class PastRun(msgspec.Struct, frozen=True):
    path: str
    shape: Shape
    record: dict[str, Any]


def shape_of(record: Mapping[str, Any]) -> Shape | None:
    """The estimate's shape of a run.json; None for a record without one (an older run, a run with no estimate)."""
    estimate = record.get("estimate")
    raw = estimate.get("shape") if isinstance(estimate, Mapping) else None
    if not isinstance(raw, Mapping):
        return None
    try:
        return Shape(str(raw["model"]), str(raw["gpu"]), int(raw["gpus"]), bool(raw["lora"]), int(raw["zeroStage"]))
    except (KeyError, TypeError, ValueError):
        return None


def read_runs(folder: Path) -> tuple[list[PastRun], list[str]]:
    """Every run.json under `folder` with a shape, and what was skipped and why. A missing folder raises OSError."""
    if not folder.is_dir():
        raise NotADirectoryError(f"{folder}: not a folder")
    runs, skipped = [], []
    for path in sorted(folder.rglob("*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            skipped.append(f"{path}: not JSON ({error})")
            continue
        shape = shape_of(record) if isinstance(record, dict) else None
        if shape is None:
            skipped.append(f"{path}: no estimate.shape (a run.json of a run without an estimate, or before it)")
            continue
        runs.append(PastRun(str(path), shape, record))
    return runs, skipped


def _range(pair: Any) -> tuple[float, float] | None:
    if not isinstance(pair, Mapping):
        return None
    values = sorted(float(v) for v in pair.values() if isinstance(v, int | float))
    return (values[0], values[-1]) if values else None


def ratio(measured: Any, estimated: Any) -> str | None:
    """`measured / estimated` over the estimate's range: "0.87" or "0.66–1.13"; None where either is missing."""
    span = _range(estimated)
    if not isinstance(measured, int | float) or span is None or span[0] <= 0:
        return None
    low, high = sorted(float(measured) / v for v in span)
    return f"{low:.2f}" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}–{high:.2f}"


def off_by(run: PastRun) -> str:
    """`runs/a/run.json (Qwen2.5-7B-Instruct, 8 x nvidia-l4, LoRA, ZeRO-2): tokens/s per GPU 903–1,074 estimated,
    811 measured (x0.76–0.90); hours 0.97–1.2 estimated, 1.3 measured (x1.1–1.3)`."""
    e, r = run.record.get("estimate") or {}, run.record
    parts = []
    for label, key, fmt in (("tokens/s per GPU", "tokensPerSecondPerGpu", ",.0f"), ("MFU", "mfu", ".1%"),
                            ("training hours", "trainingHours", ".3g")):
        span, measured = _range(e.get(key)), r.get(key)
        if span is None or not isinstance(measured, int | float):
            continue
        said = format(span[0], fmt) if span[0] == span[1] else f"{format(span[0], fmt)}–{format(span[1], fmt)}"
        parts.append(f"{label} {said} estimated, {format(measured, fmt)} measured "
                     f"(x{ratio(measured, e.get(key))})")
    return f"{run.path} ({run.shape.said()}): " + ("; ".join(parts) or "nothing measured to compare")


def same_shape(runs: list[PastRun], model: str, lora: bool) -> list[PastRun]:
    """The runs of this model, LoRA or full."""
    return [r for r in runs if r.shape.model == model and r.shape.lora == lora]
