"""What the sizing (planner/sizing.py) takes and gives: a `Request` (the workload's `model` block, resolved), the
`Strategy` that spreads it (inference, or a ZeRO stage with CPU/NVMe offload) and the `Estimate` of one accelerator's
memory. Apart from the formulas, so that the planner's other modules and the rules can name them without the
arithmetic; planner/sizing.py's docstring says where each number comes from.
"""

from __future__ import annotations

import msgspec

from model import serving_engines
from planner.model_catalog import Lora, Model, lora_parameters

GB = 1e9
# The preview check warns below this much free memory per accelerator; recommendations keep it free.
HEADROOM = 0.10
# DeepSpeed's default reduce_bucket_size and allgather_bucket_size (elements), the schema's defaults too.
DEEPSPEED_BUCKET = 500_000_000


class Strategy(msgspec.Struct, frozen=True):
    """How the model is spread: inference (tensor parallel), or a ZeRO stage with optional CPU/NVMe offload."""

    zero_stage: int | None = None
    offload_optimizer: bool = False
    offload_params: bool = False

    @property
    def training(self) -> bool:
        return self.zero_stage is not None

    @property
    def label(self) -> str:
        if self.zero_stage is None:
            return "inference"
        offloaded = [what for what, on in (("optimizer", self.offload_optimizer), ("parameters", self.offload_params))
                     if on]
        return f"ZeRO-{self.zero_stage}" + (f" + {' and '.join(offloaded)} offload" if offloaded else "")

    @classmethod
    def from_deepspeed(cls, zero_stage: int, offload_optimizer: str, offload_params: str) -> Strategy:
        """The workload's ds_config: offload counts only where DeepSpeed honours it (optimizer at stage 1 and
        above, parameters at stage 3), so an ignored setting never makes a workload look smaller than it is."""
        return cls(zero_stage, offload_optimizer != "none" and zero_stage >= 1,
                   offload_params != "none" and zero_stage == 3)



INFERENCE = Strategy()
TRAINING_STRATEGIES = (
    Strategy(0), Strategy(1), Strategy(2), Strategy(3),
    Strategy(2, offload_optimizer=True), Strategy(3, offload_optimizer=True),
    Strategy(3, offload_optimizer=True, offload_params=True),
)


class Request(msgspec.Struct, frozen=True):
    """What to size: the workload's `model` block, resolved."""

    model: Model
    precision: str = "bf16"
    mode: str = "training"
    sequence_length: int = 2048
    batch_size: int = 1
    reduce_bucket: int = DEEPSPEED_BUCKET
    allgather_bucket: int = DEEPSPEED_BUCKET
    engine: str | None = None  # inference: the serving engine (data/serving.yaml); None: the default, vLLM
    lora: Lora | None = None  # training: a LoRA adapter on the frozen model; None: every parameter trains
    gradient_checkpointing: bool = True  # training: every layer's activations recomputed in the backward pass
    adapter_slots: int = 0  # inference: vLLM's --max-loras (0: no adapters served)
    adapter_rank: int = 0  # inference: vLLM's --max-lora-rank

    def strategies(self) -> tuple[Strategy, ...]:
        """Inference; or every ZeRO variant, without ZeRO-3 parameter offload for LoRA (finetune.py refuses it:
        peft wraps modules ZeRO-3 has partitioned, and the merge at export would gather the base twice)."""
        if self.mode != "training":
            return (INFERENCE,)
        if self.lora is not None:
            return tuple(s for s in TRAINING_STRATEGIES if not s.offload_params)
        return TRAINING_STRATEGIES

    @property
    def adapter_parameters(self) -> int:
        """LoRA's trained parameters (0 without LoRA)."""
        return lora_parameters(self.model.shape, self.lora) if self.lora is not None else 0

    @property
    def trained_parameters(self) -> float:
        """What the optimizer steps on: the adapters with LoRA, else every parameter."""
        return self.adapter_parameters if self.lora is not None else self.model.parameters

    @property
    def training_label(self) -> str:
        """How it trains, in words: LoRA or every parameter, and whether activations are recomputed."""
        what = (f"{self.lora.label} ({self.adapter_parameters / 1e6:.2f}M adapter parameters, the base frozen)"
                if self.lora is not None else "every parameter")
        recompute = "with" if self.gradient_checkpointing else "without"
        return f"{what}, {recompute} gradient checkpointing"

    @property
    def serving_engine(self) -> serving_engines.Engine:
        return serving_engines.engine(self.engine)

    @property
    def headroom(self) -> float:
        """The share of each accelerator kept free: HEADROOM for training; for inference what the engine leaves
        (vLLM: 1 - its memory budget; FastGen: nothing beyond the reserve its estimate already holds)."""
        if self.mode == "training":
            return HEADROOM
        e = self.serving_engine
        return 1 - e.gpu_memory_utilization if e.gpu_memory_utilization is not None else 0.0


class Estimate(msgspec.Struct, frozen=True):
    """Memory of one accelerator (`parts`, bytes) and, with offload, of one node's CPU (DeepSpeed's estimate)."""

    request: Request
    strategy: Strategy
    gpus_per_node: int
    nodes: int
    parts: dict[str, float]
    cpu_bytes_per_node: float = 0.0

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def per_gpu_gb(self) -> float:
        return sum(self.parts.values()) / GB

    @property
    def cpu_gb_per_node(self) -> float:
        return self.cpu_bytes_per_node / GB

    def headroom(self, memory_gb: float) -> float:
        """The share of the accelerator's memory left free (negative: it does not fit)."""
        return 1 - self.per_gpu_gb / memory_gb

    def fits(self, memory_gb: float, headroom: float = 0.0) -> bool:
        return self.per_gpu_gb <= memory_gb * (1 - headroom)

    def breakdown(self) -> str:
        return ", ".join(f"{name} {value / GB:.1f}" for name, value in self.parts.items() if value >= 0.05 * GB)
