"""How clients reach a model server: its selector, the Service's ports, the NetworkPolicy's peers, the in-cluster
endpoint, the port-forward and prompt commands, and when `pulumi up` must not wait for it.
"""

from __future__ import annotations

from typing import Any

from model import serving_engines
from model.serving_engines import MII, VLLM
from model.types import AllowedSource, ServeWorkloadConfig
from recipes.contract_programs import SEND_PROMPT
from workloads import serving_group
from workloads.placement import labels
from workloads.serving_command import rest_path, served_port
from workloads.serving_source import ModelSource

COMPONENT_LABEL = "app.kubernetes.io/component"


def selector(w: ServeWorkloadConfig) -> dict[str, str]:
    return {"deepspeed-stack/workload": w.name, COMPONENT_LABEL: "server"}


def api_selector(w: ServeWorkloadConfig) -> dict[str, str]:
    """The pods that serve the API: every server pod, or of a replica across nodes its group's leader alone
    (workloads/serving_group.py)."""
    return serving_group.leader_selector(selector(w)) if w.multi_node else selector(w)


def pod_labels(w: ServeWorkloadConfig) -> dict[str, str]:
    return {**labels(w), **selector(w)}


def network_peers(sources: list[AllowedSource]) -> list[dict[str, Any]]:
    """`serving.allowFrom` as NetworkPolicy peers."""
    peers = []
    for src in sources:
        if src.cidr:
            peers.append({"ipBlock": {"cidr": src.cidr}})
            continue
        peer: dict[str, Any] = {}
        if src.namespace:
            peer["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": src.namespace}}
        if src.pod_labels:
            peer["podSelector"] = {"matchLabels": dict(src.pod_labels)}
        peers.append(peer)
    return peers


def service_ports(w: ServeWorkloadConfig) -> list[dict[str, Any]]:
    ports = [{"name": "http", "port": served_port(w), "targetPort": "http", "protocol": "TCP"}]
    if w.serving.engine == MII and w.serving.openai.enabled:
        ports.append({"name": "openai", "port": w.serving.openai.port, "targetPort": "openai", "protocol": "TCP"})
    return ports


def endpoint(w: ServeWorkloadConfig) -> str:
    """What clients in the cluster call: vLLM's OpenAI API root, or MII's RESTful path."""
    path = "/v1" if w.serving.engine == VLLM else rest_path(w)
    return f"http://{w.name}.{w.namespace}.svc.cluster.local:{served_port(w)}{path}"


def port_forward_command(w: ServeWorkloadConfig) -> str:
    return f"kubectl -n {w.namespace} port-forward svc/{w.name} {served_port(w)}:{served_port(w)}"


def prompt_command(w: ServeWorkloadConfig, source: ModelSource, prompt: str = "What is DeepSpeed?") -> str:
    """How to send one prompt through the port-forward (recipes/send_prompt.py)."""
    url = f"http://localhost:{served_port(w)}"
    if w.serving.engine == VLLM:
        # The way it was trained: a model fine-tuned through a chat template on the chat endpoint.
        values = {"openai": True, "chat": source.chat, "url": url, "model": source.default_model}
    else:
        values = {"url": url, "deployment": w.name}
    # Words joined as a person types them, the prompt in double quotes (a question mark needs no escape there).
    return " ".join(["python -m recipes.send_prompt", *SEND_PROMPT.argv(values), f'"{prompt}"'])


def skips_await(source: ModelSource) -> bool:
    """A server of a model training has not written yet: `pulumi up` must not wait for its pods (they stay in Init
    until the marker exists), so its Deployment and Service carry pulumi-kubernetes' skipAwait annotation."""
    return source.waits_for_training


def await_annotations(source: ModelSource) -> dict[str, str] | None:
    return {serving_engines.skip_await_annotation(): "true"} if skips_await(source) else None
