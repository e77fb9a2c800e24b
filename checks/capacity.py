"""Capacity rules GKE enforces on GPU pools (reservations, flex-start, queued provisioning, spot) and what
Kueue needs to queue jobs for them, refused at preview with GKE's reason instead of at `pulumi up`.

Facts (minimum versions, the 7-day limit, the queued taint) come from data/capacity.yaml with their sources.
"""

from __future__ import annotations

from checks.common import Check, at, or_list
from model import capacity, reservation
from model import catalog as gpu_catalog
from model.pair_rules import PairRule, pair_problems
from model.problems import Problem
from model.types import MpiJobBaseConfig, NodePoolConfig, StackConfig
from planner import pool_cost, run_estimate

# COMPACT placement with flex-start: only these machine families (FACTS.md section 2, CT gke-node-pool).
COMPACT_FLEX_FAMILIES = ("a3-ultragpu-", "a4-", "h4d-")
KUEUE_MAX_FLAVORS = 64  # ClusterQueue resourceGroups[].flavors maxItems (Kueue v0.19.2 CRD)


def _pools(m: StackConfig) -> list[tuple[int, NodePoolConfig]]:
    return list(enumerate(m.node_pools))


def _spot_not_with(key: str) -> PairRule:
    return PairRule("spot", f"spot VMs cannot be combined with {key} (GKE refuses it); use a separate spot pool, or "
                    "set spot: false", excludes=(key,))


# Spot VMs consume no reservation and are not DWS capacity: GKE refuses them together. Flex-start and queued
# provisioning take capacity from DWS, never from a reservation (NO_RESERVATION; model/capacity.py is_dws).
SPOT_ALONE = tuple(_spot_not_with(key) for key in ("reservation", "flexStart", "queuedProvisioning"))
DWS_WITHOUT_RESERVATION = (
    PairRule("reservation", "a flex-start or queued-provisioning pool cannot consume a reservation (GKE requires "
             "reservation affinity NO_RESERVATION); remove reservation or make a separate reservation pool",
             excludes=("flexStart", "queuedProvisioning")),)


def check_spot_alone(m: StackConfig) -> list[Problem]:
    return pair_problems(m, "nodePools", SPOT_ALONE)


def check_dws_without_reservation(m: StackConfig) -> list[Problem]:
    return pair_problems(m, "nodePools", DWS_WITHOUT_RESERVATION)


def check_reservation_zone(m: StackConfig) -> list[Problem]:
    """A specific reservation is zonal: the pool's nodes must be in the reservation's zone, named explicitly."""
    return [Problem(at('nodePools', i, 'zones'), f"a pool that consumes reservation {p.reservation} needs exactly one "
            f"zone, the reservation's (e.g. zones: [{m.region}-a]); got {p.zones or 'none (every zone)'}")
            for i, p in _pools(m) if p.reservation and len(p.zones) != 1]


def check_flex_start_version(m: StackConfig) -> list[Problem]:
    """GKE creates flex-start pools only on control planes at or above the minimum (data/capacity.yaml)."""
    if m.cluster is None:
        return []
    facts = capacity.load()
    flex = [p.name for p in m.node_pools if p.flex_start]
    if not flex:
        return []
    version = m.cluster.min_master_version
    parsed = capacity.gke_version(version) if version else None
    if version is None:
        return [Problem("cluster.minMasterVersion", f"pool(s) {', '.join(flex)} use flex-start, which needs GKE "
                f"{facts.flex_start_min_gke} or later; set cluster.minMasterVersion to it (or newer, e.g. 1.33) so "
                "GKE never runs an older control plane")]
    if parsed is not None and parsed < capacity.gke_version(facts.flex_start_min_gke):
        return [Problem("cluster.minMasterVersion",
                        f"{version} is below {facts.flex_start_min_gke}, the oldest GKE that "
                        f"accepts flex-start (pool(s) {', '.join(flex)}); set it to that or newer, e.g. 1.33")]
    return []


def check_max_run_duration(m: StackConfig) -> list[Problem]:
    """Flex-start nodes run at most 7 days; GKE refuses a longer maxRunDuration on them."""
    limit = capacity.load().flex_start_max_run_seconds
    return [Problem(at('nodePools', i, 'maxRunDuration'), f"{p.max_run_duration} is longer than flex-start's limit of "
            f"{limit}s ({limit // 86400} days); use {limit}s or less")
            for i, p in _pools(m)
            if p.flex_start and p.max_run_duration and capacity.seconds(p.max_run_duration) > limit]


def check_queued_provisioning_scales_from_zero(m: StackConfig) -> list[Problem]:
    """Queued provisioning adds nodes only for a ProvisioningRequest: the pool starts (and idles) at 0."""
    return [Problem(at('nodePools', i, 'minNodes'), f"a queued-provisioning pool must have minNodes 0 (GKE creates its "
            f"nodes only for admitted jobs), got {p.min_nodes}")
            for i, p in _pools(m) if p.queued_provisioning and p.min_nodes != 0]


def check_compact_placement_capacity(m: StackConfig) -> list[Problem]:
    """COMPACT placement: never with queued provisioning on GPUs; with flex-start only on A3 Ultra, A4, H4D."""
    problems = []
    for i, p in _pools(m):
        if not p.compact_placement:
            continue
        if p.queued_provisioning:
            problems.append(Problem(at('nodePools', i, 'compactPlacement'),
                                    "GKE refuses COMPACT placement on a GPU pool "
                            "with queued provisioning; set compactPlacement: false (Kueue admits the job's nodes "
                            "together anyway)"))
        elif p.flex_start and not p.machine_type.startswith(COMPACT_FLEX_FAMILIES):
            problems.append(Problem(at('nodePools', i, 'compactPlacement'),
                                    f"COMPACT placement with flex-start works only "
                            f"on A3 Ultra, A4 and H4D machines, not {p.machine_type}; set compactPlacement: false"))
    return problems


def check_queued_pools_have_kueue(m: StackConfig) -> list[Problem]:
    """A queued-provisioning pool gets nodes only through a ProvisioningRequest, which Kueue makes."""
    queued = [p.name for p in m.node_pools if p.queued_provisioning]
    if queued and not m.kueue.install:
        return [Problem("kueue.install", f"pool(s) {', '.join(queued)} use queued provisioning, which gets nodes only "
                "through Kueue's ProvisioningRequest; set kueue.install: true")]
    return []


def check_queued_pool_workloads(m: StackConfig) -> list[Problem]:
    """Only MPIJobs are queued by Kueue here; a Helm release on a queued pool would wait for nodes forever."""
    problems = []
    for name, w in m.workloads.items():
        pool = m.pool(w.pool or "")
        if pool is not None and pool.queued_provisioning and not w.runs_as_mpijob:
            problems.append(Problem(at('workloads', name, 'kind'), f"{w.kind} workloads are not queued by Kueue, so "
                            f"nothing would request nodes of queued-provisioning pool {pool.name}; use kind: mpijob "
                            "or a pool without queued provisioning"))
    return problems


def check_queued_pool_nccl_tests(m: StackConfig) -> list[Problem]:
    """An NCCL test is a plain Job, which Kueue does not queue here (it queues MPIJobs), so no ProvisioningRequest
    would ever ask for a queued-provisioning pool's nodes: the Job would wait out its deadline, and the training
    gated on it (workloads/first_up.py) would never be created. The rule a workload meets there, for the test."""
    problems = []
    for name, t in m.nccl_tests.items():
        for i, pool_name in enumerate(t.pools):
            pool = m.pool(pool_name)
            if pool is not None and pool.queued_provisioning:
                others = [p.name for p in m.node_pools if not p.queued_provisioning
                          and p.machine_type == pool.machine_type]
                instead = or_list(others) if others else "e.g. a reservation or on-demand pool"
                problems.append(
                    Problem(at('ncclTests', name, 'pools', i), f"{pool.name} has queued provisioning, whose nodes come "
                    "only for a ProvisioningRequest Kueue makes for a queued MPIJob; the NCCL test is a plain Job "
                    "Kueue does not queue, so nothing would ever request its nodes and it would wait out its "
                    "deadline. Test a pool of the same machine type without queued provisioning "
                    f"({instead}): same fabric, same pass line"))
    return problems


def check_fallback_pool(m: StackConfig) -> list[Problem]:
    """The fallback pool must be another pool of the same shape (the workers' resources are fitted to it); a
    queued-provisioning one only for jobs that Kueue queues."""
    problems = []
    for name, w in m.workloads.items():
        if not w.fallback_pool:
            continue
        key = at("workloads", name, "fallbackPool")
        pool, fallback = m.pool(w.pool or ""), m.pool(w.fallback_pool)
        if not w.on_nvidia or pool is None:
            problems.append(Problem(key, "a fallback pool needs an nvidia workload on a `pool`"))
        elif fallback is None:
            problems.append(Problem(key, f"no pool named {w.fallback_pool!r} (pools: "
                            f"{', '.join(p.name for p in m.node_pools) or 'none'})"))
        elif fallback.name == pool.name:
            problems.append(Problem(key, f"{fallback.name} is the workload's `pool` itself; name another pool"))
        elif (fallback.machine_type, fallback.gpu.type, fallback.gpu.count) != \
                (pool.machine_type, pool.gpu.type, pool.gpu.count):
            problems.append(Problem(key, f"{fallback.name} has {fallback.gpu.count} x {fallback.gpu.type} on "
                            f"{fallback.machine_type}, {pool.name} {pool.gpu.count} x {pool.gpu.type} on "
                            f"{pool.machine_type}; the workers are sized for one shape, so both pools need the same"))
        elif fallback.queued_provisioning and not w.runs_as_mpijob:
            problems.append(Problem(key, f"{fallback.name} has queued provisioning, whose nodes only Kueue-admitted "
                            "MPIJobs get; use kind: mpijob or a fallback pool without queued provisioning"))
    return problems


def check_kueue_target(m: StackConfig) -> list[Problem]:
    """Kueue's flavors and quotas come from the stack's GPU pools, and its MPIJob integration needs
    mpi-operator v0.8.0 or newer."""
    if not m.kueue.install:
        return []
    problems = []
    if m.cluster is None:
        problems.append(Problem("kueue.install",
                                "Kueue's queues are built from the stack's GKE pools; it needs `cluster` "
                                "(set kueue.install: false for an existing cluster)"))
    elif not m.node_pools:
        problems.append(Problem("kueue.install",
                                "the ClusterQueue's GPU flavors come from `nodePools`, and there are none; "
                                "add a GPU pool or set kueue.install: false"))
    elif not capacity.queued_chains(m):
        problems.append(Problem("kueue.install",
                                "no workload waits in Kueue (it queues `mpijob` workloads on the stack's GPU "
                                "pools), so its ClusterQueue would have no GPU flavor; add such a workload or set "
                                "kueue.install: false"))
    elif len(m.node_pools) > KUEUE_MAX_FLAVORS:
        problems.append(Problem("kueue.install",
                                f"a ClusterQueue resource group holds at most {KUEUE_MAX_FLAVORS} flavors "
                                f"(one per GPU pool), got {len(m.node_pools)} pools"))
    minimum = capacity.load().kueue_min_mpi_operator
    if any(w.runs_as_mpijob for w in m.workloads.values()) and \
            _version(m.mpi_operator.version) < _version(minimum):
        problems.append(Problem("mpiOperator.version",
                                f"Kueue queues MPIJobs only with mpi-operator {minimum} or newer, "
                                f"got {m.mpi_operator.version}"))
    return problems


def check_queue_order(m: StackConfig) -> list[Problem]:
    """One ClusterQueue tries its flavors in one order for every job: the queued jobs' `pool` before
    `fallbackPool` preferences must not contradict each other."""
    if capacity.queue_order(m) is not None:
        return []
    chains = capacity.queued_chains(m)
    wants = "; ".join(f"{name}: {' before '.join(p.name for p in chain)}" for name, chain in chains.items()
                      if len(chain) > 1)
    last = [name for name, chain in chains.items() if len(chain) > 1][-1]
    return [Problem(at('workloads', last, 'fallbackPool'), f"Kueue tries the ClusterQueue's flavors in one order for "
            f"every queued job, and the jobs' preferences contradict each other ({wants}); give them the same "
            "order")]


def check_compute_class_version(m: StackConfig) -> list[Problem]:
    """A workload's pool then fallbackPool is a GKE custom ComputeClass, which Standard clusters have from
    1.30.3-gke.1451000 on (data/capacity.yaml computeClass)."""
    users = [name for name, w in m.workloads.items() if capacity.workload_chain(m, w) is not None]
    if not users or m.cluster is None:
        return []
    minimum = capacity.load().compute_class.min_gke
    version = m.cluster.min_master_version
    why = (f"workload(s) {', '.join(users)} run on `pool` then `fallbackPool` through a GKE custom ComputeClass "
           f"(the autoscaler ignores preferred node affinity), which GKE has from {minimum}")
    if version is None:
        return [Problem("cluster.minMasterVersion",
                        f"{why}; set cluster.minMasterVersion to {minimum} or newer (e.g. 1.33) "
                        "so GKE never runs an older control plane")]
    parsed = capacity.gke_version(version)
    if parsed is not None and parsed < capacity.gke_version(minimum):
        return [Problem("cluster.minMasterVersion",
                        f"{version} is too old: {why}; set it to {minimum} or newer (e.g. 1.33)")]
    return []


def check_compute_class_pools(m: StackConfig) -> list[Problem]:
    """GKE ties a node pool to one ComputeClass, whose taint keeps every other pod off it: a pool in a
    workload's pool-then-fallback class serves that class only."""
    joins = capacity.pool_classes(m)
    problems = []
    for name, w in m.workloads.items():
        chain = capacity.workload_chain(m, w)
        for key, pool in (("pool", w.pool), ("fallbackPool", w.fallback_pool)):
            joined = joins.get(pool or "")
            if joined is None or (chain is not None and chain.name == joined):
                continue
            how = f"with fallbackPool {w.fallback_pool}" if chain is not None else (
                "queued by Kueue" if capacity.queued(m, w) else "without that fallbackPool")
            problems.append(Problem(at('workloads', name, key), f"pool {pool} belongs to GKE ComputeClass {joined} "
                            f"({_chain_text(m, joined)}), and GKE lets a pool join one class whose taint keeps "
                            f"other pods off it; this workload ({how}) cannot use it: give it the same pool and "
                            "fallbackPool, or another pool"))
    for test, t in m.nccl_tests.items():
        for i, pool in enumerate(t.pools):
            if pool in joins:
                problems.append(Problem(at('ncclTests', test, 'pools', i), f"pool {pool} belongs to GKE ComputeClass "
                                f"{joins[pool]} ({_chain_text(m, joins[pool])}), whose taint keeps the test's pods "
                                "off it; test another pool"))
    return problems


def reservation_end(pool: NodePoolConfig) -> str | None:
    """What is wrong with the pool's `reservationEndTime`, or None: on a reservation pool, in the future (the model
    parsed it, and refused a text that is no time: model/reservation.py typed_end_times)."""
    if pool.reservation_end_time is None:
        return None
    if not pool.reservation:
        return ("only a pool that consumes a reservation (`reservation`) ends with it; set reservation or remove "
                "this key")
    end, now = pool.reservation_end_time, reservation.now()
    if end <= now:
        return (f"{reservation.show(end)} is past (now {reservation.show(now)}): reservation {pool.reservation}'s "
                "nodes are gone; give the reservation's new end, or move its workloads to their fallbackPool")
    return None


def check_reservation_end_time(m: StackConfig) -> list[Problem]:
    """A reservation's end: a time still to come, on a pool that consumes a reservation."""
    return [Problem(at('nodePools', i, 'reservationEndTime'), f"{problem}")
            for i, p in _pools(m) if (problem := reservation_end(p)) is not None]


def check_reservation_fallback(m: StackConfig) -> list[Problem]:
    """A workload on a reservation that ends needs somewhere to go on when the reservation's nodes go away: a
    `fallbackPool` of the same shape (DWS or spot), where Kueue (or the ComputeClass) admits it next."""
    problems = []
    for name, w in m.workloads.items():
        pool = m.pool(w.pool or "")
        if pool is None or pool.reservation_end_time is None or w.fallback_pool:
            continue
        others = [p.name for p in m.node_pools if p.name != pool.name and not p.reservation
                  and (p.machine_type, p.gpu.type, p.gpu.count) == (pool.machine_type, pool.gpu.type, pool.gpu.count)]
        instead = f" (e.g. {or_list(others)})" if others else (
            f" (add one: {pool.machine_type} with flexStart and queuedProvisioning, or spot)")
        problems.append(Problem(at('workloads', name, 'fallbackPool'), f"pool {pool.name}'s reservation ends at "
                        f"{pool.reservation_end_text}; name a pool of the same shape{instead} that the job continues "
                        "on from its newest checkpoint when the reservation's nodes go away"))
    return problems


def idle_reserved(m: StackConfig, i: int, pool: NodePoolConfig) -> Problem | None:
    """A reservation pool whose workloads, all running at once, use fewer nodes than its maxNodes: the rest of the
    reservation is billed at the on-demand rate whether used or not (data/capacity.yaml priceBasis), so say what
    the idle nodes cost per hour and over each run the planner times (planner/run_estimate.py)."""
    users = {name: pool_cost.workload_nodes(w) for name, w in m.workloads.items() if w.pool == pool.name}
    idle = pool.max_nodes - sum(users.values())
    if not pool.reservation or not users or idle <= 0:
        return None
    cat = gpu_catalog.load()
    shape = cat.shape(pool.gpu.type, pool.machine_type, pool.gpu.count)
    node = shape.price.on_demand if shape else None
    used = ", ".join(f"{name}: {n}" for name, n in sorted(users.items()))
    text = (f"pool {pool.name} reserves {pool.max_nodes} nodes of reservation "
            f"{pool.reservation} and its workloads use {sum(users.values())} ({used}): {idle} reserved "
            f"{'node sits' if idle == 1 else 'nodes sit'} idle, billed at the on-demand rate whether used or not")
    if node is not None:
        text += f": ${idle * node:,.2f}/h ({idle} x ${node:,.2f}, data/gpu_catalog.yaml {cat.date})"
        for run in run_estimate.stack_runs(m, cat):
            if run.pool == pool.name and run.estimate is not None:
                fast, slow = (idle * node * h for h in (run.estimate.hours_fast, run.estimate.hours_slow))
                hours = "–".join(run_estimate.format_hours(h) for h in (run.estimate.hours_fast,
                                                                         run.estimate.hours_slow))
                text += f", ${fast:,.0f}–${slow:,.0f} over run {run.name} ({hours} h)"
    return Problem(at('nodePools', i, 'maxNodes'), text + f". Give them work (more workers) or shrink the "
                   f"reservation and maxNodes to {sum(users.values())}")


def maintenance_warnings(m: StackConfig) -> list[Problem]:
    """The launcher's maintenance watch (workloads/maintenance.py) needs GKE's label, from 1.31.1-gke.2008000 on
    GPU nodes, and the stack's image (its python3)."""
    jobs = {name: w for name, w in m.workloads.items()
            if m.cluster is not None and isinstance(w, MpiJobBaseConfig) and w.on_nvidia and m.pool(w.pool or "")}
    facts = capacity.load().maintenance
    out = [Problem(at('workloads', name, 'image'),
                   "the launcher's maintenance watch runs in the stack's image only; with "
                   "an image of your own this run is not saved ahead of its nodes' host maintenance (its workers still "
                   "prefer nodes without pending maintenance)") for name, w in jobs.items() if w.image]
    version = m.cluster.min_master_version if m.cluster else None
    found = capacity.gke_version(version) if version else None
    if found and found < (capacity.gke_version(facts.min_gke) or found) and any(not w.image for w in jobs.values()):
        out.append(Problem("cluster.minMasterVersion",
                           f"{version} is below {facts.min_gke}, from which GKE labels a GPU node "
                           f"{facts.label} ahead of its host maintenance ({facts.source}); below it the training runs' "
                           "maintenance watch never sees one and a run loses what it did since its last save"))
    return out


def warnings(m: StackConfig) -> list[Problem]:
    """Reserved nodes no workload uses (each billed anyway); what the maintenance watch cannot do."""
    return [*(w for i, p in _pools(m) if (w := idle_reserved(m, i, p)) is not None), *maintenance_warnings(m)]


def _chain_text(m: StackConfig, name: str) -> str:
    chain = capacity.chains(m)[name]
    return " then ".join(p.name for p in chain.pools)


def _version(tag: str) -> tuple[int, ...]:
    return tuple(int(part) for part in tag.lstrip("v").split("."))


CHECKS: list[Check] = [
    check_spot_alone,
    check_dws_without_reservation,
    check_reservation_zone,
    check_reservation_end_time,
    check_reservation_fallback,
    check_flex_start_version,
    check_max_run_duration,
    check_queued_provisioning_scales_from_zero,
    check_compact_placement_capacity,
    check_queued_pools_have_kueue,
    check_queued_pool_workloads,
    check_queued_pool_nccl_tests,
    check_kueue_target,
    check_fallback_pool,
    check_compute_class_version,
    check_compute_class_pools,
    check_queue_order,
]
