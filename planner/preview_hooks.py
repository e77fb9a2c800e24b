"""The planner's sections of the offline preview summary: the stack's estimated cost (the `costs` output) and
the preemption-recovery estimate of every training workload with a `model` block."""

from __future__ import annotations

from checks import load
from model.config import ConfigError
from planner import recovery
from planner.capacity_plan import capacity_markdown
from planner.cost import costs_markdown
from planner.sizing import resolve
from preview import hooks
from preview.engine import RunResult
from preview.engine import load_stack_config as _stack_config
from workloads.recovery import TERMINATION_GRACE_SECONDS


@hooks.section
def estimated_cost(run: RunResult) -> list[hooks.Section]:
    costs = run.outputs.get("costs")
    return [("Estimated cost", costs_markdown(costs))] if isinstance(costs, dict) else []


@hooks.section
def capacity_plan(run: RunResult) -> list[hooks.Section]:
    plan = run.outputs.get("capacityPlan")
    return [("Capacity plan", capacity_markdown(plan))] if isinstance(plan, dict) and plan else []


@hooks.section
def preemption_recovery(run: RunResult) -> list[hooks.Section]:
    """Per workload with a `model` block: checkpoint size, time to save, Spot notice fit, save interval."""
    try:
        cfg = load(*_stack_config(run.stack))
    except (FileNotFoundError, ValueError, ConfigError):
        return []  # a program run without a stack file (tests): nothing to read the workloads from
    pools = {p.name: p for p in cfg.node_pools}
    rows = ["| workload | checkpoint | save (all nodes) | fits Spot notice | save every | grace period |",
            "| --- | --- | --- | --- | --- | --- |"]
    for name, w in sorted(cfg.workloads.items()):
        if w.model is None or w.model.mode != "training":
            continue
        try:
            parameters = resolve(w.model.name, w.model.parameters).parameters
        except ValueError:
            continue
        pool = pools.get(w.pool or "")
        spot = bool(pool and pool.spot)
        storage = "gcsfuse" if w.gcs_fuse.enabled else "nfs"
        p = recovery.plan(parameters, w.deepspeed.precision, w.workers, storage, spot)
        fits = ("yes" if p.fits_spot_notice else "no: periodic checkpoints only") if spot else "n/a (on-demand)"
        rows.append(f"| {name} | {p.checkpoint_gb:.1f} GB | {p.save_seconds:.0f} s ({storage}) | {fits} | "
                    f"{p.interval_minutes:.0f} min | {TERMINATION_GRACE_SECONDS} s |")
    if len(rows) == 2:
        return []
    note = (f"The interval is Young's sqrt(2 x save time x mean time between interruptions), assumed "
            f"{recovery.MEAN_HOURS_BETWEEN_INTERRUPTIONS[True]:g} h on Spot and "
            f"{recovery.MEAN_HOURS_BETWEEN_INTERRUPTIONS[False]:g} h on-demand; pass it to the script as "
            "`--checkpoint-every` steps (or CHECKPOINT_EVERY_STEPS). A Spot VM stops about "
            f"{recovery.SPOT_NOTICE_SECONDS} s after its notice whatever the grace period; a drain honours it.")
    return [("Preemption recovery", "\n".join(rows) + "\n\n" + note)]
