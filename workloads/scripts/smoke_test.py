#!/usr/bin/env python3
"""DeepSpeed cluster smoke test.

Launched on every worker by the DeepSpeed launcher, e.g. (the dev stack's default
``source.launchCommand`` of the Bitnami chart, which mounts this file at /app)::

    deepspeed --hostfile /job/hostfile smoke_test.py --deepspeed_config ds_config.json

Every rank checks that it sees the GPUs the launcher assigned to its node, then
trains a small MLP (built in code, nothing downloaded) on random data for a few
steps under ``deepspeed.initialize`` with the given DeepSpeed config, and
reports its throughput (samples/s) and peak GPU memory. Rank 0 prints a summary
of all ranks and a ``SMOKE_TEST_RESULT {json}`` line. Exit status: 0 on
success, 3 when a rank does not see enough GPUs, 4 when the loss is not finite.

The helpers above ``main`` do not need torch or deepspeed (they are imported in
``main``), so they can be unit-tested anywhere.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

DEFAULT_STEPS = 20
DEFAULT_WARMUP_STEPS = 3
DEFAULT_MICRO_BATCH = 8
EXIT_GPU_CHECK_FAILED = 3
EXIT_LOSS_NOT_FINITE = 4


def _int_at_least(minimum: int, word: str) -> Callable[[str], int]:
    """An argparse type: an integer of at least `minimum`, with a message that names what was expected."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected a {word} integer, got {text!r}")
        return value

    return parse


_positive_int = _int_at_least(1, "positive")
_non_negative_int = _int_at_least(0, "non-negative")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="DeepSpeed multi-node smoke test (tiny MLP, random data).")
    parser.add_argument(
        "--deepspeed_config",
        "--deepspeed-config",
        dest="deepspeed_config",
        required=True,
        help="DeepSpeed JSON config (relative paths are resolved against the working directory, /app)",
    )
    parser.add_argument(
        "--steps", type=_positive_int, default=DEFAULT_STEPS, help="measured training steps (default 20)"
    )
    parser.add_argument(
        "--warmup-steps",
        type=_non_negative_int,
        default=DEFAULT_WARMUP_STEPS,
        help="steps run before measuring (kernel compilation, allocator warm-up; default 3)",
    )
    parser.add_argument("--hidden-size", type=_positive_int, default=1024, help="MLP width (default 1024)")
    parser.add_argument("--layers", type=_positive_int, default=4, help="MLP blocks (default 4)")
    parser.add_argument(
        "--expected-gpus-per-node",
        type=_positive_int,
        default=None,
        help="fail unless every rank sees exactly this many GPUs (default: at least LOCAL_WORLD_SIZE)",
    )
    parser.add_argument("--seed", type=int, default=1234)
    # Added by the DeepSpeed launcher to every rank (both spellings exist in the wild).
    parser.add_argument("--local_rank", "--local-rank", dest="local_rank", type=int, default=None)
    return parser.parse_args(argv)


def local_world_size(env: Mapping[str, str]) -> int | None:
    """Ranks on this node: LOCAL_WORLD_SIZE (torchrun) or LOCAL_SIZE (DeepSpeed launcher)."""
    for name in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE"):
        value = env.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return None


def check_gpu_visibility(
    device_count: int,
    local_world: int | None,
    expected: int | None = None,
    *,
    rank: int = 0,
    host: str = "?",
    visible_devices: str | None = None,
) -> tuple[bool, str]:
    """Whether this rank sees enough GPUs, and a one-line message saying so.

    ``device_count`` is torch.cuda.device_count(), ``local_world`` the number of
    ranks the launcher started on this node, ``expected`` an optional exact
    GPUs-per-node requirement, ``visible_devices`` CUDA_VISIBLE_DEVICES.
    """
    where = f"rank {rank} on {host}"
    if device_count <= 0:
        devices = "<unset>" if visible_devices is None else repr(visible_devices)
        return False, (
            f"{where}: no GPU visible to torch (CUDA_VISIBLE_DEVICES={devices}); is the NVIDIA driver "
            "mounted at /usr/local/nvidia and does the pod request nvidia.com/gpu?"
        )
    if expected is not None and device_count != expected:
        return False, f"{where}: {device_count} GPU(s) visible, expected {expected} per node"
    if local_world is not None and device_count < local_world:
        return False, (
            f"{where}: {device_count} GPU(s) visible but {local_world} ranks on this node "
            "(hostfile slots larger than the GPUs of the pod?)"
        )
    ranks = f", {local_world} rank(s) on this node" if local_world is not None else ""
    return True, f"{where}: {device_count} GPU(s) visible{ranks}"


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


def throughput(samples: int, seconds: float) -> float:
    """Samples per second; raises ValueError for a non-positive duration."""
    if seconds <= 0:
        raise ValueError(f"elapsed time must be positive, got {seconds!r}")
    if samples < 0:
        raise ValueError(f"sample count must not be negative, got {samples!r}")
    return samples / seconds


@dataclass(frozen=True)
class RankResult:
    rank: int
    host: str
    local_rank: int
    gpus_visible: int
    samples_per_second: float
    peak_memory_mib: float
    final_loss: float


def summarize(results: Sequence[RankResult]) -> str:
    """Rank 0's report: one line per rank plus cluster totals."""
    if not results:
        return "no results"
    ordered = sorted(results, key=lambda item: item.rank)
    lines = [f"{'rank':>5} {'host':<40} {'gpus':>4} {'samples/s':>12} {'peak MiB':>10} {'loss':>10}"]
    for item in ordered:
        lines.append(
            f"{item.rank:>5} {item.host:<40} {item.gpus_visible:>4} {item.samples_per_second:>12.1f} "
            f"{item.peak_memory_mib:>10.1f} {item.final_loss:>10.4f}"
        )
    hosts = sorted({item.host for item in ordered})
    total = sum(item.samples_per_second for item in ordered)
    peak = max(item.peak_memory_mib for item in ordered)
    lines.append(
        f"total: {len(ordered)} rank(s) on {len(hosts)} host(s), {total:.1f} samples/s, "
        f"max peak memory {peak:.1f} MiB"
    )
    return "\n".join(lines)


def load_config(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        config = json.load(handle)
    if not isinstance(config, dict):
        raise ValueError(f"{path}: a DeepSpeed config must be a JSON object")
    return config


def main(argv: Sequence[str] | None = None) -> int:  # pragma: no cover - needs GPUs, torch, deepspeed
    args = parse_args(argv)
    config = load_config(args.deepspeed_config)

    import time

    import deepspeed
    import torch
    import torch.distributed as dist

    host = socket.gethostname()
    rank = int(os.environ.get("RANK", "0"))
    local_rank = args.local_rank if args.local_rank is not None else int(os.environ.get("LOCAL_RANK", "0"))
    ok, message = check_gpu_visibility(
        torch.cuda.device_count() if torch.cuda.is_available() else 0,
        local_world_size(os.environ),
        args.expected_gpus_per_node,
        rank=rank,
        host=host,
        visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
    )
    print(f"[smoke] {message}", flush=True)

    # Agree on the GPU check over a CPU (gloo) group, so that every rank stops
    # together and rank 0 names the failing ones, even where no GPU is usable.
    deepspeed.init_distributed(dist_backend="nccl")
    world_size = dist.get_world_size()
    checks: list[dict[str, Any] | None] = [None] * world_size
    dist.all_gather_object(checks, {"ok": ok, "message": message}, group=dist.new_group(backend="gloo"))
    failures = [item["message"] for item in checks if item is not None and not item["ok"]]
    if failures:
        if rank == 0:
            for failure in failures:
                print(f"[smoke] FAILED: {failure}", file=sys.stderr, flush=True)
        return EXIT_GPU_CHECK_FAILED
    torch.cuda.set_device(local_rank)
    torch.manual_seed(args.seed + rank)

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
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=[p for p in model.parameters() if p.requires_grad],
        optimizer=optimizer,
        config=config,
    )

    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision(config), torch.float32)
    batch = micro_batch_size(config, world_size)
    device = engine.device
    inputs = torch.randn(batch, args.hidden_size, device=device, dtype=dtype)
    targets = torch.randn(batch, args.hidden_size, device=device, dtype=dtype)

    def step() -> float:
        loss = torch.nn.functional.mse_loss(engine(inputs).float(), targets.float())
        engine.backward(loss)
        engine.step()
        return loss.item()

    for _ in range(args.warmup_steps):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    loss_value = float("nan")
    for _ in range(args.steps):
        loss_value = step()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start

    result = RankResult(
        rank=rank,
        host=host,
        local_rank=local_rank,
        gpus_visible=torch.cuda.device_count(),
        samples_per_second=throughput(batch * args.steps, elapsed),
        peak_memory_mib=torch.cuda.max_memory_allocated() / 2**20,
        final_loss=loss_value,
    )
    print(
        f"[smoke] rank {rank} on {host}: {result.samples_per_second:.1f} samples/s, "
        f"peak memory {result.peak_memory_mib:.1f} MiB, loss {loss_value:.4f}",
        flush=True,
    )

    gathered: list[dict[str, Any] | None] = [None] * world_size
    dist.all_gather_object(gathered, asdict(result))
    results = [RankResult(**item) for item in gathered if item is not None]
    failed = [item.rank for item in results if not math.isfinite(item.final_loss)]
    if rank == 0:
        print("[smoke] summary\n" + summarize(results), flush=True)
        report = {
            "ok": not failed,
            "world_size": world_size,
            "hosts": sorted({item.host for item in results}),
            "micro_batch_per_gpu": batch,
            "precision": precision(config),
            "steps": args.steps,
            "total_samples_per_second": round(sum(item.samples_per_second for item in results), 2),
            "max_peak_memory_mib": round(max(item.peak_memory_mib for item in results), 1),
            "non_finite_loss_ranks": failed,
        }
        print("SMOKE_TEST_RESULT " + json.dumps(report, sort_keys=True), flush=True)
    dist.barrier()
    return EXIT_LOSS_NOT_FINITE if failed else 0


if __name__ == "__main__":
    sys.exit(main())
