"""Maintenance seen coming: an NVIDIA MPIJob on the stack's GKE pools saves before its nodes' host maintenance.

GPU VMs do not live-migrate; Compute Engine terminates them for host maintenance, which GKE announces on the node
as the label `cloud.google.com/scheduled-maintenance-time=<Unix seconds>` (GKE 1.31.1-gke.2008000 and later for GPU
machine types; data/capacity.yaml `maintenance`). The stack:

- runs recipes/maintenance_watch.py as a native sidecar of the launcher (the system pool: nothing taken
  from a GPU node's allocatable), in the stack's image, from the job's ConfigMap. It reads each worker's node every
  minute and evicts a worker once its node's maintenance is less than the workers' grace period plus LEAD_MARGIN
  away: the worker's preStop hook makes the ranks save together, and the launcher's next attempt resumes;
- gives the workers a preferred node affinity for nodes without the label, so a worker made again (and every new
  run) goes to a node with no pending maintenance where there is one. Preferred, not required: a fleet under a
  rolling maintenance must not leave a job unschedulable;
- gives only the sidecar an API token (a projected ServiceAccount token volume in that container; the pod's
  automountServiceAccountToken stays false), and the pod's ServiceAccount the least access that does it: get on
  the job's worker pods and create on their `eviction` subresource (resourceNames: the operator names workers
  `<job>-worker-<i>`), and get on nodes through a ClusterRole (nodes have no namespace; their names are not known
  before, so no resourceNames).

What it relies on (mpi-operator v0.8.0, pkg/controller/mpi_job_controller.go): workers are named
`<job>-worker-<i>` (workerName, 1453-1455), and a missing worker is made again at the next sync (getOrCreateWorker,
976-1016, called at 672). An API eviction deletes the pod gracefully; it does not leave a Failed pod with reason
`Evicted`, which the operator would count as the job failing (1142-1157: only the kubelet's node-pressure eviction
does that). The launcher's next attempt waits for the workers and resumes (workloads/recovery.py).

Only where the launcher runs the stack's image (the program needs its python3): a job with an `image` of its own
gets the affinity and a preview warning instead (checks/workloads.py).
"""

from __future__ import annotations

from typing import Any

from model import capacity
from model.types import MpiJobBaseConfig
from recipes import contract
from workloads import recovery
from workloads.placement import Placement

PROGRAM, API = "maintenance_watch.py", "kube_api.py"  # recipes/, shipped in the job's ConfigMap
SIDECAR = "maintenance-watch"
TOKEN_VOLUME = "maintenance-watch-token"
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"  # where kube_api.py reads it (the usual place)
# Beyond the grace period: a minute between looks, the eviction, and the save starting on every rank.
LEAD_MARGIN_SECONDS = 300
POLL_SECONDS = 60
STATE_FILE = "maintenance-nodes"  # in the launcher's state emptyDir: the nodes acted on, across restarts
USER = 1001  # the stack's image's user (workloads/pod_security.py NVIDIA_USER)


def label() -> str:
    return capacity.load().maintenance.label


def watched(w: MpiJobBaseConfig, where: Placement | None) -> bool:
    """An NVIDIA job on a stack GKE pool whose launcher runs the stack's image."""
    return where is not None and where.on_nvidia and where.pool is not None and not w.image


def lead_seconds(w: MpiJobBaseConfig) -> int:
    return recovery.grace_seconds(w) + LEAD_MARGIN_SECONDS


def worker_pods(w: MpiJobBaseConfig) -> list[str]:
    return [f"{w.name}-worker-{i}" for i in range(w.workers)]


def files() -> dict[str, str]:
    # contract.py: the program's options (MAINTENANCE_WATCH), for a job that ships no training program beside it.
    return contract.sources(PROGRAM, API, "contract.py")


def token_volume() -> dict[str, Any]:
    """The ServiceAccount's token, the cluster's CA and the namespace, as the kubelet's own automount lays them out
    (kubernetes.io/docs/concepts/security/service-accounts, bound token volume), for the sidecar alone."""
    return {"name": TOKEN_VOLUME, "projected": {"defaultMode": 0o440, "sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}]}}


def sidecar(w: MpiJobBaseConfig, image: Any, config_mount: dict[str, Any],
            state_mount: dict[str, Any]) -> dict[str, Any]:
    """The launcher's native sidecar (an init container that restarts Always: it runs beside the launcher and does
    not keep its Job from completing; Kubernetes 1.29+, as the fabric's sidecars)."""
    return {
        "name": SIDECAR, "image": image, "imagePullPolicy": "IfNotPresent", "restartPolicy": "Always",
        "command": ["python3"],
        "args": [f"{config_mount['mountPath']}/{PROGRAM}", *contract.MAINTENANCE_WATCH.argv({
            "namespace": w.namespace, "pods": ",".join(worker_pods(w)), "lead_seconds": lead_seconds(w),
            "poll_seconds": POLL_SECONDS, "state": f"{state_mount['mountPath']}/{STATE_FILE}"})],
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"cpu": "200m", "memory": "128Mi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "privileged": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "runAsUser": USER, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [dict(config_mount), dict(state_mount),
                         {"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True}],
    }


def launcher_account(w: MpiJobBaseConfig) -> str:
    """The launcher's own ServiceAccount where the bucket's (Workload Identity) one is not used: never the
    namespace's `default`, whose grants every pod of the namespace would share (checkov CKV_K8S_42)."""
    return f"{w.name}-launcher"[:253]


def with_watch(launcher: dict[str, Any], w: MpiJobBaseConfig, image: Any, config_mount: dict[str, Any],
               state_mount: dict[str, Any]) -> None:
    spec = launcher["spec"]
    spec.setdefault("serviceAccountName", launcher_account(w))  # the bucket's account where there is one
    spec["initContainers"] = [*spec.get("initContainers", []), sidecar(w, image, config_mount, state_mount)]
    spec["volumes"] = [*spec["volumes"], token_volume()]


def prefer_no_maintenance(worker: dict[str, Any]) -> None:
    """Workers prefer nodes without pending maintenance (the label absent), beside whatever they require."""
    node = worker["spec"].setdefault("affinity", {}).setdefault("nodeAffinity", {})
    node.setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).append({
        "weight": 100, "preference": {"matchExpressions": [{"key": label(), "operator": "DoesNotExist"}]}})


def access_name(w: MpiJobBaseConfig) -> str:
    return f"deepspeed-stack-maintenance-{w.namespace}-{w.name}"[:253]


def access(w: MpiJobBaseConfig, service_account: str) -> list[dict[str, Any]]:
    """The launcher pod's ServiceAccount may read the workers and evict them, and read nodes: nothing else."""
    name, meta = access_name(w), {"labels": {"app.kubernetes.io/managed-by": "pulumi"}}
    subject = [{"kind": "ServiceAccount", "name": service_account, "namespace": w.namespace}]
    pods = worker_pods(w)
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {**meta, "name": name, "namespace": w.namespace},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "resourceNames": pods, "verbs": ["get"]},
                   {"apiGroups": [""], "resources": ["pods/eviction"], "resourceNames": pods, "verbs": ["create"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {**meta, "name": name, "namespace": w.namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}, "subjects": subject},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {**meta, "name": name},
         "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {**meta, "name": name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
         "subjects": subject},
    ]
