"""First-up ordering and admission (issue 32, item 3): every custom resource is created after the controller and
webhooks that admit it, and an NCCL test and a workload that cannot both hold their nodes run one after the other,
as the program registers them under the mock monitor."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import stack_run, stack_yaml, stacks

from preview.engine import Registration, RunResult

MPIJOB = "kubernetes:kubeflow.org/v2beta1:MPIJob"
JOB = "kubernetes:batch/v1:Job"
TRAINING_JOB = "deepspeed-stack:workloads:TrainingJob"
KUEUE_RELEASE = "kueue-release"
OPERATOR_MANIFEST = "mpi-operator-manifest"
LWS_MANIFEST = "leader-worker-set-manifest"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# Custom resource API groups the stack creates, and what admits them: the stack's own installs (checked below), or
# GKE itself, whose controllers come with the cluster (the Kubernetes provider is created after the cluster).
STACK_ADMITTED = {"kubeflow.org", "kueue.x-k8s.io", "leaderworkerset.x-k8s.io"}
# monitoring.googleapis.com: Managed Service for Prometheus' PodMonitoring, whose CRD and operator come with the
# cluster's managed collection (components/gke_cluster.py).
GKE_ADMITTED = {"cloud.google.com", "networking.gke.io", "monitoring.googleapis.com"}
CORE_GROUPS = {"core", "apps", "batch", "networking.k8s.io", "policy", "autoscaling", "helm.sh", "yaml",
               "rbac.authorization.k8s.io"}


def group(reg: Registration) -> str | None:
    """`kubernetes:<group>/<version>:<Kind>` -> group; None for what is not a Kubernetes object."""
    if not reg.type.startswith("kubernetes:") or reg.type.startswith("kubernetes:yaml/"):
        return None
    return reg.type.split(":")[1].split("/")[0]


def ordered_after(run: RunResult, reg: Registration) -> set[str]:
    """Every URN the registration waits for: its dependencies, theirs in turn, and its parents' (children register
    only once their parent has, which waits for the parent's dependencies)."""
    seen: set[str] = set()
    todo = [reg.urn]
    while todo:
        current = run.get(todo.pop())
        for urn in [*current.dependencies, *([current.parent] if current.parent else [])]:
            if urn not in seen and urn in run.index():
                seen.add(urn)
                todo.append(urn)
    return seen


def named(run: RunResult, name: str) -> Registration:
    (reg,) = [r for r in run.resources if r.name == name]
    return reg


@pytest.mark.parametrize("stack", stacks())
def test_every_custom_resource_waits_for_what_admits_it(stack: str) -> None:
    custom_resources_wait(stack_run(stack, example=False))


def custom_resources_wait(run: RunResult) -> None:
    """Every custom resource of a run waits for the controller and webhooks that admit it."""
    crs = [r for r in run.resources if group(r) not in (None, *CORE_GROUPS)]
    assert {group(r) for r in crs} <= STACK_ADMITTED | GKE_ADMITTED  # a new kind must be added here, with its admitter
    operator = [r for r in run.resources if r.name == OPERATOR_MANIFEST]
    kueue = [r for r in run.resources if r.name == KUEUE_RELEASE]
    for reg in crs:
        after = ordered_after(run, reg)
        if group(reg) == "kubeflow.org":
            # The operator's CRD and controller, where the stack installs them (a Gaudi cluster brings its own).
            assert {r.urn for r in operator} <= set(reg.dependencies), reg.name
            if QUEUE_LABEL in (reg.inputs["metadata"].get("labels") or {}):
                (release,) = kueue
                assert release.urn in reg.dependencies, reg.name  # its mutating/validating webhooks fail closed
        elif group(reg) == "kueue.x-k8s.io":
            (release,) = kueue
            assert release.urn in after, reg.name  # Kueue's CRDs, controller and webhooks
        elif group(reg) == "leaderworkerset.x-k8s.io":
            # The LeaderWorkerSet controller the stack installs (its CRD, webhooks and controller).
            (controller,) = [r for r in run.resources if r.name == LWS_MANIFEST]
            assert controller.urn in after, reg.name
        else:
            provider = run.get(reg.provider) if reg.provider else None
            assert provider is not None and provider.dependencies, reg.name  # after the cluster that serves it


def test_queued_mpijob_waits_for_kueue_and_the_operator() -> None:
    run = stack_run("dws")
    job = run.one(MPIJOB)
    assert job.inputs["metadata"]["labels"][QUEUE_LABEL] == "deepspeed"
    assert {named(run, KUEUE_RELEASE).urn, named(run, OPERATOR_MANIFEST).urn} <= set(job.dependencies)
    # Kueue itself after the operator (its MPIJob integration needs the CRD), and not after the workload.
    kueue = run.one("deepspeed-stack:workloads:Kueue")
    assert named(run, OPERATOR_MANIFEST).urn in kueue.dependencies
    assert job.urn not in ordered_after(run, named(run, KUEUE_RELEASE))


def test_only_the_mpijob_waits_for_its_admitters() -> None:
    """No dependency that is not needed: the namespace, claim and ConfigMap do not wait for the operator or Kueue,
    and an MPIJob that Kueue does not queue (h100: no Kueue) does not wait for it."""
    run = stack_run("dws")
    admitters = {named(run, KUEUE_RELEASE).urn, named(run, OPERATOR_MANIFEST).urn}
    job = run.one(MPIJOB)
    siblings = [r for r in run.children(job.parent) if r.urn != job.urn]
    assert siblings and all(not admitters & ordered_after(run, r) for r in siblings)
    h100 = stack_run("h100")
    assert not [r for r in h100.resources if "Kueue" in r.type or r.name == KUEUE_RELEASE]
    assert named(h100, OPERATOR_MANIFEST).urn in h100.one(MPIJOB).dependencies


def test_local_queue_after_the_cluster_queue_and_the_namespace() -> None:
    run = stack_run("dws")
    (local,) = run.by_type("kubernetes:kueue.x-k8s.io/v1beta2:LocalQueue")
    cluster_queue = run.one("kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue")
    namespace = run.one("kubernetes:core/v1:Namespace", "pretrain-namespace")
    assert {cluster_queue.urn, namespace.urn} <= set(local.dependencies)
    assert named(run, KUEUE_RELEASE).urn in cluster_queue.dependencies


# --- h100: the NCCL test and the smoke MPIJob each need both A3 Mega nodes ------------------------------------------

def test_h100_smoke_job_runs_after_the_nccl_test() -> None:
    run = stack_run("h100")
    test_job = run.one(JOB)
    # pool h100 has maxNodes 2; the test takes 2 nodes and the smoke job 2 workers: they cannot run side by side.
    assert test_job.inputs["spec"]["completions"] == 2
    assert run.one(MPIJOB).inputs["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    smoke = run.one(TRAINING_JOB, "smoke")
    assert test_job.urn in smoke.dependencies
    assert test_job.urn in ordered_after(run, run.one(MPIJOB))
    # `pulumi up` awaits the Job's completion (no skipAwait) for longer than its own deadline (3600 s).
    assert "pulumi.com/skipAwait" not in test_job.inputs["metadata"]["annotations"]
    assert test_job.inputs["spec"]["activeDeadlineSeconds"] == 3600
    assert test_job.custom_timeouts == {"create": "4200s", "update": "4200s"}


def h100_with(changes: dict[str, Any]) -> RunResult:
    """The h100 stack with top-level keys replaced."""
    return stack_run("h100", changes)


def test_training_waits_for_its_pools_test_even_with_room_beside_it() -> None:
    """maxNodes 4: both fit at once, yet the training is created only once the test passed (issue 31.3: a fabric below
    its pass line must stop the training, not race it), so `pulumi up` awaits the test."""
    pools = stack_yaml("h100")["deepspeed-stack:nodePools"]
    run = h100_with({"deepspeed-stack:nodePools": [{**pools[0], "maxNodes": 4}]})
    test_job = run.one(JOB)
    assert test_job.urn in run.one(TRAINING_JOB, "smoke").dependencies
    assert test_job.urn in ordered_after(run, run.one(MPIJOB))
    assert "pulumi.com/skipAwait" not in test_job.inputs["metadata"]["annotations"]
    assert test_job.custom_timeouts == {"create": "4200s", "update": "4200s"}


def test_a_test_with_room_beside_what_it_does_not_gate_runs_side_by_side() -> None:
    """No dependency that is not needed: a model server with room beside the test, and a training on a pool the test
    does not measure, start without waiting for it; with nothing after it, `pulumi up` does not await the test."""
    from conftest import model

    from workloads import first_up

    serve = {"kind": "serve", "pool": "h100", "serving": {"model": "Qwen/Qwen2.5-72B-Instruct"},
             "model": {"name": "Qwen2.5-72B", "mode": "inference", "sequenceLength": 4096}}
    m = model("h100", {"nodePools[0].maxNodes": 4, "workloads.chat": serve})
    assert first_up.tests_before_workload(m, m.workloads["chat"]) == []
    assert first_up.tests_before_workload(m, m.workloads["smoke"]) == ["bandwidth"]  # training: gated
    pools = stack_yaml("h100")["deepspeed-stack:nodePools"]
    two_pools = [*pools, {**pools[0], "name": "other"}]
    two = model("h100", {"nodePools": two_pools, "workloads.smoke.pool": "other"})
    assert first_up.tests_before_workload(two, two.workloads["smoke"]) == []
    assert first_up.awaited_tests(two) == set()
    smoke = stack_yaml("h100")["deepspeed-stack:workloads"]["smoke"]
    run = h100_with({"deepspeed-stack:nodePools": two_pools,
                     "deepspeed-stack:workloads": {"smoke": {**smoke, "pool": "other"}}})
    test_job = run.one(JOB)
    assert test_job.urn not in ordered_after(run, run.one(MPIJOB))
    assert test_job.inputs["metadata"]["annotations"]["pulumi.com/skipAwait"] == "true"
    assert test_job.custom_timeouts == {}


def test_two_tests_on_the_same_nodes_run_in_name_order() -> None:
    tests = stack_yaml("h100")["deepspeed-stack:ncclTests"]
    run = h100_with({"deepspeed-stack:ncclTests": {**tests, "allreduce": {**tests["bandwidth"],
                                                                          "benchmarks": ["all_reduce"]}}})
    first, second = run.one(JOB, "allreduce-job"), run.one(JOB, "bandwidth-job")
    assert first.urn in second.dependencies and second.urn not in ordered_after(run, first)
    # Both awaited: the second waits for the first, the smoke job for both.
    assert first.custom_timeouts and second.custom_timeouts
    assert {first.urn, second.urn} <= set(run.one(TRAINING_JOB, "smoke").dependencies)


def test_competition_counts_what_both_pools_hold() -> None:
    from conftest import model

    from workloads import first_up

    m = model("h100")  # pool h100: maxNodes 2
    assert first_up.competes(m, ({"h100"}, 2), ({"h100"}, 1))  # 3 nodes > 2
    assert not first_up.competes(m, ({"h100"}, 1), ({"h100"}, 1))  # 2 nodes fit
    assert not first_up.competes(m, (set(), 2), ({"h100"}, 2))  # no shared pool
    dws = model("dws")  # h100-reserved maxNodes 2, h100-dws 4: a job that may fall back has room beside a test
    assert not first_up.competes(dws, ({"h100-reserved"}, 2), ({"h100-reserved", "h100-dws"}, 2))
    assert first_up.competes(dws, ({"h100-reserved"}, 2), ({"h100-reserved"}, 2))


def test_the_job_await_facts_are_the_sdks() -> None:
    """data/serving.yaml's Job await: pulumi-kubernetes (the pinned SDK's docstring) awaits Complete, fails on Failed,
    10 minutes by default; the NCCL test's wait is longer than its own deadline and than that default."""
    import inspect

    import pulumi_kubernetes

    from model import serving_engines
    from workloads import nccl_test

    # The docstring is on the SDK's overloaded __init__s: read in the installed module's source.
    doc = " ".join(inspect.getsource(pulumi_kubernetes.batch.v1.Job).split())
    assert "conditions' has a status of type 'Complete'" in doc
    assert "type 'Failed', with a 'status' set to 'True'. If this condition is set, we should fail the Job" in doc
    assert "after 10 minutes, it will time out" in doc and serving_engines.job_await_seconds() == 10 * 60
    assert nccl_test.AWAIT_SECONDS > nccl_test.ACTIVE_DEADLINE_SECONDS > serving_engines.job_await_seconds()
