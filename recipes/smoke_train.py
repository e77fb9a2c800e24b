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

The helpers above ``Place`` do not need torch or deepspeed (the functions below
it import them where they run), so they can be unit-tested anywhere.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from recipes.contract import EXIT_PREEMPTED, EXIT_USAGE
from recipes.shutdown import StopRequest, exit_without_teardown

DEFAULT_STEPS = 20
DEFAULT_WARMUP_STEPS = 3
DEFAULT_MICRO_BATCH = 8
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


def rank_env(env: Mapping[str, str]) -> dict[str, str]:
    """The torch.distributed rendezvous variables of this process, as a dict to put into os.environ.

    The DeepSpeed launcher (pdsh/ssh) sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT.
    Under Open MPI's mpirun (DeepSpeed's ``--launcher openmpi``) only OMPI_COMM_WORLD_* and the exported
    MASTER_ADDR/MASTER_PORT exist, so the ranks come from Open MPI's names. A bare ``python smoke_train.py``
    is a world of one on this host.
    """
    out: dict[str, str] = {}
    sources = {
        "RANK": ("RANK", "OMPI_COMM_WORLD_RANK"),
        "WORLD_SIZE": ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"),
        "LOCAL_RANK": ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"),
        "LOCAL_SIZE": ("LOCAL_SIZE", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    }
    defaults = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_SIZE": "1"}
    for name, candidates in sources.items():
        value = next((env[c].strip() for c in candidates if env.get(c, "").strip()), defaults[name])
        if not value.isdigit():
            raise ValueError(f"{name}={value!r}: expected a non-negative integer from the launcher")
        out[name] = value
    if int(out["WORLD_SIZE"]) < 1 or int(out["RANK"]) >= int(out["WORLD_SIZE"]):
        raise ValueError(f"RANK={out['RANK']} is not below WORLD_SIZE={out['WORLD_SIZE']}")
    if int(out["WORLD_SIZE"]) > 1 and not env.get("MASTER_ADDR", "").strip():
        raise ValueError("MASTER_ADDR is not set: the launcher must name the first host of the hostfile")
    out["MASTER_ADDR"] = env.get("MASTER_ADDR", "").strip() or "127.0.0.1"
    port = env.get("MASTER_PORT", "").strip() or "29500"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"MASTER_PORT={port!r}: expected a TCP port")
    out["MASTER_PORT"] = port
    return out


def cpu_run_requested(env: Mapping[str, str]) -> bool:
    """``DS_ACCELERATOR=cpu`` asks DeepSpeed for its CPU accelerator: the GPU check does not apply.

    Only the explicit request counts: without it DeepSpeed also falls back to the CPU on a pod that sees
    no GPU, which is exactly what the check must report.
    """
    return env.get("DS_ACCELERATOR", "").strip().lower() == "cpu"


def checkpoint_dir(argument: str | None, env: Mapping[str, str]) -> str | None:
    """Where checkpoints go: ``--checkpoint-dir``, else Vertex AI's AIP_CHECKPOINT_DIR (mapped to the
    /gcs/ FUSE path by the image's start script), else CHECKPOINT_DIR (the stack's bucket or NFS path)."""
    for value in (argument, env.get("AIP_CHECKPOINT_DIR"), env.get("CHECKPOINT_DIR")):
        if value and value.strip():
            return value.strip()
    return None


STATE_FILE = "smoke_state.json"


def read_resume_state(directory: str | None) -> dict[str, Any] | None:
    """The state file rank 0 writes after each checkpoint (step, world size, tag, loss), or None."""
    if not directory:
        return None
    path = os.path.join(directory, STATE_FILE)
    try:
        with open(path, encoding="utf-8") as handle:
            state = json.load(handle)
    except FileNotFoundError:
        return None
    if not isinstance(state, dict) or not {"step", "world_size", "tag"} <= state.keys():
        raise ValueError(f"{path}: not a smoke-test checkpoint state (step, world_size, tag)")
    return state


def write_resume_state(directory: str, state: Mapping[str, Any]) -> None:
    """Atomically (write, then rename): a preemption mid-write leaves the previous state intact."""
    path = os.path.join(directory, STATE_FILE)
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(dict(state), handle, sort_keys=True)
    os.replace(path + ".tmp", path)


def universal_tag(tag: str) -> str:
    return f"{tag}_universal"


def due_for_checkpoint(step: int, every: int) -> bool:
    """A periodic checkpoint after every `every` steps (0: none, only on SIGTERM and at the end)."""
    return every > 0 and step > 0 and step % every == 0


def say(text: str, *, err: bool = False) -> None:
    """Print, surviving a closed stdout: on preemption the ssh session that carries it may be gone first."""
    with contextlib.suppress(OSError):
        print(text, file=sys.stderr if err else sys.stdout, flush=True)


def fabric_network() -> Any:
    """nccl_network.py, shipped beside this script on a GPU fabric pool (workloads/fabric.py); None elsewhere."""
    try:
        from recipes import nccl_network
    except ImportError:
        return None
    return nccl_network


@dataclass(frozen=True)
class Place:
    """Where this rank runs: its ranks, its host, and whether it runs on CPUs (DS_ACCELERATOR=cpu)."""

    rank: int
    world_size: int
    local_rank: int
    host: str
    cpu: bool


@dataclass(frozen=True)
class Resume:
    """The checkpoint a run starts from: its directory, the saved state, and the tag to load (a universal one at a
    different world size)."""

    directory: str
    state: dict[str, Any]
    tag: str


def discover_master(env: Mapping[str, str]) -> None:  # pragma: no cover - run by the e2e (make e2e) and on GPUs
    """DeepSpeed's openmpi launcher exports no MASTER_ADDR: rank 0 shares its address over MPI (mpi4py)."""
    if env.get("OMPI_COMM_WORLD_RANK") and not env.get("MASTER_ADDR"):
        from deepspeed.comm.comm import mpi_discovery

        mpi_discovery(distributed_port=int(env.get("MASTER_PORT") or 29500), verbose=False)


def gpu_check(args: argparse.Namespace, place: Place) -> tuple[bool, str]:  # pragma: no cover - e2e and GPUs
    """This rank's GPU check (none on CPUs): whether it sees the GPUs the launcher assigned, and the line saying so."""
    if place.cpu:
        return True, f"rank {place.rank} on {place.host}: CPU run (DS_ACCELERATOR=cpu), no GPU check"
    import torch

    return check_gpu_visibility(
        torch.cuda.device_count() if torch.cuda.is_available() else 0,
        local_world_size(os.environ),
        args.expected_gpus_per_node,
        rank=place.rank,
        host=place.host,
        visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
    )


def gpu_check_failed(store: Any, place: Place, ok: bool, message: str) -> bool:  # pragma: no cover - e2e and GPUs
    """Agree on the GPU check over gloo BEFORE anything touches NCCL: NCCL refuses to start on a rank without a GPU
    (a traceback, exit 1), and every rank must stop together with rank 0 naming the failing ones."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.PrefixStore("smoke/gpu-check", store), rank=place.rank,
                            world_size=place.world_size)
    checks: list[dict[str, Any] | None] = [None] * place.world_size
    dist.all_gather_object(checks, {"ok": ok, "message": message})
    dist.destroy_process_group()
    failures = [item["message"] for item in checks if item is not None and not item["ok"]]
    if failures and place.rank == 0:
        for failure in failures:
            say(f"[smoke] FAILED: {failure}", err=True)
    return bool(failures)


def start_training_group(store: Any, place: Place) -> tuple[Any, str]:  # pragma: no cover - e2e and GPUs
    """The training group on the accelerator's backend (gloo on CPUs), which DeepSpeed adopts: (accelerator,
    backend)."""
    import deepspeed
    import torch.distributed as dist
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    backend = accelerator.communication_backend_name()
    if backend == "ccl":  # DeepSpeed's CPU accelerator without oneCCL installed talks gloo
        backend = "gloo"
    dist.init_process_group(backend, store=dist.PrefixStore("smoke/train", store), rank=place.rank,
                            world_size=place.world_size)
    deepspeed.init_distributed(dist_backend=backend)  # adopts the group above
    return accelerator, backend


def off_fabric(net: Any, nccl_log: str, want: Any, place: Place) -> bool:  # pragma: no cover - e2e and GPUs
    """The first collective proves the fabric: a plugin that did not load leaves NCCL on TCP over eth0."""
    import torch
    import torch.distributed as dist

    fabric = os.environ.get(net.FABRIC_ENV) or "the fabric"
    failed, on_fabric, line = net.check(torch, dist, nccl_log, want, fabric)
    if not on_fabric or place.rank == 0:
        say(f"[smoke] rank {place.rank}: {line}", err=not on_fabric)
    if failed and place.rank == 0:
        say(f"[smoke] FAILED: {failed} of {place.world_size} rank(s) did not use {fabric}'s network", err=True)
    return bool(failed)


def resume_point(directory: str | None, place: Place,
                 config: dict[str, Any]) -> tuple[Resume | None, dict[str, Any]]:  # pragma: no cover - e2e
    """The checkpoint to resume from (None: a fresh start), and the DeepSpeed config to load it with. At a different
    world size ZeRO's partitioned optimizer states are re-sliced through DeepSpeed's universal checkpoint
    (converted once, by rank 0, beside the original)."""
    state = read_resume_state(directory)
    if state is None or directory is None:
        return None, config
    if int(state["world_size"]) == place.world_size:
        return Resume(directory, state, state["tag"]), config
    import torch.distributed as dist

    tag = universal_tag(state["tag"])
    if place.rank == 0 and not os.path.isdir(os.path.join(directory, tag)):
        say(f"[smoke] converting {state['tag']} (world size {state['world_size']}) to a universal checkpoint")
        import subprocess

        subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
                        "--input_folder", os.path.join(directory, state["tag"]),
                        "--output_folder", os.path.join(directory, tag),
                        "--inject_missing_state"], check=True)
    dist.barrier()
    return Resume(directory, state, tag), {**config, "checkpoint": {**config.get("checkpoint", {}),
                                                                  "load_universal": True}}


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


def load_resume(engine: Any, resume: Resume, place: Place) -> int | None:  # pragma: no cover - e2e
    """The step the run resumes at; None when the checkpoint does not load."""
    loaded, client_state = engine.load_checkpoint(resume.directory, tag=resume.tag)
    if loaded is None:
        say(f"[smoke] FAILED: cannot load checkpoint {resume.tag} from {resume.directory}", err=True)
        return None
    state = resume.state
    start_step = int((client_state or {}).get("smoke_step", state["step"]))
    say(f"[smoke] rank {place.rank}: resumed from {resume.directory}/{resume.tag} at step {start_step} "
        f"(saved at world size {state['world_size']}, now {place.world_size}, last loss {state.get('loss')})")
    return start_step


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
