"""The fabric is proven in use (issue 32.5): NCCL's own init lines say which network it chose, and the NCCL test
and the smoke test fail when it is not the fabric plugin's (recipes/nccl_network.py).

Facts (sources in data/gpu_fabric.yaml): NCCL 2.29.7 logs `INFO(NCCL_INIT, "Using network %s")` per communicator
and `NET/Plugin: Loaded net plugin %s (v%d)`; it falls back to its own "IB" and "Socket" when the plugin does not
load; the plugins register FasTrak (TCPXO), GPUDirectTCPX_v7 (TCPX) and gIB (RDMA, by NCCL_NET=gIB).
The log lines below are in NCCL 2.29.7's format (src/debug.cc: "host:pid:tid [dev] NCCL INFO ...").
"""

from __future__ import annotations

import argparse
import os
import types
from pathlib import Path
from typing import Any

import pytest
from conftest import stack_run

from model import fabric
from recipes import nccl_bench, nccl_network
from workloads import fabric as pod_fabric

CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
HOST = "bandwidth-0.bandwidth.nccl-test.svc.cluster.local"

FASTRAK_LOADED = [
    f"{HOST}:57:57 [0] NCCL INFO NET/Plugin: Loaded net plugin FasTrak (v7)",
    f"{HOST}:57:57 [0] NCCL INFO Successfully loaded external network plugin /usr/local/nvidia/lib64/libnccl-net.so",
    f"{HOST}:57:57 [0] NCCL INFO Initialized NET plugin FasTrak",
    f"{HOST}:57:57 [0] NCCL INFO Assigned NET plugin FasTrak to comm",
    f"{HOST}:57:57 [0] NCCL INFO Using network FasTrak",
]
# The installer did not run on this node: no libnccl-net.so, no IB device, NCCL goes on to Socket over eth0.
SOCKET_FALLBACK = [
    f"{HOST}:57:57 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. ",
    f"{HOST}:57:57 [0] NCCL INFO NET/IB : No device found.",
    f"{HOST}:57:57 [0] NCCL INFO NET/Socket : Using [0]eth0:10.20.0.7<0>",
    f"{HOST}:57:57 [0] NCCL INFO Initialized NET plugin Socket",
    f"{HOST}:57:57 [0] NCCL INFO Using network Socket",
]
FALLBACK_MESSAGE = (
    "NCCL fell back to its own Socket transport instead of GPUDirect-TCPXO's network FasTrak: no net plugin loaded "
    "(libnccl-net.so); the fabric's bandwidth is not there. Check the plugin installer DaemonSet on this node, "
    "LD_LIBRARY_PATH (/usr/local/nvidia/lib64) and the NIC annotations")


# --- the facts --------------------------------------------------------------------------------------------------

def test_each_fabrics_network_and_the_log_settings() -> None:
    catalog = fabric.load()
    assert {name: f.nccl_network for name, f in catalog.fabrics.items()} == {
        "tcpx": "GPUDirectTCPX_v7", "tcpxo": "FasTrak", "rdma": "gIB"}
    assert catalog.nccl_log_env == {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
    # RDMA's name is the one NCCL_NET asks for (NCCL compares them case-insensitively).
    assert catalog.fabrics["rdma"].nccl_env["NCCL_NET"].lower() == catalog.fabrics["rdma"].nccl_network.lower()
    assert nccl_network.INTERNAL == ("IB", "Socket")


def test_the_script_and_the_contract_name_the_same_variables() -> None:
    assert (nccl_network.NETWORK_ENV, nccl_network.FABRIC_ENV) == (pod_fabric.NETWORK_ENV, pod_fabric.FABRIC_ENV)
    assert (nccl_network.NETWORK_ENV, nccl_network.FABRIC_ENV) == ("FABRIC_NCCL_NETWORK", "FABRIC_NAME")


# --- the parser on NCCL's lines ----------------------------------------------------------------------------------

def test_the_fabric_in_use_passes() -> None:
    assert nccl_network.verdict(FASTRAK_LOADED, ["FasTrak"], "GPUDirect-TCPXO") == (
        True, "NCCL used GPUDirect-TCPXO's network FasTrak (1 communicator(s); plugin FasTrak (v7))")


def test_a_fallback_to_socket_fails_with_the_reason() -> None:
    assert nccl_network.verdict(SOCKET_FALLBACK, ["FasTrak"], "GPUDirect-TCPXO") == (False, FALLBACK_MESSAGE)


def test_a_plugin_that_loaded_but_did_not_initialize_is_named() -> None:
    # TCPX without its RxDM daemon: the plugin loads, fails to initialize, and NCCL goes on to Socket.
    lines = [f"{HOST}:57:57 [0] NCCL INFO NET/Plugin: Loaded net plugin GPUDirectTCPX_v7 (v7)",
             f"{HOST}:57:57 [0] NCCL INFO Failed to initialize NET plugin GPUDirectTCPX_v7",
             f"{HOST}:57:57 [0] NCCL INFO Using network Socket"]
    ok, line = nccl_network.verdict(lines, ["GPUDirectTCPX_v7"], "GPUDirect-TCPX")
    assert not ok
    assert line.startswith("NCCL fell back to its own Socket transport instead of GPUDirect-TCPX's network "
                           "GPUDirectTCPX_v7: it loaded GPUDirectTCPX_v7 (v7); ")


def test_every_communicator_must_use_the_fabric() -> None:
    # DeepSpeed makes more than one communicator: the second one on IB fails the check too.
    lines = [*FASTRAK_LOADED, f"{HOST}:57:90 [0] NCCL INFO Using network IB"]
    ok, line = nccl_network.verdict(lines, ["FasTrak"], "GPUDirect-TCPXO")
    assert not ok and line.startswith("NCCL fell back to its own IB transport instead of GPUDirect-TCPXO's")


def test_names_compare_as_nccl_compares_them_and_an_unknown_one_is_named() -> None:
    assert nccl_network.verdict([f"{HOST}:1:1 [3] NCCL INFO Using network GIB"], ["gIB"])[0]
    assert nccl_network.verdict([f"{HOST}:1:1 [3] NCCL INFO Using network AWS Libfabric"], ["gIB"]) == (
        False, "NCCL used network AWS Libfabric, not the fabric's network gIB: no net plugin loaded (libnccl-net.so)")


def test_no_using_network_line_is_a_failure_not_a_pass() -> None:
    # NCCL_DEBUG=WARN (TCPXO's profile) prints none of the lines: silence proves nothing.
    assert nccl_network.verdict([f"{HOST}:57:57 [0] NCCL INFO Bootstrap: Using eth0:10.20.0.7<0>"], ["FasTrak"]) == (
        False, "NCCL printed no 'Using network' line, so nothing shows it used the fabric's network FasTrak: it "
               "needs NCCL_DEBUG=INFO with INIT in NCCL_DEBUG_SUBSYS (the pod contract sets both)")


def test_warn_lines_are_picked_out() -> None:
    warn = (f"[2026-11-27 10:00:01] {HOST}:57:60 [2] net.cc:221 NCCL WARN NET/Socket : peer 10.20.0.8<41234> "
            "closed the connection")
    assert nccl_network.warnings([*SOCKET_FALLBACK, warn + "\n"]) == [warn]


# --- a rank's own log file -----------------------------------------------------------------------------------

def test_the_log_path_as_nccl_expands_it() -> None:
    assert nccl_network.log_path("/tmp/nccl-debug.%p.log", 4242, "node-1.c.project.internal") == (
        "/tmp/nccl-debug.4242.log")
    assert nccl_network.log_path("/logs/%h-%p-100%%.txt", 7, "node-1.c.project.internal") == "/logs/node-1-7-100%.txt"


def test_divert_raises_the_level_a_profile_lowered() -> None:
    # TCPXO's release config: NCCL_DEBUG=WARN with NCCL_DEBUG_SUBSYS=INIT,NET,ENV,COLL,GRAPH (CEA README).
    env = {"FABRIC_NCCL_NETWORK": "FasTrak", "NCCL_DEBUG": "WARN", "NCCL_DEBUG_SUBSYS": "INIT,NET,ENV,COLL,GRAPH"}
    path = nccl_network.divert(env)
    assert env == {"FABRIC_NCCL_NETWORK": "FasTrak", "NCCL_DEBUG": "INFO",
                   "NCCL_DEBUG_SUBSYS": "INIT,NET,ENV,COLL,GRAPH", "NCCL_DEBUG_FILE": "/tmp/nccl-debug.%p.log"}
    assert path == f"/tmp/nccl-debug.{os.getpid()}.log"


def test_divert_adds_init_and_keeps_a_users_file() -> None:
    env = {"FABRIC_NCCL_NETWORK": "gIB", "NCCL_DEBUG_SUBSYS": "^INIT", "NCCL_DEBUG_FILE": "/scratch/nccl.log"}
    assert nccl_network.divert(env) == "/scratch/nccl.log"
    assert (env["NCCL_DEBUG"], env["NCCL_DEBUG_SUBSYS"]) == ("INFO", "INIT,NET")


def test_off_a_fabric_nothing_is_diverted() -> None:
    env = {"NCCL_DEBUG": "WARN"}
    assert nccl_network.divert(env) is None and env == {"NCCL_DEBUG": "WARN"}


class _Tensor:
    """The one-element tensor a verdict's all_reduce carries (test_fabric_gate.py uses it too)."""

    def __init__(self, value: float = 0.0) -> None:
        self.value = value

    def fill_(self, value: float) -> _Tensor:
        self.value = value
        return self

    def item(self) -> float:
        return self.value


class _Dist:
    """One rank's view of torch.distributed: NCCL writes its init lines at the first collective."""

    def __init__(self, log: Path, lines: list[str], world: int = 1) -> None:
        self.log, self.lines, self.world, self.calls = log, lines, world, 0

    def all_reduce(self, tensor: _Tensor) -> None:
        if self.calls == 0:
            self.log.write_text("\n".join(self.lines) + "\n", encoding="utf-8")
        self.calls += 1
        tensor.value *= self.world  # every rank alike

    def get_world_size(self) -> int:
        return self.world

    def get_rank(self) -> int:
        return 0

    def destroy_process_group(self) -> None:
        self.destroyed = True


_TORCH = types.SimpleNamespace(zeros=lambda n, device: _Tensor(0.0))


@pytest.mark.parametrize(("lines", "failed"), [(FASTRAK_LOADED, 0), (SOCKET_FALLBACK, 2)])
def test_check_reads_the_file_after_the_first_collective_and_agrees(tmp_path: Path, lines: list[str],
                                                                     failed: int) -> None:
    log = tmp_path / "nccl-debug.1.log"
    dist = _Dist(log, lines, world=2)
    found, ok, _ = nccl_network.check(_TORCH, dist, str(log), ["FasTrak"], "GPUDirect-TCPXO")
    assert (found, ok, dist.calls) == (failed, failed == 0, 2)


def test_the_nccl_test_fails_on_a_fallback_before_measuring(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "nccl-debug.1.log"
    dist = _Dist(log, SOCKET_FALLBACK)
    monkeypatch.setenv("FABRIC_NAME", "GPUDirect-TCPXO")
    monkeypatch.setattr(nccl_bench, "_time", lambda *a: pytest.fail("no benchmark on TCP"))
    args = argparse.Namespace(benchmarks=["all_gather"], min_bytes=2**20, max_bytes=2**21, iters=1, warmup=0)
    code = nccl_bench._run(args, _TORCH, dist, nccl_network, ["FasTrak"], str(log), "NCCL 2.29.7")
    assert code == nccl_bench.EXIT_NOT_ON_FABRIC == 4 and dist.destroyed
    assert capsys.readouterr().err.splitlines() == [
        f"# nccl_bench: rank 0: {FALLBACK_MESSAGE}",
        "# nccl_bench: 1 of 1 rank(s) did not use GPUDirect-TCPXO's network: the bandwidth would be measured on TCP "
        "over eth0. Failing the test."]


def test_the_nccl_test_says_which_network_it_measured(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "nccl-debug.1.log"
    monkeypatch.setenv("FABRIC_NAME", "GPUDirect-TCPXO")
    monkeypatch.setattr(nccl_bench, "_time", lambda *a: 0.001)
    args = argparse.Namespace(benchmarks=["all_gather"], min_bytes=2**20, max_bytes=2**20, iters=1, warmup=0)
    assert nccl_bench._run(args, _TORCH, _Dist(log, FASTRAK_LOADED), nccl_network, ["FasTrak"], str(log),
                           "NCCL 2.29.7") == 0
    assert capsys.readouterr().out.splitlines()[:2] == [
        "# nccl_bench: NCCL used GPUDirect-TCPXO's network FasTrak (1 communicator(s); plugin FasTrak (v7))",
        "# nccl_bench: 1 ranks on 1 node(s), NCCL 2.29.7"]


# --- what the jobs carry ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def h100() -> Any:
    return stack_run("h100")


def test_the_nccl_test_job_sets_the_log_level_and_the_network(h100: Any) -> None:
    job = h100.one("kubernetes:batch/v1:Job").inputs
    (app,) = job["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in app["env"]}
    assert {k: env[k] for k in ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "FABRIC_NCCL_NETWORK", "FABRIC_NAME")} == {
        "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "FABRIC_NCCL_NETWORK": "FasTrak",
        "FABRIC_NAME": "GPUDirect-TCPXO"}
    data = h100.one(CONFIG_MAP, "bandwidth-config").inputs["data"]
    assert data["nccl_network.py"] == pod_fabric.CHECK_SOURCE.read_text(encoding="utf-8")
    script = data["nccl_env.sh"]
    # TCPXO's profile sets NCCL_DEBUG=WARN: the INFO level is exported again after it.
    profile = script.index(". /usr/local/nvidia/lib64/nccl-env-profile.sh")
    assert profile < script.rindex("export NCCL_DEBUG=INFO") < script.index('exec "$@"')
    assert profile < script.rindex("export NCCL_DEBUG_SUBSYS=INIT,NET")


def test_the_smoke_mpijob_ships_the_reader_beside_its_script(h100: Any) -> None:
    maps = [c.inputs["data"] for c in h100.by_type(CONFIG_MAP) if "smoke_train.py" in c.inputs.get("data", {})]
    assert maps and all(d["nccl_network.py"] == pod_fabric.CHECK_SOURCE.read_text(encoding="utf-8") for d in maps)
    assert all("export FABRIC_NCCL_NETWORK=FasTrak" in d["nccl_env.sh"] for d in maps)


@pytest.mark.parametrize(("name", "network"), [("tcpx", "GPUDirectTCPX_v7"), ("rdma", "gIB")])
def test_every_fabrics_ranks_get_the_level_and_their_network(name: str, network: str) -> None:
    f = fabric.load().fabrics[name]
    script = pod_fabric.env_script(f)
    assert f"export FABRIC_NCCL_NETWORK={network}" in script
    if f.nccl_profile:  # gIB's set_nccl_env.sh may set its own level: INFO is exported again after it
        assert script.rindex(f". {f.nccl_profile}") < script.rindex("export NCCL_DEBUG=INFO")
    else:
        assert "export NCCL_DEBUG=INFO" in script
    assert pod_fabric.contract(f).env_dict()["FABRIC_NCCL_NETWORK"] == network
