"""Rules of the stack's own image (workloads/images/deepspeed, the version set of data/versions.yaml): a GPU it
has no kernels for, and a GPU fabric whose plugin cannot work with the NCCL it ships, are refused at preview with
the reason. A prebuilt image (`image.prebuilt`) is the user's: its torch and NCCL are unknown, so nothing is
checked for it; neither are workloads that name their own `image`.
"""

from __future__ import annotations

from checks.common import Check, at
from model import catalog, fabric, versions
from model.types import StackConfig
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


def check_gpu_arch(m: StackConfig) -> list[str]:
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
                problems.append(f"{at('workloads', w.name, key)}: pool {pool.name}'s {why}; {fix}")
    for t in m.nccl_tests.values():
        for j, pool_name in enumerate(t.pools):
            pool = m.pool(pool_name)
            if pool is not None and (why := _unsupported(pool.gpu.type)):
                problems.append(f"{at('ncclTests', t.name, 'pools', j)}: pool {pool.name}'s {why}; {fix}")
    if m.vertex.enabled and (why := _unsupported(m.vertex.gpu.type)):
        problems.append(f"vertex.gpu.type: the {why}; use a GPU it supports, or image.prebuilt")
    return problems


def check_fabric_nccl(m: StackConfig) -> list[str]:
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
        problems.append(f"{at('nodePools', i, 'machineType')}: {pool.machine_type}'s {f.display_name} plugin needs "
                        f"NCCL {f.nccl_minimum} or later, and the stack's image runs NCCL {shipped} (the "
                        "nvidia-nccl-cu13 wheel torch loads; data/versions.yaml): NCCL would fail at init or fall "
                        "back to TCP on eth0. Raise python.nvidiaNcclCu13 there (and torch with it), or set "
                        "fabric.enabled: false")
    return problems


def warnings(m: StackConfig) -> list[str]:
    """A fabric pool whose plugin Google qualifies with another NCCL than the image runs: it deploys, unqualified."""
    if m.image.prebuilt:
        return []
    vs = versions.load()
    out = []
    for i, pool in enumerate(m.node_pools):
        f = fabric.pool_fabric(pool)
        if f is None or f.nccl_qualified is None or fabric.nccl_key(vs.nccl) == fabric.nccl_key(f.nccl_qualified):
            continue
        out.append(f"{at('nodePools', i, 'machineType')}: Google qualifies the {f.display_name} plugin with NCCL "
                   f"{f.nccl_qualified}; the stack's image runs NCCL {vs.nccl}, since torch {vs.python['torch']} "
                   "cannot load an older one (data/versions.yaml). Run the pool's ncclTests entry and compare its bus "
                   "bandwidth with Google's before training")
    return out


CHECKS: list[Check] = [check_gpu_arch, check_fabric_nccl]
