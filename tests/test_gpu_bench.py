"""make gpu-bench's plain parts (e2e/gpu_bench.py, issue 37 item 2): the settings grid, finetune.py's arguments
(parsed by finetune.py's own parser), the ds_config per stage and micro batch, and the JSON lines it prints, read
back from a CPU stand-in's output. The run itself needs a GPU: docs/measurements.md says none has run yet."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
from conftest import PROJECT_DIR, load_file, yaml_load

ROOT = Path(__file__).resolve().parent.parent

# What finetune.py's progress callback prints on rank 0 at each logging step (recipes/finetune_progress.py
# progress_line), as a CPU run of the bench printed it (the first line: warm-up, left out of the median).
CPU_OUTPUT = """\
[2026-11-29 06:10:01] [INFO] [launch.py:139:main] WORLD INFO DICT: {'localhost': [0]}
[finetune] rank 0: step 2/6 (33 %), 210 tokens/s (210 per GPU), MFU 0.25%, ETA 9 s, loss 6.31
{'loss': '6.31', 'grad_norm': '0.71', 'learning_rate': '0.0001', 'epoch': '0.5'}
[finetune] rank 0: step 4/6 (66 %), 1,480 tokens/s (1,480 per GPU), MFU 1.78%, ETA 2 s, loss 6.29
[finetune] rank 0: step 6/6 (100 %), 1,520 tokens/s (1,520 per GPU), MFU 1.82%, ETA 0 s, loss 6.27
"""


@pytest.fixture(scope="module")
def gb() -> ModuleType:
    return load_file(ROOT / "e2e" / "gpu_bench.py", "gpu_bench_under_test")


@pytest.fixture(scope="module")
def ft() -> ModuleType:
    return load_file(ROOT / "recipes" / "finetune.py", "finetune_script_for_gpu_bench")


def test_no_heavy_import_at_module_level() -> None:
    top = [line for line in (ROOT / "e2e" / "gpu_bench.py").read_text().splitlines()
           if line.startswith(("import ", "from "))]
    assert not [line for line in top if any(m in line for m in ("torch", "transformers", "peft", "deepspeed"))]


def test_the_shapes_are_data_models_yaml(gb: ModuleType) -> None:
    with open(PROJECT_DIR / "data" / "models.yaml", encoding="utf-8") as fh:
        models = yaml_load(fh)["models"]
    for name, shape in gb.SHAPES.items():
        m = models[name]
        for key in ("layers", "hidden", "heads", "kvHeads", "vocab", "intermediate"):
            assert shape[key] == m[key], (name, key)
        assert shape["headDim"] == m.get("headDim", m["hidden"] // m["heads"])


def test_the_grid_is_two_models_two_stages_full_and_lora(gb: ModuleType) -> None:
    grid = gb.settings(list(gb.SHAPES))
    assert len(grid) == 8 and {s["model"] for s in grid} == {"Llama-3.2-1B", "Qwen2.5-7B"}
    assert {(s["zero"], s["training"]) for s in grid} == {(2, "full"), (2, "lora"), (3, "full"), (3, "lora")}
    assert gb.SEQ_LEN == 2048 and gb.MAX_MICRO_BATCH >= 8


@pytest.mark.parametrize("lora", [True, False])
def test_finetune_py_takes_the_bench_arguments(gb: ModuleType, ft: ModuleType, lora: bool) -> None:
    argv = gb.finetune_args(Path("/w/base"), Path("/w/data.jsonl"), Path("/w/ds.json"), Path("/w/ck"),
                            Path("/w/out"), "bf16", lora, 12, 2048)
    args = ft.parse_args(argv, {})
    assert (args.lora, args.gradient_checkpointing, args.precision, args.seq_len) == (lora, True, "bf16", 2048)
    assert (args.packing, args.max_steps, args.text_field) == ("on", 12, "text")
    assert args.save_steps > args.max_steps  # no save inside the measured steps
    if lora:
        assert args.lora_rank == 16


def test_the_stack_ds_config_per_stage_and_micro_batch(gb: ModuleType) -> None:
    gw = load_file(ROOT / "e2e" / "gpu_wheels.py", "gpu_wheels_for_bench")
    for stage in (2, 3):
        ds = gw.stack_ds_config("bf16", stage)
        assert ds["zero_optimization"]["stage"] == stage and ds["bf16"] == {"enabled": True}
        eight = gb.with_micro_batch(ds, 8)
        assert (eight["train_micro_batch_size_per_gpu"], eight["train_batch_size"]) == (8, 8)
        assert eight["zero_optimization"] == ds["zero_optimization"]
    assert set(gb.DS_CONFIGS.values()) >= {"ds_config_bf16.json", "ds_config_bf16_zero2.json"}


def test_the_json_lines_from_a_cpu_stand_in(gb: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    """The median after the warm-up line: (1480 + 1520) / 2 = 1500 tokens/s per GPU; LoRA's MFU on 4N against the
    given peak: 1500 x 4 x 1.5e5 / 0.05e12 = 0.018."""
    setting = {"model": "tiny-cpu", "zero": 3, "training": "lora"}
    line = gb.result(setting, 1, CPU_OUTPUT, 0, 1.5e5, 0.05, None, "cpu", 96)
    assert line["tokens_per_second_per_gpu"] == 1500.0 and line["mfu"] == pytest.approx(0.018)
    print(json.dumps(line))
    print("a log line the reader skips")
    oom = gb.result({**setting, "training": "full"}, 4, "torch.OutOfMemoryError: CUDA out of memory.", 1, 1.5e5, 0.05,
                    70.2, "NVIDIA H200", 2048)
    print(json.dumps(oom))
    read = gb.parse_lines(capsys.readouterr().out)
    assert [r["gpu_bench"] for r in read] == ["ok", "oom"]
    assert read[0]["micro_batch"] == 1 and read[0]["sequence_length"] == 96 and "mfu" not in read[1]
    assert gb.result(setting, 1, "no progress lines", 1, 1.5e5, 0.05, None, "cpu", 96)["gpu_bench"] == "fail"


def test_the_table_says_which_rows_are_ours() -> None:
    with open(PROJECT_DIR / "data" / "training_speed.yaml", encoding="utf-8") as fh:
        rows = yaml_load(fh)["throughput"]
    ours = [r for r in rows if r.get("ours")]
    assert ours and all(r["gpu"] == "cpu" for r in ours)  # none measured on a GPU yet: make gpu-bench fills them
