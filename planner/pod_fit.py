"""What a workload's container may request on a node of its pool: whole CPUs and GiB (model/node_memory.py). The
workers' placement (workloads/placement.py) requests it; the run's data step (planner/run_hours.py) counts the
first worker's CPUs from it."""

from __future__ import annotations

from model import catalog as gpu_catalog
from model import node_memory
from model.fabric import pool_fabric
from model.types import NodePoolConfig


def pool_fit(pool: NodePoolConfig, gcs_fuse: bool = False, evaluator: bool = False) -> node_memory.PodFit | None:
    """What the workload container may request on one node of the pool (model/node_memory.py: allocatable by
    GKE's formula, less GKE's DaemonSets and the pool's fabric installers, less the FUSE sidecar and a server's
    evaluator); None for a machine type that does not take the pool's GPUs (a config check reports it)."""
    shape = gpu_catalog.load().shape(pool.gpu.type, pool.machine_type, pool.gpu.count)
    if shape is None:
        return None
    return node_memory.fit_pod(shape.vcpus, shape.memory_gb, pool_fabric(pool), pool.fabric.installer, gcs_fuse,
                               evaluator)


def fitted_cpu_memory(pools: list[NodePoolConfig], gcs_fuse: bool = False,
                      evaluator: bool = False) -> tuple[str, str] | None:
    """Whole CPUs and GiB that fit a node of every pool the pod may land on (pool, fallback)."""
    fits = [f for f in (pool_fit(p, gcs_fuse, evaluator) for p in pools) if f is not None]
    if not fits:
        return None
    return str(min(f.cpu for f in fits)), f"{min(f.memory_gib for f in fits)}Gi"
