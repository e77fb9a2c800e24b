"""Estimated $/h of a stack: what it costs with its declared workloads running (training and serving apart),
its floor at min nodes, each pool at its min and max nodes, Filestore claims and the Vertex AI job.

Prices come from data/gpu_catalog.yaml (GPU shapes, `generalMachines` for the system pool, the GKE cluster fee,
`filestore`, `vertexTraining`); they are list-price estimates for one region (`pricedRegions`: another region is
priced as it, and the output says so), so the numbers are for comparing setups, not for a bill. The `costs` stack
output is `stack_costs()`; the preview's headline and its "Estimated cost" section render that output
(`headline()`, `costs_markdown()`), so the two never disagree.
"""

from __future__ import annotations

import math
import re
from typing import Any

import msgspec

from model import capacity, gke_drivers, reservation, training_speed
from model import catalog as gpu_catalog
from model.types import FinetuneWorkloadConfig, ServeWorkloadConfig, StackConfig, VertexConfig, WorkloadConfig
from planner import run_estimate, run_hours, spill, vertex_run

SYSTEM_POOL = "system"
HOURS_PER_MONTH = 730  # Google's billing month
TRAINING, SERVING = "training", "serving"
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")  # the schema's `bytes` form
_UNIT = {None: 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
         "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
SPOT_NOTE = "spot prices move daily and the VMs can be reclaimed"
SOFT_PRICES = (capacity.SPOT, capacity.DWS)  # capacity whose $/h is an estimate, not a list price


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


# --- what the declared workloads occupy ------------------------------------------------------------------------

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


# --- a finetune run in all: hours and dollars ------------------------------------------------------------------

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


def _reservation_lines(name: str, r: dict[str, Any]) -> list[str]:
    """When the run goes past its reservation's end and what happens then (README, Training at scale)."""
    res = r.get("reservation")
    if not res:
        return []
    ends = (f"  Reservation `{res['name']}` of pool {r['pool']} ends {res['endTime']}, "
            f"{res['hoursLeft']:,.1f} h after {res['from']} (now)")
    past = res["pastEnd"]
    if past["slow"] <= 0:
        return [f"{ends}: the run ends before it, even at its slow end, if it starts now."]
    hours = f"{run_estimate.format_hours(past['fast'])}–{run_estimate.format_hours(past['slow'])} h"
    fb = res.get("fallback")
    if fb is None:
        return [f"{ends}: **the run goes past it** by {hours} if it starts now, and has no priced fallbackPool."]
    note = f" ({fb['note']})" if fb["note"] else ""
    moves = (f"the reservation's Kueue flavor has no quota left, and Kueue admits `{name}` again on fallbackPool "
             f"{fb['pool']}" if fb["queued"] else f"GKE's ComputeClass grows fallbackPool {fb['pool']} instead")
    return [f"{ends}: **the run goes past it** by {hours} if it starts now. Then its nodes go away, {moves} "
            f"({fb['capacity']}), where it continues from its newest checkpoint without a redeploy: those {hours} "
            f"cost {_range(fb['cost'])} at {_money(fb['perHour'])}/h{note}."]


# --- Filestore and Vertex AI ------------------------------------------------------------------------------------

def gib(quantity: str) -> float | None:
    """A Kubernetes quantity (the schema's `bytes` form: 1Ti, 500G, 1024) in GiB; None for another form."""
    match = _QUANTITY.match(quantity)
    return float(match.group(1)) * _UNIT[match.group(2)] / 2**30 if match else None


def filestore_costs(cfg: StackConfig, cat: gpu_catalog.Catalog) -> dict[str, Any] | None:
    """Each claim on a Filestore class, billed at its size or the tier's minimum on the cluster's GKE version,
    whichever is larger, from creation to deletion (so part of the floor). None when no claim is on Filestore."""
    if cfg.cluster is None:
        return None
    fs, claims = cat.filestore, []
    minor = gke_drivers.cluster_minor(cfg.cluster)  # GKE's CSI driver provisions smaller Basic HDD from 1.33
    for name, w in cfg.workloads.items():
        claim = w.claim  # the kinds whose builder creates a `storage` claim on the stack's cluster
        tier = fs.tier(claim.storage_class) if claim is not None else None
        if claim is None or tier is None:
            continue
        size = gib(claim.size)
        billed = math.ceil(max(size or 0.0, tier.min_gib_on(minor)))
        price = None if tier.per_gib_hour is None else round(billed * tier.per_gib_hour, 4)
        claims.append({"workload": name, "claim": claim.claim_name, "storageClass": claim.storage_class,
                       "tier": tier.name, "requested": claim.size, "billedGiB": billed, "perHour": price})
    if not claims:
        return None
    return {"claims": claims, "perHour": round(sum(c["perHour"] or 0.0 for c in claims), 4),
            "unpriced": [c["workload"] for c in claims if c["perHour"] is None],
            "priceSource": f"data/gpu_catalog.yaml filestore ({fs.source}, {fs.date})"}


def vertex_per_hour(v: VertexConfig, cat: gpu_catalog.Catalog) -> float | None:
    """Vertex's $/h for every replica while the job runs: (machine + GPUs) x markup x replicas; None unpriced."""
    node = cat.machine_hour(v.machine_type, v.spot, v.gpu.type, v.gpu.count)
    return None if node is None else round(node * cat.vertex.markup * (1 + v.workers), 4)


def vertex_cost(cfg: StackConfig, cat: gpu_catalog.Catalog) -> dict[str, Any] | None:
    """The Vertex AI CustomJob while it runs: (machine + GPUs) x replicas (the primary and `workers`) at
    Vertex's training rate, modelled as the Compute Engine price x the catalog's markup."""
    v = cfg.vertex
    if not v.enabled:
        return None
    replicas = 1 + v.workers
    out: dict[str, Any] = {"machineType": v.machine_type, "accelerator": f"{v.gpu.count} x {v.gpu.type}",
                           "replicas": replicas, "spot": v.spot, "markup": cat.vertex.markup,
                           "markupConfirmed": cat.vertex.confirmed,
                           "priceSource": f"data/gpu_catalog.yaml vertexTraining ({cat.vertex.source}, "
                                          f"{cat.vertex.date}) and the machine and GPU prices"}
    node = cat.machine_hour(v.machine_type, v.spot, v.gpu.type, v.gpu.count)
    if node is None:
        out["price"] = "unknown: add the machine type and GPU to data/gpu_catalog.yaml"
    else:
        out["perReplicaPerHour"] = round(node * cat.vertex.markup, 4)
        out["perHour"] = round(node * cat.vertex.markup * replicas, 4)
    if (run := vertex_run.vertex_run(v, out.get("perHour"), cat)) is not None:
        out["run"] = run
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


# --- rendering --------------------------------------------------------------------------------------------------

def _money(value: float) -> str:
    return f"${value:,.2f}"


def headline(costs: dict[str, Any]) -> str:
    """One Markdown line for the top of the summary: $/h with the workloads running, then the floor."""
    running = costs.get("running") or {}
    parts = [f"**{_money(running[r]['perHour'])}/h with {r} running**{_soft_mark(running[r])}"
             for r in (TRAINING, SERVING) if r in running]
    if "all" in running:
        parts.append(f"{_money(running['all']['perHour'])}/h with both{_soft_mark(running['all'])}")
    if costs.get("pools"):
        parts.append(f"floor **{_money(costs['floorPerHour'])}/h** at min nodes")
    vertex = costs.get("vertex")
    if vertex and "perHour" in vertex:
        kinds = [k for k, soft in (("spot price", vertex["spot"]), ("Vertex markup", not vertex["markupConfirmed"]))
                 if soft]
        soft = f" ({' and '.join(kinds)}: estimate)" if kinds else ""
        parts.append(f"Vertex AI job **{_money(vertex['perHour'])}/h** while it runs{soft}")
        if (r := vertex.get("run")) and "missing" not in r:
            parts.append(f"**about {_hours(r)}, {_range(r['perRun'])} per run** on Vertex AI")
    if not parts:
        return "Estimated cost: nothing the stack creates is billed per hour."
    runs = "".join(f" {_run_headline(name, r)}." for name, r in (costs.get("runs") or {}).items())
    stand_in = f", {costs['prices']}" if costs.get("pricedAs") else ""
    return f"Estimated cost: {', '.join(parts)} (list-price estimates{stand_in}; see Estimated cost).{runs}"


def _range(pair: dict[str, float]) -> str:
    return f"{_money(pair['fast'])}–{_money(pair['slow'])}"


def _hours(r: dict[str, Any]) -> str:
    fast, slow = (run_estimate.format_hours(r["hours"][k]) for k in ("fast", "slow"))
    return f"{fast}–{slow} h"


def _mfu(r: dict[str, Any]) -> str:
    low, high = r["mfu"]["low"], r["mfu"]["high"]
    return f"{low:.0%}–{high:.0%}" if low >= 0.01 else f"{low:.1%}–{high:.1%}"


def _run_headline(name: str, r: dict[str, Any]) -> str:
    """`Run tune: **about 1.8–3.9 h, $6.56–$14.37 per run** (spot; on-demand $15.04–$32.94), at the MFU of measured
    runs 23%–27% (data/training_speed.yaml)`: the pool's own prices first."""
    if "missing" in r:
        return f"Run {name}: time and cost unknown ({r['missing']})"
    first, other = (("spot", "onDemand") if r["pays"] == "spot" else ("onDemand", "spot"))
    words = {"spot": "spot", "onDemand": "on-demand"}
    return (f"Run {name}: **about {_hours(r)}, {_range(r['perRun'][first])} per run** ({words[first]}; "
            f"{words[other]} {_range(r['perRun'][other])}), at the MFU of measured runs, {_mfu(r)} "
            "(data/training_speed.yaml)")


def _soft_mark(running: dict[str, Any]) -> str:
    soft = running.get("estimatedAt") or []
    return f" ({' and '.join(soft)} prices: estimate)" if soft else ""


def _pools_table(pools: dict[str, Any]) -> list[str]:
    lines = ["| pool | machine | accelerators | nodes | capacity | on-demand $/h (min → max) | spot $/h (min → max) "
             "| pays |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, p in pools.items():
        head = (f"| {name} | {p['machineType']} | {p.get('accelerator', '—')} | {p['minNodes']}–{p['maxNodes']} "
                f"| {p.get('capacity', '')} ")
        if "paysPerHour" not in p:
            lines.append(head + "| unknown | unknown | — |")
            continue
        od, spot = p["onDemandPerHour"], p["spotPerHour"]
        lines.append(head + f"| {_money(od['min'])} → {_money(od['max'])} | {_money(spot['min'])} → "
                     f"{_money(spot['max'])} | {'spot' if p['spot'] else 'on-demand'} |")
    return lines


def _running_lines(costs: dict[str, Any]) -> list[str]:
    lines = []
    for key, label in ((TRAINING, "training"), (SERVING, "serving"), ("all", "all workloads")):
        r = (costs.get("running") or {}).get(key)
        if r:
            nodes = ", ".join(f"{pool} {n}" for pool, n in r["nodes"].items())
            lines.append(f"- With {label} running ({', '.join(r['workloads'])}): **{_money(r['perHour'])}/h**"
                         f"{_soft_mark(r)} (nodes: {nodes}).")
    return lines


def _filestore_lines(fs: dict[str, Any]) -> list[str]:
    lines = []
    for c in fs["claims"]:
        price = f"{_money(c['perHour'])}/h" if c["perHour"] is not None else "unpriced (tier price not in the catalog)"
        lines.append(f"- Filestore claim `{c['claim']}` of {c['workload']} ({c['storageClass']}, {c['tier']}): "
                     f"{c['requested']} requested, {c['billedGiB']} GiB billed: {price}, for as long as it exists.")
    return [*lines, f"  Prices from {fs['priceSource']}."]


def _vertex_run_line(v: dict[str, Any]) -> list[str]:
    r = v.get("run")
    if not r:
        return []
    if "missing" in r:
        return [f"- Vertex AI run: no estimate of its time and cost: {r['missing']}."]
    tps, notes = r["tokensPerSecondPerGpu"], "".join(f"; {n}" for n in r["notes"])
    return [f"- Vertex AI run: {r['tokens']:,.0f} tokens ({r['tokensFrom']}) on {r['gpus']} x {r['gpu']} "
            f"({r['precision']}, {r['peakTflops']:g} TFLOPS peak): **about {_hours(r)}, {_range(r['perRun'])} per "
            f"run** at {_money(r['perHour'])}/h (training {run_estimate.format_hours(r['trainingHours']['fast'])}–"
            f"{run_estimate.format_hours(r['trainingHours']['slow'])} h + {r['saves']['count']:,} saves "
            f"{run_estimate.format_hours(r['saves']['hours'])} h); MFU {_mfu(r)} ({tps['low']:,.0f}–{tps['high']:,.0f} "
            f"tokens/s per GPU), the measured runs' {', '.join(r['evidence'])}{notes}."]


def _vertex_lines(v: dict[str, Any]) -> list[str]:
    if "perHour" not in v:
        return [f"- Vertex AI job: {v['replicas']} x {v['machineType']} + {v['accelerator']}: {v['price']}.",
                *_vertex_run_line(v)]
    sure = "" if v["markupConfirmed"] else ", unconfirmed"
    return [f"- Vertex AI job while it runs: {v['replicas']} replica(s) x ({v['machineType']} + {v['accelerator']}"
            f"{', spot' if v['spot'] else ''}) x {v['markup']:g} Vertex markup{sure} = **{_money(v['perHour'])}/h**.",
            f"  Prices from {v['priceSource']}.", *_vertex_run_line(v)]


def _parts(r: dict[str, Any]) -> str:
    """`training 1.1–1.3 h + 12 saves 0.40 h + data step 0.02–0.05 h`."""
    train = r["trainingHours"]
    parts = [f"training {run_estimate.format_hours(train['fast'])}–{run_estimate.format_hours(train['slow'])} h"]
    if s := r.get("saves"):
        parts.append(f"{s['count']:,} saves (every {s['saveSteps']:,} of ~{s['steps']:,} steps, "
                     f"{s['secondsEach']:,.0f} s each on {s['storage']}) {run_estimate.format_hours(s['hours'])} h")
    if d := r.get("dataStep"):
        fast, slow = (run_estimate.format_hours(d["hours"][k]) for k in ("fast", "slow"))
        parts.append(f"the data step on {d['on']} {fast if fast == slow else f'{fast}–{slow}'} h")
    return " + ".join(parts)


def _waiting_words(r: dict[str, Any]) -> str:
    waiting = r.get("waitingNodes") or {}
    return "".join(f", with pool {pool}'s {n} node(s) up and waiting (a server)" for pool, n in waiting.items())


def _run_lines(runs: dict[str, Any]) -> list[str]:
    """Each finetune run in all: its tokens, FLOPs and GPUs, its hours (training, saves, data step) and $ at the spot
    and on-demand $/h with every node up meanwhile, the MFU of the measured runs it rests on (named), and the
    saves' warning."""
    lines = []
    for name, r in runs.items():
        what = f"{r['training']}; {r['strategy']} on {r['gpus']} x {r['gpu']}, {r['precision']}"
        if "missing" in r:
            lines.append(f"- Run `{name}` ({what}): no estimate of its time and cost: {r['missing']}. `make gpus "
                         "MODEL=... MODE=finetune DATA=<a local copy of the data>` counts a file's tokens.")
            continue
        tps = r["tokensPerSecondPerGpu"]
        notes = "".join(f"; {n}" for n in r.get("notes", []))
        lines += [
            f"- Run `{name}` ({what}): {r['tokens']:,.0f} tokens ({r['tokensFrom']}) x "
            f"{r['modelFlopsPerToken'] / 1e9:,.1f} GFLOPs per token ({r['modelFlopsPerToken'] / r['parameters']:g}N, "
            f"N = {r['parameters'] / 1e9:.2f}B parameters) on {r['gpus']} GPUs of {r['peakTflops']:g} "
            f"TFLOPS peak ({r['precision']}, dense): **about {_hours(r)}, {_range(r['perRun']['spot'])} per run at "
            f"spot prices** ({_money(r['perHour']['spot'])}/h{_waiting_words(r)}), {_range(r['perRun']['onDemand'])} "
            f"on-demand ({_money(r['perHour']['onDemand'])}/h); the pool pays "
            f"{'spot' if r['pays'] == 'spot' else 'on-demand'}. Hours: {_parts(r)}.",
            f"  MFU {_mfu(r)} ({tps['low']:,.0f}–{tps['high']:,.0f} tokens/s per GPU): the range of the measured runs "
            f"it rests on, {', '.join(r['evidence'])}{notes}. From {r['source']}. Not in it: restarts after "
            "preemption, padding to a batch's longest sample, the model's download, the export at the end.",
            *([f"  **Warning**: {r['saves']['warning']}."] if r.get("saves", {}).get("warning") else []),
            *_reservation_lines(name, r)]
    return lines


def costs_markdown(costs: dict[str, Any]) -> str:
    """The `costs` output as Markdown (the running and floor figures, a table, the caveats), without a heading:
    the caller titles it."""
    pools, vertex = costs.get("pools", {}), costs.get("vertex")
    if not pools and not vertex:
        return "No GKE cluster in this stack: nothing the stack creates is billed per hour.\n"
    lines = _running_lines(costs)
    if costs.get("runs"):
        lines += _run_lines(costs["runs"])
    if pools:
        at_max = costs["stackPerHourAtMax"]
        lines += [f"- Floor, every pool at min nodes{' with Filestore' if costs.get('filestore') else ''}: "
                  f"**{_money(costs['floorPerHour'])}/h**; every pool at max nodes: {_money(at_max)}/h "
                  f"(≈ {_money(at_max * HOURS_PER_MONTH)} per {HOURS_PER_MONTH}-hour month).", ""]
        lines += _pools_table(pools)
        lines += ["", f"GKE cluster fee {_money(costs['clusterFeePerHour'])}/h."]
    if costs.get("filestore"):
        lines += ["", *_filestore_lines(costs["filestore"])]
    if vertex:
        lines += ["", *_vertex_lines(vertex)] if lines else _vertex_lines(vertex)
    lines += ["", f"Estimates in {costs['currency']} from {costs['priceSource']}: {costs['prices']}; disks, "
              "network egress and Cloud Storage are not included."]
    lines += costs.get("estimates", [])
    if costs.get("unpriced"):
        lines.append(f"Not priced (machine type missing from the catalog): {', '.join(costs['unpriced'])}.")
    return "\n".join([*lines, ""])


def cost_section(cfg: StackConfig, cat: gpu_catalog.Catalog | None = None) -> str:
    """Markdown for the preview summary: the same numbers as the `costs` output."""
    return costs_markdown(stack_costs(cfg, cat))
