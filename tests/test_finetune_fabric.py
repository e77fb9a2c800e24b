"""finetune.py refuses to train when NCCL's network line shows the GPU fabric's plugin was not used
(recipes/finetune_fabric.py), with a final status that names the pools, under a stub of torch.distributed
(two ranks) and NCCL's own log lines."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import PROJECT_DIR, config_model, load_file, model

from model.problems import lines
from workloads import finetune
from workloads.mpijob import nvidia

SCRIPTS = PROJECT_DIR / "recipes"
ENV = {"FABRIC_NCCL_NETWORK": "GPUDirectTCPX_v7", "FABRIC_NAME": "GPUDirect-TCPX",
       "FINETUNE_POOLS": "h100-reserved,h100-dws"}
# NCCL v2.29's INIT lines (src/init.cc "Using network", src/plugin/net.cc), as a rank's NCCL_DEBUG_FILE holds them.
ON_FABRIC = ["host:1:1 [0] NCCL INFO NET/Plugin: Loaded net plugin GPUDirectTCPX_v7 (v7)\n",
             "host:1:1 [0] NCCL INFO Using network GPUDirectTCPX_v7\n"]
ON_SOCKET = ["host:1:1 [0] NCCL WARN NET/Plugin: Could not find: libnccl-net.so\n",
             "host:1:1 [0] NCCL INFO Using network Socket\n"]


def _modules() -> tuple[Any, Any]:
    sys.path.insert(0, str(SCRIPTS))
    try:
        return load_file(SCRIPTS / "finetune_fabric.py", "finetune_fabric_under_test"), \
            load_file(SCRIPTS / "nccl_network.py", "nccl_network_under_test")
    finally:
        sys.path.remove(str(SCRIPTS))


class Probe:
    def __init__(self) -> None:
        self.value = 0.0

    def fill_(self, v: float) -> None:
        self.value = v

    def item(self) -> float:
        return self.value


class Torch:
    @staticmethod
    def zeros(n: int, device: str) -> Probe:
        assert (n, device) == (1, "cuda")
        return Probe()


class Dist:
    """Rank 0 of two; the other rank's verdict is `other_failed` (the sum over the group, as all_reduce makes it)."""

    def __init__(self, backend: str = "nccl", other_failed: bool = False):
        self.backend, self.other_failed, self.reduces = backend, other_failed, 0

    def is_initialized(self) -> bool:
        return True

    def get_backend(self) -> str:
        return self.backend

    def get_rank(self) -> int:
        return 0

    def get_world_size(self) -> int:
        return 2

    def all_reduce(self, probe: Probe) -> None:
        self.reduces += 1
        probe.value += float(self.other_failed) if self.reduces == 2 else 0.0


def _refusal(tmp_path: Path, lines: list[str], env: dict[str, str] | None = None, **dist: Any) -> tuple[Any, list]:
    fabric, net = _modules()
    log = tmp_path / "nccl-debug.1.log"
    log.write_text("".join(lines), encoding="utf-8")
    said: list[str] = []
    out = fabric.fabric_refusal(net, str(log), dict(ENV if env is None else env), Torch(), Dist(**dist), said.append)
    return out, said


def test_nccl_on_the_fabric_trains(tmp_path: Path) -> None:
    refused, said = _refusal(tmp_path, ON_FABRIC)
    assert refused is None
    assert said == ["rank 0: NCCL used GPUDirect-TCPX's network GPUDirectTCPX_v7 (1 communicator(s); plugin "
                    "GPUDirectTCPX_v7 (v7))"]


def test_nccl_on_its_socket_transport_is_refused_naming_the_pools(tmp_path: Path) -> None:
    refused, said = _refusal(tmp_path, ON_SOCKET)
    assert refused == (
        "1 of 2 rank(s) did not use GPUDirect-TCPX's network (GPUDirectTCPX_v7) on pool h100-reserved or its "
        "fallbackPool h100-dws (`kubectl describe workload` names the flavor it ran on): NCCL would run this training "
        "over its own transport at a fraction of the fabric's bandwidth. Not training (final: no restart fixes the "
        "nodes). Check the fabric's plugin installer DaemonSet on that pool's nodes (kubectl -n kube-system get ds), "
        "then re-create the job")
    assert said[0].startswith("rank 0: NCCL fell back to its own Socket transport instead of GPUDirect-TCPX's")
    assert said[1] == "host:1:1 [0] NCCL WARN NET/Plugin: Could not find: libnccl-net.so"  # into the pod's log


def test_another_ranks_failure_stops_this_one_too(tmp_path: Path) -> None:
    refused, _ = _refusal(tmp_path, ON_FABRIC, other_failed=True)
    assert refused is not None and refused.startswith("1 of 2 rank(s) did not use")


@pytest.mark.parametrize(("env", "backend"), [({k: v for k, v in ENV.items() if k != "FABRIC_NCCL_NETWORK"}, "nccl"),
                                              (ENV, "gloo"), (ENV, "hccl")])
def test_nothing_to_check_off_a_fabric_or_off_nccl(tmp_path: Path, env: dict[str, str], backend: str) -> None:
    assert _refusal(tmp_path, ON_SOCKET, env=env, backend=backend) == (None, [])


def test_no_network_module_no_check() -> None:
    fabric, _ = _modules()
    assert fabric.fabric_refusal(None, None, dict(ENV), Torch(), Dist()) is None


def test_the_refusal_is_final_at_the_launcher() -> None:
    """finetune.py exits EXIT_USAGE on a refusal, the one status the NVIDIA launcher does not retry (the check is
    finetune_train.start_ranks', before the Trainer is made)."""
    source = (SCRIPTS / "finetune_train.py").read_text(encoding="utf-8")
    gate = source.index("refused = fabric_refusal(")
    assert source.index("return EXIT_USAGE", gate) < source.index("trainer.train(", gate)  # before any step
    from recipes.contract import EXIT_USAGE

    assert EXIT_USAGE == 2 and EXIT_USAGE in nvidia.FINAL_EXIT_STATUSES


def test_the_recipe_knows_its_pools() -> None:
    w = model("finetune").workloads["tune"]
    assert finetune.env(w, has_token=False)["FINETUNE_POOLS"] == "l4x4"
    assert "finetune_fabric.py" in finetune.files(w)  # shipped beside finetune.py
    from test_reservation_end import _finetune_on_a_reservation

    with_fallback = config_model(_finetune_on_a_reservation("2030-01-01T00:00:00Z")).workloads["tune"]
    assert finetune.env(with_fallback, has_token=False)["FINETUNE_POOLS"] == "l4x4,l4x4-spot"


# --- the NCCL gate on every pool a run can land on (checks/fabric.py) ---------------------------------------------

def _h100_with_fallback(**fallback: Any) -> dict[str, Any]:
    """The h100 stack (its NCCL test `bandwidth` gates pool h100) with a second A3 Mega pool the smoke run falls
    back to."""
    from conftest import changed

    config = changed("h100", {"workloads.smoke.fallbackPool": "h100-more", "kueue.install": True})
    pools = config["deepspeed-stack:nodePools"]
    pools.append({**pools[0], "name": "h100-more", **fallback})
    return config


def _said(config: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The rule's problems among all the stack's, and the fabric warnings of a stack that loads."""
    from conftest import config_problems

    import checks

    found = [p for p in config_problems(config) if "NCCL test" in p]
    return found, ([] if found else lines(checks.fabric.warnings(config_model(config))))


def test_an_untested_fallback_of_a_tested_pool_is_refused() -> None:
    problems, warned = _said(_h100_with_fallback(spot=True))
    assert problems == ["workloads.smoke.fallbackPool: pool h100 is proven by NCCL test bandwidth before the run "
                        "starts, but its fallback h100-more by none, and the run may move there; add a test of it "
                        "(`ncclTests.h100-more: {pools: [h100-more], nodes: 2}`), which the run then waits for too"]
    assert warned == []


def test_a_tested_fallback_passes() -> None:
    config = _h100_with_fallback(spot=True)
    config["deepspeed-stack:ncclTests"]["more"] = {**config["deepspeed-stack:ncclTests"]["bandwidth"],
                                                   "pools": ["h100-more"]}
    assert _said(config) == ([], [])


DWS = {"flexStart": True, "queuedProvisioning": True, "maxRunDuration": "86400s", "minNodes": 0, "zones": None}


def test_a_queued_fallback_is_proven_by_the_run_itself() -> None:
    """No NCCL test Job can reach a queued-provisioning pool's nodes: smoke_train.py's own check is the gate."""
    config = _h100_with_fallback(**DWS)
    del config["deepspeed-stack:nodePools"][-1]["zones"]
    assert _said(config) == ([], [])
    launch = config["deepspeed-stack:workloads"]["smoke"]["launch"]
    launch["command"], launch["args"] = "python3 /opt/train.py", []  # a script that checks nothing
    problems, warned = _said(config)
    assert problems == [] and len(warned) == 1
    assert warned == ["workloads.smoke.fallbackPool: h100-more gets nodes only for this queued job, so no NCCL test "
                      "can prove its fabric first, and your script does not check NCCL's network line (finetune.py "
                      "and smoke_train.py do, with nccl_network.py shipped beside it): a run moved there could train "
                      "at a fraction of the fabric's bandwidth unnoticed"]
