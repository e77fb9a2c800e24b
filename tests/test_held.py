"""Plan for the GPUs you hold (issue 31 item 1, its first pieces): `make gpus GPUS=16xH100-MEGA` plans on those nodes
only, all of them used; `TOP=` reaches the planner."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import config_problems, yaml_load

from model import catalog
from planner import stack_writer
from planner.__main__ import main as planner_main
from planner.held import parse_held
from planner.model_catalog import resolve
from planner.recommend import recommend
from planner.requests import mode_request
from preview import write_stack

PROJECT_DIR = Path(__file__).resolve().parent.parent
MEGA = "nvidia-h100-mega-80gb"


@pytest.mark.parametrize(("spec", "gpu_type", "machine", "count", "nodes_of_8"), [
    ("16xH100-MEGA", MEGA, None, 16, 2),            # the persona's reservation: 16 GPUs, two 8-GPU machines
    ("16 x h100 mega 80gb", MEGA, None, 16, 2),
    ("2xa3-megagpu-8g", MEGA, "a3-megagpu-8g", 2, 2),  # a count before a machine type counts machines
    ("16*nvidia-h100-80gb", "nvidia-h100-80gb", None, 16, 2),
    ("H200", "nvidia-h200-141gb", None, None, None),  # no count: any number of nodes
    ("A100-80GB", "nvidia-a100-80gb", None, None, None),
])
def test_what_gpus_may_say(spec: str, gpu_type: str, machine: str | None, count: int | None,
                           nodes_of_8: int | None) -> None:
    held = parse_held(spec)
    assert (held.gpu_type, held.machine_type, held.count, held.nodes(8)) == (gpu_type, machine, count, nodes_of_8)


@pytest.mark.parametrize(("spec", "says"), [
    ("A100", "A100 is NVIDIA A100 40GB or NVIDIA A100 80GB; name one (nvidia-tesla-a100, nvidia-a100-80gb)"),
    ("12xH100-MEGA", "12 NVIDIA H100 Mega 80GB GPUs are no whole number of its machines (8 GPUs each)"),
    ("a3-megagpu", "is neither an accelerator (A100, B200, H100, H100-MEGA, H200, L4, P100, T4, V100, or a GKE type "
                   "such as nvidia-h100-mega-80gb) nor a machine type of data/gpu_catalog.yaml; did you mean "
                   "`a3-megagpu-8g`?"),
    ("0xH100", "the count must be at least 1"),
])
def test_what_it_refuses(spec: str, says: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPSPEED_STACK_MAKE", "1")  # as make runs it: the variable the user typed
    with pytest.raises(ValueError) as err:
        parse_held(spec)
    assert str(err.value).startswith(f"GPUS={spec!r}: ") and says in str(err.value)


def test_the_plan_uses_every_held_node_of_the_held_machine() -> None:
    """70B, every parameter: without GPUS the cheapest per hour is elsewhere (the issue: 15 single-L4 nodes); with
    GPUS=16xH100-MEGA each plan that fits is the two A3 Mega nodes, and the others say they do not fit there."""
    request = mode_request("training", resolve("Llama-3.1-70B"))
    anywhere = recommend(request, "us-central1", top=40)
    assert {o.gpu_type for p in anywhere for o in p.options} - {MEGA}
    held = recommend(request, "us-central1", top=40, held=parse_held("16xH100-MEGA"))
    options = [o for p in held for o in p.options]
    assert options and {(o.gpu_type, o.machine_type, o.nodes) for o in options} == {(MEGA, "a3-megagpu-8g", 2)}
    assert [p.strategy.label for p in held if p.options] == ["ZeRO-3 + optimizer offload",
                                                            "ZeRO-3 + optimizer and parameters offload"]


def test_make_gpus_says_it_plans_on_the_held_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    assert planner_main(["--model", "Llama-3.1-70B", "--mode", "training", "--gpus", "16xH100-MEGA"]) == 0
    out = capsys.readouterr().out
    assert ("On the capacity you hold only (GPUS=16xH100-MEGA): 16 x H100 Mega 80GB, all of them in every option (a "
            "reservation is paid whether its nodes work or not).") in out
    assert "## ZeRO-3\n  the held 16 x H100 Mega 80GB cannot hold it this way" in out
    assert "  16 x H100 Mega 80GB 2 x a3-megagpu-8g       19.9 of 80         188.00     75.20" in out
    assert planner_main(["--model", "Llama-3.1-70B", "--mode", "training", "--gpus", "A100"]) == 2
    assert "error: --gpus 'A100': A100 is NVIDIA A100 40GB or NVIDIA A100 80GB" in capsys.readouterr().err


def test_write_plans_on_the_held_nodes_and_the_stack_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--model", "Llama-3.1-70B", "--mode", "training", "--gpus", "16xH100-MEGA", "--stack", "big",
            "--dir", str(tmp_path)]
    assert write_stack.main(args) == 0
    assert "on 16 x H100 Mega 80GB (2 x a3-megagpu-8g" in capsys.readouterr().out
    text = (tmp_path / "Pulumi.big.yaml").read_text(encoding="utf-8")
    assert text.startswith("# big: written by `make gpus MODEL=Llama-3.1-70B MODE=training GPUS=16xH100-MEGA "
                           "WRITE=big`")
    assert "the cheapest option on the capacity you hold (16 x H100 Mega 80GB, every node used) that holds it" in \
        " ".join(line.lstrip("# ").strip() for line in text.splitlines())
    config = yaml_load(text)["config"]
    (pool,) = config["deepspeed-stack:nodePools"]
    assert (pool["machineType"], pool["maxNodes"]) == ("a3-megagpu-8g", 2)
    config["deepspeed-stack:hfToken"] = {"secure": "v1:planted"}  # Llama is gated: the header asks for it
    assert config_problems(config) == []


def test_write_says_when_the_held_nodes_hold_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--model", "Llama-3.1-405B", "--mode", "training", "--gpus", "1xa3-highgpu-1g", "--stack", "x",
            "--dir", str(tmp_path)]
    assert write_stack.main(args) == 2
    assert "no plan for Llama-3.1-405B in us-central1 on the held 1 x a3-highgpu-1g (--gpus 1xa3-highgpu-1g)" in \
        capsys.readouterr().err


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_passes_gpus_and_top_through() -> None:
    def dry(*variables: str) -> str:
        return subprocess.run(["make", "-n", "-s", "gpus", "MODEL=Llama-3.1-70B", "MODE=training", *variables],
                              cwd=PROJECT_DIR, capture_output=True, text=True, check=True).stdout

    planner = dry("GPUS=16xH100-MEGA", "TOP=40")
    assert "-m planner" in planner and '--gpus "16xH100-MEGA"' in planner and "--top 40" in planner
    written = dry("GPUS=16xH100-MEGA", "TOP=40", "WRITE=big")
    assert "preview.write_stack" in written and '--gpus "16xH100-MEGA"' in written and "--top" not in written


def test_the_writers_candidates_follow_the_held_capacity() -> None:
    request = mode_request("training", resolve("Llama-3.1-70B"))
    ranked = stack_writer.candidates(request, "us-central1", "big", held=parse_held("2xa3-megagpu-8g"))
    assert ranked and {(c.option.machine_type, c.option.nodes) for c in ranked} == {("a3-megagpu-8g", 2)}
    assert catalog.load().gpus[MEGA].shapes[0].machine_type == "a3-megagpu-8g"
