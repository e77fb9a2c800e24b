"""smoke_train.py's report: each rank's throughput, peak memory and final loss (`RankResult`), and rank 0's summary
of every rank with the SMOKE_TEST_RESULT line.

The helpers above `rank_result` need neither torch nor deepspeed, so they are unit-tested anywhere
(tests/test_image.py).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from recipes.smoke_train_loop import Training, precision
from recipes.smoke_train_ranks import say


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


def rank_result(t: Training, total_steps: int, batch: int) -> RankResult:  # pragma: no cover - e2e and GPUs
    """This rank's throughput over the measured steps, its peak memory and the final loss (and says them)."""
    import torch

    place, measured = t.place, max(0, total_steps - t.measured_from)
    result = RankResult(
        rank=place.rank,
        host=place.host,
        local_rank=place.local_rank,
        gpus_visible=0 if place.cpu else torch.cuda.device_count(),
        samples_per_second=throughput(batch * measured, t.elapsed) if measured and t.elapsed > 0 else 0.0,
        peak_memory_mib=0.0 if place.cpu else torch.cuda.max_memory_allocated() / 2**20,
        final_loss=t.loss,
    )
    say(
        f"[smoke] rank {place.rank} on {place.host}: {result.samples_per_second:.1f} samples/s, "
        f"peak memory {result.peak_memory_mib:.1f} MiB, loss {t.loss:.4f}"
    )
    return result


def report(args: argparse.Namespace, config: Mapping[str, Any], t: Training, batch: int,
           results: Sequence[RankResult], failed: list[int]) -> None:  # pragma: no cover - e2e and GPUs
    """Rank 0's summary of every rank and the SMOKE_TEST_RESULT line."""
    say("[smoke] summary\n" + summarize(results))
    result = {
        "ok": not failed,
        "world_size": t.place.world_size,
        "hosts": sorted({item.host for item in results}),
        "accelerator": "cpu" if t.place.cpu else "gpu",
        "micro_batch_per_gpu": batch,
        "precision": precision(config),
        "steps": args.steps,
        "start_step": t.start_step,
        "final_step": t.number,
        "final_loss": t.loss,
        "total_samples_per_second": round(sum(item.samples_per_second for item in results), 2),
        "max_peak_memory_mib": round(max(item.peak_memory_mib for item in results), 1),
        "non_finite_loss_ranks": failed,
    }
    say("SMOKE_TEST_RESULT " + json.dumps(result, sort_keys=True))
