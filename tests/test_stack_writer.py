"""The planner writes the stack (issue 20.1): `make gpus MODEL=... MODE=... WRITE=<stack>` writes the cheapest plan
that the stack's checks accept as Pulumi.<stack>.yaml, with its reasons as comments, and it loads.

The grid (7B, 8B, 13B, 34B, 70B x training, inference) round-trips through the written text and checks.load in
memory; one written stack runs through the whole offline preview."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import config_problems, yaml_load

from checks import load
from model import catalog
from planner import stack_writer
from planner.model_catalog import resolve
from planner.requests import mode_request
from planner.sizing_types import Request
from preview import engine
from preview import write_stack as ws
from preview import write_stack_choice as wc
from preview import write_stack_header as wh
from preview.__main__ import main as preview_main

GRID_MODELS = ["Llama-2-7B", "Llama-3.1-8B", "Llama-2-13B", "34B", "Llama-2-70B"]
MODES = [stack_writer.TRAINING, stack_writer.INFERENCE]
REGION = "us-central1"


TOKEN = {"secure": "v1:planted"}  # `pulumi config set --secret hfToken ...`, the user's step for a gated model


def _written(model: str, mode: str, stack: str = "grid") -> tuple[wc.Choice, dict, str]:
    """The written config, with the token the header asks for when the model is gated (as the user sets it)."""
    request = Request(resolve(model), "bf16", mode, 2048, 1)
    choice = wc.choose(request, REGION, stack)
    header = wh.header(choice, request, REGION, stack, f"make gpus MODEL={model} MODE={mode} WRITE={stack}",
                       catalog.load())
    text = stack_writer.render(choice.candidate, header)
    config = yaml_load(text)["config"]
    if choice.gated_model:
        assert "`pulumi config set --secret hfToken hf_... -s grid`" in text
        config["deepspeed-stack:hfToken"] = TOKEN
    return choice, config, text


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model", GRID_MODELS)
def test_grid_round_trips_through_write_and_load(model: str, mode: str) -> None:
    choice, config, text = _written(model, mode)
    assert config_problems(config) == [], text  # what was written loads through every rule `make preview` runs
    option, strategy = choice.candidate.option, choice.candidate.strategy
    (pool,) = config["deepspeed-stack:nodePools"]
    assert (pool["gpu"]["type"], pool["machineType"], pool["gpu"]["count"]) == \
        (option.gpu_type, option.machine_type, option.gpus_per_node)
    assert pool["zones"] == [option.zones[0]] and pool["maxNodes"] == option.nodes
    (workload,) = config["deepspeed-stack:workloads"].values()
    assert workload["model"]["mode"] == mode and workload["pool"] == pool["name"]
    if mode == stack_writer.TRAINING:
        # The finetune kind training every parameter: its launcher waits for the data in the bucket (an MPIJob of
        # finetune.py with its data on a claim started before anyone could put the data there).
        assert workload["kind"] == "finetune" and workload["workers"] == option.nodes
        assert workload["finetune"]["lora"] == {"enabled": False}
        assert workload["finetune"]["datasetPath"] == "data/train.jsonl" and workload["gcsFuse"]["enabled"] is True
        # The plan's activations are sized with every layer recomputed: finetune.py is told to.
        assert workload["finetune"]["gradientCheckpointing"] is True
        ds = workload["deepspeed"]
        assert ds["zeroStage"] == strategy.zero_stage
        assert (ds["offloadOptimizer"] != "none", ds["offloadParams"] != "none") == \
            (strategy.offload_optimizer, strategy.offload_params)
        assert f"#   deepspeed: {strategy.label}: " in text
    else:
        assert workload["kind"] == "serve" and option.nodes == 1 and workload["serving"]["replicas"] == 1
        assert "#   serving: " in text
    # The cheapest: every cheaper option was refused by the checks (or the budget), each for a reason in the file.
    ranked = stack_writer.candidates(choice.candidate.option.estimate.request, REGION, "grid")
    cheaper = ranked[:ranked.index(choice.candidate)]
    assert [c.label for c, _ in choice.refused] == [c.label for c in cheaper]
    for candidate, _ in choice.refused[:3]:
        assert config_problems(candidate.config) != [], candidate.label
    # Every candidate is its option as written: all its nodes in the pool, a worker (or the replica) on each.
    for c in ranked[:5]:
        (p,) = c.config["deepspeed-stack:nodePools"]
        (w,) = c.config["deepspeed-stack:workloads"].values()
        assert (p["machineType"], p["maxNodes"], p["gpu"]["count"]) == \
            (c.option.machine_type, c.option.nodes, c.option.gpus_per_node), c.label
        assert w.get("workers", 1) == c.option.nodes if mode == stack_writer.TRAINING else c.option.nodes == 1


LORA_MULTI_NODE = {"Llama-2-13B": 2, "34B": 5, "Llama-2-70B": 5}


@pytest.mark.parametrize("writer", [stack_writer.TRAINING, stack_writer.FINETUNE])
@pytest.mark.parametrize("model", GRID_MODELS)
def test_every_multi_node_plan_the_writer_makes_passes_the_stacks_checks(model: str, writer: str) -> None:
    """Not only the one written: every candidate the writer makes (issue 32 item 9), the multi-node ones included,
    loads through the stack's own checks, so the cheapest plan is never passed over for a fault of the writer
    (A3 Ultra and A4 once got the default pd-balanced boot disk they cannot boot from; LoRA once got ZeRO-3
    parameter offload, which finetune.py refuses)."""
    request = mode_request(writer, resolve(model))
    ranked = stack_writer.candidates(request, REGION, "grid", writer=writer)
    multi = [c for c in ranked if c.option.nodes > 1]
    # Every parameter of 7B-70B: 14-17 multi-node plans each; LoRA's 34B and 70B 8 each, its 13B 2 (7B and 8B fit
    # one node of every GPU).
    assert len(multi) >= (10 if writer == stack_writer.TRAINING else LORA_MULTI_NODE.get(model, 0))
    refused = {}
    for c in ranked:
        config = dict(c.config)
        if wc.gated_model(c):
            config["deepspeed-stack:hfToken"] = TOKEN
        (pool,) = config["deepspeed-stack:nodePools"]
        (workload,) = config["deepspeed-stack:workloads"].values()
        assert (pool["maxNodes"], workload["workers"]) == (c.option.nodes, c.option.nodes), c.label
        if found := config_problems(config):
            refused[c.label] = found[0]
    assert refused == {}


def test_a_written_stack_previews(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`make gpus ... WRITE=llama8b` then `make preview STACK=llama8b`: the file, then the whole offline preview.
    Llama is gated: the preview refuses the file until the token the header names is set."""
    args = ["--model", "Llama-3.1-8B", "--mode", "inference", "--stack", "llama8b", "--dir", str(tmp_path)]
    assert ws.main(args) == 0
    out = capsys.readouterr().out
    path = tmp_path / "Pulumi.llama8b.yaml"
    assert out.startswith("wrote Pulumi.llama8b.yaml: ") and "`make preview STACK=llama8b`" in out
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# llama8b: written by `make gpus MODEL=Llama-3.1-8B MODE=inference WRITE=llama8b`")
    assert "`pulumi config set --secret hfToken hf_... -s llama8b`" in text
    argv = ["--stack", "llama8b", "--stack-file", str(path), "--out", str(tmp_path / "build")]
    assert preview_main(argv) == 2 and "is gated on Hugging Face" in capsys.readouterr().err
    written = yaml_load(text)
    written["config"]["deepspeed-stack:hfToken"] = TOKEN
    path.write_text(yaml.safe_dump(written), encoding="utf-8")
    assert preview_main(argv) == 0
    summary = (tmp_path / "build" / "llama8b" / "summary.md").read_text(encoding="utf-8")
    assert "with serving running" in summary.splitlines()[2]


def test_budget_skips_what_costs_more_and_says_when_nothing_fits() -> None:
    request = Request(resolve("Llama-3.1-8B"), "bf16", "inference", 2048, 1)
    free = wc.choose(request, REGION, "b")
    assert free.gated_model == "meta-llama/Llama-3.1-8B"  # checked with the user's token
    with pytest.raises(wc.NoPlanError, match=r"within the budget"):
        wc.choose(request, REGION, "b", budget=free.running_per_hour - 0.01)
    assert wc.choose(request, REGION, "b", budget=free.running_per_hour).candidate == free.candidate


def test_budget_is_compared_with_the_running_cost_not_the_floor() -> None:
    """BUDGET is the most $/h with the workload running, all its nodes up (issue 32 item 9), by hand from
    data/gpu_catalog.yaml: Llama-3.1-8B inference's cheapest plan is one g2-standard-4 (1 x L4, $0.71/h on-demand)
    beside the system pool's one e2-standard-4 ($0.134/h) and the GKE cluster fee ($0.10/h):
    running 0.71 + 0.134 + 0.10 = $0.944/h; at rest (the GPU pool at 0 nodes) 0.134 + 0.10 = $0.234/h.
    A budget between the two holds the floor but not the run: nothing is written."""
    request = Request(resolve("Llama-3.1-8B"), "bf16", "inference", 2048, 1)
    within = wc.choose(request, REGION, "b", budget=0.95)
    assert within.candidate.option.machine_type == "g2-standard-4" and within.refused == []
    assert within.running_per_hour == pytest.approx(0.944)
    assert within.floor_per_hour == pytest.approx(0.234)
    with pytest.raises(wc.NoPlanError, match=r"\$0\.94/h with the workload running, over the budget \$0\.90/h"):
        wc.choose(request, REGION, "b", budget=0.90)


def test_hugging_face_ids_and_placeholders() -> None:
    # Llama 2's bare repositories hold Meta's format; the `-hf` ones are what transformers and the servers load.
    assert stack_writer.hf_id("Llama-2-7B") == "meta-llama/Llama-2-7b-hf"
    assert stack_writer.hf_id("Llama-3.1-8B") == "meta-llama/Llama-3.1-8B"
    assert stack_writer.hf_id("34B") is None
    _, config, text = _written("34B", stack_writer.INFERENCE)
    assert config["deepspeed-stack:workloads"]["serve"]["serving"]["model"] == stack_writer.MODEL_PLACEHOLDER
    assert config["deepspeed-stack:workloads"]["serve"]["model"]["parameters"] == 34.0
    assert "stands in for the Hugging Face id of your model" in text


def test_write_refuses_an_existing_stack_and_unknown_modes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "Pulumi.dev.yaml").write_text("config: {}\n", encoding="utf-8")
    assert ws.main(["--model", "7B", "--mode", "inference", "--stack", "dev", "--dir", str(tmp_path)]) == 2
    assert "Pulumi.dev.yaml exists" in capsys.readouterr().err
    assert ws.main(["--model", "7B", "--mode", "inferense", "--stack", "x", "--dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().endswith("did you mean `inference`?")


def test_the_written_config_is_what_the_engine_loads() -> None:
    """The file's `config:` map goes through the same engine form the preview uses (objects as JSON)."""
    choice, config, _ = _written("Llama-2-7B", stack_writer.INFERENCE)
    engine_cfg, secret_keys = engine.engine_config_from_yaml(config)  # with the token: Llama 2 is gated
    pool = stack_writer.pool_name(choice.candidate.option.gpu_type)
    assert load(engine_cfg, set(secret_keys)).pool(pool).machine_type == choice.candidate.option.machine_type


@pytest.mark.parametrize("model", GRID_MODELS)
def test_finetune_grid_writes_the_finetune_kind_and_loads(model: str) -> None:
    """MODE=finetune: the plan LoRA needs (a training Request with the kind's LoRA), written as the finetune kind
    with that LoRA, its data, checkpoints and result in the stack's bucket; it loads through every rule `make
    preview` runs, which sizes it from its keys to the same numbers."""
    request = mode_request(stack_writer.FINETUNE, resolve(model))
    choice = wc.choose(request, REGION, "grid", writer=stack_writer.FINETUNE)
    header = wh.header(choice, request, REGION, "grid", f"make gpus MODEL={model} MODE=finetune WRITE=grid",
                       catalog.load())
    text = stack_writer.render(choice.candidate, header)
    config = yaml_load(text)["config"]
    if choice.gated_model:
        config["deepspeed-stack:hfToken"] = TOKEN
    assert config_problems(config) == [], text
    (workload,) = config["deepspeed-stack:workloads"].values()
    option, strategy = choice.candidate.option, choice.candidate.strategy
    assert workload["kind"] == "finetune" and workload["workers"] == option.nodes
    assert "launch" not in workload  # the kind's own finetune.py command line
    assert workload["finetune"]["lora"] == {"enabled": True, "rank": 16, "targetModules": ["all-linear"]}
    assert workload["finetune"]["gradientCheckpointing"] is True
    assert workload["finetune"]["datasetPath"] == "data/train.jsonl"
    assert workload["finetune"]["sequenceLength"] == 2048
    assert workload["gcsFuse"]["enabled"] is True and config["deepspeed-stack:storage"] == {"enabled": True}
    assert workload["deepspeed"]["zeroStage"] == strategy.zero_stage
    assert "#   finetune: LoRA rank 16 on all-linear (" in text


def test_write_finetune_mode_writes_a_file(tmp_path: Path) -> None:
    assert ws.main(["--model", "Llama-2-7B", "--mode", "finetune", "--stack", "ft", "--dir", str(tmp_path)]) == 0
    config = yaml_load((tmp_path / "Pulumi.ft.yaml").read_text())["config"]
    # The server of the result comes with it (SERVE=1, finetune's default).
    assert [w["kind"] for w in config["deepspeed-stack:workloads"].values()] == ["finetune", "serve"]
