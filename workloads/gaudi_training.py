"""What the preview's "Training" section says of a Gaudi job running the recipe (`finetune` on kind mpijob): where
the data goes on the claim, the launcher's data step, the run's estimate in hours and card-hours (planner/gaudi_run.py,
from `finetune.datasetTokens` or `maxSteps`), and how the finished model is copied off the claim once the job's pods
are gone (the MPI operator deletes the workers at the end; the launcher pod, Completed, can no longer be exec'd into).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from model.types import MpiJobWorkloadConfig
from planner import run_hours
from planner.gaudi_run import gaudi_run
from recipes import contract
from workloads import pod_security, recipe
from workloads.finetune import data_step
from workloads.mpijob import gaudi_env

# The pod that reads the claim after the run: busybox (it has the `tar` kubectl cp needs) at a release tag, as the
# ranks' user (the files are theirs; NFS root_squash would make root nobody), hardened as the job's pods are (a
# namespace under Pod Security "restricted" admits it), the claim read-only. 1.37.0: busybox's release of
# 2024-09-26 (busybox.net news) [U: the Docker Hub tag and its digest not read here; a command for the user to run,
# not a resource of the stack].
FETCH_IMAGE = "busybox:1.37.0"
HARDENED = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True}


def fetch_pod(w: MpiJobWorkloadConfig) -> str:
    return f"{w.name}-fetch"


def fetch_commands(w: MpiJobWorkloadConfig) -> list[str]:
    """Start a throwaway pod mounting the claim, copy the model folder out with `kubectl cp`, delete the pod."""
    assert w.finetune is not None
    ns, pod, mount = w.namespace, fetch_pod(w), w.storage.mount_path
    uid = pod_security.GAUDI_USER
    overrides = {"spec": {
        "securityContext": {"runAsUser": uid, "runAsGroup": uid, "runAsNonRoot": True,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "automountServiceAccountToken": False,
        "volumes": [{"name": "claim", "persistentVolumeClaim": {"claimName": w.storage.claim_name, "readOnly": True}}],
        "containers": [{"name": "fetch", "image": FETCH_IMAGE, "command": ["sleep", "3600"],
                        "securityContext": HARDENED,
                        "volumeMounts": [{"name": "claim", "mountPath": mount, "readOnly": True}]}]}}
    model_dir = gaudi_env.recipe_roots(w).model_dir
    return [
        f"kubectl run -n {ns} {pod} --image={FETCH_IMAGE} --restart=Never "
        f"--overrides={shlex.quote(json.dumps(overrides, separators=(',', ':')))}",
        f"kubectl wait -n {ns} --for=condition=Ready pod/{pod} --timeout=5m",
        f"kubectl exec -n {ns} {pod} -- test -f {shlex.quote(f'{model_dir}/{contract.MARKER}')}   # finished",
        f"kubectl cp {ns}/{pod}:{model_dir} ./{w.name}",
        f"kubectl delete pod -n {ns} {pod}",
    ]


def summary(w: MpiJobWorkloadConfig, per_worker: int) -> dict[str, Any]:
    """The recipe's layout on the claim and what the Training section shows of the run."""
    assert w.finetune is not None
    where = gaudi_env.recipe_roots(w)
    f = w.finetune
    data = {"datasetOnClaim": where.under(f.dataset_path)} if f.dataset_path else {"datasetHub": f.dataset or ""}
    run = gaudi_run(w, per_worker)
    return {
        "checkpointDir": where.checkpoint_dir, "modelDir": where.model_dir, "model": recipe.model_arg(f, where),
        "recipeOnGaudi": True, **data, "launcherJob": f"{w.name}-launcher",
        "dataStep": data_step(w, run_hours.launcher(pod_security.LAUNCHER_RESOURCES)),
        "runHours": run.short() if run else "", "runEstimate": run.said() if run else "",
        "fetchModel": fetch_commands(w),
    }
