"""What every workload kind has: the blocks of keys common to every entry of `workloads` (model/schema.yaml), and
`WorkloadConfig`, the base class each kind's class adds its own keys to (model/workload_training.py,
model/workload_serving.py; the kind -> class table is model/workload_types.py).

Its properties are the facts about a workload that layers below the kinds ask for (which accelerator, what it mounts,
what the planner sizes), each answered for the kinds that have nothing of their own to say; a kind's class overrides
the ones it changes, so nothing compares kind names.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

GS_SCHEME = "gs://"  # a Cloud Storage URI: gs://BUCKET/PATH


class AcceleratorConfig(msgspec.Struct, frozen=True):
    kind: str
    type: str
    count: int | None = None


class ResourcesConfig(msgspec.Struct, frozen=True):
    shm_size: str
    cpu: str | None = None
    memory: str | None = None
    hugepages2_mi: str | None = None


class LoraConfig(msgspec.Struct, frozen=True):
    enabled: bool
    rank: int
    alpha: float
    dropout: float
    target_modules: list[str]


class StorageClaimConfig(msgspec.Struct, frozen=True):
    claim_name: str
    storage_class: str
    size: str
    access_mode: str
    mount_path: str


class ModelConfig(msgspec.Struct, frozen=True):
    precision: str
    mode: str
    sequence_length: int
    batch_size: int
    name: str | None = None
    parameters: float | None = None
    vocabulary: int | None = None
    hidden: int | None = None
    largest_layer: float | None = None  # millions


class GcsFuseConfig(msgspec.Struct, frozen=True):
    enabled: bool
    mount_path: str


class TrainingRun(msgspec.Struct, frozen=True):
    """How a workload's own keys say it trains, where they say more than its `model` block (kind finetune): what
    the planner sizes it by, and the keys that say so (under the workload)."""

    sequence_length: int
    gradient_checkpointing: bool
    lora: LoraConfig | None  # None: every parameter trains
    checkpointing_key: tuple[str, ...]


# --- the workloads ------------------------------------------------------------------------------------
# kw_only: a kind's class adds its keys to the base's, in any order, and the loader passes every key by name.


class WorkloadConfig(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of `workloads`, with the keys every kind has; `name` is its key in the map. The class of the
    entry's kind (WORKLOAD_TYPES) adds its own."""

    # Whether the workload runs as a Kubeflow MPIJob: it needs the MPI operator (and its CRD), Kueue can queue it,
    # and it may run on an existing cluster (workloads/target.py).
    runs_as_mpijob: ClassVar[bool] = False

    name: str
    kind: str
    namespace: str
    accelerator: AcceleratorConfig
    workers: int
    resources: ResourcesConfig
    gcs_fuse: GcsFuseConfig
    pool: str | None = None
    fallback_pool: str | None = None
    image: str | None = None
    model: ModelConfig | None = None

    @property
    def on_gaudi(self) -> bool:
        """Habana Gaudi cards (`habana.ai/gaudi`) on an existing cluster."""
        return self.accelerator.kind == "gaudi"

    @property
    def on_nvidia(self) -> bool:
        """NVIDIA GPUs of a GKE pool (`nvidia.com/gpu`)."""
        return self.accelerator.kind == "nvidia"

    @property
    def pulls_stack_image(self) -> bool:
        """Its pods run the stack's built image (NVIDIA, no `image` of its own): they wait for its read grant."""
        return self.on_nvidia and not self.image

    @property
    def claim(self) -> StorageClaimConfig | None:
        """The shared volume claim its pods mount (`storage`), for the kinds that have one."""
        return None

    @property
    def mount_paths(self) -> tuple[str, ...]:
        """Paths its pods mount besides the bucket (a GCS FUSE mount must not take one)."""
        return ()

    @property
    def evaluates(self) -> bool:
        """Its pod runs an evaluator container beside the main one (its requests count in the pod's fit)."""
        return False

    def nodes_needed(self) -> tuple[int, str]:
        """Nodes its pods take at once (each worker's CPU and memory are fitted to a whole node), and who."""
        return self.workers, f"{self.workers} worker(s)"

    def hub_models(self) -> tuple[tuple[tuple[str, ...], str], ...]:
        """The Hugging Face model ids its pods download at start, each with the key (under the workload) that
        names it: a gated one needs the stack's hfToken (checks/gated.py)."""
        return ()

    def bucket_paths(self) -> tuple[tuple[tuple[str, ...], str], ...]:
        """The paths in the stack's bucket its pods read (each relative to the bucket's root, as the key gives it),
        each with the key (under the workload) that names it: one that leaves the bucket is refused
        (checks/workloads.py)."""
        return ()

    @property
    def sized_model_name(self) -> str | None:
        """The name the planner sizes: `model.name` (a kind may know it from elsewhere)."""
        return self.model.name if self.model else None

    @property
    def sized_model_key(self) -> tuple[str, ...]:
        """The key (under the workload) that names the model the planner sizes: `model.name`."""
        return ("model", "name")

    @property
    def training_run(self) -> TrainingRun | None:
        """What its own keys say about the run the planner sizes (None: the `model` block says it all, and a
        workload without one is not sized)."""
        return None

    @property
    def model_folder(self) -> str | None:
        """Where the workload writes the model it trains, relative to its output root (the bucket's mount with
        `gcsFuse.enabled`, else its claim): `models/<name>` (MODEL_DIR of the fine-tuning contract); None for a
        workload that has no MODEL_DIR."""
        return None

    @property
    def writes_model(self) -> bool:
        """Whether what it runs writes a model a server can load into MODEL_DIR, `.complete` last (the fine-tuning
        contract's script): what a `serve` workload's `serving.fromWorkload` may name."""
        return False
