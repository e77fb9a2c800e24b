"""First-up ordering: which NCCL tests must have finished before a workload (or a later test) on the same nodes starts.

An NCCL test's Job and a workload each need several whole nodes at once (one pod per node for the test, each worker
fitted to a node), and nothing gang-admits the pair: Kueue queues only MPIJobs, never the test's Job. When the pools
they may both use cannot hold them together, a mixed placement gives each part of the nodes and both wait for the
rest: the test until its deadline (an hour), the job for as long (on h100: both A3 Mega nodes, ~$188/h). The test is
the first thing to run on a new pool, so it goes first: what competes with it depends on the test's Job, which
`pulumi up` then awaits until it completes (pulumi-kubernetes' Job await: Complete, or fail at once on Failed;
customTimeouts beyond the Job's own deadline), and a failed test stops the training from being created on a fabric
the test found broken. Tests that compete with each other run in name order. Pairs with room for both run side by
side (no dependency they do not need), with one exception: training.

A training workload (a DeepSpeed kind: helm, mpijob, finetune) on a pool an NCCL test measures waits for that test
whether or not they compete for nodes (issue 31.3). The test fails below its machine type's pass line
(recipes/nccl_bench.py, data/gpu_fabric.yaml), and a fabric that slow, or one NCCL did not use at all, makes
every step of a multi-node job wait on its collectives: on A3 Mega, 16 GPUs billed at ~$188/h for a fraction of their
work, for days. Started side by side, the training would already be running (and paying) when the test failed; ordered,
a failed test stops `pulumi up` before the training is created. A model server (serve) is not held back: it does not
train across nodes.

Workloads among themselves: checks/cluster_wide.py refuses those that together need more nodes than their pool has.
"""

from __future__ import annotations

from model.types import StackConfig, WorkloadConfig
from model.workload_training import DeepSpeedWorkloadConfig


def capacity(cfg: StackConfig, pools: set[str]) -> int:
    """Nodes the pools can hold at once (their maxNodes)."""
    return sum(p.max_nodes for p in cfg.node_pools if p.name in pools)


def competes(cfg: StackConfig, a: tuple[set[str], int], b: tuple[set[str], int]) -> bool:
    """Two sets of pods, each (the pools it may use, the nodes it needs at once), that can hold part of the same
    nodes and cannot all run at once: a shared pool, and more nodes needed than the pools of both hold."""
    (a_pools, a_nodes), (b_pools, b_nodes) = a, b
    return bool(a_pools & b_pools) and a_nodes + b_nodes > capacity(cfg, a_pools | b_pools)


def workload_needs(w: WorkloadConfig) -> tuple[set[str], int]:
    """The pools a workload's GPU pods may land on (its pool, its fallbackPool) and the nodes they take at once."""
    return {p for p in (w.pool, w.fallback_pool) if p}, w.nodes_needed()[0]


def nccl_test_needs(cfg: StackConfig, name: str) -> tuple[set[str], int]:
    t = cfg.nccl_tests[name]
    return set(t.pools), t.nodes


def trains(w: WorkloadConfig) -> bool:
    """A DeepSpeed training workload (helm, mpijob, finetune): one whose speed the fabric decides."""
    return isinstance(w, DeepSpeedWorkloadConfig)


def gates(cfg: StackConfig, name: str, w: WorkloadConfig) -> bool:
    """The test measures a pool the training workload's GPU pods may use: it must pass before they start."""
    return trains(w) and bool(nccl_test_needs(cfg, name)[0] & workload_needs(w)[0])


def tests_before_workload(cfg: StackConfig, w: WorkloadConfig) -> list[str]:
    """The NCCL tests whose Jobs must complete before the workload is created: those that compete with it for nodes,
    and, for training, every test of its pools."""
    if not w.on_nvidia:
        return []
    return [name for name in sorted(cfg.nccl_tests)
            if competes(cfg, nccl_test_needs(cfg, name), workload_needs(w)) or gates(cfg, name, w)]


def tests_before_test(cfg: StackConfig, name: str) -> list[str]:
    """The tests before `name` in name order that compete with it: they run first."""
    return [other for other in sorted(cfg.nccl_tests) if other < name
            and competes(cfg, nccl_test_needs(cfg, other), nccl_test_needs(cfg, name))]


def awaited_tests(cfg: StackConfig) -> set[str]:
    """The tests something waits for: `pulumi up` awaits their Jobs' completion (the others it leaves running)."""
    after_workloads = {t for w in cfg.workloads.values() for t in tests_before_workload(cfg, w)}
    return after_workloads | {t for name in cfg.nccl_tests for t in tests_before_test(cfg, name)}
