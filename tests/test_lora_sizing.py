"""One memory model for every kind (issue 32 item 2): the finetune kind sized from its own keys, LoRA as LoRA, the
same numbers in `make gpus MODE=finetune`, checkpoints that hold what trains. Every expected number is worked out
here by hand from data/models.yaml's shapes (the sources of each constant: planner/sizing.py's docstring)."""

from __future__ import annotations

import pytest
from conftest import PROJECT_DIR, yaml_load

from planner.sizing import Lora, Request, Strategy, estimate, lora_parameters, resolve

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
