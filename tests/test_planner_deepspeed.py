"""The planner's ZeRO model states against DeepSpeed's own estimators, within 5 %.

DeepSpeed is not a dependency of this project (it needs torch): the test runs where it is installed and is
skipped elsewhere. To run it: a throwaway venv with a CPU torch wheel, deepspeed, and this project's requirements,
e.g. `python3 -m venv /tmp/dsvenv && /tmp/dsvenv/bin/pip install torch==2.13.0 deepspeed -r requirements.txt &&
/tmp/dsvenv/bin/python -m pytest tests/test_planner_deepspeed.py`.
"""

from __future__ import annotations

import pytest

from planner import model_catalog, sizing
from planner.sizing_types import Strategy

pytest.importorskip("deepspeed", reason="deepspeed (and torch) are not installed here; the comparison with "
                                        "DeepSpeed's estimators runs where they are (see the module docstring)")
from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

TOLERANCE = 0.05
# (model, GPUs per node, nodes): small to very large, one node and several.
SETUPS = [
    ("opt-125m", 1, 1),
    ("Llama-2-7B", 8, 1),
    ("Llama-3.1-8B", 4, 2),
    ("Llama-2-70B", 8, 4),
    ("Llama-3.1-405B", 8, 16),
]


def ours(model: model_catalog.Model, strategy: Strategy, gpus: int) -> float:
    return sum(sizing.model_states(model.parameters, strategy, gpus, "bf16", model.shape.largest_layer).values())


@pytest.mark.parametrize(("name", "per_node", "nodes"), SETUPS)
@pytest.mark.parametrize("offload", [False, True])
def test_zero2_matches_deepspeed(name: str, per_node: int, nodes: int, offload: bool) -> None:
    model = model_catalog.resolve(name)
    cpu, gpu = estimate_zero2_model_states_mem_needs(
        total_params=model.parameters, num_gpus_per_node=per_node, num_nodes=nodes, cpu_offload=offload)
    strategy = Strategy(2, offload_optimizer=offload)
    assert ours(model, strategy, per_node * nodes) == pytest.approx(gpu, rel=TOLERANCE)
    if offload:  # DeepSpeed's CPU figure without offload covers loading the model, which the planner leaves out
        assert sizing.deepspeed_cpu_bytes(model.parameters, strategy, per_node, nodes) == pytest.approx(
            cpu, rel=TOLERANCE)


@pytest.mark.parametrize(("name", "per_node", "nodes"), SETUPS)
@pytest.mark.parametrize(("offload_optimizer", "offload_params"), [(False, False), (True, False), (True, True)])
def test_zero3_matches_deepspeed(name: str, per_node: int, nodes: int, offload_optimizer: bool,
                                 offload_params: bool) -> None:
    model = model_catalog.resolve(name)
    cpu, gpu, _ = estimate_zero3_model_states_mem_needs(
        total_params=model.parameters, largest_layer_params=model.shape.largest_layer, num_gpus_per_node=per_node,
        num_nodes=nodes, cpu_offload=offload_optimizer, cpu_offload_params=offload_params, zero_init=True)
    strategy = Strategy(3, offload_optimizer=offload_optimizer, offload_params=offload_params)
    assert ours(model, strategy, per_node * nodes) == pytest.approx(gpu, rel=TOLERANCE)
    if offload_optimizer:
        assert sizing.deepspeed_cpu_bytes(model.parameters, strategy, per_node, nodes) == pytest.approx(
            cpu, rel=TOLERANCE)
