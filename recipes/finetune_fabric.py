"""finetune.py's fabric gate: no training on a GPU fabric pool whose NCCL did not use the fabric's network.

On a fabric pool (A3 High/Mega/Ultra, A4) the stack ships nccl_network.py beside the recipe and names the network
the fabric's plugin registers (FABRIC_NCCL_NETWORK). NCCL that cannot load or start the plugin goes on over its own
Socket transport with nothing but INFO lines, so a run on nodes whose plugin installer did not run (a DWS or
fallback pool's first nodes, which no NCCL test Job can reach before the run: checks/capacity.py) would train for
days at a fraction of the fabric's bandwidth. Here, as in smoke_train.py: NCCL's init lines go to a file of the
rank's own (`nccl_divert`, before NCCL starts), one all_reduce after the process group starts makes NCCL pick its
network, and every rank reads its verdict, summed over the group so all stop together (nccl_network.check).

A refusal is final: finetune.py exits 2 (EXIT_USAGE), the status the NVIDIA launcher remembers and does not retry
(workloads/mpijob/nvidia.py FINAL_EXIT_STATUSES), because a restart lands on the same nodes. The message names the
pools the run may be on (FINETUNE_POOLS: its pool, then its fallbackPool; which one Kueue admitted it to is in
`kubectl describe workload`).

Off a fabric pool, on CPU (gloo) or without nccl_network.py beside it: no check.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

POOLS_ENV = "FINETUNE_POOLS"  # the run's pool, then its fallbackPool, comma-separated (workloads/finetune.py)


def network_module() -> Any | None:
    """nccl_network.py, shipped beside this script on a GPU fabric pool (workloads/fabric.py); None elsewhere."""
    try:
        from recipes import nccl_network
    except ImportError:
        return None
    return nccl_network


def nccl_divert(environ: MutableMapping[str, str], net: Any | None = None) -> tuple[Any | None, str | None]:
    """Before NCCL's first call: its INIT lines into a file this rank reads (None off a fabric pool)."""
    net = net if net is not None else network_module()
    return net, (net.divert(environ) if net is not None else None)


def pools_text(environ: MutableMapping[str, str]) -> str:
    pools = [p for p in environ.get(POOLS_ENV, "").split(",") if p]
    if not pools:
        return "this pool"
    if len(pools) == 1:
        return f"pool {pools[0]}"
    return f"pool {pools[0]} or its fallbackPool {pools[1]} (`kubectl describe workload` names the flavor it ran on)"


def fabric_refusal(net: Any | None, log: str | None, environ: MutableMapping[str, str], torch: Any, dist: Any,
                   say: Any = print) -> str | None:
    """After the process group starts, on every rank: None when NCCL used the fabric's network (or there is nothing
    to check), else why this run must not train."""
    if net is None or not log or not dist.is_initialized() or dist.get_backend() != "nccl":
        return None
    want = net.expected(environ)
    if not want:
        return None
    fabric = environ.get(net.FABRIC_ENV) or "the fabric"
    failed, on_fabric, line = net.check(torch, dist, log, want, fabric)
    rank = dist.get_rank()
    if not on_fabric or rank == 0:
        say(f"rank {rank}: {line}")
    for warning in net.warnings(net.read(log)) if not on_fabric else []:
        say(warning)
    if not failed:
        return None
    return (f"{failed} of {dist.get_world_size()} rank(s) did not use {fabric}'s network ({' or '.join(want)}) on "
            f"{pools_text(environ)}: NCCL would run this training over its own transport at a fraction of the "
            "fabric's bandwidth. Not training (final: no restart fixes the nodes). Check the fabric's plugin "
            "installer DaemonSet on that pool's nodes (kubectl -n kube-system get ds), then re-create the job")
