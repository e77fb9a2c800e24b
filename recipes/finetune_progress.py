"""finetune.py's progress and metrics while it runs: tokens per second and MFU on every rank, a progress file and
the run's measured cost on rank 0.

- Every logging step each rank prints `step S/M (P %), T tokens/s (T/W per GPU), MFU X %, ETA E s, loss L`, and the
  Trainer's logs get `tokens_per_second`, `tokens_per_second_per_gpu` and `mfu` beside the loss, so that its
  TensorBoard writer (report_to tensorboard, TENSORBOARD_LOGGING_DIR) records them with it.
- Rank 0 writes CHECKPOINT_DIR/progress.json at each logging step and at the end, atomically (a temporary file, then
  a rename): the shape of Kubeflow Trainer's TrainJob `status.trainerStatus` (KEP-2779, kubeflow/trainer PR #2905
  and docs/user-guides/trainjob-progress.md: progressPercentage 0-100, estimatedRemainingSeconds, metrics as
  name/value strings, lastUpdatedTime), plus the step, the steps and the training seconds so far.
- When the run finishes, rank 0 writes MODEL_DIR/run.json: the training hours (every attempt's, carried over a
  restart through progress.json) times the stack's $/h while it trains (FINETUNE_PRICE_PER_HOUR), the session's
  average tokens/s per GPU and MFU, and prints the estimate made before the run against them.
- The estimate (FINETUNE_ESTIMATE, JSON the stack renders from the preview's `costs` run: tokens/s per GPU, MFU,
  hours and $ as ranges, the measured rows it rests on) goes into progress.json and run.json as it came, beside
  the measured values, so that a run's record says how far its estimate was off.

MFU is the planner's definition (planner/run_estimate.py): the model's FLOPs per token (6N full, 4N LoRA, without
the recomputation of gradient checkpointing; FINETUNE_MODEL_FLOPS, rendered by the stack from the same function)
x tokens per second over the GPUs x their peak dense TFLOPS in the run's precision (FINETUNE_PEAK_TFLOPS, from
data/gpu_catalog.yaml peakTflops). Tokens are the non-padding tokens of every rank's batches, which the Trainer
counts across the ranks (include_num_input_tokens_seen); a rank's share is the total over the world size.

Above `progress_callback` everything is plain Python (unit-tested by hand: tests/test_finetune_progress.py).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROGRESS_FILE = "progress.json"  # beside the checkpoints
RUN_FILE = "run.json"  # beside the model
PEAK_ENV = "FINETUNE_PEAK_TFLOPS"
FLOPS_ENV = "FINETUNE_MODEL_FLOPS"
PRICE_ENV = "FINETUNE_PRICE_PER_HOUR"
ESTIMATE_ENV = "FINETUNE_ESTIMATE"
TERA = 1e12
SECONDS_PER_HOUR = 3600


@dataclass(frozen=True)
class RunFacts:
    """What the stack tells the ranks about the run (None: not given, and what needs it is left out)."""

    peak_tflops: float | None = None  # per GPU, in the run's precision
    flops_per_token: float | None = None  # the model's FLOPs per token trained (MFU's numerator)
    price_per_hour: float | None = None  # the stack's $/h while the run trains
    estimate: dict[str, Any] | None = None  # the run's estimate before it started (the stack's, as JSON)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> RunFacts:
        return cls(_positive(environ, PEAK_ENV), _positive(environ, FLOPS_ENV), _positive(environ, PRICE_ENV),
                   _json_object(environ, ESTIMATE_ENV))


def _json_object(environ: Mapping[str, str], name: str) -> dict[str, Any] | None:
    """A JSON object from the environment; None when unset or not one (left out, not the run)."""
    try:
        value = json.loads(environ.get(name, ""))
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _positive(environ: Mapping[str, str], name: str) -> float | None:
    """A positive number from the environment; None when unset or not one (a metric is left out, not the run)."""
    try:
        value = float(environ.get(name, "").strip())
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


def progress_percentage(step: int, steps: int) -> int:
    """Whole percent done, rounded down (100 only at the last step)."""
    if steps <= 0:
        return 0
    return min(100, max(0, step * 100 // steps))


def eta_seconds(step: int, steps: int, start_step: int, elapsed: float) -> float | None:
    """Seconds left at this session's pace: the steps left x the seconds per step since it began at `start_step`;
    None before a step is done."""
    done = step - start_step
    if done <= 0 or elapsed <= 0:
        return None
    return max(0, steps - step) * elapsed / done


def per_second(amount: float, seconds: float) -> float | None:
    return amount / seconds if seconds > 0 else None


def mfu(tokens_per_second: float, flops_per_token: float, gpus: int, peak_tflops: float) -> float:
    """The share of the GPUs' peak that the model's FLOPs reach."""
    return tokens_per_second * flops_per_token / (gpus * peak_tflops * TERA)


@dataclass(frozen=True)
class Snapshot:
    """The run as rank 0 saw it at one logging step."""

    step: int
    steps: int
    elapsed: float  # training seconds in all, every attempt's
    eta: float | None
    loss: float | None
    tokens_per_second: float | None
    mfu: float | None


def trainer_status(s: Snapshot, now: datetime.datetime, estimate: Mapping[str, Any] | None = None,
                   price_per_hour: float | None = None) -> dict[str, Any]:
    """progress.json: Kubeflow Trainer's trainerStatus fields (metrics' values are strings there), and ours: the
    estimate made before the run beside the hours and $ so far."""
    metrics = [(name, value) for name, value in (("loss", s.loss), ("tokens_per_second", s.tokens_per_second),
                                                 ("mfu", s.mfu)) if value is not None]
    out: dict[str, Any] = {"progressPercentage": progress_percentage(s.step, s.steps),
                           "metrics": [{"name": n, "value": f"{v:.6g}"} for n, v in metrics],
                           "lastUpdatedTime": now.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                           "step": s.step, "steps": s.steps, "elapsedSeconds": round(s.elapsed, 3)}
    if s.eta is not None:
        out["estimatedRemainingSeconds"] = round(s.eta)
    if estimate is not None:
        hours = s.elapsed / SECONDS_PER_HOUR
        out["estimate"] = dict(estimate)
        out["measured"] = {"hours": round(hours, 6), **({"cost": round(hours * price_per_hour, 4)}
                                                        if price_per_hour is not None else {})}
    return out


def run_record(elapsed: float, price_per_hour: float | None, step: int, world_size: int,
               tokens_per_second: float | None = None, mfu_measured: float | None = None,
               estimate: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """run.json: the training time measured and what it cost at the stack's $/h (None: no price given), the
    session's average tokens/s per GPU and MFU, and the estimate made before the run. The cost is the unrounded
    hours x the price, rounded once to 4 places; trainingHours is rounded to 6: a reader checks one against the
    other within the two roundings."""
    hours = elapsed / SECONDS_PER_HOUR
    out: dict[str, Any] = {"trainingHours": round(hours, 6), "step": step, "worldSize": world_size}
    if price_per_hour is not None:
        out["pricePerHour"] = price_per_hour
        out["cost"] = round(hours * price_per_hour, 4)
    if tokens_per_second is not None:
        out["tokensPerSecondPerGpu"] = round(tokens_per_second / world_size, 3)
    if mfu_measured is not None:
        out["mfu"] = round(mfu_measured, 6)
    if estimate is not None:
        out["estimate"] = dict(estimate)
    return out


def _span(pair: Any, fmt: str) -> str:
    """`low–high` of an estimate's range ({"low", "high"} or {"fast", "slow"}), each in `fmt`."""
    if not isinstance(pair, Mapping):
        return "?"
    values = sorted(float(v) for v in pair.values() if isinstance(v, int | float))
    return "–".join(format(v, fmt) for v in (values[0], values[-1])) if values else "?"


def estimate_line(record: Mapping[str, Any]) -> str | None:
    """`estimate vs measured: tokens/s per GPU 227–273 estimated, 246 measured; ...` from run.json; None without
    an estimate."""
    e = record.get("estimate")
    if not isinstance(e, Mapping):
        return None
    parts = []
    for label, key, fmt, measured in (("tokens/s per GPU", "tokensPerSecondPerGpu", ",.0f",
                                       record.get("tokensPerSecondPerGpu")),
                                      ("MFU", "mfu", ".2%", record.get("mfu")),
                                      ("hours", "hours", ".4g", record.get("trainingHours")),
                                      ("$", "cost", ",.4f", record.get("cost"))):
        if key in e:
            said = format(measured, fmt) if isinstance(measured, int | float) else "not measured"
            parts.append(f"{label} {_span(e[key], fmt)} estimated, {said} measured")
    rows = e.get("evidence")
    on = f" (rows: {', '.join(rows)})" if isinstance(rows, list) and rows else ""
    return "estimate vs measured: " + "; ".join(parts) + on


def write_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """JSON written whole or not at all: a reader (or a copy of the bucket) never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(data, sort_keys=True) + "\n")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def previous_elapsed(path: Path, resumed_step: int) -> float:
    """The training seconds of the attempts before this one (progress.json's), when this one resumes; 0 else."""
    if resumed_step <= 0:
        return 0.0
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("elapsedSeconds", 0.0)
    except (OSError, ValueError, AttributeError):
        return 0.0
    return float(value) if isinstance(value, int | float) else 0.0


def rank_line(rank: int, s: Snapshot, world_size: int) -> str:
    parts = [f"rank {rank}: step {s.step}/{s.steps} ({progress_percentage(s.step, s.steps)} %)"]
    if s.tokens_per_second is not None:
        parts.append(f"{s.tokens_per_second:,.0f} tokens/s ({s.tokens_per_second / world_size:,.0f} per GPU)")
    if s.mfu is not None:
        parts.append(f"MFU {s.mfu:.2%}")
    if s.eta is not None:
        parts.append(f"ETA {s.eta:,.0f} s")
    if s.loss is not None:
        parts.append(f"loss {s.loss:.4g}")
    return ", ".join(parts)


# --- the Trainer's callback (transformers) ---------------------------------------------------------------------

def measured_mfu(tokens_per_second: float | None, facts: RunFacts, gpus: int) -> float | None:
    """MFU at this rate, or None without the rate or the facts it needs."""
    if tokens_per_second is None or not facts.flops_per_token or not facts.peak_tflops:
        return None
    return mfu(tokens_per_second, facts.flops_per_token, gpus, facts.peak_tflops)


def add_rates(logs: dict[str, Any], s: Snapshot, world_size: int) -> None:
    """The Trainer's logs get the step's rates beside the loss (its TensorBoard writer records them with it)."""
    if s.tokens_per_second is not None:
        logs["tokens_per_second"] = s.tokens_per_second
        logs["tokens_per_second_per_gpu"] = s.tokens_per_second / world_size
    if s.mfu is not None:
        logs["mfu"] = s.mfu


def write_status(path: Path, s: Snapshot, facts: RunFacts) -> None:
    """progress.json as of now."""
    write_atomic(path, trainer_status(s, datetime.datetime.now(datetime.timezone.utc), facts.estimate,
                                      facts.price_per_hour))


def write_run(path: Path, facts: RunFacts, elapsed: float, step: int, world_size: int, average: float | None,
              say: Any) -> None:
    """run.json at the end of a finished run (`average`: the session's tokens/s), and the estimate against it."""
    record = run_record(elapsed, facts.price_per_hour, step, world_size, average,
                        measured_mfu(average, facts, world_size), facts.estimate)
    write_atomic(path, record)
    if line := estimate_line(record):
        say(line)


class ProgressEvents:
    """What the progress callback does at the Trainer's events, in plain Python: `progress_callback` below makes it
    a TrainerCallback, so that transformers is imported only where the ranks train."""

    def __init__(self, facts: RunFacts, progress_path: Path, run_path: Path, say: Any,
                 clock: Callable[[], float]) -> None:
        self.facts, self.say, self.clock = facts, say, clock
        self.progress_path, self.run_path = progress_path, run_path
        self.began = self.last_time = 0.0
        self.start_step = self.last_step = 0
        self.last_tokens = self.first_tokens = 0
        self.before = 0.0  # training seconds of earlier attempts
        self.loss: float | None = None
        self.last: Snapshot | None = None  # the last logging step's, whose rates the final file keeps
        # The session's pace is measured from the end of its first step: that step carries the start's one-time
        # costs (DeepSpeed's first step, the data loader's workers, a resume's reads), which would stretch every
        # ETA after it (make e2e's resumed run: 14 s said at 3 steps in, 9.4 s left).
        self.paced: tuple[int, float] | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        self.began = self.last_time = self.clock()
        self.start_step = self.last_step = state.global_step
        self.last_tokens = self.first_tokens = state.num_input_tokens_seen
        self.before = previous_elapsed(self.progress_path, state.global_step)

    def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> Any:
        if self.paced is None:
            self.paced = (state.global_step, self.clock())
        return control  # unchanged (transformers' CallbackHandler keeps what a callback returns)

    def snapshot(self, state: Any, world: int) -> Snapshot:
        now = self.clock()
        tokens = per_second(state.num_input_tokens_seen - self.last_tokens, now - self.last_time)
        from_step, since = ((self.paced[0], self.paced[1]) if self.paced and state.global_step > self.paced[0]
                            else (self.start_step, self.began))
        eta = eta_seconds(state.global_step, state.max_steps, from_step, now - since)
        self.last_time, self.last_tokens, self.last_step = now, state.num_input_tokens_seen, state.global_step
        return Snapshot(state.global_step, state.max_steps, self.before + now - self.began, eta, self.loss,
                        tokens, measured_mfu(tokens, self.facts, world))

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **_: Any) -> None:
        if logs is None or "loss" not in logs or state.global_step == self.last_step:
            return  # an eval's or the run's summary log: no training window to measure
        self.loss = float(logs["loss"])
        self.last = s = self.snapshot(state, args.world_size)
        add_rates(logs, s, args.world_size)
        self.say(rank_line(args.process_index, s, args.world_size))
        if state.is_world_process_zero:
            write_status(self.progress_path, s, self.facts)

    def on_train_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        if not state.is_world_process_zero:
            return
        elapsed = self.before + self.clock() - self.began
        finished = state.global_step >= state.max_steps
        last = self.last
        write_status(self.progress_path, Snapshot(state.global_step, state.max_steps, elapsed,
                                                  0.0 if finished else None, self.loss,
                                                  last.tokens_per_second if last else None,
                                                  last.mfu if last else None), self.facts)
        if finished:
            # the session's average: every token it trained over its seconds (the last window's rate is noise)
            average = per_second(state.num_input_tokens_seen - self.first_tokens, self.clock() - self.began)
            write_run(self.run_path, self.facts, elapsed, state.global_step, args.world_size, average, self.say)


def progress_callback(facts: RunFacts, checkpoint_dir: str, model_dir: str, say: Any,
                      clock: Any = time.monotonic) -> Any:
    """The TrainerCallback: its on_log comes before the TensorBoard writer's (finetune.py puts it first), so the
    values it adds to the logs are recorded with the loss."""
    from transformers import TrainerCallback

    class Progress(ProgressEvents, TrainerCallback):  # type: ignore[misc]
        """ProgressEvents first: its handlers are the ones the Trainer calls, TrainerCallback's do nothing."""

    return Progress(facts, Path(checkpoint_dir) / PROGRESS_FILE, Path(model_dir) / RUN_FILE, say, clock)


def event_file_closer(writer: Any) -> Any:
    """A TrainerCallback after TensorBoard's (`writer`: transformers' TensorBoardCallback) that closes the writer's
    event file at each logging step; the writer opens a new one at its next on_log (transformers 5.19,
    integration_utils.py: `if self.tb_writer is None: self._init_summary_writer(args)`). On the bucket's GCS FUSE
    mount a file reaches Cloud Storage only once closed: gcsfuse stages a write and uploads it on close or fsync, and
    with streaming writes (the pods' `checkpointing` mount options) fsync does not finalize the object (gcsfuse
    v2.9.1's release notes); the writer only flushes (no fsync) and would keep one file open until the end of
    training, so a TensorBoard server reading the bucket (kind tensorboard) would show nothing while the run lasts.
    A file per logging step (about 1 KB each) is what TensorBoard reads in order, like a writer's own rotation."""
    from transformers import TrainerCallback

    class CloseEventFile(TrainerCallback):  # type: ignore[misc]
        def on_log(self, args: Any, state: Any, control: Any, **_: Any) -> Any:
            opened = getattr(writer, "tb_writer", None)
            if opened is not None:
                opened.close()
                writer.tb_writer = None
            return control

    return CloseEventFile()
