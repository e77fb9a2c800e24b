"""A finetune run in all: its hours (training, saves, the data step) and dollars at the stack's $/h while it trains,
with the nodes that wait meanwhile; and, where its pool consumes a reservation that ends, the hours past the end and
what they cost on the fallback pool. The `runs` of the `costs` stack output (planner/cost.py).
"""

from __future__ import annotations

from typing import Any

import msgspec

from model import capacity, reservation, training_speed
from model import catalog as gpu_catalog
from model.types import FinetuneWorkloadConfig, StackConfig
from planner import run_estimate, run_hours, spill
from planner.extra_costs import filestore_costs
from planner.pool_cost import SERVING, PoolCost, pool_costs, role, workload_nodes


def _waiting(cfg: StackConfig, run: run_estimate.WorkloadRun) -> dict[str, int]:
    """Nodes of other pools kept up while the run trains: each serving workload's replicas (a server of the run's
    model waits in Init for it, on its node)."""
    out: dict[str, int] = {}
    for w in cfg.workloads.values():
        if role(w) == SERVING and w.pool and w.pool != run.pool:
            out[w.pool] = out.get(w.pool, 0) + workload_nodes(w)
    return out


def _run_per_hour(run: run_estimate.WorkloadRun, pools: list[PoolCost], fee: float, floor_extra: float,
                  spot: bool, waiting: dict[str, int] | None = None) -> float:
    """The stack's $/h while this run trains, its pool's nodes at the spot or the on-demand price, every other pool
    at the nodes that wait meanwhile (a server's, `waiting`) or its min nodes, as it pays, with the cluster fee and
    what bills anyway (Filestore)."""
    total = fee + floor_extra
    for p in pools:
        if p.name == run.pool:
            total += p.at(min(p.max_nodes, max(p.min_nodes, run.nodes)), spot)
        else:
            total += p.pays(min(p.max_nodes, max(p.min_nodes, (waiting or {}).get(p.name, 0))))
    return round(total, 4)


def training_per_hour(cfg: StackConfig, name: str, cat: gpu_catalog.Catalog | None = None) -> float | None:
    """The stack's $/h while the finetune workload `name` trains, at the price its pool pays: its nodes, every node
    that waits meanwhile (a server), the other pools at min nodes, the cluster fee, Filestore. None where the
    workload is not on a priced pool of the stack (what run.json's cost is computed at)."""
    cat = cat or gpu_catalog.load()
    w = cfg.workloads.get(name)
    if not isinstance(w, FinetuneWorkloadConfig):
        return None
    run = run_estimate.workload_run(cfg, w, cat)
    pools = pool_costs(cfg, cat)
    pool = next((p for p in pools if p.name == (run.pool if run else None)), None)
    if run is None or pool is None or not pool.known:
        return None
    fee = cat.gke_cluster_fee_per_hour if cfg.cluster is not None else 0.0
    filestore = filestore_costs(cfg, cat)
    return _run_per_hour(run, pools, fee, filestore["perHour"] if filestore else 0.0, pool.spot, _waiting(cfg, run))


def _hours_parts(cfg: StackConfig, run: run_estimate.WorkloadRun) -> dict[str, Any]:
    """The saves and the data step (planner/run_hours.py), in hours, with the warning when saves weigh too much."""
    e = run.estimate
    assert e is not None
    out: dict[str, Any] = {}
    w = cfg.workloads.get(run.name)
    if (s := run_hours.saves(cfg, run)) is not None:
        out["saves"] = {"saveSteps": s.save_steps, "steps": round(s.steps), "count": s.count,
                        "secondsEach": round(s.seconds, 1), "storage": s.storage, "hours": round(s.hours, 3),
                        "capacity": s.capacity, "meanHoursBetweenInterruptions": s.mean_hours_between_interruptions,
                        "intervalMinutes": round(s.interval_seconds / 60, 1),
                        "proposedSaveSteps": list(s.proposed_steps)}
        if warning := run_hours.saves_warning(run.name, s, e.hours_fast, e.hours_slow):
            out["saves"]["warning"] = warning
    if isinstance(w, FinetuneWorkloadConfig) and (d := run_hours.data_step(w, run_hours.first_worker(cfg, w))):
        out["dataStep"] = {"hours": {"fast": round(d.hours_fast, 4), "slow": round(d.hours_slow, 4)},
                           "cpus": d.cpus, "on": d.on, "kinds": list(d.kinds)}
    return out


def run_costs(cfg: StackConfig, pools: list[PoolCost], fee: float, floor_extra: float,
              cat: gpu_catalog.Catalog) -> dict[str, Any]:
    """Each finetune workload's run in all: its training hours, fast and slow over the measured runs' MFU
    (planner/run_estimate.py), plus its saves and data step (planner/run_hours.py), times the stack's $/h while it
    trains (with the nodes that wait meanwhile), at spot and at on-demand prices; or why there is no estimate."""
    speed = training_speed.load()
    out: dict[str, Any] = {}
    for run in run_estimate.stack_runs(cfg, cat):
        pool = next((p for p in pools if p.name == run.pool), None)
        head = {"pool": run.pool, "gpus": run.gpus, "gpu": run.gpu_type, "precision": run.precision,
                "strategy": run.strategy, "training": run.training}
        e = run.estimate
        if e is None or pool is None or not pool.known:
            out[run.name] = {**head, "missing": run.missing or f"pool {run.pool} is not priced"}
            continue
        waiting = _waiting(cfg, run)
        per_hour = {key: _run_per_hour(run, pools, fee, floor_extra, spot, waiting)
                    for key, spot in (("spot", True), ("onDemand", False))}
        parts = _hours_parts(cfg, run)
        saved, data = parts.get("saves", {}).get("hours", 0.0), parts.get("dataStep", {}).get("hours", {})
        hours = {"fast": e.hours_fast + saved + data.get("fast", 0.0),
                 "slow": e.hours_slow + saved + data.get("slow", 0.0)}
        low, high = e.tokens_per_second_per_gpu
        out[run.name] = {
            **head, "tokens": e.tokens, "tokensFrom": run.tokens_from, "parameters": e.parameters,
            "peakTflops": e.peak_tflops,
            "modelFlopsPerToken": e.model_flops_per_token, "executedFlopsPerToken": e.executed_flops_per_token,
            "evidence": list(e.evidence), "notes": list(e.notes),
            "mfu": {"low": round(e.mfu_low, 4), "high": round(e.mfu_high, 4)},
            "tokensPerSecondPerGpu": {"low": round(low, 1), "high": round(high, 1)},
            "trainingHours": {"fast": round(e.hours_fast, 3), "slow": round(e.hours_slow, 3)},
            **parts,
            "hours": {k: round(v, 3) for k, v in hours.items()},
            "waitingNodes": waiting,
            "perHour": per_hour, "pays": "spot" if pool.spot else "onDemand",
            "perRun": {key: {k: round(h * rate, 2) for k, h in hours.items()} for key, rate in per_hour.items()},
            "source": f"data/training_speed.yaml ({speed.date}) and data/gpu_catalog.yaml peakTflops",
        }
        if ends := reservation_run(cfg, run, pools, fee, floor_extra, (hours["fast"], hours["slow"])):
            out[run.name]["reservation"] = ends
    return out


def reservation_run(cfg: StackConfig, run: run_estimate.WorkloadRun, pools: list[PoolCost], fee: float,
                    floor_extra: float, hours: tuple[float, float] | None = None) -> dict[str, Any] | None:
    """Where the run's pool consumes a reservation that ends (nodePools[].reservationEndTime): the hours of the run
    past the end if it starts now (planner/spill.py), and what they cost on the workload's fallbackPool, where
    Kueue admits it next (workloads/kueue.py). None without an end (a text that is no time is refused, and dropped,
    where the model is built)."""
    pool, w = cfg.pool(run.pool), cfg.workloads.get(run.name)
    if pool is None or w is None or run.estimate is None or pool.reservation_end_time is None:
        return None
    end = pool.reservation_end_time
    fast, slow = hours or (run.estimate.hours_fast, run.estimate.hours_slow)  # the run's in all: saves, data
    s = spill.spill(fast, slow, reservation.now(), end)
    out: dict[str, Any] = {"name": pool.reservation, "endTime": reservation.show(end),
                           "from": reservation.show(s.start), "hoursLeft": round(s.hours_left, 3),
                           "pastEnd": {"fast": round(s.fast, 3), "slow": round(s.slow, 3)}}
    fallback = next((p for p in pools if p.name == w.fallback_pool), None)
    if fallback is not None and fallback.known:
        rate = _run_per_hour(msgspec.structs.replace(run, pool=fallback.name), pools, fee, floor_extra,
                             fallback.spot, _waiting(cfg, run))
        out["fallback"] = {"pool": fallback.name, "capacity": capacity.TITLES.get(fallback.capacity, ""),
                           "queued": capacity.queued(cfg, w),
                           "perHour": rate, "note": fallback.price_note,
                           "cost": dict(zip(("fast", "slow"), (round(c, 2) for c in s.cost(rate)), strict=True))}
    return out
