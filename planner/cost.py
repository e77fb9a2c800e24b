"""Estimated $/h of a stack: each pool at its min and max nodes, on-demand and spot, and the whole stack at max.

Prices come from data/gpu_catalog.yaml (GPU shapes, `generalMachines` for the system pool, the GKE cluster fee);
they are list-price estimates for one region, so the numbers are for comparing setups, not for a bill.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from model import catalog as gpu_catalog
from model.types import StackConfig

SYSTEM_POOL = "system"
HOURS_PER_MONTH = 730  # Google's billing month


@dataclass(frozen=True)
class PoolCost:
    """One pool's $/h per node, on-demand and spot; `spot` says which of the two the pool pays."""

    name: str
    machine_type: str
    accelerator: str  # "1 x nvidia-l4", or "" for the system pool
    spot: bool
    min_nodes: int
    max_nodes: int
    node_on_demand: float | None  # None: the machine type is not in the catalog
    node_spot: float | None

    @property
    def known(self) -> bool:
        return self.node_on_demand is not None and self.node_spot is not None

    def at(self, nodes: int, spot: bool) -> float:
        price = self.node_spot if spot else self.node_on_demand
        return round(nodes * (price or 0.0), 4)

    def pays(self, nodes: int) -> float:
        return self.at(nodes, self.spot)

    def to_output(self) -> dict[str, Any]:
        out: dict[str, Any] = {"machineType": self.machine_type, "spot": self.spot,
                               "minNodes": self.min_nodes, "maxNodes": self.max_nodes}
        if self.accelerator:
            out["accelerator"] = self.accelerator
        if not self.known:
            out["price"] = "unknown: add the machine type to data/gpu_catalog.yaml"
            return out
        for key, spot in (("onDemandPerHour", False), ("spotPerHour", True)):
            out[key] = {"min": self.at(self.min_nodes, spot), "max": self.at(self.max_nodes, spot)}
        out["paysPerHour"] = {"min": self.pays(self.min_nodes), "max": self.pays(self.max_nodes)}
        return out


def pool_costs(cfg: StackConfig, cat: gpu_catalog.Catalog | None = None) -> list[PoolCost]:
    """The system pool, then each GPU pool, as the stack declares them (no cluster: no pools)."""
    cat = cat or gpu_catalog.load()
    if cfg.cluster is None:
        return []
    sp = cfg.cluster.system_pool
    machine = cat.general_machines.get(sp.machine_type)
    out = [PoolCost(SYSTEM_POOL, sp.machine_type, "", False, sp.min_nodes, sp.max_nodes,
                    machine.price.on_demand if machine else None, machine.price.spot if machine else None)]
    for p in cfg.node_pools:
        shape = cat.shape(p.gpu.type, p.machine_type, p.gpu.count)
        out.append(PoolCost(p.name, p.machine_type, f"{p.gpu.count} x {p.gpu.type}", p.spot, p.min_nodes,
                            p.max_nodes, shape.price.on_demand if shape else None,
                            shape.price.spot if shape else None))
    return out


def stack_costs(cfg: StackConfig, cat: gpu_catalog.Catalog | None = None) -> dict[str, Any]:
    """The `costs` stack output: every pool, the cluster fee and the stack's total at min and max nodes, as each
    pool pays (spot or on-demand)."""
    cat = cat or gpu_catalog.load()
    pools = pool_costs(cfg, cat)
    fee = cat.gke_cluster_fee_per_hour if cfg.cluster is not None else 0.0
    return {
        "currency": cat.currency,
        "estimate": True,
        "priceSource": f"data/gpu_catalog.yaml ({cat.source}, {cat.date})",
        "pools": {p.name: p.to_output() for p in pools},
        "clusterFeePerHour": fee,
        "stackPerHourAtMin": round(fee + sum(p.pays(p.min_nodes) for p in pools), 4),
        "stackPerHourAtMax": round(fee + sum(p.pays(p.max_nodes) for p in pools), 4),
        "unpriced": [p.name for p in pools if not p.known],
    }


def _money(value: float) -> str:
    return f"${value:,.2f}"


def costs_markdown(costs: dict[str, Any]) -> str:
    """The `costs` output as Markdown (a table and its caveats), without a heading: the caller titles it."""
    pools = costs.get("pools", {})
    if not pools:
        return "No GKE cluster in this stack: nothing the stack creates is billed per hour.\n"
    lines = ["| pool | machine | accelerators | nodes | on-demand $/h (min → max) | spot $/h (min → max) | pays |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, p in pools.items():
        head = f"| {name} | {p['machineType']} | {p.get('accelerator', '—')} | {p['minNodes']}–{p['maxNodes']} "
        if "paysPerHour" not in p:
            lines.append(head + "| unknown | unknown | — |")
            continue
        od, spot = p["onDemandPerHour"], p["spotPerHour"]
        lines.append(head + f"| {_money(od['min'])} → {_money(od['max'])} | {_money(spot['min'])} → "
                     f"{_money(spot['max'])} | {'spot' if p['spot'] else 'on-demand'} |")
    at_max = costs["stackPerHourAtMax"]
    lines += [
        "",
        f"GKE cluster fee {_money(costs['clusterFeePerHour'])}/h. Whole stack, as each pool pays: "
        f"**{_money(costs['stackPerHourAtMin'])}/h at min nodes, {_money(at_max)}/h at max nodes** "
        f"(≈ {_money(at_max * HOURS_PER_MONTH)} per {HOURS_PER_MONTH}-hour month at max).",
        "",
        f"Estimates in {costs['currency']} from {costs['priceSource']}: list prices of one region; spot prices move "
        "daily; disks, network egress and storage are not included.",
    ]
    if costs.get("unpriced"):
        lines.append(f"Not priced (machine type missing from the catalog): {', '.join(costs['unpriced'])}.")
    return "\n".join([*lines, ""])


def cost_section(cfg: StackConfig, cat: gpu_catalog.Catalog | None = None) -> str:
    """Markdown for the preview summary: the same numbers as the `costs` output."""
    return costs_markdown(stack_costs(cfg, cat))
