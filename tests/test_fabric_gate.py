"""Gate on the fabric (issue 31, item 3): the NCCL test fails below its machine type's pass line (Cluster Toolkit's
daily tests, data/gpu_fabric.yaml), judged the way nccl-tests averages, and the training of the same pool starts
only after it passed."""

from __future__ import annotations

import argparse
import types
from typing import Any

import pytest
from conftest import reference, stack_run
from test_fabric_in_use import _Tensor

from model import fabric
from recipes import nccl_bench

JOB = "kubernetes:batch/v1:Job"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"

# Google's published 2-node all_gather on A3 High (Cluster Toolkit examples/gke-a3-highgpu/multi-node-test-plan.md
# @ 1047080), as nccl-tests printed it: nccl-tests' own average of these rows is 30.9622 GB/s.
A3_HIGH = """\
nccl-test-host-1:166:207 [0] NCCL INFO NCCL_P2P_PXN_LEVEL set by environment to 0.
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
     1048576         16384     float    none      -1    996.7    1.05    0.99    N/A   1007.1    1.04    0.98    N/A
     2097152         32768     float    none      -1    988.6    2.12    1.99    N/A    973.5    2.15    2.02    N/A
     4194304         65536     float    none      -1    942.9    4.45    4.17    N/A    935.8    4.48    4.20    N/A
     8388608        131072     float    none      -1   1007.2    8.33    7.81    N/A   1018.2    8.24    7.72    N/A
    16777216        262144     float    none      -1   1063.4   15.78   14.79    N/A   1057.9   15.86   14.87    N/A
    33554432        524288     float    none      -1   1116.5   30.05   28.18    N/A   1220.1   27.50   25.78    N/A
    67108864       1048576     float    none      -1   1334.7   50.28   47.14    N/A   1359.5   49.36   46.28    N/A
   134217728       2097152     float    none      -1   1940.8   69.15   64.83    N/A   1940.9   69.15   64.83    N/A
   268435456       4194304     float    none      -1   3624.3   74.07   69.44    N/A   3545.2   75.72   70.99    N/A
   536870912       8388608     float    none      -1   7098.6   75.63   70.90    N/A   7054.3   76.11   71.35    N/A
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 30.9622
""".splitlines()

def _slow(lines: list[str]) -> list[str]:
    """Every busbw and algbw of nccl-tests' rows divided by 10 (the same run on a TCP fallback)."""
    out = []
    for line in lines:
        fields = line.split()
        if len(fields) == 13 and fields[0].isdigit():
            for col in (6, 7, 10, 11):
                fields[col] = f"{float(fields[col]) / 10:.2f}"
            line = " ".join(fields)
        out.append(line)
    return out


def test_rows_and_average_are_nccl_tests_own() -> None:
    rows = nccl_bench.parse_rows(A3_HIGH)
    assert len(rows) == 10 and rows[0] == nccl_bench.Row(1048576, (0.99, 0.98))
    assert rows[-1] == nccl_bench.Row(536870912, (70.90, 71.35))
    # nccl-tests averages every busbw it printed, out-of-place and in-place: its own line says 30.9622.
    assert nccl_bench.average_busbw(rows) == pytest.approx(30.9622, abs=0.005)
    assert nccl_bench.average_busbw([]) is None


def test_zero_rows_count_as_nccl_tests_counts_them() -> None:
    # Google's A3 Mega example (Cluster Toolkit examples/gke-a3-megagpu/README.md) starts with sizes too small to
    # split over 16 ranks, printed as 0 with 0 GB/s; nccl-tests' average (53.8932 over 31 rows) includes them.
    lines = ["       0             0     float    none      -1     0.30    0.00    0.00       0     0.26    0.00"
             "    0.00       0",
             "     256             4     float    none      -1    86.95    0.00    0.00       0    88.21    0.00"
             "    0.00       0",
             "8589934592     134217728     float    none      -1  42668.7  201.32  188.73       0  42630.7  201.50"
             "  188.90       0"]
    rows = nccl_bench.parse_rows(lines)
    assert [r.size for r in rows] == [0, 256, 8589934592]
    assert nccl_bench.average_busbw(rows) == pytest.approx((188.73 + 188.90) / 6)
    # This script's own rows (size count type time algbw busbw) read the same way.
    mine = nccl_bench.row_line(8589934592, 0.0427, 201.17, 188.60)
    assert nccl_bench.parse_rows([mine, "# all_gather Avg bus bandwidth    : 188.60 GB/s"]) == [
        nccl_bench.Row(8589934592, (188.60,))]


def test_google_passes_its_own_line_and_a_tcp_fallback_fails_it() -> None:
    line = nccl_bench.parse_pass_line("all_gather:25:1Mi:512Mi")
    assert line == nccl_bench.PassLine("all_gather", 25.0, 2**20, 512 * 2**20)
    ok, text = nccl_bench.judge(nccl_bench.parse_rows(A3_HIGH), line, "a3-highgpu-8g")
    assert ok and text.startswith("all_gather average bus bandwidth 30.96 GB/s over 10 message sizes from 1048576 to "
                                  "536870912 bytes, pass line 25 GB/s: passed; at 536870912 bytes 71.35 GB/s")
    ok, text = nccl_bench.judge(nccl_bench.parse_rows(_slow(A3_HIGH)), line, "a3-highgpu-8g: Cluster Toolkit")
    assert not ok
    assert text.startswith("all_gather average bus bandwidth 3.10 GB/s over 10 message sizes from 1048576 to "
                           "536870912 bytes, pass line 25 GB/s: FAILED; at 536870912 bytes 7.13 GB/s "
                           "(a3-highgpu-8g: Cluster Toolkit). The fabric is slower than Google measures")
    ok, text = nccl_bench.judge([], line)
    assert not ok and text.startswith("no all_gather result from 1048576 to 536870912 bytes")


@pytest.mark.parametrize("text", ["all_gather:25:1Mi", "alltoall:25:1Mi:8Gi", "all_gather:fast:1Mi:8Gi",
                                  "all_gather:0:1Mi:8Gi", "all_gather:25:8Gi:1Mi", "all_gather:25:1Mi:8XB"])
def test_a_bad_pass_line_is_refused_by_the_parser(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        nccl_bench.parse_pass_line(text)
    with pytest.raises(SystemExit):
        nccl_bench.parse_args(["--pass-line", text])


def test_the_line_is_measured_over_its_own_sizes_as_nccl_tests_aligns_them() -> None:
    # 16 ranks: an all_gather below 16 x 16 bytes splits into less than 4 floats a rank, so nccl-tests runs 0 bytes.
    assert [nccl_bench.aligned(s, 16) for s in (8, 128, 256, 300)] == [0, 0, 256, 256]
    assert nccl_bench.aligned(16, 16, "all_reduce") == 16  # all_reduce is not split
    line = nccl_bench.PassLine("all_gather", 30.0, 8, 8 * 2**30)
    sweep = nccl_bench.sweep("all_gather", (2**20, 8 * 2**30), line, 16)
    assert len(sweep) == 31 and sweep[0] == (0, False, True) and sweep[5] == (256, False, True)
    assert sum(configured for _, configured, _ in sweep) == 14 and all(judged for *_, judged in sweep)
    # Another collective is measured over the configured sizes only.
    assert [s for s, *_ in nccl_bench.sweep("all_reduce", (2**20, 2**21), line, 16)] == [2**20, 2**21]


class _Dist:
    """Rank 0 of 16: the verdict's all_reduce sums every rank's vote (the others vote 0)."""

    def __init__(self) -> None:
        self.reduced: list[float] = []

    def all_reduce(self, tensor: _Tensor) -> None:
        self.reduced.append(tensor.value)

    def get_world_size(self) -> int:
        return 16

    def get_rank(self) -> int:
        return 0

    def destroy_process_group(self) -> None:
        self.destroyed = True


def _run(monkeypatch: pytest.MonkeyPatch, busbw: float, benchmarks: list[str]) -> tuple[int, _Dist]:
    """nccl_bench's sweep on 2 nodes of A3 Mega's line, every size at `busbw` GB/s."""
    seen: list[tuple[str, int]] = []

    def timed(torch: Any, dist: Any, benchmark: str, size: int, world: int, iters: int, warmup: int) -> float:
        seen.append((benchmark, size))
        return size * nccl_bench.bus_factor(benchmark, world) / (busbw * 1e9)

    monkeypatch.setattr(nccl_bench, "_time", timed)
    monkeypatch.setenv("NODES", "2")
    args = nccl_bench.parse_args(["--benchmarks", ",".join(benchmarks), "--min-bytes", "1Gi", "--max-bytes", "8Gi",
                                  "--pass-line", "all_gather:30:8:8Gi", "--pass-line-note", "a3-megagpu-8g"])
    dist = _Dist()
    code = nccl_bench._run(args, types.SimpleNamespace(zeros=lambda n, device: _Tensor()), dist, None, (), None,
                           "NCCL 2.29.7")
    assert dist.destroyed and 0 not in {size for _, size in seen}  # a 0-byte row is printed, never run
    return code, dist


def test_the_test_fails_below_the_line_on_every_rank(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, dist = _run(monkeypatch, 4.0, ["all_reduce"])  # the line's collective is added when not configured
    assert code == nccl_bench.EXIT_BELOW_PASS_LINE == 6 and dist.reduced == [1.0]
    out, err = capsys.readouterr()
    assert "# all_gather\n" in out and "# all_reduce Avg bus bandwidth    : 4.00 GB/s" in out
    # 31 sizes from 8 B: 5 rows of 0 (as nccl-tests prints them) and 26 at 4 GB/s.
    assert err.startswith(f"# nccl_bench: all_gather average bus bandwidth {4.0 * 26 / 31:.2f} GB/s over 31 message "
                          "sizes from 0 to 8589934592 bytes, pass line 30 GB/s: FAILED; at 8589934592 bytes 4.00 GB/s "
                          "(a3-megagpu-8g). The fabric is slower")


def test_the_test_passes_at_googles_bandwidth(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    code, dist = _run(monkeypatch, 188.0, ["all_gather", "all_reduce"])
    assert code == 0 and dist.reduced == [0.0]
    out = capsys.readouterr().out
    assert "# all_gather Avg bus bandwidth    : 188.00 GB/s" in out  # the configured sizes' figure, as before
    assert "pass line 30 GB/s: passed" in out


# --- the facts: Google's lines and sizes -------------------------------------------------------------------------

@pytest.mark.parametrize(("machine", "gbps", "low", "high", "example"), [
    ("a3-highgpu-8g", 25, "1Mi", "512Mi", 30.96),   # CT test-gke-a3-high.yml; CEA nccl-config.yaml 1M 512M
    ("a3-megagpu-8g", 30, "8", "8Gi", 53.89),       # CT test-gke-a3-mega.yml; example rows 8 B (0) .. 8 GiB
    ("a3-ultragpu-8g", 100, "1Ki", "8Gi", 120.25),  # CT test-gke-a3-ultra.yml; jobset -b 1K -e 8G
    ("a4-highgpu-8g", 100, "1Ki", "8Gi", None),     # CT test-gke-a4.yml; no example published
])
def test_each_machine_types_pass_line(machine: str, gbps: float, low: str, high: str, example: float | None) -> None:
    line = fabric.load().for_machine(machine).nccl_test.pass_lines[machine]
    assert (line.benchmark, line.average_gbps, line.min_bytes, line.max_bytes, line.nodes) == (
        "all_gather", gbps, low, high, 2)
    assert line.example_average_gbps == example
    assert example is None or example > gbps  # Google's own run passes its line
    assert nccl_bench.parse_pass_line(line.flag()).gbps == gbps


def test_the_sizes_are_those_of_googles_pinned_tests() -> None:
    # nccl-tests' K/M/G are 2^10/2^20/2^30 (the rows above: 1M is 1048576).
    # Read in place where ../shared is beside the checkout; the sizes themselves are data/gpu_fabric.yaml's facts.
    tcpx = reference("gke-gpu-fabric", "container-engine-accelerators/gpudirect-tcpx/nccl-config.yaml").read_text(
        encoding="utf-8")
    assert "/scripts/run-allgather.sh 8 eth1,eth2,eth3,eth4 1M 512M" in tcpx
    for path in ("cluster-toolkit/examples/gke-a4/nccl-jobset-example.yaml",
                 "cluster-toolkit/examples/gke-consumption-options/dws-flex-start-queued-provisioning/"
                 "nccl-jobset-example.yaml"):
        assert "all_gather_perf -b 1K -e 8G -f 2" in reference("gke-gpu-fabric", path).read_text(encoding="utf-8")


# --- the stack: the line reaches the Job, and the training waits -------------------------------------------------

@pytest.fixture(scope="module")
def h100() -> Any:
    return stack_run("h100")


def test_the_job_runs_the_bench_with_its_machine_types_line(h100: Any) -> None:
    run_sh = h100.one(CONFIG_MAP, "bandwidth-config").inputs["data"]["run.sh"]
    assert ("--pass-line all_gather:30:8:8Gi --pass-line-note 'a3-megagpu-8g: Cluster Toolkit'\"'\"'s daily test "
            "test-gke-a3-mega.yml, 2 nodes; Google'\"'\"'s example run averaged 53.89 GB/s, 188.73 GB/s at 8589934592 "
            "bytes'") in run_sh
    summary = h100.outputs["workloads"]["bandwidth"]
    assert summary["passLine"] == ("all_gather average bus bandwidth >= 30 GB/s over 8..8Gi bytes (Cluster Toolkit's "
                                   "daily test test-gke-a3-mega.yml, 2 nodes)")


def test_the_preview_says_what_the_test_must_reach_and_what_waits(h100: Any) -> None:
    from preview.sections import fabric as section

    ((_, text),) = section.section(h100)
    assert text.splitlines()[-1] == (
        "- NCCL test `bandwidth`: must reach all_gather average bus bandwidth >= 30 GB/s over 8..8Gi bytes (Cluster "
        "Toolkit's daily test test-gke-a3-mega.yml, 2 nodes), else it fails; created only after it passed: `smoke`")
    job = h100.one(JOB).inputs["metadata"]["annotations"]
    assert job["deepspeed-stack/pass-line"].startswith("all_gather average bus bandwidth >= 30 GB/s")
