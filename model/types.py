"""The typed stack configuration. Field names are the snake_case of the schema's camelCase keys.

`build()` turns a schema-valid, defaults-filled dict into these objects, so components never index
into raw dicts and a renamed key fails here, not at `pulumi up`.
"""

from __future__ import annotations

import datetime
import functools
import re
import types
import typing
from typing import Any

import msgspec
import pulumi

from model.training_blocks import (
    ADAPTER_EXPORT,
    ChartConfig,
    DeepSpeedConfig,
    FinetuneConfig,
    FinetuneLoraConfig,
    GaudiConfig,
    LaunchConfig,
    ProxyConfig,
    TrainingConfig,
)
from model.workload_base import (
    AcceleratorConfig,
    GcsFuseConfig,
    LoraConfig,
    ModelConfig,
    ResourcesConfig,
    StorageClaimConfig,
    TrainingRun,
    WorkloadConfig,
)
from model.workload_serving import (
    AdapterFolder,
    AllowedSource,
    AutoscalingConfig,
    GatewayConfig,
    OpenAiConfig,
    ServeWorkloadConfig,
    ServingConfig,
    TensorboardConfig,
    TensorboardWorkloadConfig,
)
from model.workload_training import (
    DeepSpeedWorkloadConfig,
    FinetuneWorkloadConfig,
    HelmWorkloadConfig,
    MpiJobBaseConfig,
    MpiJobWorkloadConfig,
)
from model.workload_types import WORKLOAD_TYPES

# The workload classes live in model/workload_*.py and model/training_blocks.py (by kind family; the kind -> class
# table in model/workload_types.py); re-exported for `from model.types import`.
__all__ = [
    "ADAPTER_EXPORT", "WORKLOAD_TYPES", "AcceleratorConfig", "AdapterFolder", "AllowedSource", "AutoscalingConfig",
    "ChartConfig",
    "DeepSpeedConfig", "DeepSpeedWorkloadConfig", "FinetuneConfig", "FinetuneLoraConfig", "FinetuneWorkloadConfig",
    "GatewayConfig", "GaudiConfig", "GcsFuseConfig",
    "HelmWorkloadConfig", "LaunchConfig", "LoraConfig", "ModelConfig", "MpiJobBaseConfig", "MpiJobWorkloadConfig",
    "OpenAiConfig", "ProxyConfig", "ResourcesConfig", "ServeWorkloadConfig", "ServingConfig", "StackConfig",
    "StorageClaimConfig", "TensorboardConfig", "TensorboardWorkloadConfig", "TrainingConfig", "TrainingRun",
    "WorkloadConfig", "build", "camel", "key_path", "snake",
]


class AuthorizedNetwork(msgspec.Struct, frozen=True):
    cidr: str
    name: str


class SystemPool(msgspec.Struct, frozen=True):
    machine_type: str
    min_nodes: int
    max_nodes: int
    zones: list[str]


class FleetConfig(msgspec.Struct, frozen=True):
    enabled: bool
    project: str | None = None  # the fleet host project; None means gcp:project


class ClusterConfig(msgspec.Struct, frozen=True):
    name: str
    release_channel: str
    private_nodes: bool
    master_cidr: str
    private_endpoint: bool
    authorized_networks: list[AuthorizedNetwork]
    deletion_protection: bool
    dataplane_v2: bool
    system_pool: SystemPool
    fleet: FleetConfig
    location: str | None = None
    multi_networking: bool | None = None  # None: on when a pool's GPU fabric needs it
    min_master_version: str | None = None


class FlowLogsConfig(msgspec.Struct, frozen=True):
    enabled: bool
    sampling: float
    aggregation_interval: str


class ExistingNetwork(msgspec.Struct, frozen=True):
    """`network.existing`: a VPC the stack does not create (your own, or a Shared VPC host project's)."""

    network: str  # projects/P/global/networks/N
    subnetwork: str  # projects/P/regions/R/subnetworks/S
    pods_range: str
    services_range: str


class NetworkConfig(msgspec.Struct, frozen=True):
    subnet_cidr: str
    pods_cidr: str
    services_cidr: str
    fabric_cidr: str
    flow_logs: FlowLogsConfig
    proxy_only_cidr: str  # the gateway's proxy-only subnet (created only for serving.gateway)
    existing: ExistingNetwork | None = None  # None: the stack creates the VPC


class GpuConfig(msgspec.Struct, frozen=True):
    type: str
    count: int
    driver_version: str


END_KEY = "reservationEndTime"
END_TEXT_KEY = "x-reservationEndTime-text"  # not a schema key: the model's own, set beside the parsed end


class PoolFabricConfig(msgspec.Struct, frozen=True):
    enabled: bool
    installer: bool
    additional_networks: int | None = None


class NodePoolConfig(msgspec.Struct, frozen=True):
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
    fabric: PoolFabricConfig
    compact_placement: bool
    # Capacity (README, Capacity and queueing): at most one of reservation / flex-start / spot (checks/capacity.py).
    flex_start: bool
    queued_provisioning: bool
    reservation: str | None = None
    # Parsed once, where the model is built (model/reservation.py typed_end_times): aware, in UTC. The rules
    # (checks/capacity.py) say whether it is still to come.
    reservation_end_time: datetime.datetime | None = None
    # The end as the stack file wrote it, which the stack writes back out unchanged (the reservation-end CronJob's
    # --end, the capacity plan): a reformatted time would change what a reviewer diffs.
    reservation_end_text: str | None = msgspec.field(default=None, name=END_TEXT_KEY)
    max_run_duration: str | None = None


class RegistryConfig(msgspec.Struct, frozen=True):
    name: str
    keep_versions: int


class ImageConfig(msgspec.Struct, frozen=True):
    name: str
    context: str
    tag: str
    platform: str
    prebuilt: str | None = None


class GaudiImageConfig(ImageConfig, frozen=True):
    registry: str | None = None  # the push target when the stack has no gcp:project
    username: str | None = None


class KubernetesConfig(msgspec.Struct, frozen=True):
    context: str | None = None


class MpiOperatorConfig(msgspec.Struct, frozen=True):
    install: bool
    version: str


class KueueConfig(msgspec.Struct, frozen=True):
    install: bool
    version: str
    queue_name: str


class NfsProvisionerConfig(msgspec.Struct, frozen=True):
    install: bool
    path: str
    storage_class: str
    chart_version: str
    server: str | None = None


class StorageConfig(msgspec.Struct, frozen=True):
    enabled: bool
    versioning: bool
    soft_delete_days: int
    checkpoint_retention_days: int
    kubernetes_service_account: str
    bucket_name: str | None = None
    existing_bucket: str | None = None  # a bucket the stack did not create: granted on, never changed
    location: str | None = None


class VertexGpuConfig(msgspec.Struct, frozen=True):
    type: str
    count: int


class VertexLaunchConfig(msgspec.Struct, frozen=True):
    script: str
    args: list[str]


class VertexModelConfig(msgspec.Struct, frozen=True):
    """`vertex.model`: the shape of the model `vertex.finetune` trains (a workload's `model` block's naming keys)."""

    name: str | None = None
    parameters: float | None = None  # billions
    vocabulary: int | None = None
    hidden: int | None = None


class VertexConfig(msgspec.Struct, frozen=True):
    enabled: bool
    display_name: str
    machine_type: str
    gpu: VertexGpuConfig
    workers: int
    boot_disk_type: str
    boot_disk_gb: int
    spot: bool
    tensorboard: bool
    launch: VertexLaunchConfig
    deepspeed: DeepSpeedConfig  # ds_config.json of the recipe's run (with `finetune`)
    finetune: FinetuneConfig | None = None  # the recipe's keys (model/schema.yaml $defs.finetuneRun); None: launch
    model: VertexModelConfig | None = None  # the trained model's shape, where finetune.model does not say it


class NcclTestConfig(msgspec.Struct, frozen=True):
    """One entry of `ncclTests`; `name` is its key in the map."""

    name: str
    pools: list[str]
    nodes: int
    namespace: str
    benchmarks: list[str]
    min_bytes: str
    max_bytes: str


class StackConfig(msgspec.Struct, frozen=True):
    """Everything the program needs, validated. `project`/`region` come from the `gcp:` namespace."""

    project: str
    region: str
    network: NetworkConfig
    node_pools: list[NodePoolConfig]
    registry: RegistryConfig
    image: ImageConfig
    kubernetes: KubernetesConfig
    mpi_operator: MpiOperatorConfig
    nfs_provisioner: NfsProvisionerConfig
    workloads: dict[str, WorkloadConfig]
    storage: StorageConfig
    vertex: VertexConfig
    gaudi_image: GaudiImageConfig
    kueue: KueueConfig
    nccl_tests: dict[str, NcclTestConfig]
    cluster: ClusterConfig | None = None
    hf_token: pulumi.Output[str] | None = None
    registry_password: pulumi.Output[str] | None = None
    kubeconfig: pulumi.Output[str] | None = None

    @property
    def cluster_location(self) -> str:
        return (self.cluster.location if self.cluster and self.cluster.location else None) or self.region

    def pool(self, name: str) -> NodePoolConfig | None:
        return next((p for p in self.node_pools if p.name == name), None)


_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_NAMESPACED_KEY = re.compile(r"^[a-z][a-z0-9-]*:[A-Za-z0-9_-]+$")  # another package's key: gcp:project


def key_path(parts: list[Any] | tuple[Any, ...]) -> str:
    """`['nodePools', 1, 'gpu']` -> `nodePools[1].gpu`, as `pulumi config set --path` spells it (`gcp:project`
    as itself)."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not out and _NAMESPACED_KEY.match(str(part)):
            out = str(part)
        elif not _PLAIN_KEY.match(str(part)):
            out += f'["{part}"]'  # a key with dots, brackets or spaces: `workloads["a.b"]`
        else:
            out += f".{part}" if out else str(part)
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
        structs = [a for a in inner if _is_struct(a)]
        if isinstance(value, dict) and structs:  # str | Struct (serving.adapters): an object is the struct
            return _convert(structs[0], value)
        return _convert(inner[0], value)
    if origin is list:
        (item,) = typing.get_args(hint)
        return [_convert(item, v) for v in value]
    if origin is dict:
        _, item = typing.get_args(hint)
        # __struct_fields__: the names only (msgspec.structs.fields resolves every annotation, on each call).
        if _is_struct(item) and "name" in item.__struct_fields__:
            # A named map: the key is the name; a workload is built as its kind's class.
            return {k: build(_concrete(item, v), v, name=k) for k, v in value.items()}
        return {k: _convert(item, v) for k, v in value.items()}
    if _is_struct(hint):
        return build(hint, value)
    if hint is int and isinstance(value, float):
        return int(value)  # JSON Schema counts 2.0 as an integer; the model (and ds_config.json) should not
    return value


def _concrete(cls: type, data: dict[str, Any]) -> type:
    """The class to build `data` as: a workload's kind picks its class (model/workload_types.py)."""
    return WORKLOAD_TYPES[data["kind"]] if cls is WorkloadConfig else cls


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    # Resolving the string annotations compiles each one: once per class, not once per pool (`make bench`).
    return typing.get_type_hints(cls)


def build(cls: type, data: dict[str, Any], **extra: Any) -> Any:
    """Build struct `cls` from a camelCase dict (already schema-valid, defaults filled). A key with no field
    is a bug (the schema and the classes disagree), never silently dropped."""
    hints = _type_hints(cls)
    kwargs = dict(extra)
    keys = _field_keys(cls)
    unknown = sorted(set(data) - set(keys.values()))
    if unknown:
        raise TypeError(f"{cls.__name__} has no field for the schema key(s) {', '.join(unknown)}")
    for name, key in keys.items():
        if name in kwargs or key not in data:
            continue
        kwargs[name] = _convert(hints[name], data[key])
    return cls(**kwargs)


@functools.cache
def _field_keys(cls: type) -> dict[str, str]:
    """Each field of `cls` and the schema key it is read from (camelCase, or the name its `msgspec.field` gives)."""
    return {f.name: f.encode_name if f.encode_name != f.name else camel(f.name) for f in msgspec.structs.fields(cls)}


def _is_struct(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, msgspec.Struct)
