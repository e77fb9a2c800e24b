"""The server container's command line, ports, probes and security context, for each engine (model/
serving_engines.py, data/serving.yaml):
- vLLM: its OpenAI-compatible server (`python -m vllm.entrypoints.openai.api_server`) on the Service's port, with
  --tensor-parallel-size = the node's GPUs, --max-model-len = `model.sequenceLength`, --gpu-memory-utilization =
  the budget the planner sized within, --dtype from the precision. Probes on its own `/health` on that port:
  it listens only once the model is loaded, and answers 503 once the engine is dead.
- MII: the entry script runs MII's RESTful gateway on 127.0.0.1 only (it also serves an unauthenticated
  `GET /terminate`) and serves `POST /mii/<workload>` and `GET /health` itself on the Service's port; /health
  answers 200 only while the gateway and every model process answer, so the probes watch what clients use.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from model import serving_engines
from model.serving_engines import MII, VLLM, mii_facts, vllm_facts
from model.types import ServeWorkloadConfig
from recipes.contract_programs import SERVE
from workloads import gcs_fuse, pod_security
from workloads.placement import Placement
from workloads.serving_source import ModelSource

SERVER_SCRIPT = "serve.py"
# With evaluation, vLLM's ASGI middleware that keeps the runtime adapter endpoints to the pod itself (the evaluator).
CLIENT_ENDPOINTS_FILE = "client_endpoints.py"
CLIENT_ENDPOINTS_MIDDLEWARE = "client_endpoints.ClientEndpoints"
SCRIPT_DIR = "/app"  # where the ConfigMap with the entry script is mounted
CHAT_TEMPLATE_FILE = "chat_template.jinja"  # the adapters' named template in that ConfigMap (vLLM --chat-template)
# The image's user (workloads/images/deepspeed/Dockerfile) and its home, where HF_HOME, Triton's and torch's
# extension caches live: a scratch volume, because the root filesystem is read-only.
USER_ID = pod_security.NVIDIA_USER
HOME = "/home/deepspeed"
HF_TOKEN_DIR = "/etc/huggingface"
TOKEN_KEY = "token"
PROBE_PERIOD_SECONDS = 10


def engine_of(w: ServeWorkloadConfig) -> serving_engines.Engine:
    return serving_engines.engine(w.serving.engine)


def served_port(w: ServeWorkloadConfig) -> int:
    """The API's port: `serving.port`, else the engine's own (vLLM 8000, MII 51080)."""
    return w.serving.port or engine_of(w).port


def mii_reserved_ports(tensor_parallel: int) -> dict[int, str]:
    """Ports MII uses inside the pod, with what uses each: the configurable API ports must not take them."""
    f = mii_facts()
    ports = {f.torch_dist_port: "torch.distributed", f.zmq_port: "MII's ZMQ broadcast",
             f.load_balancer_port: "MII's load balancer", f.gateway_internal_port: "MII's RESTful gateway (127.0.0.1)"}
    for rank in range(tensor_parallel):  # one model-server port per tensor-parallel rank after the balancer's
        ports[f.load_balancer_port + 1 + rank] = f"MII's model server (rank {rank})"
    return ports


class ServerInputs(msgspec.Struct, frozen=True):
    """What the pod template is rendered from (resolved values, no Outputs)."""

    workload: ServeWorkloadConfig
    placement: Placement
    image: str
    config_map: str
    source: ModelSource
    hf_token_secret: str | None = None
    gcs: gcs_fuse.GcsMount | None = None
    # SERVER: a replica clients reach; EVALUATOR: the evaluator's own pod where it decides for a fleet
    # (workloads/serving_fleet.py).
    role: str = "server"


def rest_path(w: ServeWorkloadConfig) -> str:
    """MII's RESTful API path: `/mii/<deployment name>`; the deployment is named after the workload."""
    return f"{mii_facts().rest_path}/{w.name}"


def gpu_memory_utilization(w: ServeWorkloadConfig) -> float:
    """vLLM's memory budget per GPU: the share the planner sized the model within (data/serving.yaml)."""
    return engine_of(w).gpu_memory_utilization or 0.0


def vllm_args(w: ServeWorkloadConfig, where: Placement, source: ModelSource) -> list[str]:
    """vLLM's OpenAI server: the model, its name in the API, the Service's port, tensor-parallel over every GPU of
    the node, the planner's sequence length, memory budget and precision; then the LoRA adapters."""
    # More names after the first (nargs="+"): a canary answers for the model name of the server it shares with.
    args = ["--model", source.ref, "--served-model-name", source.served_name, *source.aliases, "--host", "0.0.0.0",
            "--port", str(served_port(w)), "--tensor-parallel-size", str(where.per_worker),
            "--gpu-memory-utilization", f"{gpu_memory_utilization(w):.2f}"]
    if w.model is not None:
        args += ["--max-model-len", str(w.model.sequence_length), "--dtype", vllm_facts().dtypes[w.model.precision]]
    if source.chat_template is not None:  # the template the adapters learned, not the base tokenizer's
        args += ["--chat-template", f"{SCRIPT_DIR}/{CHAT_TEMPLATE_FILE}"]
    return args + lora_args(source) + guard_args(source)


def guard_args(source: ModelSource) -> list[str]:
    """With evaluation, the runtime adapter endpoints answer the pod itself only (recipes/
    client_endpoints.py, loaded from the ConfigMap on PYTHONPATH): clients get the serving endpoints alone."""
    return ["--middleware", CLIENT_ENDPOINTS_MIDDLEWARE] if source.evaluated else []


def lora_args(source: ModelSource) -> list[str]:
    """vLLM's LoRA flags: room for `max_loras` adapters of rank up to `max_lora_rank` in a batch; every adapter in
    host memory (--max-cpu-loras, at least --max-loras) when a batch holds fewer than all; each NAME=PATH."""
    if not source.adapters:
        return []
    loras = source.max_loras or len(source.adapters)
    args = ["--enable-lora", "--max-lora-rank", str(source.max_lora_rank), "--max-loras", str(loras)]
    if loras < len(source.adapters):
        args += ["--max-cpu-loras", str(len(source.adapters))]
    if source.evaluated:
        return args  # the evaluator loads each adapter once scored (and again after a restart)
    # nargs="+": one flag, every NAME=PATH after it (vLLM's LoRAParserAction reads the old `name=path` form).
    return [*args, "--lora-modules", *(f"{a.name}={a.path}" for a in source.adapters)]


def mii_args(w: ServeWorkloadConfig, where: Placement, source: ModelSource) -> list[str]:
    """The MII entry script's arguments: the model, tensor-parallel over every GPU of the pod, the planner's
    sequence length as the server's max length, the Service's port and MII's gateway on 127.0.0.1."""
    s = w.serving
    return [f"{SCRIPT_DIR}/{SERVER_SCRIPT}", *SERVE.argv({
        "model": source.ref, "deployment_name": w.name, "tensor_parallel": where.per_worker,
        "port": served_port(w), "gateway_port": mii_facts().gateway_internal_port,
        "max_length": w.model.sequence_length if w.model is not None else None,
        "openai_port": s.openai.port if s.openai.enabled else None})]


def command(inp: ServerInputs) -> tuple[list[str], list[str]]:
    """The server container's command and arguments for its engine."""
    w, where = inp.workload, inp.placement
    if w.serving.engine == VLLM:
        return list(vllm_facts().entrypoint), vllm_args(w, where, inp.source)
    return ["python"], mii_args(w, where, inp.source)


def container_ports(w: ServeWorkloadConfig) -> list[dict[str, Any]]:
    ports = [{"name": "http", "containerPort": served_port(w), "protocol": "TCP"}]
    if w.serving.engine == MII and w.serving.openai.enabled:
        ports.append({"name": "openai", "containerPort": w.serving.openai.port, "protocol": "TCP"})
    return ports


def health_path(w: ServeWorkloadConfig) -> str:
    """vLLM's own /health, or the MII entry script's /health; both on the Service's port."""
    return vllm_facts().health_path if w.serving.engine == VLLM else "/health"


def probes(w: ServeWorkloadConfig) -> dict[str, dict[str, Any]]:
    """All on the port clients use: startup allows `startupMinutes` for the download and the weight load (it starts
    after the init containers, so the wait for a trained model is not counted); then readiness and liveness, which
    fail once the server or the model stops answering (vLLM: 503 from a dead engine, or no answer at all)."""
    get = {"path": health_path(w), "port": "http", "scheme": "HTTP"}
    startup_failures = math.ceil(w.serving.startup_minutes * 60 / PROBE_PERIOD_SECONDS)
    return {
        "startupProbe": {"httpGet": dict(get), "periodSeconds": PROBE_PERIOD_SECONDS,
                         "timeoutSeconds": 5, "failureThreshold": startup_failures},
        "readinessProbe": {"httpGet": dict(get), "periodSeconds": PROBE_PERIOD_SECONDS,
                           "timeoutSeconds": 5, "failureThreshold": 3, "successThreshold": 1},
        "livenessProbe": {"httpGet": dict(get), "periodSeconds": 20, "timeoutSeconds": 5,
                          "failureThreshold": 3},
    }


def hardened() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "privileged": False, "readOnlyRootFilesystem": True,
            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}
