"""One memory model (issue 19.3, issue 20.2): what a pod may use on a GKE node, from GKE's allocatable formula
(model/node_memory.py, data/node_memory.yaml), and every rendered GPU pod within it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import changed, config_problems, examples, model, reference, stack_run, stacks

from model import catalog, node_memory
from model.config_schema import schema as load_schema
from preview.engine import Registration
from workloads.placement import GKE_ACCELERATOR_LABEL, POOL_LABEL, placement, quantity_bytes

MIB, GIB = 2**20, 2**30


@pytest.mark.parametrize(("memory", "expected"), [
    # kubernetes/autoscaler cluster-autoscaler/cloudprovider/gce/gce_reserved_test.go (55c37cd5), the COS cases:
    # reservedMemory + min(correctionConstant x memory, maximumCorrectionValue).
    (256 * MIB, 4 * MIB + 16 * MIB + 8 * MIB + 0.00175 * 256 * MIB),
    (2 * GIB, 32 * MIB + 16 * MIB + 8 * MIB + 0.00175 * 2 * GIB),
    (3 * GIB, 48 * MIB + 16 * MIB + 8 * MIB + 0.00175 * 3 * GIB),
    (3.25 * GIB, 52 * MIB + 16 * MIB + 64 * MIB + 8 * MIB + 0.00175 * 3.25 * GIB),
    (4 * GIB, 64 * MIB + 16 * MIB + 64 * MIB + 8 * MIB + 0.00175 * 4 * GIB),
    (1872 * GIB, 1872 * GIB / 64 + 16 * MIB + 64 * MIB + 248 * MIB),  # the correction's 248 MiB cap
])
def test_kernel_reserve_is_the_autoscalers(memory: float, expected: float) -> None:
    assert node_memory.kernel_reserved_gib(memory / GIB) * GIB == pytest.approx(expected, abs=1)


def test_a3_highgpu_8g_allocatable() -> None:
    # 1872 GiB: kernel 29.25 GiB + 328 MiB = 29.57; kube-reserved 1 + 0.8 + 0.8 + 6.72 + 0.02 x 1744 = 44.2;
    # eviction 100 MiB: allocatable 1798.13 GiB (../shared/reference/gke-node/FACTS.md: "about 1798 GiB").
    node = node_memory.allocatable(208, 1872)
    assert node.kernel_gib == pytest.approx(29.25 + 328 / 1024)
    assert node.kube_reserved_gib == pytest.approx(44.2)
    assert node.memory_allocatable_gib == pytest.approx(1872 - 29.25 - 328 / 1024 - 44.2 - 100 / 1024)
    assert round(node.memory_allocatable_gib) == 1798


def test_g2_standard_8_allocatable() -> None:
    # 32 GiB: kernel 0.5 GiB + 80 MiB + 0.00175 x 32 GiB; kube-reserved 1 + 0.8 + 0.8 + 0.96 = 3.56: ~27.7 GiB.
    node = node_memory.allocatable(8, 32)
    assert node.memory_allocatable_gib == pytest.approx(32 - 0.5 - 80 / 1024 - 0.00175 * 32 - 3.56 - 100 / 1024)
    assert round(node.memory_allocatable_gib, 1) == 27.7


def test_small_machines_keep_the_minimum_kube_reserve() -> None:
    assert node_memory.kube_reserved_gib(0.6) == pytest.approx(255 / 1024)


def test_the_dws_request_of_1826gi_is_refused() -> None:
    (msg,) = config_problems(changed("dws", {"workloads.pretrain.resources.memory": "1826Gi"}))
    assert msg.startswith("workloads.pretrain.resources.memory: 1826Gi is more than what one a3-highgpu-8g node of "
                          "pool h100-reserved (1872 GiB) gives pods: 1798.1 GiB allocatable")
    assert "at most 1796Gi" in msg
    (msg,) = config_problems(changed("dws", {"workloads.pretrain.resources.cpu": "208"}))
    assert msg.startswith("workloads.pretrain.resources.cpu: 208 is more than one a3-highgpu-8g node")
    assert config_problems(changed("dws", {"workloads.pretrain.resources.memory": "1796Gi"})) == []


def test_the_dws_workers_fit_allocatable() -> None:
    m = model("dws")
    where = placement(m, m.workloads["pretrain"])
    # 1798.13 GiB allocatable less 1.5 GiB for GKE's DaemonSets (the TCPX installer and NRI ask no memory).
    assert where.memory == "1796Gi"
    assert quantity_bytes(where.memory) <= node_memory.allocatable(208, 1872).memory_allocatable_gib * GIB


def test_the_fuse_sidecar_counts_against_the_node() -> None:
    plain = node_memory.fit_pod(8, 32)
    fuse = node_memory.fit_pod(8, 32, gcs_fuse=True)
    assert fuse.container_room_gib == pytest.approx(plain.container_room_gib - 128 / 1024)


def test_the_pod_fit_check_keeps_room_for_the_fuse_sidecar() -> None:
    """checks/node_fit.py compares `resources.memory` with what the container may have beside the sidecar GKE
    injects for a bucket mount (issue 32 item 9): a value that fits the node only without the sidecar is refused.

    finetune's `chat` mounts the bucket on pool l4, a g2-standard-8 (8 vCPUs, 32 GiB), by hand:
      kernel        32 / 64 + 16 MiB + 64 MiB (swiotlb) + 0.00175 x 32       = 0.634125 GiB
      kube-reserved 4 x 0.25 + 4 x 0.20 + 8 x 0.10 + 16 x 0.06               = 3.56 GiB
      eviction      100 MiB                                                   = 0.09765625 GiB
      allocatable   32 - 0.634125 - 3.56 - 0.09765625                         = 27.70821875 GiB
      pod room      less GKE's DaemonSets (1.5 GiB)                           = 26.20821875 GiB
      container     less the FUSE sidecar's 128 MiB                           = 26.08321875 GiB
    26780Mi (26.152 GiB) fits the pod room but not the container beside the sidecar; 26705Mi (26.079 GiB) fits."""
    (msg,) = config_problems(changed("finetune", {"workloads.chat.resources.memory": "26780Mi"}))
    assert msg.startswith("workloads.chat.resources.memory: 26780Mi is more than what one g2-standard-8 node of "
                          "pool l4 (32 GiB) gives pods: 27.7 GiB allocatable")
    assert "less 1.5 GiB for its DaemonSets, 0.12 GiB for the GCS FUSE sidecar: at most 26Gi" in msg
    assert config_problems(changed("finetune", {"workloads.chat.resources.memory": "26705Mi"})) == []


def test_the_fitted_memory_leaves_the_fuse_sidecar_its_room() -> None:
    """Unset, `resources.memory` is fitted beside the sidecar. dev's smoke on an n1-standard-16 (16 vCPUs, 60 GiB):
      kernel 60 / 64 + 80 MiB + 0.00175 x 60 = 1.120625; kube-reserved 1 + 0.8 + 0.8 + 44 x 0.06 = 5.24;
      allocatable 60 - 1.120625 - 5.24 - 100 MiB = 53.5417; less 1.5 GiB of DaemonSets = 52.0417 GiB: 52Gi;
      less the sidecar's 128 MiB = 51.9167 GiB: 51Gi with the bucket mounted."""
    keys = {"nodePools[0].machineType": "n1-standard-16", "storage.enabled": True}
    for mounted, memory in ((False, "52Gi"), (True, "51Gi")):
        m = model("dev", {**keys, "workloads.smoke.gcsFuse.enabled": mounted})
        assert placement(m, m.workloads["smoke"]).memory == memory, mounted


def _gpu_resources(value: Any) -> list[dict[str, Any]]:
    """Every `resources` block that asks for GPUs, anywhere in a resource's inputs (pod specs, Helm values)."""
    found = []
    if isinstance(value, dict):
        res = value.get("resources")
        if isinstance(res, dict) and "nvidia.com/gpu" in (res.get("limits") or {}):
            found.append(res)
        for item in value.values():
            found += _gpu_resources(item)
    elif isinstance(value, list):
        for item in value:
            found += _gpu_resources(item)
    return found


NODE_POOL = "gcp:container/nodePool:NodePool"


def node_labels(pool: Registration) -> dict[str, str]:
    """The labels of a rendered GPU pool's nodes: its own (`nodeConfig.labels`: the pool's name, a ComputeClass),
    and those GKE puts on every GPU node (the accelerator type, the machine type)."""
    node = pool.inputs["nodeConfig"]
    (accelerator,) = node["guestAccelerators"]
    return {**(node.get("labels") or {}), GKE_ACCELERATOR_LABEL: accelerator["type"],
            "node.kubernetes.io/instance-type": node["machineType"]}


def selects(pod: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether the scheduler may put the pod on a node with these labels: its nodeSelector, and its required node
    affinity's terms (any term; each of a term's `In` expressions), as kube-scheduler matches them."""
    if any(labels.get(k) != v for k, v in (pod.get("nodeSelector") or {}).items()):
        return False
    required = (((pod.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") or []
    for term in terms:
        assert {e["operator"] for e in term["matchExpressions"]} == {"In"}, term  # the only operator we render
    return not terms or any(all(labels.get(e["key"]) in e["values"] for e in term["matchExpressions"])
                            for term in terms)


def gpu_pods(value: Any) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(pod spec, resources) of every container that asks for GPUs, anywhere in a resource's inputs (a pod spec is
    a dict with `containers`; the chart's values put the selector beside `resources`)."""
    found = []
    if isinstance(value, dict):
        for container in value.get("containers") or []:
            found += [(value, res) for res in _gpu_resources(container)]
        if "containers" not in value and "nodeSelector" in value:
            found += [(value, res) for res in _gpu_resources(value)]
        for key, item in value.items():
            if key != "containers":
                found += gpu_pods(item)
    elif isinstance(value, list):
        for item in value:
            found += gpu_pods(item)
    return found


def gpu_pods_that_fit(stack: str, example: bool, path: Path | None = None) -> int:
    """Every GPU pod's requests fit the room of a node of each pool it may be scheduled on (its selector and
    required affinity against each pool's node labels: its own pool, or its pool and fallback), and some pool takes
    it (asserted); how many were checked."""
    m, run, cat = model(stack, example=example, path=path), stack_run(stack, example=example, path=path), catalog.load()
    pools = []  # (name, node labels, pod room GiB) of each GPU pool
    for reg in run.by_type(NODE_POOL):
        if not reg.inputs["nodeConfig"].get("guestAccelerators"):
            continue
        labels = node_labels(reg)
        pool = m.pool(labels[POOL_LABEL])
        assert pool is not None, labels
        shape = cat.shape(pool.gpu.type, pool.machine_type, pool.gpu.count)
        fit = node_memory.fit_pod(shape.vcpus, shape.memory_gb, node_memory.machine_fabric(pool.machine_type))
        pools.append((pool.name, labels, fit.pod_room_gib, pool.gpu.count))
    checked = 0
    for reg in run.resources:
        found = gpu_pods(reg.inputs)
        assert len(found) == len(_gpu_resources(reg.inputs)), reg.name  # none left out of the walk
        for pod, res in found:
            gpus = int(res["limits"]["nvidia.com/gpu"])
            fits = [(name, room) for name, labels, room, count in pools if count >= gpus and selects(pod, labels)]
            assert fits, (reg.name, "no pool's nodes take it", pod.get("nodeSelector"), pod.get("affinity"))
            for name, room in fits:
                for part in ("requests", "limits"):
                    assert quantity_bytes(res[part]["memory"]) <= room * GIB, (reg.name, name, part, res[part])
            checked += 1
    return checked


@pytest.mark.parametrize("stack", stacks())
def test_every_gpu_pod_fits_its_node(stack: str) -> None:
    gpu_pods_that_fit(stack, example=False)  # a stack without GPU pools (Gaudi, Vertex AI) has none


@pytest.mark.parametrize("stack", [s for s in examples() if s not in ("gaudi", "vertex")])
def test_the_examples_gpu_pods_are_checked(stack: str) -> None:
    assert gpu_pods_that_fit(stack, example=True)  # else the walk above finds the GPU requests nowhere


def test_the_stacks_daemonsets_ask_what_the_data_says() -> None:
    # container-engine-accelerators @992db81: the installers and the NRI injector request 150m CPU, no memory.
    base = ("gke-gpu-fabric", "container-engine-accelerators")
    data = node_memory.facts().stack_daemonsets
    for path, key in ((("gpudirect-tcpx", "nccl-tcpx-installer.yaml"), "fabricInstaller"),
                      (("gpudirect-tcpxo", "nccl-tcpxo-installer.yaml"), "fabricInstaller"),
                      (("gpudirect-rdma", "nccl-rdma-installer.yaml"), "fabricInstaller"),
                      (("nri_device_injector", "nri-device-injector.yaml"), "nriDeviceInjector")):
        with open(reference(*base, *path), encoding="utf-8") as fh:
            ds = next(d for d in yaml_load_all(fh) if d and d.get("kind") == "DaemonSet")
        spec = ds["spec"]["template"]["spec"]
        requests = [c.get("resources", {}).get("requests", {}) for c in spec["containers"]]
        init = [c.get("resources", {}).get("requests", {}) for c in spec.get("initContainers", [])]
        # A pod's effective request: the larger of its containers' sum and its largest init container.
        cpu = max(sum(_cpu(r) for r in requests), max((_cpu(r) for r in init), default=0))
        assert (cpu, [r.get("memory") for r in requests + init if r.get("memory")]) == (data[key].cpu, []), path
        assert data[key].memory_gib == 0


def yaml_load_all(fh: Any) -> list[Any]:
    import yaml

    return list(yaml.load_all(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))


def _cpu(requests: dict[str, str]) -> float:
    cpu = str(requests.get("cpu", "0"))
    return float(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)


def _defaults_of(schema: Any, key: str) -> set[str]:
    found = set()
    if isinstance(schema, dict):
        if isinstance(schema.get(key), dict) and "default" in schema[key]:
            found.add(schema[key]["default"])
        for value in schema.values():
            found |= _defaults_of(value, key)
    elif isinstance(schema, list):
        for value in schema:
            found |= _defaults_of(value, key)
    return found


def test_the_planners_shm_is_the_workloads_default() -> None:
    assert _defaults_of(load_schema(), "shmSize") == {node_memory.DEFAULT_SHM}
