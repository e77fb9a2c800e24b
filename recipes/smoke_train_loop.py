"""smoke_train.py's training: what the DeepSpeed config implies (micro-batch, precision, whose optimizer), the small
MLP under deepspeed.initialize, the fixed regression batch, and the steps with their checkpoints (`Training`).

The helpers above `build_engine` need neither torch nor deepspeed, so they are unit-tested anywhere
(tests/test_image.py).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from recipes.smoke_train_checkpoint import due_for_checkpoint, write_resume_state
from recipes.smoke_train_ranks import Place, say

DEFAULT_MICRO_BATCH = 8


def load_config(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        config = json.load(handle)
    if not isinstance(config, dict):
        raise ValueError(f"{path}: a DeepSpeed config must be a JSON object")
    return config


def micro_batch_size(config: Mapping[str, Any], world_size: int) -> int:
    """Per-GPU micro-batch implied by a DeepSpeed config (what each forward pass gets)."""
    micro = config.get("train_micro_batch_size_per_gpu")
    if isinstance(micro, int) and not isinstance(micro, bool) and micro > 0:
        return micro
    total = config.get("train_batch_size")
    if isinstance(total, int) and not isinstance(total, bool) and total > 0:
        accumulation = config.get("gradient_accumulation_steps", 1)
        if not isinstance(accumulation, int) or accumulation < 1:
            accumulation = 1
        return max(1, total // (max(1, world_size) * accumulation))
    return DEFAULT_MICRO_BATCH


def precision(config: Mapping[str, Any]) -> str:
    """``fp16``, ``bf16`` or ``fp32`` according to the DeepSpeed config."""
    for name, key in (("fp16", "fp16"), ("bf16", "bf16"), ("bf16", "bfloat16")):
        section = config.get(key)
        if isinstance(section, Mapping) and section.get("enabled") is True:
            return name
    return "fp32"


def needs_client_optimizer(config: Mapping[str, Any]) -> bool:
    """True when the config names no optimizer, so the script must pass one to deepspeed.initialize."""
    return not isinstance(config.get("optimizer"), Mapping)


def build_engine(args: argparse.Namespace, config: dict[str, Any]) -> Any:  # pragma: no cover - e2e and GPUs
    """The small MLP (the same initial weights on every rank) under deepspeed.initialize."""
    import deepspeed
    import torch

    torch.manual_seed(args.seed)  # the same initial weights on every rank
    blocks: list[torch.nn.Module] = []
    for _ in range(args.layers):
        blocks += [
            torch.nn.Linear(args.hidden_size, 4 * args.hidden_size),
            torch.nn.GELU(),
            torch.nn.Linear(4 * args.hidden_size, args.hidden_size),
        ]
    model = torch.nn.Sequential(*blocks)
    optimizer = None
    if needs_client_optimizer(config):
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=[p for p in model.parameters() if p.requires_grad],
        optimizer=optimizer,
        config=config,
    )
    return engine


def regression_batch(args: argparse.Namespace, rank: int, batch: int, dtype: Any,
                     device: Any) -> tuple[Any, Any]:  # pragma: no cover - e2e and GPUs
    """A fixed regression task (a random linear teacher) and the same batch every step on a rank: the loss falls
    steadily, so a resumed run visibly continues where the saved one was (a fresh start would not)."""
    import torch

    teacher = torch.randn(args.hidden_size, args.hidden_size,
                          generator=torch.Generator().manual_seed(args.seed)) / math.sqrt(args.hidden_size)
    generator = torch.Generator().manual_seed(args.seed * 1_000_003 + rank)
    inputs_cpu = torch.randn(batch, args.hidden_size, generator=generator)
    return inputs_cpu.to(device=device, dtype=dtype), (inputs_cpu @ teacher).to(device)


@dataclass
class Training:  # pragma: no cover - run by the e2e (make e2e) and on GPUs
    """The engine's steps over the fixed batch, its checkpoints and the measured window."""

    engine: Any
    accelerator: Any
    place: Place
    directory: str | None
    inputs: Any
    targets: Any
    start_step: int = 0
    number: int = 0  # steps done, with a resumed run's
    loss: float = float("nan")  # the mean loss over the ranks at the last step
    elapsed: float = 0.0  # seconds of the measured steps
    measured_from: int = 0

    def step(self) -> float:
        import torch

        prediction = self.engine(self.inputs)
        loss = torch.nn.functional.mse_loss(prediction.float(), self.targets)
        self.engine.backward(loss)
        self.engine.step()
        return loss.item()

    def save(self, why: str) -> None:
        if self.directory is None:
            return
        tag = f"global_step{self.number}"
        self.engine.save_checkpoint(self.directory, tag=tag, client_state={"smoke_step": self.number,
                                                                           "loss": self.loss})
        if self.place.rank == 0:
            write_resume_state(self.directory, {"step": self.number, "world_size": self.place.world_size, "tag": tag,
                                                "loss": self.loss})
            say(f"[smoke] checkpoint {self.directory}/{tag} saved ({why})")

    def run(self, args: argparse.Namespace, stop: Any) -> bool:
        """Train to warmup + steps, timing the steps after the warmup; False when stopped by SIGTERM (saved)."""
        import time

        import torch
        import torch.distributed as dist

        total_steps = args.warmup_steps + args.steps
        self.measured_from = max(self.start_step, args.warmup_steps)
        self.number = self.start_step
        start = time.perf_counter()
        while self.number < total_steps:
            if self.number == self.measured_from:
                self.accelerator.synchronize()
                if not self.place.cpu:
                    torch.cuda.reset_peak_memory_stats()
                start = time.perf_counter()
            local_loss = self.step()
            self.number += 1
            # One small all-reduce per step: the mean loss, and whether any rank got SIGTERM (all must save).
            flags = torch.tensor([local_loss, 1.0 if stop.signal is not None else 0.0], device=self.engine.device)
            dist.all_reduce(flags)
            self.loss = flags[0].item() / self.place.world_size
            if self.place.rank == 0:
                say(f"[smoke] step {self.number} loss {self.loss:.6f}")
            if flags[1].item() > 0:
                self.save("SIGTERM: preempted")
                say(f"[smoke] rank {self.place.rank} on {self.place.host}: stopped at step {self.number} on SIGTERM")
                return False
            if due_for_checkpoint(self.number, args.checkpoint_every) and self.number < total_steps:
                self.save(f"every {args.checkpoint_every} steps")
        self.accelerator.synchronize()
        self.elapsed = time.perf_counter() - start
        if self.directory is not None and self.number > self.start_step:
            self.save("end of run")
        return True
