"""A reservation's end moves the run: a CronJob per ending reservation pool (`reservation-end-<pool>`, in Kueue's
namespace) runs recipes/reservation_end.py at the end's minute (UTC), in the stack's image. It sets the
reservation flavor's GPU quota to 0 and requeues the Workloads admitted to that flavor (deactivate, wait for the
admission to clear, reactivate), so Kueue admits them again on their fallback flavor; each resumes from its newest
checkpoint. Why a requeue, and the Kueue and mpi-operator lines each step relies on: the script's docstring.

Least access, nothing else:
- a ClusterRole: `patch` on the one ClusterQueue (the JSON patch needs no read first);
- a Role in each namespace whose queued jobs may run on an ending reservation (their `pool` or `fallbackPool`):
  `list` and `patch` on Kueue Workloads. `list`, because a Workload's name carries a hash of its job's UID (kueue
  pkg/controller/jobframework/workload_names.go 64-78), unknown before the job exists, so no `resourceNames`; the
  program also waits by listing again, so no `get` or `watch`.

The objects are plain dicts from pure functions, validated in tests against Kubernetes' schemas.
"""

from __future__ import annotations

import datetime
from typing import Any

from model import capacity
from model.types import NodePoolConfig, StackConfig, WorkloadConfig
from recipes import contract
from recipes.contract_programs import RESERVATION_END
from workloads import recovery
from workloads.pod_security import NVIDIA_IMAGE_UID_WAIVER, NVIDIA_USER, skip_annotations

END_JOB = "reservation-end"  # the ServiceAccount, ConfigMap and RBAC names of the CronJobs
ROLE = f"deepspeed-stack-{END_JOB}"
PROGRAM, API = "reservation_end.py", "kube_api.py"  # recipes/, shipped in the ConfigMap
MOUNT = "/opt/deepspeed-stack/reservation-end"
WAIT_MARGIN_SECONDS = 300  # beyond the grace period: Kueue's reconcilers and the operator's sync
WORKLOADS_RULE = {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["list", "patch"]}
# checkov's checks the CronJob cannot pass, each with its reason (skip annotations, as the fabric's daemons have).
WAIVERS = {
    "CKV_K8S_38": "the pod patches the ClusterQueue and the Workloads of the ending reservation: it needs its "
                  "ServiceAccount's token (a role that may patch that one ClusterQueue and list/patch Workloads)",
    # It runs the stack's own image (python3 and kube_api.py), whose one user is 1001, as every pod of that image.
    **NVIDIA_IMAGE_UID_WAIVER,
}


def _meta(name: str, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {"app.kubernetes.io/managed-by": "pulumi"}}
    return {**meta, "namespace": namespace} if namespace else meta


def job_name(pool: NodePoolConfig) -> str:
    return f"{END_JOB}-{pool.name}"[:52].rstrip("-")  # a CronJob's name: at most 52 characters


def ending(pools: list[NodePoolConfig]) -> list[NodePoolConfig]:
    return [p for p in pools if p.reservation_end_time is not None]


def _jobs(cfg: StackConfig, pool: NodePoolConfig) -> list[WorkloadConfig]:
    """The queued jobs that may be admitted to the pool's flavor (their `pool` or `fallbackPool`)."""
    return [w for w in cfg.workloads.values() if capacity.queued(cfg, w) and pool.name in (w.pool, w.fallback_pool)]


def namespaces(cfg: StackConfig, pool: NodePoolConfig) -> list[str]:
    """Where those jobs run."""
    return sorted({w.namespace for w in _jobs(cfg, pool)})


def wait_seconds(cfg: StackConfig, pool: NodePoolConfig) -> int:
    """How long the program waits for Kueue to clear an evicted job's admission: that happens once the job's pods
    are gone, within their grace period (workloads/recovery.py, from the save), so the longest one's plus a margin."""
    return max([recovery.grace_seconds(w) for w in _jobs(cfg, pool)], default=recovery.TERMINATION_GRACE_SECONDS) \
        + WAIT_MARGIN_SECONDS


def cron_schedule(end: datetime.datetime) -> str:
    """The end's minute in UTC as a cron line, rounded up (a cron line has no seconds): `0 0 4 12 *` for
    2026-12-04T00:00:00Z. Cron has no year either: it fires on that date every year, and the program acts only at
    the end's own (reservation_end.py `due`), never a year early on the first `pulumi up`, never a year later."""
    when = end.astimezone(datetime.UTC)
    if when.second or when.microsecond:
        when = when.replace(second=0, microsecond=0) + datetime.timedelta(minutes=1)
    return f"{when.minute} {when.hour} {when.day} {when.month} *"


def config_map() -> dict[str, Any]:
    namespace = capacity.load().reservation_end.namespace
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(END_JOB, namespace),
            "data": contract.sources(PROGRAM, API)}


def program_args(queue: str, pools: list[NodePoolConfig], pool: NodePoolConfig, where: list[str],
                 wait: int) -> list[str]:
    assert pool.reservation_end_text is not None
    return [f"{MOUNT}/{PROGRAM}", *RESERVATION_END.argv({
        "queue": queue, "flavor": pool.name, "index": [p.name for p in pools].index(pool.name),
        "end": pool.reservation_end_text, "namespaces": ",".join(where),
        "kueue_api": capacity.load().kueue_api_version, "wait_seconds": wait})]


def _pod(args: list[str], image: Any) -> dict[str, Any]:
    return {
        "serviceAccountName": END_JOB,
        "restartPolicy": "OnFailure",  # each step is idempotent (reservation_end.py)
        "securityContext": {"runAsNonRoot": True, "runAsUser": NVIDIA_USER, "runAsGroup": NVIDIA_USER,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{
            "name": "requeue", "image": image, "imagePullPolicy": "IfNotPresent",  # by digest
            "command": ["python3"], "args": args,
            "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"cpu": "200m", "memory": "128Mi"}},
            "securityContext": {"allowPrivilegeEscalation": False, "privileged": False, "readOnlyRootFilesystem": True,
                                "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}},
            "volumeMounts": [{"name": "program", "mountPath": MOUNT, "readOnly": True}],
        }],
        "volumes": [{"name": "program", "configMap": {"name": END_JOB}}],
    }


def cron_job(queue: str, pools: list[NodePoolConfig], pool: NodePoolConfig, where: list[str],
             image: Any, wait: int = recovery.TERMINATION_GRACE_SECONDS + WAIT_MARGIN_SECONDS) -> dict[str, Any]:
    """At the reservation's end (its minute, UTC): the quota to 0 and the requeue (reservation_end.py)."""
    assert pool.reservation_end_time is not None
    facts = capacity.load().reservation_end
    meta = _meta(job_name(pool), facts.namespace)
    return {"apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {**meta, "annotations": skip_annotations(WAIVERS)},
            "spec": {"schedule": cron_schedule(pool.reservation_end_time), "timeZone": facts.time_zone,
                     # Run late rather than never (the control plane busy at that minute): within a day.
                     "startingDeadlineSeconds": 86400, "concurrencyPolicy": "Forbid",
                     "successfulJobsHistoryLimit": 1, "failedJobsHistoryLimit": 3,
                     "jobTemplate": {"spec": {"backoffLimit": 6, "template": {
                         "metadata": {"labels": {"app.kubernetes.io/name": END_JOB}},
                         "spec": _pod(program_args(queue, pools, pool, where, wait), image)}}}}}


def cluster_access(queue: str) -> list[dict[str, Any]]:
    """The CronJobs' ServiceAccount, allowed to patch the one ClusterQueue (and, per namespace, namespace_access)."""
    namespace = capacity.load().reservation_end.namespace
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(END_JOB, namespace)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": _meta(ROLE),
         "rules": [{"apiGroups": ["kueue.x-k8s.io"], "resources": ["clusterqueues"], "resourceNames": [queue],
                    "verbs": ["patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": _meta(ROLE),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ROLE},
         "subjects": [{"kind": "ServiceAccount", "name": END_JOB, "namespace": namespace}]},
    ]


def namespace_access(namespace: str) -> list[dict[str, Any]]:
    """In a namespace of jobs that may run on an ending reservation: list and patch its Workloads."""
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(ROLE, namespace),
         "rules": [dict(WORKLOADS_RULE)]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": _meta(ROLE, namespace),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ROLE},
         "subjects": [{"kind": "ServiceAccount", "name": END_JOB,
                       "namespace": capacity.load().reservation_end.namespace}]},
    ]


def objects(queue: str, pools: list[NodePoolConfig], where: dict[str, list[str]], image: Any,
            waits: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """The cluster-wide objects: the program, its access to the ClusterQueue, a CronJob per ending pool (`where`:
    pool -> namespaces; `waits`: pool -> wait_seconds). The Roles come with their namespaces (namespace_access)."""
    if not ending(pools):
        return []
    waits = waits or {}
    return [config_map(), *cluster_access(queue),
            *(cron_job(queue, pools, p, where.get(p.name, []), image, *([waits[p.name]] if p.name in waits else []))
              for p in ending(pools))]
