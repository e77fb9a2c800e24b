"""Did NCCL use the GPU fabric's network plugin? NCCL's own init lines say so; this module reads them.

Shipped beside a job's script on a GPU fabric pool (with nccl_env.sh, workloads/fabric.py) and imported by
nccl_bench.py (the NCCL test) and smoke_train.py (after its first collective). The pod contract names the network
the fabric's plugin registers (FABRIC_NCCL_NETWORK, from data/gpu_fabric.yaml `ncclNetwork`: FasTrak for TCPXO,
GPUDirectTCPX_v7 for TCPX, gIB for RDMA). NCCL tries the external plugin first and, when it does not load or
initialize, goes on to its own IB and Socket transports with nothing but INFO lines (NVIDIA/nccl v2.29.7-1
src/plugin/net.cc ncclNetInit), so a fabric pool silently runs on TCP over eth0 at a fraction of its bandwidth
unless someone reads "Using network ..." (src/init.cc, INFO(NCCL_INIT)).

How a rank reads them: before NCCL starts, `divert()` raises NCCL_DEBUG to INFO with INIT in NCCL_DEBUG_SUBSYS
(a fabric's profile may have set WARN) and points NCCL_DEBUG_FILE at a file of this process's own (NCCL expands
%p to the pid, and line-buffers it: src/debug.cc); after the first collective `verdict()` reads it. The rank then
prints its NCCL WARN lines (`warnings()`), which would otherwise stay in that file.

No torch here: the pure functions are unit-tested anywhere.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterable, MutableMapping, Sequence

NETWORK_ENV = "FABRIC_NCCL_NETWORK"  # the network name(s) the fabric's plugin registers, comma-separated
FABRIC_ENV = "FABRIC_NAME"  # the fabric's name, for messages
LOG_DIR = "/tmp"
LOG_PATTERN = "nccl-debug.%p.log"  # NCCL_DEBUG_FILE: %p is the process id (src/debug.cc)
# NCCL's own transports, which it falls back to (src/transport/net_ib/common.cc "IB", net_socket.cc "Socket").
INTERNAL = ("IB", "Socket")
USING = re.compile(r"NCCL INFO Using network (.+?)\s*$")  # a name may have spaces ("AWS Libfabric")
LOADED = re.compile(r"NCCL INFO NET/Plugin: Loaded net plugin (.+?) \(v(\d+)\)")
WARN = re.compile(r"NCCL WARN ")


def expected(env: MutableMapping[str, str]) -> tuple[str, ...]:
    """The fabric's network name(s) from the pod contract; empty off a fabric pool (nothing to check)."""
    return tuple(n.strip() for n in env.get(NETWORK_ENV, "").split(",") if n.strip())


def log_path(pattern: str, pid: int, host: str) -> str:
    """NCCL_DEBUG_FILE as NCCL expands it: %p the pid, %h the host name up to its first dot, %% a percent."""
    return re.sub(r"%([%hp])", lambda m: {"%": "%", "h": host.split(".")[0], "p": str(pid)}[m.group(1)], pattern)


def divert(env: MutableMapping[str, str]) -> str | None:
    """Before NCCL's first call: INFO lines of INIT into a file of this process's own. Returns the file NCCL will
    write (a NCCL_DEBUG_FILE already set is kept), or None off a fabric pool."""
    if not expected(env):
        return None
    if env.get("NCCL_DEBUG", "").upper() not in ("INFO", "TRACE"):
        env["NCCL_DEBUG"] = "INFO"
    subsys = env.get("NCCL_DEBUG_SUBSYS", "").upper()
    if subsys.startswith("^") or not ({"INIT", "ALL"} & set(subsys.split(","))):
        env["NCCL_DEBUG_SUBSYS"] = "INIT,NET"
    env.setdefault("NCCL_DEBUG_FILE", f"{LOG_DIR}/{LOG_PATTERN}")
    return log_path(env["NCCL_DEBUG_FILE"], os.getpid(), socket.gethostname())


def networks_used(lines: Iterable[str]) -> list[str]:
    """Every network NCCL said it used, one per communicator, in order."""
    return [m.group(1) for line in lines if (m := USING.search(line.rstrip("\n")))]


def plugins_loaded(lines: Iterable[str]) -> list[str]:
    return [f"{m.group(1)} (v{m.group(2)})" for line in lines if (m := LOADED.search(line))]


def verdict(lines: Sequence[str], want: Sequence[str], fabric: str = "the fabric") -> tuple[bool, str]:
    """(ok, one line for the log): every communicator used one of the fabric's networks."""
    used = networks_used(lines)
    names = " or ".join(want)
    if not used:
        return False, (f"NCCL printed no 'Using network' line, so nothing shows it used {fabric}'s network {names}: "
                       "it needs NCCL_DEBUG=INFO with INIT in NCCL_DEBUG_SUBSYS (the pod contract sets both)")
    wrong = [n for n in dict.fromkeys(used) if n.lower() not in {w.lower() for w in want}]
    loaded = plugins_loaded(lines)
    if not wrong:
        return True, f"NCCL used {fabric}'s network {used[0]} ({len(used)} communicator(s); plugin {', '.join(loaded)})"
    plugin = f"it loaded {', '.join(loaded)}" if loaded else "no net plugin loaded (libnccl-net.so)"
    if all(n in INTERNAL for n in wrong):
        return False, (f"NCCL fell back to its own {'/'.join(wrong)} transport instead of {fabric}'s network {names}: "
                       f"{plugin}; the fabric's bandwidth is not there. Check the plugin installer DaemonSet on this "
                       "node, LD_LIBRARY_PATH (/usr/local/nvidia/lib64) and the NIC annotations")
    return False, f"NCCL used network {'/'.join(wrong)}, not {fabric}'s network {names}: {plugin}"


def read(path: str | None) -> list[str]:
    if not path:
        return []
    try:
        with open(path, encoding="utf-8", errors="replace") as log:
            return log.readlines()
    except OSError:
        return []


def warnings(lines: Iterable[str]) -> list[str]:
    """NCCL's WARN lines, which the diverted file would otherwise keep out of the pod's log."""
    return [line.rstrip("\n") for line in lines if WARN.search(line)]


def check(torch, dist, path: str, want: Sequence[str], fabric: str) -> tuple[int, bool, str]:
    """After init_process_group, on every rank: one all_reduce makes NCCL create its communicator (and log the
    network it chose); then this rank's verdict, and how many ranks failed, summed over the same group (which works
    on whatever transport NCCL chose), so every rank stops together instead of the others waiting for it."""
    probe = torch.zeros(1, device="cuda")
    dist.all_reduce(probe)
    ok, line = verdict(read(path), want, fabric)
    probe.fill_(0.0 if ok else 1.0)
    dist.all_reduce(probe)
    return int(probe.item()), ok, line
