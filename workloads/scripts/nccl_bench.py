"""NCCL bus bandwidth across nodes: all_gather / all_reduce / reduce_scatter, the way nccl-tests' *_perf report it.

Started by `torchrun` on every node of an NCCL test (workloads/nccl_test.py), one process per GPU, through the
fabric's NCCL env script. Rank 0 prints one line per message size (bytes, time, algorithm and bus bandwidth in
GB/s) and, per collective, `# Avg bus bandwidth` like nccl-tests, so the figure compares with Google's
(README, Training at scale). Bus bandwidth follows nccl-tests' PERFORMANCE.md: algbw x 2(n-1)/n for
all_reduce, algbw x (n-1)/n for all_gather and reduce_scatter, where n is the number of ranks.

Before any benchmark every rank checks the NCCL torch loaded (`torch.cuda.nccl.version()`): the image's own
(--expect-nccl; another one means a different libnccl.so.2 was preloaded) and at least the fabric plugin's minimum
(--min-nccl), else it exits 3 and the Job fails; rank 0 prints the version and whether Google qualified it
(--qualified-nccl). The stack passes all three from data/versions.yaml and data/gpu_fabric.yaml.

Then, on a fabric pool, every rank reads NCCL's own init lines (nccl_network.py, shipped beside this script): a
communicator on NCCL's Socket or IB transport instead of the fabric plugin's network means the plugin did not load,
and the bandwidth measured would be TCP's over eth0. Every rank then exits 4 (rank 0 says how many failed), so
the Job fails loudly instead of reporting a low figure.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence

UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
         "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}
BENCHMARKS = ("all_gather", "all_reduce", "reduce_scatter")
ELEMENT_BYTES = 4  # float32, as nccl-tests' default
EXIT_WRONG_NCCL = 3
EXIT_NOT_ON_FABRIC = 4


def parse_size(text: str) -> int:
    """`1Mi`, `8G`, `512K`, `4096` -> bytes (Kubernetes-style suffixes, as the stack config writes them)."""
    match = re.fullmatch(r"(\d+)\s*([KMGT]i?)?B?", text.strip(), flags=re.IGNORECASE)
    if not match:
        raise argparse.ArgumentTypeError(f"expected a size such as 1Mi or 8G, got {text!r}")
    return int(match.group(1)) * UNITS[(match.group(2) or "").upper()]


def sizes(min_bytes: int, max_bytes: int, world: int) -> list[int]:
    """Message sizes from min to max, doubling (nccl-tests -f 2), each a whole number of elements per rank."""
    step = world * ELEMENT_BYTES
    out, size = [], max(min_bytes, step)
    while size <= max_bytes:
        out.append(size - size % step)
        size *= 2
    return out


def bus_factor(benchmark: str, world: int) -> float:
    if benchmark == "all_reduce":
        return 2 * (world - 1) / world
    return (world - 1) / world


def bandwidth(benchmark: str, size: int, seconds: float, world: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for one operation on `size` bytes that took `seconds`."""
    algbw = size / seconds / 1e9
    return algbw, algbw * bus_factor(benchmark, world)


def version_key(version: str) -> tuple[int, ...]:
    """`2.28.7` or `2.28.7-1` (NCCL's release suffix) -> (2, 28, 7)."""
    return tuple(int(part) for part in version.split("-")[0].split("."))


def nccl_text(version: object) -> str:
    """torch.cuda.nccl.version() (a (major, minor, patch[, suffix]) tuple, an int in old torch) -> `2.29.7`."""
    if isinstance(version, int):  # NCCL_VERSION_CODE: major*10000 + minor*100 + patch
        return f"{version // 10000}.{version // 100 % 100}.{version % 100}"
    return ".".join(str(part) for part in tuple(version)[:3])


def check_nccl(ran: str, expected: str | None, minimum: str | None, qualified: str | None) -> tuple[bool, str]:
    """(ok, one line for the log): the NCCL torch ran against what the image ships and the fabric accepts."""
    notes = []
    ok = True
    if expected is not None and version_key(ran) != version_key(expected):
        ok = False
        notes.append(f"the image ships {expected}: torch loaded another libnccl.so.2 (LD_PRELOAD, or a changed venv)")
    if minimum is not None and version_key(ran) < version_key(minimum):
        ok = False
        notes.append(f"the fabric's plugin needs {minimum} or later: NCCL would fail at init or fall back to TCP")
    if qualified is not None:
        same = version_key(ran) == version_key(qualified)
        notes.append(f"Google qualifies the fabric's plugin with {qualified}" + ("" if same else ", not this one"))
    return ok, f"NCCL {ran}" + (f" ({'; '.join(notes)})" if notes else "")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--benchmarks", default="all_gather,all_reduce",
                        help=f"comma-separated, of {', '.join(BENCHMARKS)}")
    parser.add_argument("--min-bytes", type=parse_size, default=parse_size("1Mi"))
    parser.add_argument("--max-bytes", type=parse_size, default=parse_size("8Gi"))
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--expect-nccl", help="the NCCL the image ships (fail on another)")
    parser.add_argument("--min-nccl", help="the oldest NCCL the fabric's plugin works with (fail below)")
    parser.add_argument("--qualified-nccl", help="the NCCL Google qualifies the fabric's plugin with (reported)")
    args = parser.parse_args(argv)
    args.benchmarks = [b for b in args.benchmarks.split(",") if b]
    unknown = [b for b in args.benchmarks if b not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}")
    return args


def _time(torch, dist, benchmark: str, size: int, world: int, iters: int, warmup: int) -> float:
    """Seconds per operation, on GPU events (nccl-tests times out-of-place operations the same way)."""
    per_rank = size // ELEMENT_BYTES // (1 if benchmark == "all_reduce" else world)
    send = torch.ones(per_rank if benchmark != "reduce_scatter" else per_rank * world, device="cuda")
    recv = torch.empty(per_rank * world if benchmark == "all_gather" else per_rank, device="cuda")

    def op() -> None:
        if benchmark == "all_reduce":
            dist.all_reduce(send)
        elif benchmark == "all_gather":
            dist.all_gather_into_tensor(recv, send)
        else:
            dist.reduce_scatter_tensor(recv, send)

    for _ in range(warmup):
        op()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        op()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000 / iters


def fabric_network():
    """nccl_network.py, shipped beside this script on a fabric pool (workloads/fabric.py); None elsewhere."""
    try:
        import nccl_network
    except ImportError:
        return None
    return nccl_network


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    net = fabric_network()
    want = net.expected(os.environ) if net else ()
    log = net.divert(os.environ) if net else None  # before NCCL's first call: its init lines into a file we read
    import torch
    import torch.distributed as dist

    ok, nccl_line = check_nccl(nccl_text(torch.cuda.nccl.version()), args.expect_nccl, args.min_nccl,
                               args.qualified_nccl)
    if not ok:  # every rank, before the rendezvous: the Job fails with the reason in each pod's log
        print(f"# nccl_bench: wrong NCCL: {nccl_line}", file=sys.stderr, flush=True)
        return EXIT_WRONG_NCCL
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl")
    try:
        return _run(args, torch, dist, net, want, log, nccl_line)
    finally:
        if net and log:  # NCCL's warnings went to the file: into the pod's log with them
            for line in net.warnings(net.read(log)):
                print(line, file=sys.stderr, flush=True)


def _run(args: argparse.Namespace, torch, dist, net, want: Sequence[str], log: str | None,
         nccl_line: str) -> int:
    world, rank = dist.get_world_size(), dist.get_rank()
    nodes = int(os.environ.get("NODES", "1"))
    if net and log and want:
        fabric = os.environ.get(net.FABRIC_ENV) or "the fabric"
        failed, ok, line = net.check(torch, dist, log, want, fabric)
        if not ok:
            print(f"# nccl_bench: rank {rank}: {line}", file=sys.stderr, flush=True)
        if failed:
            if rank == 0:
                print(f"# nccl_bench: {failed} of {world} rank(s) did not use {fabric}'s network: the bandwidth "
                      "would be measured on TCP over eth0. Failing the test.", file=sys.stderr, flush=True)
            dist.destroy_process_group()
            return EXIT_NOT_ON_FABRIC
        if rank == 0:
            print(f"# nccl_bench: {line}", flush=True)
    if rank == 0:
        print(f"# nccl_bench: {world} ranks on {nodes} node(s), {nccl_line}", flush=True)
    for benchmark in args.benchmarks:
        busbws = []
        if rank == 0:
            print(f"# {benchmark}\n#{'size':>13} {'count':>12} {'type':>6} {'time(us)':>10} "
                  f"{'algbw(GB/s)':>12} {'busbw(GB/s)':>12}")
        for size in sizes(args.min_bytes, args.max_bytes, world):
            seconds = _time(torch, dist, benchmark, size, world, args.iters, args.warmup)
            algbw, busbw = bandwidth(benchmark, size, seconds, world)
            busbws.append(busbw)
            if rank == 0:
                print(f"{size:>14} {size // ELEMENT_BYTES:>12} {'float':>6} {seconds * 1e6:>10.1f} "
                      f"{algbw:>12.2f} {busbw:>12.2f}", flush=True)
        if rank == 0 and busbws:
            print(f"# {benchmark} Avg bus bandwidth    : {sum(busbws) / len(busbws):.2f} GB/s")
            print(f"# {benchmark} bus bandwidth at {sizes(args.min_bytes, args.max_bytes, world)[-1]} bytes: "
                  f"{busbws[-1]:.2f} GB/s", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
