"""smoke_train.py's ranks: where this rank runs (the launchers' variables), the GPU check and the ranks' agreement on
it, the training group, and the GPU fabric's check at the first collective.

The helpers above `Place` need neither torch nor deepspeed (the functions below it import them where they run), so
they are unit-tested anywhere (tests/test_image.py, tests/test_smoke_train_run.py).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def say(text: str, *, err: bool = False) -> None:
    """Print, surviving a closed stdout: on preemption the ssh session that carries it may be gone first."""
    with contextlib.suppress(OSError):
        print(text, file=sys.stderr if err else sys.stdout, flush=True)


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
