"""What a run's GPUs reach, from measured runs (data/training_speed.yaml `throughput`): each row's MFU (its tokens/s
per GPU x the model's FLOPs per token over the GPU's peak; an FP8 row at bf16 through fp8OverBf16), interpolated by
log(N) between the rows nearest the run's size, below and above it. The range is the spread of the evidence: at
each of the two sizes the lowest and the highest row's MFU, interpolated alike. `evidence()` says which rows an
estimate rests on, and in words what it assumes beyond them (another GPU, LoRA from full fine-tuning rows, offload).

Which rows: a toy run (CPU) only toy rows, a GPU run never them. Rows of the run's training (full or LoRA) and of
a data-parallel stack (DeepSpeed ZeRO, PyTorch FSDP: what this stack runs); for LoRA without such a row, the full
fine-tuning rows x LoRA's measured speed-up (Hu et al.); with none of either, Megatron/NeMo rows (the fast end:
tensor parallelism and FP8 kernels), said so. Rows on the run's GPU type where there are some, else every GPU's (the
same share of peak assumed), said so.
"""

from __future__ import annotations

import math

import msgspec

from model import catalog as gpu_catalog
from model import training_speed
from model.training_speed import CPU, Row, TrainingSpeed

DEEPSPEED, FSDP, MEGATRON = "deepspeed", "fsdp", "megatron"
DATA_PARALLEL = (DEEPSPEED, FSDP)


class Evidence(msgspec.Struct, frozen=True):
    """The MFU range a run rests on (on the model's FLOPs: 6N full, 4N LoRA), the rows it comes from (ids) and what
    it assumes beyond them, in words. `scale`: LoRA's conversion from full fine-tuning rows x offload's, already in
    the range."""

    mfu_low: float
    mfu_high: float
    rows: tuple[str, ...]
    notes: tuple[str, ...] = ()
    scale: float = 1.0


def model_flops_share(lora: bool, speed: TrainingSpeed) -> float:
    """A LoRA run's model FLOPs per token over full fine-tuning's: 4N / 6N."""
    f = speed.flops_per_token
    full = f.forward + f.backward_inputs + f.backward_weights
    return (f.forward + f.backward_inputs) / full if lora else 1.0


def row_peak(row: Row, speed: TrainingSpeed, cat: gpu_catalog.Catalog) -> float:
    """The row's GPU's peak dense TFLOPS in its precision (FP8 rows: bf16's, the throughput converted): the CPU
    stand-in for a toy row."""
    if row.gpu == CPU:
        return speed.cpu_peak_tflops
    gpu = cat.gpus[row.gpu]
    precision = "bf16" if row.precision == "fp8" else row.precision
    return gpu.peak_tflops[precision]


def row_tokens_per_second(row: Row, speed: TrainingSpeed) -> float:
    """The row's tokens/s per GPU at bf16 (an FP8 row's over fp8OverBf16)."""
    return row.tokens_per_second_per_gpu / (speed.fp8_over_bf16 if row.precision == "fp8" else 1.0)


def row_mfu(row: Row, speed: TrainingSpeed | None = None, cat: gpu_catalog.Catalog | None = None) -> float:
    """The row's MFU on the model's FLOPs (6N full, 4N LoRA, no recomputation), at bf16 for an FP8 row."""
    speed, cat = speed or training_speed.load(), cat or gpu_catalog.load()
    f = speed.flops_per_token
    per_n = f.forward + f.backward_inputs + (0.0 if row.lora else f.backward_weights)
    return row_tokens_per_second(row, speed) * per_n * row.parameters / (row_peak(row, speed, cat) * 1e12)


def _candidates(lora: bool, gpu_type: str, stack: str, speed: TrainingSpeed) -> tuple[list[Row], float, list[str]]:
    """The rows of the run's training and stack, LoRA's conversion factor from full rows (1.0: none), and notes."""
    toy = gpu_type == CPU
    pool = [r for r in speed.rows if r.toy == toy]
    wanted = DATA_PARALLEL if stack in DATA_PARALLEL else (stack,)
    rows = [r for r in pool if r.lora == lora and r.stack in wanted]
    if rows:
        return rows, 1.0, []
    if lora:
        full = [r for r in pool if not r.lora and r.stack in wanted]
        if full:
            factor = speed.lora_speedup_over_full * model_flops_share(True, speed)
            return full, factor, [f"LoRA from the full fine-tuning rows x{speed.lora_speedup_over_full:g} tokens/s "
                                  "(Hu et al.'s measured LoRA speed-up; no data-parallel LoRA row yet)"]
    rows = [r for r in pool if r.lora == lora]
    return rows, 1.0, ["Megatron/NeMo rows only (tensor parallelism, FP8 kernels): the fast end for this run"]


def _at(size: float, rows: list[Row], speed: TrainingSpeed, cat: gpu_catalog.Catalog) -> tuple[float, float]:
    mfus = [row_mfu(r, speed, cat) for r in rows if r.parameters == size]
    return min(mfus), max(mfus)


def evidence(parameters: float, lora: bool, gpu_type: str, offload: bool = False, stack: str = DEEPSPEED,
             speed: TrainingSpeed | None = None, cat: gpu_catalog.Catalog | None = None) -> Evidence:
    """The MFU range of a run of a model of `parameters` (full or `lora`) on `gpu_type` ("cpu": the toy rows; ""
    unknown: every GPU's rows), with CPU `offload` or not, on `stack`. Raises ValueError without a row to rest on."""
    speed, cat = speed or training_speed.load(), cat or gpu_catalog.load()
    rows, scale, notes = _candidates(lora, gpu_type, stack, speed)
    if not rows:
        raise ValueError(f"no measured row in data/training_speed.yaml for a {'LoRA' if lora else 'full'} run on "
                         f"{gpu_type or 'a GPU'}")
    same = [r for r in rows if r.gpu == gpu_type]
    if same:
        rows = same
    elif gpu_type != CPU:
        measured = ", ".join(sorted({r.gpu for r in rows}))
        notes.append(f"measured on {measured}; the same share of peak assumed on {gpu_type or 'this GPU'}")
    sizes = sorted({r.parameters for r in rows})
    if not sizes[0] <= parameters <= sizes[-1]:
        notes.append(f"{parameters / 1e9:.3g}B parameters is outside the rows' sizes ({sizes[0] / 1e9:.3g}–"
                     f"{sizes[-1] / 1e9:.3g}B): the nearest size's MFU, not scaled")
    below = max((s for s in sizes if s <= parameters), default=sizes[0])
    above = min((s for s in sizes if s >= parameters), default=sizes[-1])
    (lo_b, hi_b), (lo_a, hi_a) = _at(below, rows, speed, cat), _at(above, rows, speed, cat)
    t = 0.0 if above == below else (math.log(parameters) - math.log(below)) / (math.log(above) - math.log(below))
    if offload:
        scale *= speed.offload_factor
        notes.append(f"x{speed.offload_factor:.2f} for CPU offload (ZeRO-3 offload over ZeRO-3, the GPT example's "
                     "measured samples/s)")
    used = tuple(r.id for r in rows if r.parameters in (below, above))
    return Evidence((lo_b + t * (lo_a - lo_b)) * scale, (hi_b + t * (hi_a - hi_b)) * scale, used, tuple(notes),
                    scale)
