"""data/training_speed.yaml: FLOPs per token, the assumed MFU range, LoRA's measured speed-up and the ZeRO stages'
measured rates, for the estimate of a run's time (planner/run_estimate.py). Each value's source is in the file."""

from __future__ import annotations

import functools
from pathlib import Path

import msgspec

from model.yamlio import load_yaml

DATA_PATH = Path(__file__).resolve().parent.parent / "data" / "training_speed.yaml"


class FlopsPerToken(msgspec.Struct, frozen=True):
    """Multiples of the parameter count N per token trained, by pass."""

    forward: float
    backward_inputs: float
    backward_weights: float
    recompute: float


class StrategyRates(msgspec.Struct, frozen=True):
    """Samples per second of one model on the same GPUs at each ZeRO stage, and at ZeRO-3 with CPU offload."""

    zero0: float
    zero1: float
    zero2: float
    zero3: float
    zero3_offload: float


class TrainingSpeed(msgspec.Struct, frozen=True):
    source: str
    date: str
    flops_per_token: FlopsPerToken
    mfu_low: float
    mfu_high: float
    lora_speedup_over_full: float
    rates: StrategyRates
    chars_per_token: float
    # finetune.py's data step (--prepare-data): characters rendered, tokenized and saved per second on one CPU, by
    # the records' kind (text, chat).
    tokenize_chars_per_second: dict[str, float] = msgspec.field(default_factory=dict)


def parse(raw: dict) -> TrainingSpeed:
    f, rates = raw["flopsPerToken"], raw["strategies"]["samplesPerSecond"]
    return TrainingSpeed(
        source=str(raw["source"]), date=str(raw["date"]),
        flops_per_token=FlopsPerToken(float(f["forward"]), float(f["backwardInputs"]), float(f["backwardWeights"]),
                                      float(f["recompute"])),
        mfu_low=float(raw["mfu"]["low"]), mfu_high=float(raw["mfu"]["high"]),
        lora_speedup_over_full=float(raw["lora"]["speedupOverFull"]),
        rates=StrategyRates(float(rates["zero0"]), float(rates["zero1"]), float(rates["zero2"]), float(rates["zero3"]),
                            float(rates["zero3Offload"])),
        chars_per_token=float(raw["charsPerToken"]),
        tokenize_chars_per_second={kind: float(rate) for kind, rate in
                                   raw["tokenization"]["charsPerSecondPerCpu"].items()},
    )


@functools.cache
def load(path: Path = DATA_PATH) -> TrainingSpeed:
    return parse(load_yaml(path))
