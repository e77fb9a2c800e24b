"""The workload kinds that train with DeepSpeed: helm (the Bitnami chart), mpijob (a Kubeflow MPIJob, NVIDIA or
Gaudi) and finetune (recipes/finetune.py as an MPIJob), with the MPIJob's shared base. Their blocks of keys are in
model/training_blocks.py; what every kind has, in model/workload_base.py.
"""

from __future__ import annotations

import shlex
from typing import ClassVar

import msgspec

from model.training_blocks import (
    ADAPTER_EXPORT,
    ChartConfig,
    DeepSpeedConfig,
    FinetuneConfig,
    GaudiConfig,
    LaunchConfig,
    ProxyConfig,
    TrainingConfig,
    eval_path,
    hub_ids,
    run_dirs,
)
from model.workload_base import GS_SCHEME, StorageClaimConfig, TrainingRun, WorkloadConfig

# The folder of a Gaudi job's claim that its ranks (the stack's image: uid 10001) make and own: HF_HOME (unset `hfHome`)
# and the output under it, one per claim for every stack's jobs (the same user; outputs are per workload).
RANKS_FOLDER = "deepspeed-stack"


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
