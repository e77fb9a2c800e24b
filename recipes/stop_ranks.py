#!/usr/bin/env python3
"""The training pods' preStop hook: SIGTERM to this container's training ranks, then wait until they are gone.

Why: Kubernetes sends SIGTERM to each container's main process only (preemption, drain, eviction). A worker's main
process is sshd; sshd exits without signalling its sessions, and when a PID namespace's init exits the kernel
SIGKILLs everything left in it, so the ranks would die without saving. The kubelet runs a container's preStop hook
before it sends that SIGTERM and waits for the hook, within terminationGracePeriodSeconds. This hook makes the
ranks get the notice first: each saves a checkpoint (finetune.py, smoke_train.py: the ranks agree on it at the next
step) and exits; then the hook returns and the kubelet stops sshd.

Only the ranks are signalled, never DeepSpeed's per-node launcher (deepspeed.launcher.launch): on SIGTERM it gives
its ranks 30 s, then SIGKILL, however long their save takes. Here its 30 s start only once a rank has exited on
its own, after the ranks' collective save. Once the ranks are gone the hook waits a few seconds more for their
parents (that per-node launcher, which polls its ranks every second): it then exits with the ranks' status, which
reaches the MPIJob's launcher through pdsh, before the kubelet's SIGTERM to sshd ends the pod.

The MPIJob's launcher runs this same script on every worker over ssh when it gets SIGTERM itself
(workloads/mpijob/nvidia.py stop_workers_function): on a whole-job stop both requests come at once; a rank
takes the second SIGTERM as the first.

A rank is a process of this container with a rank variable in its environment (LOCAL_RANK, set by DeepSpeed's
launcher for each rank; OMPI_COMM_WORLD_LOCAL_RANK, by OpenMPI's) whose parent has none: a rank's own children
(data loader workers) inherit the variable and are left to their rank. Only processes in the hook's own network
namespace count: in a container that is every process it sees, but a pod that shares the node's PID namespace
(hostPID) sees other pods' ranks too, and so does `make e2e`, whose hosts are network namespaces of one machine.

Usage: stop_ranks.py [--timeout SECONDS] [--proc /proc]. Prints what it did; always exits 0 (a failing hook
only delays the SIGTERM it precedes).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

RANK_VARIABLES = (b"LOCAL_RANK", b"OMPI_COMM_WORLD_LOCAL_RANK")
DEFAULT_TIMEOUT = 600.0  # the kubelet ends the hook at the grace period anyway
POLL_SECONDS = 0.2
PARENT_WAIT_SECONDS = 5.0  # DeepSpeed's launch.py polls its ranks every 1 s, then exits with the failed one's status


def _environ_names(proc: Path, pid: int) -> set[bytes] | None:
    """The names in /proc/PID/environ; None when the process is gone or not ours to read."""
    try:
        raw = (proc / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    return {entry.split(b"=", 1)[0] for entry in raw.split(b"\0") if entry}


def _parent(proc: Path, pid: int) -> int | None:
    """The parent PID from /proc/PID/stat (the field after the command, which may hold spaces and parentheses)."""
    try:
        stat = (proc / str(pid) / "stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None


def _is_rank_env(names: set[bytes] | None) -> bool:
    return names is not None and any(v in names for v in RANK_VARIABLES)


def _net_namespace(proc: Path, pid: int | str) -> str | None:
    try:
        return os.readlink(proc / str(pid) / "ns" / "net")
    except OSError:
        return None


def rank_pids(proc: Path = Path("/proc"), me: int | None = None) -> list[int]:
    """The ranks among the processes under `proc` in the network namespace of process `me` (default: this one):
    a rank variable in their environment, none in their parent's."""
    me = os.getpid() if me is None else me
    pod = _net_namespace(proc, me)
    pids = sorted(int(p.name) for p in proc.iterdir() if p.name.isdigit() and int(p.name) != me)
    ranks = []
    for pid in pids:
        if pod is None or _net_namespace(proc, pid) != pod:
            continue  # another pod's process, or one that is gone or not ours to inspect
        if not _is_rank_env(_environ_names(proc, pid)):
            continue
        parent = _parent(proc, pid)
        if parent is not None and _is_rank_env(_environ_names(proc, parent)):
            continue  # a rank's child: its rank handles the notice
        ranks.append(pid)
    return ranks


def signal_all(pids: Iterable[int], signum: int = signal.SIGTERM,
               kill: Callable[[int, int], None] = os.kill) -> list[int]:
    sent = []
    for pid in pids:
        try:
            kill(pid, signum)
            sent.append(pid)
        except (ProcessLookupError, PermissionError):
            pass
    return sent


def wait_gone(pids: Iterable[int], timeout: float, alive: Callable[[int], bool],
              clock: Callable[[], float] = time.monotonic, pause: Callable[[float], None] = time.sleep) -> list[int]:
    """Waits until none of `pids` is alive or `timeout` seconds passed; returns those still alive."""
    left = list(pids)
    deadline = clock() + timeout
    while True:
        left = [p for p in left if alive(p)]
        if not left or clock() >= deadline:
            return left
        pause(POLL_SECONDS)


def process_alive(proc: Path) -> Callable[[int], bool]:
    def alive(pid: int) -> bool:
        try:
            state = (proc / str(pid) / "stat").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return False
        return state[state.rfind(")") + 2:][:1] not in ("Z", "X")  # a zombie has exited
    return alive


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds to wait for the ranks")
    parser.add_argument("--proc", type=Path, default=Path("/proc"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    ranks = rank_pids(args.proc, me=os.getpid())
    if not ranks:
        print("[stop_ranks] no training rank in this container", flush=True)
        return 0
    parents = sorted({p for r in ranks if (p := _parent(args.proc, r)) is not None and p > 1})
    sent = signal_all(ranks)
    print(f"[stop_ranks] SIGTERM to ranks {sent}; waiting up to {args.timeout:.0f} s for their save", flush=True)
    started = time.monotonic()
    alive = process_alive(args.proc)
    left = wait_gone(sent, args.timeout, alive)
    took = time.monotonic() - started
    if left:
        print(f"[stop_ranks] ranks {left} still running after {took:.0f} s", flush=True)
        return 0
    print(f"[stop_ranks] every rank exited within {took:.1f} s", flush=True)
    # Their per-node launcher passes their status on (to pdsh, the MPIJob's launcher): give it the moment it needs.
    wait_gone(parents, min(PARENT_WAIT_SECONDS, max(0.0, args.timeout - took)), alive)
    return 0


if __name__ == "__main__":
    sys.exit(main())
