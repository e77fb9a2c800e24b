"""The workload kinds that serve rather than train: serve (a model server, vLLM or DeepSpeed-MII) and tensorboard
(a TensorBoard server of the finetune workloads' event files), each with its blocks of keys. What every kind has is
in model/workload_base.py.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

from model.workload_base import AcceleratorConfig, ResourcesConfig, WorkloadConfig


class AutoscalingConfig(msgspec.Struct, frozen=True):
    enabled: bool
    max_replicas: int
    metric: str  # `waiting` or `running`: which of vLLM's gauges (model/serving_metrics.py)
    target: int | None = None  # None: the metric's default (model/serving_metrics.py target)
    cpu_utilization: int | None = None  # refused when set: kept in the schema to say why


class OpenAiConfig(msgspec.Struct, frozen=True):
    enabled: bool
    port: int


class AllowedSource(msgspec.Struct, frozen=True):
    namespace: str | None = None
    pod_labels: dict[str, str] | None = None
    cidr: str | None = None


class AdapterFolder(msgspec.Struct, frozen=True):
    """An item of `serving.adapters` that is a folder of the bucket (trained anywhere), not a finetune workload."""

    name: str  # what clients call it
    path: str  # its folder in the bucket
    rank: int | None = None  # adapter_config.json's r; None: serving.maxLoraRank must hold it
    base: str | None = None  # adapter_config.json's base_model_name_or_path; None: not checked


class CanaryConfig(msgspec.Struct, frozen=True):
    """`serving.gateway.canary`: a share of the gateway's requests for another server (a new model version)."""

    workload: str
    percent: int


class GatewayConfig(msgspec.Struct, frozen=True):
    """`serving.gateway`: GKE Inference Gateway in front of the replicas (workloads/serving_gateway.py)."""

    enabled: bool
    access: str  # internal | external (model/serving_gateway.py gatewayClasses)
    canary: CanaryConfig | None = None


class EvaluationConfig(msgspec.Struct, frozen=True):
    """`serving.evaluation`: each served adapter scored against the base (and the adapter served now) on the user's
    held-out task by the server's evaluator container (recipes/evaluate.py), optionally gated."""

    task: str  # a JSON-lines file of the bucket: conversations, prompt/completion, alpaca or prompt/reference
    max_tokens: int  # tokens generated per prompt (evaluate.py --max-tokens)
    min_improvement: float | None = None  # the gate (in the metric's unit); None: every evaluated adapter served
    metric: str | None = None  # loglikelihood | exact_match; None: by the export's rendering (evaluate.py --metric)


# Where the evaluator container (and, read-only, the server) mounts the bucket's evals/ folder alone.
EVALS_MOUNT = "/evals"


class ServingConfig(msgspec.Struct, frozen=True):
    """`serving` of a `serve` workload (vLLM or DeepSpeed-MII)."""

    engine: str
    replicas: int
    autoscaling: AutoscalingConfig
    openai: OpenAiConfig
    service: str
    allow_from: list[AllowedSource]
    startup_minutes: int
    cache_size: str
    adapters: list[str | AdapterFolder]  # finetune workloads, or folders of the bucket, of LoRA adapters on the base
    gateway: GatewayConfig
    nodes_per_replica: int  # above 1: one replica across nodes (pipeline stages), a LeaderWorkerSet group
    port: int | None = None  # None: the engine's own (data/serving.yaml)
    model: str | None = None
    model_path: str | None = None
    from_workload: str | None = None  # a training workload of the stack whose MODEL_DIR it serves
    max_lora_rank: int | None = None  # None: the smallest vLLM rank at least the adapters' largest
    max_loras: int | None = None  # None: every served adapter
    evaluation: EvaluationConfig | None = None  # None: the adapters are served as training exports them

    @property
    def adapter_workloads(self) -> list[str]:
        """The items of `adapters` that name finetune workloads."""
        return [a for a in self.adapters if isinstance(a, str)]

    @property
    def adapter_folders(self) -> list[tuple[int, AdapterFolder]]:
        """The items of `adapters` that are folders of the bucket, with their index (their key's)."""
        return [(i, a) for i, a in enumerate(self.adapters) if isinstance(a, AdapterFolder)]


class TensorboardConfig(msgspec.Struct, frozen=True):
    """`tensorboard` of a `tensorboard` workload: whose event files the server shows, and where it listens."""

    workloads: list[str]  # finetune workloads of this stack; empty: every one that writes to the bucket
    port: int
    cpu: str  # the server's request and limit (requests = limits, as every pod of the stack)
    memory: str
    reload_seconds: int  # TensorBoard's --reload_interval


class ServeWorkloadConfig(WorkloadConfig, frozen=True, kw_only=True):
    """kind serve: a model server Deployment (vLLM, or DeepSpeed-MII) on a GKE pool."""

    serving: ServingConfig

    def hub_models(self) -> tuple[tuple[tuple[str, ...], str], ...]:
        return ((("serving", "model"), self.serving.model),) if self.serving.model else ()  # not modelPath

    def bucket_paths(self) -> tuple[tuple[tuple[str, ...], str], ...]:
        paths = ((("serving", "modelPath"), self.serving.model_path),
                 (("serving", "evaluation", "task"), self.serving.evaluation.task if self.serving.evaluation else None))
        return tuple((key, path) for key, path in paths if path is not None)

    @property
    def mount_paths(self) -> tuple[str, ...]:
        return (EVALS_MOUNT, *super().mount_paths) if self.evaluates else super().mount_paths

    @property
    def evaluates(self) -> bool:
        return self.serving.evaluation is not None

    @property
    def evaluator_apart(self) -> bool:
        """Evaluation for more than one replica (or an autoscaler): one evaluator pod of its own decides for every
        replica, and each replica loads what it decided (workloads/serving_fleet.py)."""
        s = self.serving
        return s.evaluation is not None and (s.replicas > 1 or s.autoscaling.enabled)

    @property
    def evaluator_nodes(self) -> int:
        """Nodes of the pool the evaluator's own pod takes (it runs vLLM of the whole model): 1 or 0."""
        return 1 if self.evaluator_apart else 0

    @property
    def multi_node(self) -> bool:
        """One replica spans several nodes (a LeaderWorkerSet group: workloads/serving_group.py)."""
        return self.serving.nodes_per_replica > 1

    @property
    def sized_model_name(self) -> str | None:
        # Without `model.name` the shape comes from the served Hugging Face id (data/models.yaml aliases).
        return (self.model.name if self.model else None) or self.serving.model


# What a TensorBoard server is not: it holds no accelerator, takes one small pod on the system pool, sizes no model.
NO_ACCELERATOR = AcceleratorConfig(kind="none", type="none")
NO_RESOURCES = ResourcesConfig(shm_size="0")


class TensorboardWorkloadConfig(WorkloadConfig, frozen=True, kw_only=True):
    """kind tensorboard: a TensorBoard server (one pod on the system pool, no GPU) of the event files finetune
    workloads write to the bucket (`logs/<workload>`), read through a read-only GCS FUSE mount; reached by
    `kubectl port-forward`. Its schema branch has the common keys that apply (namespace, image, gcsFuse) and
    `tensorboard`; the GPU keys are fixed here (FIXED_FIELDS), not in the config."""

    FIXED_FIELDS: ClassVar[tuple[str, ...]] = ("accelerator", "workers", "resources", "pool", "fallback_pool", "model")

    tensorboard: TensorboardConfig
    accelerator: AcceleratorConfig = NO_ACCELERATOR
    workers: int = 1
    resources: ResourcesConfig = NO_RESOURCES

    @property
    def pulls_stack_image(self) -> bool:
        # On the system pool, whose nodes pull the stack's image with the same read grant as the GPU pools'.
        return not self.image
