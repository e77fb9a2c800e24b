"""The serve kind's rules for one replica across nodes (`serving.nodesPerReplica`, issue 42 item 3).

A model no single node of the pool holds is served by one replica of several nodes: vLLM tensor-parallel over each
node's GPUs and pipeline-parallel across the nodes (its multiprocessing backend, data/serving.yaml multiNode),
rendered as a LeaderWorkerSet group (workloads/serving_group.py). What is checked here: the engine spans nodes,
the pipeline has no more stages than the model has layers, and what the group cannot do yet (an autoscaler on a
LeaderWorkerSet, the evaluator, which needs the whole model in its own pod). How many nodes a model needs on the
pool's GPU is `nodes_that_hold`, which the memory rule's message names and serve_engine.py's warning of a replica
split more than needed reads.
"""

from __future__ import annotations

from model import catalog as gpu_catalog
from model.problems import Problem
from model.types import ServeWorkloadConfig, StackConfig
from model.validators import at
from planner.recommend import short_name
from planner.requests import workload_request
from planner.sizing import estimate
from planner.sizing_types import INFERENCE, Request
from workloads.placement import Placement
from workloads.serving_command import engine_of


def nodes_per_replica(w: ServeWorkloadConfig) -> int:
    return w.serving.nodes_per_replica


def fits(request: Request, where: Placement, nodes: int) -> bool:
    """The request within each GPU's budget, tensor-parallel over a node's GPUs and pipeline-parallel over `nodes`."""
    gpu = gpu_catalog.load().gpus.get(where.accelerator_type)
    if gpu is None:
        return False
    return estimate(request, INFERENCE, where.per_worker, nodes).per_gpu_gb <= gpu.memory_gb * (1 - request.headroom)


def nodes_that_hold(request: Request, where: Placement) -> int | None:
    """The fewest nodes of the pool one replica of the engine needs (1 when one node holds it), or None when not
    even the engine's most does (or it spans no nodes)."""
    e = request.serving_engine
    most = min(e.max_nodes_per_replica if e.multi_node else 1, request.model.shape.layers)
    return next((n for n in range(1, most + 1) if fits(request, where, n)), None)


def across_nodes_hint(request: Request, where: Placement, key: str) -> str:
    """The memory rule's advice where the pool's GPU holds the model across nodes: the key and the layout."""
    needed = nodes_that_hold(request, where)
    if needed is None or needed <= 1:
        return ""
    gpu = gpu_catalog.load().gpus[where.accelerator_type]
    return (f"; or one replica across {needed} nodes of this pool: {key}: {needed} (tensor-parallel "
            f"{where.per_worker} x pipeline-parallel {needed} over {needed * where.per_worker} x "
            f"{short_name(gpu.display_name)}, a LeaderWorkerSet group)")


def check_serve_nodes_per_replica(m: StackConfig, w: ServeWorkloadConfig) -> list[Problem]:
    """A replica across nodes: an engine that spans nodes, no more pipeline stages than layers, and neither the
    autoscaler (it scales a Deployment) nor the evaluator (its pod holds the whole model) with it."""
    nodes = nodes_per_replica(w)
    if nodes <= 1:
        return []
    key, s, e = at("workloads", w.name, "serving", "nodesPerReplica"), w.serving, engine_of(w)
    if not e.multi_node:
        return [Problem(key,
                        f"{nodes}, but {e.display_name} spans no nodes in this stack (data/serving.yaml multiNode); "
                        f"set {at('workloads', w.name, 'serving', 'engine')}: vllm, or nodesPerReplica: 1")]
    problems = []
    request = workload_request(w)
    if request is not None and request.model.shape_known and nodes > request.model.shape.layers:
        problems.append(Problem(key, f"{nodes} pipeline stages, but {request.model.name} has "
                        f"{request.model.shape.layers} layers to split over them; set at most "
                        f"{request.model.shape.layers}"))
    if s.autoscaling.enabled:
        problems.append(Problem(at('workloads', w.name, 'serving', 'autoscaling', 'enabled'),
                                f"true with {key} {nodes}: "
                        "the stack's autoscaler scales a Deployment, and a replica across nodes is a LeaderWorkerSet "
                        "group; set false and a fixed serving.replicas, or nodesPerReplica: 1"))
    if s.evaluation is not None:
        problems.append(Problem(at('workloads', w.name, 'serving', 'evaluation'), f"with {key} {nodes}: the evaluator "
                        "scores exports against a server that holds the whole model in its own pod, and no node of "
                        "this pool does; remove serving.evaluation (adapters are then served as exported), or "
                        "nodesPerReplica: 1 on a pool whose node holds the model"))
    return problems
