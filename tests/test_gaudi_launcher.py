"""The Gaudi launcher does what the NVIDIA one does (issue 39 item 2): it waits for the recipe's inputs on the claim,
runs the data step (finetune.py --prepare-data: the check, the records tokenized once into the claim) before
gaudi_spawn.py starts the ranks, remembers a final exit status (2: bad arguments or data) so the launcher's restarts
(restartPolicy OnFailure, backoffLimit 6) run nothing again, and passes a stop on to DeepSpeed's runner under
gaudi_spawn.py so the ranks save.

The rendered launcher script runs whole under bash, as the launcher container would, with stand-ins for what needs a
cluster: `ssh` (the workers' sshd answers), `python` (finetune.py's data step and gaudi_spawn.py, told apart by
their arguments), the operator's hostfile, the claim at a temporary folder, the state emptyDir at another."""

from __future__ import annotations

import contextlib
import copy
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import stack_yaml

from preview.engine import RunResult, engine_config_from_yaml, run_program
from workloads import pod_security

JOB = "gaudi-llm-ds-ft"
MPIJOB = "kubernetes:kubeflow.org/v2beta1:MPIJob"
RECIPE = {"model": "Qwen/Qwen2.5-7B-Instruct", "datasetPath": "data/chat.jsonl", "recordFormat": "messages",
          "epochs": 1}


def run_gaudi(finetune: dict[str, Any] | None) -> RunResult:
    """The gaudi example, its `training` replaced by `finetune` (None: Omnia's run as the example has it)."""
    config = stack_yaml("gaudi")
    job = config["deepspeed-stack:workloads"][JOB]
    if finetune is not None:
        job.pop("training")
        job["finetune"] = copy.deepcopy(finetune)
    engine_cfg, secrets = engine_config_from_yaml(config)
    return run_program(engine_cfg, secrets, stack="gaudi")


@pytest.fixture(scope="module")
def recipe_run() -> RunResult:
    return run_gaudi(RECIPE)


def launcher(run: RunResult) -> dict[str, Any]:
    return run.one(MPIJOB).inputs["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]


def runnable(run: RunResult, tmp_path: Path, python: str) -> tuple[str, dict[str, str], Path]:
    """The launcher's script as rendered, made to run here: the claim at tmp_path/claim (the data on it), the
    emptyDir at tmp_path/state, the image's example folder at tmp_path; `python` the stand-in's body (bash; $@: the
    arguments). Returns (script, environment, the stand-ins' call log)."""
    (container,) = launcher(run)["containers"]
    claim, state, bin_dir, calls = (tmp_path / n for n in ("claim", "state", "bin", "calls"))
    for folder in (claim / "data", state, bin_dir, tmp_path / "examples"):
        folder.mkdir(parents=True, exist_ok=True)
    (claim / "data" / "chat.jsonl").write_text('{"messages": "not a list"}\n', encoding="utf-8")
    script = (container["args"][0].replace("/storage", str(claim)).replace("/run/deepspeed-stack", str(state))
              .replace(pod_security.GAUDI_EXAMPLES_DIR, str(tmp_path / "examples")))
    stubs = {"ssh": "exit 0", "python": f'echo "$*" >> {calls}\n{python}'}
    for name, body in stubs.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n", encoding="utf-8")
        (bin_dir / name).chmod(0o755)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("w0 slots=8\n", encoding="utf-8")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "OMPI_MCA_orte_default_hostfile": str(hostfile),
           "KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOME": str(tmp_path)}
    return script, env, calls


def steps(calls: Path) -> list[str]:
    """Each stand-in call: the data step or the ranks (gaudi_spawn.py)."""
    if not calls.exists():
        return []
    return ["data step" if "--prepare-data" in line else "ranks" if "gaudi_spawn.py" in line else line
            for line in calls.read_text(encoding="utf-8").splitlines()]


def bash(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=60, check=False)


def test_a_bad_record_stops_the_job_once_before_the_ranks(recipe_run: RunResult, tmp_path: Path) -> None:
    """finetune.py --prepare-data exits 2 on a bad record: the ranks never start, and the restarted launcher (the
    emptyDir kept) stops at once without running anything."""
    script, env, calls = runnable(recipe_run, tmp_path, 'case "$*" in *--prepare-data*) exit 2;; esac')
    first = bash(script, env)
    assert first.returncode == 2, first.stderr
    assert steps(calls) == ["data step"]
    assert (tmp_path / "state" / "final-status").read_text().strip() == "2"
    assert "the input check stopped with exit status 2" in first.stderr
    again = bash(script, env)
    assert again.returncode == 2 and steps(calls) == ["data step"]  # nothing ran again
    assert "not running the ranks again" in again.stderr


def test_the_data_step_runs_once_before_gaudi_spawn(recipe_run: RunResult, tmp_path: Path) -> None:
    script, env, calls = runnable(recipe_run, tmp_path, "exit 0")
    done = bash(script, env)
    assert done.returncode == 0, done.stderr
    assert steps(calls) == ["data step", "ranks"]
    data_step, ranks = calls.read_text(encoding="utf-8").splitlines()
    # The same arguments as the ranks' finetune.py: the tokenized folder they memory-map is the one it made.
    assert data_step == ("/etc/deepspeed/finetune.py --prepare-data "
                         + ranks.split("/etc/deepspeed/finetune.py ", 1)[1])
    assert f"--dataset {tmp_path}/claim/data/chat.jsonl" in data_step


def test_a_rank_exiting_2_is_final_and_another_failure_is_retried(recipe_run: RunResult, tmp_path: Path) -> None:
    script, env, calls = runnable(recipe_run, tmp_path, 'case "$*" in *gaudi_spawn*) exit 2;; esac')
    assert bash(script, env).returncode == 2 and steps(calls) == ["data step", "ranks"]
    again = bash(script, env)
    assert again.returncode == 2 and steps(calls) == ["data step", "ranks"]
    script, env, calls = runnable(recipe_run, tmp_path / "other", 'case "$*" in *gaudi_spawn*) exit 1;; esac')
    assert bash(script, env).returncode == 1 and bash(script, env).returncode == 1
    assert steps(calls) == ["data step", "ranks", "data step", "ranks"]  # retried: the tokenized data is found then


def test_omnias_run_is_guarded_too(tmp_path: Path) -> None:
    """Without `finetune` (run_lora_clm.py): no data step, but argparse's exit 2 is final as well."""
    script, env, calls = runnable(run_gaudi(None), tmp_path, "exit 2")
    assert bash(script, env).returncode == 2 and bash(script, env).returncode == 2
    assert steps(calls) == ["ranks"]


def test_the_launcher_waits_for_the_data_on_the_claim(recipe_run: RunResult) -> None:
    (container,) = launcher(recipe_run)["containers"]
    lines = container["args"][0].splitlines()
    (wait,) = [i for i, line in enumerate(lines) if line.startswith("for path in /storage/data/chat.jsonl; do ")]
    assert "(copy it onto the claim)" in lines[wait]
    assert lines[wait + 1].startswith("check_inputs python /etc/deepspeed/finetune.py --prepare-data ")
    assert lines[wait + 2].startswith("run_ranks python ../gaudi_spawn.py ")


def test_the_launcher_keeps_its_state_in_an_empty_dir(recipe_run: RunResult) -> None:
    pod = launcher(recipe_run)
    assert {"name": "launcher-state", "emptyDir": {"sizeLimit": "1Mi"}} in pod["volumes"]
    assert {"name": "launcher-state", "mountPath": "/run/deepspeed-stack"} in pod["containers"][0]["volumeMounts"]
    spec = recipe_run.one(MPIJOB).inputs["spec"]
    assert spec["mpiReplicaSpecs"]["Launcher"]["restartPolicy"] == "OnFailure"


@pytest.mark.parametrize("runner_status", [143, 255])
def test_a_stop_asks_the_workers_ranks_to_save_and_waits_for_them(recipe_run: RunResult, tmp_path: Path,
                                                                   runner_status: int) -> None:
    """The kubelet's SIGTERM goes to the launcher's shell. It does not signal gaudi_spawn.py or DeepSpeed's runner
    under it (the runner's PDSH handler would have the per-node launchers SIGKILL the ranks 30 s later): it runs
    every worker's preStop hook over ssh (stop_ranks.py: the ranks save, then stop), and waits until the runner
    (a stand-in that ends once the ranks were asked, as it does when they exit) and gaudi_spawn.py end with the
    ranks' status, 143. pdsh's 255 (a worker's sshd closed the connection as its pod stopped, before the rank's
    status came back: make e2e saw it) is the stop's 143 too."""
    ready, runner_log, asked = tmp_path / "ready", tmp_path / "runner", tmp_path / "asked"
    # The stand-in ends by itself within 30 s whatever happens: it may sit in a process group of its own, out of the
    # finally's killpg, and a loop on `read` spun at full CPU once stdin closed (one ran for 100 minutes here).
    runner = (f"trap 'echo signalled >> {runner_log}' TERM; touch {ready}; "
              f"until [ -e {asked} ] || ((SECONDS >= 30)); do sleep 0.05; done; echo saved >> {runner_log}; "
              f"exit {runner_status}")
    spawn = f'case "$*" in *gaudi_spawn*) bash -c "{runner}"; exit $?;; esac'
    script, env, _ = runnable(recipe_run, tmp_path, spawn)
    ssh = tmp_path / "bin" / "ssh"  # the workers answer; a stop_ranks.py request is recorded and "delivered"
    ssh.write_text(f'#!/bin/bash\ncase "$*" in *stop_ranks.py*) echo "$*" >> {tmp_path / "ssh"}; touch {asked};; '
                   "esac\nexit 0\n", encoding="utf-8")
    proc = subprocess.Popen(["bash", "-c", script], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline and proc.poll() is None:
            os.sched_yield()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == 143, err
    assert runner_log.read_text().splitlines() == ["saved"]  # asked through the workers, never signalled
    (request,) = (tmp_path / "ssh").read_text().splitlines()
    assert request.startswith("-o ConnectTimeout=5 -o BatchMode=yes w0 python3 /etc/deepspeed/stop_ranks.py --timeout ")
    assert "asking every worker's ranks to save and stop" in err
    assert ("a worker's connection closed as its pod stopped (ssh 255); exit status 143" in err) == (
        runner_status == 255)
    assert not (tmp_path / "state" / "final-status").exists()  # preempted: retried, resumed from the checkpoint


def test_a_cut_connection_without_a_stop_stays_255(recipe_run: RunResult, tmp_path: Path) -> None:
    """With no stop asked, pdsh's 255 (a worker unreachable, its connection cut) is the launcher's status: a
    failure the launcher's restarts retry, not a stop."""
    spawn = 'case "$*" in *gaudi_spawn*) exit 255;; esac'
    script, env, _ = runnable(recipe_run, tmp_path, spawn)
    result = bash(script, env)
    assert result.returncode == 255, result.stderr
    assert "exit status 143" not in result.stderr


def test_the_whole_launcher_script_is_shellcheck_clean(recipe_run: RunResult, tmp_path: Path) -> None:
    from test_image import tool

    (container,) = launcher(recipe_run)["containers"]
    script = tmp_path / "launcher.sh"
    script.write_text("#!/bin/bash\n" + container["args"][0] + "\n", encoding="utf-8")
    # Left out, each by design: SC2154 (the operator sets OMPI_MCA_orte_default_hostfile), SC2155 and SC2013 (the
    # hostfile preamble shared with the NVIDIA launcher: `set -e` does not stop at a head or sed there, and the
    # hostfile's words are host names), SC2043 (the wait's list holds one path when only the data is awaited),
    # SC2329 (stop_workers is called from the SIGTERM trap, which shellcheck does not follow).
    done = subprocess.run([tool("shellcheck"), "-e", "SC2154,SC2155,SC2013,SC2043,SC2329", str(script)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout
