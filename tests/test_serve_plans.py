"""Serving plans that can be served (issue 20 item 3): every inference option the planner prints is one node (a
`serve` replica), or where no single node of that GPU holds the model one replica across nodes (issue 42 item 3:
pipeline stages across them); its GPUs split the model's attention heads the way vLLM can, on a GPU vLLM (in the
image) runs on, in a precision it serves there; and each engine is sized by how it takes memory (vLLM: a budget of
--gpu-memory-utilization; FastGen: all but a 1 GB reserve)."""

from __future__ import annotations

import pytest

from planner import sizing
from planner.model_catalog import resolve
from planner.recommend import recommend
from planner.sizing_types import GB, INFERENCE, Request

MODELS = ("Mistral-7B", "Llama-3.1-8B", "Llama-2-13B", "CodeLlama-34B", "Llama-3.1-70B", "Qwen2.5-7B", "Falcon-7B")
# Compute capabilities vLLM in the stack's image runs (vLLM 7.0+; torch 2.13's cubins: no 7.0 V100, no 6.0 P100).
VLLM_RUNS = {"nvidia-tesla-t4", "nvidia-l4", "nvidia-tesla-a100", "nvidia-a100-80gb", "nvidia-h100-80gb",
             "nvidia-h100-mega-80gb", "nvidia-h200-141gb", "nvidia-b200"}
NO_BF16 = {"nvidia-tesla-t4", "nvidia-tesla-v100", "nvidia-tesla-p100"}


def options(model: str, precision: str, region: str = "us-central1", max_nodes: int = 32) -> list:
    (plan,) = recommend(Request(resolve(model), precision, "inference", 2048, 1), region, top=50,
                        max_nodes=max_nodes)
    return plan.options


@pytest.mark.parametrize("precision", ["bf16", "fp16", "int4"])
@pytest.mark.parametrize("model", MODELS)
def test_every_inference_option_is_one_node_a_split_vllm_accepts_on_a_gpu_it_runs(model: str, precision: str) -> None:
    shape = resolve(model).shape
    found = options(model, precision)
    assert found, f"nothing serves {model} {precision}"
    for o in found:
        if o.nodes > 1:  # only where no node of that GPU holds it (no split of its heads fits one node's memory)
            assert o.multi_node_replica and o.nodes <= 8, o.describe()
            assert not [s for s in options(model, precision, max_nodes=1) if s.gpu_type == o.gpu_type], o.describe()
        # vllm/config/model.py: the heads divide by the tensor parallel size; linear.py: it divides the KV heads
        # or is a multiple of them.
        g = o.gpus_per_node
        assert shape.heads % g == 0 and (shape.kv_heads % g == 0 or g % shape.kv_heads == 0), o.describe()
        assert o.gpu_type in VLLM_RUNS, o.describe()
        if precision == "bf16":
            assert o.gpu_type not in NO_BF16, o.describe()


def test_the_examples_of_the_issue() -> None:
    # 13B was split over 2 x g2-standard-4 (two nodes); now two L4s of one g2-standard-24.
    l4 = next(o for o in options("Llama-2-13B", "bf16") if o.gpu_type == "nvidia-l4")
    assert (l4.machine_type, l4.nodes, l4.gpus) == ("g2-standard-24", 1, 2)
    # 70B (64 heads) was offered on 3, 5 or 12 GPUs; only powers of two divide 64 (and its 8 KV heads).
    assert {o.gpus for o in options("Llama-3.1-70B", "bf16")} <= {1, 2, 4, 8}
    # T4 (no bf16) serves fp16 only; P100 (6.0) and V100 (no kernels in the image) nothing.
    assert "nvidia-tesla-t4" in {o.gpu_type for o in options("Mistral-7B", "fp16")}
    assert "nvidia-tesla-t4" not in {o.gpu_type for o in options("Mistral-7B", "bf16")}
    assert not {o.gpu_type for o in options("Mistral-7B", "fp16")} & {"nvidia-tesla-p100", "nvidia-tesla-v100"}
    # Falcon-7B's 71 heads divide by nothing but 1: single-GPU nodes only.
    assert {o.gpus_per_node for o in options("Falcon-7B", "bf16")} == {1}


def test_kv_heads_replicate_over_more_gpus_than_there_are() -> None:
    # Qwen2.5-7B has 4 KV heads: over 8 GPUs each holds one (vLLM and FastGen replicate), a quarter of the cache,
    # not an eighth.
    shape = resolve("Qwen2.5-7B").shape
    total = sizing.kv_cache_bytes(shape, 4096, 8, "bf16")
    assert sizing.kv_cache_per_gpu(shape, 4096, 8, "bf16", 8) == total / 4
    assert sizing.kv_cache_per_gpu(shape, 4096, 8, "bf16", 2) == total / 2


def test_each_engine_is_sized_by_how_it_takes_memory() -> None:
    model = resolve("Llama-3.1-8B")
    weights, kv = 8.03e9 * 2, 2 * 32 * 8 * 128 * 4096 * 4 * 2
    vllm = sizing.estimate(Request(model, "bf16", "inference", 4096, 4), INFERENCE, 1, 1)
    # vLLM: (weights + KV cache) x 1.1 + the CUDA context, within 0.90 of the GPU.
    assert vllm.per_gpu_gb == pytest.approx(((weights + kv) * 1.1 + 0.5e9) / GB)
    assert Request(model, "bf16", "inference", engine="vllm").headroom == pytest.approx(0.10)
    mii = sizing.estimate(Request(model, "bf16", "inference", 4096, 4, engine="mii"), INFERENCE, 1, 1)
    # FastGen: weights + KV cache + its 1 GB reserve + the CUDA context, within the whole GPU (its cache takes the
    # rest: DeepSpeed ragged/manager_configs.py MemoryConfig).
    assert mii.per_gpu_gb == pytest.approx((weights + kv + 1e9 + 0.5e9) / GB)
    assert Request(model, "bf16", "inference", engine="mii").headroom == 0.0
    # FastGen runs on A100, L4, H100, H200 only: its plans have none of T4 or B200.
    (plan,) = recommend(Request(model, "bf16", "inference", 2048, 1, engine="mii"), "us-central1", top=50)
    assert {o.gpu_type for o in plan.options} <= {"nvidia-l4", "nvidia-tesla-a100", "nvidia-a100-80gb",
                                                  "nvidia-h100-80gb", "nvidia-h100-mega-80gb", "nvidia-h200-141gb"}
