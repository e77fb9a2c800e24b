"""make gpu-check's plain parts (e2e/gpu_check.py, e2e/gpu_wheels.py): the wheel folder's rules, the finetune.py
command it runs, the stack's ds_config it passes, and which greedy-token comparisons fail the check. The run itself
needs torch (and a GPU): docs/measurements.md "GPU check" records it."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from conftest import load_file

from recipes import finetune_args as fa

ROOT = Path(__file__).resolve().parent.parent
WANTED = {"deepspeed": "0.19.8", "datasets": "5.2.0", "pydantic-core": "2.50.5"}
GOOD = ["deepspeed-0.19.8.tar.gz", "datasets-5.2.0-py3-none-any.whl",
        "pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        "ds_config_bf16.json"]


@pytest.fixture(scope="module")
def gc() -> ModuleType:
    return load_file(ROOT / "e2e" / "gpu_check.py", "gpu_check_under_test")


@pytest.fixture(scope="module")
def ft() -> ModuleType:
    return load_file(ROOT / "recipes" / "finetune.py", "finetune_script_for_gpu_check")


def test_no_heavy_import_at_module_level() -> None:
    top = [line for line in (ROOT / "e2e" / "gpu_check.py").read_text().splitlines()
           if line.startswith(("import ", "from "))]
    assert not [line for line in top if any(m in line for m in ("torch", "transformers", "peft", "deepspeed"))]


def test_a_complete_wheel_folder_passes(gc: ModuleType) -> None:
    assert gc.wheel_problems(GOOD, WANTED) == []


@pytest.mark.parametrize(("files", "expected"), [
    (GOOD[1:], "no deepspeed==0.19.8 in the wheel folder (make gpu-wheels)"),
    ([*GOOD, "datasets-5.1.0-py3-none-any.whl"],
     "datasets: 2 files (datasets-5.2.0-py3-none-any.whl, datasets-5.1.0-py3-none-any.whl); keep one"),
    (["deepspeed-0.19.7.tar.gz", *GOOD[1:]], "deepspeed: deepspeed-0.19.7.tar.gz is not version 0.19.8"),
    (["deepspeed-0.19.8-py3-none-any.whl", *GOOD[1:]],
     "deepspeed: deepspeed-0.19.8-py3-none-any.whl is not the sdist (built on the device against its torch)"),
])
def test_wheel_folder_problems(gc: ModuleType, files: list[str], expected: str) -> None:
    assert gc.wheel_problems(files, WANTED) == [expected]


def test_finetune_py_takes_the_check_arguments_as_zero3_bf16_lora(gc: ModuleType, ft: ModuleType) -> None:
    """The arguments parse with finetune.py's own parser and ask for what item 5 names, with nothing it refuses."""
    argv = gc.finetune_args(Path("/w/base"), Path("/w/data.jsonl"), Path("/w/ds.json"), Path("/w/ck"),
                            Path("/w/out"), "bf16", 20, "merged")
    args = ft.parse_args(argv, {})
    assert (args.lora, args.gradient_checkpointing, args.precision, args.lora_export) == (True, True, "bf16", "merged")
    assert (args.deepspeed, args.model, args.dataset, args.max_steps, args.save_steps) == (
        "/w/ds.json", "/w/base", "/w/data.jsonl", 20, 20)
    assert (args.prompt_field, args.response_field, args.checkpoint_dir, args.model_dir) == (
        "prompt", "response", "/w/ck", "/w/out")
    assert fa.argument_problems(args) == []


def test_the_launcher_runs_finetune_py_on_one_gpu(gc: ModuleType) -> None:
    command = gc.launcher_command("/py", 29511, ["--lora"])
    assert command == ["/py", "-m", "deepspeed.launcher.runner", "--num_gpus", "1", "--master_port", "29511",
                       str(ROOT / "recipes" / "finetune.py"), "--lora"]


def test_cpu_mode_selects_deepspeeds_cpu_accelerator_and_gpu_mode_does_not(gc: ModuleType) -> None:
    assert gc.launch_env({"PATH": "/bin"}, cpu=True)["DS_ACCELERATOR"] == "cpu"
    gpu = gc.launch_env({"PATH": "/bin"}, cpu=False)
    assert "DS_ACCELERATOR" not in gpu and gpu["HF_HUB_OFFLINE"] == "1" and gpu["PATH"] == "/bin"


def _tokens(**changed: list[int]) -> dict[str, list[int]]:
    same = list(range(12))
    return {"merged_export": same, "merged_in_memory": same, "adapter_on_base": same, "adapter_merged": same,
            **changed}


def test_equal_tokens_pass(gc: ModuleType) -> None:
    assert gc.token_problems(_tokens(), "bf16") == []


def test_a_merged_export_unlike_its_in_memory_merge_fails(gc: ModuleType) -> None:
    problems = gc.token_problems(_tokens(merged_in_memory=[0] * 12), "bf16")
    assert len(problems) == 1 and problems[0].startswith("merged export's greedy tokens")


def test_the_unmerged_adapter_must_match_in_fp32_only(gc: ModuleType) -> None:
    """In bf16 the merged weights are rounded, so a near-tied argmax may move: reported by the run, not failed."""
    assert gc.token_problems(_tokens(adapter_on_base=[1] * 12), "bf16") == []
    assert gc.token_problems(_tokens(adapter_on_base=[1] * 12), "fp32") == [
        f"adapter export on the base (peft) {[1] * 12} != the same adapter merged {list(range(12))}"]


def test_too_few_tokens_fail(gc: ModuleType) -> None:
    short = list(range(5))
    assert gc.token_problems(_tokens(merged_export=short, merged_in_memory=short), "bf16") == [
        "5 new tokens, expected 12"]


def test_the_step_an_export_names(gc: ModuleType, tmp_path: Path) -> None:
    (tmp_path / ".complete").write_text('{"step": 21, "export": "merged"}')
    assert gc.exported_step(tmp_path) == 21


def test_both_exports_must_name_the_last_step(gc: ModuleType) -> None:
    """The merged run resumes at step 20 of 20 and exports it untrained; step 21 was finetune.py's old bug."""
    assert gc.step_problems(20, 20, steps=20) == []
    assert gc.step_problems(20, 21, steps=20) == ["the merged export names step 21, expected 20 (--max-steps)"]


def test_result_line_is_one_json_line_naming_pass_or_fail(gc: ModuleType) -> None:
    assert gc.result_line([], steps=20) == '{"gpu_check": "pass", "steps": 20, "problems": []}'
    assert gc.result_line(["x"], steps=20) == '{"gpu_check": "fail", "steps": 20, "problems": ["x"]}'


def test_losses_read_from_the_trainers_log(gc: ModuleType) -> None:
    log = "{'loss': '6.214', 'grad_norm': '1.2'}\n{'loss': 5.5, 'epoch': 1}\n"
    assert gc.losses(log) == [6.214, 5.5]


@pytest.fixture(scope="module")
def gw(gc: ModuleType) -> ModuleType:
    sys.modules.setdefault("e2e.gpu_check", gc)
    return load_file(ROOT / "e2e" / "gpu_wheels.py", "gpu_wheels_under_test")


def test_the_wheels_are_data_versions_pins_and_gpu_check_yaml(gw: ModuleType) -> None:
    versions = yaml.safe_load((ROOT / "data" / "versions.yaml").read_text())["python"]
    pins = gw.pins()
    assert (pins["deepspeed"], pins["datasets"]) == (versions["deepspeed"], versions["datasets"])
    assert pins["pydantic"] == "2.14.4" and pins["multiprocess"] == "0.70.19"


def test_the_check_passes_the_stacks_zero3_config(gw: ModuleType) -> None:
    bf16 = gw.stack_ds_config("bf16")
    assert bf16["zero_optimization"]["stage"] == 3
    assert bf16["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    assert bf16["bf16"] == {"enabled": True}
    assert (bf16["train_micro_batch_size_per_gpu"], bf16["train_batch_size"]) == (4, 4)
    fp32 = gw.stack_ds_config("fp32")
    assert "bf16" not in fp32 and "fp16" not in fp32


def test_packing_asks_finetune_py_for_padding_free_batches(gc: ModuleType) -> None:
    argv = gc.finetune_args(Path("/w/base"), Path("/w/data.jsonl"), Path("/w/ds.json"), Path("/w/ck"),
                            Path("/w/out"), "bf16", 20, "adapter", packing=True)
    assert argv[argv.index("--packing") + 1] == "on"
    plain = gc.finetune_args(Path("/w/base"), Path("/w/data.jsonl"), Path("/w/ds.json"), Path("/w/ck"),
                             Path("/w/out"), "bf16", 20, "adapter")
    assert "--packing" not in plain  # finetune.py's auto: off for prompt/response records


@pytest.mark.parametrize(("max_diff", "fails"), [
    ({"fp32": 2e-6, "bf16": 0.03}, False),   # bf16 rounding is reported, not failed
    ({"fp32": 0.5, "bf16": 0.5}, True),      # one record saw the other
    ({"bf16": 0.0}, True),                   # no fp32 comparison ran
])
def test_flattened_logits_must_match_in_fp32(gc: ModuleType, max_diff: dict[str, float], fails: bool) -> None:
    assert bool(gc.packed_problems(max_diff)) is fails
