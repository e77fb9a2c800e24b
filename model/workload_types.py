"""The typed workloads: one class per workload kind, each with only its kind's keys (model/schema.yaml's
`workloads` entries: the keys every kind has, plus one branch per kind).

`WORKLOAD_TYPES` maps each kind to its class; the loader (model/types.py `build`) picks the class by the entry's
`kind`. What a kind does (its rules, its builder, its summary) lives in its module under workloads/kinds/; this
module holds only what the config says, and the few facts about it that layers below the kinds ask for (which
accelerator, whether it runs as an MPIJob, what it mounts), as properties, so nothing compares kind names.
"""

from __future__ import annotations

import re
import shlex
from typing import ClassVar

import msgspec

GS_SCHEME = "gs://"  # a Cloud Storage URI: gs://BUCKET/PATH
# The folder of a Gaudi job's claim that its ranks (the stack's image: uid 10001) make and own: HF_HOME (unset `hfHome`)
# and the output under it, one per claim for every stack's jobs (the same user; outputs are per workload).
RANKS_FOLDER = "deepspeed-stack"
# A Hugging Face repo id: OWNER/NAME, each of letters, digits, '-', '_', '.' (huggingface_hub's validate_repo_id);
# a path (/data/..., ./x, ../x) or a URL (gs://...) is none.
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


def hub_ids(tokens: list[str]) -> list[tuple[int, str]]:
    """(index, id) of each script argument that names a Hugging Face repo id, alone or as `--flag=ID`: a training
    script given one downloads it (finetune.py's --model, and the `--model_name_or_path` of most others)."""
    found = []
    for j, token in enumerate(tokens):
        value = token.split("=", 1)[1] if token.startswith("-") and "=" in token else token
        if HUB_ID.fullmatch(value):
            found.append((j, value))
    return found


class AcceleratorConfig(msgspec.Struct, frozen=True):
    kind: str
    type: str
    count: int | None = None


class GaudiConfig(msgspec.Struct, frozen=True):
    software_version: str
    pytorch_version: str
    os: str
    install_at_start: bool


class ChartConfig(msgspec.Struct, frozen=True):
    version: str
    repository: str
    client_gpu: bool  # the client on the workers' GPU pool (else on the system pool, CPU and memory only)


class ResourcesConfig(msgspec.Struct, frozen=True):
    shm_size: str
    cpu: str | None = None
    memory: str | None = None
    hugepages2_mi: str | None = None


class LaunchConfig(msgspec.Struct, frozen=True):
    script: str
    args: list[str]
    command: str | None = None


# Not a schema key (the schema refuses a stack file that writes it): the config reader's record of what was written.
WRITTEN_KEY = "x-written"


class LoraConfig(msgspec.Struct, frozen=True):
    enabled: bool
    rank: int
    alpha: float
    dropout: float
    target_modules: list[str]


class FinetuneLoraConfig(LoraConfig, frozen=True):
    """`finetune.lora`: LoRA's settings, and what MODEL_DIR holds at the end."""

    export: str  # ADAPTER_EXPORT (peft's adapter folder) or "merged" (a whole model)


ADAPTER_EXPORT = "adapter"


class TrainingConfig(msgspec.Struct, frozen=True):
    model: str
    dataset: str
    epochs: int
    script: str
    optimum_habana_version: str
    args: list[str]
    lora: LoraConfig
    # The keys of `training` the stack file wrote (the config reader fills it: model/config.py written_training):
    # a key beside `finetune` is refused even at its default value, which the value alone cannot tell from none.
    written: tuple[str, ...] = msgspec.field(default=(), name=WRITTEN_KEY)


class StorageClaimConfig(msgspec.Struct, frozen=True):
    claim_name: str
    storage_class: str
    size: str
    access_mode: str
    mount_path: str


class ProxyConfig(msgspec.Struct, frozen=True):
    http: str
    https: str
    no_proxy: str


class DeepSpeedConfig(msgspec.Struct, frozen=True):
    zero_stage: int
    offload_optimizer: str
    offload_params: str
    nvme_path: str
    precision: str
    micro_batch_per_gpu: int
    gradient_accumulation: int
    reduce_bucket_size: int
    allgather_bucket_size: int
    steps_per_print: int
    learning_rate: float
    gradient_clipping: float
    train_batch_size: int | None = None


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


class FinetuneConfig(msgspec.Struct, frozen=True):
    """`finetune` of a `finetune` workload: what recipes/finetune.py trains on what (the fine-tuning
    contract's arguments, from typed keys)."""

    format: str
    record_format: str  # finetune_data.py's RECORD_FORMATS
    roles: dict[str, str]  # the data's role names -> system | user | assistant
    chat_template: str  # auto | raw | a template of data/chat_templates.yaml
    sequence_length: int
    save_steps: int
    gradient_checkpointing: bool
    lora: FinetuneLoraConfig
    model: str | None = None  # a Hugging Face model id
    model_path: str | None = None  # or a folder of the stack's bucket
    dataset: str | None = None  # a Hugging Face dataset id
    dataset_path: str | None = None  # or a file or folder of the stack's bucket
    text_field: str | None = None  # None: finetune.py's default, `text`
    prompt_field: str | None = None
    response_field: str | None = None
    messages_field: str | None = None  # None: the record format's own (messages, sharegpt conversations)
    role_field: str | None = None
    content_field: str | None = None
    eval_split: float | str | None = None  # a fraction of the records, or a file or folder of the bucket
    epochs: float | None = None  # None with max_steps None: finetune.py's default, one pass
    max_steps: int | None = None
    lr_scheduler: str | None = None  # None: the Trainer's own, linear
    dataset_tokens: int | None = None  # the data's token count, for the run's estimate (planner/run_estimate.py)
    # None: finetune.py's --packing auto (text records packed into blocks, chat and prompt/completion not); true:
    # chat and prompt/completion records in padding-free batches too; false: nothing packed.
    packing: bool | None = None


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


class DeepSpeedWorkloadConfig(WorkloadConfig, frozen=True, kw_only=True):
    """A workload that trains with DeepSpeed: a launch command and a generated ds_config.json."""

    launch: LaunchConfig
    deepspeed: DeepSpeedConfig

    @property
    def mount_paths(self) -> tuple[str, ...]:
        return (self.deepspeed.nvme_path,)

    def hub_models(self) -> tuple[tuple[tuple[str, ...], str], ...]:
        """The Hugging Face ids its script's arguments name (`launch.args`, or the words of `launch.command`): what
        `make gpus MODE=training` writes (`--model meta-llama/...`) downloads that model on every rank."""
        found = [(("launch", "args", j), model_id) for j, model_id in hub_ids(self.launch.args)]
        if self.launch.command:
            try:
                words = shlex.split(self.launch.command)
            except ValueError:  # an unbalanced quote: the words as written
                words = self.launch.command.split()
            found += [(("launch", "command"), model_id) for _, model_id in hub_ids(words)]
        return tuple(found)


class HelmWorkloadConfig(DeepSpeedWorkloadConfig, frozen=True, kw_only=True):
    """kind helm: the Bitnami DeepSpeed chart (a client and SSH workers) on a GKE pool."""

    chart: ChartConfig

    def nodes_needed(self) -> tuple[int, str]:
        if self.chart.client_gpu:
            return self.workers + 1, f"{self.workers} worker(s) + 1 client (chart.clientGpu)"
        return self.workers, f"{self.workers} worker(s)"  # the chart's client runs on the system pool


def eval_path(f: FinetuneConfig) -> str | None:
    """`evalSplit` when it names a file or folder, not a fraction (a number, or text that reads as one: `pulumi config
    set` may store 0.05 as text)."""
    value = f.eval_split
    if not isinstance(value, str):
        return None
    try:
        float(value)
    except ValueError:
        return value
    return None


def run_dirs(root: str, name: str) -> tuple[str, str]:
    """The fine-tuning contract's layout under an output root, on every platform (GKE's bucket or claim, Gaudi's
    claim, Vertex AI's bucket): CHECKPOINT_DIR <root>/checkpoints/<name> and MODEL_DIR <root>/models/<name>."""
    base = root.rstrip("/")
    return f"{base}/checkpoints/{name}", f"{base}/models/{name}"

class MpiJobBaseConfig(DeepSpeedWorkloadConfig, frozen=True, kw_only=True):
    """A workload that runs as a Kubeflow MPIJob (workloads/mpijob/shape.py): a launcher and workers on a shared
    volume claim (`storage`, with HF_HOME on it), behind a proxy where the cluster has one. A kind built on the
    MPIJob subclasses this with its own keys (and merges these keys into its branch of model/schema.yaml)."""

    runs_as_mpijob: ClassVar[bool] = True

    storage: StorageClaimConfig
    hf_home: str  # kind mpijob: unset ("") is the stack's choice, `cache_home`
    proxy: ProxyConfig

    @property
    def claim(self) -> StorageClaimConfig | None:
        return self.storage

    @property
    def mount_paths(self) -> tuple[str, ...]:
        return (self.storage.mount_path, *super().mount_paths)

    @property
    def shares_host_ipc(self) -> bool:
        """Whether the workers share the host's IPC namespace (a kind with a `hostIPC` key says)."""
        return False

    def bucket_paths(self) -> tuple[tuple[tuple[str, ...], str], ...]:
        # `launch.script` in the bucket: `gs://BUCKET/PATH.py`, or a path under the bucket's mount
        # (workloads/mpijob/script_source.py).
        script, mount = self.launch.script, self.gcs_fuse.mount_path.rstrip("/") + "/"
        if script.startswith(GS_SCHEME):
            return ((("launch", "script"), script[len(GS_SCHEME):].partition("/")[2]),)
        if script.startswith(mount):
            return ((("launch", "script"), script[len(mount):]),)
        return ()

    @property
    def ranks_root(self) -> str:
        """The folder of the claim under which the ranks keep what they write by default (caches, outputs)."""
        return self.storage.mount_path.rstrip("/") or "/"

    @property
    def cache_home(self) -> str:
        """HF_HOME (the model and dataset caches: HF_HUB_CACHE and HF_DATASETS_CACHE default to folders of it):
        `hfHome`, or, unset, `huggingface` under the ranks' folder."""
        return self.hf_home or f"{self.ranks_root.rstrip('/')}/huggingface"

    # The fine-tuning contract's layout (run_dirs): CHECKPOINT_DIR=<out>/checkpoints/<workload>,
    # MODEL_DIR=<out>/models/<workload>.
    @property
    def output_root(self) -> str:
        """Where CHECKPOINT_DIR and MODEL_DIR live in the pods: the bucket's mount, else the claim's."""
        root = self.gcs_fuse.mount_path if self.gcs_fuse.enabled else self.storage.mount_path
        return root.rstrip("/") or "/"

    @property
    def model_folder(self) -> str:
        """MODEL_DIR relative to the output root (the bucket, or the claim): what a server of the result reads."""
        return run_dirs("", self.name)[1].lstrip("/")

    @property
    def checkpoint_dir(self) -> str:
        return run_dirs(self.output_root, self.name)[0]

    @property
    def model_dir(self) -> str:
        return run_dirs(self.output_root, self.name)[1]


class MpiJobWorkloadConfig(MpiJobBaseConfig, frozen=True, kw_only=True):
    """kind mpijob: a Kubeflow v2beta1 MPIJob, on NVIDIA GPUs of a GKE pool (`launch`) or on Gaudi nodes of an
    existing cluster (`gaudi`, `training`: optimum-habana's fine-tuning run)."""

    gaudi: GaudiConfig
    host_ipc: bool = msgspec.field(name="hostIPC")
    training: TrainingConfig
    env: dict[str, str]  # Gaudi: every rank's environment (DS_ENV_FILE)
    # Gaudi: the recipe's keys (finetune.py on HPU) instead of `training`'s optimum-habana example; None: `training`.
    finetune: FinetuneConfig | None = None

    @property
    def shares_host_ipc(self) -> bool:
        return self.host_ipc

    @property
    def installs_at_start(self) -> bool:
        """Omnia's original Gaudi path (opt-in): Habana's stock image, software installed at every start, as root."""
        return self.on_gaudi and self.gaudi.install_at_start

    def hub_models(self) -> tuple[tuple[tuple[str, ...], str], ...]:
        # Only Omnia's Gaudi trainer (no launch.command) downloads `training.model`, and the recipe `finetune.model`;
        # any script its arguments' ids.
        if self.on_gaudi and self.finetune is not None:
            recipe = ((("finetune", "model"), self.finetune.model),) if self.finetune.model else ()
            return (*recipe, *super().hub_models())
        trainer = ((("training", "model"), self.training.model),) if self.on_gaudi and not self.launch.command else ()
        return (*trainer, *super().hub_models())

    @property
    def training_run(self) -> TrainingRun | None:
        """On Gaudi, what the run's own keys add: the recipe's sequence length, gradient checkpointing and LoRA (as
        kind finetune's, with or without a `model` block), or with a `model` block Omnia's run_lora_clm.py with
        `training.lora`; LoRA trains (and checkpoints) the adapters alone, not the whole model."""
        if not self.on_gaudi or self.launch.command:
            return None
        if self.finetune is not None:  # sized with or without a `model` block, as kind finetune
            f = self.finetune
            return TrainingRun(f.sequence_length, f.gradient_checkpointing, f.lora if f.lora.enabled else None,
                               ("finetune", "gradientCheckpointing"))
        lora = self.training.lora
        if self.model is None or not lora.enabled:
            return None
        return TrainingRun(self.model.sequence_length, False, lora, ("training", "args"))

    @property
    def sized_model_name(self) -> str | None:
        # The recipe on Gaudi: without `model.name`, the Hugging Face id it fine-tunes, as kind finetune.
        recipe = self.finetune.model if self.on_gaudi and self.finetune is not None else None
        return (self.model.name if self.model else None) or recipe

    @property
    def sized_model_key(self) -> tuple[str, ...]:
        if (self.model is not None and self.model.name) or not (self.on_gaudi and self.finetune is not None):
            return ("model", "name")
        return ("finetune", "model")

    @property
    def runs_stack_gaudi_image(self) -> bool:
        """The default Gaudi path: the stack's Gaudi image (or an `image` built from it), hardened."""
        return self.on_gaudi and not self.gaudi.install_at_start

    @property
    def ranks_root(self) -> str:
        # The stack's Gaudi image runs the ranks as uid 10001 on a claim of an existing cluster, whose folders
        # another run may have made first as root (Omnia's by-hand run: /storage/huggingface). They write under a
        # folder they make and own; NFS volumes take no fsGroup (kubernetes/kubernetes#96900) and root_squash
        # turns a root pod's chown into nobody's, so only the NFS server's admin could change a folder's owner.
        mount = super().ranks_root
        return f"{mount.rstrip('/')}/{RANKS_FOLDER}" if self.runs_stack_gaudi_image else mount

    @property
    def output_root(self) -> str:
        return self.ranks_root if self.runs_stack_gaudi_image else super().output_root

    @property
    def writes_model(self) -> bool:
        # An NVIDIA MPIJob that runs the project's finetune.py as it comes (e.g. what `make gpus MODE=training`
        # writes) keeps the contract; any other script or command is the user's, and may write nothing.
        return self.on_nvidia and not self.launch.command and self.launch.script == "finetune.py"


class FinetuneWorkloadConfig(MpiJobBaseConfig, frozen=True, kw_only=True):
    """kind finetune: an NVIDIA MPIJob whose ranks run recipes/finetune.py (the Hugging Face Trainer under
    DeepSpeed) with the `finetune` keys; checkpoints and the finished model go to the bucket (its GCS FUSE mount)
    or, without one, to the shared claim."""

    finetune: FinetuneConfig
    local_checkpoints: bool  # tiered saves: the node's local SSDs first, then copied to CHECKPOINT_DIR

    @property
    def writes_model(self) -> bool:
        return True  # finetune.py, or a copy that keeps its contract (launch.script)

    def hub_models(self) -> tuple[tuple[tuple[str, ...], str], ...]:
        """The Hugging Face model ids its pods download, with their keys (a gated one needs hfToken)."""
        given = ((("finetune", "model"), self.finetune.model),) if self.finetune.model else ()
        return (*given, *super().hub_models())

    @property
    def exports_adapter(self) -> bool:
        """MODEL_DIR holds a LoRA adapter (served on the base model), not a whole model."""
        lora = self.finetune.lora
        return lora.enabled and lora.export == ADAPTER_EXPORT

    def bucket_paths(self) -> tuple[tuple[tuple[str, ...], str], ...]:
        f = self.finetune
        given = ((("finetune", "modelPath"), f.model_path), (("finetune", "datasetPath"), f.dataset_path),
                 (("finetune", "evalSplit"), self.eval_path))
        return (*super().bucket_paths(), *((key, path) for key, path in given if path is not None))

    @property
    def eval_path(self) -> str | None:
        """`evalSplit` when it names a file of the bucket (eval_path)."""
        return eval_path(self.finetune)

    @property
    def sized_model_name(self) -> str | None:
        # Without `model.name`, the Hugging Face id it fine-tunes (data/models.yaml aliases); a bucket folder
        # (modelPath) names no shape.
        return (self.model.name if self.model else None) or self.finetune.model

    @property
    def sized_model_key(self) -> tuple[str, ...]:
        return ("model", "name") if self.model is not None and self.model.name else ("finetune", "model")

    @property
    def training_run(self) -> TrainingRun:
        """Sized with or without a `model` block: at finetune.sequenceLength, LoRA as LoRA, recomputing
        activations as finetune.gradientCheckpointing says."""
        f = self.finetune
        return TrainingRun(f.sequence_length, f.gradient_checkpointing, f.lora if f.lora.enabled else None,
                           ("finetune", "gradientCheckpointing"))


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


# The one kind -> class table: a new kind adds its class here and its branch in model/schema.yaml.
WORKLOAD_TYPES: dict[str, type[WorkloadConfig]] = {
    "helm": HelmWorkloadConfig,
    "mpijob": MpiJobWorkloadConfig,
    "finetune": FinetuneWorkloadConfig,
    "serve": ServeWorkloadConfig,
    "tensorboard": TensorboardWorkloadConfig,
}
