"""The Vertex AI recipe's run in all, as a GKE finetune workload's (planner/run_cost.py run_costs): its tokens
(`vertex.finetune.datasetTokens` x epochs, or maxSteps x the global batch x sequence length), its training hours from
the measured runs (planner/run_estimate.py) on every replica's GPUs, its saves (planner/run_hours.py's rule: steps
over saveSteps, each the checkpoint over the bucket's write rate, every replica its share), at Vertex's $/h while it
runs (the `costs` output's `vertex.perHour`). `vertex_run()` is `costs.vertex.run`; a key that feeds it is read, and
where the run has no estimate, `missing` says which key to set."""

from __future__ import annotations

from typing import Any

from model import capacity, training_speed
from model import catalog as gpu_catalog
from model.types import VertexConfig
from planner import recovery, run_estimate, run_hours
from planner.requests import vertex_request, vertex_strategy

KEY = "vertex.finetune"


def vertex_tokens(v: VertexConfig) -> tuple[float | None, str]:
    """The tokens the recipe trains and how they were counted; None (and what to set) where the keys do not say."""
    f = v.finetune
    assert f is not None
    gpus = (1 + v.workers) * v.gpu.count
    if f.max_steps is not None:
        batch = gpus * v.deepspeed.micro_batch_per_gpu * v.deepspeed.gradient_accumulation
        return (float(f.max_steps * batch * f.sequence_length),
                f"{KEY}.maxSteps {f.max_steps:,} x global batch {batch} x sequenceLength {f.sequence_length:,}: "
                "every sample full, an upper bound")
    if f.dataset_tokens is None:
        return None, f"set {KEY}.datasetTokens (the data's token count) or {KEY}.maxSteps"
    epochs = f.epochs if f.epochs is not None else 1.0
    return f.dataset_tokens * epochs, f"{KEY}.datasetTokens {f.dataset_tokens:,} x {epochs:g} epoch(s)"


def vertex_run(v: VertexConfig, per_hour: float | None,
               cat: gpu_catalog.Catalog | None = None) -> dict[str, Any] | None:
    """`costs.vertex.run`: hours and $ per run at `per_hour` (Vertex's rate for every replica), or `missing`;
    None without `vertex.finetune`."""
    if not v.enabled or v.finetune is None:
        return None
    cat = cat or gpu_catalog.load()
    request = vertex_request(v)
    tokens, said = vertex_tokens(v)
    precision = v.deepspeed.precision
    top = run_estimate.peak(cat, v.gpu.type, precision)
    replicas = 1 + v.workers
    gpus = replicas * v.gpu.count
    if request is None:
        return {"missing": f"give vertex.model.parameters (the size of {v.finetune.model or 'the model'} is unknown)"}
    if top is None:
        return {"missing": f"add {v.gpu.type}'s {precision} peak to data/gpu_catalog.yaml peakTflops"}
    if tokens is None:
        return {"missing": said}
    if per_hour is None:
        return {"missing": "the Vertex machine is not priced (data/gpu_catalog.yaml)"}
    e = run_estimate.estimate(tokens, request, vertex_strategy(v), gpus, top, gpu_type=v.gpu.type)
    plan = recovery.plan(request.trained_parameters, precision, replicas, "gcsfuse", v.spot, True)
    steps = tokens / (gpus * v.deepspeed.micro_batch_per_gpu * v.deepspeed.gradient_accumulation
                      * v.finetune.sequence_length)
    count = int(steps // v.finetune.save_steps)
    speed = training_speed.load()
    kind = capacity.SPOT if v.spot else capacity.ON_DEMAND
    interval = run_hours.young_interval(plan.save_seconds, speed.mean_hours_between_interruptions[kind])
    saves = count * plan.save_seconds / 3600
    hours = {"fast": e.hours_fast + saves, "slow": e.hours_slow + saves}
    low, high = e.tokens_per_second_per_gpu
    return {"tokens": tokens, "tokensFrom": said, "gpus": gpus, "gpu": v.gpu.type, "precision": precision,
            "peakTflops": top, "modelFlopsPerToken": e.model_flops_per_token, "evidence": list(e.evidence),
            "notes": list(e.notes), "mfu": {"low": round(e.mfu_low, 4), "high": round(e.mfu_high, 4)},
            "tokensPerSecondPerGpu": {"low": round(low, 1), "high": round(high, 1)},
            "trainingHours": {"fast": round(e.hours_fast, 3), "slow": round(e.hours_slow, 3)},
            "saves": {"count": count, "saveSteps": v.finetune.save_steps, "secondsEach": round(plan.save_seconds, 1),
                      "hours": round(saves, 3), "intervalMinutes": round(interval / 60, 1)},
            "hours": {k: round(h, 3) for k, h in hours.items()}, "perHour": per_hour,
            "perRun": {k: round(h * per_hour, 2) for k, h in hours.items()}}
