"""Where a workload runs and what each worker may use: one place for both workload kinds.

NVIDIA workloads run on a GKE pool (type and count from the pool, CPU/memory fitted to its machine
type); Gaudi workloads run on `habana.ai/gaudi` nodes of an existing cluster.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import msgspec

from model import capacity, node_memory
from model import catalog as gpu_catalog
from model.fabric import pool_fabric
from model.types import NodePoolConfig, StackConfig, WorkloadConfig
from planner.pod_fit import fitted_cpu_memory
from workloads import compute_class

NVIDIA_RESOURCE = "nvidia.com/gpu"
GAUDI_RESOURCE = "habana.ai/gaudi"
GKE_ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"
POOL_LABEL = "deepspeed-stack/pool"  # every GPU pool's node label (components/gpu_node_pool.py)
DEFAULT_GAUDI_CARDS = 8
# The Omnia reference worker: memory and hugepages per 8-card Gaudi node (limits = requests), from the newest
# example (dell/omnia release_1.7.1, examples/ai_examples/intel/deepSpeed/ds_configuration.yml, 2025-02-01;
# the 1.7 example asked for 95000Mi with 400Gi). tests/test_gaudi_stack.py pins both against that file.
GAUDI_MEMORY = "250Gi"
GAUDI_HUGEPAGES = "312600Mi"


class Placement(msgspec.Struct, frozen=True):
    resource: str  # nvidia.com/gpu | habana.ai/gaudi
    per_worker: int
    node_selector: dict[str, str]
    tolerations: list[dict[str, str]]
    cpu: str | None
    memory: str
    hugepages: str | None
    memory_gb_per_accelerator: float
    accelerator_type: str
    pool: NodePoolConfig | None = None
    # With `fallbackPool`: unqueued, the workers select the pools' ComputeClass (`compute_class`), whose
    # priorities make the autoscaler grow `pool` first and move them back to it; queued, they require either
    # pool (`affinity`) and Kueue picks one.
    affinity: dict[str, Any] | None = None
    fallback: NodePoolConfig | None = None
    compute_class: str | None = None

    @property
    def on_gaudi(self) -> bool:
        return self.resource == GAUDI_RESOURCE

    @property
    def on_nvidia(self) -> bool:
        return self.resource == NVIDIA_RESOURCE

    def limits(self) -> dict[str, str]:
        """Worker requests = limits: accelerators, CPU, memory (and hugepages on Gaudi)."""
        out = {self.resource: str(self.per_worker), "memory": self.memory}
        if self.cpu:
            out["cpu"] = self.cpu
        if self.hugepages:
            out["hugepages-2Mi"] = self.hugepages
        return out


def capacity_tolerations(pool: NodePoolConfig) -> list[dict[str, str]]:
    """The queued-provisioning taint: only pods that GKE provisioned the nodes for may land there."""
    if not pool.queued_provisioning:
        return []
    return [{"key": capacity.load().queued_taint, "operator": "Exists", "effect": "NoSchedule"}]


def either_pool(pool: NodePoolConfig, fallback: NodePoolConfig) -> dict[str, Any]:
    """A node of either pool: for a Kueue-queued job, whose admitted flavor then adds its pool to the node
    selector (a preference here would mean nothing to Kueue nor to the autoscaler, kubernetes/autoscaler#2804)."""
    either = {"key": POOL_LABEL, "operator": "In", "values": [pool.name, fallback.name]}
    return {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [either]}]}}}


def _nvidia(cfg: StackConfig, w: WorkloadConfig) -> Placement | None:
    pool = cfg.pool(w.pool or "")
    if pool is None:
        return None
    fallback = cfg.pool(w.fallback_pool or "")
    fallback = fallback if fallback is not None and fallback.name != pool.name else None
    chain = capacity.workload_chain(cfg, w)
    selector = {GKE_ACCELERATOR_LABEL: pool.gpu.type, POOL_LABEL: pool.name}
    tolerations = [{"key": NVIDIA_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    if chain is not None:
        # The class alone: GKE refuses pods that also select a system label the class could set
        # (cloud.google.com/gke-accelerator), and the pool label would pin one pool. Its pools' taint is tolerated.
        selector = {capacity.load().compute_class.label_key: chain.name}
        tolerations.append(compute_class.toleration(chain.name))
    elif fallback is not None:
        del selector[POOL_LABEL]  # the affinity names both pools
    gpu = gpu_catalog.load().gpus.get(pool.gpu.type)
    cpu, memory = fitted_cpu_memory([pool, *([fallback] if fallback else [])], w.gcs_fuse.enabled,
                                    w.evaluates) or (None, "8Gi")
    return Placement(
        resource=NVIDIA_RESOURCE,
        per_worker=w.accelerator.count or pool.gpu.count,
        node_selector=selector,
        # GKE taints GPU nodes with nvidia.com/gpu=present:NoSchedule (and queued-provisioning nodes with
        # cloud.google.com/gke-queued=true:NoSchedule).
        tolerations=[*tolerations, *capacity_tolerations(pool), *(capacity_tolerations(fallback) if fallback else [])],
        cpu=w.resources.cpu or cpu,
        memory=w.resources.memory or memory,
        hugepages=w.resources.hugepages2_mi,
        memory_gb_per_accelerator=gpu.memory_gb if gpu else 0.0,
        accelerator_type=pool.gpu.type,
        pool=pool,
        affinity=either_pool(pool, fallback) if fallback and chain is None else None,
        fallback=fallback,
        compute_class=chain.name if chain else None,
    )


def _gaudi(w: WorkloadConfig) -> Placement:
    gaudi = gpu_catalog.load().gaudi.get(w.accelerator.type, {})
    return Placement(
        resource=GAUDI_RESOURCE,
        per_worker=w.accelerator.count or DEFAULT_GAUDI_CARDS,
        node_selector={},
        tolerations=[],
        cpu=w.resources.cpu,
        memory=w.resources.memory or GAUDI_MEMORY,
        hugepages=w.resources.hugepages2_mi or GAUDI_HUGEPAGES,
        memory_gb_per_accelerator=float(gaudi.get("memoryGb", 0)),
        accelerator_type=w.accelerator.type,
    )


def labels(w: WorkloadConfig) -> dict[str, str]:
    """Labels on every object of a workload, of either kind: `kubectl get -l deepspeed-stack/workload=NAME`."""
    return {"app.kubernetes.io/managed-by": "pulumi", "deepspeed-stack/workload": w.name}


# The stack's system pool's node label (components/gke_cluster.py); it has no taint, so no toleration is needed: where
# pods that hold no GPU run (the Helm chart's client, the TensorBoard server).
SYSTEM_POOL_SELECTOR = {"deepspeed-stack/pool": "system"}

CONFIG_DIGEST_ANNOTATION = "deepspeed-stack/config-sha256"


def config_digest(files: dict[str, str]) -> str:
    """A digest of what a workload's ConfigMap holds, as a pod annotation: the pods mount the ConfigMap by
    name, so without it a changed script or ds_config.json would change nothing the pods are built from."""
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def placement(cfg: StackConfig, w: WorkloadConfig) -> Placement | None:
    """None when an NVIDIA workload names no existing pool (a config check reports that)."""
    return _gaudi(w) if w.on_gaudi else _nvidia(cfg, w)


quantity_bytes = node_memory.quantity_bytes


def effective_shm(where: Placement, shm_size: str) -> str:
    """The /dev/shm the pods get: a GPU fabric's pod contract sets its own size (data/gpu_fabric.yaml)."""
    fabric = pool_fabric(where.pool) if where.pool is not None else None
    return fabric.shm_size if fabric is not None and fabric.shm_size else shm_size


def offload_memory_bytes(where: Placement, shm_size: str) -> float | None:
    """What a worker's processes may hold in memory, e.g. ZeRO's offloaded states: the pod's memory limit
    (fitted to the node after GKE's reservations, or set by resources.memory) less the memory-backed
    /dev/shm, which counts against the same limit. None when either is not a quantity."""
    limit, shm = quantity_bytes(where.memory), quantity_bytes(effective_shm(where, shm_size))
    return None if limit is None or shm is None else max(0.0, limit - shm)

