"""Issue 37 item 5's last sentence: `make gpus ... RUNS=<folder>` reads earlier runs' run.json (copied from the
bucket, as the preview's Training section says), picks those of the same shape, and says how far their estimates
were off (planner/past_runs.py). The records are written here, as finetune_progress.run_record writes them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import config_model, stack_run

from planner import past_runs
from planner.__main__ import main

# The finetune example's run: Qwen/Qwen2.5-7B-Instruct (the planner's Qwen2.5-7B), LoRA, 2 workers x 4 L4, ZeRO-3.
SHAPE = {"model": "Qwen2.5-7B", "gpu": "nvidia-l4", "gpus": 8, "lora": True, "zeroStage": 3}


def _record(shape: dict[str, Any] | None, tps: float, hours: float, mfu: float) -> dict[str, Any]:
    estimate: dict[str, Any] = {"tokensPerSecondPerGpu": {"low": 900.0, "high": 1100.0},
                                "mfu": {"low": 0.2, "high": 0.25}, "trainingHours": {"fast": 1.0, "slow": 1.25},
                                "hours": {"fast": 1.01, "slow": 1.26}, "cost": {"fast": 4.6, "slow": 5.7},
                                "evidence": ["torchtitan-8b-fsdp-8xh100"]}
    if shape is not None:
        estimate["shape"] = shape
    return {"trainingHours": hours, "step": 229, "worldSize": 8, "pricePerHour": 4.56, "cost": round(hours * 4.56, 4),
            "tokensPerSecondPerGpu": tps, "mfu": mfu, "estimate": estimate}


def _write(folder: Path, name: str, data: Any) -> None:
    (folder / name).mkdir(parents=True)
    (folder / name / "run.json").write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    folder = tmp_path / "runs"
    _write(folder, "tune", _record(SHAPE, 990.0, 1.5, 0.22))
    _write(folder, "full", _record({**SHAPE, "lora": False}, 500.0, 3.0, 0.1))  # full fine-tune: not this shape
    _write(folder, "other", _record({**SHAPE, "model": "Llama-3.1-8B"}, 990.0, 1.5, 0.22))  # another model
    _write(folder, "old", _record(None, 990.0, 1.5, 0.22))  # a record from before the shape was carried
    _write(folder, "broken", "{not json")
    return folder


def test_the_earlier_runs_of_the_same_shape_and_how_far_off(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model", "Qwen2.5-7B-Instruct", "--mode", "finetune", "--tokens", "3e7", "--runs", str(runs)]) == 0
    out = capsys.readouterr().out
    section = out.split("## Earlier runs of Qwen2.5-7B (LoRA)", 1)[1]
    assert section.startswith(f" in {runs}: 1 of 3 run record(s); x: measured over estimated")
    # 990 over 900..1100 = 0.90..1.10; MFU 0.22 over 0.20..0.25 = 0.88..1.10; hours 1.5 over 1.0..1.25 = 1.20..1.50.
    assert (f"  {runs}/tune/run.json (Qwen2.5-7B, 8 x nvidia-l4, LoRA, ZeRO-3): tokens/s per GPU 900–1,100 "
            "estimated, 990 measured (x0.90–1.10); MFU 20.0%–25.0% estimated, 22.0% measured (x0.88–1.10); training "
            "hours 1–1.25 estimated, 1.5 measured (x1.20–1.50) [") in section
    assert "/full/" not in section and "/other/" not in section
    assert f"  skipped {runs}/broken/run.json: not JSON" in section
    assert f"  skipped {runs}/old/run.json: no estimate.shape" in section
    # The same records, asked for the full fine-tune: the full one only.
    assert main(["--model", "Qwen2.5-7B-Instruct", "--mode", "training", "--runs", str(runs)]) == 0
    full = capsys.readouterr().out.split("## Earlier runs of Qwen2.5-7B (full)", 1)[1]
    assert f"{runs}/full/run.json (Qwen2.5-7B, 8 x nvidia-l4, full, ZeRO-3): tokens/s per GPU 900–1,100 estimated, " \
           "500 measured (x0.45–0.56)" in full and "/tune/" not in full


def test_a_missing_runs_folder_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model", "Qwen2.5-7B-Instruct", "--mode", "finetune", "--runs", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err.startswith(f"error: --runs {tmp_path / 'none'}: ")


def test_no_runs_of_the_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model", "Llama-3.1-70B", "--mode", "finetune", "--runs", str(tmp_path)]) == 0
    assert "0 of 0 run record(s)" in capsys.readouterr().out


def test_the_ranks_carry_the_runs_shape() -> None:
    """run.json keeps the estimate as it came: its shape is what the planner matches on."""
    from test_training_section import stack_yaml

    from workloads import finetune_progress

    cfg = config_model(stack_yaml("finetune"))
    env = finetune_progress.run_env(cfg, cfg.workloads["tune"])
    assert json.loads(env["FINETUNE_ESTIMATE"])["shape"] == SHAPE
    assert past_runs.shape_of({"estimate": {"shape": SHAPE}}) == past_runs.Shape("Qwen2.5-7B", "nvidia-l4", 8, True, 3)


def test_the_preview_says_how_to_copy_the_run_records() -> None:
    from preview.sections import training

    [(_, body)] = training.section(stack_run("finetune"))
    bucket = "gs://$(pulumi stack output bucket -s finetune)"
    assert ("for f in $(gcloud storage ls '" + bucket + "/models/*/run.json'); do "
            'd="runs/$(basename "$(dirname "$f")")"; mkdir -p "$d" && gcloud storage cp "$f" "$d/"; done') in body
    assert "RUNS=runs" in body
