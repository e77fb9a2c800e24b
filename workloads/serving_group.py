"""One vLLM replica across nodes as a LeaderWorkerSet group (issue 42 item 3; `serving.nodesPerReplica` > 1).

A model no single node of the pool holds is served tensor-parallel over each node's GPUs and pipeline-parallel across
`nodesPerReplica` nodes, with vLLM's multiprocessing backend (no Ray; data/serving.yaml multiNode). The replicas are
a LeaderWorkerSet (leaderworkerset.x-k8s.io/v1, kubernetes-sigs/lws v0.10.0, its controller installed by the stack:
workloads/leader_worker_set.py): one group per replica, `size` pods each, one per node:

- the leader (worker index 0) runs vLLM's OpenAI server, node rank 0, the torch.distributed store on
  `--master-port`; it alone serves the API, so the Service, the probes and the PodMonitoring select leaders only
  (the label LWS puts on every pod: `leaderworkerset.sigs.k8s.io/worker-index`);
- each worker (index 1..size-1) runs `vllm serve ... --headless` with its index as its node rank: the engine's
  workers, no API server.
Both start through serve_group.sh (recipes), which reads what the LWS controller injects into every
container (LWS_LEADER_ADDRESS, LWS_GROUP_SIZE, LWS_WORKER_INDEX), refuses a group of another size than the stack
rendered, and execs the engine with `--nnodes/--node-rank/--master-addr/--master-port` (through the fabric's NCCL
environment script on a GPU fabric pool, so the cross-node traffic takes the fabric's NICs).

restartPolicy RecreateGroupOnPodRestart: a pod or container of a group that restarts recreates the whole group (a
pipeline with a stage gone cannot serve, and vLLM does not re-join a node). The rollout surges one whole group where
the pool has room for it, and never takes a lone group down first (the Deployment's rule: serving.py `rollout`).
Each pod is fitted to a node like the single-node server's; workers serve no port, so their liveness is the
process itself (a dead engine exits its container, which recreates the group): the checks for probes are waived on
the worker template with that reason.
"""

from __future__ import annotations

import copy
from typing import Any

from model.serving_engines import vllm_facts
from recipes import contract
from workloads import fabric
from workloads.placement import Placement

SCRIPTS_DIR = contract.HERE  # recipes/
API_VERSION = "leaderworkerset.x-k8s.io/v1"
KIND = "LeaderWorkerSet"
TYPE_TOKEN = f"kubernetes:{API_VERSION}:{KIND}"
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"  # LWS sets it on every pod; 0 is the leader
LEADER_ADDRESS_ENV, GROUP_SIZE_ENV, WORKER_INDEX_ENV = "LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX"
RESTART_POLICY = "RecreateGroupOnPodRestart"
GROUP_SCRIPT = "serve_group.sh"  # the launch of every pod of a group (recipes/serve_group.sh)
GROUP_NODES_ENV = "GROUP_NODES"  # the group size the stack rendered; the script refuses another
MASTER_PORT_ENV = "MASTER_PORT"
NCCL_ENV_SCRIPT_ENV = "NCCL_ENV_SCRIPT"  # on a fabric pool: the fabric's NCCL environment the engine runs through
WORKER_PROBE_WAIVERS = {
    check: ("a headless vLLM worker of a LeaderWorkerSet group serves no port to probe; its engine process is the "
            "container's, so a dead worker exits and the group is recreated (restartPolicy RecreateGroupOnPodRestart,"
            " kubernetes-sigs/lws v0.10.0 api/leaderworkerset/v1)")
    for check in ("CKV_K8S_8", "CKV_K8S_9")
}


def file_names(multi_node: bool) -> list[str]:
    """What a group's server container mounts of the ConfigMap: the launch script, and the fabric's NCCL
    environment script (shipped only on a fabric pool: `files`; an item of a missing key would fail the mount, so
    the env script is named only where shipped)."""
    return [GROUP_SCRIPT] if multi_node else []


def files(where: Placement | None) -> dict[str, str]:
    """The ConfigMap's files for a group: serve_group.sh, and on a GPU fabric pool the fabric's env script."""
    out = {GROUP_SCRIPT: (SCRIPTS_DIR / GROUP_SCRIPT).read_text(encoding="utf-8")}
    contract = fabric.pod_contract(where)
    if contract is not None:
        out[fabric.ENV_SCRIPT] = contract.env_script
    return out


def leader_selector(selector: dict[str, str]) -> dict[str, str]:
    """What selects the API of each group: the server's selector and the leader's worker index."""
    return {**selector, WORKER_INDEX_LABEL: "0"}


def group_args(engine_args: list[str], nodes: int) -> list[str]:
    """vLLM's arguments on every node of a group: the single-node server's with the pipeline across `nodes` (the
    node's GPUs stay its tensor-parallel size). The nodes' own flags (--nnodes, --node-rank, --master-addr,
    --master-port, and --headless on workers) are serve_group.sh's."""
    return [*engine_args, "--pipeline-parallel-size", str(nodes)]


def group_env(nodes: int, script_dir: str, on_fabric: bool) -> list[dict[str, str]]:
    env = [{"name": GROUP_NODES_ENV, "value": str(nodes)},
           {"name": MASTER_PORT_ENV, "value": str(vllm_facts().master_port)}]
    if on_fabric:
        env.append({"name": NCCL_ENV_SCRIPT_ENV, "value": f"{script_dir}/{fabric.ENV_SCRIPT}"})
    return env


def with_fabric(pod: dict[str, Any], where: Placement) -> dict[str, Any]:
    """A group's pod on a GPU fabric pool: the fabric's NICs, its daemon as a native sidecar, the host's NCCL
    plugin and its environment (the pipeline's activations cross nodes over NCCL), /dev/shm for 8 GPUs."""
    contract = fabric.pod_contract(where)
    if contract is None:
        return pod
    pod["metadata"].setdefault("annotations", {}).update(contract.annotations)
    spec = pod["spec"]
    server = spec["containers"][0]
    for volume in spec["volumes"]:  # the env script beside serve_group.sh, in the ConfigMap's items vLLM mounts
        items = volume.get("configMap", {}).get("items")
        if items is not None and any(i["key"] == GROUP_SCRIPT for i in items):
            items.append({"key": fabric.ENV_SCRIPT, "path": fabric.ENV_SCRIPT})
    spec["volumes"] += contract.volumes
    server["volumeMounts"] += contract.mounts
    server["env"] += contract.env
    if contract.sidecars:
        spec["initContainers"] = [*contract.sidecars, *spec.get("initContainers", [])]
    if contract.shm_size:
        next(v for v in spec["volumes"] if v["name"] == "dshm")["emptyDir"]["sizeLimit"] = contract.shm_size
    return pod


def _launch(pod: dict[str, Any], script_dir: str, nodes: int, on_fabric: bool) -> dict[str, Any]:
    server = pod["spec"]["containers"][0]
    server["command"] = ["/bin/sh", f"{script_dir}/{GROUP_SCRIPT}"]
    server["args"] = group_args(server["args"], nodes)
    server["env"] = [*server.get("env", []), *group_env(nodes, script_dir, on_fabric)]
    return pod


def leader_template(pod: dict[str, Any], script_dir: str, nodes: int, where: Placement) -> dict[str, Any]:
    """The leader: the single-node server's pod (probes, API port, init containers) launched as node rank 0."""
    leader = with_fabric(copy.deepcopy(pod), where)
    return _launch(leader, script_dir, nodes, fabric.pod_contract(where) is not None)


def worker_template(pod: dict[str, Any], script_dir: str, nodes: int, where: Placement) -> dict[str, Any]:
    """A worker: the same pod, engine and volumes, without the API's port and probes, and without the containers
    that only the API's pod needs (an evaluator is refused with nodesPerReplica; the wait for a trained model stays:
    every node loads it)."""
    worker = with_fabric(copy.deepcopy(pod), where)
    worker["metadata"].setdefault("annotations", {}).update(
        {f"checkov.io/skip{i}": f"{check}={why}" for i, (check, why) in enumerate(WORKER_PROBE_WAIVERS.items(), 90)})
    server = worker["spec"]["containers"][0]
    for key in ("ports", "startupProbe", "readinessProbe", "livenessProbe"):
        server.pop(key, None)
    worker["spec"]["containers"] = [server]
    return _launch(worker, script_dir, nodes, fabric.pod_contract(where) is not None)


def layout_text(gpus_per_node: int, nodes: int) -> str:
    """How one replica is split, as the summary says it."""
    return (f"tensor-parallel {gpus_per_node} x pipeline-parallel {nodes} ({nodes} nodes per replica, a "
            "LeaderWorkerSet group)")


def rollout(surge: dict[str, Any]) -> dict[str, Any]:
    """The Deployment's rule (serving.py `rollout`) in whole groups: surge one group, or replace one at a time."""
    return {"type": "RollingUpdate",
            "rollingUpdateConfiguration": {"maxSurge": surge["maxSurge"], "maxUnavailable": surge["maxUnavailable"]}}


def spec(replicas: int, nodes: int, leader: dict[str, Any], worker: dict[str, Any],
         surge: dict[str, Any]) -> dict[str, Any]:
    """The LeaderWorkerSet's spec: `replicas` groups of `nodes` pods, the leader first (LeaderCreated: the workers'
    StatefulSet is made with the leader pod, so every node loads its stage meanwhile), the group recreated whole."""
    return {
        "replicas": replicas,
        "startupPolicy": "LeaderCreated",
        "rolloutStrategy": rollout(surge),
        "networkConfig": {"subdomainPolicy": "Shared"},
        "leaderWorkerTemplate": {"size": nodes, "restartPolicy": RESTART_POLICY,
                                 "leaderTemplate": leader, "workerTemplate": worker},
    }


def pods(lws: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The leader's and a worker's pod as the controller creates them (for scanners that do not know the kind):
    the LeaderWorkerSet's own checkov waivers with each template's."""
    meta = lws.get("metadata") or {}
    waivers = {k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith("checkov.io/")}
    template = (lws.get("spec") or {}).get("leaderWorkerTemplate") or {}
    out = {}
    for role, key in (("leader", "leaderTemplate"), ("worker", "workerTemplate")):
        t = template.get(key) or {}
        t_meta = t.get("metadata") or {}
        out[role] = {"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": f"{meta.get('name', 'server')}-{role}",
                                  "namespace": meta.get("namespace", "default"),
                                  "labels": dict(t_meta.get("labels") or {}),
                                  "annotations": {**waivers, **(t_meta.get("annotations") or {})}},
                     "spec": t.get("spec") or {}}
    return out
