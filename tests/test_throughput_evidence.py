"""The run's estimate rests on measured runs (issue 37 item 1): data/training_speed.yaml's throughput rows, each with
its source and date, interpolated by model size; the range is the spread of the evidence, and the output names the
rows. Every expected number here is computed from the table read as YAML (never from planner/throughput.py)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from conftest import PROJECT_DIR, yaml_load

from planner import run_estimate, throughput
from planner.model_catalog import resolve
from planner.requests import mode_request
from planner.sizing_types import Strategy


def _data(name: str) -> dict[str, Any]:
    with open(PROJECT_DIR / "data" / name, encoding="utf-8") as fh:
        return yaml_load(fh)


SPEED, CATALOG = _data("training_speed.yaml"), _data("gpu_catalog.yaml")
ROWS = SPEED["throughput"]
GPU_ROWS = [r for r in ROWS if not r.get("toy")]


def _peak(row: dict[str, Any]) -> float:
    precision = "bf16" if row["precision"] == "fp8" else row["precision"]
    return CATALOG["gpus"][row["gpu"]]["peakTflops"][precision]


def _request(parameters: float, lora: bool) -> Any:
    model = resolve(None, float(parameters) / 1e9)
    return mode_request("finetune" if lora else "training", model)


def test_every_row_names_its_source_and_date_and_ours_are_flagged() -> None:
    for r in ROWS:
        assert r["source"] and r["date"] and r["tokensPerSecondPerGpu"] > 0, r["id"]
        assert r["gpu"] == "cpu" or r["gpu"] in CATALOG["gpus"], r["id"]
    ours = [r for r in ROWS if r.get("ours")]
    assert ours and all(r["gpu"] == "cpu" and r.get("toy") for r in ours)  # none measured on a GPU yet
    assert {r["id"].split("-")[0] for r in GPU_ROWS} >= {"torchtitan", "mlperf", "nemo"}


def test_a_rows_mfu_by_hand() -> None:
    """torchtitan Table 1, Llama 3.1 8B FSDP on 8 H100: 5,762 x 6 x 8.03e9 / 989.5e12 = 0.28056; Table 4's 70B at
    FP8, 829 / 1.28 = 647.66 tokens/s at bf16: x 6 x 70.55e9 / 989.5e12 = 0.27706."""
    speed = throughput.training_speed.load()
    rows = {r.id: r for r in speed.rows}
    assert throughput.row_mfu(rows["torchtitan-8b-fsdp-8xh100"]) == pytest.approx(0.28056, abs=1e-5)
    assert throughput.row_mfu(rows["torchtitan-70b-fsdp-tp-256xh100"]) == pytest.approx(0.27706, abs=1e-5)
    assert pytest.approx(SPEED["fp8OverBf16"], abs=1e-3) == 8532 / 6667  # torchtitan's Table 1, compile -> Float8


@pytest.mark.parametrize("row", GPU_ROWS, ids=[r["id"] for r in GPU_ROWS])
def test_each_published_configuration_estimate_contains_its_throughput_within_x2(row: dict[str, Any]) -> None:
    """The estimate of the row's own configuration (its model size, training, stack, GPU and GPU count) contains
    the row's tokens/s per GPU (an FP8 row's at FP8: the bf16 estimate x fp8OverBf16), and its high/low <= 2."""
    lora = row["training"] == "lora"
    tokens = 1e9
    e = run_estimate.estimate(tokens, _request(row["parameters"], lora), Strategy(3), row["gpus"], _peak(row),
                              gpu_type=row["gpu"], stack=row["stack"])
    fp8 = SPEED["fp8OverBf16"] if row["precision"] == "fp8" else 1.0
    # tokens/s per GPU from the hours, as a user reads them
    slow, fast = (tokens / (h * 3600) / row["gpus"] * fp8 for h in (e.hours_slow, e.hours_fast))
    assert slow * (1 - 1e-9) <= row["tokensPerSecondPerGpu"] <= fast * (1 + 1e-9)
    assert fast / slow <= 2
    assert row["id"] in e.evidence


def test_the_70b_case_lands_in_12_to_30_hours() -> None:
    """Llama-3.1-70B (N = 70.55e9) full fine-tuning on 2e9 tokens, 32 H100 Mega (989.5 TFLOPS bf16), ZeRO-3: the
    rows of its size are torchtitan's Table 4, 829 and 876 tokens/s at FP8, 647.66 and 684.38 at bf16, so
    2e9 / (32 x 684.38) / 3600 = 25.37 h .. 2e9 / (32 x 647.66) / 3600 = 26.81 h."""
    request = mode_request("training", resolve("Llama-3.1-70B"))
    e = run_estimate.estimate(2e9, request, Strategy(3), 32, 989.5, gpu_type="nvidia-h100-mega-80gb")
    fp8 = SPEED["fp8OverBf16"]
    assert e.hours_fast == pytest.approx(2e9 / (32 * 876 / fp8) / 3600, rel=1e-3)
    assert e.hours_slow == pytest.approx(2e9 / (32 * 829 / fp8) / 3600, rel=1e-3)
    assert 12 <= e.hours_fast <= e.hours_slow <= 30
    assert set(e.evidence) == {"torchtitan-70b-fsdp-tp-256xh100", "torchtitan-70b-fsdp-asynctp-256xh100"}
    assert any("same share of peak assumed on nvidia-h100-mega-80gb" in n for n in e.notes)


def test_between_two_sizes_the_range_is_interpolated_by_log_size() -> None:
    """A 24B model between the 8.03B rows (MFU 0.27292 .. 0.32457: 5,605 and 6,667 tokens/s) and the 70.55B rows
    (0.27706 .. 0.29277): t = ln(24 / 8.03) / ln(70.55 / 8.03); low = 0.27292 + t x (0.27706 - 0.27292)."""
    def mfu(tps: float, n: float) -> float:
        return tps * 6 * n / 989.5e12
    fp8 = SPEED["fp8OverBf16"]
    t = math.log(24 / 8.03) / math.log(70.55 / 8.03)
    low = mfu(5605, 8.03e9) + t * (mfu(829 / fp8, 70.55e9) - mfu(5605, 8.03e9))
    high = mfu(6667, 8.03e9) + t * (mfu(876 / fp8, 70.55e9) - mfu(6667, 8.03e9))
    ev = throughput.evidence(24e9, False, "nvidia-h100-80gb")
    assert (ev.mfu_low, ev.mfu_high) == pytest.approx((low, high), rel=1e-9)
    assert len(ev.rows) == 6 and not ev.notes  # the 8B rows and the 70B rows, on the rows' own GPU


def test_lora_without_a_data_parallel_row_converts_full_rows_by_hu_et_al() -> None:
    """No DeepSpeed/FSDP LoRA row yet: the full rows' tokens/s x 1.25 (Hu et al.), on 4N: MFU x 1.25 x 4 / 6."""
    full = throughput.evidence(8.03e9, False, "nvidia-h100-80gb")
    lora = throughput.evidence(8.03e9, True, "nvidia-h100-80gb")
    factor = SPEED["lora"]["speedupOverFull"] * 4 / 6
    assert (lora.mfu_low, lora.mfu_high) == pytest.approx((full.mfu_low * factor, full.mfu_high * factor))
    assert lora.rows == full.rows and "Hu et al." in lora.notes[0]
    megatron = throughput.evidence(68.98e9, True, "nvidia-h100-80gb", stack="megatron")
    assert "mlperf-v4.0-llama2-70b-lora-8xh100" in megatron.rows  # asked for: the Megatron rows


def test_offload_is_the_one_factor_left_and_says_so() -> None:
    """ZeRO-3 + CPU offload: the GPT example's 53.90 / 140.71 = 0.383 of the rows' MFU."""
    plain = throughput.evidence(8.03e9, False, "nvidia-h100-80gb")
    offload = throughput.evidence(8.03e9, False, "nvidia-h100-80gb", offload=True)
    ratio = SPEED["offload"]["samplesPerSecond"]["zero3Offload"] / SPEED["offload"]["samplesPerSecond"]["zero3"]
    assert offload.mfu_low == pytest.approx(plain.mfu_low * ratio) and ratio == pytest.approx(0.383, abs=1e-3)
    assert any("offload" in n for n in offload.notes)


def test_toy_cpu_rows_never_reach_a_gpu_estimate_and_only_they_reach_a_cpu_one() -> None:
    toy = {r["id"] for r in ROWS if r.get("toy")}
    for lora in (False, True):
        for n in (1.5e5, 1e9, 7e9, 70e9):
            assert not set(throughput.evidence(n, lora, "nvidia-l4").rows) & toy
    cpu = throughput.evidence(1.5e5, True, "cpu")
    assert set(cpu.rows) == toy and not cpu.notes
    # the CPU rows' MFU against the stand-in peak: 227 x 4 x 1.5e5 / 0.05e12 = 0.002724
    assert cpu.mfu_low == pytest.approx(227 * 4 * 1.5e5 / (SPEED["cpuPeakTflops"] * 1e12))
