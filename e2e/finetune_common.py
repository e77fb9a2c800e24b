"""What the `finetune`, `vertex` and `adapters` scenarios of `make e2e` share (e2e/run.py): the tiny Llama and
its data, the `finetune` kind's workload, and the checks of a run's output and records (vLLM's side:
serving_common.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import harness
from harness import CACHE_LOCK, ROOT, VENV, _chown_dirs, fail_unless, stack_workload, write

# --- fine-tune, preempt, resume, export, serve -------------------------------------------------------------

TINY_LLM = Path(__file__).resolve().parent / "tiny_llm.py"
SEND_PROMPT = ROOT / "recipes" / "send_prompt.py"
# ZeRO-3 in fp32 (DeepSpeed's CPU accelerator has no fp16); 2 ranks x 4 samples a step. A LoRA adapter learns a
# random model slowly: a high learning rate.
FINETUNE_DS = {"zeroStage": 3, "precision": "fp32", "microBatchPerGpu": 4, "gradientAccumulation": 1,
               "stepsPerPrint": 1000, "learningRate": 0.01}
# 30 steps: the loss is about 0.90 of the first by then (two runs at 40 steps: 5.55 at step 5, 4.99 at step 30, 4.94
# at 40); ten more cost make e2e 10 s of its 4 minutes.
FINETUNE_STEPS = 30
FINETUNE_SAVE_STEPS = 5
BUCKET_INPUTS = "e2e-finetune"  # the data and the base model, in the bucket
# The kind's `finetune` keys: its defaults (LoRA on every linear layer; gradient checkpointing) but for the data,
# the model and the run's length, and the export: merged here (the `adapters` scenario serves adapters).
# The data: chat conversations (OpenAI's messages), one in eight held out for the eval loss at every save. Not
# packed (chat's default): padding-free batches took the tiny model twice the CPU time a step (docs/measurements.md);
# make test-recipe trains them (tests/recipe).
FINETUNE_KEYS = {"finetune": {"modelPath": f"{BUCKET_INPUTS}/base", "datasetPath": f"{BUCKET_INPUTS}/data.jsonl",
                              "recordFormat": "messages", "evalSplit": 0.125, "sequenceLength": 96,
                              "maxSteps": FINETUNE_STEPS, "saveSteps": FINETUNE_SAVE_STEPS,
                              "lora": {"export": "merged"}},
                 # A bucket folder names no shape: the tiny Llama's, for the planner's memory check (e2e/tiny_llm.py:
                 # 2 x 512 x 64 embedding and head + 2 layers x (4 x 64^2 + 3 x 64 x 128) = 148k parameters).
                 "model": {"parameters": 0.00015, "vocabulary": 512, "hidden": 64, "precision": "fp32"}}
FINETUNE_LAUNCH_ARGS = ["--logging-steps", "5"]
# Tiered saves (localCheckpoints): each worker's own folder stands for its local SSD emptyDir, and the copy to the
# bucket is capped so that one takes seconds (a checkpoint of the tiny Llama is about 1 MB; a real one takes minutes)
# and the whole-job stop comes while one is under way.
FINETUNE_COPY_ARGS = ["--copy-rate-mb", "0.25"]
FINETUNE_PROMPT = "What is two plus three?"
FINETUNE_SYSTEM = "You add numbers."
# A conversation no record holds (the records' second turns ask other sums): the server's chat reply to it.
FINETUNE_HELD_OUT = [{"role": "system", "content": FINETUNE_SYSTEM},
                     {"role": "user", "content": "What is seven plus one?"},
                     {"role": "assistant", "content": "seven plus one is 8."},
                     {"role": "user", "content": "And six plus seven?"}]
FINETUNE_MAX_TOKENS = 12
NUMBERS = ("zero", "one", "two", "three", "four", "five", "six", "seven")
LOSS_LINE = re.compile(r"\{'loss': '?([\d.]+)'?")
EVAL_LOSS_LINE = re.compile(r"'eval_loss': '?([\d.]+)'?")
RESUMED = re.compile(r"\[finetune\] rank 0/\d+: .* resuming from (\S+)")
# The progress callback's facts (workloads/finetune_progress.py renders them from the pool on a cluster). Here the
# ranks run on CPUs, which have no peak in data/gpu_catalog.yaml: data/training_speed.yaml's cpuPeakTflops stand-in,
# so MFU is computed the cluster's way against a stated figure; and a stand-in price of $1/h.
E2E_PRICE_PER_HOUR = 1.0
EVENT_TAGS = ("train/loss", "train/tokens_per_second", "train/mfu")  # TensorBoardCallback's names (train/ + key)
ETA_TOLERANCE = 0.5  # the ETA at half-way within 50 % of the real remainder (issue 29 item 2)


def e2e_estimate(w: Any) -> dict[str, Any]:
    """The run's estimate before it starts, as the stack renders one for a GPU pool, from the CPU rows of
    data/training_speed.yaml (this scenario's own measured runs, `toy`): its maxSteps x global batch x sequence
    tokens (an upper bound: chat records are shorter), at the rows' tokens/s per rank, plus its saves (every
    saveSteps, each the checkpoint over the bucket's write rate, planner/recovery.py), at the stand-in $/h."""
    from model import training_speed
    from planner import recovery, run_estimate, run_hours
    from planner.requests import workload_request, workload_strategy

    request = workload_request(w)
    assert request is not None, "the e2e workload's model block gives its size"
    tokens, _said = run_estimate.run_tokens(w, w.workers)
    assert tokens is not None, "the e2e workload trains maxSteps"
    e = run_estimate.estimate(tokens, request, workload_strategy(w), w.workers,
                              training_speed.load().cpu_peak_tflops, gpu_type="cpu")
    save = recovery.plan(request.trained_parameters, w.deepspeed.precision, w.workers,
                         "gcsfuse" if w.gcs_fuse.enabled else "nfs", False, w.writes_model).save_seconds
    saves = FINETUNE_STEPS // w.finetune.save_steps
    return run_hours.summary(e, saves * save / 3600, E2E_PRICE_PER_HOUR)


def e2e_run_env(w: Any) -> dict[str, str]:
    """What the stack renders for the progress callback, with the CPU's stand-in peak (data/training_speed.yaml
    cpuPeakTflops) and price, and the run's estimate from the CPU rows."""
    from model import training_speed
    from workloads import finetune_progress

    flops = finetune_progress.model_flops(w)
    assert flops is not None, "the e2e workload's model block gives its size"
    peak = training_speed.load().cpu_peak_tflops
    return {finetune_progress.LOGS_ENV: finetune_progress.logs_dir(w), finetune_progress.FLOPS_ENV: f"{flops:.6g}",
            finetune_progress.PEAK_ENV: f"{peak:g}", finetune_progress.PRICE_ENV: f"{E2E_PRICE_PER_HOUR:g}",
            finetune_progress.ESTIMATE_ENV: json.dumps(e2e_estimate(w), separators=(",", ":"))}


def run_record_problems(run: dict[str, Any], steps: int, price: float) -> list[str]:
    """run.json against the run: its step, its cost = hours x $/h within the two roundings (the record rounds the
    cost from the unrounded hours to 4 places and the hours to 6: |cost - hours x price| <= 0.5e-4 + price x
    0.5e-6), and the estimate it carries beside the measured tokens/s and MFU."""
    problems = []
    hours, cost = run.get("trainingHours"), run.get("cost")
    if run.get("step") != steps or not isinstance(hours, int | float) or not isinstance(cost, int | float) or \
            abs(cost - hours * price) > 0.5e-4 + price * 0.5e-6 + 1e-12:
        problems.append(f"run.json {run}: expected step {steps} and hours x ${price:g}/h within rounding")
    missing = [k for k in ("estimate", "tokensPerSecondPerGpu", "mfu") if k not in run]
    if missing:
        problems.append(f"run.json lacks {', '.join(missing)} (the estimate beside the measured run)")
    return problems


class ProgressWatch(threading.Thread):
    """Polls CHECKPOINT_DIR/progress.json while a run trains: the first reading at half-way or past it."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path, self.half = path, None
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set() and self.half is None:
            try:
                seen = json.loads(self.path.read_text())
            except (OSError, ValueError):  # not yet written (the writer renames: never half a file)
                seen = None
            if seen and seen.get("progressPercentage", 0) >= 50:
                self.half = seen
            time.sleep(0.05)


def progress_problems(half: dict[str, Any] | None, final: dict[str, Any]) -> list[str]:
    """The progress file ends at 100 %, and its ETA at half-way was within ETA_TOLERANCE of the time that was in
    fact left (the training seconds between the two readings)."""
    problems = []
    if final.get("progressPercentage") != 100 or final.get("estimatedRemainingSeconds") != 0:
        problems.append(f"progress.json ends at {final.get('progressPercentage')} %, ETA "
                        f"{final.get('estimatedRemainingSeconds')} s: expected 100 % and 0 s")
    if half is None or "estimatedRemainingSeconds" not in half:
        return [*problems, f"no ETA read at half-way ({half})"]
    real = final["elapsedSeconds"] - half["elapsedSeconds"]
    eta = half["estimatedRemainingSeconds"]
    if abs(eta - real) > ETA_TOLERANCE * real:
        problems.append(f"ETA at step {half.get('step')} ({half['progressPercentage']} %): {eta} s, but {real:.1f} s "
                        f"were left (more than {ETA_TOLERANCE:.0%} off)")
    return problems


def event_problems(tags: set[str]) -> list[str]:
    return [f"the TensorBoard event files have no {tag}" for tag in EVENT_TAGS if tag not in tags]


EVENT_TAGS_SCRIPT = """
import json, pathlib, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
tags = set()
for path in sorted(pathlib.Path(sys.argv[1]).rglob("events.out.tfevents.*")):
    events = EventAccumulator(str(path))
    events.Reload()
    tags |= {t for t in events.Tags()["scalars"] if events.Scalars(t)}
print(json.dumps(sorted(tags)))
"""


def finetune_records() -> list[dict[str, Any]]:
    """The scenario's data set: 64 conversations (OpenAI's messages) a tiny model learns within a few dozen steps,
    a system turn and a question, every eighth with a second question: two assistant turns, both learned."""
    records = []
    for i, a in enumerate(NUMBERS):
        for j, b in enumerate(NUMBERS):
            messages = [{"role": "system", "content": FINETUNE_SYSTEM},
                        {"role": "user", "content": f"What is {a} plus {b}?"},
                        {"role": "assistant", "content": f"{a} plus {b} is {i + j}."}]
            if j == i:
                messages += [{"role": "user", "content": f"And {b} plus {a}?"},
                             {"role": "assistant", "content": f"{b} plus {a} is {i + j} too."}]
            records.append({"messages": messages})
    return records


TOKENIZED_MADE = re.compile(r"\[finetune\] tokenized (\d+) records in ([\d.]+) s")
TOKENIZED_REUSED = re.compile(r"\[finetune\] tokenized data reused from (\S+) ")


def tokenized_problems(first: str, second: str) -> list[str]:
    """The data tokenized once (issue 31 item 2): by the first start's launcher (--prepare-data, before the ranks),
    whose ranks then memory-map that folder; the second start (the resume) tokenizes nothing and reuses the same
    folder."""
    problems = []
    made, again = TOKENIZED_MADE.findall(first), TOKENIZED_MADE.findall(second)
    if len(made) != 1:
        problems.append(f"the first start tokenized the data {len(made)} times, expected once (the launcher's step)")
    if again:
        problems.append(f"the second start tokenized the data again ({len(again)} times): expected it reused")
    folders = {*TOKENIZED_REUSED.findall(first), *TOKENIZED_REUSED.findall(second)}
    if not TOKENIZED_REUSED.search(first) or not TOKENIZED_REUSED.search(second) or len(folders) != 1:
        problems.append(f"folders reused {sorted(folders)}: expected the first start's ranks and the second start to "
                        "reuse the one folder the launcher made")
    return problems


def trainer_losses(output: str) -> list[float]:
    """The Trainer's logged losses in order (transformers 5 prints them as strings: {'loss': '3.458', ...})."""
    return [float(v) for v in LOSS_LINE.findall(output)]


def eval_losses(output: str) -> list[float]:
    """The eval losses on the held-out records, logged at each save."""
    return [float(v) for v in EVAL_LOSS_LINE.findall(output)]


def sample_problems(sample: dict[str, Any], rendered: dict[str, Any]) -> list[str]:
    """What differs between the first record as finetune.py trained on it (CHECKPOINT_DIR/rendered-sample.json) and
    transformers' apply_chat_template of it: the ids, and the labels everywhere but the assistant turns masked (its
    assistant mask, from the template with {% generation %} markers)."""
    expected = [token if mask else -100 for token, mask in zip(rendered["marked_ids"], rendered["assistant_masks"],
                                                                strict=True)]
    problems = []
    if rendered["marked_ids"] != rendered["input_ids"]:
        problems.append("the marked template renders other ids than the served one")
    if sample.get("input_ids") != rendered["input_ids"]:
        problems.append(f"trained ids {sample.get('input_ids')} != apply_chat_template's {rendered['input_ids']}")
    if sample.get("labels") != expected:
        problems.append(f"trained labels {sample.get('labels')} != the assistant turns' {expected}")
    if not any(label != -100 for label in expected):
        problems.append("the record has no assistant token")
    return problems


def resumed_from(output: str) -> str | None:
    found = RESUMED.findall(output)
    return found[-1] if found else None


class Phases:
    """Each phase's wall time, printed as it ends."""

    def __init__(self, scenario: str) -> None:
        self.scenario = scenario
        self.done: list[tuple[str, float]] = []
        self._start = time.monotonic()

    def end(self, name: str) -> None:
        now = time.monotonic()
        self.done.append((name, now - self._start))
        print(f"[e2e] {self.scenario}: {name} {now - self._start:.1f} s", flush=True)
        self._start = now

    def summary(self) -> str:
        return ", ".join(f"{name} {seconds:.0f} s" for name, seconds in self.done)


def _finetune_script() -> Any:
    """finetune.py's checkpoint rule (newest_checkpoint), the same the ranks resume by."""
    from workloads.finetune import script_module

    return script_module("finetune_checkpoints")


def copied(ft: Any, checkpoints: Path) -> Path | None:
    """The newest checkpoint every node's copy finished (finetune_tiered.py's marker), as a tiered run resumes."""
    from workloads.finetune import script_module

    return ft.newest_checkpoint(checkpoints, script_module("finetune_tiered").COPIED_MARKER)


def copying(ft: Any, checkpoints: Path, after: int) -> int | None:
    """A checkpoint newer than `after` whose copy to the bucket is under way (its folder there, no marker yet)."""
    from workloads.finetune import script_module

    marker = script_module("finetune_tiered").COPIED_MARKER
    steps = [step for p in checkpoints.iterdir() if (step := ft.checkpoint_step(p.name)) is not None
             and step > after and not (p / marker).exists()] if checkpoints.is_dir() else []
    return min(steps, default=None)


def _venv_popen(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """_venv_python's process in the background, its output in `log`; killed at the run's end if still running."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "OMP_NUM_THREADS": "1",
           "PYTHONUNBUFFERED": "1"}
    with open(log, "wb") as out:
        process = subprocess.Popen([str(VENV / "bin" / "python"), *args], stdout=out, stderr=subprocess.STDOUT,
                                   env=env)
    harness.BACKGROUND.append(process)
    return process


def _venv_python(*args: str, timeout: float = 120) -> str:
    """The e2e venv's python on this machine (torch, transformers), outside the hosts; its stdout. One OpenMP
    thread, as the ranks (RANK_ENV): beside the other cluster's work a second thread only spins (lora_llm.py took
    21.8 CPU s with two, 8.6 with one; docs/measurements.md)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "OMP_NUM_THREADS": "1"}
    result = subprocess.run([str(VENV / "bin" / "python"), *args], capture_output=True, text=True, timeout=timeout,
                            env=env, check=False)
    fail_unless(result.returncode == 0, f"{' '.join(args[:2])}: {result.stderr.strip()[-800:]}")
    return result.stdout


def tiny_base(base: Path, cache: Path) -> None:
    """The run's one tiny Llama (random weights, a tokenizer trained on every scenario's records: finetune's
    conversations, whose words vertex's documents use, and the adapters' questions and answers) copied to `base`:
    made by the first scenario that needs it (e2e/tiny_llm.py, 10 CPU s), kept in `cache` for the others. One base
    for all: an adapter trained by one scenario (vertex's) is served on another's (adapters') server."""
    from adapters_common import adapter_records  # builds on this module: imported when a base is made

    with CACHE_LOCK:  # the clusters' scenarios side by side: one makes it, the other waits and copies
        if not (cache / "base").is_dir():
            cache.mkdir(parents=True, exist_ok=True)
            corpus = cache / "corpus.jsonl"
            write(corpus, "".join(json.dumps(r) + "\n" for r in [*finetune_records(), *adapter_records()]))
            # With it, transformers' rendering of finetune's first record (what finetune.py must train on):
            # computed where transformers is imported anyway (tiny_llm.py references cost 9 CPU s of its own).
            made = _venv_python(str(TINY_LLM), "make", str(corpus), str(cache / "base"),
                                json.dumps(finetune_records()[0]["messages"]))
            write(cache / RENDERED, json.dumps(json.loads(made.strip().splitlines()[-1])["render"]))
        shutil.copytree(cache / "base", base, dirs_exist_ok=True)


RENDERED = "render.json"  # tiny_base's: transformers' rendering of finetune_records()[0], beside the cached base


def finetune_assets(bucket: Path, cache: Path) -> None:
    """The data set and the run's tiny Llama (tiny_base) uploaded to the bucket."""
    base = bucket / BUCKET_INPUTS
    base.mkdir(parents=True, exist_ok=True)
    write(base / "data.jsonl", "".join(json.dumps(r) + "\n" for r in finetune_records()))
    tiny_base(base / "base", cache)
    _chown_dirs(bucket)


def finetune_workload() -> tuple[Any, Any, Any]:
    """The dev stack's `finetune` workload as the stack renders it: (workload, placement, its MPIJob launch)."""
    from workloads import finetune

    w, where = stack_workload("finetune", args=[*FINETUNE_LAUNCH_ARGS, *FINETUNE_COPY_ARGS], script="finetune.py",
                              deepspeed=FINETUNE_DS, keys={**FINETUNE_KEYS, "localCheckpoints": True})
    return w, where, finetune.launch(w, has_token=False, run_env=e2e_run_env(w))


def outside(path: str, mount: str, folder: Path) -> Path:
    """Where a pod's path under `mount` lies on this machine, `folder` being what is mounted there."""
    return folder / Path(path).relative_to(mount)
