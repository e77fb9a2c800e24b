"""Rules of the stack's own image (workloads/images/deepspeed, the version set of data/versions.yaml): a GPU it
has no kernels for, a node driver older than its CUDA needs (data/gke_drivers.yaml), and a GPU fabric whose
plugin cannot work with the NCCL it ships, are refused at preview with the reason. A prebuilt image
(`image.prebuilt`) is the user's: its torch, CUDA and NCCL are unknown, so nothing is checked for it; neither are
workloads that name their own `image`.
"""

from __future__ import annotations

from checks.common import Check, at
from model import catalog, fabric, gke_drivers, versions
from model.problems import Problem
from model.types import NodePoolConfig, StackConfig
from workloads.kinds import kind_of


def _unsupported(gpu_type: str) -> str | None:
    """Why the image's torch cannot run on this GPU type, or None (unknown types are another rule's)."""
    gpu = catalog.load().gpus.get(gpu_type)
    if gpu is None or gpu.compute_capability == (0, 0):
        return None
    vs = versions.load()
    if vs.supports(gpu.compute_capability):
        return None
    return (f"{gpu.display_name} is compute capability {gpu.compute_capability_text}, and the stack's image runs "
            f"torch {vs.python['torch']} (CUDA {vs.cuda}) with kernels for compute capability {vs.torch_archs_text()} "
            "only (data/versions.yaml): its first CUDA kernel would fail")


def check_gpu_arch(m: StackConfig) -> list[Problem]:
    """Every pool the stack's image runs on (workloads without their own `image`, NCCL tests, Vertex AI) has a GPU
    the image's torch has kernels for (issue 19.12: A4's sm_100 is there with torch 2.13's CUDA 13 wheels)."""
    if m.image.prebuilt:
        return []
    fix = ("use a pool with a GPU it supports, or an image built for this GPU (the workload's `image`, or "
           "image.prebuilt)")
    problems = []
    for w in m.workloads.values():
        # A kind whose engine has its own, narrower rule (serve: MII's kernels need 8.0+, workloads/kinds/serve.py)
        # refuses its GPUs itself, so a GPU it refuses is not refused twice.
        if not w.on_nvidia or w.image or kind_of(w).checks_its_gpu:
            continue
        for key, pool_name in (("pool", w.pool), ("fallbackPool", w.fallback_pool)):
            pool = m.pool(pool_name) if pool_name else None
            if pool is not None and (why := _unsupported(pool.gpu.type)):
                problems.append(Problem(at('workloads', w.name, key), f"pool {pool.name}'s {why}; {fix}"))
    for t in m.nccl_tests.values():
        for j, pool_name in enumerate(t.pools):
            pool = m.pool(pool_name)
            if pool is not None and (why := _unsupported(pool.gpu.type)):
                problems.append(Problem(at('ncclTests', t.name, 'pools', j), f"pool {pool.name}'s {why}; {fix}"))
    if m.vertex.enabled and (why := _unsupported(m.vertex.gpu.type)):
        problems.append(Problem("vertex.gpu.type", f"the {why}; use a GPU it supports, or image.prebuilt"))
    return problems


def _image_pools(m: StackConfig) -> set[str]:
    """The pools the stack's image runs on: NVIDIA workloads without their own `image`, and the NCCL tests."""
    names = {name for w in m.workloads.values() if w.on_nvidia and not w.image
             for name in (w.pool, w.fallback_pool) if name}
    return names | {name for t in m.nccl_tests.values() for name in t.pools}


def _gke_minor(m: StackConfig) -> tuple[tuple[int, int] | None, str, str]:
    """The GKE minor the cluster's nodes start at, the key that decides it, and what to call it in a message."""
    cluster = m.cluster
    minor = gke_drivers.cluster_minor(cluster)
    if cluster.min_master_version:
        return minor, "cluster.minMasterVersion", ""
    return minor, "cluster.releaseChannel", f"a new cluster's version on the {cluster.release_channel} channel; "


def _where(minor: tuple[int, int], context: str) -> str:
    """`GKE 1.33 (data/gke_drivers.yaml)`, saying where the version came from and whether the row is confirmed."""
    drivers = gke_drivers.load()
    row = drivers.row(minor)
    unconfirmed = "" if row.confirmed else f", an assumption of {drivers.date}"
    return f"GKE {minor[0]}.{minor[1]} ({context}data/gke_drivers.yaml{unconfirmed})"


def _image_needs() -> str:
    vs = versions.load()
    return (f"the stack's image is CUDA {vs.cuda} (torch {vs.python['torch']}), which needs an R{vs.min_driver_branch} "
            f"driver ({vs.min_driver} or later; data/versions.yaml)")


def _newer_gke(pools: list[NodePoolConfig]) -> str:
    """The oldest GKE minor whose LATEST driver runs the image on every one of these pools."""
    need = versions.load().min_driver_branch
    firsts = [gke_drivers.load().first_minor_with("LATEST", p.gpu.type, need) for p in pools]
    if None in firsts:
        return f"no GKE version in data/gke_drivers.yaml installs R{need} there: use image.prebuilt for an older CUDA"
    return f"set cluster.minMasterVersion to {max(firsts, key=lambda r: r.minor).text} or later"


def check_driver(m: StackConfig) -> list[Problem]:
    """Each pool the stack's image runs on gets a driver its CUDA runs on (issue 32.4): DEFAULT installs the
    long-term R535 branch, which runs CUDA 12 only; LATEST installs R580 from GKE 1.33 (data/gke_drivers.yaml).
    A prebuilt image's CUDA is unknown; INSTALLATION_DISABLED leaves the driver to the user (a warning)."""
    if m.image.prebuilt or m.cluster is None:
        return []
    minor, key, context = _gke_minor(m)
    if minor is None:
        return []  # not a version: the schema said so
    need, used = versions.load().min_driver_branch, _image_pools(m)
    row, gke = gke_drivers.load().row(minor), _where(minor, context)
    problems, too_old = [], []
    for i, pool in enumerate(m.node_pools):
        choice = pool.gpu.driver_version
        if pool.name not in used or choice not in gke_drivers.CHOICES or row.branch(choice, pool.gpu.type) >= need:
            continue
        if choice == "LATEST":
            too_old.append(pool)
            continue
        fix = "use LATEST" + ("" if row.branch("LATEST", pool.gpu.type) >= need else f", and {_newer_gke([pool])}")
        problems.append(Problem(at('nodePools', i, 'gpu', 'driverVersion'), f"DEFAULT installs the "
                        f"R{row.branch(choice, pool.gpu.type)} driver on {pool.gpu.type} with {gke}, and "
                        f"{_image_needs()}: every CUDA call would fail with \"CUDA driver version is insufficient\"; "
                        f"{fix}"))
    if too_old:
        branches = sorted({row.branch("LATEST", p.gpu.type) for p in too_old})
        problems.append(Problem(key, f"{gke} installs the R{'/R'.join(map(str, branches))} driver as LATEST, and "
                        f"{_image_needs()}: pool(s) {', '.join(p.name for p in too_old)} would run no CUDA; "
                        f"{_newer_gke(too_old)}"))
    return problems


def check_fabric_nccl(m: StackConfig) -> list[Problem]:
    """A fabric pool's plugin works only with an NCCL core at or above its minimum (data/gpu_fabric.yaml); torch runs
    the image's own NCCL wheel (its RPATH wins over LD_LIBRARY_PATH), so that one must be new enough."""
    if m.image.prebuilt:
        return []
    shipped = versions.load().nccl
    problems = []
    for i, pool in enumerate(m.node_pools):
        f = fabric.pool_fabric(pool)
        if f is None or f.nccl_minimum is None or fabric.nccl_key(shipped) >= fabric.nccl_key(f.nccl_minimum):
            continue
        problems.append(Problem(at('nodePools', i, 'machineType'),
                                f"{pool.machine_type}'s {f.display_name} plugin needs "
                                f"NCCL {f.nccl_minimum} or later, and the stack's image runs NCCL {shipped} (the "
                        "nvidia-nccl-cu13 wheel torch loads; data/versions.yaml): NCCL would fail at init or fall "
                        "back to TCP on eth0. Raise python.nvidiaNcclCu13 there (and torch with it), or set "
                        "fabric.enabled: false"))
    return problems


def _driver_warnings(m: StackConfig) -> list[Problem]:
    """INSTALLATION_DISABLED: GKE installs no driver, so the one the image needs is the user's to install."""
    used = _image_pools(m)
    return [Problem(at('nodePools', i, 'gpu', 'driverVersion'), f"INSTALLATION_DISABLED installs no driver, and "
            f"{_image_needs()}: install one yourself (a driver installer DaemonSet pinned to such a version) before "
            "the pool's pods start, or use LATEST")
            for i, pool in enumerate(m.node_pools)
            if pool.name in used and pool.gpu.driver_version == "INSTALLATION_DISABLED"]


def warnings(m: StackConfig) -> list[Problem]:
    """A fabric pool whose plugin Google qualifies with another NCCL than the image runs: it deploys, unqualified.
    A pool whose driver GKE does not install."""
    if m.image.prebuilt:
        return []
    vs = versions.load()
    out = _driver_warnings(m) if m.cluster is not None else []
    for i, pool in enumerate(m.node_pools):
        f = fabric.pool_fabric(pool)
        if f is None or f.nccl_qualified is None or fabric.nccl_key(vs.nccl) == fabric.nccl_key(f.nccl_qualified):
            continue
        out.append(Problem(at('nodePools', i, 'machineType'), f"Google qualifies the {f.display_name} plugin with NCCL "
                   f"{f.nccl_qualified}; the stack's image runs NCCL {vs.nccl}, since torch {vs.python['torch']} "
                   "cannot load an older one (data/versions.yaml). Run the pool's ncclTests entry and compare its bus "
                   "bandwidth with Google's before training"))
    return out


CHECKS: list[Check] = [check_gpu_arch, check_driver, check_fabric_nccl]
