"""The "Preemption recovery" section, from the `recovery` stack output (planner/recovery.py computes it): per
training workload with a `model` block, the checkpoint, the time to save it, whether the save fits the pods'
grace period and the Spot notice (flagged when not), and how often to save; then per event (a drain or whole-job
stop, a Spot preemption, a node failure) the most work it can lose."""

from __future__ import annotations

from typing import Any

from model import capacity
from planner import recovery
from preview.engine import RunResult
from preview.sections import Section
from workloads import maintenance

NO = "**no**"


def _grace(r: dict[str, Any]) -> str:
    seconds = f"{r['graceSeconds']} s"
    return seconds if r["fitsGracePeriod"] else f"{seconds}: {NO}, a drain kills the save; periodic checkpoints only"


def _spot(r: dict[str, Any]) -> str:
    if not r["spot"]:
        return "n/a (on-demand)"
    return "yes" if r["fitsSpotNotice"] else f"{NO}: periodic checkpoints only"


def _save(r: dict[str, Any]) -> str:
    if r.get("localSaveSeconds") is None:
        return f"{r['saveSeconds']:.0f} s ({r['storage']})"
    return (f"{r['localSaveSeconds']:.0f} s to {r['localSsds']} local SSDs, then {r['saveSeconds']:.0f} s copy "
            f"({r['storage']})")


def _lost(minutes: float) -> str:
    return "none" if minutes == 0 else f"up to {minutes:.0f} min"


def _risk_rows(plans: dict[str, dict[str, Any]]) -> list[str]:
    rows = ["| workload | drain, eviction, whole-job stop (grace period) | Spot preemption (15 s) | node failure |",
            "| --- | --- | --- | --- |"]
    for name, r in sorted(plans.items()):
        lost = r.get("lostMinutes") or {}
        spot = _lost(lost.get("spot", 0.0)) if r["spot"] else "n/a (on-demand)"
        rows.append(f"| {name} | {_lost(lost.get('drain', 0.0))} | {spot} | {_lost(lost.get('nodeFailure', 0.0))} |")
    return rows


def _flags(name: str, r: dict[str, Any]) -> list[str]:
    out = []
    if not r["fitsGracePeriod"]:
        out.append(f"`{name}` saves in {r['saveSeconds']:.0f} s, longer than the pods' grace period "
                   f"({r['graceSeconds']} s)")
    if r["spot"] and not r["fitsSpotNotice"]:
        out.append(f"`{name}` saves in {r['saveSeconds']:.0f} s, longer than the {recovery.SPOT_USABLE_SECONDS} s "
                   "of a Spot notice its pods can use")
    return out


def section(run: RunResult) -> list[Section]:
    plans = run.outputs.get("recovery")
    if not isinstance(plans, dict) or not plans:
        return []
    rows = ["| workload | checkpoint | save (all nodes) | grace period | fits Spot notice | save every (minutes) |",
            "| --- | --- | --- | --- | --- | --- |"]
    flags: list[str] = []
    for name, r in sorted(plans.items()):
        rows.append(f"| {name} | {r['checkpointGb']:.1f} GB | {_save(r)} | "
                    f"{_grace(r)} | {_spot(r)} | {r['saveEveryMinutes']:.0f} min |")
        flags += _flags(name, r)
    flagged = "".join(f"- {NO}: {f}.\n" for f in flags)
    facts, maintenance_margin = capacity.load().maintenance, maintenance.LEAD_MARGIN_SECONDS
    note = (f"The interval is Young's sqrt(2 x save time x mean time between interruptions), assumed "
            f"{recovery.MEAN_HOURS_BETWEEN_INTERRUPTIONS[True]:g} h on Spot and "
            f"{recovery.MEAN_HOURS_BETWEEN_INTERRUPTIONS[False]:g} h on-demand. It is in minutes, and no flag takes "
            "minutes: the scripts' `--checkpoint-every` (CHECKPOINT_EVERY_STEPS; the fine-tune script's "
            "`--save-steps`) takes steps, and a step's time is not known before a run. Steps = minutes x 60 / "
            "seconds per step; the smoke test's SMOKE_TEST_RESULT line gives it as micro_batch_per_gpu x "
            f"world_size / total_samples_per_second. A Spot VM stops {recovery.SPOT_NOTICE_SECONDS} s after its "
            f"notice and its pods get the first {recovery.SPOT_USABLE_SECONDS} s of it, whatever their grace period; "
            f"a drain and a whole-job stop honour the grace period, which every pod of the job gets from its save: "
            f"{recovery.STEP_ALLOWANCE_SECONDS} s for the step in flight plus the save and a quarter more, at least "
            f"{recovery.MIN_GRACE_SECONDS} s. Either way the workers' preStop hook passes the notice to the ranks "
            "(on a whole-job stop the launcher sends the same request). "
            f"Host maintenance of a GPU node (no live migration): GKE {facts.min_gke} and later labels the node "
            f"`{facts.label}` with its start; the MPIJob launcher's maintenance watch evicts the worker on it once the "
            f"start is within the grace period plus {maintenance_margin // 60} minutes, a drain with a save, and "
            "the workers prefer nodes without that label (docs/recovery.md).")
    risk = ("Work at risk per event (from the save and copy times above): a drain, an eviction or a whole-job stop "
            "(kubectl delete, Kueue's preemption) gives the grace period, which covers the SIGTERM save (and with "
            "local checkpoints its copy); otherwise up to an interval is lost, plus the save or copy still under way "
            "(the newest complete checkpoint is that much older).\n\n" + "\n".join(_risk_rows(plans)))
    tiered = (" With local checkpoints (`localCheckpoints`) training waits only for the local save, at an assumed "
              f"{recovery.LOCAL_SSD_WRITE_GBPS:g} GB/s per local SSD; the interval uses that wait, and the copy to the "
              "bucket runs beside the training (docs/recovery.md).") if any(
        r.get("localSaveSeconds") is not None for r in plans.values()) else ""
    body = "\n".join(rows) + "\n\n" + flagged + ("\n" if flags else "") + note + tiered + "\n\n" + risk
    return [("Preemption recovery", body)]
