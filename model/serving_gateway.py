"""GKE Inference Gateway facts (`serving.gateway`): data/serving_gateway.yaml, with each fact's source there."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import msgspec

from model.types import ServeWorkloadConfig, StackConfig
from model.yamlio import load_yaml

GATEWAY_PATH = Path(__file__).resolve().parent.parent / "data" / "serving_gateway.yaml"
INTERNAL, EXTERNAL = "internal", "external"


class EppFacts(msgspec.Struct, frozen=True, rename="camel"):
    image: str
    ext_proc_port: int
    health_port: int
    metrics_port: int
    failure_mode: str
    termination_grace_period_seconds: int
    user: int
    args: tuple[str, ...]
    resources: dict[str, str]
    plugins: str
    rules: tuple[dict[str, Any], ...]


class GatewayFacts(msgspec.Struct, frozen=True, rename="camel"):
    source: str
    date: str
    min_gke_version: str
    gateway_api_channel: str
    gateway_classes: dict[str, str]
    listener_port: int
    health_check_ranges: tuple[str, ...]
    epp: EppFacts
    health_check: dict[str, int]
    backend_timeout_sec: int

    def gateway_class(self, access: str) -> str:
        return self.gateway_classes[access]


def servers(cfg: StackConfig) -> list[str]:
    """The serve workloads with `serving.gateway.enabled`: the cluster then needs Gateway API, the network a
    proxy-only subnet."""
    return [name for name, w in cfg.workloads.items()
            if isinstance(w, ServeWorkloadConfig) and w.serving.gateway.enabled]


@functools.cache
def load() -> GatewayFacts:
    return msgspec.convert(load_yaml(GATEWAY_PATH), GatewayFacts)
