"""The "Existing objects" section (issue 30 item 5): what the stack may find already in the cluster, what it does
with each (adopts it, or stops `pulumi up` at it) and what `pulumi destroy` leaves. From the registrations alone:
an object whose provider upserts (`upsertExistingObjects`) is adopted, one with retain_on_delete is kept, and the
MPI operator's release keeps what its transforms say (workloads/mpi_operator.py)."""

from __future__ import annotations

import pulumi

from preview.engine import Registration, RunResult
from preview.sections import Section
from workloads import mpi_operator
from workloads.training_job import ADOPTED_CLAIM_SIZE

PROVIDER = "pulumi:providers:kubernetes"
CONFIG_FILE = "kubernetes:yaml/v2:ConfigFile"
MPIJOB = "kubernetes:kubeflow.org/v2beta1:MPIJob"
KEPT, DELETED = "kept", "deleted"


def _upserts(run: RunResult, reg: Registration) -> bool:
    provider = run.index().get(reg.provider or "")
    return provider is not None and provider.inputs.get("upsertExistingObjects") == "true"


def _kind(reg: Registration) -> str:
    return reg.type.rsplit(":", 1)[-1]


def _where(reg: Registration) -> str:
    meta = reg.inputs.get("metadata") or {}
    name = meta.get("name") or reg.physical_name or reg.name
    return f"{meta['namespace']}/{name}" if meta.get("namespace") else str(name)


def kept_by_transforms(reg: Registration, child_type: str, child_name: str) -> bool:
    """Whether the component's transforms set retain_on_delete on a child of this type (run as the engine would)."""
    opts = pulumi.ResourceOptions()
    for transform in reg.transforms:
        result = transform(pulumi.ResourceTransformArgs(True, child_type, child_name, {}, opts))
        if result is not None:
            opts = result.opts
    return opts.retain_on_delete is True


def _claim_size(reg: Registration) -> str:
    """What happens to an adopted claim's size: the first apply requests storage.size (the stack cannot read the
    claim's own offline), what Kubernetes does with a claim larger or smaller than that, and that later changes
    are left alone (ignoreChanges, workloads/training_job.py)."""
    size = ((reg.inputs.get("spec") or {}).get("resources") or {}).get("requests", {}).get("storage")
    meta = reg.inputs.get("metadata") or {}
    workload = (reg.parent or "").rsplit("::", 1)[-1]
    left = "; later changes of the size are left alone" if ADOPTED_CLAIM_SIZE in reg.ignore_changes else ""
    return (f"; its size: the first `pulumi up` requests {size} (workloads.{workload}.storage.size): Kubernetes "
            "never shrinks a claim, so a larger one stops `pulumi up`, and a smaller one is asked to grow, which "
            "only a storage class with allowVolumeExpansion grants (else `pulumi up` stops)"
            f"{left}. Set storage.size to the claim's own: `kubectl get pvc -n {meta.get('namespace')} "
            f"{meta.get('name')} -o jsonpath={{.spec.resources.requests.storage}}`")


def _adopted_rows(run: RunResult) -> list[str]:
    return [f"| {_kind(r)} | `{_where(r)}` | adopted: the stack applies its fields over it"
            f"{_claim_size(r) if _kind(r) == 'PersistentVolumeClaim' else ''} | "
            f"{KEPT if r.retain_on_delete else DELETED} |"
            for r in run.resources if r.custom and r.type.startswith("kubernetes:") and _upserts(run, r)]


def _job_rows(run: RunResult, existing_cluster: bool) -> list[str]:
    """An MPIJob of the same name (Omnia's by-hand run, say): on an existing cluster never adopted."""
    rows = []
    for r in run.by_type(MPIJOB):
        if not existing_cluster or _upserts(run, r):
            continue
        meta = r.inputs.get("metadata") or {}
        check = f"kubectl get mpijob -n {meta.get('namespace')} {meta.get('name')}"
        rows.append(f"| MPIJob | `{_where(r)}` | never adopted: `pulumi up` stops (AlreadyExists) and leaves it and "
                    f"its logs; `{check}` shows one: save its launcher's log, then delete it or rename the workload | "
                    f"{DELETED} (the stack's own run only) |")
    return rows


def _operator_rows(run: RunResult, existing_cluster: bool) -> list[str]:
    rows = []
    for r in run.by_type(CONFIG_FILE):
        if not r.name.startswith("mpi-operator"):
            continue
        crd = KEPT if kept_by_transforms(r, mpi_operator.CRD_TYPE, mpi_operator.CRD_NAME) else DELETED
        rest = KEPT if kept_by_transforms(r, "kubernetes:apps/v1:Deployment", "mpi-operator") else DELETED
        there = ("never adopted: `pulumi up` stops (AlreadyExists) at an operator already there; "
                 f"`kubectl get crd {mpi_operator.CRD_NAME}` shows one: set mpiOperator.install: false"
                 if existing_cluster and not _upserts(run, r) else "created by the stack (a new cluster has none)")
        rows.append(f"| MPI operator (CRD `{mpi_operator.CRD_NAME}`, RBAC, Deployment) | `{r.inputs.get('file')}` | "
                    f"{there} | CRD {crd}, the rest {rest} |")
    return rows


def section(run: RunResult) -> list[Section]:
    existing_cluster = any(r.inputs.get("upsertExistingObjects") == "true" for r in run.by_type(PROVIDER))
    rows = _adopted_rows(run) + _job_rows(run, existing_cluster) + _operator_rows(run, existing_cluster)
    if not rows:
        return []
    table = ["| object | name | if it is there already | on `pulumi destroy` |", "| --- | --- | --- | --- |", *rows]
    notes = []
    if run.by_type(CONFIG_FILE):
        notes.append("Uninstalling the MPI operator's CRD is left to you: "
                     f"`kubectl delete crd {mpi_operator.CRD_NAME}` deletes every MPIJob in the cluster with it "
                     "(Kubernetes deletes all custom objects of a deleted CRD), so the stack never deletes it.")
    if existing_cluster:
        notes.append("What `pulumi destroy` keeps stays in the cluster with its data; what the stack adopts it never "
                     "deletes. Any other object of the same name that is there already stops `pulumi up` unchanged.")
    return [("Existing objects", "\n".join(table) + "\n\n" + " ".join(notes))]
