"""Rules across workloads and the cluster they share: what each workload alone cannot see.

- The pods of every workload on one pool must fit in its `maxNodes` together (each worker, and each Helm
  release's client, takes a node of its own: their CPU and memory are fitted to a whole node).
- An MPIJob on the stack's own GKE cluster needs the MPI operator the stack installs (`mpiOperator.install`):
  a new cluster has no `kubeflow.org` MPIJob CRD, so the MPIJob could not even be created.
- A claim on the `nfs-client` storage class needs the NFS provisioner on GKE: GKE has no such class (its
  ReadWriteMany classes come from the Filestore CSI driver the cluster enables: standard-rwx, ...).
"""

from __future__ import annotations

from checks.common import Check, at
from model.problems import Problem
from model.types import StackConfig

NFS_CLASS = "nfs-client"
# GKE's Filestore CSI driver (enabled by components/gke_cluster.py) provides these ReadWriteMany classes
# (cloud.google.com/kubernetes-engine/docs/how-to/persistent-volumes/filestore-csi-driver).
GKE_RWX_CLASS = "standard-rwx"


def check_pool_holds_its_workloads(m: StackConfig) -> list[Problem]:
    problems = []
    for i, pool in enumerate(m.node_pools):
        on_pool = [(name, *w.nodes_needed()) for name, w in m.workloads.items()
                   if w.on_nvidia and w.pool == pool.name]
        total = sum(needed for _, needed, _ in on_pool)
        if len(on_pool) < 2 or total <= pool.max_nodes:
            continue  # one workload alone: check_gpu_pool_placement says it
        each = ", ".join(f"{name} {needed} ({who})" for name, needed, who in on_pool)
        problems.append(Problem(at('nodePools', i, 'maxNodes'),
                                f"the workloads on pool {pool.name} need {total} nodes at "
                                f"once ({each}), but maxNodes is {pool.max_nodes}; raise it to {total}, or move a "
                                "workload to another pool"))
    return problems


def check_mpijob_has_its_operator(m: StackConfig) -> list[Problem]:
    if m.cluster is None or m.mpi_operator.install:
        return []  # an existing cluster brings its own operator (mpiOperator.version says which)
    jobs = [name for name, w in m.workloads.items() if w.runs_as_mpijob]
    if not jobs:
        return []
    runs = "runs as an MPIJob" if len(jobs) == 1 else "run as MPIJobs"
    return [Problem("mpiOperator.install",
                    f"{', '.join(f'workloads.{n}' for n in jobs)} {runs} on this stack's new GKE "
            "cluster, which has no MPI operator (nor its kubeflow.org MPIJob CRD); set mpiOperator.install: true")]


def check_nfs_class_has_a_provisioner(m: StackConfig) -> list[Problem]:
    if m.cluster is None:
        return []  # an existing cluster may well have nfs-client (Omnia does)
    nfs = m.nfs_provisioner
    provided = nfs.storage_class if nfs.install else None
    problems = []
    for name, w in m.workloads.items():
        if w.claim is None:
            continue
        cls = w.claim.storage_class
        if cls == provided or (cls != NFS_CLASS and cls != nfs.storage_class):
            continue
        problems.append(Problem(at('workloads', name, 'storage', 'storageClass'),
                                f"{cls} does not exist on GKE without "
                        f"the NFS provisioner; set nfsProvisioner.install: true (with nfsProvisioner.server, and "
                        f"nfsProvisioner.storageClass {cls}), or use GKE's Filestore class {GKE_RWX_CLASS}"))
    return problems


CHECKS: list[Check] = [check_pool_holds_its_workloads, check_mpijob_has_its_operator, check_nfs_class_has_a_provisioner]
