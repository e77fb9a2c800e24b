"""A workload's `model` block as the planner's sizing request, and the ZeRO strategy it trains with.

Shared by the planner's rules (checks/planner.py) and a kind's own (a server's fit on one node,
workloads/kinds/serve.py). Only workloads that train with DeepSpeed have a ds_config to size a training run by; a
kind whose own keys say how it trains (`training_run`: kind finetune) is sized from them, with or without a
`model` block. `mode_request` is `make gpus MODE=...` as a request, the same numbers for the same run.
"""

from __future__ import annotations

from model.types import DeepSpeedWorkloadConfig, ServeWorkloadConfig, TrainingRun, VertexConfig, WorkloadConfig
from planner.model_catalog import Lora, Model, UnknownModelError, given_shape, resolve
from planner.sizing import TRAINING_PRECISIONS
from planner.sizing_types import INFERENCE, Request, Strategy

# `make gpus MODE=finetune`: the finetune kind's defaults (model/schema.yaml `finetune.lora` and
# `finetune.gradientCheckpointing`; tests/test_lora_sizing.py keeps them equal).
FINETUNE_LORA = Lora(rank=16, targets=("all-linear",))
FINETUNE_GRADIENT_CHECKPOINTING = True
FINETUNE = "finetune"


def mode_request(mode: str, model: Model, precision: str = "bf16", sequence_length: int = 2048,
                 batch_size: int = 1) -> Request:
    """`make gpus MODE=inference|training|finetune` as a request: finetune is the finetune kind as it comes (LoRA
    with its default rank and targets, gradient checkpointing on), training every parameter."""
    if mode == FINETUNE:
        return Request(model, precision, "training", sequence_length, batch_size, lora=FINETUNE_LORA,
                       gradient_checkpointing=FINETUNE_GRADIENT_CHECKPOINTING)
    return Request(model, precision, mode, sequence_length, batch_size)


def _lora(run: TrainingRun | None) -> Lora | None:
    if run is None or run.lora is None:
        return None
    return Lora(run.lora.rank, tuple(run.lora.target_modules))


def workload_request(w: WorkloadConfig) -> Request | None:
    """The workload's `model` block as a sizing request; None when there is none or it cannot be sized (the
    rules report why): an unknown model, a weight format ZeRO does not train in, or training sized for a
    workload that does not train with DeepSpeed. A workload whose keys say how it trains (`training_run`) is
    sized at its sequence length and micro batch, with its LoRA and gradient checkpointing."""
    mb = w.model
    run = w.training_run
    if mb is None and run is None:
        return None
    parameters = mb.parameters if mb else None
    try:
        model = resolve(w.sized_model_name, parameters)
    except UnknownModelError:
        return None
    if mb is not None:
        model = given_shape(model, mb.vocabulary, mb.hidden, mb.largest_layer)
    mode = mb.mode if mb else "training"
    if run is not None and mode != "training":
        return None  # a trainer sized as a server: its kind's rule says so
    if not isinstance(w, DeepSpeedWorkloadConfig):
        engine = w.serving.engine if isinstance(w, ServeWorkloadConfig) else None
        if mb is None or mode == "training":
            return None
        return Request(model, mb.precision, mb.mode, mb.sequence_length, mb.batch_size, engine=engine)
    precision = mb.precision if mb else w.deepspeed.precision
    if mode == "training" and precision not in TRAINING_PRECISIONS:
        return None
    ds = w.deepspeed
    if run is not None:
        return Request(model, precision, mode, run.sequence_length, ds.micro_batch_per_gpu,
                       reduce_bucket=ds.reduce_bucket_size, allgather_bucket=ds.allgather_bucket_size,
                       lora=_lora(run), gradient_checkpointing=run.gradient_checkpointing)
    assert mb is not None
    # Training: DeepSpeed runs microBatchPerGpu sequences per GPU; size for the larger of the two settings.
    batch = max(mb.batch_size, ds.micro_batch_per_gpu) if mode == "training" else mb.batch_size
    return Request(model, precision, mode, mb.sequence_length, batch,
                   reduce_bucket=ds.reduce_bucket_size, allgather_bucket=ds.allgather_bucket_size)


def workload_strategy(w: WorkloadConfig) -> Strategy:
    if not isinstance(w, DeepSpeedWorkloadConfig):
        return INFERENCE
    if (w.model is None and w.training_run is None) or (w.model is not None and w.model.mode == "inference"):
        return INFERENCE
    ds = w.deepspeed
    return Strategy.from_deepspeed(ds.zero_stage, ds.offload_optimizer, ds.offload_params)


def vertex_request(v: VertexConfig) -> Request | None:
    """`vertex.finetune` as a sizing request, as a `finetune` workload's: its model (`vertex.model`, else
    `finetune.model`'s data/models.yaml entry), LoRA, gradient checkpointing, sequence length and micro batch;
    None without the recipe or a model the planner can size."""
    f = v.finetune
    if f is None:
        return None
    shape = v.model
    try:
        model = resolve((shape.name if shape else None) or f.model, shape.parameters if shape else None)
    except UnknownModelError:
        return None
    if shape is not None:
        model = given_shape(model, shape.vocabulary, shape.hidden, None)
    ds = v.deepspeed
    lora = Lora(f.lora.rank, tuple(f.lora.target_modules)) if f.lora.enabled else None
    return Request(model, ds.precision, "training", f.sequence_length, ds.micro_batch_per_gpu,
                   reduce_bucket=ds.reduce_bucket_size, allgather_bucket=ds.allgather_bucket_size, lora=lora,
                   gradient_checkpointing=f.gradient_checkpointing)


def vertex_strategy(v: VertexConfig) -> Strategy:
    ds = v.deepspeed
    return Strategy.from_deepspeed(ds.zero_stage, ds.offload_optimizer, ds.offload_params)
