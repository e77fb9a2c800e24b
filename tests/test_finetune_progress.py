"""finetune_progress.py's arithmetic and files, against values computed by hand; its callback under a stand-in
TrainerCallback and a stand-in clock (no transformers, no sleeping)."""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from conftest import load_file

from recipes import finetune_train as fr

SCRIPT = Path(__file__).resolve().parent.parent / "recipes" / "finetune_progress.py"


@pytest.fixture(scope="module")
def fp() -> Any:
    return load_file(SCRIPT, "finetune_progress_under_test")


def test_percentage_rounds_down_and_reaches_100_only_at_the_end(fp: Any) -> None:
    assert fp.progress_percentage(20, 40) == 50
    assert fp.progress_percentage(39, 40) == 97  # 97.5 rounded down
    assert fp.progress_percentage(40, 40) == 100
    assert fp.progress_percentage(0, 0) == 0


def test_eta_is_the_steps_left_at_this_sessions_pace(fp: Any) -> None:
    # Resumed at step 5, at step 20 after 30 s: 2 s a step, 20 steps left -> 40 s.
    assert fp.eta_seconds(20, 40, 5, 30.0) == pytest.approx(40.0)
    assert fp.eta_seconds(40, 40, 5, 70.0) == 0.0
    assert fp.eta_seconds(5, 40, 5, 3.0) is None  # no step done yet this session


def test_mfu_counts_the_model_flops_over_every_gpus_peak(fp: Any) -> None:
    # Llama-2-7B (6.74e9 parameters) in full: 6N = 4.044e10 FLOPs a token; 8 x A100 (312 dense bf16 TFLOPS) at
    # 24,000 tokens/s: 24,000 x 4.044e10 / (8 x 312e12) = 9.7056e14 / 2.496e15 = 0.388846...
    assert fp.mfu(24_000, 6 * 6.74e9, 8, 312.0) == pytest.approx(0.3888461538)


def test_run_facts_read_positive_numbers_and_leave_out_the_rest(fp: Any) -> None:
    facts = fp.RunFacts.from_env({"FINETUNE_PEAK_TFLOPS": "65", "FINETUNE_MODEL_FLOPS": "2.8e10",
                                  "FINETUNE_PRICE_PER_HOUR": "abc"})
    assert (facts.peak_tflops, facts.flops_per_token, facts.price_per_hour) == (65.0, 2.8e10, None)
    assert fp.RunFacts.from_env({"FINETUNE_PEAK_TFLOPS": "0"}).peak_tflops is None


def test_progress_file_has_kubeflow_trainer_status_fields(fp: Any) -> None:
    s = fp.Snapshot(step=20, steps=40, elapsed=61.23456, eta=40.4, loss=1.25, tokens_per_second=1234.5, mfu=0.0312)
    now = datetime.datetime(2026, 11, 27, 12, 0, 5, tzinfo=datetime.UTC)
    assert fp.trainer_status(s, now) == {
        "progressPercentage": 50, "estimatedRemainingSeconds": 40, "lastUpdatedTime": "2026-11-27T12:00:05Z",
        "metrics": [{"name": "loss", "value": "1.25"}, {"name": "tokens_per_second", "value": "1234.5"},
                    {"name": "mfu", "value": "0.0312"}],
        "step": 20, "steps": 40, "elapsedSeconds": 61.235}
    unknown = fp.Snapshot(0, 40, 0.0, None, None, None, None)
    assert "estimatedRemainingSeconds" not in fp.trainer_status(unknown, now)


def test_run_record_prices_the_hours_trained(fp: Any) -> None:
    # 2 h 15 min at $3.71/h: 2.25 x 3.71 = $8.3475.
    assert fp.run_record(8100.0, 3.71, 40, 2) == {"trainingHours": 2.25, "pricePerHour": 3.71, "cost": 8.3475,
                                                 "step": 40, "worldSize": 2}
    assert "cost" not in fp.run_record(8100.0, None, 40, 2)


def test_write_atomic_replaces_the_file_whole_and_leaves_no_temporary(fp: Any, tmp_path: Path) -> None:
    path = tmp_path / "ckpt" / "progress.json"
    fp.write_atomic(path, {"step": 1})
    fp.write_atomic(path, {"step": 2})
    assert json.loads(path.read_text()) == {"step": 2}
    assert [p.name for p in path.parent.iterdir()] == ["progress.json"]


def test_previous_elapsed_only_on_a_resume(fp: Any, tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    path.write_text(json.dumps({"elapsedSeconds": 12.5}))
    assert fp.previous_elapsed(path, 5) == 12.5
    assert fp.previous_elapsed(path, 0) == 0.0  # a fresh run: an old run's file is not this one's
    assert fp.previous_elapsed(tmp_path / "none.json", 5) == 0.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _callback(fp: Any, tmp_path: Path, clock: Clock, said: list[str]) -> Any:
    transformers = ModuleType("transformers")
    transformers.TrainerCallback = type("TrainerCallback", (), {})  # type: ignore[attr-defined]
    sys.modules["transformers"] = transformers
    try:
        facts = fp.RunFacts(peak_tflops=0.001, flops_per_token=600_000.0, price_per_hour=2.0)
        return fp.progress_callback(facts, str(tmp_path / "ckpt"), str(tmp_path / "model"), said.append, clock)
    finally:
        del sys.modules["transformers"]


def test_callback_adds_rates_to_the_logs_writes_progress_and_the_runs_cost(fp: Any, tmp_path: Path) -> None:
    clock, said = Clock(), []
    cb = _callback(fp, tmp_path, clock, said)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "progress.json").write_text(json.dumps({"elapsedSeconds": 30.0}))  # the first attempt's
    args = SimpleNamespace(world_size=2, process_index=0)
    state = SimpleNamespace(global_step=5, max_steps=40, num_input_tokens_seen=1000, is_world_process_zero=True)
    cb.on_train_begin(args, state, None)
    clock.now, state.global_step, state.num_input_tokens_seen = 110.0, 10, 3000
    logs = {"loss": 2.5}
    cb.on_log(args, state, None, logs=logs)
    # 2,000 tokens in 10 s = 200 tokens/s; MFU 200 x 600,000 / (2 x 0.001e12) = 0.06; ETA 30 steps x 2 s = 60 s.
    assert logs == {"loss": 2.5, "tokens_per_second": 200.0, "tokens_per_second_per_gpu": 100.0,
                    "mfu": pytest.approx(0.06)}
    assert said == ["rank 0: step 10/40 (25 %), 200 tokens/s (100 per GPU), MFU 6.00%, ETA 60 s, loss 2.5"]
    progress = json.loads((tmp_path / "ckpt" / "progress.json").read_text())
    assert (progress["progressPercentage"], progress["estimatedRemainingSeconds"], progress["elapsedSeconds"]) == \
        (25, 60, 40.0)
    clock.now, state.global_step = 170.0, 40
    cb.on_train_end(args, state, None)
    final = json.loads((tmp_path / "ckpt" / "progress.json").read_text())
    assert (final["progressPercentage"], final["estimatedRemainingSeconds"]) == (100, 0)
    # 30 s before + 70 s now = 100 s = 0.027778 h, at $2/h: $0.0556. The session's average: 2,000 tokens in 70 s =
    # 28.571 tokens/s, 14.286 per GPU; MFU 28.571 x 600,000 / (2 x 0.001e12) = 0.008571.
    assert json.loads((tmp_path / "model" / "run.json").read_text()) == {
        "trainingHours": 0.027778, "pricePerHour": 2.0, "cost": 0.0556, "step": 40, "worldSize": 2,
        "tokensPerSecondPerGpu": 14.286, "mfu": 0.008571}
    assert len(said) == 1  # no estimate given: no comparison line


def test_the_eta_paces_the_session_from_its_first_steps_end(fp: Any, tmp_path: Path) -> None:
    """A resumed session's first step carries its start (here 20 s); the ETA paces the steps after it."""
    clock, said = Clock(), []
    cb = _callback(fp, tmp_path, clock, said)
    args = SimpleNamespace(world_size=2, process_index=0)
    state = SimpleNamespace(global_step=5, max_steps=40, num_input_tokens_seen=1000, is_world_process_zero=True)
    clock.now = 100.0
    cb.on_train_begin(args, state, None)
    clock.now, state.global_step = 120.0, 6
    cb.on_step_end(args, state, None)
    clock.now, state.global_step = 121.0, 7
    cb.on_step_end(args, state, None)  # only the first step's end counts
    clock.now, state.global_step, state.num_input_tokens_seen = 128.0, 10, 3000
    cb.on_log(args, state, None, logs={"loss": 2.5})
    # Steps 6-10 in 8 s: 2 s a step, 30 steps left -> 60 s (from the session's start: 28 s / 5 steps -> 168 s).
    progress = json.loads((tmp_path / "ckpt" / "progress.json").read_text())
    assert progress["estimatedRemainingSeconds"] == 60
    assert said[-1].endswith("ETA 60 s, loss 2.5")


def test_the_estimate_rides_in_progress_and_run_json_and_the_end_prints_it_against_the_measured(
        fp: Any, tmp_path: Path) -> None:
    estimate = {"tokensPerSecondPerGpu": {"low": 10.0, "high": 20.0}, "mfu": {"low": 0.006, "high": 0.012},
                "hours": {"fast": 0.02, "slow": 0.04}, "cost": {"fast": 0.04, "slow": 0.08},
                "evidence": ["row-a", "row-b"]}
    facts = fp.RunFacts.from_env({fp.PEAK_ENV: "0.001", fp.FLOPS_ENV: "600000", fp.PRICE_ENV: "2",
                                  fp.ESTIMATE_ENV: json.dumps(estimate)})
    assert facts.estimate == estimate
    assert fp.RunFacts.from_env({fp.ESTIMATE_ENV: "[1, 2]"}).estimate is None  # not an object: left out
    assert fp.RunFacts.from_env({fp.ESTIMATE_ENV: "{oops"}).estimate is None
    clock, said = Clock(), []
    transformers = ModuleType("transformers")
    transformers.TrainerCallback = type("TrainerCallback", (), {})  # type: ignore[attr-defined]
    sys.modules["transformers"] = transformers
    try:
        cb = fp.progress_callback(facts, str(tmp_path / "ckpt"), str(tmp_path / "model"), said.append, clock)
    finally:
        del sys.modules["transformers"]
    args = SimpleNamespace(world_size=2, process_index=0)
    state = SimpleNamespace(global_step=0, max_steps=10, num_input_tokens_seen=0, is_world_process_zero=True)
    cb.on_train_begin(args, state, None)
    clock.now, state.global_step, state.num_input_tokens_seen = 136.0, 10, 2160  # 2,160 tokens in 36 s
    cb.on_log(args, state, None, logs={"loss": 2.0})
    progress = json.loads((tmp_path / "ckpt" / "progress.json").read_text())
    assert progress["estimate"] == estimate and progress["measured"] == {"hours": 0.01, "cost": 0.02}
    cb.on_train_end(args, state, None)
    record = json.loads((tmp_path / "model" / "run.json").read_text())
    # 60 tokens/s, 30 per GPU; MFU 60 x 600,000 / (2 x 1e9) = 0.018; 36 s = 0.01 h, $0.02 at $2/h.
    assert record["estimate"] == estimate and record["tokensPerSecondPerGpu"] == 30.0 and record["mfu"] == 0.018
    assert said[-1] == ("estimate vs measured: tokens/s per GPU 10–20 estimated, 30 measured; MFU 0.60%–1.20% "
                        "estimated, 1.80% measured; hours 0.02–0.04 estimated, 0.01 measured; $ 0.0400–0.0800 "
                        "estimated, 0.0200 measured (rows: row-a, row-b)")


def test_callback_on_another_rank_logs_but_writes_nothing(fp: Any, tmp_path: Path) -> None:
    clock, said = Clock(), []
    cb = _callback(fp, tmp_path, clock, said)
    args = SimpleNamespace(world_size=2, process_index=1)
    state = SimpleNamespace(global_step=0, max_steps=40, num_input_tokens_seen=0, is_world_process_zero=False)
    cb.on_train_begin(args, state, None)
    clock.now, state.global_step, state.num_input_tokens_seen = 105.0, 5, 1000
    cb.on_log(args, state, None, logs={"loss": 3.0})
    cb.on_log(args, state, None, logs={"train_runtime": 5.0})  # the run's summary: no window, nothing said
    state.global_step = 40
    cb.on_train_end(args, state, None)
    assert said == ["rank 1: step 5/40 (12 %), 200 tokens/s (100 per GPU), MFU 6.00%, ETA 35 s, loss 3"]
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "model").exists()


def test_a_stopped_run_records_no_cost(fp: Any, tmp_path: Path) -> None:
    clock, said = Clock(), []
    cb = _callback(fp, tmp_path, clock, said)
    args = SimpleNamespace(world_size=1, process_index=0)
    state = SimpleNamespace(global_step=0, max_steps=40, num_input_tokens_seen=0, is_world_process_zero=True)
    cb.on_train_begin(args, state, None)
    clock.now, state.global_step = 120.0, 7  # preempted at step 7
    cb.on_train_end(args, state, None)
    progress = json.loads((tmp_path / "ckpt" / "progress.json").read_text())
    assert progress["progressPercentage"] == 17 and "estimatedRemainingSeconds" not in progress
    assert not (tmp_path / "model" / "run.json").exists()


# --- what the stack renders for it --------------------------------------------------------------------------------

def _recipe_env(changes: dict[str, Any] | None = None) -> dict[str, str]:
    from conftest import changed, config_model

    from workloads import finetune_progress

    cfg = config_model(changed("finetune", changes))
    return finetune_progress.run_env(cfg, cfg.workloads["tune"])


def test_the_recipe_gets_its_gpus_peak_the_models_flops_its_pools_price_and_logs_folder() -> None:
    # Pulumi.finetune.yaml: Qwen2.5-7B (7.62e9 parameters, data/models.yaml) with LoRA: 4N = 3.048e10 FLOPs a token
    # (PaLM's MFU counts no recomputation); L4 bf16 dense 121 TFLOPS (NVIDIA's datasheet, 242 with sparsity);
    # The stack's $/h while it trains, as the estimate counts it: 2 spot g2-standard-48 nodes at $1.60/h each
    # (data/gpu_catalog.yaml) + the system pool's e2-standard-4 $0.134 + the cluster fee $0.10 + Filestore 1 TiB x
    # $0.000274 + the server's g2-standard-8, up and waiting, $0.85 = $4.5646/h (run.json counted the trainer only).
    env = _recipe_env()
    estimate = json.loads(env.pop("FINETUNE_ESTIMATE"))
    assert env == {"FINETUNE_PEAK_TFLOPS": "121", "FINETUNE_MODEL_FLOPS": "3.048e+10",
                   "FINETUNE_PRICE_PER_HOUR": "4.5646", "TENSORBOARD_LOGGING_DIR": "/gcs/logs/tune"}
    # the preview's run, as the ranks carry it (tests/test_run_estimate.py works its numbers by hand)
    from conftest import changed, config_model

    from planner import cost
    run = cost.stack_costs(config_model(changed("finetune")))["runs"]["tune"]
    assert estimate == {"tokensPerSecondPerGpu": run["tokensPerSecondPerGpu"], "mfu": run["mfu"],
                        "hours": run["hours"], "trainingHours": run["trainingHours"], "cost": run["perRun"]["spot"],
                        "evidence": run["evidence"],
                        # what ran, for `make gpus RUNS=` (tests/test_past_runs.py): Qwen/Qwen2.5-7B-Instruct as
                        # the planner resolves it, 2 x 4 L4, LoRA, ZeRO-3
                        "shape": {"model": "Qwen2.5-7B", "gpu": "nvidia-l4", "gpus": 8, "lora": True, "zeroStage": 3}}


def test_full_fine_tuning_counts_6n() -> None:
    env = _recipe_env({"workloads.tune.finetune.lora.enabled": False,
                       "workloads.tune.deepspeed.offloadOptimizer": "cpu"})  # full: needs offload to fit
    assert env["FINETUNE_MODEL_FLOPS"] == "4.572e+10"  # 6 x 7.62e9


def test_the_launch_carries_the_env_and_ships_the_callback_beside_the_script() -> None:
    from conftest import changed, config_model

    from workloads import finetune, finetune_progress

    cfg = config_model(changed("finetune", None))
    w = cfg.workloads["tune"]
    launch = finetune.launch(w, has_token=False, run_env=finetune_progress.run_env(cfg, w))
    assert launch.env["FINETUNE_PEAK_TFLOPS"] == "121" and launch.env["CHECKPOINT_DIR"] == "/gcs/checkpoints/tune"
    # finetune.py's modules beside it (every finetune_*.py), the progress callback among them, the contract, and the
    # package's __init__ as recipes.py.
    assert sorted(launch.files) == [
        "contract.py", "finetune.py", "finetune_args.py", "finetune_check.py", "finetune_checkpoints.py",
        "finetune_config.py", "finetune_data.py", "finetune_export.py", "finetune_fabric.py", "finetune_hpu.py",
        "finetune_prepare.py", "finetune_progress.py", "finetune_read.py", "finetune_render.py", "finetune_tiered.py",
        "finetune_tokenized.py", "finetune_train.py", "recipes.py", "shutdown.py"]
    assert launch.files["finetune_progress.py"] == SCRIPT.read_text(encoding="utf-8")


def _callbacks_with(monkeypatch: pytest.MonkeyPatch, tensorboard: Any, logs_dir: str | None) -> tuple[list, list]:
    """finetune_train.progress_callbacks under stand-in transformers modules; (callbacks, lines said)."""
    said: list[str] = []
    monkeypatch.setattr(fr, "say", said.append)
    transformers = ModuleType("transformers")
    transformers.TrainerCallback = type("TrainerCallback", (), {})  # type: ignore[attr-defined]
    integrations = ModuleType("transformers.integrations")
    integrations.TensorBoardCallback = tensorboard  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "transformers", transformers)
    monkeypatch.setitem(sys.modules, "transformers.integrations", integrations)
    if logs_dir is None:
        monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    else:
        monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", logs_dir)
    args = SimpleNamespace(checkpoint_dir="/c", model_dir="/m")
    return fr.progress_callbacks(args), said


def test_the_progress_callback_comes_before_tensorboards_writer(monkeypatch: pytest.MonkeyPatch) -> None:
    writer = type("TensorBoardCallback", (), {})
    callbacks, said = _callbacks_with(monkeypatch, writer, "/gcs/logs/tune")
    assert [type(c).__name__ for c in callbacks] == ["Progress", "TensorBoardCallback", "CloseEventFile"]
    assert said == []
    callbacks, _ = _callbacks_with(monkeypatch, writer, None)
    assert [type(c).__name__ for c in callbacks] == ["Progress"]


def test_on_vertex_ai_the_event_files_go_to_aip_tensorboard_log_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    """Vertex AI uploads what lands under AIP_TENSORBOARD_LOG_DIR to the CustomJob's TensorBoard."""
    folders: list[str | None] = []
    writer = type("TensorBoardCallback", (), {"__init__": lambda self: folders.append(
        os.environ.get("TENSORBOARD_LOGGING_DIR"))})  # transformers' writer reads its folder from there
    monkeypatch.setenv("AIP_TENSORBOARD_LOG_DIR", "gs://bkt/vertex/logs/")
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", "")  # recorded as unset: the folder set by the run is undone
    callbacks, _ = _callbacks_with(monkeypatch, writer, None)
    assert [type(c).__name__ for c in callbacks] == ["Progress", "TensorBoardCallback", "CloseEventFile"]
    assert folders == ["/gcs/bkt/vertex/logs/"]


def test_without_tensorboard_the_run_goes_on_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> None:
        raise RuntimeError("TensorBoardCallback requires tensorboard to be installed.")

    callbacks, said = _callbacks_with(monkeypatch, missing, "/gcs/logs/tune")
    assert [type(c).__name__ for c in callbacks] == ["Progress"]
    assert said == ["no TensorBoard event files: TensorBoardCallback requires tensorboard to be installed."]


def test_each_logging_steps_event_file_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    """GCS FUSE uploads a file when it is closed: the writer's file is closed after its on_log, and the writer left
    without one (transformers' writer opens a new file at its next on_log when it has none)."""
    closed: list[str] = []

    class File:
        def __init__(self, name: str) -> None:
            self.name = name

        def close(self) -> None:
            closed.append(self.name)

    writer = type("TensorBoardCallback", (), {"__init__": lambda self: setattr(self, "tb_writer", None)})
    callbacks, _ = _callbacks_with(monkeypatch, writer, "/gcs/logs/tune")
    tensorboard, closer = callbacks[1], callbacks[2]
    control = object()
    for step in ("first", "second"):
        tensorboard.tb_writer = File(step)  # what the writer's on_log opened
        assert closer.on_log(None, None, control, logs={"loss": 1.0}) is control
        assert tensorboard.tb_writer is None
    assert closer.on_log(None, None, control) is control  # a step where nothing was written (not rank 0)
    assert closed == ["first", "second"]
