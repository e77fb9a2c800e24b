"""What a written stack says about how it trains (issue 40 item 5): the global batch and the learning rate it
writes, the run's optimizer steps, and the record formats the recipe reads. The numbers come from the stack the
writer wrote and from model/schema.yaml."""

from __future__ import annotations

from typing import Any

from model.config_schema import schema
from model.validators import or_list
from planner.sizing_types import Request

# deepspeed.learningRate's default (model/schema.yaml) is an adapter's; every parameter trains at what
# finetune.lora.enabled's description advises instead (tests/test_docs_drift.py reads both from the schema).
LORA_LEARNING_RATE, FULL_LEARNING_RATE = 3e-4, 2e-5


def batch_reason(ds: dict[str, Any], request: Request) -> str:
    """The global batch and learning rate the stack trains with, said: one sequence a step is what a 1-GPU plan
    writes, and nothing else would tell the user (issue 40)."""
    batch, rate = ds["trainBatchSize"], ds.get("learningRate", LORA_LEARNING_RATE)
    why = ("deepspeed.learningRate's default, for adapters" if request.lora is not None else
           "for every parameter, as finetune.lora.enabled advises; the default 3e-4 is an adapter's")
    return (f"batch: {batch} sequence(s) of {request.sequence_length} tokens per optimizer step (trainBatchSize: "
            f"the smallest the plan holds) at learning rate {rate:g} ({why}); to average more sequences a step "
            "without more GPU memory, raise deepspeed.gradientAccumulation (and trainBatchSize with it) and set "
            "learningRate to what your recipe uses at that batch")


def steps_line(config: dict[str, Any], request: Request, tokens: float) -> list[str]:
    """The run's optimizer steps at the written global batch ("Why each choice" says the batch and the rate)."""
    trainer = (config.get("deepspeed-stack:workloads") or {}).get("train") or {}
    batch = (trainer.get("deepspeed") or {}).get("trainBatchSize")
    if not batch:
        return []
    steps = tokens / (batch * request.sequence_length)
    return [f"Steps: about {steps:,.0f} optimizer steps of {batch} sequence(s) of {request.sequence_length} tokens "
            "(the batch and learning rate: `batch` below)."]


def record_formats() -> str:
    """The record formats the recipe reads (finetune.recordFormat's values but `auto`), as the header names them."""
    formats = schema()["$defs"]["finetuneRun"]["properties"]["recordFormat"]["enum"]
    return or_list([f"`{f}`" for f in formats if f != "auto"])
