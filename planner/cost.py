"""Estimated $/h of a stack: what it costs with its declared workloads running (training and serving apart),
its floor at min nodes, each pool at its min and max nodes, Filestore claims and the Vertex AI job.

Prices come from data/gpu_catalog.yaml (GPU shapes, `generalMachines` for the system pool, the GKE cluster fee,
`filestore`, `vertexTraining`); they are list-price estimates for one region (`pricedRegions`: another region is
priced as it, and the output says so), so the numbers are for comparing setups, not for a bill. The `costs` stack
output is `stack_costs()`; the preview's headline and its "Estimated cost" section render that output
(planner/cost_markdown.py `headline()`, `costs_markdown()`), so the two never disagree.

Its parts, each a module of its own: the pools and what the workloads occupy (planner/pool_cost.py), Filestore and
Vertex AI (planner/extra_costs.py), a finetune run in all (planner/run_cost.py).
"""

from __future__ import annotations

from typing import Any

from model import capacity
from model import catalog as gpu_catalog
from model.types import StackConfig
from planner.extra_costs import filestore_costs, vertex_cost
from planner.pool_cost import SERVING, TRAINING, PoolCost, pool_costs, role, workload_nodes
from planner.run_cost import run_costs

SPOT_NOTE = "spot prices move daily and the VMs can be reclaimed"
SOFT_PRICES = (capacity.SPOT, capacity.DWS)  # capacity whose $/h is an estimate, not a list price


def _running(cfg: StackConfig, pools: list[PoolCost], fee: float, floor_extra: float,
             roles: tuple[str, ...]) -> dict[str, Any]:
    """The stack's $/h while the workloads of `roles` run: each pool at the nodes they occupy (at least its min
    nodes, at most its max), the others at min nodes, plus the cluster fee and what bills anyway (Filestore)."""
    wanted: dict[str, int] = {}
    names = []
    for name, w in cfg.workloads.items():
        if role(w) in roles:
            wanted[w.pool or ""] = wanted.get(w.pool or "", 0) + workload_nodes(w)
            names.append(name)
    nodes = {p.name: min(p.max_nodes, max(p.min_nodes, wanted.get(p.name, 0))) for p in pools}
    per_hour = fee + floor_extra + sum(p.pays(nodes[p.name]) for p in pools)
    return {"perHour": round(per_hour, 4), "workloads": names,
            "nodes": {name: n for name, n in nodes.items() if n}, "estimatedAt": _soft(pools, nodes)}


def _soft(pools: list[PoolCost], nodes: dict[str, int]) -> list[str]:
    """The capacity kinds among the pools with nodes whose price is an estimate, not a list price: spot (moves
    daily) and DWS (a discount the catalog does not have)."""
    kinds = {p.capacity for p in pools if nodes.get(p.name) and p.capacity in SOFT_PRICES}
    return [capacity.TITLES[k] for k in sorted(kinds)]


def running_costs(cfg: StackConfig, pools: list[PoolCost], fee: float, floor_extra: float) -> dict[str, Any]:
    """training / serving (each alone) and, when the stack declares both, all of them at once."""
    present = [r for r in (TRAINING, SERVING) if any(role(w) == r for w in cfg.workloads.values())]
    out = {r: _running(cfg, pools, fee, floor_extra, (r,)) for r in present}
    if len(present) > 1:
        out["all"] = _running(cfg, pools, fee, floor_extra, tuple(present))
    return out


def _estimates(pools: list[PoolCost], vertex: dict[str, Any] | None, cat: gpu_catalog.Catalog) -> list[str]:
    """Which of the numbers are softer than list prices, in words for the summary."""
    notes = []
    if any(p.spot for p in pools) or (vertex and vertex["spot"]):
        notes.append(f"Spot: {SPOT_NOTE}.")
    for p in pools:
        if p.capacity in (capacity.DWS, capacity.RESERVATION):
            notes.append(f"{capacity.TITLES[p.capacity]} pool {p.name}: {p.price_note}.")
    if vertex and not cat.vertex.confirmed:
        notes.append(f"Vertex AI: Compute Engine price x {cat.vertex.markup:g} (Vertex's training markup, "
                     "unconfirmed).")
    return notes


def stack_costs(cfg: StackConfig, cat: gpu_catalog.Catalog | None = None) -> dict[str, Any]:
    """The `costs` stack output: $/h with the declared workloads running (training, serving), the floor, every
    pool at min and max nodes as it pays (spot or on-demand), the cluster fee, Filestore claims, the Vertex job."""
    cat = cat or gpu_catalog.load()
    pools = pool_costs(cfg, cat)
    fee = cat.gke_cluster_fee_per_hour if cfg.cluster is not None else 0.0
    filestore = filestore_costs(cfg, cat)
    filestore_hour = filestore["perHour"] if filestore else 0.0
    at_min = round(fee + sum(p.pays(p.min_nodes) for p in pools), 4)
    vertex = vertex_cost(cfg, cat)
    out: dict[str, Any] = {
        "currency": cat.currency,
        "estimate": True,
        "priceSource": f"data/gpu_catalog.yaml ({cat.source}, {cat.date})",
        # Whose list prices these are: the stack's region's where the catalog has them, else the stand-in's, said.
        "prices": cat.prices_of(cfg.region) if cfg.region else "list prices of one region",
        "running": running_costs(cfg, pools, fee, filestore_hour),
        "floorPerHour": round(at_min + filestore_hour, 4),
        "pools": {p.name: p.to_output() for p in pools},
        "clusterFeePerHour": fee,
        "stackPerHourAtMin": at_min,
        "stackPerHourAtMax": round(fee + filestore_hour + sum(p.pays(p.max_nodes) for p in pools), 4),
        "unpriced": [p.name for p in pools if not p.known],
        "estimates": _estimates(pools, vertex, cat),
    }
    if cfg.region and cat.priced_as(cfg.region):
        out["pricedAs"] = cat.priced_as(cfg.region)
    if filestore:
        out["filestore"] = filestore
    if vertex:
        out["vertex"] = vertex
    if runs := run_costs(cfg, pools, fee, filestore_hour, cat):
        out["runs"] = runs
    return out
