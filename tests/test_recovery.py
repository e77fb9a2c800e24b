"""Preemption recovery: the planner's checkpoint estimate, the restart and grace-period settings the workloads
carry, and the preview's section."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from conftest import changed, model

from planner import recovery
from preview.__main__ import main
from preview.engine import RunResult
from preview.sections.recovery import section as preemption_recovery
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


def test_a_spot_notice_gives_the_pods_15_s() -> None:
    # GKE's "Spot VMs" page: the VM stops 30 s after the notice; non-system pods get the first 15 s of it.
    # 0.5e9 parameters in fp32 (16 bytes) = 8 GB at 0.4 GB/s on one node: 20 s, beyond those 15 s.
    assert (recovery.SPOT_NOTICE_SECONDS, recovery.SPOT_USABLE_SECONDS) == (30, 15)
    p = recovery.plan(0.5e9, "fp32", nodes=1, storage="gcsfuse", spot=True)
    assert p.save_seconds == pytest.approx(20.0)
    assert p.fits_spot_notice is False
    assert recovery.plan(0.375e9, "fp32", nodes=1, storage="gcsfuse", spot=True).fits_spot_notice  # 15 s


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


def _row(body: str, workload: str) -> list[str]:
    line = next(line for line in body.splitlines() if line.startswith(f"| {workload} "))
    return [cell.strip() for cell in line.strip("|").split("|")]


def _section(plans: dict) -> str:
    [(title, body)] = preemption_recovery(RunResult(stack="prod", resources=[], outputs={"recovery": plans}))
    assert title == "Preemption recovery"
    return body


def test_preview_section_for_prod(prod: RunResult) -> None:
    [(title, body)] = preemption_recovery(prod)
    assert title == "Preemption recovery"
    assert "| workload | checkpoint | save (all nodes) | grace period | fits Spot notice | save every (minutes) |" \
        in body
    # prod's zero3-smoke: the smoke MLP (33.6M parameters, bf16: 14 bytes each = 0.47 GB) on the NFS claim, two
    # nodes at 0.1 GB/s: 2.35 s; on-demand (a week between interruptions): sqrt(2 x 2.352 x 604800) s = 28.1 min.
    assert _row(body, "zero3-smoke") == ["zero3-smoke", "0.5 GB", "2 s (nfs)", "120 s", "n/a (on-demand)", "28 min"]
    assert "**no**" not in body


# A bucket mounted through Cloud Storage FUSE on a Spot pool: prod's MLP at 0.4 GB/s per node.
SPOT_GCSFUSE = {"nodePools[0].spot": True, "storage.enabled": True, "workloads.zero3-smoke.gcsFuse.enabled": True}


def test_spot_pool_and_gcsfuse_bucket() -> None:
    plans = recovery.stack_recovery(model("prod", SPOT_GCSFUSE))
    r = plans["zero3-smoke"]
    assert (r["storage"], r["spot"], r["fitsSpotNotice"], r["fitsGracePeriod"]) == ("gcsfuse", True, True, True)
    assert r["saveSeconds"] == pytest.approx(0.588)  # 0.4704 GB / (0.4 GB/s x 2 nodes)
    assert r["saveEveryMinutes"] == pytest.approx(2.656, abs=0.001)  # sqrt(2 x 0.588 s x 6 h) / 60
    assert _row(_section(plans), "zero3-smoke") == ["zero3-smoke", "0.5 GB", "1 s (gcsfuse)", "120 s", "yes", "3 min"]


# A 1.8B model (25.2 GB in bf16) on two g2-standard-16 to NFS saves in 126 s: once over the fixed 120 s the pods got
# on SIGTERM (issue 38: a 70B run's 706 s save had 120 s).
LONG_SAVE = {"nodePools[0].machineType": "g2-standard-16", "workloads.zero3-smoke.model.parameters": 1.8}


def test_the_grace_period_is_what_the_save_needs() -> None:
    # 60 s for the step in flight + 1.25 x the save; never under 120 s (Kubernetes' default is 30 s).
    assert [recovery.grace_seconds(s) for s in (None, 0.5, 47.9, 48.0, 126.0, 706.0)] == [120, 120, 120, 120, 218,
                                                                                         943]
    plans = recovery.stack_recovery(model("prod", LONG_SAVE))
    r = plans["zero3-smoke"]
    assert r["saveSeconds"] == pytest.approx(126.0)  # 1.8e9 x 14 bytes / (0.1 GB/s x 2 nodes)
    assert (r["graceSeconds"], r["fitsGracePeriod"]) == (218, True)
    assert _row(_section(plans), "zero3-smoke") == ["zero3-smoke", "25.2 GB", "126 s (nfs)", "218 s",
                                                    "n/a (on-demand)", "206 min"]


def test_every_pod_of_a_long_saving_job_gets_its_grace_period() -> None:
    # The chart's client and workers, and the hook's wait (the grace less its 5 s margin).
    m = model("prod", LONG_SAVE)
    w = m.workloads["zero3-smoke"]
    values = deepspeed_release.chart_values(w, placement(m, w), {"registry": "r", "repository": "x", "tag": "t"},
                                            "smoke-source")
    assert values["client"]["terminationGracePeriodSeconds"] == values["worker"]["terminationGracePeriodSeconds"] \
        == "218"
    assert values["worker"]["lifecycleHooks"]["preStop"]["exec"]["command"][-1] == "213"
    # An MPIJob's launcher and workers, and the launcher's stop request to the workers.
    # 1B parameters in fp16 under ZeRO-3 to the NFS claim: 14 GB at 0.1 GB/s on each of 2 nodes, 70 s.
    long_job = {**NVIDIA_MPIJOB, "model": {"parameters": 1.0, "precision": "fp16"},
                "deepspeed": {"precision": "fp16", "zeroStage": 3, "offloadOptimizer": "cpu"}}
    m = model("dev", {"workloads": {"ds-t4": long_job}, "mpiOperator.install": True})
    w = m.workloads["ds-t4"]
    spec = mpijob.render_spec(mpijob.MpiJobInputs(workload=w, placement=placement(m, w), image="i", config_map="c"))
    grace = 148  # 60 + 1.25 x 70 s
    pods = {role: spec["mpiReplicaSpecs"][role]["template"]["spec"] for role in ("Launcher", "Worker")}
    assert {pod["terminationGracePeriodSeconds"] for pod in pods.values()} == {grace}
    assert pods["Worker"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][-1] == str(grace - 5)
    assert f"stop_ranks.py --timeout {grace - 5}" in pods["Launcher"]["containers"][0]["args"][0]


def test_a_save_longer_than_the_spot_notice_is_flagged() -> None:
    plans = recovery.stack_recovery(model("prod", {**LONG_SAVE, "nodePools[0].spot": True}))
    assert (plans["zero3-smoke"]["spot"], plans["zero3-smoke"]["fitsSpotNotice"]) == (True, False)
    body = _section(plans)
    assert _row(body, "zero3-smoke")[4] == "**no**: periodic checkpoints only"
    assert "- **no**: `zero3-smoke` saves in 126 s, longer than the 15 s of a Spot notice its pods can use.\n" in body


def test_the_interval_says_it_is_minutes_and_which_flags_take_steps(prod: RunResult) -> None:
    # The scripts' flags take steps (smoke_train.py --checkpoint-every, finetune.py --save-steps), and a step's time
    # is unknown before a run: the table gives minutes and says how to convert.
    [(_, body)] = preemption_recovery(prod)
    assert "It is in minutes, and no flag takes minutes: the scripts' `--checkpoint-every` (CHECKPOINT_EVERY_STEPS;" \
           " the fine-tune script's `--save-steps`) takes steps" in body
    assert "Steps = minutes x 60 / seconds per step" in body
    # GKE's Spot VMs page: 30 s of notice, the first 15 s for non-system pods.
    assert "A Spot VM stops 30 s after its notice and its pods get the first 15 s of it" in body


def test_preview_section_absent_without_a_recovery_output() -> None:
    assert preemption_recovery(RunResult(stack="prod", resources=[], outputs={})) == []


def test_a_stack_file_previews_its_own_recovery_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # `--stack-file` runs another file as stack prod: the table is that file's (1B parameters: 14 GB, 70 s), not
    # Pulumi.prod.yaml's (the smoke MLP: 0.5 GB), which the section once read again by the stack's name.
    stack_file = tmp_path / "candidate.yaml"
    doc = {"config": changed("prod", {"workloads.zero3-smoke.model.parameters": 1.0})}
    stack_file.write_text(yaml.safe_dump(doc), encoding="utf-8")
    assert main(["--stack", "prod", "--stack-file", str(stack_file), "--out", str(tmp_path / "build")]) == 0
    capsys.readouterr()
    summary_md = (tmp_path / "build" / "prod" / "summary.md").read_text(encoding="utf-8")
    body = summary_md.split("#### Preemption recovery", 1)[1]
    assert _row(body, "zero3-smoke")[1:3] == ["14.0 GB", "70 s (nfs)"]
