"""Tiered checkpoints (issue 38 item 3, a finetune workload's `localCheckpoints`): the save to the node's local SSDs,
its copy to the bucket by finetune_tiered.py (a marker per node, checkpoint-copied.json last), resuming from the
newest complete copy, the key's rules, what the MPIJob carries, and the preview's estimate per event."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import PROJECT_DIR, changed, load_file, model, problems, run_stack

from planner import recovery
from preview.engine import RunResult
from preview.sections.recovery import section

SCRIPTS = PROJECT_DIR / "recipes"
MPIJOB = "kubernetes:kubeflow.org/v2beta1:MPIJob"
W = "workloads.tune"
# The finetune stack's pool (g2-standard-48) takes 4 local SSDs (data/gpu_catalog.yaml machineDisks) and has none.
TIERED = {f"{W}.localCheckpoints": True, "nodePools[0].localSsdCount": 4}


@functools.cache
def _modules() -> tuple[Any, Any]:
    import sys

    sys.path.insert(0, str(SCRIPTS))  # finetune_tiered imports finetune_checkpoints by name, as in the pod
    return load_file(SCRIPTS / "finetune_tiered.py", "finetune_tiered"), \
        load_file(SCRIPTS / "finetune_checkpoints.py", "finetune_checkpoints")


def _local_save(root: Path, step: int, node: int) -> Path:
    """What the Trainer leaves on a node's disk for one save (its files, trainer_state.json among them)."""
    folder = root / f"checkpoint-{step}"
    (folder / f"global_step{step}").mkdir(parents=True)
    (folder / f"global_step{step}" / f"zero_pp_rank_{node}_mp_rank_00_optim_states.pt").write_bytes(b"o" * 3000)
    (folder / "adapter_model.safetensors").write_bytes(b"a" * 2000)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return folder


def _copier(tiered: Any, local: Path, bucket: Path, node: int, nodes: int, stopping: Any = lambda: False,
            said: list[str] | None = None) -> Any:
    return tiered.Copier(local, bucket, node, nodes, node == 0, 2, stopping,
                         say=(said.append if said is not None else lambda _: None))


def test_every_nodes_files_are_copied_and_rank_0_marks_the_copy_complete_last(tmp_path: Path) -> None:
    tiered, checkpoints = _modules()
    bucket = tmp_path / "bucket"
    for node in (0, 1):
        _local_save(tmp_path / f"node{node}", 5, node)
    node1 = _copier(tiered, tmp_path / "node1", bucket, 1, 2)
    node1.submit(5)
    assert node1.drain(timeout=30)
    # Node 1's files are there, not yet complete: rank 0 has not copied its own.
    assert (bucket / "checkpoint-5" / "copied-node-1.json").is_file()
    assert not (bucket / "checkpoint-5" / tiered.COPIED_MARKER).exists()
    assert checkpoints.newest_checkpoint(bucket, tiered.COPIED_MARKER) is None
    node0 = _copier(tiered, tmp_path / "node0", bucket, 0, 2)
    node0.submit(5)
    assert node0.drain(timeout=30)
    folder = bucket / "checkpoint-5"
    assert json.loads((folder / tiered.COPIED_MARKER).read_text()) == {"step": 5, "nodes": 2}
    assert {p.name for p in (folder / "global_step5").iterdir()} == {
        "zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"}
    assert checkpoints.newest_checkpoint(bucket, tiered.COPIED_MARKER) == folder


def test_the_trainers_own_last_file_is_copied_last(tmp_path: Path) -> None:
    tiered, _ = _modules()
    order = [p.name for p in tiered.files_in_order(_local_save(tmp_path, 5, 0))]
    assert order[-1] == "trainer_state.json" and len(order) == 3


def test_a_resume_skips_a_newer_copy_that_was_cut_off(tmp_path: Path) -> None:
    """A preemption during a copy leaves checkpoint-N without the marker (trainer_state.json may be there): the
    newest complete copy is resumed from, whatever the Trainer's own rule would pick."""
    tiered, checkpoints = _modules()
    for step, complete in ((5, True), (10, False)):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        (folder / "trainer_state.json").write_text("{}")
        if complete:
            (folder / tiered.COPIED_MARKER).write_text("{}")
    assert checkpoints.newest_checkpoint(tmp_path, tiered.COPIED_MARKER) == tmp_path / "checkpoint-5"
    assert checkpoints.newest_checkpoint(tmp_path) == tmp_path / "checkpoint-10"  # untiered: the Trainer's file


def test_on_sigterm_the_copy_under_way_is_dropped_for_the_stops_save(tmp_path: Path) -> None:
    tiered, checkpoints = _modules()
    bucket, local = tmp_path / "bucket", tmp_path / "node0"
    for step in (10, 11):
        _local_save(local, step, 0)
    said: list[str] = []
    copier = _copier(tiered, local, bucket, 0, 1, stopping=lambda: True, said=said)
    copier.newest_queued = 11  # the stop's save is queued while checkpoint-10 is copied
    with pytest.raises(tiered.CopyAbandonedError, match="checkpoint-11 is newer"):
        copier.copy(10)
    copier.submit(11)
    assert copier.drain(timeout=30)
    assert checkpoints.newest_checkpoint(bucket, tiered.COPIED_MARKER) == bucket / "checkpoint-11"
    assert not (bucket / "checkpoint-10").exists()  # the cut-off copy is removed once a newer one is complete


def test_the_bucket_keeps_the_newest_complete_copies(tmp_path: Path) -> None:
    tiered, _ = _modules()
    for step in (5, 10, 15, 20):
        (tmp_path / f"checkpoint-{step}").mkdir()
        if step != 15:
            (tmp_path / f"checkpoint-{step}" / tiered.COPIED_MARKER).write_text("{}")
    (tmp_path / "checkpoint-25").mkdir()  # a newer copy under way is not touched
    _copier(tiered, tmp_path / "local", tmp_path, 0, 1).prune(20)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-10", "checkpoint-20", "checkpoint-25"]


def test_deepspeed_writes_the_model_states_on_every_node() -> None:
    tiered, _ = _modules()
    assert tiered.local_ds_config({"checkpoint": {"tag_validation": "Warn"}, "zero_optimization": {"stage": 3}}) == {
        "checkpoint": {"tag_validation": "Warn", "use_node_local_storage": True}, "zero_optimization": {"stage": 3}}
    assert tiered.node_of(5, 16, {"LOCAL_SIZE": "8"}) == (0, 2)
    assert tiered.node_of(9, 16, {"LOCAL_SIZE": "8"}) == (1, 2)


def test_the_script_takes_the_local_folder_from_the_flag_or_the_contracts_variable() -> None:
    import sys

    sys.path.insert(0, str(SCRIPTS))
    finetune = load_file(SCRIPTS / "finetune.py", "finetune_under_tiered_test")
    base = ["--model", "m", "--dataset", "d.jsonl", "--checkpoint-dir", "/c", "--model-dir", "/m"]
    assert finetune.parse_args(base, {"LOCAL_CHECKPOINT_DIR": "/local-checkpoints"}).local_checkpoint_dir == \
        "/local-checkpoints"
    assert finetune.parse_args([*base, "--local-checkpoint-dir", "/x"], {}).local_checkpoint_dir == "/x"
    with pytest.raises(finetune.UsageError, match="--copy-rate-mb must be more than 0"):
        finetune.parse_args([*base, "--copy-rate-mb", "0"], {})


# --- the stack key --------------------------------------------------------------------------------------------

def test_a_pool_without_local_ssds_is_refused() -> None:
    found = problems("finetune", {f"{W}.localCheckpoints": True})
    assert found == [f"{W}.localCheckpoints: pool l4x4 has no local SSDs, so a local save would go to the boot disk; "
                     "set nodePools[0].localSsdCount to a count g2-standard-48 takes (1 or more), or set "
                     "localCheckpoints to false"]
    assert problems("finetune", TIERED) == []


def test_a_script_other_than_finetune_py_is_refused() -> None:
    found = problems("finetune", {**TIERED, f"{W}.launch.command": "python my_train.py"})
    assert any(p.startswith(f"{W}.localCheckpoints: the copy to the bucket is finetune.py's own") and
               f"{W}.launch.command runs something else" in p for p in found), found


@functools.cache
def _tiered_run() -> RunResult:
    return run_stack("finetune", changed("finetune", TIERED))


def _pod(run: RunResult, role: str) -> dict[str, Any]:
    return run.one(MPIJOB).inputs["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]


def test_the_workers_save_to_an_empty_dir_on_the_local_ssds() -> None:
    run = _tiered_run()
    worker, launcher = _pod(run, "Worker"), _pod(run, "Launcher")
    assert {"name": "local-checkpoints", "emptyDir": {}} in worker["volumes"]
    assert {"name": "local-checkpoints", "mountPath": "/local-checkpoints"} in worker["containers"][0]["volumeMounts"]
    assert not [v for v in launcher["volumes"] if v["name"] == "local-checkpoints"]  # the launcher saves nothing
    env = {e["name"]: e["value"] for e in worker["containers"][0]["env"]}
    assert env["LOCAL_CHECKPOINT_DIR"] == "/local-checkpoints"
    shipped = [r.inputs["data"] for r in run.by_type("kubernetes:core/v1:ConfigMap")
               if "finetune.py" in r.inputs.get("data", {})]
    assert shipped and all("finetune_tiered.py" in data for data in shipped)  # beside finetune.py


def test_the_preview_gives_the_local_save_the_copy_and_the_work_at_risk() -> None:
    """The recipe's LoRA checkpoint (0.646 GB) on 2 nodes: to 4 local SSDs at 0.2 GB/s each, 0.40 s; the copy at
    0.4 GB/s a node, 0.81 s. Full fine-tuning of the 7.62B Qwen (121.9 GB): 76.2 s local, 152.4 s copy; the
    interval from the 76.2 s wait on a Spot pool (6 h between interruptions): sqrt(2 x 76.2 x 21600) / 60 = 30.2 min;
    a Spot notice or a node failure loses up to that plus the copy under way (2.5 min)."""
    full = recovery.stack_recovery(model("finetune", {**TIERED, f"{W}.finetune.lora.enabled": False,
                                                      f"{W}.deepspeed.offloadOptimizer": "cpu",
                                                      "nodePools[0].spot": True}))["tune"]
    assert full["localSaveSeconds"] == pytest.approx(121.92 / (0.2 * 4 * 2))
    assert full["saveSeconds"] == pytest.approx(121.92 / (0.4 * 2))
    assert full["saveEveryMinutes"] == pytest.approx(30.24, abs=0.01)
    assert full["graceSeconds"] == 346  # 60 + 1.25 x (76.2 + 152.4)
    assert full["lostMinutes"]["drain"] == 0
    assert full["lostMinutes"]["spot"] == full["lostMinutes"]["nodeFailure"] == pytest.approx(30.24 + 2.54, abs=0.01)
    [(_, body)] = section(RunResult(stack="finetune", resources=[], outputs={"recovery": {"tune": full}}))
    assert "| tune | 121.9 GB | 76 s to 4 local SSDs, then 152 s copy (gcsfuse) | 346 s |" in body
    assert "| tune | none | up to 33 min | up to 33 min |" in body
    plain = recovery.stack_recovery(model("finetune", {f"{W}.finetune.lora.enabled": False,
                                                       f"{W}.deepspeed.offloadOptimizer": "cpu",
                                                       "nodePools[0].spot": True}))["tune"]
    assert plain["localSaveSeconds"] is None and plain["saveEveryMinutes"] > full["saveEveryMinutes"]


def test_every_pod_of_a_tiered_job_gets_the_save_and_its_copy() -> None:
    run = _tiered_run()
    plan = recovery.stack_recovery(model("finetune", TIERED))["tune"]
    assert {_pod(run, role)["terminationGracePeriodSeconds"] for role in ("Launcher", "Worker")} == \
        {plan["graceSeconds"]}
