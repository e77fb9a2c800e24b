"""GPU fabric rules: a plan that cannot reach an A3/A4 pool's GPU-to-GPU bandwidth is refused at preview,
with the reason, before anything is created. Facts come from data/gpu_fabric.yaml (model/fabric.py).
"""

from __future__ import annotations

import ipaddress

from checks.common import Check, at, or_list
from model import fabric
from model.problems import Problem
from model.types import NodePoolConfig, StackConfig, WorkloadConfig
from model.workload_training import FinetuneWorkloadConfig, MpiJobBaseConfig
from workloads import first_up

NATIVE_SIDECAR_MINOR = (1, 29)  # the RxDM daemon runs as a native sidecar (CEA gpudirect-tcpxo/best-practice.md)


def _fabric_pools(m: StackConfig) -> list[tuple[int, NodePoolConfig, fabric.Fabric]]:
    return [(i, p, f) for i, p in enumerate(m.node_pools) if (f := fabric.pool_fabric(p)) is not None]


def check_multi_networking(m: StackConfig) -> list[Problem]:
    """The fabric's NICs reach pods only through GKE multi-networking, which needs Dataplane V2."""
    pools = [p.name for _, p, _ in _fabric_pools(m)]
    if not pools or m.cluster is None:
        return []
    problems = []
    if m.cluster.multi_networking is False:
        problems.append(Problem("cluster.multiNetworking",
                                f"is off, but pool(s) {', '.join(pools)} attach their GPU NICs "
                        "through multi-networking; without it NCCL runs on the primary NIC at a fraction of the "
                        "bandwidth. Remove the key (on by default with a fabric) or set it true"))
    if not m.cluster.dataplane_v2:
        problems.append(Problem("cluster.dataplaneV2",
                                f"GKE multi-networking, which pool(s) {', '.join(pools)} need for their "
                        "GPU NICs, runs only on Dataplane V2; set dataplaneV2: true (Calico is not supported with it)"))
    return problems


def check_additional_networks(m: StackConfig) -> list[Problem]:
    """Each GPU NIC needs its own additional network; fewer leave NICs (and their bandwidth) unused."""
    problems = []
    for i, p, f in _fabric_pools(m):
        count = fabric.additional_networks(p)
        if count != len(f.nics):
            word = "fewer" if count < len(f.nics) else "more"
            problems.append(Problem(at('nodePools', i, 'fabric', 'additionalNetworks'), f"{count} is {word} than the "
                            f"{len(f.nics)} extra NICs of {p.machine_type} ({f.display_name}: {', '.join(f.nics)}); "
                            f"remove the key to attach all {len(f.nics)}, or set fabric.enabled: false"))
    return problems


def check_installer(m: StackConfig) -> list[Problem]:
    """Without the NCCL plugin installer the node has no plugin library and NCCL falls back to sockets."""
    return [Problem(at('nodePools', i, 'fabric', 'installer'), f"pool {p.name} ({f.display_name}) needs the "
            f"{f.installer.daemon_set} DaemonSet to put the NCCL plugin on its nodes; set installer: true, or "
            "fabric.enabled: false for single-node work")
            for i, p, f in _fabric_pools(m) if not p.fabric.installer]


def check_nccl_test_pools(m: StackConfig) -> list[Problem]:
    """One job runs on one fabric: NCCL cannot mix TCPX, TCPXO, RDMA or plain NICs in one communicator, and
    a test without a fabric measures nothing the stack set up."""
    problems = []
    for name, t in m.nccl_tests.items():
        key = at("ncclTests", name, "pools")
        pools = [(pool, m.pool(pool)) for pool in t.pools]
        missing = [pool for pool, cfg in pools if cfg is None]
        if missing:
            problems.append(Problem(key, f"{', '.join(missing)} is not a nodePools entry (known: "
                            f"{', '.join(p.name for p in m.node_pools) or 'none'})"))
            continue
        fabrics = {pool: (f.name if (f := fabric.pool_fabric(cfg)) else "none") for pool, cfg in pools}
        if len(set(fabrics.values())) > 1:
            problems.append(Problem(key, "one job across pools of different fabrics ("
                            + ", ".join(f"{pool}: {name}" for pool, name in fabrics.items())
                            + "); NCCL runs one transport per job, so use pools of one fabric"))
        elif "none" in fabrics.values():
            problems.append(Problem(key, f"{or_list(list(fabrics))} has no GPU fabric (A3 High/Mega/Ultra, A4 with "
                            "fabric.enabled); the NCCL test measures a fabric pool"))
        capacity = sum(cfg.max_nodes for _, cfg in pools)
        if t.nodes > capacity:
            problems.append(Problem(at('ncclTests', name, 'nodes'), f"{t.nodes} nodes, but the pools reach at most "
                            f"{capacity}; raise their maxNodes or lower nodes"))
    return problems


def check_compact_placement_zone(m: StackConfig) -> list[Problem]:
    """COMPACT placement puts nodes physically close: GKE allows it in a single zone only."""
    problems = []
    for i, p in enumerate(m.node_pools):
        zones = fabric.pool_zones(m, p)
        if p.compact_placement and len(zones) != 1:
            problems.append(Problem(at('nodePools', i, 'compactPlacement'), f"COMPACT placement works in one zone, but "
                            f"pool {p.name} spans {len(zones)} ({', '.join(zones) or 'none'}); set "
                            f"nodePools[{i}].zones to one zone"))
    return problems


def check_zonal_fabric_one_zone(m: StackConfig) -> list[Problem]:
    """A RoCE VPC's network profile belongs to one zone: an RDMA pool (A3 Ultra, A4) lives in that zone."""
    problems = []
    for i, p, f in _fabric_pools(m):
        zones = fabric.pool_zones(m, p)
        if f.zonal and len(zones) != 1:
            problems.append(Problem(at('nodePools', i, 'zones'),
                                    f"{f.display_name} needs its pool in one zone (the RoCE "
                            f"VPC's network profile is zonal), but {p.name} spans {', '.join(zones) or 'none'}; "
                            "list one zone"))
    return problems


def check_fabric_networks_distinct(m: StackConfig) -> list[Problem]:
    """Kubernetes Network names are cluster-wide: TCPX and TCPXO both name theirs vpc1.., and two RDMA zones
    would both name theirs rdma-0..; one cluster takes one set of each name."""
    seen: dict[str, str] = {}
    problems = []
    for s in fabric.fabric_sets(m):
        clash = sorted({seen[n] for n in s.network_names if n in seen})
        if clash:
            names = ", ".join(n for n in s.network_names if n in seen)
            problems.append(Problem("nodePools",
                                    f"pool(s) {', '.join(s.pools)} ({s.key}) and {', '.join(clash)} need Networks "
                            f"of the same names ({names}); put fabric pools of one type in one zone, and A3 High and "
                            "A3 Mega in separate clusters"))
        for n in s.network_names:
            seen.setdefault(n, s.key)
    return problems


def check_fabric_cidr(m: StackConfig) -> list[Problem]:
    """The GPU subnets come out of network.fabricCidr: it must hold them and overlap nothing else."""
    if not fabric.fabric_sets(m):
        return []
    try:
        cidr = ipaddress.IPv4Network(m.network.fabric_cidr, strict=True)
    except ValueError:
        return [Problem("network.fabricCidr",
                        f"{m.network.fabric_cidr!r} is not an IPv4 network such as 192.168.0.0/16")]
    problems = []
    needed = fabric.subnets_needed(m)
    room = 2 ** (fabric.SUBNET_PREFIX - cidr.prefixlen) if cidr.prefixlen <= fabric.SUBNET_PREFIX else 0
    if needed > room:
        problems.append(Problem("network.fabricCidr", f"{cidr} holds {room} /24 subnet(s), the fabrics need {needed}; "
                        "use a larger range such as 192.168.0.0/16"))
    for key in ("subnetCidr", "podsCidr", "servicesCidr"):
        value = getattr(m.network, {"subnetCidr": "subnet_cidr", "podsCidr": "pods_cidr",
                                    "servicesCidr": "services_cidr"}[key])
        try:
            other = ipaddress.IPv4Network(value, strict=False)
        except ValueError:
            continue  # the platform rules report it
        if cidr.overlaps(other):
            problems.append(Problem("network.fabricCidr",
                                    f"{cidr} overlaps network.{key} {other}; pick a disjoint range"))
    return problems


def check_gke_version(m: StackConfig) -> list[Problem]:
    """Each fabric needs a minimum GKE version (CT gpu_direct.tf), and its RxDM daemon runs as a native sidecar."""
    if m.cluster is None or not m.cluster.min_master_version:
        return []
    version = m.cluster.min_master_version
    problems = []
    for f in {f.name: f for _, _, f in _fabric_pools(m)}.values():
        if not fabric.meets_minimum(version, f.min_gke_versions):
            problems.append(Problem("cluster.minMasterVersion",
                                    f"{version} is below what {f.display_name} ({f.family}) needs: "
                                    f"{or_list(list(f.min_gke_versions))} or later on its minor, or a later minor"))
        elif f.daemon and (key := fabric.version_key(version)) and key[:2] < NATIVE_SIDECAR_MINOR:
            problems.append(Problem("cluster.minMasterVersion",
                                    f"{version} is below 1.29, where GKE runs the {f.daemon.name} "
                                    "daemon as a native sidecar; use 1.29 or later"))
    return problems


# Scripts that read NCCL's network line after their first collective and stop when the fabric was not used.
SELF_CHECKING_SCRIPTS = ("smoke_train.py", "finetune.py")


def proves_its_fabric(w: WorkloadConfig) -> bool:
    """The run stops by itself off the fabric's network: the recipe (finetune_fabric.py) or the smoke test."""
    if isinstance(w, FinetuneWorkloadConfig):
        return True
    return isinstance(w, MpiJobBaseConfig) and not w.launch.command and \
        w.launch.script.rsplit("/", 1)[-1] in SELF_CHECKING_SCRIPTS


def _unproven_fallbacks(m: StackConfig) -> list[tuple[str, WorkloadConfig, NodePoolConfig, list[str]]]:
    """Training workloads whose fallbackPool, a fabric pool, no NCCL test measures: (name, workload, fallback, the
    tests that gate its pool, maybe none)."""
    out = []
    for name, w in m.workloads.items():
        fallback = m.pool(w.fallback_pool or "")
        if not first_up.trains(w) or fallback is None or fabric.pool_fabric(fallback) is None:
            continue
        if not any(fallback.name in test.pools for test in m.nccl_tests.values()):
            out.append((name, w, fallback, sorted(t for t, test in m.nccl_tests.items() if w.pool in test.pools)))
    return out


def check_nccl_gate_fallback(m: StackConfig) -> list[Problem]:
    """The fabric proven on every pool a run can land on: an NCCL test gates the pool, so one gates the fallback
    too (a run moved there, spot reclaimed or a reservation ended, would otherwise train on a fabric nobody
    measured). A queued-provisioning fallback cannot be tested first (its nodes come only for a queued MPIJob:
    checks/capacity.py): there the run's own first collective is the gate (warnings)."""
    return [Problem(at('workloads', name, 'fallbackPool'),
                    f"pool {w.pool} is proven by NCCL test {or_list(tests)} before "
                    f"the run starts, but its fallback {fb.name} by none, and the run may move there; add a test of it "
            f"(`ncclTests.{fb.name}: {{pools: [{fb.name}], nodes: {min(fb.max_nodes, w.nodes_needed()[0])}}}`), "
            "which the run then waits for too")
            for name, w, fb, tests in _unproven_fallbacks(m) if tests and not fb.queued_provisioning]


def warnings(m: StackConfig) -> list[Problem]:
    """A fallback no NCCL test can or does prove first (a queued-provisioning pool's first nodes are the run's own;
    a ComputeClass's taint keeps a test off its pools): only a script that checks NCCL's network line stops a run
    there that NCCL put on its own TCP transport."""
    out = []
    for name, w, fb, tests in _unproven_fallbacks(m):
        if proves_its_fabric(w) or (tests and not fb.queued_provisioning):
            continue
        why = "gets nodes only for this queued job, so no NCCL test can prove its fabric first" \
            if fb.queued_provisioning else "is measured by no NCCL test"
        out.append(Problem(at('workloads', name, 'fallbackPool'), f"{fb.name} {why}, and your script does not check "
                   "NCCL's network line (finetune.py and smoke_train.py do, with nccl_network.py shipped beside it): "
                   "a run moved there could train at a fraction of the fabric's bandwidth unnoticed"))
    return out


CHECKS: list[Check] = [
    check_multi_networking,
    check_additional_networks,
    check_installer,
    check_nccl_test_pools,
    check_compact_placement_zone,
    check_zonal_fabric_one_zone,
    check_fabric_networks_distinct,
    check_fabric_cidr,
    check_gke_version,
    check_nccl_gate_fallback,
]
