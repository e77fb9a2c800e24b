"""Adopt without harm (issue 30 item 5): what the stack adopts on an existing cluster is kept by `pulumi destroy`,
the MPI operator's CRD is never deleted with the stack, and the preview says which objects may exist already."""

from __future__ import annotations

import pulumi
import pytest
from conftest import stack_run

from preview.__main__ import SECTIONS
from preview.engine import Registration, RunResult
from preview.sections import adopted

CONFIG_FILE = "kubernetes:yaml/v2:ConfigFile"
# What the Kubernetes provider registers for the release's objects (mpi-operator v0.8.0's manifest).
CRD = "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"


@pytest.fixture(scope="module")
def gaudi_installs() -> RunResult:
    """The gaudi stack (an existing cluster) with `mpiOperator.install: true`."""
    return stack_run("gaudi", {"mpiOperator": {"install": True}})


def retained_by_transforms(reg: Registration, child_type: str, child_name: str) -> bool:
    """Whether the component's recorded transforms set retain_on_delete on a child the provider would register
    (the mock monitor does not run them: the test runs each as the engine would, in order)."""
    args = pulumi.ResourceTransformArgs(custom=True, type_=child_type, name=child_name, props={},
                                        opts=pulumi.ResourceOptions())
    for transform in reg.transforms:
        result = transform(args)
        if result is not None:
            args = pulumi.ResourceTransformArgs(custom=True, type_=child_type, name=child_name, props=result.props,
                                                opts=result.opts)
    return args.opts.retain_on_delete is True


def test_operator_crd_is_kept_on_destroy_on_the_stacks_own_cluster() -> None:
    """Deleting the CRD deletes every MPIJob in the cluster: even on the stack's own cluster it is kept."""
    manifest = stack_run("h100").one(CONFIG_FILE, "mpi-operator-manifest")
    assert retained_by_transforms(manifest, CRD, "mpi-operator-manifest:mpijobs.kubeflow.org")
    # The rest of a release the stack installed on its own cluster goes with the stack.
    assert not retained_by_transforms(manifest, DEPLOYMENT, "mpi-operator-manifest:mpi-operator/mpi-operator")


def test_operator_on_an_existing_cluster_is_never_removed(gaudi_installs: RunResult) -> None:
    """install: true on a cluster that already runs the operator adopts it: destroy must leave all of it."""
    manifest = gaudi_installs.one(CONFIG_FILE, "mpi-operator-manifest")
    assert retained_by_transforms(manifest, CRD, "mpi-operator-manifest:mpijobs.kubeflow.org")
    assert retained_by_transforms(manifest, DEPLOYMENT, "mpi-operator-manifest:mpi-operator/mpi-operator")


MPIJOB = "kubernetes:kubeflow.org/v2beta1:MPIJob"
PROVIDER = "pulumi:providers:kubernetes"


def upserts(run: RunResult, reg: Registration) -> bool:
    """Whether the object's provider takes over an existing object of the same name (upsertExistingObjects)."""
    assert reg.provider is not None
    return run.get(reg.provider).inputs.get("upsertExistingObjects") == "true"


def test_an_old_mpijob_of_the_same_name_is_never_adopted(gaudi_installs: RunResult) -> None:
    """Omnia's by-hand MPIJob of the same name: taken over, it would be deleted on destroy with its launcher's logs.
    The stack's MPIJob goes through a provider without upsert: pulumi up stops with AlreadyExists, the old job stays."""
    job = gaudi_installs.one(MPIJOB)
    assert job.inputs["metadata"]["name"] == "gaudi-llm-ds-ft"
    assert not upserts(gaudi_installs, job)
    assert gaudi_installs.get(job.provider).inputs["enableServerSideApply"] == "true"  # same apply, same cluster
    assert gaudi_installs.get(job.provider).inputs["context"] == "kubernetes-admin@cluster.local"
    # The namespace and the claim Omnia's guide creates by hand are still adopted (and kept on destroy).
    kept = {r.type: r for r in gaudi_installs.resources if r.retain_on_delete}
    assert {t: r.inputs["metadata"]["name"] for t, r in kept.items()} == {
        "kubernetes:core/v1:Namespace": "workloads", "kubernetes:core/v1:PersistentVolumeClaim": "shared-model"}
    assert all(upserts(gaudi_installs, r) for r in kept.values())


def test_install_true_never_replaces_an_operator_already_there(gaudi_installs: RunResult) -> None:
    """install: true on a cluster that runs the operator: its CRD and Deployment are not taken over (applied over with
    v0.8.0): the release goes through the provider without upsert, so pulumi up stops at the first existing object."""
    manifest = gaudi_installs.one(CONFIG_FILE, "mpi-operator-manifest")
    assert manifest.provider is not None and not upserts(gaudi_installs, manifest)


def test_only_the_namespace_and_the_claim_are_adopted(gaudi_installs: RunResult) -> None:
    """The ConfigMap, Secrets and NetworkPolicies of the job, and the NFS provisioner, would be deleted on destroy:
    the stack adopts none of them (an object of the same name stops pulumi up); what it adopts it keeps."""
    k8s = [r for r in gaudi_installs.resources if r.custom and r.type.startswith("kubernetes:")]
    adopted = sorted(r.inputs["metadata"]["name"] for r in k8s if upserts(gaudi_installs, r))
    assert adopted == ["shared-model", "workloads"]
    assert all(r.retain_on_delete for r in k8s if upserts(gaudi_installs, r))
    assert len([r for r in k8s if not upserts(gaudi_installs, r)]) >= 4  # ConfigMap, Secret, 2 NetworkPolicies, MPIJob


CLAIM = "kubernetes:core/v1:PersistentVolumeClaim"


def test_an_adopted_claim_keeps_its_size_after_the_first_apply(gaudi_installs: RunResult) -> None:
    """Omnia's shared-model claim, adopted: the rendered claim (what the first apply sends) and the size left out of
    every later update (ignoreChanges), so a changed storage.size never asks Kubernetes to shrink or grow it."""
    claim = gaudi_installs.one(CLAIM)
    assert upserts(gaudi_installs, claim) and claim.retain_on_delete
    assert claim.inputs["metadata"]["name"] == "shared-model" and claim.inputs["metadata"]["namespace"] == "workloads"
    assert claim.inputs["spec"] == {"accessModes": ["ReadWriteMany"], "storageClassName": "nfs-client",
                                    "resources": {"requests": {"storage": "100Gi"}}}
    assert claim.ignore_changes == ["spec.resources.requests.storage"]


def test_a_claim_the_stack_makes_on_its_own_cluster_follows_storage_size() -> None:
    claim = stack_run("h100").one(CLAIM)
    assert not claim.retain_on_delete and claim.ignore_changes == []


# --- the preview says it ------------------------------------------------------------------------------------------

def test_the_preview_lists_what_exists_already_on_an_existing_cluster(gaudi_installs: RunResult) -> None:
    [(title, body)] = adopted.section(gaudi_installs)
    assert title == "Existing objects"
    rows = [line for line in body.splitlines() if line.startswith("| ") and not line.startswith(("| object", "| ---"))]
    assert rows[0] == "| Namespace | `workloads` | adopted: the stack applies its fields over it | kept |"
    assert rows[1] == (
        "| PersistentVolumeClaim | `workloads/shared-model` | adopted: the stack applies its fields over it; its size: "
        "the first `pulumi up` requests 100Gi (workloads.gaudi-llm-ds-ft.storage.size): Kubernetes never shrinks a "
        "claim, so a larger one stops `pulumi up`, and a smaller one is asked to grow, which only a storage class "
        "with allowVolumeExpansion grants (else `pulumi up` stops); later changes of the size are left alone. Set "
        "storage.size to the claim's own: `kubectl get pvc -n workloads shared-model -o "
        "jsonpath={.spec.resources.requests.storage}` | kept |")
    assert "| MPIJob | `workloads/gaudi-llm-ds-ft` | never adopted: `pulumi up` stops (AlreadyExists)" in rows[2]
    assert "`kubectl get mpijob -n workloads gaudi-llm-ds-ft` shows one" in rows[2]
    assert "`kubectl get crd mpijobs.kubeflow.org` shows one: set mpiOperator.install: false" in rows[3]
    assert rows[3].endswith("| CRD kept, the rest kept |")
    assert "Uninstalling the MPI operator's CRD is left to you: `kubectl delete crd mpijobs.kubeflow.org`" in body


def test_on_the_stacks_own_cluster_only_the_operators_crd_is_kept() -> None:
    [(_, body)] = adopted.section(stack_run("h100"))
    rows = [line for line in body.splitlines() if line.startswith("| MPI operator")]
    assert len(rows) == 1 and rows[0].endswith("| created by the stack (a new cluster has none) | CRD kept, "
                                               "the rest deleted |")
    assert "left to you" in body


def test_nothing_to_adopt_no_section() -> None:
    assert adopted.section(stack_run("dev")) == []


def test_the_section_is_in_the_summary() -> None:
    assert adopted.section in SECTIONS
