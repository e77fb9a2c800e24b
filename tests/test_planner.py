"""The planner: sizing (the GKE guide's worked examples, each ZeRO stage by hand), recommendations (against a
brute-force search written here), the preview check and its warnings, and the cost output."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest
from conftest import (
    PROJECT_DIR,
    changed,
    config_model,
    config_problems,
    run_stack,
    set_path,
    stack_run,
    stack_yaml,
    yaml_load,
)

from checks import planner as checks_planner
from model import catalog, node_memory
from model.config import ConfigError
from model.problems import lines
from planner import cost, cost_markdown, model_catalog, recommend, sizing
from planner.__main__ import main as planner_main
from planner.model_catalog import Model, ModelShape
from planner.sizing_types import GB, INFERENCE, Request, Strategy
from preview import engine
from preview.engine import RunResult

WORKLOAD = "workloads.zero3-smoke"  # prod's helm workload on the l4 pool: 2 workers x 1 L4
CATALOG_FILE = PROJECT_DIR / "data" / "gpu_catalog.yaml"


def raw_catalog() -> dict[str, Any]:
    with open(CATALOG_FILE, encoding="utf-8") as fh:
        return yaml_load(fh)








def synthetic(parameters: float, largest_layer: int) -> Model:
    """A model whose largest layer is exactly `largest_layer` parameters (vocab x hidden)."""
    shape = ModelShape(layers=1, hidden=1000, heads=8, kv_heads=8, head_dim=125, vocab=largest_layer // 1000,
                       intermediate=1)
    return Model("synthetic", parameters, shape, shape_known=True)


# --- the model catalog -------------------------------------------------------------------------------------------

def test_models_resolve_by_name_alias_and_count() -> None:
    llama = model_catalog.resolve("llama-2-70b")  # case-insensitive
    assert (llama.name, llama.parameters, llama.shape.layers, llama.shape.kv_heads) == ("Llama-2-70B", 68.98e9, 80, 8)
    assert model_catalog.resolve("meta-llama/Llama-2-70b-hf").name == "Llama-2-70B"
    # The schema's default MPIJob model is known, so a Gaudi workload can name it as it trains it.
    assert model_catalog.resolve("meta-llama/Meta-Llama-3.1-8B-Instruct").name == "Llama-3.1-8B"
    # `parameters` overrides the known count but keeps the known shape.
    override = model_catalog.resolve("Llama-2-7B", 7.0)
    assert (override.parameters, override.shape.hidden, override.shape_known) == (7e9, 4096, True)
    with pytest.raises(model_catalog.UnknownModelError, match=r"unknown model 'gpt-5'; known: .*Llama-2-7B"):
        model_catalog.resolve("gpt-5")


def test_every_model_entry_is_complete_and_consistent() -> None:
    with open(PROJECT_DIR / "data" / "models.yaml", encoding="utf-8") as fh:
        doc = yaml_load(fh)
    assert doc["source"] and doc["date"]
    for name, m in doc["models"].items():
        assert {"parameters", "layers", "hidden", "heads", "kvHeads", "vocab", "intermediate"} <= set(m), name
        assert m["heads"] % m["kvHeads"] == 0, name  # grouped-query attention shares KV heads evenly
        # A decoder's parameters are at least its layers' attention + MLP weights: within a factor of 2 of
        # layers x (4 h^2 + 3 h x ffn), which catches a mistyped field.
        h, ffn = m["hidden"], m["intermediate"]
        rough = m["layers"] * (4 * h * h + 3 * h * ffn) / 1e9
        assert rough / 3 < m["parameters"] < rough * 10, (name, rough)


def test_unknown_shape_falls_back_to_a_llama_like_shape() -> None:
    model = model_catalog.resolve(None, 7.0)
    # 12 x L x (128 L)^2 = 7e9  ->  L = (7e9 / 196608)^(1/3) = 32.9 -> 33 layers, hidden 33 x 128 = 4224.
    assert (model.shape.layers, model.shape.hidden, model.shape.kv_heads, model.shape.head_dim) == (33, 4224, 33, 128)
    assert model.shape_known is False and model.name == "7B"


# --- inference sizing: the GKE guide's worked examples -----------------------------------------------------------

def test_guide_7b_in_half_precision_is_about_14_gb_of_weights() -> None:
    # "multiply the number of parameters (in billions) by 2 ... a 7B parameter model ... approximately 14 GB"
    assert sizing.weights_bytes(7e9, "fp16") / GB == 14
    assert sizing.weights_bytes(7e9, "bf16") / GB == 14
    assert sizing.weights_bytes(7e9, "fp32") / GB == 28
    assert sizing.weights_bytes(7e9, "int8") / GB == 7


def test_guide_7b_fits_one_l4_or_two_t4() -> None:
    request = Request(model_catalog.resolve("Llama-2-7B"), "fp16", "inference", 2048, 1)
    # weights 6.74e9 x 2 B; KV cache 2 x 32 layers x 32 KV heads x 128 x 2048 tokens x 2 B; +10 % and 0.5 GB context.
    weights, kv = 6.74e9 * 2, 2 * 32 * 32 * 128 * 2048 * 2
    one = sizing.estimate(request, INFERENCE, 1, 1)
    assert one.per_gpu_gb == pytest.approx(((weights + kv) * 1.1 + 0.5e9) / 1e9)  # 16.5 GB
    assert one.fits(24, headroom=0.10) and not one.fits(16)  # one L4 yes (7.5 GB left), one T4 no
    two = sizing.estimate(request, INFERENCE, 2, 1)  # "2 Tesla-T4 GPUs with 32G by sharding model across both"
    assert two.per_gpu_gb == pytest.approx(((weights + kv) / 2 * 1.1 + 0.5e9) / 1e9)  # 8.5 GB
    assert two.fits(16, headroom=0.10)


def test_guide_70b_in_4_bit_needs_35_gb_and_two_l4() -> None:
    # "Llama 2 70b ... 140G memory with ... 16 bits ... 4 bits, which only need 35G memory and can fit into 2 L4"
    assert sizing.weights_bytes(70e9, "fp16") / GB == 140
    assert sizing.weights_bytes(70e9, "int4") / GB == 35
    request = Request(model_catalog.resolve("Llama-2-70B"), "int4", "inference", 2048, 1)
    weights, kv = 68.98e9 * 0.5, 2 * 80 * 8 * 128 * 2048 * 2  # GQA: 8 KV heads
    two = sizing.estimate(request, INFERENCE, 2, 1)
    assert two.per_gpu_gb == pytest.approx(((weights + kv) / 2 * 1.1 + 0.5e9) / 1e9)  # 19.8 GB of 24
    assert two.fits(24, headroom=0.10)
    assert not sizing.estimate(request, INFERENCE, 1, 1).fits(24)
    l4 = next(o for o in recommend.recommend(request, "us-central1")[0].options if o.gpu_type == "nvidia-l4")
    assert (l4.gpus, l4.memory_gb) == (2, 24)


def test_kv_cache_grows_with_sequence_and_batch() -> None:
    shape = model_catalog.resolve("Llama-3.1-8B").shape
    # 2 x 32 layers x 8 KV heads x 128 head dim x 8192 tokens x 4 sequences x 2 bytes
    assert sizing.kv_cache_bytes(shape, 8192, 4, "bf16") == 2 * 32 * 8 * 128 * 8192 * 4 * 2
    assert sizing.kv_cache_bytes(shape, 8192, 4, "fp32") == 2 * 32 * 8 * 128 * 8192 * 4 * 4
    assert sizing.kv_cache_bytes(shape, 8192, 4, "int4") == 2 * 32 * 8 * 128 * 8192 * 4 * 2  # 16-bit cache


# --- training sizing: each ZeRO stage by hand ----------------------------------------------------------------------

def test_zero_paper_figure_1() -> None:
    # ZeRO paper, figure 1: 7.5B parameters, 64 GPUs, K = 12: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB per GPU.
    assert sizing.zero_paper_bytes(7.5e9, 0, 64) / GB == pytest.approx(120)
    assert sizing.zero_paper_bytes(7.5e9, 1, 64) / GB == pytest.approx(4 * 7.5 + 12 * 7.5 / 64)  # 31.4
    assert sizing.zero_paper_bytes(7.5e9, 2, 64) / GB == pytest.approx(2 * 7.5 + 14 * 7.5 / 64)  # 16.6
    assert sizing.zero_paper_bytes(7.5e9, 3, 64) / GB == pytest.approx(16 * 7.5 / 64)  # 1.9


@pytest.mark.parametrize(("strategy", "precision", "expected_gb"), [
    # 1e9 parameters on N = 8 GPUs, largest layer 1e8 parameters; bytes per parameter by hand:
    (Strategy(0), "bf16", 2 + 2 + 4 + 12),                    # everything replicated: 20
    (Strategy(1), "bf16", 2 + 2 + (4 + 12) / 8),              # optimizer + fp32 grads partitioned: 6
    (Strategy(2), "bf16", 2 + (2 + 4 + 12) / 8),              # and the fp16 grads: 4.25
    (Strategy(3), "fp16", (2 + 4 + 12) / 8 + 4 * 0.1),        # and the weights; + gathered layer: 2.65
    (Strategy(1, True), "bf16", 2 + 2),                       # optimizer on the CPU, fp16 grads replicated
    (Strategy(2, True), "bf16", 2),                           # DeepSpeed's ZeRO-2 offload: 2 bytes
    (Strategy(3, True), "bf16", 2 / 8 + 4 * 0.1),             # 0.65
    (Strategy(3, True, True), "bf16", 4 * 0.1),               # only the gathered layer: 0.4
    (Strategy(0), "fp32", 4 + 4 + 8),                         # plain fp32 Adam: 16
    (Strategy(2), "fp32", 4 + (4 + 8) / 8),                   # 5.5
    (Strategy(3), "fp32", (4 + 4 + 8) / 8 + 8 * 0.1),         # fp32 gathered layer: 2.8
])
def test_model_states_per_stage(strategy: Strategy, precision: str, expected_gb: float) -> None:
    states = sizing.model_states(1e9, strategy, 8, precision, largest_layer=1e8)
    assert sum(states.values()) / GB == pytest.approx(expected_gb)


def test_deepspeed_accounting_is_the_paper_plus_the_fp32_gradient_partition() -> None:
    p, n = 7.5e9, 64
    stage2 = sum(sizing.model_states(p, Strategy(2), n).values())
    assert stage2 == pytest.approx(sizing.zero_paper_bytes(p, 2, n) + 4 * p / n)


def test_training_estimate_adds_activations_buckets_and_context() -> None:
    request = Request(model_catalog.resolve("Llama-2-7B"), "bf16", "training", 2048, 1)
    est = sizing.estimate(request, Strategy(2), gpus_per_node=8, nodes=1)
    p = 6.74e9
    states = 2 * p + 18 * p / 8
    # checkpointed layer inputs 2 x s x b x h x 32 layers + one layer's 34 x s x b x h + fp32 logits and grads
    activations = 2048 * 4096 * (2 * 32 + 34) + 8 * 2048 * 32000
    buckets = (5e8 + 5e8) * 2  # reduce + allgather bucket, 16-bit
    assert est.per_gpu_gb == pytest.approx((states + activations + buckets + 0.5e9) / 1e9)
    assert est.gpus == 8 and est.cpu_gb_per_node == 0
    # ZeRO-3 + full offload on 2 nodes: CPU per node = P x 18 / nodes x 1.5 (DeepSpeed, zero.Init)
    offload = sizing.estimate(request, Strategy(3, True, True), gpus_per_node=4, nodes=2)
    assert offload.cpu_gb_per_node == pytest.approx(p * 18 / 2 * 1.5 / 1e9)


def test_training_in_4_bit_is_refused() -> None:
    request = Request(model_catalog.resolve("Llama-2-7B"), "int4", "training")
    with pytest.raises(ValueError, match="int4 is a weight format for inference"):
        sizing.estimate(request, Strategy(2))


# --- recommendations against a brute-force search ------------------------------------------------------------------

def vllm_serves(capability: tuple[int, int], precision: str) -> bool:
    """vLLM (the default engine) in the stack's image: compute capability 7.0+ (vLLM's GPU installation page), with a
    torch 2.13 cubin (7.5, 8.0, 8.6, 9.0, 10.0, 12.0 and their minors: no V100 7.0), bf16 from 8.0 (vLLM's
    _check_if_gpu_supports_dtype)."""
    torch_archs = {(7, 5), (8, 0), (8, 6), (9, 0), (10, 0), (12, 0)}
    runs = capability >= (7, 0) and any(m == capability[0] and n <= capability[1] for m, n in torch_archs)
    return runs and (precision != "bf16" or capability >= (8, 0))


def vllm_splits(shape: model_catalog.ModelShape, gpus: int) -> bool:
    """vLLM's tensor parallel: the heads divide by it, and it divides the KV heads or is a multiple of them
    (vllm/config/model.py verify_with_parallel_config; linear.py QKVParallelLinear)."""
    return shape.heads % gpus == 0 and (shape.kv_heads % gpus == 0 or gpus % shape.kv_heads == 0)


def brute_force(request: Request, strategy: Strategy, region: str, max_nodes: int) -> list[tuple]:
    """Every GPU type x machine shape x node count of the catalog; keep what fits with 10 % free GPU memory and
    the offloaded states in what a worker pod's processes may hold (model/node_memory.py, pinned by
    test_node_memory.py: this checks the search, not the memory model); per GPU type the cheapest; cheapest first."""
    cat = catalog.load()
    fitting = []
    for gpu_type, gpu in cat.gpus.items():
        if not gpu.zones.get(region):
            continue
        if request.mode == "training" and request.precision == "bf16" and not gpu.bf16:
            continue
        if request.mode == "inference" and not vllm_serves(gpu.compute_capability, request.precision):
            continue
        for shape in gpu.shapes:
            if request.mode == "inference" and not vllm_splits(request.model.shape, shape.gpus):
                continue
            pod_gb = node_memory.planned_process_memory_gb(shape.machine_type, shape.vcpus, shape.memory_gb)
            # A server replica is one node (issue 20 item 3: neither engine spans nodes in this stack).
            for nodes in range(1, (1 if request.mode == "inference" else max_nodes) + 1):
                est = sizing.estimate(request, strategy, shape.gpus, nodes)
                if est.per_gpu_gb <= 0.9 * gpu.memory_gb and est.cpu_gb_per_node <= pod_gb:
                    fitting.append((round(nodes * shape.price.on_demand, 6), round(nodes * shape.price.spot, 6),
                                    nodes * shape.gpus, gpu_type, shape.machine_type, nodes))
    best: dict[str, tuple] = {}
    for option in sorted(fitting):
        best.setdefault(option[3], option)
    return sorted(best.values())


CASES = [
    ("Llama-2-7B", None, "fp16", "inference", "us-central1"),
    ("Llama-2-70B", None, "int4", "inference", "us-central1"),
    ("Mixtral-8x7B", None, "bf16", "inference", "us-east4"),
    ("Llama-3.1-8B", None, "bf16", "training", "us-central1"),
    (None, 13.0, "fp16", "training", "us-west1"),  # fp16: T4 and V100 qualify
    ("opt-125m", None, "bf16", "training", "europe-west4"),
]


@pytest.mark.parametrize(("name", "billions", "precision", "mode", "region"), CASES)
def test_recommendation_equals_brute_force(name: str | None, billions: float | None, precision: str, mode: str,
                                           region: str) -> None:
    request = Request(model_catalog.resolve(name, billions), precision, mode, 2048, 1)
    plans = recommend.recommend(request, region, max_nodes=6, top=100)
    assert [p.strategy for p in plans] == list(request.strategies())
    for plan in plans:
        got = [(round(o.on_demand, 6), round(o.spot, 6), o.gpus, o.gpu_type, o.machine_type, o.nodes)
               for o in plan.options]
        assert got == brute_force(request, plan.strategy, region, max_nodes=6), plan.strategy.label
        for o in plan.options:
            assert set(o.zones) <= set(catalog.load().regions[region])


def test_recommendation_is_sorted_and_skips_gpus_without_bf16_for_bf16_training() -> None:
    request = Request(model_catalog.resolve("Llama-3.1-8B"), "bf16", "training")
    for plan in recommend.recommend(request, "us-central1", top=20):
        prices = [o.on_demand for o in plan.options]
        assert prices == sorted(prices)
        assert not {o.gpu_type for o in plan.options} & {"nvidia-tesla-t4", "nvidia-tesla-v100", "nvidia-tesla-p100"}


def test_cli_lists_options_and_rejects_unknown_models(capsys: pytest.CaptureFixture[str]) -> None:
    assert planner_main(["--model", "Llama-2-70B", "--mode", "inference", "--precision", "int4", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "Llama-2-70B: 68.98B parameters" in out and "## inference" in out
    # One node per replica: the two L4s of one g2-standard-24, not two g2-standard-4 (issue 20 item 3).
    assert re.search(r"2 x L4\s+1 x g2-standard-24\s+19\.8 of 24", out), out
    assert "Served by vLLM" in out
    assert planner_main(["--model", "gpt-5", "--mode", "training"]) == 2
    assert "unknown model 'gpt-5'" in capsys.readouterr().err
    assert planner_main(["--parameters", "7", "--mode", "training", "--region", "mars-1"]) == 2
    assert "region mars-1 is not a region of data/gpu_catalog.yaml" in capsys.readouterr().err


# --- the preview check ---------------------------------------------------------------------------------------------

def test_prod_stack_fails_when_its_model_cannot_fit() -> None:
    workloads = changed("prod", {})["deepspeed-stack:workloads"]
    workloads["zero3-smoke"]["model"] = {"name": "Llama-2-70B", "mode": "training", "precision": "bf16"}
    with pytest.raises(ConfigError) as err:
        run_stack("prod", {"workloads": workloads})
    (problem,) = err.value.problems
    # prod trains at ZeRO-3 with the optimizer on the CPU, 2 workers x 1 L4, micro batch 4, sequence 2048:
    # fp16 weights 2 x 68.98e9 / 2 GPUs; gathered layer 4 x (32000 x 8192); activations 8192 tokens x 8192 x
    # (2 x 80 + 34) + 8 x 8192 x 32000; reduce bucket 5e8 x 2; CUDA context 0.5e9.
    need = (68.98e9 + 4 * 32000 * 8192 + 8192 * 8192 * 194 + 8 * 8192 * 32000 + 1e9 + 0.5e9) / 1e9
    assert problem.startswith(f"{WORKLOAD}.model: Llama-2-70B (68.98B parameters) bf16 training at ZeRO-3 + "
                              f"optimizer offload needs {need:.1f} GB per GPU (")
    assert "; nvidia-l4 has 24 GB (2 workers x 1 GPU). Fits with 10% headroom: " in problem
    suggestions = re.findall(r"(ZeRO-\d[^;.]*?) on (\d+) x L4 \((\d+) workers? x 1; ([\d.]+) GB each\)", problem)
    assert suggestions, problem
    for _, gpus, workers, each in suggestions:
        assert gpus == workers and float(each) <= 24 * 0.9
    assert re.search(r"Cheapest in us-central1: ZeRO-\d.* on \d+ x \w+ .*\$[\d.]+/h on-demand", problem)


def test_when_nothing_of_its_gpu_type_holds_it_the_error_says_so() -> None:
    # Llama-3.1-405B at micro batch 4: activations alone are 8192 tokens x 16384 x (2 x 126 + 34) bytes = 38 GB.
    config = changed("prod", {f"{WORKLOAD}.model": {"name": "Llama-3.1-405B", "mode": "training"}})
    (problem,) = config_problems(config)
    assert ("Nothing up to 128 workers of 1 x L4 holds it at sequence 2048 x batch 4; shorten the sequence or the "
            "micro batch. Cheapest in us-central1: ") in problem


def test_model_fits_on_more_workers() -> None:
    # The same model on 60 workers with optimizer and parameter offload: 4 x largest layer + activations + ...
    # on the GPU; on the CPU DeepSpeed's 68.98e9 x 18 / 60 x 1.5 = 31.0 GB per node, more than a g2-standard-8's
    # pod holds (26Gi less 8Gi of /dev/shm), so on g2-standard-16 (56Gi less 8Gi).
    config = changed("prod", {f"{WORKLOAD}.model": {"name": "Llama-2-70B", "mode": "training"},
                        f"{WORKLOAD}.workers": 60, f"{WORKLOAD}.deepspeed.trainBatchSize": 60 * 4 * 8,
                        f"{WORKLOAD}.deepspeed.offloadParams": "cpu", "nodePools[0].maxNodes": 61,
                        "nodePools[0].machineType": "g2-standard-16"})
    assert config_problems(config) == []


def test_unknown_model_and_training_precision_are_config_errors() -> None:
    found = config_problems(changed("prod", {f"{WORKLOAD}.model": {"name": "my-llm"}}))
    assert found == [f"{WORKLOAD}.model.name: unknown model 'my-llm'; known: " + ", ".join(model_catalog.model_names())
                     + f" (or give the parameter count in billions as {WORKLOAD}.model.parameters)"]
    assert config_problems(changed("prod", {f"{WORKLOAD}.model": {"mode": "inference"}})) == [
        f"{WORKLOAD}.model: give `name` (a model in data/models.yaml) or `parameters` (billions) for the planner's "
        "memory check"]
    found = config_problems(changed("prod", {f"{WORKLOAD}.model": {"name": "Llama-2-7B", "precision": "int4"}}))
    assert found == [f"{WORKLOAD}.model.precision: int4 is a weight format for inference; ZeRO training runs in "
                     "fp32, fp16, bf16 (quantised fine-tuning such as QLoRA is not modelled)"]
    found = config_problems(changed("prod", {f"{WORKLOAD}.model": {"name": "opt-125m", "precision": "fp16"}}))
    assert found == [f"{WORKLOAD}.model.precision: fp16, but the workload trains in "
                     f"{WORKLOAD}.deepspeed.precision = bf16; set both the same"]


def tight_inference() -> dict[str, Any]:
    # Llama-2-7B fp16 on 2 L4, 24 sequences of 2048: ((6.74e9 x 2 + 24 x 2 x 32 x 32 x 128 x 2048 x 2) / 2 x 1.1
    # + 0.5e9) = 22.1 GB of 24: 8 % free, under the 10 % asked for.
    return changed("prod", {f"{WORKLOAD}.model": {"name": "Llama-2-7B", "mode": "inference", "precision": "fp16",
                                            "batchSize": 24}})


def test_under_10_percent_headroom_is_a_warning_not_an_error() -> None:
    config = tight_inference()
    assert config_problems(config) == []
    need = (6.74e9 * 2 + 24 * 2 * 32 * 32 * 128 * 2048 * 2) / 2 * 1.1 + 0.5e9
    free = 1 - need / 24e9
    assert lines(checks_planner.warnings(config_model(config))) == [
        f"{WORKLOAD}.model: Llama-2-7B (6.74B parameters) fp16 inference needs {need / 1e9:.1f} GB per GPU of "
        f"nvidia-l4's 24 GB, {free:.1%} headroom (under 10%); a longer sequence or allocator fragmentation can run "
        "it out of memory"]
    # Two more sequences no longer fit: an error.
    set_path(config, f"{WORKLOAD}.model.batchSize", 28)
    (problem,) = config_problems(config)
    assert problem.startswith(f"{WORKLOAD}.model: Llama-2-7B (6.74B parameters) fp16 inference needs ")


def test_offload_beyond_the_pod_memory_is_an_error() -> None:
    # ZeRO-2 offload of Llama-2-7B on 2 g2-standard-8: DeepSpeed wants P x max(4 x 2 GPUs, 16) x 1.5 per node;
    # a pod may use 26Gi (fitted to the node) less 8Gi of /dev/shm. tests/test_offload.py has the details.
    config = changed("prod", {f"{WORKLOAD}.model": {"name": "Llama-2-7B", "mode": "training"},
                        f"{WORKLOAD}.deepspeed.zeroStage": 2})
    cpu = 6.74e9 * 16 * 1.5 / 1e9
    (problem,) = config_problems(config)
    assert problem.startswith(f"{WORKLOAD}.deepspeed.offloadOptimizer: DeepSpeed estimates {cpu:.1f} GB of CPU "
                              "memory per node for Llama-2-7B's offloaded states at ZeRO-2 + optimizer offload")


def test_stack_logs_the_warnings() -> None:
    # run.warnings: what the program sent the engine's log as warnings (preview/engine.py's RecordingLogger), which
    # `pulumi up` prints. The run is shared with test_user_path (same overrides).
    run = stack_run("prod", {"workloads": tight_inference()["deepspeed-stack:workloads"]})
    assert any(m.startswith(f"{WORKLOAD}.model: Llama-2-7B") and "headroom (under 10%)" in m
               for m in run.warnings), run.warnings
    assert run.outputs["costs"]["pools"]["l4"]["machineType"] == "g2-standard-8"


def test_repo_stacks_pass_the_planner_without_warnings(prod: RunResult) -> None:
    m = config_model(stack_yaml("prod"))
    (sized,) = checks_planner.sized_workloads(m)  # prod's workload has a model block
    assert sized.estimate.gpus == 2 and sized.strategy == Strategy(3, offload_optimizer=True)
    assert checks_planner.warnings(m) == []
    assert checks_planner.warnings(config_model(stack_yaml("dev"))) == []


# --- cost ----------------------------------------------------------------------------------------------------------

def _price(node: dict[str, Any], spot: bool) -> float:
    return node["price"]["spot" if spot else "onDemand"]


def test_dev_costs_output(dev: RunResult) -> None:
    raw = raw_catalog()
    costs = dev.outputs["costs"]
    # t4 pool: n1-standard-8 + 1 attached T4 per node, 0..3 nodes, spot.
    node = {spot: _price(raw["n1Machines"]["n1-standard-8"], spot) + _price(raw["gpus"]["nvidia-tesla-t4"], spot)
            for spot in (False, True)}
    t4 = costs["pools"]["t4"]
    assert t4["spot"] is True and (t4["minNodes"], t4["maxNodes"]) == (0, 3)
    assert t4["onDemandPerHour"] == {"min": 0, "max": pytest.approx(3 * node[False])}
    assert t4["spotPerHour"] == {"min": 0, "max": pytest.approx(3 * node[True])}
    assert t4["paysPerHour"] == t4["spotPerHour"]
    system = {spot: _price(raw["generalMachines"]["e2-standard-4"], spot) for spot in (False, True)}
    assert costs["pools"]["system"]["paysPerHour"] == {"min": pytest.approx(system[False]),
                                                       "max": pytest.approx(3 * system[False])}
    fee = raw["gkeClusterFeePerHour"]
    assert costs["stackPerHourAtMax"] == pytest.approx(fee + 3 * system[False] + 3 * node[True])
    assert costs["stackPerHourAtMin"] == pytest.approx(fee + system[False])
    assert costs["estimate"] is True and costs["currency"] == "USD" and costs["unpriced"] == []


def test_prod_costs_pay_on_demand(prod: RunResult) -> None:
    raw = raw_catalog()
    l4_node = raw["gpus"]["nvidia-l4"]["machines"]["g2-standard-8"]["price"]
    l4 = prod.outputs["costs"]["pools"]["l4"]
    assert l4["spot"] is False
    assert l4["paysPerHour"] == l4["onDemandPerHour"] == {"min": pytest.approx(l4_node["onDemand"]),
                                                          "max": pytest.approx(4 * l4_node["onDemand"])}
    assert l4["spotPerHour"]["max"] == pytest.approx(4 * l4_node["spot"])


def test_cost_section_is_a_markdown_table() -> None:
    m = config_model(stack_yaml("dev"))
    text = cost_markdown.cost_section(m)
    costs = cost.stack_costs(m)
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| pool | machine | accelerators | nodes |")
    t4 = costs["pools"]["t4"]
    assert f"| t4 | n1-standard-8 | 1 x nvidia-tesla-t4 | 0–3 | spot | $0.00 → ${t4['onDemandPerHour']['max']:,.2f} " \
           f"| $0.00 → ${t4['spotPerHour']['max']:,.2f} | spot |" in rows
    assert f"every pool at max nodes: ${costs['stackPerHourAtMax']:,.2f}/h" in text
    assert "Estimates in USD" in text


def test_preview_summary_gets_the_cost_section(dev: RunResult) -> None:
    from preview.sections import cost as cost_section

    ((title, body),) = cost_section.section(dev)
    assert title == "Estimated cost"
    assert body == cost_markdown.cost_section(config_model(stack_yaml("dev")))  # the output and the config agree
    gaudi_like = engine.RunResult(stack="gaudi", resources=[], outputs={})
    assert cost_section.section(gaudi_like) == []


def test_unpriced_machine_is_named_not_guessed() -> None:
    m = config_model(changed("prod", {"cluster.systemPool.machineType": "c3-standard-4"}))
    costs = cost.stack_costs(m)
    assert costs["unpriced"] == ["system"]
    assert costs["pools"]["system"]["price"].startswith("unknown")
    assert "Not priced (machine type missing from the catalog): system." in cost_markdown.cost_section(m)


# --- the GPU catalog -----------------------------------------------------------------------------------------------

def test_catalog_prices_and_accessors() -> None:
    raw, cat = raw_catalog(), catalog.load()
    assert raw["pricesAreEstimates"] is True and raw["source"] and raw["date"]
    t4 = raw["gpus"]["nvidia-tesla-t4"]["price"]
    assert cat.gpu_hour("nvidia-tesla-t4") == t4["onDemand"] and cat.gpu_hour("nvidia-tesla-t4", True) == t4["spot"]
    # Bundled GPUs: the machine price; per GPU-hour, the cheapest shape's price per GPU.
    a100 = raw["gpus"]["nvidia-tesla-a100"]["machines"]
    assert cat.machine_hour("a2-highgpu-8g", gpu_type="nvidia-tesla-a100", count=8) == a100["a2-highgpu-8g"][
        "price"]["onDemand"]
    assert cat.gpu_hour("nvidia-tesla-a100") == min(m["price"]["onDemand"] / m["gpus"] for m in a100.values())
    assert cat.machine_hour("e2-standard-4") == raw["generalMachines"]["e2-standard-4"]["price"]["onDemand"]
    assert cat.machine_hour("c3-standard-4") is None
    for gpu in cat.gpus.values():
        assert gpu.shapes and any(gpu.zones.values()), gpu.name
        for shape in gpu.shapes:
            assert 0 < shape.price.spot < shape.price.on_demand, (gpu.name, shape.machine_type)
            assert math.isfinite(shape.memory_gb) and shape.vcpus > 0


def test_costs_output_is_plain_json(dev: RunResult) -> None:
    # The output is data (no Outputs inside): it serialises as is and carries no secret marker.
    text = json.dumps(dev.outputs["costs"])
    assert "[secret]" not in text and "stackPerHourAtMax" in text
