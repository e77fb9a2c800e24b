"""A worker's requests (= limits) must fit what a node of its pool gives pods: one named rule.

The stack fits `cpu` and `memory` to the pool's machine itself (model/node_memory.py: GKE's allocatable less the
DaemonSets on the node and the pod's FUSE sidecar) unless `resources.cpu` / `resources.memory` set them. A value
above that never schedules: the pod stays Pending, DWS's ProvisioningRequest fails and Kueue deactivates the job.
"""

from __future__ import annotations

from checks.common import Check, at
from model import node_memory
from model.problems import Problem
from model.types import NodePoolConfig, StackConfig, WorkloadConfig
from planner.pod_fit import pool_fit
from workloads.placement import quantity_bytes


def _pools(m: StackConfig, w: WorkloadConfig) -> list[NodePoolConfig]:
    return [p for p in (m.pool(w.pool or ""), m.pool(w.fallback_pool or "")) if p is not None]


def _why(fit: node_memory.PodFit, pool: NodePoolConfig, evaluator: bool = False) -> str:
    n = fit.node
    what = "the GCS FUSE sidecar and the evaluator" if evaluator else "the GCS FUSE sidecar"
    sidecar = f", {fit.sidecars.memory_gib:.2f} GiB for {what}" if fit.sidecars.memory_gib else ""
    return (f"what one {pool.machine_type} node of pool {pool.name} ({n.memory_gib:g} GiB) gives pods: "
            f"{n.memory_allocatable_gib:.1f} GiB allocatable (less the kernel's {n.kernel_gib:.1f}, kube-reserved "
            f"{n.kube_reserved_gib:.1f} and the eviction threshold's {n.eviction_gib:.1f} GiB), less "
            f"{fit.daemonsets.memory_gib:.1f} GiB for its DaemonSets{sidecar}")


def _memory_problem(name: str, w: WorkloadConfig, pool: NodePoolConfig, fit: node_memory.PodFit) -> Problem | None:
    asked = quantity_bytes(w.resources.memory or "")
    if asked is None or asked <= fit.container_room_gib * node_memory.GIB_BYTES:
        return None
    why = _why(fit, pool, w.evaluates)
    return (Problem(at('workloads', name, 'resources', 'memory'), f"{w.resources.memory} is more than {why}: "
            f"at most {fit.memory}; the pod would stay Pending. Leave it unset (the stack fits {fit.memory}), or "
            "choose a machine type with more memory"))


def _cpu_problem(name: str, w: WorkloadConfig, pool: NodePoolConfig, fit: node_memory.PodFit) -> Problem | None:
    cpu = w.resources.cpu or ""
    asked = quantity_bytes(cpu)  # a quantity's value: cores for CPU (500m = 0.5)
    if asked is None or asked <= fit.container_room_cpu:
        return None
    return (Problem(at('workloads', name, 'resources', 'cpu'),
                    f"{cpu} is more than one {pool.machine_type} node of pool "
            f"{pool.name} gives the pod ({fit.node.vcpus:g} vCPUs less kube-reserved {fit.node.kube_reserved_cpu:.2f}, "
            f"{fit.daemonsets.cpu:.2f} for DaemonSets and {fit.sidecars.cpu:.2f} for sidecars): at most "
            f"{fit.container_room_cpu:.2f}; leave it unset (the stack fits {fit.cpu})"))


def check_requests_fit_nodes(m: StackConfig) -> list[Problem]:
    problems = []
    for name, w in m.workloads.items():
        if not w.on_nvidia or m.cluster is None:
            continue  # Gaudi runs on an existing cluster whose nodes the stack does not know
        for pool in _pools(m, w):
            fit = pool_fit(pool, w.gcs_fuse.enabled, w.evaluates)
            found = [p for p in (_memory_problem(name, w, pool, fit), _cpu_problem(name, w, pool, fit))
                     if p] if fit else []
            problems += found
            if found:
                break  # the fallback pool has the same shape (checks/capacity.py): one message is enough
    return problems


CHECKS: list[Check] = [check_requests_fit_nodes]
