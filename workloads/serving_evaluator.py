"""The evaluator container (`serving.evaluation`, vLLM with adapters) and what the preview says of it.

An evaluator container beside vLLM (recipes/evaluator.py, shipped with evaluate.py in the ConfigMap)
serves the adapters instead of --lora-modules. vLLM starts with the base and the LoRA flags only, with
VLLM_ALLOW_RUNTIME_LORA_UPDATING=true, and no init container waits: the evaluator waits for each adapter's marker,
scores each new export against the base and the adapter served now on the user's task (evaluate.py against
127.0.0.1), writes evals/<adapter>/results.json and, when the export passes the gate (or there is none), copies it to
evals/<adapter>/adapter and loads that copy; it loads the copies again after a restart of vLLM. So vLLM never serves a
MODEL_DIR that was not scored (the scores would otherwise compare an export with itself, and a gate could not keep a
worse one out); on the first start it serves the base alone until the first export has been scored. A container,
not an init or native sidecar container: it needs the server running and must not hold up its start; its loop never
exits, so it never makes the pod not Ready. Its own GCS FUSE volume mounts only the bucket's evals/ folder,
read-write (data/gcs_fuse.yaml `evals`: only-dir, rename-dir-limit for the copy's rename); vLLM mounts the same
volume read-only at the same path (one gcsfuse mount: no stale cache between the writer and the reader), and the
bucket's own volume stays read-only in both. Its requests (data/node_memory.yaml podSidecars.evaluator) come off
what the server container is fitted to.
"""

from __future__ import annotations

from typing import Any

import msgspec

from model import node_memory
from model.types import ServeWorkloadConfig
from model.workload_serving import EVALS_MOUNT
from recipes import evaluate as recipes_evaluate
from recipes.contract_programs import CONTRACT_FILES, EVALUATOR
from workloads import gcs_fuse
from workloads.serving_command import HOME, SCRIPT_DIR, ServerInputs, hardened, served_port
from workloads.serving_source import ModelSource, in_bucket

EVALUATOR_SCRIPT = "evaluator.py"  # the evaluator container's loop; it runs EVALUATE_SCRIPT beside it
EVALUATE_SCRIPT = "evaluate.py"
# The evaluator's files: its loop, evaluate.py and its modules, and finetune.py's record reading (the same formats).
EVALUATOR_FILES = (EVALUATOR_SCRIPT, EVALUATE_SCRIPT, "evaluate_task.py", "evaluate_metrics.py", "evaluate_copies.py",
                   "finetune_data.py", "finetune_config.py", *CONTRACT_FILES)
EVALS_VOLUME = "evals"  # the bucket's evals/ folder alone (gcs_fuse profile `evals`)
EVALUATOR_SCRATCH_SIZE = "1Gi"  # its /tmp (the task's copy) and home (datasets' cache of the task)
# The evaluator's liveness: its writable mount still answers (a dead FUSE mount fails `test -d`).
# checkov's CKV_K8S_9 (a readiness probe on every container), waived on a pod with the evaluator: it serves nothing,
# and in the server's own pod its readiness would take the server out of its Service while an export is scored.
EVALUATOR_READINESS_WAIVER = {"CKV_K8S_9": (
    "the evaluator container serves no request: it scores adapter exports and loads them into vLLM over loopback; "
    "a readiness probe on it would take the pod's server out of its Service (workloads/serving_evaluator.py)")}
EVALUATOR_LIVENESS = {"exec": {"command": ["test", "-d", EVALS_MOUNT]}, "periodSeconds": 60, "timeoutSeconds": 10,
                      "failureThreshold": 3}


def evals_volume(gcs: gcs_fuse.GcsMount) -> dict[str, Any]:
    """The bucket's evals/ folder alone, writable (the evaluator's; vLLM mounts it read-only)."""
    volume = gcs_fuse.volume(msgspec.structs.replace(gcs, mount_options=gcs_fuse.mount_options("evals")))
    return {**volume, "name": EVALS_VOLUME}


def evaluator_args(inp: ServerInputs) -> list[str]:
    """evaluator.py's arguments: the local server, its base, the task in the bucket, each adapter's MODEL_DIR."""
    w, src = inp.workload, inp.source
    ev = w.serving.evaluation
    assert ev is not None
    gate = ev.min_improvement
    return [f"{SCRIPT_DIR}/{EVALUATOR_SCRIPT}", *EVALUATOR.argv({
        "url": f"http://127.0.0.1:{served_port(w)}", "base": src.served_name, "task": in_bucket(w, ev.task),
        "evals": EVALS_MOUNT, "max_tokens": ev.max_tokens,
        # lm-eval cuts prompts to the server's max length less the reply
        "max_length": w.model.sequence_length if w.model is not None else None,
        # The gate as it was always written, to 6 significant digits (:g); the declaration renders that float
        # back the same (0..1: no exponent form where repr and :g differ).
        "min_improvement": float(f"{gate:g}") if gate is not None else None, "metric": ev.metric,
        "adapter": [f"{adapter.name}={adapter.path}" for adapter in src.adapters]})]


def evaluator_container(inp: ServerInputs, mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """The evaluator (see the module's docstring): the bucket read-only at the server's path (MODEL_DIR and the
    task are the paths vLLM loads), evals/ writable, its own scratch; offline (a local task, no hub). A liveness
    probe on its writable mount; no readiness probe: it serves nothing, and its readiness would gate the server's."""
    resources = node_memory.evaluator_resources()
    bucket = [mnt for mnt in mounts if mnt["name"] == gcs_fuse.VOLUME]
    return {
        "name": "evaluator",
        "image": inp.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python"],
        "args": evaluator_args(inp),
        "workingDir": "/tmp",  # anything lm-eval or datasets writes beside it lands in a writable place
        "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}, {"name": "HF_DATASETS_OFFLINE", "value": "1"}],
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "volumeMounts": [{"name": "server", "mountPath": SCRIPT_DIR, "readOnly": True}, *bucket,
                         {"name": EVALS_VOLUME, "mountPath": EVALS_MOUNT},
                         {"name": "evaluator-tmp", "mountPath": "/tmp"}, {"name": "evaluator-home", "mountPath": HOME}],
        "livenessProbe": EVALUATOR_LIVENESS,
        "securityContext": hardened(),
    }


def evaluator_volumes(inp: ServerInputs) -> list[dict[str, Any]]:
    return [{"name": "server", "configMap": {"name": inp.config_map, "defaultMode": 0o444}},
            {"name": "evaluator-tmp", "emptyDir": {"sizeLimit": EVALUATOR_SCRATCH_SIZE}},
            {"name": "evaluator-home", "emptyDir": {"sizeLimit": EVALUATOR_SCRATCH_SIZE}}]


def evaluation_summary(w: ServeWorkloadConfig, source: ModelSource) -> dict[str, Any]:
    """Where the evaluator reads and writes (bucket paths) and how its gate decides (the preview's Serving)."""
    ev = w.serving.evaluation
    assert ev is not None
    evaluate = recipes_evaluate  # the gate's rule in words, from the program that applies it
    metrics = {a.name: ev.metric or (evaluate.LOGLIKELIHOOD if a.chat else evaluate.EXACT_MATCH)
               for a in source.adapters}
    return {"task": ev.task, "minImprovement": ev.min_improvement, "maxTokens": ev.max_tokens, "metric": metrics,
            "gate": {name: evaluate.gate_text(metric, ev.min_improvement) for name, metric in metrics.items()},
            "results": {a.name: f"evals/{a.name}/results.json" for a in source.adapters},
            "served": {a.name: f"evals/{a.name}/served.json" for a in source.adapters},
            "logs": f"kubectl logs -n {w.namespace} -f deploy/{evaluator_deployment(w)} -c evaluator",
            **({"decides": f"one evaluator pod (deployment {evaluator_deployment(w)}, a node of its own) for every "
                           "replica; each replica's adapter-loader serves what it decided (served.json)"}
               if w.evaluator_apart else {})}


def evaluator_deployment(w: ServeWorkloadConfig) -> str:
    """Where the evaluator runs: beside the one server, or in its own Deployment for a fleet (serving_fleet.py)."""
    return f"{w.name}-evaluator" if w.evaluator_apart else w.name
