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

Last, the pass line (--pass-line, from data/gpu_fabric.yaml per machine type): the average bus bandwidth of one
collective over Google's own message sizes, as Cluster Toolkit's daily tests require of the same machines. The
collective is measured over those sizes too (beside the configured ones), rank 0 judges the figures as it printed
them (`judge` reads nccl-tests' lines the same way), every rank learns the verdict, and below the line every rank
exits 6: the Job fails, and the training that waits for it (workloads/first_up.py) is never created.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Iterable, Sequence
from typing import NamedTuple

UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
         "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}
BENCHMARKS = ("all_gather", "all_reduce", "reduce_scatter")
ELEMENT_BYTES = 4  # float32, as nccl-tests' default
EXIT_WRONG_NCCL = 3
EXIT_NOT_ON_FABRIC = 4
EXIT_BELOW_PASS_LINE = 6  # (5 is the smoke test's "not on the fabric")
# nccl-tests aligns each rank's element count down to 16 bytes (4 floats); a message too small for that is a size-0
# row with 0 GB/s, which its average counts: so do the rows here, to compare with Google's averages.
ALIGN_ELEMENTS = 4
SPLIT = ("all_gather", "reduce_scatter")  # collectives whose message is split over the ranks


class PassLine(NamedTuple):
    """The average bus bandwidth `benchmark` must reach over the message sizes min_bytes..max_bytes (doubling)."""

    benchmark: str
    gbps: float
    min_bytes: int
    max_bytes: int


class Row(NamedTuple):
    """One message size's result: its bus bandwidths in GB/s (out-of-place, and in-place in nccl-tests' lines)."""

    size: int
    busbw: tuple[float, ...]


def parse_size(text: str) -> int:
    """`1Mi`, `8G`, `512K`, `4096` -> bytes (Kubernetes-style suffixes, as the stack config writes them)."""
    match = re.fullmatch(r"(\d+)\s*([KMGT]i?)?B?", text.strip(), flags=re.IGNORECASE)
    if not match:
        raise argparse.ArgumentTypeError(f"expected a size such as 1Mi or 8G, got {text!r}")
    return int(match.group(1)) * UNITS[(match.group(2) or "").upper()]


def nominal_sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """min, 2 min, 4 min, ... up to max (nccl-tests -f 2), before alignment."""
    out, size = [], max(min_bytes, 1)
    while size <= max_bytes:
        out.append(size)
        size *= 2
    return out


def aligned(size: int, world: int, benchmark: str = "all_gather") -> int:
    """The size nccl-tests runs for `size`: each rank's element count aligned down to ALIGN_ELEMENTS (0: too small)."""
    step = ELEMENT_BYTES * ALIGN_ELEMENTS * (world if benchmark in SPLIT else 1)
    return size - size % step


def sizes(min_bytes: int, max_bytes: int, world: int, benchmark: str = "all_gather") -> list[int]:
    """Message sizes from min to max, doubling, each a whole number of aligned elements per rank (or 0)."""
    return [aligned(size, world, benchmark) for size in nominal_sizes(min_bytes, max_bytes)]


def sweep(benchmark: str, configured: tuple[int, int], line: PassLine | None,
          world: int) -> list[tuple[int, bool, bool]]:
    """(size, in the configured range, in the pass line's range) for every size measured: the pass line's collective
    also over the line's sizes, so its average is taken over the same sizes as Google's."""
    mine = set(nominal_sizes(*configured))
    judged = set(nominal_sizes(line.min_bytes, line.max_bytes)) if line and line.benchmark == benchmark else set()
    return [(aligned(n, world, benchmark), n in mine, n in judged) for n in sorted(mine | judged)]


def row_line(size: int, seconds: float, algbw: float, busbw: float) -> str:
    return (f"{size:>14} {size // ELEMENT_BYTES:>12} {'float':>6} {seconds * 1e6:>10.1f} "
            f"{algbw:>12.2f} {busbw:>12.2f}")


def parse_rows(lines: Iterable[str]) -> list[Row]:
    """The result rows among output lines: nccl-tests' (size count type redop root, then time algbw busbw #wrong
    out-of-place and in-place) and this script's (size count type time algbw busbw); other lines are skipped."""
    busbw_columns = {13: (7, 11), 6: (5,)}
    rows = []
    for line in lines:
        fields = line.split()
        columns = busbw_columns.get(len(fields))
        if columns is None or not (fields[0].isdigit() and fields[1].isdigit()) or fields[2].isdigit():
            continue
        try:
            rows.append(Row(int(fields[0]), tuple(float(fields[c]) for c in columns)))
        except ValueError:
            continue
    return rows


def average_busbw(rows: Sequence[Row]) -> float | None:
    """nccl-tests' "Avg bus bandwidth": the mean of every busbw it printed (each size, out-of-place and in-place)."""
    values = [bw for row in rows for bw in row.busbw]
    return sum(values) / len(values) if values else None


def judge(rows: Sequence[Row], line: PassLine, note: str = "") -> tuple[bool, str]:
    """(passed, one line for the log): the rows' average bus bandwidth against the pass line."""
    average = average_busbw(rows)
    source = f" ({note})" if note else ""
    if average is None:
        return False, (f"no {line.benchmark} result from {line.min_bytes} to {line.max_bytes} bytes to judge against "
                       f"the pass line of {line.gbps:g} GB/s{source}")
    ok = average >= line.gbps
    largest = rows[-1]
    text = (f"{line.benchmark} average bus bandwidth {average:.2f} GB/s over {len(rows)} message sizes from "
            f"{rows[0].size} to {largest.size} bytes, pass line {line.gbps:g} GB/s: "
            f"{'passed' if ok else 'FAILED'}; at {largest.size} bytes {max(largest.busbw):.2f} GB/s{source}")
    if not ok:
        text += (". The fabric is slower than Google measures these machines: the training that waits for this test "
                 "is not started (README, 'NCCL test: the first thing to run on a new pool')")
    return ok, text


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


def parse_pass_line(text: str) -> PassLine:
    """`all_gather:30:8:8Gi` (the stack's --pass-line, data/gpu_fabric.yaml) -> PassLine."""
    parts = text.split(":")
    try:
        if len(parts) != 4 or parts[0] not in BENCHMARKS:
            raise ValueError
        line = PassLine(parts[0], float(parts[1]), parse_size(parts[2]), parse_size(parts[3]))
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(
            f"expected BENCHMARK:GBPS:MIN:MAX such as all_gather:30:8:8Gi (BENCHMARK one of {', '.join(BENCHMARKS)}), "
            f"got {text!r}") from None
    if line.gbps <= 0 or line.min_bytes > line.max_bytes:
        raise argparse.ArgumentTypeError(f"a pass line needs GBPS > 0 and MIN <= MAX, got {text!r}")
    return line


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
    parser.add_argument("--pass-line", type=parse_pass_line,
                        help="BENCHMARK:GBPS:MIN:MAX: fail when BENCHMARK's average bus bandwidth over MIN..MAX is "
                             "below GBPS")
    parser.add_argument("--pass-line-note", default="", help="where the pass line comes from (for the log)")
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
        from recipes import nccl_network
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
    line: PassLine | None = getattr(args, "pass_line", None)
    passed = True
    for benchmark in [*args.benchmarks, *([line.benchmark] if line and line.benchmark not in args.benchmarks else [])]:
        mine, judged = [], []
        if rank == 0:
            print(f"# {benchmark}\n#{'size':>13} {'count':>12} {'type':>6} {'time(us)':>10} "
                  f"{'algbw(GB/s)':>12} {'busbw(GB/s)':>12}")
        for size, configured, in_line in sweep(benchmark, (args.min_bytes, args.max_bytes), line, world):
            seconds = _time(torch, dist, benchmark, size, world, args.iters, args.warmup) if size else 0.0
            algbw, busbw = bandwidth(benchmark, size, seconds, world) if size else (0.0, 0.0)
            text = row_line(size, seconds, algbw, busbw)
            mine += [text] if configured else []
            judged += [text] if in_line else []
            if rank == 0:
                print(text, flush=True)
        rows = parse_rows(mine)
        if rank == 0 and rows:
            print(f"# {benchmark} Avg bus bandwidth    : {average_busbw(rows):.2f} GB/s")
            print(f"# {benchmark} bus bandwidth at {rows[-1].size} bytes: {rows[-1].busbw[0]:.2f} GB/s", flush=True)
        if line and benchmark == line.benchmark and rank == 0:
            passed, verdict = judge(parse_rows(judged), line, getattr(args, "pass_line_note", ""))
            print(f"# nccl_bench: {verdict}", file=sys.stdout if passed else sys.stderr, flush=True)
    # Rank 0 judged: every rank learns the verdict, so every pod of the Job fails together.
    failed = torch.zeros(1, device="cuda").fill_(0.0 if passed else 1.0)
    dist.all_reduce(failed)
    dist.destroy_process_group()
    return EXIT_BELOW_PASS_LINE if failed.item() > 0 else 0


if __name__ == "__main__":
    sys.exit(main())
