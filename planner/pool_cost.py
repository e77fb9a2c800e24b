"""A stack's node pools priced ($/h per node, on-demand and spot, and which of the two each pays), and the nodes of
its pool a declared workload keeps busy while it runs: what planner/cost.py and planner/run_cost.py add up.

Prices come from data/gpu_catalog.yaml (planner/cost.py's docstring says what they are worth).
"""

from __future__ import annotations

from typing import Any

import msgspec

from model import capacity
from model import catalog as gpu_catalog
from model.types import ServeWorkloadConfig, StackConfig, WorkloadConfig

SYSTEM_POOL = "system"
TRAINING, SERVING = "training", "serving"


class PoolCost(msgspec.Struct, frozen=True):
    """One pool's $/h per node, on-demand and spot; `spot` says which of the two the pool pays."""

    name: str
    machine_type: str
    accelerator: str  # "1 x nvidia-l4", or "" for the system pool
    spot: bool
    min_nodes: int
    max_nodes: int
    node_on_demand: float | None  # None: the machine type is not in the catalog
    node_spot: float | None
    capacity: str = capacity.ON_DEMAND  # reservation | dws | on-demand | spot (model/capacity.py)
    price_note: str = ""  # what the price it pays means (data/capacity.yaml priceBasis)

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
                               "minNodes": self.min_nodes, "maxNodes": self.max_nodes,
                               "capacity": capacity.TITLES.get(self.capacity, self.capacity)}
        if self.accelerator:
            out["accelerator"] = self.accelerator
        if not self.known:
            out["price"] = "unknown: add the machine type to data/gpu_catalog.yaml"
            return out
        for key, spot in (("onDemandPerHour", False), ("spotPerHour", True)):
            out[key] = {"min": self.at(self.min_nodes, spot), "max": self.at(self.max_nodes, spot)}
        out["paysPerHour"] = {"min": self.pays(self.min_nodes), "max": self.pays(self.max_nodes)}
        if self.price_note:
            out["priceNote"] = self.price_note
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
    basis = capacity.load().price_basis
    for p in cfg.node_pools:
        shape = cat.shape(p.gpu.type, p.machine_type, p.gpu.count)
        source = capacity.source(p)
        out.append(PoolCost(p.name, p.machine_type, f"{p.gpu.count} x {p.gpu.type}", p.spot, p.min_nodes,
                            p.max_nodes, shape.price.on_demand if shape else None,
                            shape.price.spot if shape else None, source, basis.get(source, ("", ""))[1]))
    return out


def role(w: WorkloadConfig) -> str | None:
    """training or serving for an NVIDIA workload on one of the stack's pools; None otherwise (Gaudi on an
    existing cluster: nothing the stack bills)."""
    if not w.on_nvidia or not w.pool:
        return None
    return SERVING if isinstance(w, ServeWorkloadConfig) else TRAINING


def workload_nodes(w: WorkloadConfig) -> int:
    """Nodes of its pool the workload keeps busy while it runs: `nodesPerReplica` per serving replica (autoscaling
    starts at `replicas`), else one per worker (each fitted to a whole node) plus the Helm client's."""
    if isinstance(w, ServeWorkloadConfig):
        return w.serving.replicas * w.serving.nodes_per_replica + w.evaluator_nodes  # a fleet's evaluator pod too
    return w.nodes_needed()[0]
