"""What a pod may use on a GKE node: the one memory (and CPU) model behind pod requests, the planner and the checks.

    allocatable = machine memory - kernel reserve - kube-reserved - eviction threshold      (GKE, per node)
    pod room    = allocatable - DaemonSets on the node (GKE's own, and those this stack adds on the pool)
    container   = pod room - the pod's sidecars' requests (the GCS FUSE sidecar GKE injects)
    processes   = container limit - /dev/shm (a memory-backed emptyDir counts against the same limit)

A pod requesting more than the pod room stays Pending (DWS retries, then Kueue deactivates the job); processes
holding more than `processes` are OOM-killed. The constants and their sources are in data/node_memory.yaml.
Machine memory is GiB (Compute Engine's "GB" for machine types); `*_gb` values are decimal GB, the planner's unit.
"""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path
from typing import Any

import msgspec

from model.fabric import Fabric
from model.fabric import load as load_fabrics
from model.yamlio import load_yaml

DATA_PATH = Path(__file__).resolve().parent.parent / "data" / "node_memory.yaml"
MIB = 1 / 1024  # in GiB
GIB_BYTES = 2**30
GB_BYTES = 1e9
# The workloads' default /dev/shm (model/schema.yaml `resources.shmSize`; a test keeps the two equal).
DEFAULT_SHM = "8Gi"


class Resources(msgspec.Struct, frozen=True):
    cpu: float = 0.0
    memory_gib: float = 0.0

    def __add__(self, other: Resources) -> Resources:
        return Resources(self.cpu + other.cpu, self.memory_gib + other.memory_gib)


class NodeMemoryFacts(msgspec.Struct, frozen=True):
    kernel: dict[str, Any]
    kube_reserved: dict[str, Any]
    eviction_mib: float
    gke_daemonsets: Resources
    stack_daemonsets: dict[str, Resources]
    pod_sidecars: dict[str, Resources]


def _resources(raw: dict[str, Any]) -> Resources:
    memory = raw["memoryGiB"] if "memoryGiB" in raw else raw.get("memoryMiB", 0) * MIB
    return Resources(float(raw.get("cpu", 0)), float(memory))


@functools.cache
def facts(path: Path = DATA_PATH) -> NodeMemoryFacts:
    raw = load_yaml(path)
    return NodeMemoryFacts(
        kernel=raw["kernel"], kube_reserved=raw["kubeReserved"], eviction_mib=float(raw["evictionMiB"]),
        gke_daemonsets=_resources(raw["gkeDaemonSets"]),
        stack_daemonsets={k: _resources(v) for k, v in raw["stackDaemonSets"].items()},
        pod_sidecars={k: _resources(v) for k, v in raw["podSidecars"].items()})


def _tiered(amount: float, tiers: list[list[Any]]) -> float:
    """Marginal rates per tier ([size, rate], size None for the rest), as GKE's kube-reserved brackets."""
    total, left = 0.0, amount
    for size, rate in tiers:
        take = left if size is None else min(left, size)
        total += take * rate
        left -= take
        if left <= 0:
            break
    return total


def kernel_reserved_gib(memory_gib: float) -> float:
    """What the Linux kernel keeps before kubelet sees capacity (the autoscaler's CalculateKernelReserved, COS)."""
    k = facts().kernel
    reserved = memory_gib / k["ratio"] + k["fixedMiB"] * MIB
    if memory_gib > k["swiotlbThresholdGiB"]:
        reserved += k["swiotlbMiB"] * MIB
    if memory_gib <= k["lowMemoryThresholdGiB"]:
        reserved += k["lowMemoryOffsetMiB"] * MIB
    return reserved + min(k["correctionRatio"] * memory_gib, k["correctionMaxMiB"] * MIB)


def kube_reserved_gib(memory_gib: float) -> float:
    kr = facts().kube_reserved
    if memory_gib < 1:
        return kr["belowOneGiBMiB"] * MIB
    return _tiered(memory_gib, kr["tiers"])


def kube_reserved_cpu(vcpus: float) -> float:
    return _tiered(vcpus, facts().kube_reserved["cpuTiers"])


class NodeAllocatable(msgspec.Struct, frozen=True):
    """One node's allocatable CPU and memory, with the parts that make it up (for messages and tests)."""

    vcpus: float
    memory_gib: float
    kernel_gib: float
    kube_reserved_gib: float
    eviction_gib: float
    kube_reserved_cpu: float

    @property
    def memory_allocatable_gib(self) -> float:
        return self.memory_gib - self.kernel_gib - self.kube_reserved_gib - self.eviction_gib

    @property
    def cpu_allocatable(self) -> float:
        return self.vcpus - self.kube_reserved_cpu


def allocatable(vcpus: float, memory_gib: float) -> NodeAllocatable:
    return NodeAllocatable(vcpus, memory_gib, kernel_reserved_gib(memory_gib), kube_reserved_gib(memory_gib),
                           facts().eviction_mib * MIB, kube_reserved_cpu(vcpus))


def node_daemonsets(fabric: Fabric | None, installer: bool = True) -> Resources:
    """GKE's DaemonSets on a GPU node plus those this stack adds there: the fabric's NCCL plugin installer and,
    for TCPX/TCPXO, the NRI device injector."""
    f = facts()
    total = f.gke_daemonsets
    if fabric is not None and installer:
        total = total + f.stack_daemonsets["fabricInstaller"]
        if fabric.nri:
            total = total + f.stack_daemonsets["nriDeviceInjector"]
    return total


def pod_sidecars(gcs_fuse: bool, evaluator: bool = False) -> Resources:
    """The requests of the containers beside the main one: GKE's FUSE sidecar, a server's evaluator."""
    f = facts()
    total = f.pod_sidecars["gcsFuse"] if gcs_fuse else Resources()
    return total + f.pod_sidecars["evaluator"] if evaluator else total


def evaluator_resources() -> dict[str, str]:
    """The evaluator container's requests (= limits), as Kubernetes quantities."""
    r = facts().pod_sidecars["evaluator"]
    return {"cpu": f"{r.cpu:g}", "memory": f"{round(r.memory_gib * 1024)}Mi"}


class PodFit(msgspec.Struct, frozen=True):
    """What the main container of the one workload pod on a node may request (= limit), whole units."""

    node: NodeAllocatable
    daemonsets: Resources
    sidecars: Resources
    cpu: int
    memory_gib: int

    @property
    def pod_room_gib(self) -> float:
        """Allocatable less the DaemonSets: what the pod's containers together may request."""
        return self.node.memory_allocatable_gib - self.daemonsets.memory_gib

    @property
    def container_room_gib(self) -> float:
        return self.pod_room_gib - self.sidecars.memory_gib

    @property
    def container_room_cpu(self) -> float:
        return self.node.cpu_allocatable - self.daemonsets.cpu - self.sidecars.cpu

    @property
    def memory(self) -> str:
        return f"{self.memory_gib}Gi"

    @property
    def cpu_quantity(self) -> str:
        return str(self.cpu)


def fit_pod(vcpus: float, memory_gib: float, fabric: Fabric | None = None, installer: bool = True,
            gcs_fuse: bool = False, evaluator: bool = False) -> PodFit:
    """Whole CPUs and GiB the workload container can request on an otherwise empty node of this shape (rounded
    down, so requests and limits stay within allocatable)."""
    node = allocatable(vcpus, memory_gib)
    ds, side = node_daemonsets(fabric, installer), pod_sidecars(gcs_fuse, evaluator)
    cpu = max(1, math.floor(node.cpu_allocatable - ds.cpu - side.cpu))
    memory = max(1, math.floor(node.memory_allocatable_gib - ds.memory_gib - side.memory_gib))
    return PodFit(node, ds, side, cpu, memory)


def machine_fabric(machine_type: str) -> Fabric | None:
    """The fabric a pool of this machine type gets by default (data/gpu_fabric.yaml)."""
    return load_fabrics().for_machine(machine_type)


def process_memory_gb(limit_bytes: float, shm_bytes: float) -> float:
    """What a container's processes may hold (e.g. ZeRO's offloaded states), in GB: its limit less /dev/shm."""
    return max(0.0, limit_bytes - shm_bytes) / GB_BYTES


def planned_process_memory_gb(machine_type: str, vcpus: float, memory_gib: float,
                              shm_bytes: float | None = None) -> float:
    """What the planner may count on for offloaded states on one node of this shape, as a stack written from its
    plan would get it: the pod fitted with the machine's default fabric (and its /dev/shm, where the fabric
    sets one), the workloads' default /dev/shm otherwise."""
    fabric = machine_fabric(machine_type)
    fit = fit_pod(vcpus, memory_gib, fabric)
    if shm_bytes is None:
        shm_bytes = quantity_bytes((fabric.shm_size if fabric and fabric.shm_size else "") or DEFAULT_SHM) or 0.0
    return process_memory_gb(fit.memory_gib * GIB_BYTES, shm_bytes)


_SUFFIX = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
# Kubernetes' quantity grammar (k8s.io/apimachinery pkg/api/resource/quantity.go): a signed decimal number, then
# a binary SI suffix, a decimal SI suffix, or a decimal exponent (e/E followed by a signed integer).
QUANTITY = re.compile(r"^(?P<number>[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+))"
                      r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE](?P<exponent>[+-]?[0-9]+))?$")


def quantity_bytes(quantity: str) -> float | None:
    """A Kubernetes quantity (24Gi, 500M, 1024, 1.5Gi, 129e6) as a number (bytes for memory); None if it is not one."""
    match = QUANTITY.match(quantity.strip()) if isinstance(quantity, str) else None
    if match is None:
        return None
    number, suffix, exponent = float(match["number"]), match["suffix"] or "", match["exponent"]
    return number * (10 ** int(exponent) if exponent is not None else _SUFFIX[suffix])
