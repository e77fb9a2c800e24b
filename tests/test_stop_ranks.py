"""The workers' preStop hook (recipes/stop_ranks.py) and where the stack puts it.

Kubernetes sends SIGTERM to each container's main process only; a worker's is sshd, which exits without signalling
its sessions. The hook must find the ranks (and only the ranks: never DeepSpeed's per-node launcher, whose own
SIGTERM handler SIGKILLs its ranks 30 s later) and wait for their save, inside the grace period.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import PROJECT_DIR, load_file, stack_run

SCRIPT = PROJECT_DIR / "recipes" / "stop_ranks.py"
MPIJOB = "kubernetes:kubeflow.org/v2beta1:MPIJob"
RELEASE = "kubernetes:helm.sh/v3:Release"
STACKS = ("gaudi", "h100", "dws", "finetune")  # the example stacks with MPIJobs
GRACE = 120  # workloads/recovery.py TERMINATION_GRACE_SECONDS, restated: the pods' terminationGracePeriodSeconds


def _hook() -> Any:
    return load_file(SCRIPT, "stop_ranks_under_test")


POD_NET = "net:[4026532801]"


def _process(proc: Path, pid: int, parent: int, command: str, env: dict[str, str], net: str = POD_NET) -> None:
    folder = proc / str(pid)
    folder.mkdir()
    (folder / "ns").mkdir()
    (folder / "ns" / "net").symlink_to(net)  # /proc/PID/ns/net reads as "net:[inode]"
    # /proc/PID/stat: pid (comm) state ppid ...; a command may hold spaces and parentheses.
    (folder / "stat").write_text(f"{pid} ({command}) S {parent} {pid} {pid} 0 -1 4194560\n")
    (folder / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))


def test_the_ranks_are_found_and_nothing_else(tmp_path: Path) -> None:
    """sshd, its session shell, DeepSpeed's launcher and a rank's data loader worker are left alone."""
    path = {"PATH": "/opt/venv/bin:/usr/bin"}
    _process(tmp_path, 1, 0, "sshd", path)
    _process(tmp_path, 40, 1, "sshd", path)  # the session
    _process(tmp_path, 41, 40, "bash", path)
    _process(tmp_path, 50, 41, "python", {**path, "CROSS_RANK": "1"})  # deepspeed.launcher.launch
    _process(tmp_path, 51, 50, "python", {**path, "RANK": "2", "LOCAL_RANK": "0"})
    _process(tmp_path, 52, 50, "python", {**path, "RANK": "3", "LOCAL_RANK": "1"})
    _process(tmp_path, 60, 51, "pt_data_worker", {**path, "RANK": "2", "LOCAL_RANK": "0"})  # inherits it
    _process(tmp_path, 70, 41, "prted", path)  # OpenMPI's daemon and its rank
    _process(tmp_path, 71, 70, "python (x) y", {**path, "OMPI_COMM_WORLD_LOCAL_RANK": "0"})
    _process(tmp_path, 90, 89, "python", {**path, "LOCAL_RANK": "0"}, net="net:[4026532999]")  # another pod's
    _process(tmp_path, 99, 0, "python3 stop_ranks.py", path)  # the hook
    assert _hook().rank_pids(tmp_path, me=99) == [51, 52, 71]


def test_a_process_that_is_gone_is_skipped(tmp_path: Path) -> None:
    _process(tmp_path, 51, 50, "python", {"LOCAL_RANK": "0"})  # its parent already exited
    (tmp_path / "52").mkdir()  # exited between the listing and the read
    _process(tmp_path, 1, 0, "sshd", {})
    assert _hook().rank_pids(tmp_path, me=1) == [51]


def test_waiting_ends_at_the_timeout_with_what_is_left() -> None:
    hook = _hook()
    now = [0.0]
    left = hook.wait_gone([5, 6], 10.0, alive=lambda pid: pid == 6, clock=lambda: now[0],
                          pause=lambda s: now.__setitem__(0, now[0] + s))
    assert left == [6]
    assert 10.0 <= now[0] < 10.0 + 0.5  # polled until the deadline, not beyond one poll


def test_a_real_rank_gets_sigterm_and_is_waited_for(tmp_path: Path) -> None:
    """A process with LOCAL_RANK that saves on SIGTERM: the hook signals it and returns once it has exited."""
    saved = tmp_path / "saved"
    code = ("import signal, sys, time\n"
            f"def term(*_):\n    open({str(saved)!r}, 'w').write('step 7')\n    sys.exit(143)\n"
            "signal.signal(signal.SIGTERM, term)\nprint('ready', flush=True)\n"
            "while True:\n    time.sleep(1)\n")
    rank = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "LOCAL_RANK": "0"})
    try:
        assert rank.stdout is not None and rank.stdout.readline().strip() == "ready"
        view = tmp_path / "proc"  # this container's processes: the rank and the hook
        view.mkdir()
        (view / str(rank.pid)).symlink_to(f"/proc/{rank.pid}")
        (view / str(os.getpid())).symlink_to(f"/proc/{os.getpid()}")
        hook = _hook()
        assert hook.rank_pids(view) == [rank.pid]
        assert hook.main(["--proc", str(view), "--timeout", "30"]) == 0
        assert rank.wait(timeout=5) == 143
        assert saved.read_text() == "step 7"
    finally:
        if rank.poll() is None:
            rank.send_signal(signal.SIGKILL)
            rank.wait()


def test_the_hook_returns_after_the_ranks_parent_passed_their_status_on(tmp_path: Path) -> None:
    """DeepSpeed's per-node launcher polls its ranks every second, then exits with the failed one's status (which
    reaches the MPIJob's launcher through pdsh): the hook gives it that moment before the kubelet stops sshd."""
    rank = ("import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(143))\n"
            "print('ready', flush=True)\nwhile True:\n    time.sleep(1)\n")
    parent_code = ("import os, subprocess, sys, time\n"
                   f"child = subprocess.Popen([sys.executable, '-c', {rank!r}],"
                   " env={**os.environ, 'LOCAL_RANK': '0'}, stdout=subprocess.PIPE, text=True)\n"
                   "print(child.pid, child.stdout.readline().strip(), flush=True)\n"
                   "while child.poll() is None:\n    time.sleep(1)\n"
                   f"open({str(tmp_path / 'status')!r}, 'w').write(str(child.returncode))\n"
                   "sys.exit(child.returncode)\n")
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True,
                              env={k: v for k, v in os.environ.items() if k != "LOCAL_RANK"})
    try:
        assert parent.stdout is not None
        child_pid, ready = parent.stdout.readline().split()
        assert ready == "ready"
        view = tmp_path / "proc"
        view.mkdir()
        for pid in (int(child_pid), parent.pid, os.getpid()):
            (view / str(pid)).symlink_to(f"/proc/{pid}")
        assert _hook().main(["--proc", str(view), "--timeout", "30"]) == 0
        assert (tmp_path / "status").read_text() == "143"  # the parent had passed the rank's status on
        assert parent.wait(timeout=5) == 143
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def _worker_containers(job: dict[str, Any]) -> list[dict[str, Any]]:
    return job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]


@pytest.mark.parametrize("stack", STACKS)
def test_every_mpijob_worker_runs_the_hook_from_its_config_map(stack: str) -> None:
    run = stack_run(stack)
    jobs = run.by_type(MPIJOB)
    maps = {r.inputs["metadata"]["name"]: r.inputs["data"] for r in run.by_type("kubernetes:core/v1:ConfigMap")
            if "metadata" in r.inputs and "name" in r.inputs["metadata"]}
    for job in jobs:
        spec = job.inputs["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
        main = spec["containers"][0]
        assert main["lifecycle"] == {"preStop": {"exec": {"command": [
            "python3", "/etc/deepspeed/stop_ranks.py", "--timeout", str(GRACE - 5)]}}}
        assert spec["terminationGracePeriodSeconds"] == GRACE
        mounted = {v["name"]: v for v in spec["volumes"]}
        config = next(m for m in main["volumeMounts"] if m["mountPath"] == "/etc/deepspeed")
        config_map = mounted[config["name"]]["configMap"]["name"]
        assert maps[config_map]["stop_ranks.py"] == SCRIPT.read_text()
    assert jobs


def test_the_charts_workers_run_the_hook_from_the_source_config_map() -> None:
    run = stack_run("dev")
    values = run.one(RELEASE).inputs["values"]
    assert values["worker"]["lifecycleHooks"] == {"preStop": {"exec": {"command": [
        "python3", "/app/stop_ranks.py", "--timeout", str(GRACE - 5)]}}}
    assert "lifecycleHooks" not in values["client"]  # the client runs no rank
    source = values["source"]["existingConfigMap"]
    maps = [r for r in run.by_type("kubernetes:core/v1:ConfigMap") if "stop_ranks.py" in r.inputs.get("data", {})]
    assert [m.inputs["data"]["stop_ranks.py"] for m in maps] == [SCRIPT.read_text()]
    assert source is not None
