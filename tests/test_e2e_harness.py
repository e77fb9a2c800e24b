"""The pure parts of the e2e harness (e2e/run.py): what it reads from the image and renders as the chart,
the operator and Vertex AI would; and the MPIJob launcher's environment for remote ranks that the e2e found.
The launches themselves run in `make e2e` (root, network namespaces), not here."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
from conftest import model

from workloads import mpijob
from workloads.placement import placement

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def e2e() -> ModuleType:
    sys.path.insert(0, str(ROOT / "e2e"))
    spec = importlib.util.spec_from_file_location("e2e_run", ROOT / "e2e" / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_image_sshd_drop_in_is_read_from_the_dockerfile(e2e: ModuleType) -> None:
    lines = e2e.image_sshd_drop_in().splitlines()
    assert "Port 2222" in lines and "UsePAM no" in lines and "PermitUserEnvironment yes" in lines
    assert "PidFile /tmp/sshd.pid" in lines
    assert not any("'" in line for line in lines)


def test_hostfiles_as_the_chart_and_the_operator_write_them(e2e: ModuleType) -> None:
    assert e2e.chart_hostfile(2, 1) == ("e2e-deepspeed-worker-0.e2e-deepspeed-worker-headless slots=1\n"
                                        "e2e-deepspeed-worker-1.e2e-deepspeed-worker-headless slots=1\n")
    assert e2e.mpijob_hostfile(1, 4) == "ds-e2e-worker-0.ds-e2e.e2e.svc slots=4\n"


def test_every_name_a_launch_path_uses_resolves_to_a_host(e2e: ModuleType) -> None:
    names = {n for host, aliases in e2e.host_names(2) for n in (host, *aliases)}
    assert {line.split()[0] for line in e2e.chart_hostfile(2, 1).splitlines()} <= names
    assert {line.split()[0] for line in e2e.mpijob_hostfile(2, 1).splitlines()} <= names
    spec = json.loads(e2e.vertex_cluster_spec("workerpool1", 1, 2))
    hosts = [a.split(":")[0] for pool in spec["cluster"].values() for a in pool]
    assert hosts == ["workerpool0-0", "workerpool1-0", "workerpool1-1"] and set(hosts) <= names
    assert spec["task"] == {"type": "workerpool1", "index": 1, "trial": ""}


def test_check_run_and_losses(e2e: ModuleType) -> None:
    good = ("[smoke] rank 0 on w-0: 10.0 samples/s, peak memory 0.0 MiB, loss 1.0\n"
            "[smoke] rank 1 on w-1: 12.5 samples/s, peak memory 0.0 MiB, loss 1.0\n"
            "[smoke] step 1 loss 1.250000\n[smoke] step 2 loss 0.750000\n"
            'SMOKE_TEST_RESULT {"ok": true, "world_size": 2, "hosts": ["w-0", "w-1"]}\n')
    assert e2e.check_run(good, 2, ["w-1", "w-0"]) == []
    assert e2e.losses(good) == {1: 1.25, 2: 0.75}
    assert e2e.check_run(good, 3, ["w-0", "w-1"]) == ["world size 2, expected 3", "rank 2 did not report"]
    assert e2e.check_run("no result", 1, ["w-0"]) == ["no SMOKE_TEST_RESULT line"]


def test_mpijob_launcher_hands_path_to_the_ranks() -> None:
    # Found by the e2e: sshd sets PATH itself, whatever the launcher's ssh sends (SendEnv), so ranks started
    # over pdsh ran without the image's venv on PATH (no ninja for DeepSpeed's JIT-built ops). DeepSpeed's
    # runner exports ~/.deepspeed_env's lines to every rank: the launcher writes PATH there before launching.
    m = model("dev", {"workloads": {"ds-t4": copy.deepcopy({"kind": "mpijob", "pool": "t4", "workers": 2,
                                                            "deepspeed": {"precision": "fp16"},
                                                            "storage": {"storageClass": "standard-rwx"}})},
                      "mpiOperator.install": True})
    script = mpijob.nvidia_launcher_script(m.workloads["ds-t4"])
    lines = script.splitlines()
    env_line = next(i for i, line in enumerate(lines) if ".deepspeed_env" in line)
    assert lines[env_line] == ('printf "PATH=%s\\nLD_LIBRARY_PATH=%s\\n" "$PATH" "${LD_LIBRARY_PATH:-}" '
                               '>> "$HOME/.deepspeed_env"')
    assert env_line < next(i for i, line in enumerate(lines) if line.startswith("exec deepspeed"))
    assert placement(m, m.workloads["ds-t4"]) is not None
