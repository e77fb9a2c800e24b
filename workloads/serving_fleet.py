"""One truth for adapters across replicas (issue 42 item 1): with `serving.evaluation` and more than one replica (or
an autoscaler), one evaluator decides for the fleet and every replica serves what it decided.

- The evaluator runs in a pod of its own: the `<workload>-evaluator` Deployment, one replica, strategy Recreate (two
  evaluators never run at once: the old pod is gone before the new one starts), the single-node server's pod with
  the evaluator container beside vLLM (workloads/serving_evaluator.py), labelled component `evaluator`, so no
  Service, gateway or autoscaler selects it and no client reaches its vLLM (its NetworkPolicy admits nobody). It
  alone writes the bucket's evals/ folder: the versioned copies and EVALS/NAME/served.json, the decision.
- Each replica runs vLLM with runtime adapter loading (its adapter endpoints answer the pod's loopback alone:
  client_endpoints.py) and the adapter loader beside it (recipes/adapter_loader.py): it loads what
  served.json names at start, switches in place when the decision changes, and is Ready only once it serves every
  decided version, so a new replica takes no traffic before it serves what its peers serve. Its evals/ mount is
  read-only (the volume too); it scores and copies nothing.
The evaluator's pod takes one node of the pool more (vLLM holds the whole model to score an export against it): the
replicas check and the surge warning count it, and the preview's cost does.
The single-replica server keeps its evaluator in its own pod (no node more): one pod, one decision.
"""

from __future__ import annotations

from typing import Any

from model.serving_engines import VLLM
from model.types import ServeWorkloadConfig
from model.workload_serving import EVALS_MOUNT
from recipes.contract_programs import ADAPTER_LOADER
from workloads.serving_command import SCRIPT_DIR, ServerInputs, hardened, served_port
from workloads.serving_endpoint import COMPONENT_LABEL, selector

SERVER, EVALUATOR = "server", "evaluator"
LOADER_SCRIPT = "adapter_loader.py"
LOADER_TMP = "loader-tmp"
READY_FILE = "/tmp/adapter-loader/ready"
# The loader only polls vLLM and reads small JSON files: a little CPU and memory, requests = limits, taken from the
# room the node keeps for the evaluator (which runs in its own pod here).
LOADER_RESOURCES = {"cpu": "100m", "memory": "128Mi"}
# Ready once every decided version is served (the file the loader writes); a dead FUSE mount fails `test -d`.
LOADER_READINESS = {"exec": {"command": ["test", "-f", READY_FILE]}, "periodSeconds": 5, "timeoutSeconds": 5,
                    "failureThreshold": 1, "successThreshold": 1}
LOADER_LIVENESS = {"exec": {"command": ["test", "-d", EVALS_MOUNT]}, "periodSeconds": 60, "timeoutSeconds": 10,
                   "failureThreshold": 3}


def apart(w: ServeWorkloadConfig) -> bool:
    """The evaluator decides for a fleet from its own pod (vLLM with evaluation and several replicas)."""
    return w.evaluator_apart and w.serving.engine == VLLM


def evaluator_name(w: ServeWorkloadConfig) -> str:
    return f"{w.name}-evaluator"


def evaluator_selector(w: ServeWorkloadConfig) -> dict[str, str]:
    """The evaluator's pod: the workload's label, its own component (never the server's Service or gateway)."""
    return {**selector(w), COMPONENT_LABEL: EVALUATOR}


def loader_args(inp: ServerInputs) -> list[str]:
    w = inp.workload
    return [f"{SCRIPT_DIR}/{LOADER_SCRIPT}", *ADAPTER_LOADER.argv({
        "url": f"http://127.0.0.1:{served_port(w)}", "evals": EVALS_MOUNT, "ready": READY_FILE,
        "adapter": [adapter.name for adapter in inp.source.adapters]})]


def loader_container(inp: ServerInputs, evals_volume: str) -> dict[str, Any]:
    """The adapter loader beside a replica's vLLM (see the module's docstring): the ConfigMap's scripts, evals/
    read-only, its own /tmp for the readiness file."""
    return {
        "name": "adapter-loader",
        "image": inp.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python"],
        "args": loader_args(inp),
        "resources": {"requests": dict(LOADER_RESOURCES), "limits": dict(LOADER_RESOURCES)},
        "volumeMounts": [{"name": "server", "mountPath": SCRIPT_DIR, "readOnly": True},
                         {"name": evals_volume, "mountPath": EVALS_MOUNT, "readOnly": True},
                         {"name": LOADER_TMP, "mountPath": "/tmp"}],
        "readinessProbe": LOADER_READINESS,
        "livenessProbe": LOADER_LIVENESS,
        "securityContext": hardened(),
    }


def loader_volumes(inp: ServerInputs) -> list[dict[str, Any]]:
    return [{"name": "server", "configMap": {"name": inp.config_map, "defaultMode": 0o444}},
            {"name": LOADER_TMP, "emptyDir": {"sizeLimit": "16Mi"}}]


def with_loader(spec: dict[str, Any], inp: ServerInputs, evals_volume: str) -> None:
    """A replica of a fleet: the loader beside vLLM, and the evals/ volume itself read-only (nothing here writes)."""
    spec["containers"].append(loader_container(inp, evals_volume))
    spec["volumes"] += loader_volumes(inp)
    for volume in spec["volumes"]:
        if volume["name"] == evals_volume and "csi" in volume:
            volume["csi"]["readOnly"] = True


def evaluator_network_policy(w: ServeWorkloadConfig) -> dict[str, Any]:
    """The evaluator's pod admits nobody: it serves no client, and its evaluator reaches vLLM over loopback."""
    return {"podSelector": {"matchLabels": evaluator_selector(w)}, "policyTypes": ["Ingress"], "ingress": []}
