"""The typed stack configuration. Field names are the snake_case of the schema's camelCase keys.

`build()` turns a schema-valid, defaults-filled dict into these objects, so components never index
into raw dicts and a renamed key fails here, not at `pulumi up`.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any

import pulumi


@dataclass(frozen=True)
class AuthorizedNetwork:
    cidr: str
    name: str = ""


@dataclass(frozen=True)
class SystemPool:
    machine_type: str
    min_nodes: int
    max_nodes: int
    zones: list[str]


@dataclass(frozen=True)
class ClusterConfig:
    name: str
    release_channel: str
    private_nodes: bool
    master_cidr: str
    private_endpoint: bool
    authorized_networks: list[AuthorizedNetwork]
    deletion_protection: bool
    dataplane_v2: bool
    system_pool: SystemPool
    location: str | None = None


@dataclass(frozen=True)
class NetworkConfig:
    subnet_cidr: str
    pods_cidr: str
    services_cidr: str


@dataclass(frozen=True)
class GpuConfig:
    type: str
    count: int
    driver_version: str


@dataclass(frozen=True)
class NodePoolConfig:
    name: str
    machine_type: str
    gpu: GpuConfig
    spot: bool
    min_nodes: int
    max_nodes: int
    zones: list[str]
    local_ssd_count: int
    disk_size_gb: int
    disk_type: str
    labels: dict[str, str]


@dataclass(frozen=True)
class RegistryConfig:
    name: str
    keep_versions: int


@dataclass(frozen=True)
class ImageConfig:
    name: str
    context: str
    tag: str
    platform: str
    prebuilt: str | None = None


@dataclass(frozen=True)
class StackConfig:
    """Everything the program needs, validated. `project`/`region` come from the `gcp:` namespace."""

    project: str
    region: str
    network: NetworkConfig
    node_pools: list[NodePoolConfig]
    registry: RegistryConfig
    image: ImageConfig
    cluster: ClusterConfig | None = None
    hf_token: pulumi.Output[str] | None = field(default=None, compare=False)

    @property
    def cluster_location(self) -> str:
        return (self.cluster.location if self.cluster and self.cluster.location else None) or self.region

    def pool(self, name: str) -> NodePoolConfig | None:
        return next((p for p in self.node_pools if p.name == name), None)


def key_path(parts: list[Any] | tuple[Any, ...]) -> str:
    """`['nodePools', 1, 'gpu']` -> `nodePools[1].gpu`, as `pulumi config set --path` spells it."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _convert(hint: Any, value: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        return _convert(inner[0], value)
    if origin is list:
        (item,) = typing.get_args(hint)
        return [_convert(item, v) for v in value]
    if origin is dict:
        _, item = typing.get_args(hint)
        return {k: _convert(item, v) for k, v in value.items()}
    if dataclasses.is_dataclass(hint):
        return build(hint, value)
    return value


def build(cls: type, data: dict[str, Any], **extra: Any) -> Any:
    """Build dataclass `cls` from a camelCase dict (already schema-valid, defaults filled)."""
    hints = typing.get_type_hints(cls)
    kwargs = dict(extra)
    for f in dataclasses.fields(cls):
        key = camel(f.name)
        if f.name in kwargs or key not in data:
            continue
        kwargs[f.name] = _convert(hints[f.name], data[key])
    return cls(**kwargs)
