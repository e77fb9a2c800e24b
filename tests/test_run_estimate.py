"""A run's time and cost before it starts (issue 29 item 1): tokens x FLOPs per token over the GPUs' peak dense
TFLOPS x an assumed MFU, with LoRA's and the ZeRO stages' measured speeds; hours and dollars per run at spot and
on-demand prices, beside $/h.

Every expected number is worked by hand in the comments, from the data files' values read here (never from
planner/run_estimate.py or planner/cost.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import DELETE, PROJECT_DIR, changed, config_model, seed, stack_run, yaml_load

from planner import cost, run_estimate
from planner.requests import mode_request
from planner.sizing import Strategy, resolve
from preview import summary
from preview.__main__ import SECTIONS
from preview.sections import render_sections

SEED = "004_f4f5c41d5745b6f2.txt"  # the GPT example this project started from (../shared/seeds)


def _data(name: str) -> dict[str, Any]:
    with open(PROJECT_DIR / "data" / name, encoding="utf-8") as fh:
        return yaml_load(fh)


@pytest.fixture(scope="module")
def speed() -> dict[str, Any]:
    return _data("training_speed.yaml")


@pytest.fixture(scope="module")
def catalog() -> dict[str, Any]:
    return _data("gpu_catalog.yaml")


# --- the facts -----------------------------------------------------------------------------------------------------

def test_peak_tflops_are_the_datasheets_dense_figures(catalog: dict[str, Any]) -> None:
    """NVIDIA quotes Ampere-and-later tensor throughput with 2:4 sparsity; training runs dense, at half of it."""
    peaks = {g: raw.get("peakTflops") for g, raw in catalog["gpus"].items()}
    assert peaks["nvidia-l4"] == {"fp32": 30.3, "fp16": 242 / 2, "bf16": 242 / 2}
    assert peaks["nvidia-tesla-a100"] == peaks["nvidia-a100-80gb"] == {"fp32": 19.5, "fp16": 624 / 2, "bf16": 624 / 2}
    for h in ("nvidia-h100-80gb", "nvidia-h100-mega-80gb", "nvidia-h200-141gb"):
        assert peaks[h] == {"fp32": 67, "fp16": 1979 / 2, "bf16": 1979 / 2}
    assert peaks["nvidia-b200"] == {"fp32": 80, "fp16": 4500 / 2, "bf16": 4500 / 2}
    assert peaks["nvidia-tesla-t4"] == {"fp32": 8.1, "fp16": 65}  # Turing: no sparsity, no bf16
    assert all(p is not None for p in peaks.values()), "every GPU of the catalog has its peaks"
    for g, p in peaks.items():  # a precision a GPU lacks has no peak, and one it has, has one
        assert ("bf16" in p) == catalog["gpus"][g]["bf16"], g


def test_the_seeds_measured_rates_are_the_data(speed: dict[str, Any]) -> None:
    """The GPT example this project started from: DeepSpeed's RunningAvgSamplesPerSec at step 2000 per setting;
    ZeRO-3 with CPU offload about a tenth of plain data parallelism's."""
    text = seed(SEED).read_text(encoding="utf-8")
    measured = [float(v) for v in __import__("re").findall(r"RunningAvgSamplesPerSec=([0-9.]+)", text)]
    rates = speed["strategies"]["samplesPerSecond"]
    # In the seed's order: no ZeRO, stage 1, 2, 3, 3 with offload, then stage 1 in fp16 (not used).
    expected = [rates[k] for k in ("zero0", "zero1", "zero2", "zero3", "zero3Offload")]
    assert [round(m, 2) for m in measured[:5]] == expected
    assert 0.09 < rates["zero3Offload"] / rates["zero0"] < 0.11  # 53.90 / 502.17 = 0.107


def test_flops_per_token_full_and_lora() -> None:
    """Full fine-tuning 6N (8N executed with recomputation: Narayanan et al.'s 96Bslh^2); LoRA 4N, 6N executed."""
    n = 7.62e9
    assert run_estimate.flops_per_token(n, lora=False, checkpointing=True) == (6 * n, 8 * n)
    assert run_estimate.flops_per_token(n, lora=False, checkpointing=False) == (6 * n, 6 * n)
    assert run_estimate.flops_per_token(n, lora=True, checkpointing=True) == (4 * n, 6 * n)
    assert run_estimate.flops_per_token(n, lora=True, checkpointing=False) == (4 * n, 4 * n)
    # LoRA measured x1.25 over full fine-tuning (Hu et al.); 6N / 4N promises x1.5: its FLOPs go 1.25 / 1.5 as fast.
    assert run_estimate.lora_efficiency() == pytest.approx(1.25 / 1.5)


@pytest.mark.parametrize(("strategy", "lora", "gpus", "expected"), [
    # Full fine-tuning pays every stage: ZeRO-3 = 357.69/502.17 x 242.05/357.69 x 140.71/242.05 = 140.71/502.17.
    (Strategy(3), False, 8, 140.71 / 502.17),
    (Strategy(2), False, 8, 242.05 / 502.17),
    (Strategy(0), False, 8, 1.0),
    # ZeRO-3 with both offloaded: 53.90 / 502.17 = 0.107, the seed's "about a tenth".
    (Strategy(3, offload_optimizer=True, offload_params=True), False, 8, 53.90 / 502.17),
    # Optimizer offload alone (not measured): the measured cost of both, 53.90 / 140.71, on top of ZeRO-2's.
    (Strategy(2, offload_optimizer=True), False, 8, 242.05 / 502.17 * 53.90 / 140.71),
    # LoRA: stages 1-2 and optimizer offload move only the adapters' states: no slowdown; ZeRO-3 gathers the base.
    (Strategy(2), True, 8, 1.0),
    (Strategy(3), True, 8, 140.71 / 242.05),
    (Strategy(3, offload_optimizer=True), True, 8, 140.71 / 242.05),
    # One GPU: nothing to exchange, only offload's copies to the CPU count.
    (Strategy(3), False, 1, 1.0),
    (Strategy(3, offload_optimizer=True, offload_params=True), False, 1, 53.90 / 140.71),
])
def test_strategy_factors(strategy: Strategy, lora: bool, gpus: int, expected: float) -> None:
    factors = run_estimate.strategy_factors(strategy, lora, gpus)
    product = 1.0
    for f in factors:
        product *= f.value
    assert product == pytest.approx(expected, rel=1e-9)


# --- the recipe: Pulumi.finetune.yaml ------------------------------------------------------------------------------

# tune: Qwen2.5-7B-Instruct (N = 7.62e9, data/models.yaml), LoRA with gradient checkpointing, ZeRO-3 on 2 x
# g2-standard-48 (8 L4s, bf16 peak 121 TFLOPS), datasetTokens 10,000,000 x epochs 3 = 3.0e7 tokens.
#   executed FLOPs   = 3.0e7 x 6 x 7.62e9                       = 1.3716e18
#   FLOP/s at MFU 1  = 8 x 121e12 x (1.25/1.5) x (140.71/242.05) = 9.68e14 x 0.833333 x 0.581326 = 4.689357e14
#   fast (0.46)      = 1.3716e18 / (4.689357e14 x 0.46) = 6358.5 s = 1.76626 h
#   slow (0.21)      = 1.3716e18 / (4.689357e14 x 0.21) = 13928 s = 3.86896 h
#   $/h spot         = 2 x 1.60 (g2-standard-48) + 0.134 (system e2-standard-4) + 0.10 (fee) + 1024 x 0.000274
#                      (Filestore basic HDD, 1 TiB) = 3.714576; on-demand: 2 x 4.00 + the rest = 8.514576
#   $ per run spot   = 1.76626 x 3.714576 = 6.5609 .. 3.86896 x 3.714576 = 14.3716
#   MFU              = 0.21 x 0.833333 x 0.581326 x 4/6 = 0.067821 .. 0.46 x ... = 0.148560
RECIPE_EXECUTED = 3.0e7 * 6 * 7.62e9
RECIPE_RATE = 8 * 121e12 * (1.25 / 1.5) * (140.71 / 242.05)
SPOT_PER_HOUR = 2 * 1.60 + 0.134 + 0.10 + 1024 * 0.000274
ON_DEMAND_PER_HOUR = 2 * 4.00 + 0.134 + 0.10 + 1024 * 0.000274


def _recipe_run(changes: dict[str, Any] | None = None) -> dict[str, Any]:
    return cost.stack_costs(config_model(changed("finetune", changes)))["runs"]["tune"]


def test_recipe_hours_dollars_and_mfu_by_hand() -> None:
    r = _recipe_run()
    fast, slow = RECIPE_EXECUTED / (RECIPE_RATE * 0.46) / 3600, RECIPE_EXECUTED / (RECIPE_RATE * 0.21) / 3600
    assert (fast, slow) == pytest.approx((1.76626, 3.86896), rel=1e-5)  # the comment's arithmetic
    assert r["tokens"] == 3.0e7
    assert r["hours"] == pytest.approx({"fast": fast, "slow": slow}, abs=1e-3)
    assert r["perHour"] == pytest.approx({"spot": SPOT_PER_HOUR, "onDemand": ON_DEMAND_PER_HOUR}, abs=1e-4)
    assert r["perRun"]["spot"] == pytest.approx({"fast": 6.56, "slow": 14.37}, abs=0.01)
    assert r["perRun"]["onDemand"] == pytest.approx({"fast": fast * ON_DEMAND_PER_HOUR,
                                                     "slow": slow * ON_DEMAND_PER_HOUR}, abs=0.01)
    share = 4 / 6 * (1.25 / 1.5) * (140.71 / 242.05)
    assert r["mfu"] == pytest.approx({"low": 0.21 * share, "high": 0.46 * share}, abs=1e-4)
    assert r["pays"] == "spot" and r["gpus"] == 8 and r["peakTflops"] == 121


def test_max_steps_trains_steps_x_global_batch_x_sequence() -> None:
    """maxSteps 100 x global batch (8 GPUs x micro batch 2 x accumulation 4 = 64) x 2048 = 13,107,200 tokens; the
    datasetTokens key is then not read."""
    r = _recipe_run({"workloads.tune.finetune.epochs": DELETE, "workloads.tune.finetune.maxSteps": 100})
    assert r["tokens"] == 100 * 64 * 2048
    assert "maxSteps 100" in r["tokensFrom"] and "upper bound" in r["tokensFrom"]
    # 1.31072e7 / 3.0e7 of the recipe's hours
    assert r["hours"]["fast"] == pytest.approx(1.76626 * 13_107_200 / 3.0e7, rel=1e-3)


def test_epochs_default_to_one_pass() -> None:
    r = _recipe_run({"workloads.tune.finetune.epochs": DELETE})
    assert r["tokens"] == 1.0e7 and "finetune.py's default" in r["tokensFrom"]


def test_no_token_count_says_which_key_to_set() -> None:
    """The failing input: data in the bucket, unreadable at preview, and no datasetTokens: no hours, and the key."""
    costs = cost.stack_costs(config_model(changed("finetune", {"workloads.tune.finetune.datasetTokens": DELETE})))
    r = costs["runs"]["tune"]
    assert "hours" not in r and "workloads.tune.finetune.datasetTokens" in r["missing"]
    assert "Run tune: time and cost unknown (set workloads.tune.finetune.datasetTokens" in cost.headline(costs)


def test_full_fine_tuning_costs_more_than_lora_on_the_same_gpus() -> None:
    """The recipe's 8 L4s with LoRA off (ZeRO-3 then needs offload to fit; the time alone here): 8N executed
    instead of 6N, no LoRA factor (LoRA's hours were divided by 1.25/1.5), and ZeRO-3 pays stages 1 and 2 too:
    hours x (8 / 6) x (1.25/1.5) x (140.71/242.05) / (140.71/502.17) = 1.3333 x 0.8333 x 2.0747 = x 2.3052."""
    model = resolve("Qwen2.5-7B")
    lora = run_estimate.estimate(3.0e7, mode_request("finetune", model), Strategy(3), 8, 121)
    full = run_estimate.estimate(3.0e7, mode_request("training", model), Strategy(3), 8, 121)
    assert lora.hours_fast == pytest.approx(1.76626, rel=1e-5)
    ratio = (8 / 6) * (1.25 / 1.5) * (140.71 / 242.05) / (140.71 / 502.17)
    assert full.hours_fast / lora.hours_fast == pytest.approx(ratio, rel=1e-9)
    assert ratio == pytest.approx(2.3052, rel=1e-4)


def test_headline_and_summary_print_hours_and_dollars_per_run_beside_per_hour() -> None:
    """`make preview STACK=finetune`: "about H h, $X per run" with the assumed MFU named, after the $/h."""
    run = stack_run("finetune")
    line = cost.headline(run.outputs["costs"])
    assert "**$3.71/h with training running**" in line
    assert "Run tune: **about 1.8–3.9 h, $6.56–$14.37 per run** (spot; on-demand $15.04–$32.94), at an assumed " \
           "MFU of 7%–15% (data/training_speed.yaml)" in line
    md = summary.markdown(run, [], 0, extra=render_sections(run, SECTIONS))
    assert line in md
    section = md.split("#### Estimated cost", 1)[1]
    assert "30,000,000 tokens (workloads.tune.finetune.datasetTokens 10,000,000 x 3 epoch(s))" in section
    assert "an assumed 21%–46% of peak x 0.83 for LoRA" in section and "0.58 for ZeRO-3" in section
    assert "about 1.8–3.9 h" in summary.text(run, [], 0, extra=render_sections(run, SECTIONS))


# --- the planner: make gpus ... TOKENS= / DATA= --------------------------------------------------------------------

def test_count_file_tokens_by_characters(tmp_path: Path) -> None:
    """3 records; prompt + response characters: (5 + 7) + (3 + 1) + (0 + 4) = 20 -> 20 / 4 = 5 tokens."""
    data = tmp_path / "train.jsonl"
    rows = [{"prompt": "hello", "response": "goodbye", "id": "x" * 50}, {"prompt": "abc", "response": "d"},
            {"prompt": "", "response": "wxyz"}]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    assert run_estimate.count_file_tokens(data, ["prompt", "response"]) == (20 / 4, 3, "fields prompt, response")
    text = tmp_path / "notes.txt"
    text.write_text("12345678\n\n1234\n", encoding="utf-8")  # 12 characters on 2 lines
    assert run_estimate.count_file_tokens(text) == (3.0, 2, "lines")


@pytest.mark.parametrize(("rows", "chars", "fmt"), [
    # OpenAI chat records: every turn's content (4 + 8 + 2), the id not.
    ([{"messages": [{"role": "system", "content": "sys."}, {"role": "user", "content": "question"},
                    {"role": "assistant", "content": "ok"}], "id": "x" * 50}], 14, "messages"),
    ([{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}], 7, "sharegpt"),
    # alpaca as finetune.py reads it as a chat: the instruction and input a line apart (3 + 1 + 2), the output (3).
    ([{"instruction": "sum", "input": "12", "output": "3.0"}], 9, "alpaca"),
    ([{"prompt": "abc", "completion": "de"}], 5, "prompt-completion"),
    ([{"text": "abcdefgh"}], 8, "text"),
])
def test_data_is_counted_by_the_format_finetune_reads(tmp_path: Path, rows: list[Any], chars: int, fmt: str) -> None:
    """Issue 36 item 7: `make gpus DATA=` recognises records as finetune.py does (its own finetune_data.py)."""
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert run_estimate.count_file_tokens(data) == (chars / 4, 1, f"{fmt} records")
    said = run_estimate.given_tokens(None, data).said
    assert f"({fmt} records)" in said and f"set finetune.datasetTokens: {chars / 4:.0f}" in said


def test_data_of_no_known_format_is_an_error_never_zero_tokens(tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"question": "q", "answer": "a"}) + "\n", encoding="utf-8")
    with pytest.raises(ValueError) as found:
        run_estimate.count_file_tokens(data)
    assert str(found.value) == (
        f"DATA={data}: record 1 has the fields answer, question: none of a format finetune.py reads (messages, "
        "conversations, instruction + output, prompt + completion, text); give FIELDS= the fields that train "
        "(finetune.promptField and responseField's), or TOKENS=")
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "q"}]}) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no assistant turn"):
        run_estimate.count_file_tokens(data)


@pytest.mark.parametrize(("name", "content", "says"), [
    ("train.parquet", "", "counts .jsonl, .json, .txt files"),
    ("train.jsonl", '{"a": 1}\nnot json\n', "not JSON lines (line 2"),
])
def test_count_file_tokens_refuses_what_it_cannot_read(tmp_path: Path, name: str, content: str, says: str) -> None:
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=__import__("re").escape(says)):
        run_estimate.count_file_tokens(path)


def test_estimate_of_one_l4_lora_by_hand() -> None:
    """Qwen2.5-7B LoRA, ZeRO-2 on 1 L4 (no factor but LoRA's): 1e7 tokens x 6 x 7.62e9 = 4.572e17 FLOPs over
    121e12 x 0.833333 x 0.46 = 4.638333e13 FLOP/s: 9857 s = 2.738 h; at 0.21: 5.998 h."""
    request = mode_request("finetune", resolve("Qwen2.5-7B"))
    e = run_estimate.estimate(1e7, request, Strategy(2), 1, 121)
    assert (e.hours_fast, e.hours_slow) == pytest.approx((2.738, 5.998), abs=1e-3)
    assert e.cost(0.71) == pytest.approx((2.738 * 0.71, 5.998 * 0.71), abs=1e-3)


def _gpus(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    from planner.__main__ import main
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_make_gpus_ranks_by_cost_per_run_and_says_when_cheapest_per_hour_is_not(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Llama-2-7B (N = 6.74e9) trained in full on 1e7 tokens, executed 8N per token with recomputation:
      8 x B200, ZeRO-0 (no factor): 1e7 x 8 x 6.74e9 = 5.392e17 / (8 x 2250e12 x 0.46 = 8.28e15) = 65.1 s = 0.0181 h,
        x $113.00/h = $2.04; at 0.21: 0.0396 h, $4.48.
      2 x L4 (2 x g2-standard-32, $3.46/h: the cheapest per hour), ZeRO-3 + optimizer offload: 53.90/502.17 = 0.10733;
        5.392e17 / (2 x 121e12 x 0.46 x 0.10733 = 1.19484e13) = 45,127 s = 12.5 h, x $3.46 = $43.37; at 0.21: 27 h."""
    code, out, _ = _gpus(capsys, "--model", "Llama-2-7B", "--mode", "training", "--tokens", "1e7")
    assert code == 0
    ranking = out.split("## By cost per run: 10,000,000 tokens (TOKENS=10,000,000 x 1 epoch(s))", 1)[1]
    first = ranking.splitlines()[3].split()
    assert first[:4] == ["8", "x", "B200", "180GB"] and "2.04–4.48" in first
    assert ("The cheapest per hour is not the cheapest per run: ZeRO-3 + optimizer offload on 2 x L4 (2 x "
            "g2-standard-32, 10.1 GB each) costs $3.46/h but $43.37–$95.01 per run (13–27 h); ZeRO-0 on 8 x B200 "
            "180GB (a4-highgpu-8g, 137.6 GB each) costs $113.00/h and $2.04–$4.48 per run") in ranking


def test_make_gpus_finetune_counts_a_local_data_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """100 records of 40 + 60 characters = 10,000 characters = 2,500 tokens; x 3 epochs = 7,500. The cheapest per
    hour (1 L4, LoRA at ZeRO-0) is the cheapest per run too."""
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": "p" * 40, "response": "r" * 60, "id": "x" * 9}) + "\n"
                            for _ in range(100)), encoding="utf-8")
    code, out, _ = _gpus(capsys, "--model", "Qwen2.5-7B", "--mode", "finetune", "--data", str(data),
                         "--fields", "prompt,response", "--epochs", "3")
    assert code == 0
    assert "## By cost per run: 7,500 tokens (DATA=" in out
    assert "100 records, 2,500 tokens counted as characters / 4 (fields prompt, response) x 3 epoch(s); set " \
           "finetune.datasetTokens: 2500" in out
    assert "The cheapest per hour is also the cheapest per run: ZeRO-0 on 1 x L4 (g2-standard-4" in out


@pytest.mark.parametrize(("argv", "says"), [
    (["--mode", "inference", "--tokens", "1e6"], "estimate a training run: give MODE=training or finetune"),
    (["--mode", "training", "--tokens", "0"], "TOKENS= and EPOCHS= must be more than 0"),
    (["--mode", "training", "--fields", "text"], "FIELDS= names the fields of DATA="),
])
def test_make_gpus_refuses_tokens_it_cannot_use(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                                argv: list[str], says: str) -> None:
    monkeypatch.setenv("DEEPSPEED_STACK_MAKE", "1")  # as the Makefile runs it: the messages name make's variables
    with pytest.raises(SystemExit) as exit_info:
        _gpus(capsys, "--model", "Llama-2-7B", *argv)
    assert exit_info.value.code == 2 and says in capsys.readouterr().err


def test_make_gpus_data_it_cannot_read_is_a_clear_error(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPSPEED_STACK_MAKE", "1")
    code, _, err = _gpus(capsys, "--model", "Llama-2-7B", "--mode", "training", "--data", str(tmp_path / "none.jsonl"))
    assert code == 2 and err.startswith(f"error: DATA={tmp_path / 'none.jsonl'}: No such file")


def test_write_puts_the_tokens_in_the_stack_and_its_header_agrees_with_the_preview(tmp_path: Path) -> None:
    """`make gpus MODEL=Qwen2.5-7B MODE=finetune TOKENS=1e7 EPOCHS=3 WRITE=est`: 1 L4 (LoRA, ZeRO-0: LoRA's factor
    only): 3e7 x 6 x 7.62e9 = 1.3716e18 / (121e12 x 0.833333 x 0.46 = 4.638333e13) = 29,571 s = 8.2 h; at 0.21:
    8.214 x 0.46 / 0.21 = 18 h. The written finetune.datasetTokens and epochs give the preview the same run."""
    from preview import write_stack as ws
    argv = ["--model", "Qwen2.5-7B", "--mode", "finetune", "--stack", "est", "--tokens", "1e7", "--epochs", "3",
            "--dir", str(tmp_path)]
    assert ws.main(argv) == 0
    text = (tmp_path / "Pulumi.est.yaml").read_text(encoding="utf-8")
    assert text.startswith("# est: written by `make gpus MODEL=Qwen2.5-7B MODE=finetune TOKENS=10000000 EPOCHS=3 "
                           "WRITE=est`")
    config = yaml_load(text)["config"]
    workload = config["deepspeed-stack:workloads"]["train"]  # and its server, `serve` (SERVE=1, finetune's default)
    assert (workload["finetune"]["datasetTokens"], workload["finetune"]["epochs"]) == (10_000_000, 3)
    run = cost.stack_costs(config_model(config))["runs"]["train"]
    assert run["hours"] == pytest.approx({"fast": 8.214, "slow": 17.993}, abs=1e-2)  # 8.214 x 0.46 / 0.21
    on_demand, spot = run["perRun"]["onDemand"], run["perRun"]["spot"]
    header = " ".join(line.lstrip("# ").strip() for line in text.splitlines() if line.startswith("#"))
    assert (f"Estimated run: 30,000,000 tokens (TOKENS=10,000,000 x 3 epoch(s)): about 8.2–18 h, "
            f"${on_demand['fast']:,.2f}–${on_demand['slow']:,.2f} per run on-demand, ${spot['fast']:,.2f}–"
            f"${spot['slow']:,.2f} spot") in header


def test_dataset_tokens_with_max_steps_warn_unread() -> None:
    import checks
    tune = "workloads.tune.finetune"
    with_steps = {f"{tune}.epochs": DELETE, f"{tune}.maxSteps": 100}
    assert checks.warnings(config_model(changed("finetune"))) == []  # epochs: read
    assert checks.warnings(config_model(changed("finetune", with_steps))) == [
        f"{tune}.datasetTokens: not used: with {tune}.maxSteps the run trains maxSteps x the global batch x "
        "sequenceLength tokens, what the preview's estimate counts"]
    assert checks.warnings(config_model(changed("finetune", {**with_steps, f"{tune}.datasetTokens": DELETE}))) == []
