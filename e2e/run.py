"""`make e2e`: DeepSpeed's launch paths across network-namespace hosts on one machine, on CPU.

Two clusters of three hosts each (e2e/hosts.py), side by side (STREAMS), run the stack's own files, rendered by
the stack's own code. Each scenario is a module beside this file, its docstring saying what it runs:

- mpijob (mpijob_scenario.py): the MPIJob's workers reached by the one mpirun line the stack renders (Gaudi's setup);
- vertex (vertex_scenario.py): the vertex stack's CustomJob, vertex_start.sh on 2 hosts, finetune.py, LoRA merged;
- recovery (recovery_scenario.py): the Bitnami chart's path, a worker pod preempted, relaunched and resumed,
          then resumed with one worker fewer (universal checkpoint);
- finetune (finetune_scenario.py): the `finetune` kind's MPIJob stopped whole and resumed from tiered saves,
          exported, its estimate against the measured run;
- adapters (adapters_scenario.py): two LoRA runs on vertex's merged export, served with it and a bucket folder's
          adapter by one vLLM (chat, /metrics), the evaluation and its gate.

What they share is in harness.py (and finetune_common.py, serving_common.py, adapters_common.py). Run as root after
e2e/install.sh (the Makefile's `e2e` target does both); skips with a reason where network namespaces are not
permitted. Every launch runs under a timeout; every process and namespace is torn down at the end, also on failure or
Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness
import hosts as nshosts
from adapters_common import (
    ADAPTER_SAVE_STEPS,
    ADAPTER_STEPS,
    TASK_RECORDS,
    adapter_pairs,
    adapter_prompt,
    adapters_stack,
)
from adapters_scenario import scenario_adapters
from finetune_common import (
    FINETUNE_HELD_OUT,
    FINETUNE_SAVE_STEPS,
    FINETUNE_STEPS,
    _finetune_script,
    e2e_estimate,
    eval_losses,
    event_problems,
    finetune_records,
    finetune_workload,
    outside,
    progress_problems,
    resumed_from,
    run_record_problems,
    sample_problems,
    tokenized_problems,
    trainer_losses,
)
from finetune_scenario import scenario_finetune
from harness import (
    CHART_CLIENT,
    CHART_WORKER,
    MPIJOB,
    MPIJOB_NAMESPACE,
    VENV,
    WORKERS,
    Outcome,
    chart_hostfile,
    check_run,
    image_sshd_drop_in,
    losses,
    mpijob_hostfile,
    timed,
)
from mpijob_scenario import scenario_mpijob
from recovery_scenario import scenario_recovery, tiered_problems
from serving_common import chat_problems, completion_problems, metrics_problems
from vertex_scenario import packed_steps, scenario_vertex, vertex_cluster_spec

# What tests/test_e2e_harness.py (and test_serving_metrics.py) read through this entry point.
__all__ = [
    "ADAPTER_SAVE_STEPS", "ADAPTER_STEPS", "FINETUNE_HELD_OUT", "FINETUNE_SAVE_STEPS", "FINETUNE_STEPS",
    "TASK_RECORDS", "_finetune_script", "adapter_pairs", "adapter_prompt", "adapters_stack", "chart_hostfile",
    "chat_problems", "check_run", "completion_problems", "e2e_estimate", "eval_losses", "event_problems",
    "finetune_records", "finetune_workload", "image_sshd_drop_in", "losses", "metrics_problems", "mpijob_hostfile",
    "outside", "packed_steps", "progress_problems", "resumed_from", "run_record_problems", "sample_problems",
    "tiered_problems", "tokenized_problems", "trainer_losses", "vertex_cluster_spec",
]

# --- main ---------------------------------------------------------------------------------------------

def host_names(workers: int) -> list[tuple[str, tuple[str, ...]]]:
    """Each host answers to the names every launch path gives it: the chart's pods and headless
    service, the MPIJob's pods and service, Vertex AI's worker pools."""
    names: list[tuple[str, tuple[str, ...]]] = [(f"{CHART_CLIENT}-0", (f"{MPIJOB}-launcher", "workerpool0-0"))]
    for i in range(workers):
        names.append((f"{CHART_WORKER}-{i}", (
            f"{CHART_WORKER}-{i}.{CHART_WORKER}-headless", f"{MPIJOB}-worker-{i}",
            f"{MPIJOB}-worker-{i}.{MPIJOB}.{MPIJOB_NAMESPACE}.svc", f"workerpool1-{i}")))
    return names


SCENARIOS: dict[str, Callable[[nshosts.Cluster, Path], str]] = {
    "mpijob": scenario_mpijob,
    "vertex": scenario_vertex,
    "recovery": scenario_recovery,
    "finetune": scenario_finetune,
    "adapters": scenario_adapters,
}
DEFAULT_SCENARIOS = ("mpijob", "vertex", "recovery", "finetune", "adapters")
# Two clusters of hosts run side by side, each its scenarios in this order: a scenario keeps a core busy for about
# 70 % of its time (process start-ups, one rank a host), so two at once fill the machine's cores. Split so that
# each side's CPU seconds are about equal (docs/measurements.md); the tiny Llama is made by whichever side needs
# it first (finetune_common.tiny_base); adapters serves vertex's export, on the same side after it (NEEDS).
STREAMS = (("recovery", "mpijob", "finetune"), ("vertex", "adapters"))


# A scenario that serves another's output, run after it on the same cluster: adapters serves vertex's export from a
# bucket folder (the adapter trained outside the stack's workloads).
NEEDS = {"adapters": "vertex"}


def with_needs(scenarios: Sequence[str]) -> list[str]:
    """The requested scenarios, each one NEEDS placed before the first that needs it when not asked for."""
    names: list[str] = []
    for name in scenarios:
        need = NEEDS.get(name)
        if need and need not in names and need not in scenarios:
            names.append(need)
        names.append(name)
    return names


def streams_of(scenarios: Sequence[str]) -> list[list[str]]:
    """The requested scenarios split over the two clusters, each side in the order asked."""
    side = {name: i for i, stream in enumerate(STREAMS) for name in stream}
    split: list[list[str]] = [[] for _ in STREAMS]
    for name in scenarios:
        split[side.get(name, 0)].append(name)
    return [names for names in split if names]


def run_stream(cluster: nshosts.Cluster, names: Sequence[str], outcomes: list[Outcome], work: Path,
               logs: Path) -> None:
    for name in names:
        cluster.fresh_homes()
        timed(name, outcomes, work, lambda name=name: SCENARIOS[name](cluster, logs))
        cluster.stop_services()


def run_streams(work: Path, logs: Path, streams: Sequence[Sequence[str]], outcomes: list[Outcome]) -> None:
    """Each stream on its own cluster (own namespaces, bridge and hosts) in a thread; the clusters are torn down
    here, in the main thread, also when a signal or Ctrl-C ends the wait."""
    with contextlib.ExitStack() as stack:
        threads = []
        for index, names in enumerate(streams):
            cluster = stack.enter_context(nshosts.Cluster(work / f"cluster-{index}", host_names(WORKERS),
                                                          prefix=f"dse2e{os.getpid() % 100000}{'ab'[index]}"))
            thread = threading.Thread(target=run_stream, args=(cluster, names, outcomes, work, logs),
                                      name=f"e2e-{index}", daemon=True)
            thread.start()
            threads.append(thread)
        for thread in threads:
            while thread.is_alive():
                thread.join(timeout=0.5)  # short waits: SIGTERM's handler runs in this thread between them


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", default=list(DEFAULT_SCENARIOS),
                        help=f"default: {' '.join(DEFAULT_SCENARIOS)}; known: {' '.join(SCENARIOS)}")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs) after a success")
    parser.add_argument("--one-cluster", action="store_true", help="every scenario on one cluster, one at a time")
    parser.add_argument("--preflight", action="store_true",
                        help="only say whether network-namespace hosts can run here (exit 0) or why not (exit 3)")
    args = parser.parse_args(argv)
    if args.preflight:
        why = nshosts.preflight()
        print(f"[e2e] SKIPPED: {why}" if why else "[e2e] network namespaces: ok", flush=True)
        return 3 if why else 0
    unknown = [s for s in args.scenarios if s not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; known: {list(SCENARIOS)}")
    if with_needs(args.scenarios) != list(args.scenarios):
        print(f"[e2e] running {' '.join(with_needs(args.scenarios))}: {NEEDS} (what a scenario serves)", flush=True)
    args.scenarios = with_needs(args.scenarios)
    reason = nshosts.preflight()
    if reason is None and not (VENV / "bin" / "deepspeed").exists():
        reason = f"{VENV} has no DeepSpeed: run e2e/install.sh first (make e2e does)"
    if reason:
        print(f"[e2e] SKIPPED: {reason}", flush=True)
        return 0

    # SIGTERM (a CI timeout) ends the run like Ctrl-C does: through the teardown below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="ds-e2e-", dir="/var/tmp"))
    os.chmod(work, 0o755)  # the clusters' folders below it are the hosts' (UID 1001 reads and writes there)
    logs = work / "logs"
    logs.mkdir()
    harness.RUN_CACHE = work / "cache"  # the one object every scenario module reads
    outcomes: list[Outcome] = []
    started = time.monotonic()
    try:
        run_streams(work, logs, [list(args.scenarios)] if args.one_cluster else streams_of(args.scenarios),
                    outcomes)
    finally:
        for process in harness.BACKGROUND:  # a failed scenario's: the clusters' teardown took the hosts' processes
            if process.poll() is None:
                process.kill()
        total = time.monotonic() - started
        print("\n[e2e] summary (two clusters side by side: a scenario's seconds overlap the other side's)")
        print(f"{'scenario':<10} {'result':<7} {'seconds':>8}  detail")
        for item in outcomes:
            print(f"{item.scenario:<10} {'ok' if item.ok else 'FAILED':<7} {item.seconds:>8.1f}  {item.detail}")
        print(f"total {total:.1f} s; work folder {work}")
    failed = [o.scenario for o in outcomes if not o.ok]
    if not failed and not args.keep:
        subprocess.run(["rm", "-rf", str(work)], check=False)
    return 1 if failed or len(outcomes) < len(args.scenarios) else 0

if __name__ == "__main__":
    sys.exit(main())
