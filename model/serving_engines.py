"""The `serve` kind's engines (`serving.engine`): vLLM (the default) and DeepSpeed-MII (FastGen); data/serving.yaml.

What each engine runs on (compute capabilities), what it serves (precisions), how it takes GPU memory (vLLM: a
budget of `--gpu-memory-utilization`; FastGen: everything but a reserve) and how it splits a model over a node's GPUs
(the attention heads). The planner sizes by these facts and the serve kind's rules refuse by them; the sources are
in the data file.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import msgspec

from model.yamlio import load_yaml

SERVING_PATH = Path(__file__).resolve().parent.parent / "data" / "serving.yaml"
VLLM, MII = "vllm", "mii"
BUDGET, RESERVE = "budget", "reserve"  # how an engine takes GPU memory


def _capability(text: Any) -> tuple[int, int]:
    major, _, minor = str(text).partition(".")
    return int(major), int(minor or 0)


def capability_text(capability: tuple[int, int]) -> str:
    return "{}.{}".format(*capability)


class Engine(msgspec.Struct, frozen=True):
    name: str  # the `serving.engine` value
    display_name: str
    min_compute_capability: tuple[int, int]
    precisions: tuple[str, ...]  # `model.precision` values it serves
    port: int  # its API port when `serving.port` is not set
    memory: str  # BUDGET (vLLM) or RESERVE (FastGen)
    # The compute capabilities its own kernels are built for (a GPU runs a cubin of its major and an equal or lower
    # minor); None: the engine's kernels come with the image's torch and vLLM wheel (data/versions.yaml decides).
    kernel_archs: tuple[tuple[int, int], ...] | None = None
    bf16_min_compute_capability: tuple[int, int] | None = None  # bf16 below it: refused (serve fp16 instead)
    quantised: tuple[str, ...] = ()  # precisions served only from a checkpoint quantised that way
    gpu_memory_utilization: float | None = None  # BUDGET: the fraction of each GPU it may take
    reserve_bytes: float = 0.0  # RESERVE: what it leaves free after the KV cache
    multi_node: bool = False  # one replica may span nodes (tensor parallel within, pipeline parallel across)
    max_nodes_per_replica: int = 1  # the stack's bound on a replica's nodes (data/serving.yaml)

    def runs_kernels_on(self, capability: tuple[int, int]) -> bool:
        """Its own kernels run on the GPU: at or above its minimum, and a cubin of the same major, an equal or lower
        minor where the engine ships its own (CUDA binary compatibility; no PTX)."""
        if capability < self.min_compute_capability:
            return False
        return self.kernel_archs is None or any(
            major == capability[0] and minor <= capability[1] for major, minor in self.kernel_archs)

    def kernel_archs_text(self) -> str:
        archs = self.kernel_archs or ()
        return ", ".join(capability_text(a) for a in archs)

    def serves_bf16_on(self, capability: tuple[int, int]) -> bool:
        return self.bf16_min_compute_capability is None or capability >= self.bf16_min_compute_capability

    def tensor_parallel_problem(self, heads: int, kv_heads: int, tp: int) -> str | None:
        """Why the model's attention cannot be split over `tp` GPUs (each engine's rule; sources in the data
        file), or None."""
        if tp <= 1:
            return None
        if self.name == VLLM:
            if heads % tp:
                return f"its {heads} attention heads do not divide by {tp}"
            if kv_heads % tp and tp % kv_heads:
                return f"its {kv_heads} KV heads neither divide by {tp} nor divide {tp}"
            return None
        # FastGen (sharding/attn.py): at least one head per shard; grouped KV heads spread evenly.
        if heads < tp:
            return f"it has {heads} attention heads, fewer than {tp} GPUs"
        if kv_heads != heads and ((kv_heads >= tp and kv_heads % tp) or (kv_heads < tp and tp % kv_heads)):
            return f"its {kv_heads} KV heads cannot be spread evenly over {tp} GPUs"
        return None

    def valid_tensor_parallel(self, heads: int, kv_heads: int, up_to: int) -> list[int]:
        return [t for t in range(1, up_to + 1) if self.tensor_parallel_problem(heads, kv_heads, t) is None]


class MiiFacts(msgspec.Struct, frozen=True):
    """What the pinned DeepSpeed-MII needs and uses inside its pod (each fact with its source in the data file)."""

    version: str
    load_balancer_port: int
    torch_dist_port: int
    zmq_port: int
    gateway_internal_port: int
    rest_path: str
    fastgen_max_context: int


class VllmFacts(msgspec.Struct, frozen=True):
    entrypoint: tuple[str, ...]
    dtypes: dict[str, str]  # `model.precision` -> `--dtype`
    health_path: str
    env: dict[str, str]
    lora_ranks: tuple[int, ...]  # the values --max-lora-rank takes, ascending
    runtime_lora_env: str  # the variable that opens /v1/load_lora_adapter (set "true" for serving.evaluation)
    headless_entrypoint: tuple[str, ...] = ()  # a multi-node replica's other nodes: `vllm serve ... --headless`
    master_port: int = 29501  # --master-port: the leader's torch.distributed store (multi-node)


@functools.cache
def _raw(path: Path = SERVING_PATH) -> dict[str, Any]:
    return load_yaml(path)


def _engine(name: str, raw: dict[str, Any]) -> Engine:
    archs = raw.get("kernelArchs")
    bf16 = raw.get("bf16MinComputeCapability")
    precisions = tuple(raw["dtypes"]) if "dtypes" in raw else tuple(raw["precisions"])
    budget = raw.get("gpuMemoryUtilization")
    return Engine(
        name=name, display_name=str(raw["displayName"]),
        min_compute_capability=_capability(raw["minComputeCapability"]), precisions=precisions,
        port=int(raw["port"]), memory=BUDGET if budget is not None else RESERVE,
        kernel_archs=tuple(_capability(a) for a in archs) if archs else None,
        bf16_min_compute_capability=_capability(bf16) if bf16 else None,
        quantised=tuple(raw.get("quantised", ())), gpu_memory_utilization=float(budget) if budget else None,
        reserve_bytes=float(raw.get("reserveBytes", 0)), multi_node=bool(raw["multiNode"]),
        max_nodes_per_replica=int(raw.get("maxNodesPerReplica", 1)))


@functools.cache
def engines() -> dict[str, Engine]:
    raw = _raw()
    return {name: _engine(name, raw[name]) for name in (VLLM, MII)}


def engine(name: str | None = None) -> Engine:
    """An engine by its `serving.engine` name; the default engine without one."""
    return engines()[name or default_engine()]


def default_engine() -> str:
    return str(_raw()["defaultEngine"])


@functools.cache
def mii_facts() -> MiiFacts:
    raw = _raw()["mii"]
    ports = raw["ports"]
    return MiiFacts(version=str(raw["deepspeedMiiVersion"]), load_balancer_port=int(ports["loadBalancer"]),
                    torch_dist_port=int(ports["torchDistributed"]), zmq_port=int(ports["zmq"]),
                    gateway_internal_port=int(ports["gatewayInternal"]), rest_path=str(raw["restPath"]),
                    fastgen_max_context=int(raw["fastgenMaxContext"]))


@functools.cache
def vllm_facts() -> VllmFacts:
    raw = _raw()["vllm"]
    return VllmFacts(entrypoint=tuple(raw["entrypoint"]), dtypes={k: str(v) for k, v in raw["dtypes"].items()},
                     health_path=str(raw["healthPath"]), env={k: str(v) for k, v in raw["env"].items()},
                     lora_ranks=tuple(sorted(int(r) for r in raw["loraRanks"])),
                     runtime_lora_env=str(raw["runtimeLoraEnv"]),
                     headless_entrypoint=tuple(raw["headlessEntrypoint"]), master_port=int(raw["masterPort"]))


def skip_await_annotation() -> str:
    """pulumi-kubernetes' annotation that skips its await logic on an object (source in the data file)."""
    return str(_raw()["pulumiKubernetes"]["skipAwait"])


def job_await_seconds() -> int:
    """How long pulumi-kubernetes awaits a Job's completion without customTimeouts (source in the data file)."""
    return int(_raw()["pulumiKubernetes"]["jobAwaitSeconds"])


class LeaderWorkerSetFacts(msgspec.Struct, frozen=True):
    version: str  # the kubernetes-sigs/lws release the stack installs
    manifest_url: str  # its release manifest, `{version}` in it


def leader_worker_set() -> LeaderWorkerSetFacts:
    raw = _raw()["leaderWorkerSet"]
    return LeaderWorkerSetFacts(version=str(raw["version"]), manifest_url=str(raw["manifestUrl"]))
