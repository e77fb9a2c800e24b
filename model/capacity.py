"""Capacity facts (`data/capacity.yaml`) and how each GPU pool obtains its nodes.

A pool gets capacity one way: a specific reservation, the Dynamic Workload Scheduler (flex-start, with or
without queued provisioning), on-demand, or spot. Components, checks, Kueue and the capacity plan all ask
`source(pool)`, so the four agree on what a pool is.
"""

from __future__ import annotations

import functools
import itertools
import re
from pathlib import Path
from typing import Any

import msgspec

from model.types import NodePoolConfig, StackConfig, WorkloadConfig
from model.yamlio import load_yaml

CAPACITY_PATH = Path(__file__).resolve().parent.parent / "data" / "capacity.yaml"

RESERVATION, DWS, ON_DEMAND, SPOT = "reservation", "dws", "on-demand", "spot"
# Human names for the summary's capacity plan.
TITLES = {RESERVATION: "reservation", DWS: "DWS", ON_DEMAND: "on-demand", SPOT: "spot"}

_GKE_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?(?:-gke\.(\d+))?$")


class KueueInstall(msgspec.Struct, frozen=True):
    """How the stack installs Kueue: its Helm chart and the manager's Configuration (data/capacity.yaml kueue)."""
    chart_repository: str
    chart_version: str
    release_name: str
    namespace: str
    image: str
    config_api_version: str
    manager_defaults: dict[str, Any]
    integrations: tuple[str, ...]
    managed_namespace_label: tuple[str, str]
    replicas: int
    min_available: int
    wait_for_pods_ready: dict[str, Any]
    falls_through_on_stockout: bool


def _kueue_install(kq: dict[str, Any]) -> KueueInstall:
    chart, label = kq["chart"], kq["managedNamespaceLabel"]
    return KueueInstall(
        chart_repository=str(chart["repository"]), chart_version=str(chart["version"]),
        release_name=str(chart["releaseName"]), namespace=str(chart["namespace"]), image=str(chart["image"]),
        config_api_version=str(kq["configApiVersion"]), manager_defaults=dict(kq["managerDefaults"]),
        integrations=tuple(kq["integrations"]), managed_namespace_label=(str(label["key"]), str(label["value"])),
        replicas=int(kq["replicas"]), min_available=int(kq["minAvailable"]),
        wait_for_pods_ready=dict(kq["waitForPodsReady"]),
        falls_through_on_stockout=bool(kq["fallsThroughOnStockout"]))


class ReservationEndFacts(msgspec.Struct, frozen=True):
    """What the stack does at a reservation's end (data/capacity.yaml kueue.reservationEnd)."""
    flavor_fungibility: dict[str, str]
    namespace: str
    time_zone: str


def _reservation_end(raw: dict[str, Any]) -> ReservationEndFacts:
    return ReservationEndFacts(flavor_fungibility=dict(raw["flavorFungibility"]), namespace=str(raw["namespace"]),
                               time_zone=str(raw["timeZone"]))


class MaintenanceFacts(msgspec.Struct, frozen=True):
    """GKE's label for a GPU node's scheduled host maintenance (data/capacity.yaml maintenance)."""
    label: str
    min_gke: str
    source: str


class ComputeClassFacts(msgspec.Struct, frozen=True):
    """GKE's custom ComputeClass as the stack uses it for `pool` then `fallbackPool` (data/capacity.yaml)."""
    api_version: str
    kind: str
    min_gke: str
    label_key: str
    taint_effect: str
    reserved_prefixes: tuple[str, ...]
    when_unsatisfiable: str
    name_prefix: str


def _compute_class(raw: dict[str, Any]) -> ComputeClassFacts:
    return ComputeClassFacts(
        api_version=str(raw["apiVersion"]), kind=str(raw["kind"]), min_gke=str(raw["minGkeVersion"]),
        label_key=str(raw["labelKey"]), taint_effect=str(raw["taintEffect"]),
        reserved_prefixes=tuple(raw["reservedPrefixes"]), when_unsatisfiable=str(raw["whenUnsatisfiable"]),
        name_prefix=str(raw["namePrefix"]))


class Facts(msgspec.Struct, frozen=True):
    flex_start_min_gke: str
    flex_start_max_run_seconds: int
    flex_start_label: str
    queued_taint: str
    provisioning_class: str
    max_pod_sets: int
    reservation_consume_type: str
    reservation_key: str
    kueue_version: str
    kueue_api_version: str
    queue_label: str
    provisioning_controller: str
    kueue_min_mpi_operator: str
    kueue_install: KueueInstall
    reservation_end: ReservationEndFacts
    compute_class: ComputeClassFacts
    maintenance: MaintenanceFacts
    order: tuple[str, ...]
    price_basis: dict[str, tuple[str, str]]  # source -> (onDemand | spot, what the price means)
    source: str
    date: str


def parse(raw: dict[str, Any]) -> Facts:
    flex, queued, res, kq = raw["flexStart"], raw["queuedProvisioning"], raw["reservation"], raw["kueue"]
    return Facts(
        flex_start_min_gke=str(flex["minGkeVersion"]),
        flex_start_max_run_seconds=int(flex["maxRunDurationSeconds"]),
        flex_start_label=str(flex["nodeLabel"]),
        queued_taint=str(queued["taintKey"]),
        provisioning_class=str(queued["provisioningClass"]),
        max_pod_sets=int(queued["maxPodSets"]),
        reservation_consume_type=str(res["consumeType"]),
        reservation_key=str(res["key"]),
        kueue_version=str(kq["version"]),
        kueue_api_version=str(kq["apiVersion"]),
        queue_label=str(kq["queueLabel"]),
        provisioning_controller=str(kq["provisioningController"]),
        kueue_min_mpi_operator=str(kq["minMpiOperator"]),
        kueue_install=_kueue_install(kq),
        reservation_end=_reservation_end(kq["reservationEnd"]),
        compute_class=_compute_class(raw["computeClass"]),
        maintenance=MaintenanceFacts(label=str(raw["maintenance"]["label"]),
                                     min_gke=str(raw["maintenance"]["minGkeVersion"]),
                                     source=str(raw["maintenance"]["source"])),
        order=tuple(raw["order"]),
        price_basis={k: (str(v["price"]), str(v["note"])) for k, v in raw["priceBasis"].items()},
        source=str(raw["source"]),
        date=str(raw["date"]),
    )


@functools.cache
def load(path: Path = CAPACITY_PATH) -> Facts:
    return parse(load_yaml(path))


def source(pool: NodePoolConfig) -> str:
    """Where the pool's nodes come from: reservation, dws, on-demand or spot."""
    if pool.reservation:
        return RESERVATION
    if pool.flex_start or pool.queued_provisioning:
        return DWS
    return SPOT if pool.spot else ON_DEMAND


def rank(pool: NodePoolConfig) -> int:
    """The pool's place in the order the stack obtains capacity (data/capacity.yaml `order`)."""
    return load().order.index(source(pool))


def queued(cfg: StackConfig, w: WorkloadConfig) -> bool:
    """Kueue queues the workload: an `mpijob` on a stack GPU pool when Kueue is installed (workloads/kueue.py)."""
    return bool(cfg.kueue.install and cfg.cluster is not None and w.runs_as_mpijob and cfg.pool(w.pool or ""))


def is_dws(pool: NodePoolConfig) -> bool:
    """Flex-start or queued provisioning, whatever else the pool (wrongly) asks for."""
    return pool.flex_start or pool.queued_provisioning


def gke_version(text: str) -> tuple[int, int, int, int] | None:
    """`1.32.2-gke.1652000` -> (1, 32, 2, 1652000). A prefix (`1.32`, `1.32.2`) counts as its earliest build:
    as a minimum it does not promise anything newer."""
    m = _GKE_VERSION.match(text.strip())
    if m is None:
        return None
    major, minor, patch, build = m.groups()
    return int(major), int(minor), int(patch or 0), int(build or 0)


def seconds(duration: str) -> int:
    """GKE's duration form `3600s` -> 3600."""
    return int(duration.rstrip("s"))


# --- A workload's pool then fallbackPool: one GKE ComputeClass (workloads/compute_class.py) ----------

class Chain(msgspec.Struct, frozen=True):
    """One ComputeClass: the pools GKE tries, first choice first."""
    name: str
    pools: tuple[NodePoolConfig, ...]


def class_name(preferred: str) -> str:
    """Named after the pool it prefers (a pool joins one class); the prefix keeps it off GKE's reserved `gke`."""
    return f"{load().compute_class.name_prefix}{preferred}"


def workload_chain(cfg: StackConfig, w: WorkloadConfig) -> Chain | None:
    """The class an unqueued NVIDIA workload with another pool as `fallbackPool` runs in, else None."""
    pool, fallback = cfg.pool(w.pool or ""), cfg.pool(w.fallback_pool or "")
    if cfg.cluster is None or not w.on_nvidia or pool is None or fallback is None or \
            queued(cfg, w) or not _fallback_fits(pool, fallback):
        return None  # none, queued, or a fallback that checks/capacity.py refuses anyway
    return Chain(class_name(pool.name), (pool, fallback))


def _fallback_fits(pool: NodePoolConfig, fallback: NodePoolConfig) -> bool:
    same_shape = (pool.machine_type, pool.gpu.type, pool.gpu.count) == \
        (fallback.machine_type, fallback.gpu.type, fallback.gpu.count)
    return fallback.name != pool.name and same_shape and not fallback.queued_provisioning


def chains(cfg: StackConfig) -> dict[str, Chain]:
    """Every class the stack creates, by name (workloads that share a chain share its class)."""
    out: dict[str, Chain] = {}
    for w in cfg.workloads.values():
        chain = workload_chain(cfg, w)
        if chain is not None:
            out.setdefault(chain.name, chain)
    return out


def pool_classes(cfg: StackConfig) -> dict[str, str]:
    """Pool name -> the class it joins (its node label and taint). The first chain that names a pool wins; a
    pool named by two chains is a config error (checks/capacity.py)."""
    out: dict[str, str] = {}
    for chain in chains(cfg).values():
        for pool in chain.pools:
            out.setdefault(pool.name, chain.name)
    return out


# --- The ClusterQueue's flavor order: what the queued jobs prefer (workloads/kueue.py) ----------------

def queued_chains(cfg: StackConfig) -> dict[str, tuple[NodePoolConfig, ...]]:
    """Workload name -> the pools a Kueue-queued job may run on, first choice first (`pool`, then a
    `fallbackPool` of the same shape)."""
    out: dict[str, tuple[NodePoolConfig, ...]] = {}
    for name, w in cfg.workloads.items():
        pool = cfg.pool(w.pool or "")
        if pool is None or not queued(cfg, w):
            continue
        fallback = cfg.pool(w.fallback_pool or "")
        same_shape = fallback is not None and (fallback.machine_type, fallback.gpu.type, fallback.gpu.count) == \
            (pool.machine_type, pool.gpu.type, pool.gpu.count)
        out[name] = (pool, fallback) if fallback is not None and fallback.name != pool.name and same_shape \
            else (pool,)
    return out


def queue_order(cfg: StackConfig) -> list[NodePoolConfig] | None:
    """The pools queued jobs use, in one order that keeps every job's preference (its pool before its
    fallbackPool); where no job orders two pools, capacity order (`order` in data/capacity.yaml), then config
    order. None when the preferences contradict each other (one ClusterQueue has one flavor order)."""
    chains_ = queued_chains(cfg)
    pools = {p.name: p for chain in chains_.values() for p in chain}
    index = {p.name: i for i, p in enumerate(cfg.node_pools)}
    after: dict[str, set[str]] = {name: set() for name in pools}  # pool -> pools that must come before it
    for chain in chains_.values():
        for first, then in itertools.pairwise(chain):
            after[then.name].add(first.name)
    placed: list[NodePoolConfig] = []
    while len(placed) < len(pools):
        ready = [name for name in pools if pools[name] not in placed and after[name] <= {p.name for p in placed}]
        if not ready:
            return None
        placed.append(pools[min(ready, key=lambda n: (rank(pools[n]), index[n]))])
    return placed
