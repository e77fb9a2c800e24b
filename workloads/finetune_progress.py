"""What finetune.py's progress callback (recipes/finetune_progress.py) needs from the stack, in the ranks'
environment: the GPU's peak dense TFLOPS in the run's precision and the model's FLOPs per token (MFU as the run's
estimate defines it, planner/run_estimate.py: 6N full, 4N LoRA, without the recomputation, over
data/gpu_catalog.yaml peakTflops), the stack's $/h while the run trains (its pool's nodes at the price it pays and
every node up meanwhile, planner/run_cost.py training_per_hour: the measured cost in MODEL_DIR/run.json), the run's
estimate (FINETUNE_ESTIMATE: the preview's, set against the measured values in progress.json and run.json), and
TENSORBOARD_LOGGING_DIR, the folder of the run's TensorBoard event files: `logs/<workload>`
under the output root (the bucket's mount with gcsFuse.enabled, else the claim). What the stack cannot say (a GPU
without a peak, a model without a size, an unpriced machine) is left out: the run still logs what it can.
"""

from __future__ import annotations

import json
from pathlib import PurePosixPath
from typing import Any

from model import catalog as gpu_catalog
from model.types import FinetuneWorkloadConfig, StackConfig, VertexConfig
from planner import cost, extra_costs, past_runs, run_cost, run_estimate, vertex_run
from planner.requests import vertex_request, workload_request

PEAK_ENV = "FINETUNE_PEAK_TFLOPS"  # finetune_progress.PEAK_ENV, and the two below
FLOPS_ENV = "FINETUNE_MODEL_FLOPS"  # per token trained (a name with TOKEN in it reads as a secret to the policy)
PRICE_ENV = "FINETUNE_PRICE_PER_HOUR"
ESTIMATE_ENV = "FINETUNE_ESTIMATE"  # finetune_progress.ESTIMATE_ENV: the run's estimate, JSON
LOGS_ENV = "TENSORBOARD_LOGGING_DIR"  # transformers' TensorBoardCallback reads its folder from it
LOGS_FOLDER = "logs"
PROGRESS_FILE = "progress.json"  # finetune_progress.PROGRESS_FILE: beside the checkpoints
RUN_FILE = "run.json"  # finetune_progress.RUN_FILE: beside the model


def logs_folder(w: FinetuneWorkloadConfig) -> str:
    """The run's TensorBoard folder relative to the output root: `logs/<workload>`."""
    return f"{LOGS_FOLDER}/{w.name}"


def logs_dir(w: FinetuneWorkloadConfig) -> str:
    return f"{w.output_root.rstrip('/')}/{logs_folder(w)}"


def where_to_watch(w: FinetuneWorkloadConfig) -> dict[str, str]:
    """The run's progress file, event files and cost record (the preview's "Training" section): in the bucket, by
    their paths there, with gcsFuse.enabled; else the pods' paths on the claim."""
    progress = f"{w.checkpoint_dir}/{PROGRESS_FILE}"
    out = {"logsDir": logs_dir(w), "progressFile": progress, "runRecord": f"{w.model_dir}/{RUN_FILE}"}
    if w.gcs_fuse.enabled:
        root = PurePosixPath(w.output_root)
        out |= {"progressInBucket": str(PurePosixPath(progress).relative_to(root)), "logsInBucket": logs_folder(w),
                "runRecordInBucket": f"{w.model_folder}/{RUN_FILE}"}
    return out


def _number(value: float) -> str:
    return f"{value:.6g}"


def model_flops(w: FinetuneWorkloadConfig) -> float | None:
    """The model's FLOPs per token trained, as the run's estimate counts them; None where its size is unknown."""
    request = workload_request(w)
    if request is None:
        return None
    flops, _executed = run_estimate.flops_per_token(request.model.parameters, request.lora is not None,
                                                    request.gradient_checkpointing)
    return flops


def estimate_summary(run: dict[str, Any]) -> dict[str, Any]:
    """What the ranks carry of the `costs` output's run (planner/cost.py): the ranges a measured run is set against,
    at the price the pool pays, and the rows they rest on."""
    return {"tokensPerSecondPerGpu": run["tokensPerSecondPerGpu"], "mfu": run["mfu"], "hours": run["hours"],
            "trainingHours": run["trainingHours"], "cost": run["perRun"][run["pays"]],
            "evidence": run["evidence"]}


def estimate_env(cfg: StackConfig, w: FinetuneWorkloadConfig, cat: gpu_catalog.Catalog) -> dict[str, str]:
    """ESTIMATE_ENV for the workload's run, where the preview has an estimate of it."""
    run = (cost.stack_costs(cfg, cat).get("runs") or {}).get(w.name)
    if not isinstance(run, dict) or "missing" in run:
        return {}
    summary = estimate_summary(run)
    request = workload_request(w)
    if request is not None:  # what ran, for `make gpus RUNS=` to find runs of the same shape (planner/past_runs.py)
        summary["shape"] = past_runs.Shape(request.model.name, str(run["gpu"]), int(run["gpus"]),
                                           request.lora is not None, w.deepspeed.zero_stage).record()
    return {ESTIMATE_ENV: json.dumps(summary, sort_keys=True, separators=(",", ":"))}


def run_env(cfg: StackConfig, w: FinetuneWorkloadConfig, cat: gpu_catalog.Catalog | None = None) -> dict[str, str]:
    cat = cat or gpu_catalog.load()
    out = {LOGS_ENV: logs_dir(w)}
    pool = cfg.pool(w.pool) if w.pool else None
    if pool is None:
        return out
    peak = run_estimate.peak(cat, pool.gpu.type, w.deepspeed.precision)
    if peak is not None:
        out[PEAK_ENV] = _number(peak)
    flops = model_flops(w)
    if flops is not None:
        out[FLOPS_ENV] = _number(flops)
    price = run_cost.training_per_hour(cfg, w.name, cat)  # every node up while it trains, as the estimate counts them
    if price is not None:
        out[PRICE_ENV] = _number(price)
    return {**out, **estimate_env(cfg, w, cat)}


def vertex_env(v: VertexConfig, cat: gpu_catalog.Catalog | None = None) -> dict[str, str]:
    """The progress inputs of the recipe on Vertex AI, as a GKE pool's ranks get them (run_env): the GPU's peak, the
    model's FLOPs per token (`vertex.model` or finetune.model's entry), Vertex's $/h for every replica, and the
    run's estimate (planner/vertex_run.py). Its event files go where Vertex says (AIP_TENSORBOARD_LOG_DIR)."""
    cat = cat or gpu_catalog.load()
    out: dict[str, str] = {}
    peak = run_estimate.peak(cat, v.gpu.type, v.deepspeed.precision)
    if peak is not None:
        out[PEAK_ENV] = _number(peak)
    request = vertex_request(v)
    if request is not None:
        flops, _executed = run_estimate.flops_per_token(request.model.parameters, request.lora is not None,
                                                        request.gradient_checkpointing)
        out[FLOPS_ENV] = _number(flops)
    price = extra_costs.vertex_per_hour(v, cat)
    if price is not None:
        out[PRICE_ENV] = _number(price)
    run = vertex_run.vertex_run(v, price, cat)
    if run is not None and "missing" not in run:
        summary = {"tokensPerSecondPerGpu": run["tokensPerSecondPerGpu"], "mfu": run["mfu"], "hours": run["hours"],
                   "trainingHours": run["trainingHours"], "cost": run["perRun"], "evidence": run["evidence"]}
        out[ESTIMATE_ENV] = json.dumps(summary, sort_keys=True, separators=(",", ":"))
    return out
