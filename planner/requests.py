"""A workload's `model` block as the planner's sizing request, and the ZeRO strategy it trains with.

Shared by the planner's rules (checks/planner.py) and a kind's own (a server's fit on one node,
workloads/kinds/serve.py). Only workloads that train with DeepSpeed have a ds_config to size a training run by.
"""

from __future__ import annotations

from model.types import DeepSpeedWorkloadConfig, ServeWorkloadConfig, WorkloadConfig
from planner.sizing import INFERENCE, TRAINING_PRECISIONS, Request, Strategy, UnknownModelError, given_shape, resolve


def workload_request(w: WorkloadConfig) -> Request | None:
    """The workload's `model` block as a sizing request; None when there is none or it cannot be sized (the
    rules report why): an unknown model, a weight format ZeRO does not train in, or training sized for a
    workload that does not train with DeepSpeed."""
    mb = w.model
    if mb is None:
        return None
    try:
        model = given_shape(resolve(w.sized_model_name, mb.parameters), mb.vocabulary, mb.hidden, mb.largest_layer)
    except UnknownModelError:
        return None
    if mb.mode == "training" and (mb.precision not in TRAINING_PRECISIONS
                                  or not isinstance(w, DeepSpeedWorkloadConfig)):
        return None
    if not isinstance(w, DeepSpeedWorkloadConfig):
        engine = w.serving.engine if isinstance(w, ServeWorkloadConfig) else None
        return Request(model, mb.precision, mb.mode, mb.sequence_length, mb.batch_size, engine=engine)
    ds = w.deepspeed
    # Training: DeepSpeed runs microBatchPerGpu sequences per GPU; size for the larger of the two settings.
    batch = max(mb.batch_size, ds.micro_batch_per_gpu) if mb.mode == "training" else mb.batch_size
    return Request(model, mb.precision, mb.mode, mb.sequence_length, batch,
                   reduce_bucket=ds.reduce_bucket_size, allgather_bucket=ds.allgather_bucket_size)


def workload_strategy(w: WorkloadConfig) -> Strategy:
    if w.model is None or w.model.mode == "inference" or not isinstance(w, DeepSpeedWorkloadConfig):
        return INFERENCE
    ds = w.deepspeed
    return Strategy.from_deepspeed(ds.zero_stage, ds.offload_optimizer, ds.offload_params)
