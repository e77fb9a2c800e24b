"""Your code without forking (issue 18 item 2): `launch.script` from the bucket, the image or recipes/user/,
`launch.command` that replaces only the DeepSpeed command line, and a user's script that never breaks the project's
own tests or lint."""

from __future__ import annotations

import copy
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import PROJECT_DIR, model, problems
from test_mpijob import NVIDIA_WORKLOAD, render

from workloads import mpijob
from workloads.mpijob import script_source
from workloads.placement import placement

# The dev stack with an NVIDIA MPIJob `smoke` (no GPU fabric: the rank command is the script), and the stack's bucket
# (named, so gs:// paths can be checked) mounted at /gcs.
BASE = {"workloads": {"smoke": dict(NVIDIA_WORKLOAD)}, "mpiOperator.install": True}
BUCKET = {"storage": {"enabled": True, "bucketName": "team-bucket"}, "workloads.smoke.gcsFuse.enabled": True}
SCRIPT_KEY = "workloads.smoke.launch.script"


def _changes(changes: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy({**BASE, **changes})  # set_path writes into the nested values


def _problems(changes: dict[str, Any]) -> list[str]:
    return problems("dev", _changes(changes))


def _launcher(changes: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """The rendered launcher script and the job's ConfigMap files."""
    m = model("dev", _changes(changes))
    job = render(m, "smoke", image="registry/deepspeed@sha256:" + "0" * 64)
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["args"][0]
    w = m.workloads["smoke"]
    return launcher, mpijob.config_map_data(w, placement(m, w), False)


def _rank(launcher: str) -> list[str]:
    return shlex.split(launcher.splitlines()[-1].split('"$MASTER_ADDR" ', 1)[1])


def test_launch_command_replaces_only_the_deepspeed_line() -> None:
    command = 'deepspeed --hostfile "$HOSTSFILE" --master_addr "$MASTER_ADDR" /gcs/code/train.py --lr 1e-4'
    launcher, files = _launcher({"workloads.smoke.launch.command": command})
    lines = launcher.splitlines()
    assert lines[-1] == command
    # The set-up stays: MASTER_ADDR, the wait for every worker's sshd, ~/.deepspeed_env, the ConfigMap's folder.
    assert lines[0] == "set -eo pipefail"
    assert 'HOSTSFILE="$OMPI_MCA_orte_default_hostfile"' in lines
    assert any(line.startswith('export MASTER_ADDR="$(head -n 1 "$HOSTSFILE"') for line in lines)
    assert any(line.startswith("for host in $(sed") and "until ssh" in line for line in lines)
    assert 'printf "PATH=%s\\nLD_LIBRARY_PATH=%s\\n" "$PATH" "${LD_LIBRARY_PATH:-}" >> "$HOME/.deepspeed_env"' in lines
    assert lines[-2] == "cd /etc/deepspeed"
    assert not [line for line in lines if "--force_multi" in line or "run_ranks" in line]  # the stack's line is gone
    assert "smoke_train.py" not in files  # the command runs what it names: no script shipped


def test_a_script_in_the_bucket_runs_from_the_mount() -> None:
    launcher, files = _launcher({**BUCKET, "workloads.smoke.launch.script": "gs://team-bucket/code/train.py"})
    assert _rank(launcher)[0] == "/gcs/code/train.py"
    assert _rank(launcher)[1:3] == ["--deepspeed_config", "/etc/deepspeed/ds_config.json"]
    # Only the workers' preStop hook and the launcher's maintenance watch (with its options, contract.py) are
    # shipped: the training script runs from the bucket.
    assert sorted(k for k in files if k.endswith(".py")) == ["contract.py", "kube_api.py", "maintenance_watch.py",
                                                                 "recipes.py", "stop_ranks.py"]
    assert _problems({**BUCKET, "workloads.smoke.launch.script": "gs://team-bucket/code/train.py"}) == []
    assert _problems({**BUCKET, "workloads.smoke.launch.script": "/gcs/code/train.py"}) == []


def test_a_path_in_the_image_runs_where_it_is() -> None:
    launcher, files = _launcher({"workloads.smoke.launch.script": "/opt/app/train.py"})
    assert _rank(launcher)[0] == "/opt/app/train.py" and "smoke_train.py" not in files
    assert _problems({"workloads.smoke.launch.script": "/opt/app/train.py"}) == []


@pytest.mark.parametrize(("changes", "expected"), [
    ({**BUCKET, "workloads.smoke.launch.script": "gs://other-bucket/train.py"},
     f"{SCRIPT_KEY}: 'other-bucket' is not the stack's bucket ('team-bucket'); the pods mount only that one "
     "(storage.existingBucket names a bucket of yours)"),
    ({"storage": {"enabled": True}, "workloads.smoke.gcsFuse.enabled": True,
      "workloads.smoke.launch.script": "gs://whatever/train.py"},
     f"{SCRIPT_KEY}: the stack's bucket is auto-named, so 'whatever' cannot be told to be it; write the path under "
     "the bucket's mount instead (/gcs/train.py)"),
    ({"storage": {"enabled": True, "bucketName": "team-bucket"}, "workloads.smoke.launch.script":
      "gs://team-bucket/train.py"},
     f"{SCRIPT_KEY}: a script in the bucket is read through the pods' GCS FUSE mount; set "
     "workloads.smoke.gcsFuse.enabled: true"),
    ({"workloads.smoke.launch.script": "/gcs/train.py"},
     f"{SCRIPT_KEY}: /gcs/train.py is under the bucket's mount path /gcs, but the pods do not mount the bucket; set "
     "workloads.smoke.gcsFuse.enabled: true"),
    ({"workloads.smoke.launch.script": "user/absent.py"},
     f"{SCRIPT_KEY}: no file 'absent.py' in recipes/user (there: "),
    ({"workloads.smoke.launch.script": "code/train.py"},
     f"{SCRIPT_KEY}: no file 'code/train.py' in recipes (there: "),
])
def test_a_script_the_ranks_cannot_reach_is_refused(changes: dict[str, Any], expected: str) -> None:
    (found,) = [p for p in _problems(changes) if p.startswith(SCRIPT_KEY)]
    assert found.startswith(expected)


def test_without_storage_a_bucket_script_names_the_missing_bucket() -> None:
    found = _problems({"workloads.smoke.launch.script": "gs://team-bucket/train.py"})
    assert f"{SCRIPT_KEY}: 'gs://team-bucket/train.py' is in a bucket, but the stack has none; set storage.enabled " \
           "(with storage.existingBucket for a bucket of yours)" in found


def test_a_user_script_ships_under_its_own_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "train.py").write_text("print('mine')\n")
    monkeypatch.setattr(script_source, "SCRIPTS_DIR", tmp_path)
    launcher, files = _launcher({"workloads.smoke.launch.script": "user/train.py"})
    assert _rank(launcher)[0] == "/etc/deepspeed/user-train.py"
    assert files["user-train.py"] == "print('mine')\n"
    assert _problems({"workloads.smoke.launch.script": "user/train.py"}) == []


@pytest.mark.parametrize(("name", "linted"), [("recipes/user/mine.py", False),
                                              ("recipes/mine.py", True)])
def test_user_scripts_are_not_linted(name: str, linted: bool) -> None:
    """pyproject.toml: ruff leaves recipes/user/ alone; the project's own scripts stay linted. The file is
    given on stdin under that name, so nothing is written into the checkout."""
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--force-exclude",
                             "--stdin-filename", name, "-"], input="import os\n", cwd=PROJECT_DIR,
                            capture_output=True, text=True, check=False)
    assert (result.returncode != 0) is linted, result.stdout
    assert (PROJECT_DIR / "recipes" / "user" / "README.md").is_file()  # the folder, saying what it is
