"""The `recovery` scenario of `make e2e` (e2e/run.py): the Bitnami chart's path. Workers serve SSH as UID 1001 on port
2222 with the chart's sshd drop-in over the image's sshd_config; the client waits for them with the image
entrypoint's `retry_while`, then runs the release's launch command (`cd /app && deepspeed --hostfile /job/hostfile
smoke_train.py ...`, pdsh) with /app holding the release's source ConfigMap and /job/hostfile written as the chart's
template writes it. A run with checkpoints is preempted, relaunched (every rank on every host reports) and resumes
from the step saved on SIGTERM; then the same checkpoint resumes with one worker fewer through DeepSpeed's universal
checkpoint. A worker pod is stopped as a kubelet stops one and nothing more (hosts.Cluster.terminate_pod): its
preStop hook, SIGTERM to its main process (sshd) only, SIGKILL when the grace period ends, and the rest of the pod
SIGKILLed once the main process is gone, as the kernel does to a PID namespace whose init exits. The ranks save only
because the hook reached them.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import hosts as nshosts
from harness import (
    CHART_SSHD_DROP_IN,
    CHART_WORKER,
    IMAGE_ENV,
    LAUNCH_TIMEOUT,
    RANK_ENV,
    _chown_dirs,
    chart_files,
    chart_ssh_client,
    check_run,
    deepspeed_env,
    fail_unless,
    image_etc,
    losses,
    result_of,
    stack_workload,
    start_chart_workers,
    wait_for_workers,
)

# --- preemption recovery ----------------------------------------------------------------------------------

GRACE_SECONDS = 20  # the e2e's terminationGracePeriodSeconds: SIGTERM, then SIGKILL after this
EVERY = 5  # --checkpoint-every
RUN_STEPS = 400  # long enough to be preempted mid-run on any machine

def chart_run(cluster: nshosts.Cluster, logs: Path, name: str, workers: int, args: Sequence[str],
              checkpoints: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """The chart's launch of `workers` workers with checkpoints in a folder every host shares (the
    bucket's FUSE path or the NFS claim); returns the client's launch process and its log."""
    from workloads import deepspeed_release

    w, where = stack_workload("helm", workers, args)
    client, hosts = cluster.hosts[0], cluster.hosts[1:1 + workers]
    chart_files(cluster, client, w, where, workers)
    deepspeed_env(client, {"CHECKPOINT_DIR": str(checkpoints)})
    # Every launch starts with fresh worker pods (a preempted pod comes back; the others restart with it).
    start_chart_workers(cluster, hosts, (client.home / ".ssh" / "id_rsa.pub").read_text(), logs)
    wait_for_workers(cluster, client, [f"{CHART_WORKER}-{i}.{CHART_WORKER}-headless" for i in range(workers)])
    log = logs / f"{name}.log"
    process = cluster.spawn(client, ["/bin/bash", "-c", deepspeed_release.launch_command(w, where)], log=log,
                            env={**IMAGE_ENV, **RANK_ENV})
    return process, log


def wait_process(cluster: nshosts.Cluster, process: subprocess.Popen[bytes], log: Path, what: str) -> tuple[int, str]:
    try:
        status = process.wait(timeout=LAUNCH_TIMEOUT)
    except subprocess.TimeoutExpired:
        cluster.stop_services()
        raise RuntimeError(f"{what}: timed out after {LAUNCH_TIMEOUT:.0f} s (log {log})") from None
    return status, log.read_text(errors="replace")


def chart_pre_stop() -> list[str]:
    """The chart workers' preStop command, as the stack renders the release's values."""
    from workloads import deepspeed_release

    w, where = stack_workload("helm")
    values = deepspeed_release.chart_values(w, where, image={}, source_config_map="e2e-source")
    return list(values["worker"]["lifecycleHooks"]["preStop"]["exec"]["command"])


def mpijob_pre_stop(w: Any, where: Any, launch: Any) -> list[str]:
    """The MPIJob workers' preStop command, as the stack renders the job."""
    from workloads.mpijob import nvidia
    from workloads.mpijob.shape import MpiJobInputs

    spec = nvidia.render_spec(MpiJobInputs(workload=w, placement=where, image="e2e", config_map="e2e"), launch)
    container = spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    return list(container["lifecycle"]["preStop"]["exec"]["command"])


HOOK_SIGNALLED = re.compile(r"SIGTERM to ranks \[([\d, ]+)\]")


def pre_stop_problems(stop: nshosts.Termination) -> list[str]:
    """A pod stopped as the kubelet does: the hook signalled the ranks and saw them exit, and the main process
    (sshd) ended on its SIGTERM in time. What the kernel then SIGKILLs (ssh sessions closing) is only counted."""
    problems = []
    if not HOOK_SIGNALLED.search(stop.hook_output):
        problems.append(f"the preStop hook signalled no rank: {stop.hook_output!r}")
    elif "every rank exited" not in stop.hook_output:
        problems.append(f"the ranks outlived the preStop hook: {stop.hook_output!r}")
    if not stop.main_exited:
        problems.append(f"the pod's main process needed SIGKILL after {GRACE_SECONDS} s")
    return problems


EXIT_PREEMPTED = 143  # finetune.py's and smoke_train.py's status after the save on SIGTERM
# DeepSpeed's per-node launcher (launch.py sigkill_handler) logs this when it gets SIGTERM itself: what pdsh's pkill
# from the runner's handler does, and it then SIGKILLs its ranks 30 s later.
PER_NODE_LAUNCHER_SIGNALLED = "Main process received SIGTERM"


def whole_job_stop_problems(launcher: nshosts.Termination, status: int, output: str) -> list[str]:
    """The launcher of a job stopped whole: it asked the workers to stop their ranks, never signalled DeepSpeed's
    runner (no per-node launcher got a signal: the ranks exited on their own after their save), and ended by
    itself within its grace period with the ranks' status."""
    problems = []
    if "asking every worker's ranks to save and stop" not in output:
        problems.append("the launcher did not ask the workers to stop their ranks")
    if PER_NODE_LAUNCHER_SIGNALLED in output:
        problems.append("a per-node DeepSpeed launcher was signalled (pdsh's pkill from the runner's handler)")
    if not launcher.main_exited:
        problems.append(f"the launcher needed SIGKILL after {GRACE_SECONDS} s")
    if status != EXIT_PREEMPTED:
        problems.append(f"the launcher exited {status}, not the ranks' {EXIT_PREEMPTED} (saved on SIGTERM)")
    return problems


def tiered_problems(ft: Any, local: dict[str, Path], checkpoints: Path, saved: int, in_flight: int,
                   output: str) -> list[str]:
    """Tiered saves after the stop: every worker's local disk holds the stop's save, the bucket its complete copy
    (the run's newest), and the copy the stop cut short (when it was not the stop's own save) was dropped, never
    marked complete."""
    problems = [f"{name}'s local disk lacks checkpoint-{saved}" for name, folder in local.items()
                if ft.newest_checkpoint(folder) is None or ft.checkpoint_step(ft.newest_checkpoint(folder).name)
                != saved]
    if in_flight != saved:
        from workloads.finetune import script_module

        tiered = script_module("finetune_tiered")
        folder = checkpoints / f"checkpoint-{in_flight}"
        marked = (folder / tiered.COPIED_MARKER).exists()
        # The copy under way when the harness stopped the job is either dropped for the stop's save (the ranks'
        # save queued a newer one while it ran) or, on a loaded machine where the ranks reach their step's end
        # after it, finished first: then it must be whole (every node's part). Never cut short and marked.
        if f"copy of checkpoint-{in_flight} abandoned" in output:
            if marked:
                problems.append(f"checkpoint-{in_flight}, cut short by the stop, is marked complete")
        elif not marked or not all((folder / tiered.NODE_MARKER.format(node=n)).is_file() for n in range(len(local))):
            problems.append(f"the copy of checkpoint-{in_flight} under way at the stop was neither dropped for the "
                            "stop's save nor finished on every node")
    return problems


def pre_stop_summary(stop: nshosts.Termination) -> str:
    found = HOOK_SIGNALLED.search(stop.hook_output)
    ranks = len(found.group(1).split(",")) if found else 0
    return (f"{ranks} rank(s) got SIGTERM and exited, then sshd got its SIGTERM; {stop.killed} process(es) left for "
            "the kernel's SIGKILL")


def scenario_recovery(cluster: nshosts.Cluster, logs: Path) -> str:
    client, workers = cluster.hosts[0], cluster.hosts[1:]
    image_etc(cluster, CHART_SSHD_DROP_IN)
    chart_ssh_client(client, len(workers))
    checkpoints = cluster.work / "checkpoints"
    checkpoints.mkdir(exist_ok=True)
    _chown_dirs(checkpoints)
    base = ["--hidden-size", "256", "--layers", "2", "--lr", "0.003", "--warmup-steps", "0"]

    # 1. A run with a checkpoint every EVERY steps; once the second one is saved, the last worker host
    #    is preempted as the kubelet stops a pod: its preStop hook, SIGTERM to its main process (sshd) only, SIGKILL
    #    after the grace period.
    process, log = chart_run(cluster, logs, "recovery-1-preempted", len(workers),
                             [*base, "--steps", str(RUN_STEPS), "--checkpoint-every", str(EVERY)], checkpoints)
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    target = f"global_step{2 * EVERY} saved"
    while target not in log.read_text(errors="replace"):
        fail_unless(process.poll() is None, f"the run ended before its second checkpoint (log {log})")
        fail_unless(time.monotonic() < deadline, f"no second checkpoint within {LAUNCH_TIMEOUT:.0f} s")
        time.sleep(0.05)
    victim = workers[-1]
    stop = cluster.terminate_pod(victim, GRACE_SECONDS, pre_stop=chart_pre_stop(), env=IMAGE_ENV)
    status, first = wait_process(cluster, process, log, "preempted run")
    cluster.stop_services()
    state = json.loads((checkpoints / "smoke_state.json").read_text())
    before = losses(first)
    stopped = max(before)
    fail_unless(status != 0, "the launcher reported success for a preempted run")
    fail_unless(not pre_stop_problems(stop), f"{'; '.join(pre_stop_problems(stop))} (log {log})")
    fail_unless("(SIGTERM: preempted)" in first, f"the ranks did not save on SIGTERM (log {log})")
    fail_unless(state["step"] >= 2 * EVERY, f"last checkpoint at step {state['step']}, expected >= {2 * EVERY}")
    fail_unless(stopped - state["step"] <= EVERY, f"stopped at {stopped}, saved {state['step']}: lost > {EVERY}")

    # 2. The pods come back (the worker restarted, the client's launch restarted): resume from the saved step.
    total = state["step"] + 2 * EVERY
    process, log = chart_run(cluster, logs, "recovery-2-resumed", len(workers),
                             [*base, "--steps", str(total), "--checkpoint-every", str(EVERY)], checkpoints)
    status, second = wait_process(cluster, process, log, "resumed run")
    cluster.stop_services()
    result = result_of(second) or {}
    after = losses(second)
    fail_unless(status == 0 and result.get("ok") is True, f"resumed run: exit {status} (log {log})")
    problems = check_run(second, len(workers), [h.name for h in workers])  # the chart's launch: every rank, host
    fail_unless(not problems, f"resumed run: {'; '.join(problems)} (log {log})")
    fail_unless(f"resumed from {checkpoints}/{state['tag']} at step {state['step']}" in second,
                f"the relaunch did not resume from {state['tag']}")
    fail_unless(result.get("start_step") == state["step"] and min(after) == state["step"] + 1,
                f"resumed at {result.get('start_step')}, first step {min(after, default=None)}")
    fresh = before[1]
    fail_unless(after[min(after)] < 0.9 * fresh, f"loss after resume {after[min(after)]:.4f} vs fresh {fresh:.4f}: "
                "looks like a fresh start")

    final_two, smaller = _smaller_world(cluster, logs, base, checkpoints, fresh)
    return (f"preempted at step {stopped} (preStop: {pre_stop_summary(stop)}; saved on SIGTERM at step "
            f"{state['step']}); "
            f"resumed at {state['step']} (loss {before.get(state['step'], float('nan')):.4f} -> "
            f"{after[min(after)]:.4f}, fresh {fresh:.4f}); {len(workers) - 1} worker resumed at "
            f"{final_two['step']} via the universal checkpoint (loss {final_two['loss']:.4f} -> "
            f"{smaller[min(smaller)]:.4f})")


def _smaller_world(cluster: nshosts.Cluster, logs: Path, base: list[str], checkpoints: Path,
                   fresh: float) -> tuple[dict[str, Any], dict[int, float]]:
    """3. One worker fewer: DeepSpeed's universal checkpoint re-slices ZeRO's optimizer states. Returns the state
    it resumed from and its losses."""
    workers = cluster.hosts[1:]
    final_two = json.loads((checkpoints / "smoke_state.json").read_text())
    process, log = chart_run(cluster, logs, "recovery-3-smaller", len(workers) - 1,
                             [*base, "--steps", str(final_two["step"] + EVERY)], checkpoints)
    status, third = wait_process(cluster, process, log, "resume at a smaller world size")
    cluster.stop_services()
    result3 = result_of(third) or {}
    smaller = losses(third)
    fail_unless(status == 0 and result3.get("ok") is True, f"smaller world: exit {status} (log {log})")
    fail_unless("to a universal checkpoint" in third and f"resumed from {checkpoints}/{final_two['tag']}_universal"
                in third, "no resume through the universal checkpoint")
    fail_unless(result3.get("world_size") == len(workers) - 1 and result3.get("start_step") == final_two["step"],
                f"smaller world: world size {result3.get('world_size')}, start step {result3.get('start_step')}")
    fail_unless(smaller[min(smaller)] < 0.9 * fresh and smaller[min(smaller)] < 1.5 * final_two["loss"],
                f"loss after the universal resume {smaller[min(smaller)]:.4f}, before {final_two['loss']:.4f}")
    return final_two, smaller
