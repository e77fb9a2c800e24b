"""The generated DeepSpeed `ds_config.json`, from a workload's typed `deepspeed` block.

One function builds it for both workload kinds (the Helm release ships it in its source ConfigMap,
the MPIJob mounts it), and one function checks the batch arithmetic before anything is deployed:
DeepSpeed asserts `train_batch_size == micro_batch_per_gpu * gradient_accumulation_steps * world_size`
at start-up, and a wrong total surfaces there as the opaque "Micro batch size per gpu: 0" assertion.

Keys and meanings follow https://www.deepspeed.ai/docs/config-json/ (checked 2025-08).
"""

from __future__ import annotations

from typing import Any

from model.problems import Problem
from model.types import DeepSpeedConfig

# fp16 dynamic loss scaling: loss_scale 0 means dynamic; the rest are DeepSpeed's documented defaults,
# written out so the file says what runs.
FP16_LOSS_SCALE_WINDOW = 1000
FP16_INITIAL_SCALE_POWER = 16
FP16_HYSTERESIS = 2
FP16_MIN_LOSS_SCALE = 1
# Stage 3: prefetch ~ reduce bucket; keep parameters below 1e5 elements unpartitioned (DeepSpeed's default
# threshold) so small layers are not gathered every step; save 16-bit weights so checkpoints load without
# zero_to_fp32.py.
STAGE3_PREFETCH_BUCKET_SIZE = 50_000_000
STAGE3_PARAM_PERSISTENCE_THRESHOLD = 100_000
STAGE3_MAX_LIVE_PARAMETERS = 1_000_000_000
STAGE3_MAX_REUSE_DISTANCE = 1_000_000_000
# AdamW's usual constants (also the Hugging Face Trainer's defaults).
ADAM_BETAS = [0.9, 0.999]
ADAM_EPS = 1e-8
HF_AUTO = "auto"


def train_batch_size(ds: DeepSpeedConfig, workers: int, per_worker: int) -> int:
    """workers x GPUs per worker x micro batch per GPU x gradient accumulation steps."""
    return workers * per_worker * ds.micro_batch_per_gpu * ds.gradient_accumulation


def batch_problems(path: str, ds: DeepSpeedConfig, workers: int, per_worker: int) -> list[Problem]:
    """The train_batch_size arithmetic; `path` is the workload's key prefix, e.g. `workloads.train`."""
    if ds.train_batch_size is None:
        return []
    expected = train_batch_size(ds, workers, per_worker)
    if ds.train_batch_size == expected:
        return []
    return [Problem(f"{path}.deepspeed.trainBatchSize",
                    f"{ds.train_batch_size} must equal {path}.workers ({workers}) x "
            f"accelerators per worker ({per_worker}) x {path}.deepspeed.microBatchPerGpu ({ds.micro_batch_per_gpu}) x "
            f"{path}.deepspeed.gradientAccumulation ({ds.gradient_accumulation}) = {expected}; "
            "DeepSpeed would stop at start-up (\"Micro batch size per gpu: 0\" or a batch size assertion). "
            "Remove trainBatchSize to have it computed")]


NVME_VOLUME = "nvme-offload"


def nvme_offload_path(ds: DeepSpeedConfig) -> str | None:
    """Where offloaded states go when either offload targets nvme; the pods must mount something there."""
    return ds.nvme_path if "nvme" in (ds.offload_optimizer, ds.offload_params) else None


def nvme_volume(ds: DeepSpeedConfig) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """An emptyDir at nvme_path (volume, mount): on a GKE pool with local SSD ephemeral storage it lives on
    the local NVMe SSDs; the containers' root filesystem is read-only or slow, never the place for it."""
    path = nvme_offload_path(ds)
    if path is None:
        return None
    return {"name": NVME_VOLUME, "emptyDir": {}}, {"name": NVME_VOLUME, "mountPath": path}


def _offload(device: str, ds: DeepSpeedConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"device": device, "pin_memory": True}
    if device == "nvme":
        out["nvme_path"] = ds.nvme_path
    return out


# Scripts that run the Hugging Face Trainer: their ds_config.json leaves the Trainer's values to it ("auto").
HF_TRAINER_SCRIPTS = frozenset({"finetune.py"})


def runs_hf_trainer(script: str | None) -> bool:
    """Whether the workload's launch script is one of the stack's Hugging Face Trainer scripts."""
    return bool(script) and script.rsplit("/", 1)[-1] in HF_TRAINER_SCRIPTS


def zero_optimization(ds: DeepSpeedConfig, hf_trainer: bool = False) -> dict[str, Any]:
    """The `zero_optimization` block for stages 0-3. Under the Hugging Face Trainer, stage 3's prefetch bucket
    and persistence threshold are "auto": the Trainer sizes them from the model's hidden size (0.9 x hidden^2
    and 10 x hidden), where the fixed values would keep a small model's layers whole on every rank."""
    zero: dict[str, Any] = {"stage": ds.zero_stage}
    if ds.zero_stage == 0:
        return zero
    zero.update(overlap_comm=True, contiguous_gradients=True, reduce_bucket_size=ds.reduce_bucket_size)
    if ds.offload_optimizer != "none":
        zero["offload_optimizer"] = _offload(ds.offload_optimizer, ds)
    if ds.zero_stage < 3:
        zero.update(allgather_partitions=True, allgather_bucket_size=ds.allgather_bucket_size,
                    reduce_scatter=True)
        return zero
    if ds.offload_params != "none":
        zero["offload_param"] = _offload(ds.offload_params, ds)
    zero.update(
        stage3_prefetch_bucket_size=HF_AUTO if hf_trainer else STAGE3_PREFETCH_BUCKET_SIZE,
        stage3_param_persistence_threshold=HF_AUTO if hf_trainer else STAGE3_PARAM_PERSISTENCE_THRESHOLD,
        stage3_max_live_parameters=STAGE3_MAX_LIVE_PARAMETERS,
        stage3_max_reuse_distance=STAGE3_MAX_REUSE_DISTANCE,
        stage3_gather_16bit_weights_on_model_save=True,
    )
    return zero


def precision(ds: DeepSpeedConfig) -> dict[str, Any]:
    """fp16 with dynamic loss scaling, bf16 (no loss scaling needed), or nothing for fp32."""
    if ds.precision == "fp16":
        return {"fp16": {
            "enabled": True,
            "loss_scale": 0,
            "loss_scale_window": FP16_LOSS_SCALE_WINDOW,
            "initial_scale_power": FP16_INITIAL_SCALE_POWER,
            "hysteresis": FP16_HYSTERESIS,
            "min_loss_scale": FP16_MIN_LOSS_SCALE,
        }}
    if ds.precision == "bf16":
        return {"bf16": {"enabled": True}}
    return {}


def optimizer(ds: DeepSpeedConfig, hf_trainer: bool = False) -> dict[str, Any]:
    """With the optimizer offloaded, DeepSpeed must build the optimizer itself (its CPU Adam): ZeRO-Offload
    refuses a client optimizer (`zero_force_ds_cpu_optimizer`). Without offload the script brings its own.
    Under the Hugging Face Trainer (the Gaudi job) "auto" lets the Trainer fill in its own arguments, which it
    otherwise checks against these values and refuses to start on a mismatch."""
    if ds.offload_optimizer == "none":
        return {}
    params: dict[str, Any] = {"lr": ds.learning_rate, "betas": ADAM_BETAS, "eps": ADAM_EPS, "weight_decay": 0.0}
    if hf_trainer:
        params = dict.fromkeys(params, HF_AUTO)
    return {"optimizer": {"type": "AdamW", "params": params}}


def build_ds_config(ds: DeepSpeedConfig, workers: int, per_worker: int, hf_trainer: bool = False) -> dict[str, Any]:
    """The JSON-able ds_config for `workers` nodes with `per_worker` GPUs (or Gaudi cards) each;
    `hf_trainer` when the Hugging Face Trainer reads it (the Gaudi MPIJob, finetune.py). The batch sizes, clipping
    and precision stay concrete under the Trainer too: they come from the workload's `deepspeed` block, which the
    planner sized, and finetune.py sets the Trainer's arguments to match them."""
    return {
        "train_batch_size": train_batch_size(ds, workers, per_worker),
        "train_micro_batch_size_per_gpu": ds.micro_batch_per_gpu,
        "gradient_accumulation_steps": ds.gradient_accumulation,
        "gradient_clipping": ds.gradient_clipping,
        "steps_per_print": ds.steps_per_print,
        **precision(ds),
        **optimizer(ds, hf_trainer),
        "zero_optimization": zero_optimization(ds, hf_trainer),
        "wall_clock_breakdown": False,
    }
