"""data/training_speed.yaml: FLOPs per token, the measured throughput rows (published runs and this project's own),
FP8's and LoRA's conversions, offload's measured slowdown, the interruption rates by capacity, and the data step's
tokenization rate, for the estimate of a run's time (planner/run_estimate.py). Each value's source is in the file."""

from __future__ import annotations

import functools
from pathlib import Path

import msgspec

from model.yamlio import load_yaml

DATA_PATH = Path(__file__).resolve().parent.parent / "data" / "training_speed.yaml"
CPU = "cpu"  # a row's `gpu` for a toy run on CPU cores


class FlopsPerToken(msgspec.Struct, frozen=True):
    """Multiples of the parameter count N per token trained, by pass."""

    forward: float
    backward_inputs: float
    backward_weights: float
    recompute: float


class Row(msgspec.Struct, frozen=True):
    """One measured run: tokens per second per GPU (or accelerator, or CPU rank) for a model on a GPU type."""

    id: str
    gpu: str  # a data/gpu_catalog.yaml type, or "cpu"
    gpus: int
    model: str
    parameters: float  # N
    training: str  # full | lora
    stack: str  # fsdp | deepspeed | megatron
    sequence_length: int
    precision: str
    tokens_per_second_per_gpu: float
    source: str
    date: str
    ours: bool = False  # measured by this project (make gpu-bench, make e2e)
    toy: bool = False  # a toy run (CPU): never evidence for a GPU's estimate

    @property
    def lora(self) -> bool:
        return self.training == "lora"


class TrainingSpeed(msgspec.Struct, frozen=True):
    source: str
    date: str
    flops_per_token: FlopsPerToken
    rows: tuple[Row, ...]
    fp8_over_bf16: float
    cpu_peak_tflops: float  # the stand-in peak of one CPU rank (toy rows, e2e)
    lora_speedup_over_full: float
    offload_factor: float  # ZeRO-3 with CPU offload over ZeRO-3, measured samples/s
    mean_hours_between_interruptions: dict[str, float]  # by capacity kind (model/capacity.py)
    saves_share_warning: float
    chars_per_token: float
    # finetune.py's data step (--prepare-data): characters rendered, tokenized and saved per second on one CPU, by
    # the records' kind (text, chat).
    tokenize_chars_per_second: dict[str, float] = msgspec.field(default_factory=dict)


def _row(raw: dict) -> Row:
    return Row(id=str(raw["id"]), gpu=str(raw["gpu"]), gpus=int(raw["gpus"]), model=str(raw["model"]),
               parameters=float(raw["parameters"]), training=str(raw["training"]), stack=str(raw["stack"]),
               sequence_length=int(raw["sequenceLength"]), precision=str(raw["precision"]),
               tokens_per_second_per_gpu=float(raw["tokensPerSecondPerGpu"]), source=str(raw["source"]),
               date=str(raw["date"]), ours=bool(raw.get("ours", False)), toy=bool(raw.get("toy", False)))


def parse(raw: dict) -> TrainingSpeed:
    f, offload = raw["flopsPerToken"], raw["offload"]["samplesPerSecond"]
    return TrainingSpeed(
        source=str(raw["source"]), date=str(raw["date"]),
        flops_per_token=FlopsPerToken(float(f["forward"]), float(f["backwardInputs"]), float(f["backwardWeights"]),
                                      float(f["recompute"])),
        rows=tuple(_row(r) for r in raw["throughput"]),
        fp8_over_bf16=float(raw["fp8OverBf16"]), cpu_peak_tflops=float(raw["cpuPeakTflops"]),
        lora_speedup_over_full=float(raw["lora"]["speedupOverFull"]),
        offload_factor=float(offload["zero3Offload"]) / float(offload["zero3"]),
        mean_hours_between_interruptions={str(k): float(v) for k, v in
                                          raw["interruptions"]["meanHoursBetween"].items()},
        saves_share_warning=float(raw["interruptions"]["savesShareWarning"]),
        chars_per_token=float(raw["charsPerToken"]),
        tokenize_chars_per_second={kind: float(rate) for kind, rate in
                                   raw["tokenization"]["charsPerSecondPerCpu"].items()},
    )


@functools.cache
def load(path: Path = DATA_PATH) -> TrainingSpeed:
    return parse(load_yaml(path))
