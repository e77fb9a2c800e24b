"""ZeRO offload must fit in the memory a worker pod may use, and NVMe offload needs the image's async_io op: one
named rule each.

DeepSpeed's estimators give the CPU memory per node that offloaded optimizer states (and parameters) take
(planner/sizing.py, `deepspeed_cpu_bytes`). On GKE a worker pod is fitted to its node (model/node_memory.py:
GKE's allocatable, the machine's memory less the kernel's reserve, kube-reserved memory and the eviction
threshold, less the DaemonSets on the node), and the
memory-backed /dev/shm counts against the same limit. Beyond that the kernel OOM-kills the worker mid-run, so
it is an error that says what would fit: more workers, or a machine type with more memory.
"""

from __future__ import annotations

from checks.common import Check, at
from checks.planner import Sized, _describe, alternatives, sized_workloads
from model import catalog as gpu_catalog
from model import node_memory, versions
from model.problems import Problem
from model.types import DeepSpeedWorkloadConfig, StackConfig
from workloads.ds_config import nvme_offload_path
from workloads.placement import effective_shm, quantity_bytes

NVME_OP = "async_io"  # DeepSpeed's op that ZeRO-Infinity's NVMe offload (swap_tensor) reads and writes with

MACHINE_SUGGESTIONS = 3


def _limit(s: Sized) -> str:
    w = s.workload
    if w.resources.memory:
        source = f"{at('workloads', s.name, 'resources', 'memory')}"
    elif s.where.pool is not None:
        shape = gpu_catalog.load().shape(s.where.pool.gpu.type, s.where.pool.machine_type, s.where.pool.gpu.count)
        source = (f"{s.where.pool.machine_type}'s {shape.memory_gb:g} GiB less the kernel's and GKE's reservations "
                  "and the node's DaemonSets") if shape else ""
    else:
        source = ""
    return f"its memory limit {s.where.memory}" + (f" ({source})" if source else "")


def _shm(s: Sized) -> str:
    shm = effective_shm(s.where, s.workload.resources.shm_size)
    if shm != s.workload.resources.shm_size:
        return f"{shm} (the GPU fabric's pod contract)"
    return f"{at('workloads', s.name, 'resources', 'shmSize')} {shm}"


def bigger_machines(s: Sized, need_gb: float) -> list[str]:
    """Machine types of the pool's GPU and count whose fitted pod holds `need_gb` beside /dev/shm, smallest first."""
    pool = s.where.pool
    shm = quantity_bytes(effective_shm(s.where, s.workload.resources.shm_size))
    if pool is None or s.workload.resources.memory or shm is None:
        return []
    cat, out = gpu_catalog.load(), []
    for machine_type in cat.machine_types(pool.gpu.type, pool.gpu.count):
        shape = cat.shape(pool.gpu.type, machine_type, pool.gpu.count)
        fabric = node_memory.machine_fabric(machine_type) if pool.fabric.enabled else None
        fit = node_memory.fit_pod(shape.vcpus, shape.memory_gb, fabric, pool.fabric.installer,
                                  s.workload.gcs_fuse.enabled)
        pod = node_memory.process_memory_gb(fit.memory_gib * node_memory.GIB_BYTES, shm)
        if pod >= need_gb:
            out.append(f"{machine_type} ({pod:.1f} GB)")
    return out[:MACHINE_SUGGESTIONS]


def _what_fits(m: StackConfig, s: Sized) -> str:
    options = [_describe(s, strategy, est) for strategy, est in alternatives(s)]
    machines = bigger_machines(s, s.estimate.cpu_gb_per_node)
    parts = []
    if options:
        parts.append("on this pool's accelerators, with the offload in each pod's memory: " + "; ".join(options))
    if machines and s.where.pool is not None:
        key = at("nodePools", m.node_pools.index(s.where.pool), "machineType")
        parts.append(f"or {s.strategy.label} as it is with {key} one of (memory for the offload): "
                     + ", ".join(machines))
    return "What fits: " + "; ".join(parts) if parts else "Lower the offload, or give the workers more memory"


def _pool_known(s: Sized) -> bool:
    """A pool whose machine type does not take its GPUs has its own problem, and no fitted memory to compare."""
    pool = s.where.pool
    return pool is None or gpu_catalog.load().shape(pool.gpu.type, pool.machine_type, pool.gpu.count) is not None


def check_offload_fits_pod_memory(m: StackConfig) -> list[Problem]:
    problems = []
    for s in sized_workloads(m):
        need, room = s.estimate.cpu_gb_per_node, s.offload_memory_gb
        if need <= 0 or room is None or need <= room or not _pool_known(s):
            continue
        if s.estimate.per_gpu_gb > s.memory_gb:
            continue  # check_model_fits reports it, with suggestions that hold the offload in memory too
        problems.append(
            Problem(at('workloads', s.name, 'deepspeed', 'offloadOptimizer'),
                    f"DeepSpeed estimates {need:.1f} GB of CPU "
                    f"memory per node for {s.request.model.name}'s offloaded states at {s.strategy.label} on "
            f"{s.estimate.nodes} worker(s) (its 1.5 buffer factor included), but a worker pod may use {room:.1f} GB: "
            f"{_limit(s)} less {_shm(s)} for /dev/shm. {_what_fits(m, s)}"))
    return problems


def check_nvme_offload_has_async_io(m: StackConfig) -> list[Problem]:
    """NVMe offload runs DeepSpeed's async_io op, which needs libaio: on an image that has not built it (data/
    versions.yaml image.deepspeedOps, what the Dockerfile builds), DeepSpeed would try to compile it on every rank at
    start-up and stop without libaio. The stack's own image only: one of the user's (`image`, image.prebuilt) may
    have it, which nothing here can see."""
    if m.image.prebuilt or versions.load().has_op(NVME_OP):
        return []
    problems = []
    for name, w in m.workloads.items():
        if not isinstance(w, DeepSpeedWorkloadConfig) or not w.on_nvidia or w.image:
            continue
        ds = w.deepspeed
        if nvme_offload_path(ds) is None:
            continue
        key = "offloadOptimizer" if ds.offload_optimizer == "nvme" else "offloadParams"
        problems.append(Problem(at('workloads', name, 'deepspeed', key), f"nvme offload runs DeepSpeed's {NVME_OP} op, "
                        f"which the stack's image does not build (data/versions.yaml image.deepspeedOps; it needs "
                        "libaio-dev in workloads/images/deepspeed/Dockerfile and DS_BUILD_AIO=1); offload to cpu, or "
                        "run an image with it (the workload's `image`, or image.prebuilt)"))
    return problems


CHECKS: list[Check] = [check_offload_fits_pod_memory, check_nvme_offload_has_async_io]
