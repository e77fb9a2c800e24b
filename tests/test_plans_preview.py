"""The planner and the preview agree (issue 20 item 2): every recommendation `make gpus` prints for a grid of
models, modes and regions, written as a stack (the plan's pool and a workload with its `model` block and ZeRO
settings), passes checks.load. Both compare with model/node_memory.py: what a worker pod may hold on the node,
not the machine's memory (the planner once offered 58 GB of offload on a g2-standard-16 whose pod may use 51.5)."""

from __future__ import annotations

import pytest
from conftest import changed, config_problems

from model import machine_disks
from planner.model_catalog import resolve
from planner.recommend import Option, recommend
from planner.sizing_types import Request, Strategy

# 7B, 8B, 13B, 34B, 70B from data/models.yaml.
MODELS = ("Mistral-7B", "Llama-3.1-8B", "Llama-2-13B", "CodeLlama-34B", "Llama-3.1-70B")
REGIONS = ("us-central1", "europe-west4")
TOP = 5  # what `make gpus` prints per plan (planner/__main__.py --top default)
WORKLOAD = "zero3-smoke"
# Problems of the planner's printed plans that are not about memory, each another item's: none left (bf16 was
# offered for inference on T4/P100 before issue 20 item 3, GPUs the image has no kernels for before issue 19.12).
NOT_MEMORY: tuple[str, ...] = ()


def stack_for(model: str, mode: str, region: str, strategy: Strategy, o: Option) -> dict:
    """The plan as a stack file's config: prod's cluster, one pool of the plan's shape, its workload on it."""
    gpus = o.gpus_per_node
    disks = machine_disks.for_machine(o.machine_type)
    boot = {"diskType": disks.boot_disks[0]} if disks else {}  # what the shape boots from, as a writer picks
    deepspeed = {"zeroStage": strategy.zero_stage or 0, "precision": "bf16", "microBatchPerGpu": 1,
                 "gradientAccumulation": 1, "trainBatchSize": o.nodes * gpus,
                 "offloadOptimizer": "cpu" if strategy.offload_optimizer else "none",
                 "offloadParams": "cpu" if strategy.offload_params else "none"}
    return changed("prod", {
        "gcp:region": region,
        "cluster.systemPool.zones": [o.zones[0]],
        "nodePools": [{"name": "gpu", "machineType": o.machine_type,
                       "gpu": {"type": o.gpu_type, "count": gpus, "driverVersion": "LATEST"},
                       "minNodes": 0, "maxNodes": o.nodes + 1, "zones": [o.zones[0]], **boot}],
        f"workloads.{WORKLOAD}.pool": "gpu",
        f"workloads.{WORKLOAD}.workers": o.nodes,
        f"workloads.{WORKLOAD}.launch.args": ["--expected-gpus-per-node", str(gpus)],
        f"workloads.{WORKLOAD}.deepspeed": deepspeed,
        f"workloads.{WORKLOAD}.model": {"name": model, "mode": mode, "precision": "bf16", "sequenceLength": 2048,
                                        "batchSize": 1},
    })


def printed_plans(model: str, mode: str) -> dict[tuple, tuple[str, Strategy, Option]]:
    """Every option printed for the model in each region; an option that is the same stack in both regions but
    for its zone is checked once."""
    found: dict[tuple, tuple[str, Strategy, Option]] = {}
    for region in REGIONS:
        for plan in recommend(Request(resolve(model, None), "bf16", mode), region, top=TOP):
            for o in plan.options:
                found.setdefault((plan.strategy, o.gpu_type, o.machine_type, o.nodes), (region, plan.strategy, o))
    return found


@pytest.mark.parametrize("mode", ["training", "inference"])
@pytest.mark.parametrize("model", MODELS)
def test_every_printed_plan_previews(model: str, mode: str) -> None:
    plans = printed_plans(model, mode)
    assert plans, f"the planner found nothing for {model} {mode}"
    refused = {}
    for region, strategy, o in plans.values():
        found = [p for p in config_problems(stack_for(model, mode, region, strategy, o))
                 if not any(f"{WORKLOAD}{known}" in p for known in NOT_MEMORY)]
        if found:
            refused[f"{strategy.label} on {o.describe()} in {region}"] = found
    assert refused == {}


def test_mistral_7b_training_no_longer_offloads_beyond_the_pod() -> None:
    # g2-standard-16 (64 GiB): allocatable 64 - kernel 1.19 - kube-reserved 5.48 - 0.1 = 57.2 GiB, less 1.5 GiB for
    # DaemonSets -> 55Gi, less 8Gi /dev/shm: 47 GiB = 50.5 GB for the processes, under the 58 GB ZeRO-3 offload.
    for plan in recommend(Request(resolve("Mistral-7B", None), "bf16", "training"), "us-central1", top=TOP):
        for o in plan.options:
            assert o.estimate.cpu_gb_per_node <= o.pod_memory_gb
            if o.machine_type == "g2-standard-16":
                assert o.pod_memory_gb == pytest.approx(47 * 2**30 / 1e9)
