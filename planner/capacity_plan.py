"""The capacity plan: for each GPU type, the pools that supply it, the zones that offer it and what each costs;
for each job, the pools its workers run on, first choice first, and who chooses: Kueue (the ClusterQueue's
flavor order, which is the queued jobs' own), a GKE ComputeClass (the autoscaler's order), or the scheduler.

The `capacityPlan` stack output; the preview renders it as a summary section (planner/preview_hooks.py).
"""

from __future__ import annotations

from typing import Any

from model import capacity
from model import catalog as gpu_catalog
from model.types import NodePoolConfig, StackConfig, WorkloadConfig


def _pool_row(cfg: StackConfig, p: NodePoolConfig, cat: gpu_catalog.Catalog) -> dict[str, Any]:
    facts = capacity.load()
    source = capacity.source(p)
    basis, note = facts.price_basis[source]
    shape = cat.shape(p.gpu.type, p.machine_type, p.gpu.count)
    per_node = shape.price.for_spot(basis == "spot") if shape else None
    offered = list(cat.zones(p.gpu.type, cfg.region))
    row: dict[str, Any] = {
        "pool": p.name, "capacity": capacity.TITLES[source], "machineType": p.machine_type,
        "gpusPerNode": p.gpu.count, "maxNodes": p.max_nodes,
        "zones": list(p.zones) or offered, "zonesOffering": offered, "priceNote": note,
    }
    if p.reservation:
        row["reservation"] = p.reservation
        if p.reservation_end_text:
            row["reservationEndTime"] = p.reservation_end_text  # at its end Kueue moves jobs on (docs/capacity.md)
    if p.queued_provisioning:
        row["queuedProvisioning"] = True
    if per_node is not None:
        row["perNodeHour"] = round(per_node, 4)
        row["atMaxPerHour"] = round(per_node * p.max_nodes, 4)
    return row


def capacity_plan(cfg: StackConfig, cat: gpu_catalog.Catalog | None = None) -> dict[str, Any]:
    """GPU type -> its pools (reservation, DWS, on-demand, spot; config order within a kind), and the jobs."""
    cat = cat or gpu_catalog.load()
    if cfg.cluster is None or not cfg.node_pools:
        return {}
    by_gpu: dict[str, list[NodePoolConfig]] = {}
    for p in sorted(cfg.node_pools, key=capacity.rank):
        by_gpu.setdefault(p.gpu.type, []).append(p)
    return {
        "queue": cfg.kueue.queue_name if cfg.kueue.install else None,
        # The ClusterQueue's GPU flavors, first tried first (workloads/kueue.py flavor_pools).
        "flavors": [p.name for p in capacity.queue_order(cfg) or []] if cfg.kueue.install else [],
        "gpus": {gpu: [_pool_row(cfg, p, cat) for p in pools] for gpu, pools in by_gpu.items()},
        "jobs": {name: job for name, w in cfg.workloads.items() if (job := _job(cfg, w))},
        "priceSource": f"data/gpu_catalog.yaml ({cat.source}, {cat.date})",
    }


def _job(cfg: StackConfig, w: WorkloadConfig) -> dict[str, Any] | None:
    """The pools a job may run on, first choice first: its `pool`, then its `fallbackPool`. Kueue's flavor
    order and a ComputeClass's priorities keep that order (checks/capacity.py refuses contradicting ones)."""
    pools = [p for p in (cfg.pool(w.pool or ""), cfg.pool(w.fallback_pool or "")) if p is not None]
    if not pools or not w.on_nvidia:
        return None
    job: dict[str, Any] = {"queued": capacity.queued(cfg, w), "pools": [
        {"pool": p.name, "capacity": capacity.TITLES[capacity.source(p)]} for p in pools]}
    chain = capacity.workload_chain(cfg, w)
    if chain is not None:
        job["computeClass"] = chain.name
    return job


def _money(value: float | None) -> str:
    return "unknown" if value is None else f"${value:,.2f}"


def _how(plan: dict[str, Any]) -> str:
    """Who picks a job's pool, as the plan's jobs use it."""
    jobs = list(plan.get("jobs", {}).values())
    ways = []
    if any(j["queued"] for j in jobs):
        wait = capacity.load().kueue_install.wait_for_pods_ready
        ways.append(f"Kueue admits each queued MPIJob from ClusterQueue `{plan['queue']}` to the first of its "
                    f"flavors with free quota ({' → '.join(plan['flavors'])}, the order the queued jobs prefer); "
                    f"a job whose pods are not all ready within {wait['timeout']} is evicted and requeued, to the "
                    "same flavor while it has free quota (Kueue does not fall through on a stockout).")
    if any(j.get("computeClass") for j in jobs):
        ways.append("A GKE ComputeClass makes the autoscaler grow a job's first pool before its fallback pool, and "
                    "moves the workers back to the first pool when it has room.")
    if not ways:
        ways.append("Each job runs on its pool.")
    return " ".join(ways)


def capacity_markdown(plan: dict[str, Any]) -> str:
    """The `capacityPlan` output as Markdown, without a heading (the caller titles it)."""
    if not plan.get("gpus"):
        return "No GPU pools in this stack.\n"
    lines = [_how(plan), ""]
    for gpu, rows in plan["gpus"].items():
        lines += [f"**{gpu}**", "",
                  "| pool | capacity | zones | offered in | $/node-hour | $/h at max nodes | price |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in rows:
            kind = r["capacity"] + (f" `{r['reservation']}`" if r.get("reservation") else "") + \
                (f" until {r['reservationEndTime']}" if r.get("reservationEndTime") else "") + \
                (" (queued provisioning)" if r.get("queuedProvisioning") else "")
            lines.append(f"| {r['pool']} | {kind} | {', '.join(r['zones'])} | {', '.join(r['zonesOffering'])} "
                         f"| {_money(r.get('perNodeHour'))} | {_money(r.get('atMaxPerHour'))} "
                         f"(max {r['maxNodes']}) | {r['priceNote']} |")
        lines.append("")
    if plan.get("jobs"):
        lines += ["| job | where its workers run, first choice first | chosen by |", "| --- | --- | --- |"]
        for name, job in plan["jobs"].items():
            chain = " → ".join(f"{p['pool']} ({p['capacity']})" for p in job["pools"])
            how = f"Kueue, queue `{plan['queue']}`" if job["queued"] else (
                f"GKE autoscaler, ComputeClass `{job['computeClass']}` (back to the first when it has room)"
                if job.get("computeClass") else "scheduler")
            lines.append(f"| {name} | {chain} | {how} |")
        lines.append("")
    lines.append(f"Estimates from {plan['priceSource']}.")
    return "\n".join([*lines, ""])
