"""One memory model for every kind (issue 32 item 2): the finetune kind sized from its own keys, LoRA as LoRA, the
same numbers in `make gpus MODE=finetune`, checkpoints that hold what trains. Every expected number is worked out
here by hand from data/models.yaml's shapes (the sources of each constant: planner/sizing.py's docstring)."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import DELETE, PROJECT_DIR, config_problems, model, problems, stack_run, yaml_load

from checks import planner as checks_planner
from model.config_schema import schema as load_schema
from model.problems import lines
from planner import recovery, requests
from planner.__main__ import main as planner_main
from planner.model_catalog import Lora, lora_parameters, resolve
from planner.sizing import estimate
from planner.sizing_types import GB, Request, Strategy
from preview.sections.recovery import section as preemption_recovery
from preview.write_stack import main as planner_write

T = "workloads.tune"  # Pulumi.finetune.yaml: Qwen2.5-7B-Instruct, LoRA r16 all-linear, ZeRO-3, 2 x 4 L4, bf16

# Qwen2.5-7B (data/models.yaml): 7.62B parameters, 28 layers, hidden 3584, 28 heads and 4 KV heads of 128,
# MLP 18944, vocabulary 152064.
QWEN_P, QWEN_LAYERS, QWEN_H, QWEN_KV, QWEN_I, QWEN_V = 7.62e9, 28, 3584, 4 * 128, 18944, 152064
# LoRA r16 on its seven linear layers: q (3584 -> 3584), k and v (3584 -> 512), o (3584 -> 3584), gate and up
# (3584 -> 18944), down (18944 -> 3584).
QWEN_ADAPTER = QWEN_LAYERS * 16 * (2 * (QWEN_H + QWEN_H) + 2 * (QWEN_H + QWEN_KV) + 3 * (QWEN_H + QWEN_I))
# The example's run: micro batch 2 x sequence 2048 on each of 8 GPUs.
TOKENS, GPUS = 2 * 2048, 8


# --- the adapter -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "lora", "expected"), [
    # Llama-2-7B: 32 layers of q, k, v, o (4096 -> 4096) and gate, up, down (4096 <-> 11008):
    # 32 x 16 x (4 x 8192 + 3 x 15104) = 39,976,960 (what peft prints as "trainable params" for it).
    ("Llama-2-7B", Lora(16), 32 * 16 * (4 * (4096 + 4096) + 3 * (4096 + 11008))),
    # The LoRA paper's choice, q and v only, rank 8: 32 x 8 x 2 x 8192 = 4,194,304.
    ("Llama-2-7B", Lora(8, ("q_proj", "v_proj")), 32 * 8 * 2 * (4096 + 4096)),
    # A dotted target is matched by its last part, as peft matches a module name's end.
    ("Llama-2-7B", Lora(8, ("self_attn.q_proj", "v_proj")), 32 * 8 * 2 * (4096 + 4096)),
    ("Qwen2.5-7B", Lora(16), 40_370_176),
    # Llama-3.1-8B: GQA, k and v 4096 -> 8 x 128 = 1024; MLP 14336.
    ("Llama-3.1-8B", Lora(16), 32 * 16 * (2 * (4096 + 4096) + 2 * (4096 + 1024) + 3 * (4096 + 14336))),
    # Mixtral in transformers 5.19: the experts and the router are nn.Parameter tensors: the attention's 4 only.
    ("Mixtral-8x7B", Lora(16), 32 * 16 * (2 * (4096 + 4096) + 2 * (4096 + 1024))),
    # Falcon-7B: fused query_key_value 4544 -> (71 + 2 x 1) x 64 = 4672, dense, and the 4544 <-> 18176 MLP.
    ("Falcon-7B", Lora(16), 32 * 16 * ((4544 + 4672) + (4544 + 4544) + 2 * (4544 + 18176))),
    # GPT-2: Conv1D c_attn 768 -> 2304, attn c_proj, c_fc 768 -> 3072 and mlp c_proj; "c_proj" names both.
    ("gpt2", Lora(16), 12 * 16 * ((768 + 2304) + (768 + 768) + (768 + 3072) + (3072 + 768))),
    ("gpt2", Lora(4, ("c_proj",)), 12 * 4 * ((768 + 768) + (3072 + 768))),
    # A name no layer of the model has trains nothing.
    ("Llama-2-7B", Lora(16, ("c_attn",)), 0),
])
def test_adapter_parameters_by_hand(name: str, lora: Lora, expected: int) -> None:
    assert lora_parameters(resolve(name).shape, lora) == expected


def test_every_model_has_an_architecture_of_known_widths() -> None:
    with open(PROJECT_DIR / "data" / "models.yaml", encoding="utf-8") as fh:
        doc = yaml_load(fh)
    widths = {"hidden", "q", "kv", "qkv", "intermediate"}
    for name, layers in doc["architectures"].items():
        assert layers and all(len(layer) == 3 and {layer[1], layer[2]} <= widths for layer in layers), name
    for name, entry in doc["models"].items():
        assert entry.get("architecture", "llama") in doc["architectures"], name


def test_qwen_adapter_by_hand() -> None:
    assert QWEN_ADAPTER == 40_370_176


def test_the_command_line_lora_is_the_kinds_default() -> None:
    """`make gpus MODE=finetune` sizes the finetune kind as it comes (model/schema.yaml's defaults)."""
    schema = load_schema()
    ft = schema["properties"]["workloads"]["additionalProperties"]["allOf"]
    branch = next(b["then"] for b in ft if b["then"].get("x-kind") == "finetune")["properties"]["finetune"]
    lora = branch["properties"]["lora"]["properties"]
    assert Lora(lora["rank"]["default"], tuple(lora["targetModules"]["default"])) == requests.FINETUNE_LORA
    assert requests.FINETUNE_GRADIENT_CHECKPOINTING is branch["properties"]["gradientCheckpointing"]["default"]


# --- the estimate ------------------------------------------------------------------------------------------------

def _lora_request(checkpointing: bool = True) -> Request:
    return Request(resolve("Qwen2.5-7B"), "bf16", "training", 2048, 2, lora=Lora(16),
                   gradient_checkpointing=checkpointing)


def test_lora_at_zero3_by_hand() -> None:
    """The finetune recipe on 8 L4s: ZeRO-3 partitions the frozen base and the adapters' states over 8 ranks."""
    est = estimate(_lora_request(), Strategy(3), 4, 2)
    assert est.parts == pytest.approx({
        "frozen weights": 2 * QWEN_P / GPUS,  # 1.905 GB of bf16 base, one eighth each
        "gathered layer": 2 * QWEN_V * QWEN_H,  # the embedding, 152064 x 3584, weights only (frozen: no gradient)
        "adapter weights": 2 * QWEN_ADAPTER / GPUS,
        "adapter gradients": 0.0,  # ZeRO-3 reduces straight into the fp32 partition
        "adapter fp32 gradients": 4 * QWEN_ADAPTER / GPUS,
        "adapter optimizer states": 12 * QWEN_ADAPTER / GPUS,  # fp32 master + Adam's two moments
        # Checkpointing: each layer's 16-bit input + one layer's 34 x s x b x h; fp32 logits and their gradient.
        "activations": TOKENS * QWEN_H * (2 * QWEN_LAYERS + 34) + 8 * TOKENS * QWEN_V,
        "buckets": 2 * QWEN_ADAPTER,  # the reduce bucket never larger than what trains
        "CUDA context": 0.5e9,
    })
    assert est.per_gpu_gb == pytest.approx(9.9706, abs=1e-4)


def test_lora_without_gradient_checkpointing_keeps_every_layers_activations() -> None:
    # Korthikanti et al.: 34 x s x b x h per layer, all 28 kept: 13.98 GB, + 4.98 GB of logits.
    est = estimate(_lora_request(checkpointing=False), Strategy(3), 4, 2)
    assert est.parts["activations"] == pytest.approx(34 * TOKENS * QWEN_H * QWEN_LAYERS + 8 * TOKENS * QWEN_V)
    assert est.per_gpu_gb == pytest.approx(22.625, abs=1e-3)


def test_lora_below_zero3_replicates_the_frozen_base() -> None:
    # ZeRO-2: the bf16 base whole on every GPU; the adapters' gradients and optimizer states partitioned.
    est = estimate(_lora_request(), Strategy(2), 4, 2)
    assert est.parts["frozen weights"] == pytest.approx(2 * QWEN_P)
    assert est.parts["gathered layer"] == 0
    assert est.parts["adapter weights"] == pytest.approx(2 * QWEN_ADAPTER)
    assert est.parts["adapter gradients"] == pytest.approx(2 * QWEN_ADAPTER / GPUS)
    assert est.parts["adapter optimizer states"] == pytest.approx(12 * QWEN_ADAPTER / GPUS)
    assert est.parts["buckets"] == pytest.approx(2 * 2 * QWEN_ADAPTER)  # reduce + allgather, each capped
    # Optimizer offload moves the adapters' fp32 states to the CPU: DeepSpeed's estimate for what trains.
    offload = estimate(_lora_request(), Strategy(2, offload_optimizer=True), 4, 2)
    assert offload.parts["adapter optimizer states"] == 0
    assert offload.cpu_bytes_per_node == pytest.approx(QWEN_ADAPTER * max(4 * GPUS, 16) * 1.5)


def test_lora_is_never_planned_with_parameter_offload() -> None:
    # finetune.py refuses LoRA with ZeRO-3 parameter offload (combination_problems): no plan offers it.
    assert not any(s.offload_params for s in _lora_request().strategies())
    assert any(s.offload_params for s in Request(resolve("Qwen2.5-7B")).strategies())


# --- the finetune kind at preview ----------------------------------------------------------------------------------

def test_the_recipe_is_sized_from_its_finetune_keys() -> None:
    """No `model` block: finetune.model (an alias in data/models.yaml), LoRA, sequenceLength and the micro batch."""
    sized = {s.name: s for s in checks_planner.sized_workloads(model("finetune"))}
    est = sized["tune"].estimate
    assert (est.request.lora, est.request.sequence_length, est.request.batch_size) == (Lora(16), 2048, 2)
    assert (est.strategy, est.gpus_per_node, est.nodes) == (Strategy(3), 4, 2)
    assert est.per_gpu_gb == pytest.approx(9.9706, abs=1e-4)
    assert checks_planner.warnings(model("finetune")) == []


def test_full_fine_tuning_that_cannot_fit_is_refused_with_what_would() -> None:
    """Every parameter of Qwen2.5-7B under ZeRO-3 on 8 L4s, by hand: 18 x 7.62e9 / 8 = 17.15 GB of model states,
    + the embedding's weights and gradients gathered 4 x 545.0M = 2.18 GB, + activations 6.30 GB, + a 500M-element
    bf16 bucket 1.0 GB, + 0.5 GB: 27.1 GB of an L4's 24."""
    (found,) = problems("finetune", {f"{T}.finetune.lora.enabled": False})
    assert found.startswith(f"{T}.finetune.model: Qwen2.5-7B (7.62B parameters) bf16 training at ZeRO-3 (every "
                            "parameter, with gradient checkpointing; micro batch 2 x sequence 2048) needs 27.1 GB per "
                            "GPU (")
    assert "nvidia-l4 has 24 GB (2 workers x 4 GPUs). Fits with 10% headroom: ZeRO-3 + optimizer offload on 8 x L4 " \
           "(2 workers x 4; 11.9 GB each)" in found
    assert "ZeRO-3 on 12 x L4 (3 workers x 4; 21.4 GB each)" in found
    assert "`make gpus MODEL=Qwen2.5-7B MODE=training " in found
    # What it says fits does: the optimizer offloaded (within the pod's memory), or a third worker.
    assert problems("finetune", {f"{T}.finetune.lora.enabled": False, f"{T}.deepspeed.offloadOptimizer": "cpu"}) == []
    assert problems("finetune", {f"{T}.finetune.lora.enabled": False, f"{T}.workers": 3,
                                 "nodePools[0].maxNodes": 3}) == []


def test_without_gradient_checkpointing_the_error_says_to_turn_it_on() -> None:
    # Every parameter, no recomputation: 28 layers x 34 x 4096 x 3584 = 13.98 GB more activations: 39.8 GB.
    (found,) = problems("finetune", {f"{T}.finetune.lora.enabled": False, f"{T}.finetune.gradientCheckpointing": False})
    assert "without gradient checkpointing; micro batch 2 x sequence 2048) needs 39.8 GB per GPU" in found
    assert f"With gradient checkpointing ({T}.finetune.gradientCheckpointing: true) it fits: ZeRO-3 + optimizer " \
           "offload on 8 x L4 (2 workers x 4; 11.9 GB each)" in found


def test_lora_without_gradient_checkpointing_fits_tightly() -> None:
    # 22.6 GB of 24: 5.7 % free, under the 10 % the planner keeps: a warning, not an error.
    m = model("finetune", {f"{T}.finetune.gradientCheckpointing": False})
    (warning,) = lines(checks_planner.warnings(m))
    assert warning.startswith(f"{T}.finetune.model: Qwen2.5-7B (7.62B parameters) bf16 training at ZeRO-3 (LoRA rank "
                              "16 on all-linear (40.37M adapter parameters, the base frozen), without gradient "
                              "checkpointing; micro batch 2 x sequence 2048) needs 22.6 GB per GPU of nvidia-l4's "
                              "24 GB, 5.7% headroom")


def test_a_model_block_names_the_shape_and_the_run_keys_size_it() -> None:
    # A bucket folder with the model it holds: sized as that model, at the finetune keys' sequence (not the
    # model block's default 2048) and the ds_config's micro batch.
    keys = {f"{T}.finetune.model": DELETE, f"{T}.finetune.modelPath": "models/base", f"{T}.model.name": "Qwen2.5-7B",
            f"{T}.finetune.sequenceLength": 4096}
    m = model("finetune", keys)
    (s,) = [s for s in checks_planner.sized_workloads(m) if s.name == "tune"]
    assert (s.request.model.name, s.request.sequence_length, s.request.batch_size) == ("Qwen2.5-7B", 4096, 2)
    assert problems("finetune", {**keys, f"{T}.model.mode": "inference"}) == [
        f"{T}.model.mode: a finetune workload trains (ZeRO model states, LoRA adapters, activations), got inference; "
        f"set mode: training, or leave the model block out (the run is sized from {T}.finetune.model)"]


def test_a_model_the_planner_does_not_know_needs_its_shape() -> None:
    (found,) = problems("finetune", {f"{T}.finetune.model": "my-org/my-model"})
    assert found.startswith(f"{T}.finetune.model: unknown model 'my-org/my-model'; known: ")
    assert found.endswith(f"(or give the parameter count in billions as {T}.model.parameters); or name its shape: "
                          f"{T}.model.name (a listed model of the same shape)")
    assert problems("finetune", {f"{T}.finetune.model": "my-org/my-model", f"{T}.model.name": "Qwen2.5-7B"}) == []
    assert problems("finetune", {f"{T}.finetune.model": "my-org/my-model", f"{T}.model.parameters": 7.0}) == []


# --- make gpus MODE=finetune ---------------------------------------------------------------------------------------

def test_make_gpus_finetune_prints_the_numbers_the_preview_checks(capsys: pytest.CaptureFixture[str]) -> None:
    assert planner_main(["--model", "Qwen2.5-7B", "--mode", "finetune", "--batch", "2", "--top", "50"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Qwen2.5-7B: 7.62B parameters (shape from data/models.yaml), bf16 training (LoRA rank 16 on "
                          "all-linear (40.37M adapter parameters, the base frozen), with gradient checkpointing), "
                          "sequence 2048 x batch 2")
    assert "parameters offload" not in out
    zero3 = out.split("## ZeRO-3\n", 1)[1].split("\n\n", 1)[0]
    # The cheapest L4 plan: 2 x g2-standard-4 (one L4 each). By hand: the frozen base and the adapters' 18 bytes
    # halved, the embedding gathered, the run's activations, the adapters' bucket, the context: 16.0 GB.
    by_hand = (2 * QWEN_P / 2 + 2 * QWEN_V * QWEN_H + 18 * QWEN_ADAPTER / 2 + TOKENS * QWEN_H * (2 * QWEN_LAYERS + 34)
               + 8 * TOKENS * QWEN_V + 2 * QWEN_ADAPTER + 0.5e9)
    assert round(by_hand / GB, 1) == 16.0
    assert "  2 x L4             2 x g2-standard-4       16.0 of 24           1.42" in zero3
    # The recipe on that plan: the preview sizes it from its keys to the same bytes.
    m = model("finetune", {"nodePools[0].machineType": "g2-standard-4", "nodePools[0].gpu.count": 1})
    (s,) = [s for s in checks_planner.sized_workloads(m) if s.name == "tune"]
    assert (s.estimate.gpus_per_node, s.estimate.nodes) == (1, 2)
    assert s.estimate.per_gpu_gb * GB == pytest.approx(by_hand)


# --- checkpoints ---------------------------------------------------------------------------------------------------

def test_a_lora_checkpoint_holds_the_adapter_not_the_base() -> None:
    """The recipe's checkpoint: the adapters' bf16 weights (DeepSpeed's module states and the Trainer's
    adapter_model.safetensors, 2 + 2 bytes) and their fp32 master weights and Adam moments (12): 16 x 40.37M =
    0.646 GB, written by 2 nodes to the bucket at 0.4 GB/s each: 0.81 s. Full fine-tuning writes 16 bytes of
    every parameter: 121.9 GB."""
    r = recovery.stack_recovery(model("finetune"))["tune"]
    assert r["checkpointGb"] == pytest.approx(16 * QWEN_ADAPTER / GB)
    assert r["saveSeconds"] == pytest.approx(16 * QWEN_ADAPTER / (0.4e9 * 2))
    full = recovery.stack_recovery(model("finetune", {f"{T}.finetune.lora.enabled": False,
                                                      f"{T}.deepspeed.offloadOptimizer": "cpu"}))["tune"]
    assert full["checkpointGb"] == pytest.approx(16 * QWEN_P / GB)


def test_the_preview_table_prices_the_lora_checkpoint() -> None:
    [(_, body)] = preemption_recovery(stack_run("finetune"))
    row = next(line for line in body.splitlines() if line.startswith("| tune "))
    assert row.startswith("| tune | 0.6 GB | 1 s (gcsfuse) | 120 s | yes |")


def test_make_gpus_finetune_writes_the_lora_plan(tmp_path: Any) -> None:
    """`make gpus MODEL=Qwen2.5-7B MODE=finetune WRITE=ft`: LoRA on a 7B model fits one L4 at ZeRO-0 (the bf16 base
    15.24 GB whole, the adapters' 20 bytes, activations at batch 1), where full fine-tuning needed 2 x L4 with the
    optimizer offloaded; the claim holds the download only, checkpoints go to the bucket."""
    assert planner_write(["--model", "Qwen2.5-7B", "--mode", "finetune", "--stack", "ft", "--serve", "0",  # SERVE=0
                          "--dir", str(tmp_path)]) == 0
    text = (tmp_path / "Pulumi.ft.yaml").read_text(encoding="utf-8")
    config = yaml_load(text)["config"]
    (w,) = config["deepspeed-stack:workloads"].values()
    (pool,) = config["deepspeed-stack:nodePools"]
    assert (pool["machineType"], pool["gpu"]["count"], w["workers"], w["deepspeed"]["zeroStage"]) == \
        ("g2-standard-4", 1, 1, 0)
    by_hand = (2 * QWEN_P + 20 * QWEN_ADAPTER + 2048 * QWEN_H * (2 * QWEN_LAYERS + 34) + 8 * 2048 * QWEN_V
               + 2 * QWEN_ADAPTER + 0.5e9)
    reasons = " ".join(line[1:].strip() for line in text.splitlines() if line.startswith("#"))
    assert f"deepspeed: ZeRO-0: {by_hand / GB:.1f} GB of each 24 GB GPU (frozen weights 15.2, " in reasons
    assert w["storage"]["size"] == "100Gi"  # 15.24 GB of weights, at least 100Gi
    assert "checkpoints (0.65 GB each: what trains, its optimizer states and the Trainer's copy) go to the " \
           "bucket's checkpoints/train/" in reasons
    assert config_problems(config) == []
