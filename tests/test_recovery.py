"""Preemption recovery: the planner's checkpoint estimate, the restart and grace-period settings the workloads
carry, and the preview's section."""

from __future__ import annotations

import copy

import pytest
from conftest import model

from planner import recovery
from planner.preview_hooks import preemption_recovery
from preview.engine import RunResult
from workloads import deepspeed_release, mpijob
from workloads.placement import placement


def test_checkpoint_size_save_time_and_interval() -> None:
    # 8e9 parameters in bf16: 2 bytes of weights + 12 of fp32 master weights and Adam moments = 112 GB;
    # two nodes writing 0.1 GB/s each to NFS: 560 s, far beyond a Spot notice; Young: sqrt(2 x 560 x 6 h).
    p = recovery.plan(8e9, "bf16", nodes=2, storage="nfs", spot=True)
    assert p.checkpoint_gb == pytest.approx(112.0)
    assert p.save_seconds == pytest.approx(560.0)
    assert p.fits_spot_notice is False
    assert p.interval_minutes == pytest.approx(81.97, abs=0.01)


def test_small_checkpoint_fits_the_notice_and_the_interval_has_a_floor() -> None:
    # 33.6M parameters in fp32 (4 + 12 bytes) = 0.54 GB at 0.4 GB/s on one node: 1.3 s.
    p = recovery.plan(33.6e6, "fp32", nodes=1, storage="gcsfuse", spot=True)
    assert p.checkpoint_gb == pytest.approx(0.5376)
    assert p.save_seconds == pytest.approx(1.344)
    assert p.fits_spot_notice is True
    assert p.interval_minutes == pytest.approx(4.02, abs=0.01)  # sqrt(2 x 1.344 s x 21600 s) / 60
    tiny = recovery.plan(1e3, "bf16", nodes=1, storage="gcsfuse", spot=False)
    assert tiny.interval_minutes == recovery.MIN_INTERVAL_MINUTES


NVIDIA_MPIJOB = {"kind": "mpijob", "pool": "t4", "workers": 2, "deepspeed": {"precision": "fp16"},
                 "storage": {"storageClass": "standard-rwx"}}


def test_mpijob_restarts_with_a_backoff_limit_and_grace_period() -> None:
    m = model("dev", {"workloads": {"ds-t4": copy.deepcopy(NVIDIA_MPIJOB)}, "mpiOperator.install": True})
    w = m.workloads["ds-t4"]
    inputs = mpijob.MpiJobInputs(workload=w, placement=placement(m, w), image="img", config_map="cm")
    spec = mpijob.render_spec(inputs)
    assert spec["runPolicy"]["backoffLimit"] == 6
    assert spec["mpiReplicaSpecs"]["Launcher"]["restartPolicy"] == "OnFailure"
    for role in ("Launcher", "Worker"):
        assert spec["mpiReplicaSpecs"][role]["template"]["spec"]["terminationGracePeriodSeconds"] == 120


def test_chart_pods_get_the_grace_period() -> None:
    m = model("dev")
    w = m.workloads["smoke"]
    values = deepspeed_release.chart_values(w, placement(m, w), {"registry": "r", "repository": "x", "tag": "t"},
                                            "smoke-source")
    # The chart's schema types it as a string (values.schema.json, client/worker.terminationGracePeriodSeconds).
    assert values["client"]["terminationGracePeriodSeconds"] == "120"
    assert values["worker"]["terminationGracePeriodSeconds"] == "120"


def test_preview_section_for_prod(prod: RunResult) -> None:
    [(title, body)] = preemption_recovery(prod)
    assert title == "Preemption recovery"
    # prod's zero3-smoke: the smoke MLP (33.6M parameters, bf16: 14 bytes each = 0.47 GB) on the NFS claim.
    row = next(line for line in body.splitlines() if line.startswith("| zero3-smoke "))
    assert row.split(" | ")[1:3] == ["0.5 GB", "2 s (nfs)"]
    assert row.rstrip(" |").endswith("120 s")


def test_preview_section_absent_without_a_stack_file() -> None:
    assert preemption_recovery(RunResult(stack="no-such-stack", resources=[], outputs={})) == []
