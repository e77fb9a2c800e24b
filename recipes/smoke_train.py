#!/usr/bin/env python3
"""DeepSpeed cluster smoke test.

Launched on every worker by the DeepSpeed launcher, e.g. (the dev stack's default
``source.launchCommand`` of the Bitnami chart, which mounts this file at /app)::

    deepspeed --hostfile /job/hostfile smoke_train.py --deepspeed_config ds_config.json

Every rank checks that it sees the GPUs the launcher assigned to its node, then
trains a small MLP (built in code, nothing downloaded) on random data for a few
steps under ``deepspeed.initialize`` with the given DeepSpeed config, and
reports its throughput (samples/s) and peak GPU memory. Rank 0 prints a summary
of all ranks and a ``SMOKE_TEST_RESULT {json}`` line. Exit status: 0 on
success, 2 on bad arguments or launcher variables, 3 when a rank does not see
enough GPUs (agreed over gloo before NCCL starts, so every rank stops with this
status and rank 0 names the failing ranks), 4 when the loss is not finite, 5 when
NCCL did not use the GPU fabric's network plugin (on a fabric pool: NCCL's own
init lines, read by nccl_network.py, which the stack ships beside this script
there; agreed over the training group, so every rank stops), 143 when stopped by
SIGTERM after saving a checkpoint.

Preemption recovery (the contract for a user's training script as well): with a
checkpoint directory (``--checkpoint-dir``, else ``AIP_CHECKPOINT_DIR`` on
Vertex AI, else ``CHECKPOINT_DIR``: the bucket's FUSE path on GKE, the NFS claim
on Gaudi) every rank saves a DeepSpeed checkpoint every ``--checkpoint-every``
steps, at the end, and when any rank gets SIGTERM (Kubernetes' notice, before
the grace period ends in SIGKILL); on start it resumes from the latest one. At a
different world size the checkpoint is converted once to DeepSpeed's universal
format (``ds_to_universal``) and loaded with ``checkpoint.load_universal``.

``DS_ACCELERATOR=cpu`` runs the same path on CPUs with gloo (no GPU check):
that is how ``make e2e`` runs it across network-namespace hosts.

The program is this entry point (its arguments, the run's order and exit statuses) and the modules shipped beside it
wherever it is shipped (recipes/contract.py `own_modules`: the stack's ConfigMaps ship every smoke_train_*.py):
smoke_train_ranks.py (the launchers' variables, the GPU check, the training group, the fabric check),
smoke_train_checkpoint.py (saves and the resume), smoke_train_loop.py (the config's facts, the model, the steps)
and smoke_train_report.py (each rank's result, rank 0's summary). Their helpers that need no torch or deepspeed
sit at the top of each module (the functions below import them where they run), so they can be unit-tested
anywhere. The parser stays here: the stack reads its flags from this file's source (workloads/script_flags.py).
"""

from __future__ import annotations

import argparse
import math
import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from recipes.contract import EXIT_PREEMPTED, EXIT_USAGE
from recipes.shutdown import StopRequest, exit_without_teardown
from recipes.smoke_train_checkpoint import checkpoint_dir, load_resume, resume_point
from recipes.smoke_train_loop import Training, build_engine, load_config, micro_batch_size, precision, regression_batch
from recipes.smoke_train_ranks import (
    Place,
    cpu_run_requested,
    discover_master,
    fabric_network,
    gpu_check,
    gpu_check_failed,
    off_fabric,
    rank_env,
    say,
    start_training_group,
)
from recipes.smoke_train_report import RankResult, rank_result, report

DEFAULT_STEPS = 20
DEFAULT_WARMUP_STEPS = 3
EXIT_GPU_CHECK_FAILED = 3
EXIT_LOSS_NOT_FINITE = 4
EXIT_NOT_ON_FABRIC = 5


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
    parser.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate when the config names no optimizer")
    parser.add_argument(
        "--checkpoint-dir",
        default=None,
        help="save DeepSpeed checkpoints here and resume from the latest on start "
        "(default: AIP_CHECKPOINT_DIR, else CHECKPOINT_DIR; none: no checkpoints)",
    )
    parser.add_argument(
        "--checkpoint-every",
        type=_non_negative_int,
        default=int(os.environ.get("CHECKPOINT_EVERY_STEPS", "0") or 0),
        help="also save every N steps (default CHECKPOINT_EVERY_STEPS, else 0: only on SIGTERM and at the end)",
    )
    # Added by the DeepSpeed launcher to every rank (both spellings exist in the wild).
    parser.add_argument("--local_rank", "--local-rank", dest="local_rank", type=int, default=None)
    return parser.parse_args(argv)


def train_and_report(args: argparse.Namespace, config: dict[str, Any], place: Place, accelerator: Any,
                     stop: Any) -> int:  # pragma: no cover - run by the e2e (make e2e) and on GPUs
    """Resume if a checkpoint is there, train, gather every rank's result: the exit status."""
    import torch
    import torch.distributed as dist

    directory = checkpoint_dir(args.checkpoint_dir, os.environ)
    resume, config = resume_point(directory, place, config)
    engine = build_engine(args, config)
    start_step: int | None = 0 if resume is None else load_resume(engine, resume, place)
    if start_step is None:
        return EXIT_USAGE
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision(config), torch.float32)
    batch = micro_batch_size(config, place.world_size)
    inputs, targets = regression_batch(args, place.rank, batch, dtype, engine.device)
    t = Training(engine, accelerator, place, directory, inputs, targets, start_step)
    if not t.run(args, stop):
        return EXIT_PREEMPTED
    result = rank_result(t, args.warmup_steps + args.steps, batch)
    gathered: list[dict[str, Any] | None] = [None] * place.world_size
    dist.all_gather_object(gathered, asdict(result))
    results = [RankResult(**item) for item in gathered if item is not None]
    failed = [item.rank for item in results if not math.isfinite(item.final_loss)]
    if place.rank == 0:
        report(args, config, t, batch, results, failed)
    dist.barrier()
    return EXIT_LOSS_NOT_FINITE if failed else 0


def main(argv: Sequence[str] | None = None) -> int:  # pragma: no cover - run by the e2e (make e2e) and on GPUs
    args = parse_args(argv)
    net = fabric_network()
    want = net.expected(os.environ) if net else ()
    nccl_log = net.divert(os.environ) if net else None  # before NCCL starts: its init lines into a file we read
    config = load_config(args.deepspeed_config)
    discover_master(os.environ)
    try:
        ranks = rank_env(os.environ)
    except ValueError as error:
        say(f"[smoke] FAILED: {error}", err=True)
        return EXIT_USAGE
    os.environ.update(ranks)
    rank = int(ranks["RANK"])
    place = Place(rank, int(ranks["WORLD_SIZE"]), args.local_rank if args.local_rank is not None
                  else int(ranks["LOCAL_RANK"]), socket.gethostname(), cpu_run_requested(os.environ))

    import datetime
    import signal

    import torch.distributed as dist

    stop = StopRequest()
    signal.signal(signal.SIGTERM, stop)
    ok, message = gpu_check(args, place)
    say(f"[smoke] {message}")
    # One rendezvous store serves the GPU check's gloo group and then the training group.
    store = dist.TCPStore(ranks["MASTER_ADDR"], int(ranks["MASTER_PORT"]), place.world_size, is_master=rank == 0,
                          timeout=datetime.timedelta(minutes=10))
    if gpu_check_failed(store, place, ok, message):
        return EXIT_GPU_CHECK_FAILED
    accelerator, backend = start_training_group(store, place)
    if not place.cpu:
        accelerator.set_device(place.local_rank)
    if net and nccl_log and want and backend == "nccl" and off_fabric(net, nccl_log, want, place):
        code = EXIT_NOT_ON_FABRIC
    else:
        code = train_and_report(args, config, place, accelerator, stop)
    # PyTorch's shutdown rule (torch.distributed docs, "Shutdown"): destroy the groups before the process exits.
    # DeepSpeed still references them, so their threads live on: the process ends without teardown (below).
    dist.destroy_process_group()
    if net and nccl_log:  # NCCL's warnings went to the file with its init lines: into the pod's log too
        for line in net.warnings(net.read(nccl_log)):
            say(line, err=True)
    return code


if __name__ == "__main__":
    # As finetune.py: DeepSpeed keeps the gloo groups referenced after destroy_process_group(), so their threads
    # would race the interpreter's teardown; end without it (recipes/shutdown.py).
    exit_without_teardown(main)
