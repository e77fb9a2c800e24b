"""Vertex AI mode of the DeepSpeed image: vertex_cluster.py (CLUSTER_SPEC, hostfile, /gcs paths) and
vertex_start.sh driven with stand-ins for deepspeed, sshd, ssh and nvidia-smi (no network, no sleeps).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from conftest import load_file

ROOT = Path(__file__).resolve().parent.parent
IMAGE_DIR = ROOT / "workloads" / "images" / "deepspeed"
CLUSTER_PY = IMAGE_DIR / "vertex_cluster.py"
START_SH = IMAGE_DIR / "vertex_start.sh"

PRIMARY = "cmle-training-workerpool0-ab12-0"
WORKER_0 = "cmle-training-workerpool1-ab12-0"
WORKER_1 = "cmle-training-workerpool1-ab12-1"


def spec(task_type: str = "workerpool0", index: int = 0, *, workers: int = 2, **extra: Any) -> str:
    cluster: dict[str, Any] = {"workerpool0": [f"{PRIMARY}:2222"]}
    if workers:
        cluster["workerpool1"] = [f"{host}:2222" for host in (WORKER_0, WORKER_1)[:workers]]
    cluster.update(extra)
    return json.dumps(
        {"cluster": cluster, "environment": "cloud", "task": {"type": task_type, "index": index, "trial": ""}}
    )


SINGLE = spec(workers=0)
TWO_POOLS = spec()


@pytest.fixture(scope="module")
def vc() -> ModuleType:
    return load_file(CLUSTER_PY, "vertex_cluster")


# --------------------------------------------------------------------------------------------
# CLUSTER_SPEC → hosts, roles, hostfile
# --------------------------------------------------------------------------------------------


def test_single_node_spec(vc: ModuleType) -> None:
    cluster = vc.parse_cluster_spec(SINGLE)
    assert cluster.hosts == (PRIMARY,)
    assert cluster.is_primary and cluster.role == "primary"
    assert not cluster.is_multi_node
    assert vc.render_hostfile(cluster.hosts, 4) == f"{PRIMARY} slots=4\n"


def test_two_pools_primary_first(vc: ModuleType) -> None:
    cluster = vc.parse_cluster_spec(TWO_POOLS)
    assert cluster.hosts == (PRIMARY, WORKER_0, WORKER_1)
    assert cluster.primary_host == PRIMARY
    assert cluster.is_multi_node
    assert vc.render_hostfile(cluster.hosts, 8) == (
        f"{PRIMARY} slots=8\n{WORKER_0} slots=8\n{WORKER_1} slots=8\n"
    )


@pytest.mark.parametrize(
    ("task_type", "index", "primary", "role", "this_host"),
    [
        ("workerpool0", 0, True, "primary", PRIMARY),
        ("workerpool1", 0, False, "worker", WORKER_0),
        ("workerpool1", 1, False, "worker", WORKER_1),
        ("workerpool2", 0, False, "other", None),
    ],
)
def test_primary_detection(
    vc: ModuleType, task_type: str, index: int, primary: bool, role: str, this_host: str | None
) -> None:
    cluster = vc.parse_cluster_spec(spec(task_type, index, workerpool2=["reduction-0:2222"]))
    assert cluster.is_primary is primary
    assert cluster.role == role
    assert cluster.this_host == this_host
    assert cluster.hosts == (PRIMARY, WORKER_0, WORKER_1), "pools 2 and 3 are not DeepSpeed hosts"


def test_slots_per_host(vc: ModuleType) -> None:
    hosts = (PRIMARY, WORKER_0, WORKER_1)
    text = vc.render_hostfile(hosts, {PRIMARY: 8, WORKER_0: 4, WORKER_1: 4})
    assert text.splitlines() == [f"{PRIMARY} slots=8", f"{WORKER_0} slots=4", f"{WORKER_1} slots=4"]
    with pytest.raises(ValueError, match=f"no slot count for host '{WORKER_1}'"):
        vc.render_hostfile(hosts, {PRIMARY: 8, WORKER_0: 4})
    with pytest.raises(ValueError, match="must be a positive integer, got 0"):
        vc.render_hostfile(hosts, 0)
    with pytest.raises(ValueError, match="without hosts"):
        vc.render_hostfile((), 1)


@pytest.mark.parametrize(
    ("address", "host"),
    [("h-0:2222", "h-0"), ("h-0", "h-0"), ("10.0.0.2:2222", "10.0.0.2"), ("[fd00::2]:2222", "fd00::2")],
)
def test_host_of(vc: ModuleType, address: str, host: str) -> None:
    assert vc.host_of(address) == host


# --------------------------------------------------------------------------------------------
# Malformed specs
# --------------------------------------------------------------------------------------------


def raw_spec(cluster: Any, task: Any = None) -> str:
    return json.dumps({"cluster": cluster, "task": task or {"type": "workerpool0", "index": 0}})


MALFORMED = [
    pytest.param("", "CLUSTER_SPEC is unset or empty", id="empty"),
    pytest.param("{not json", "CLUSTER_SPEC is not valid JSON", id="not-json"),
    pytest.param("[1, 2]", "CLUSTER_SPEC must be a JSON object, got list", id="not-object"),
    pytest.param('{"task": {"type": "workerpool0", "index": 0}}', "has no 'cluster' object", id="no-cluster"),
    pytest.param(
        '{"cluster": ["a:1"]}', "'cluster' must be an object of worker pools, got list", id="cluster-list"
    ),
    pytest.param(
        '{"cluster": {"workerpool1": ["w:1"]}, "task": {"type": "workerpool1", "index": 0}}',
        "'cluster' has no 'workerpool0'",
        id="no-workerpool0",
    ),
    pytest.param(
        '{"cluster": {"workerpool0": "p:1"}, "task": {"type": "workerpool0", "index": 0}}',
        "'cluster.workerpool0' must be a list",
        id="pool0-not-list",
    ),
    pytest.param(
        raw_spec({"workerpool0": ["p:1"], "workerpool1": {"w": 1}}),
        "'cluster.workerpool1' must be a list of \"host:port\" strings, got dict",
        id="pool1-not-list",
    ),
    pytest.param(
        '{"cluster": {"workerpool0": []}, "task": {"type": "workerpool0", "index": 0}}',
        "'cluster.workerpool0' is empty",
        id="pool0-empty",
    ),
    pytest.param(
        '{"cluster": {"workerpool0": [7]}, "task": {"type": "workerpool0", "index": 0}}',
        "'cluster.workerpool0[0]' must be a \"host:port\" string, got 7",
        id="entry-not-string",
    ),
    pytest.param(
        raw_spec({"workerpool0": ["p:1"], "workerpool1": ["p:1"]}),
        "lists host 'p' more than once",
        id="duplicate-host",
    ),
    pytest.param('{"cluster": {"workerpool0": ["p:1"]}}', "has no 'task' object", id="no-task"),
    pytest.param(
        '{"cluster": {"workerpool0": ["p:1"]}, "task": {"type": "workerpool0", "index": -1}}',
        "'task.index' must be a non-negative integer, got -1",
        id="index-negative",
    ),
    pytest.param(
        '{"cluster": {"workerpool0": ["p:1"]}, "task": {"type": "workerpool0", "index": "0"}}',
        "'task.index' must be a non-negative integer, got '0'",
        id="index-string",
    ),
    pytest.param(
        '{"cluster": {"workerpool0": ["p:1"]}, "task": {"type": "workerpool0"}}',
        "'task.index' must be a non-negative integer, got None",
        id="index-missing",
    ),
    pytest.param(
        raw_spec({"workerpool0": ["p:1"], "workerpool1": ["w:1"]}, {"type": "workerpool1", "index": 1}),
        "'task.index' 1 is out of range for 'workerpool1' (1 replica)",
        id="index-out-of-range",
    ),
    pytest.param(
        '{"cluster": {"workerpool0": ["p:1"]}, "task": {"type": "workerpool3", "index": 0}}',
        "'task.type' 'workerpool3' is not a pool in 'cluster'",
        id="unknown-task-type",
    ),
]


@pytest.mark.parametrize(("raw", "message"), MALFORMED)
def test_malformed_specs_raise_clear_errors(vc: ModuleType, raw: str, message: str) -> None:
    with pytest.raises(vc.ClusterSpecError) as exc:
        vc.parse_cluster_spec(raw)
    assert isinstance(exc.value, ValueError)
    assert message in str(exc.value)


CLEAN_ENV_PREFIXES = ("AIP_", "CLUSTER_SPEC", "CLOUD_ML_", "VERTEX_")


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """vertex_cluster.py in a subprocess, as vertex_start.sh runs it."""
    base = {key: value for key, value in os.environ.items() if not key.startswith(CLEAN_ENV_PREFIXES)}
    return subprocess.run(
        [sys.executable, str(CLUSTER_PY), *args],
        capture_output=True,
        text=True,
        timeout=20,
        env={**base, **(env or {})},
    )


@pytest.fixture
def cli(vc: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Any:
    """vertex_cluster.main in-process (fast): returns (exit status, stdout, stderr)."""

    def invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
        for key in list(os.environ):
            if key.startswith(CLEAN_ENV_PREFIXES):
                monkeypatch.delenv(key)
        for key, value in (env or {}).items():
            monkeypatch.setenv(key, value)
        try:
            status = vc.main(list(args))
        except SystemExit as exc:  # argparse usage errors
            status = exc.code
        captured = capsys.readouterr()
        return status, captured.out, captured.err

    return invoke


@pytest.mark.parametrize(("raw", "message"), [MALFORMED[1], MALFORMED[5], MALFORMED[7], MALFORMED[15]])
def test_cli_exits_2_with_message_and_no_traceback(raw: str, message: str) -> None:
    proc = run_cli("role", env={"CLUSTER_SPEC": raw})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("vertex_cluster.py: error: CLUSTER_SPEC ")
    assert proc.stderr.count("\n") == 1, "one line"
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize("command", [["hosts"], ["env"], ["hostfile", "--slots", "1"]])
def test_every_cli_command_reports_malformed_specs(cli: Any, command: list[str]) -> None:
    status, out, err = cli(*command, env={"CLUSTER_SPEC": '{"cluster": {"workerpool1": []}}'})
    assert (status, out) == (2, "")
    assert (
        err == "vertex_cluster.py: error: CLUSTER_SPEC 'cluster' has no 'workerpool0' (the primary replica)\n"
    )


def test_cli_unset_cluster_spec() -> None:
    proc = run_cli("hostfile", "--slots", "1")
    assert proc.returncode == 2
    assert "CLUSTER_SPEC is unset or empty" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_bad_slots_is_a_usage_error(cli: Any) -> None:
    status, _, err = cli("hostfile", "--slots", "0", env={"CLUSTER_SPEC": TWO_POOLS})
    assert status == 2
    assert "expected a positive integer, got '0'" in err
    status, _, err = cli("hostfile", env={"CLUSTER_SPEC": TWO_POOLS})
    assert status == 2
    assert "pass --slots N or --host-slots HOST=N" in err
    status, _, err = cli(
        "hostfile", "--slots", "1", "--host-slots", "elsewhere=2", env={"CLUSTER_SPEC": TWO_POOLS}
    )
    assert status == 2
    assert "not in CLUSTER_SPEC: elsewhere" in err


def test_cli_role_hosts_hostfile(cli: Any, tmp_path: Path) -> None:
    env = {"CLUSTER_SPEC": spec("workerpool1", 1)}
    assert cli("role", env=env) == (0, "worker\n", "")
    assert cli("hosts", env=env) == (0, f"{PRIMARY}\n{WORKER_0}\n{WORKER_1}\n", "")
    status, out, _ = cli("hostfile", "--slots", "4", "--host-slots", f"{PRIMARY}=8", env=env)
    assert status == 0
    assert out == f"{PRIMARY} slots=8\n{WORKER_0} slots=4\n{WORKER_1} slots=4\n"
    output = tmp_path / "hostfile"
    status, out, _ = cli(
        "--cluster-spec", SINGLE, "hostfile", "--slots", "2", "--output", str(output), env=env
    )
    assert (status, out) == (0, "")
    assert output.read_text(encoding="utf-8") == f"{PRIMARY} slots=2\n"


# --------------------------------------------------------------------------------------------
# AIP_* paths and the key exchange directory
# --------------------------------------------------------------------------------------------


def test_gcs_to_local(vc: ModuleType) -> None:
    assert vc.gcs_to_local("gs://bucket/path/to/model/") == "/gcs/bucket/path/to/model/"
    assert vc.gcs_to_local("gs://bucket") == "/gcs/bucket"
    assert vc.gcs_to_local("/mnt/local/dir") == "/mnt/local/dir"
    assert vc.gcs_to_local("s3://bucket/x") == "s3://bucket/x"
    assert vc.gcs_to_local("") == ""
    with pytest.raises(vc.VertexEnvError, match="has no bucket name"):
        vc.gcs_to_local("gs:///x")


def test_mapped_paths(vc: ModuleType) -> None:
    env = {
        "AIP_MODEL_DIR": "gs://b/run/model/",
        "AIP_CHECKPOINT_DIR": "/local/ckpt",
        "UNRELATED": "gs://b/other",
    }
    assert vc.mapped_paths(env) == {"AIP_MODEL_DIR": "/gcs/b/run/model/", "AIP_CHECKPOINT_DIR": "/local/ckpt"}
    assert vc.mapped_paths({}) == {}
    with pytest.raises(vc.VertexEnvError, match="AIP_CHECKPOINT_DIR: 'gs://' has no bucket name"):
        vc.mapped_paths({"AIP_CHECKPOINT_DIR": "gs://"})


def test_paths_cli_output_is_shell_safe(cli: Any) -> None:
    env = {
        "AIP_MODEL_DIR": "gs://b/run/model/",
        "AIP_TENSORBOARD_LOG_DIR": "gs://b/it's $HOME/logs",
        "AIP_CHECKPOINT_DIR": "/already/local",
    }
    status, out, _ = cli("paths", env=env)
    assert status == 0
    lines = out.splitlines()
    assert lines[0] == "export AIP_MODEL_DIR=/gcs/b/run/model/"
    assert len(lines) == 3, "unset variables are not exported"
    parsed = dict(shlex.split(line)[1].split("=", 1) for line in lines)
    assert parsed["AIP_TENSORBOARD_LOG_DIR"] == "/gcs/b/it's $HOME/logs"
    assert parsed["AIP_CHECKPOINT_DIR"] == "/already/local"


def test_paths_cli_evaluated_by_bash() -> None:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash is not installed")
    script = f'eval "$({shlex.quote(sys.executable)} {shlex.quote(str(CLUSTER_PY))} paths)"; '
    script += 'printf "%s|%s|%s" "$AIP_MODEL_DIR" "$AIP_TENSORBOARD_LOG_DIR" "${AIP_CHECKPOINT_DIR-unset}"'
    env = {key: value for key, value in os.environ.items() if not key.startswith("AIP_")}
    env.update({"AIP_MODEL_DIR": "gs://b/m", "AIP_TENSORBOARD_LOG_DIR": "gs://b/a b;echo pwned"})
    proc = subprocess.run([bash, "-c", script], capture_output=True, text=True, timeout=20, env=env)
    assert proc.stdout == "/gcs/b/m|/gcs/b/a b;echo pwned|unset"


def test_exchange_dir(vc: ModuleType) -> None:
    cluster = vc.parse_cluster_spec(TWO_POOLS)
    env = {"AIP_MODEL_DIR": "gs://bkt/jobs/run1/model/", "CLOUD_ML_JOB_ID": "8123"}
    assert vc.exchange_dir(env, cluster) == "/gcs/bkt/jobs/run1/.ssh-exchange/8123"
    # Without a job id every replica still agrees: the primary's host name is unique per job.
    assert (
        vc.exchange_dir({"AIP_MODEL_DIR": "gs://bkt/model"}, cluster) == f"/gcs/bkt/.ssh-exchange/{PRIMARY}"
    )
    override = {**env, "VERTEX_SSH_EXCHANGE_DIR": "/gcs/other/keys/"}
    assert vc.exchange_dir(override, cluster) == "/gcs/other/keys"
    for bad in ({}, {"AIP_MODEL_DIR": "gs://bkt"}, {"AIP_MODEL_DIR": "/local/model"}):
        with pytest.raises(vc.VertexEnvError, match="VERTEX_SSH_EXCHANGE_DIR"):
            vc.exchange_dir(bad, cluster)


def test_job_id_is_path_safe(vc: ModuleType) -> None:
    cluster = vc.parse_cluster_spec(TWO_POOLS)
    assert vc.job_id({"CLOUD_ML_JOB_ID": "a/b c"}, cluster) == "a_b_c"
    trial = vc.parse_cluster_spec(TWO_POOLS.replace('"trial": ""', '"trial": "7"'))
    assert vc.job_id({"CLOUD_ML_JOB_ID": "99"}, trial) == "99-trial-7"


def test_env_cli_for_worker(cli: Any) -> None:
    env = {
        "CLUSTER_SPEC": spec("workerpool1", 0),
        "AIP_MODEL_DIR": "gs://bkt/run/model",
        "CLOUD_ML_JOB_ID": "42",
    }
    status, out, _ = cli("env", env=env)
    assert status == 0
    values = dict(shlex.split(line)[1].split("=", 1) for line in out.splitlines())
    assert values == {
        "AIP_MODEL_DIR": "/gcs/bkt/run/model",
        "VERTEX_ROLE": "worker",
        "VERTEX_IS_PRIMARY": "0",
        "VERTEX_PRIMARY_HOST": PRIMARY,
        "VERTEX_THIS_HOST": WORKER_0,
        "VERTEX_HOSTS": f"{PRIMARY} {WORKER_0} {WORKER_1}",
        "VERTEX_NUM_HOSTS": "3",
        "VERTEX_JOB_ID": "42",
        "VERTEX_SSH_EXCHANGE_DIR": "/gcs/bkt/run/.ssh-exchange/42",
    }


def test_env_cli_multi_node_without_output_dir_fails(cli: Any) -> None:
    status, _, err = cli("env", env={"CLUSTER_SPEC": TWO_POOLS})
    assert status == 2
    assert "needs a shared directory for the SSH key exchange" in err
    # A single node exchanges no keys and needs no bucket.
    status, out, _ = cli("env", env={"CLUSTER_SPEC": SINGLE})
    assert status == 0
    assert "VERTEX_SSH_EXCHANGE_DIR" not in out


# --------------------------------------------------------------------------------------------
# vertex_start.sh with stand-in commands
# --------------------------------------------------------------------------------------------

FAKE_DEEPSPEED = """#!/bin/bash
{
  echo "deepspeed $*"
  echo "AIP_MODEL_DIR=${AIP_MODEL_DIR-unset}"
  for arg in "$@"; do
    if [[ "$arg" == --hostfile=* ]]; then echo "HOSTFILE:"; cat "${arg#--hostfile=}"; fi
  done
} >> "$FAKE_LOG"
exit "${FAKE_DEEPSPEED_RC:-0}"
"""

# sshd exits at once (a worker's wait returns), recording its arguments.
FAKE_SSHD = """#!/bin/bash
echo "sshd $*" >> "$FAKE_LOG"
"""

# ssh: every host answers; `nvidia-smi -L` over ssh lists FAKE_REMOTE_GPUS GPUs.
FAKE_SSH = """#!/bin/bash
echo "ssh $*" >> "$FAKE_LOG"
if [[ "$*" == *nvidia-smi* ]]; then
  for ((i = 0; i < ${FAKE_REMOTE_GPUS:-2}; i++)); do echo "GPU $i: Tesla T4 (UUID: GPU-$i)"; done
fi
exit 0
"""

FAKE_NVIDIA_SMI = """#!/bin/bash
for ((i = 0; i < ${FAKE_LOCAL_GPUS:-4}; i++)); do echo "GPU $i: NVIDIA L4 (UUID: GPU-$i)"; done
"""


@pytest.fixture
def sandbox(tmp_path: Path) -> dict[str, Any]:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash is not installed")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, body in (
        ("deepspeed", FAKE_DEEPSPEED),
        ("sshd", FAKE_SSHD),
        ("ssh", FAKE_SSH),
        ("nvidia-smi", FAKE_NVIDIA_SMI),
    ):
        path = bindir / name
        path.write_text(body, encoding="utf-8")
        path.chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("AIP_", "CLUSTER_SPEC", "VERTEX_", "CLOUD_ML_"))
    }
    env.update(
        {
            "PATH": f"{bindir}:{env.get('PATH', '/usr/bin:/bin')}",
            "HOME": str(home),
            "FAKE_LOG": str(tmp_path / "log"),
            "VERTEX_PYTHON": sys.executable,
            "VERTEX_RUNTIME_DIR": str(tmp_path / "runtime"),
            "VERTEX_SSH_WAIT_RETRIES": "2",
            "VERTEX_SSH_WAIT_SLEEP": "0",
        }
    )
    return {"bash": bash, "env": env, "tmp": tmp_path, "home": home, "log": tmp_path / "log"}


def start(box: dict[str, Any], *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [box["bash"], str(START_SH), *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**box["env"], **env},
        cwd=box["tmp"],
    )


def log_of(box: dict[str, Any]) -> str:
    path: Path = box["log"]
    return path.read_text(encoding="utf-8") if path.exists() else ""


def need_ssh_keygen() -> None:
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen is not installed")


def test_start_without_cluster_spec_runs_deepspeed(sandbox: dict[str, Any]) -> None:
    proc = start(sandbox, "train.py", "--deepspeed_config", "ds.json", AIP_MODEL_DIR="gs://bkt/m")
    assert proc.returncode == 0, proc.stderr
    assert log_of(sandbox).splitlines() == [
        "deepspeed train.py --deepspeed_config ds.json",
        "AIP_MODEL_DIR=/gcs/bkt/m",
    ]


def test_start_propagates_the_exit_status(sandbox: dict[str, Any]) -> None:
    proc = start(sandbox, "train.py", FAKE_DEEPSPEED_RC="7")
    assert proc.returncode == 7


def test_start_single_host_maps_paths(sandbox: dict[str, Any]) -> None:
    proc = start(sandbox, "--", "train.py", CLUSTER_SPEC=SINGLE, AIP_MODEL_DIR="gs://bkt/run/model/")
    assert proc.returncode == 0, proc.stderr
    assert log_of(sandbox).splitlines() == ["deepspeed train.py", "AIP_MODEL_DIR=/gcs/bkt/run/model/"]


def test_start_command_mode(sandbox: dict[str, Any]) -> None:
    out = sandbox["tmp"] / "out"
    proc = start(sandbox, "--command", "bash", "-c", f'echo "ran $0" > {out}', "arg0")
    assert proc.returncode == 0, proc.stderr
    assert out.read_text(encoding="utf-8") == "ran arg0\n"
    assert log_of(sandbox) == ""


def test_start_without_arguments_is_a_usage_error(sandbox: dict[str, Any]) -> None:
    proc = start(sandbox)
    assert proc.returncode == 1
    assert "usage: vertex_start.sh" in proc.stderr


def test_start_with_malformed_spec_fails_clearly(sandbox: dict[str, Any]) -> None:
    proc = start(sandbox, "train.py", CLUSTER_SPEC='{"cluster": {}}')
    assert proc.returncode == 1
    assert "has no 'workerpool0'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert log_of(sandbox) == ""


def test_start_other_pool_does_nothing(sandbox: dict[str, Any]) -> None:
    proc = start(sandbox, "train.py", CLUSTER_SPEC=spec("workerpool2", 0, workerpool2=["rs-0:2222"]))
    assert proc.returncode == 0, proc.stderr
    assert "not part of the DeepSpeed cluster" in proc.stderr
    assert log_of(sandbox) == ""


def test_start_multi_node_needs_exchange_dir(sandbox: dict[str, Any]) -> None:
    proc = start(sandbox, "train.py", CLUSTER_SPEC=TWO_POOLS)
    assert proc.returncode == 1
    assert "VERTEX_SSH_EXCHANGE_DIR" in proc.stderr
    assert log_of(sandbox) == ""


STACK_KEYS = '{"--dataset":"vertex.finetune.datasetPath","--model":"vertex.finetune.model"}'


def test_start_worker_installs_key_and_serves_ssh(sandbox: dict[str, Any]) -> None:
    need_ssh_keygen()
    exchange = sandbox["tmp"] / "exchange"
    exchange.mkdir()
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITESTKEY deepspeed-vertex-test\n"
    (exchange / "primary_ed25519.pub").write_text(key, encoding="utf-8")
    proc = start(
        sandbox,
        "train.py",
        CLUSTER_SPEC=spec("workerpool1", 1),
        AIP_MODEL_DIR="gs://bkt/run/model",
        VERTEX_SSH_EXCHANGE_DIR=str(exchange),
        FINETUNE_STACK_KEYS=STACK_KEYS,
    )
    assert proc.returncode == 0, proc.stderr
    ssh_dir: Path = sandbox["home"] / ".ssh"
    assert key in (ssh_dir / "authorized_keys").read_text(encoding="utf-8")
    environment = (ssh_dir / "environment").read_text(encoding="utf-8").splitlines()
    assert "AIP_MODEL_DIR=/gcs/bkt/run/model" in environment
    # The recipe's stack keys reach the ranks this host serves as they are (sshd does not parse the value).
    assert f"FINETUNE_STACK_KEYS={STACK_KEYS}" in environment
    assert any(line.startswith("PATH=") for line in environment)
    assert "Port 2222" in (ssh_dir / "config").read_text(encoding="utf-8")
    log = log_of(sandbox)
    assert "deepspeed" not in log, "workers never launch"
    sshd = next(line for line in log.splitlines() if line.startswith("sshd "))
    assert "-p 2222" in sshd and "-D" in sshd and "PermitUserEnvironment=yes" in sshd
    assert (sandbox["tmp"] / "runtime" / "ssh_host_ed25519_key").is_file(), "host key generated at start"
    assert not (ssh_dir / "id_ed25519").exists(), "workers hold no private client key"


def test_start_worker_gives_up_without_key(sandbox: dict[str, Any]) -> None:
    need_ssh_keygen()
    exchange = sandbox["tmp"] / "exchange"
    proc = start(
        sandbox, "train.py", CLUSTER_SPEC=spec("workerpool1", 0), VERTEX_SSH_EXCHANGE_DIR=str(exchange)
    )
    assert proc.returncode == 1
    assert "did not publish its key" in proc.stderr


def test_start_primary_exchanges_key_writes_hostfile_and_launches(sandbox: dict[str, Any]) -> None:
    need_ssh_keygen()
    exchange = sandbox["tmp"] / "exchange" / "job"
    proc = start(
        sandbox,
        "train.py",
        "--deepspeed_config",
        "ds.json",
        CLUSTER_SPEC=TWO_POOLS,
        AIP_MODEL_DIR="gs://bkt/run/model",
        VERTEX_SSH_EXCHANGE_DIR=str(exchange),
        FAKE_LOCAL_GPUS="4",
        FAKE_REMOTE_GPUS="2",
        FAKE_DEEPSPEED_RC="3",
    )
    assert proc.returncode == 3, proc.stderr
    log = log_of(sandbox).splitlines()
    # Every host (the primary included) was probed over SSH before the launch.
    probes = [line for line in log if line.startswith("ssh ") and line.endswith(" true")]
    assert [line.split()[-2] for line in probes] == [PRIMARY, WORKER_0, WORKER_1]
    launch = next(line for line in log if line.startswith("deepspeed "))
    runtime = sandbox["tmp"] / "runtime"
    assert launch == f"deepspeed --hostfile={runtime}/hostfile train.py --deepspeed_config ds.json"
    hostfile = log[log.index("HOSTFILE:") + 1 : log.index("HOSTFILE:") + 4]
    assert hostfile == [f"{PRIMARY} slots=4", f"{WORKER_0} slots=2", f"{WORKER_1} slots=2"]
    assert "AIP_MODEL_DIR=/gcs/bkt/run/model" in log
    # The public key was published, then removed; the private key never left ~/.ssh.
    assert not (exchange / "primary_ed25519.pub").exists()
    ssh_dir: Path = sandbox["home"] / ".ssh"
    public = (ssh_dir / "id_ed25519.pub").read_text(encoding="utf-8")
    assert public.startswith("ssh-ed25519 ")
    assert public in (ssh_dir / "authorized_keys").read_text(encoding="utf-8")
    assert "AIP_MODEL_DIR=/gcs/bkt/run/model" in (sandbox["home"] / ".deepspeed_env").read_text(
        encoding="utf-8"
    )


def test_start_primary_fails_when_a_host_never_answers(sandbox: dict[str, Any]) -> None:
    need_ssh_keygen()
    never = sandbox["tmp"] / "bin" / "ssh"
    never.write_text('#!/bin/bash\necho "ssh $*" >> "$FAKE_LOG"\n[[ "$*" != *workerpool1-ab12-1* ]]\n')
    exchange = sandbox["tmp"] / "exchange"
    proc = start(sandbox, "train.py", CLUSTER_SPEC=TWO_POOLS, VERTEX_SSH_EXCHANGE_DIR=str(exchange))
    assert proc.returncode == 1
    assert f"host {WORKER_1} did not answer over SSH after 2 attempts" in proc.stderr
    assert "deepspeed " not in log_of(sandbox)
    assert not (exchange / "primary_ed25519.pub").exists(), "the published key is removed on failure too"


# --------------------------------------------------------------------------------------------
# SIGTERM: Vertex AI signals each replica's main process (vertex_start.sh) only
# --------------------------------------------------------------------------------------------

STOP_RANKS = ROOT / "recipes" / "stop_ranks.py"

# A rank: LOCAL_RANK in its environment (as DeepSpeed's launcher sets it), saves on SIGTERM and exits 143.
FAKE_RANK = """#!/bin/bash
trap 'echo "rank saved" >> "$FAKE_LOG"; exit 143' TERM
touch "$FAKE_RANK_UP"
while true; do sleep 0.05 & wait $!; done
"""

# Starts the rank; says "rank ready" once the rank and this parent both handle SIGTERM.
START_RANK = """LOCAL_RANK=0 "$FAKE_RANK" &
rank=$!
until [[ -e "$FAKE_RANK_UP" ]]; do sleep 0.01; done
echo "rank ready"
"""

# DeepSpeed's runner: starts the rank, returns its status; records a SIGTERM of its own and passes it on.
FAKE_LAUNCHER = """#!/bin/bash
trap 'echo "launcher got TERM" >> "$FAKE_LOG"; kill -TERM "$rank"' TERM
""" + START_RANK + """status=0; wait "$rank" || status=$?
while kill -0 "$rank" 2>/dev/null; do status=0; wait "$rank" || status=$?; done
echo "launcher: rank exited $status" >> "$FAKE_LOG"
exit "$status"
"""

# A worker's sshd serving one session's rank until it is stopped.
FAKE_SERVING_SSHD = """#!/bin/bash
trap 'echo "sshd got TERM" >> "$FAKE_LOG"; exit 143' TERM
""" + START_RANK + """while true; do sleep 0.05 & wait $!; done
"""

# stop_ranks.py itself, shown only this test's processes (the descendants of vertex_start.sh, its parent): on a
# shared machine another process with LOCAL_RANK in this network namespace is never signalled.
SCOPED_STOP_RANKS = """import importlib.util, os, pathlib, sys
root, view = os.getppid(), pathlib.Path({view!r})
parents = {{}}
for entry in pathlib.Path("/proc").iterdir():
    try:
        stat = (entry / "stat").read_text()
    except (OSError, ValueError):
        continue
    if entry.name.isdigit():
        parents[int(entry.name)] = int(stat[stat.rfind(")") + 2:].split()[1])
def under(pid):
    while pid > 1:
        if pid == root:
            return True
        pid = parents.get(pid, 0)
    return False
view.mkdir(exist_ok=True)
for pid in {{*(p for p in parents if under(p)), os.getpid()}}:
    (view / str(pid)).symlink_to(f"/proc/{{pid}}")
spec = importlib.util.spec_from_file_location("stop_ranks", {script!r})
hook = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hook)
hook.POLL_SECONDS = 0.01  # the test's time, not the hook's behaviour
sys.exit(hook.main(["--proc", str(view), *sys.argv[1:]]))
"""


def stopping_box(box: dict[str, Any], sshd: str | None = None, scoped: bool = True) -> dict[str, str]:
    tmp: Path = box["tmp"]
    for name, body in (("rank", FAKE_RANK), ("bin/deepspeed", FAKE_LAUNCHER), *([("bin/sshd", sshd)] if sshd else [])):
        (tmp / name).write_text(body, encoding="utf-8")
        (tmp / name).chmod(0o755)
    env = {"FAKE_RANK": str(tmp / "rank"), "FAKE_RANK_UP": str(tmp / "rank-up")}
    if scoped:
        wrapper = tmp / "stop_ranks_scoped.py"
        wrapper.write_text(SCOPED_STOP_RANKS.format(view=str(tmp / "proc-view"), script=str(STOP_RANKS)))
        env["VERTEX_STOP_RANKS"] = str(wrapper)
    return env


def start_and_stop(box: dict[str, Any], args: list[str], env: dict[str, str],
                   meanwhile: Callable[[], None] = lambda: None) -> subprocess.CompletedProcess[str]:
    """vertex_start.sh until its rank is up, then `meanwhile`, then SIGTERM to it alone, as Vertex AI sends it."""
    proc = subprocess.Popen([box["bash"], str(START_SH), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**box["env"], **env}, cwd=box["tmp"], start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "rank ready"
        meanwhile()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        with contextlib.suppress(ProcessLookupError):  # whatever a failure left of this test's processes
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_sigterm_reaches_the_ranks_which_save_before_the_launcher_stops(sandbox: dict[str, Any]) -> None:
    """The primary (here a single host): its rank gets the SIGTERM and saves; the launcher ends by itself with the
    rank's status, never signalled (DeepSpeed's runner would give the ranks 30 s, then SIGKILL)."""
    proc = start_and_stop(sandbox, ["train.py"], stopping_box(sandbox))
    assert proc.returncode == 143, proc.stderr
    assert log_of(sandbox).splitlines() == ["rank saved", "launcher: rank exited 143"], proc.stderr
    assert "passing it on to the training ranks" in proc.stderr


def test_sigterm_on_a_worker_stops_sshd_only_after_its_ranks_saved(sandbox: dict[str, Any]) -> None:
    need_ssh_keygen()
    exchange = sandbox["tmp"] / "exchange"
    exchange.mkdir()
    (exchange / "primary_ed25519.pub").write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITESTKEY x\n")
    env = {**stopping_box(sandbox, sshd=FAKE_SERVING_SSHD), "CLUSTER_SPEC": spec("workerpool1", 0),
           "VERTEX_SSH_EXCHANGE_DIR": str(exchange), "VERTEX_SSH_WAIT_SLEEP": "0.01"}
    proc = start_and_stop(sandbox, ["train.py"], env)
    assert proc.returncode == 143, proc.stderr
    assert log_of(sandbox).splitlines() == ["rank saved", "sshd got TERM"]


def test_a_worker_takes_the_restarted_primarys_key_over_a_stale_one(sandbox: dict[str, Any]) -> None:
    """Vertex AI restarts a job whole under the same job id, so the same exchange folder: a key the last attempt's
    primary left there is read first; the worker installs the new primary's key as well, until the primary deletes
    it (every host answered)."""
    need_ssh_keygen()
    exchange = sandbox["tmp"] / "exchange"
    exchange.mkdir()
    published = exchange / "primary_ed25519.pub"
    stale, fresh = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAISTALE x", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFRESH y"
    published.write_text(stale + "\n")
    authorized = sandbox["home"] / ".ssh" / "authorized_keys"

    def primary_republishes() -> None:
        published.write_text(fresh + "\n")
        for _ in range(2000):  # the worker polls every 0.01 s here
            if fresh in authorized.read_text():
                break
            subprocess.run(["sleep", "0.01"], check=False)
        published.unlink()  # every host answered: the primary deletes it

    env = {**stopping_box(sandbox, sshd=FAKE_SERVING_SSHD), "CLUSTER_SPEC": spec("workerpool1", 0),
           "VERTEX_SSH_EXCHANGE_DIR": str(exchange), "VERTEX_SSH_WAIT_SLEEP": "0.01"}
    proc = start_and_stop(sandbox, ["train.py"], env, primary_republishes)
    assert proc.returncode == 143, proc.stderr
    assert authorized.read_text().splitlines() == [stale, fresh]


def test_without_stop_ranks_the_launcher_gets_the_sigterm(sandbox: dict[str, Any]) -> None:
    """No VERTEX_STOP_RANKS (a spec from before the stack shipped it): DeepSpeed's runner gets it at once."""
    proc = start_and_stop(sandbox, ["train.py"], stopping_box(sandbox, scoped=False))
    assert proc.returncode == 143, proc.stderr
    assert log_of(sandbox).splitlines() == ["launcher got TERM", "rank saved", "launcher: rank exited 143"]
