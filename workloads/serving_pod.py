"""The model server's pod template (a plain dict, validated in tests as a core/v1 Pod): the server container, its
volumes and env, the init container that waits for training's markers, the evaluator beside it, and the
ConfigMap's files.
"""

from __future__ import annotations

from typing import Any

from model import chat_templates
from model.serving_engines import MII, VLLM, vllm_facts
from model.types import ServeWorkloadConfig
from model.workload_serving import EVALS_MOUNT
from recipes import contract
from recipes.contract_programs import CONTRACT_FILES
from workloads import gcs_fuse, serving_fleet, serving_group
from workloads.placement import CONFIG_DIGEST_ANNOTATION, Placement, config_digest
from workloads.serving_command import (
    CHAT_TEMPLATE_FILE,
    CLIENT_ENDPOINTS_FILE,
    HF_TOKEN_DIR,
    HOME,
    SCRIPT_DIR,
    SERVER_SCRIPT,
    TOKEN_KEY,
    USER_ID,
    ServerInputs,
    command,
    container_ports,
    hardened,
    probes,
)
from workloads.serving_endpoint import pod_labels
from workloads.serving_evaluator import (
    EVALS_VOLUME,
    EVALUATOR_FILES,
    evals_volume,
    evaluator_container,
    evaluator_volumes,
)
from workloads.serving_source import ADAPTER_MARKER_TEXT, ModelSource, Wait, evaluates

SCRIPTS_DIR = contract.HERE  # recipes/
VLLM_FILES_VOLUME = "vllm-files"  # vLLM's own files of that ConfigMap, mounted at SCRIPT_DIR in its container
MARKER_POLL_SECONDS = 30
# The init container that waits for the model only runs `sh`: a little CPU and memory, requests = limits.
WAIT_RESOURCES = {"cpu": "100m", "memory": "64Mi"}


def _volumes(inp: ServerInputs) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    w = inp.workload
    volumes: list[dict[str, Any]] = [
        {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
        # HF_HOME (the download cache), Triton's, torch's and the engine's compiled-kernel caches: the only writable
        # place besides /tmp.
        {"name": "home", "emptyDir": {"sizeLimit": w.serving.cache_size}},
        # NCCL between the tensor-parallel ranks needs more than the runtime's 64 MiB of shared memory.
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": w.resources.shm_size}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "home", "mountPath": HOME},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    if w.serving.engine == MII:
        volumes.insert(0, {"name": "server", "configMap": {"name": inp.config_map, "defaultMode": 0o444}})
        mounts.insert(0, {"name": "server", "mountPath": SCRIPT_DIR, "readOnly": True})
    elif vllm_files(inp.source, inp.workload):
        # Only vLLM's own files of the ConfigMap (its --chat-template, its --middleware on PYTHONPATH): the
        # evaluator's scripts stay out of its import path (evaluate.py would shadow Hugging Face's `evaluate`).
        items = [{"key": name, "path": name} for name in vllm_files(inp.source, inp.workload)]
        volumes.insert(0, {"name": VLLM_FILES_VOLUME, "configMap": {"name": inp.config_map, "defaultMode": 0o444,
                                                                     "items": items}})
        mounts.insert(0, {"name": VLLM_FILES_VOLUME, "mountPath": SCRIPT_DIR, "readOnly": True})
    if inp.hf_token_secret:
        volumes.append({"name": "hf-token", "secret": {"secretName": inp.hf_token_secret, "defaultMode": 0o440,
                                                       "items": [{"key": TOKEN_KEY, "path": TOKEN_KEY}]}})
        mounts.append({"name": "hf-token", "mountPath": HF_TOKEN_DIR, "readOnly": True})
    if inp.gcs:
        # The model is only read: a read-only mount cannot damage the bucket (or the training run's output).
        volume = gcs_fuse.volume(inp.gcs)
        volume["csi"]["readOnly"] = True
        volumes.append(volume)
        mounts.append({**gcs_fuse.volume_mount(inp.gcs), "readOnly": True})
    if inp.gcs and inp.source.evaluated:
        # The copies that passed, read from the evaluator's own mount of evals/ (read-only in this container).
        volumes.append(evals_volume(inp.gcs))
        mounts.append({"name": EVALS_VOLUME, "mountPath": EVALS_MOUNT, "readOnly": True})
    return volumes, mounts


def vllm_files(source: ModelSource, w: ServeWorkloadConfig | None = None) -> list[str]:
    """The ConfigMap's files vLLM itself reads: the adapters' chat template, the evaluation's client middleware,
    and for one replica across nodes the group's launch script (and the fabric's NCCL environment beside it)."""
    group = serving_group.file_names(w.multi_node) if w is not None else []
    return [name for name, wanted in ((CHAT_TEMPLATE_FILE, source.chat_template is not None),
                                      (CLIENT_ENDPOINTS_FILE, source.evaluated)) if wanted] + group


def _env(inp: ServerInputs) -> list[dict[str, str]]:
    env = [{"name": k, "value": v} for k, v in vllm_facts().env.items()] if inp.workload.serving.engine == VLLM \
        else []
    if inp.source.evaluated:  # /v1/load_lora_adapter, for the evaluator only (not without evaluation)
        env.append({"name": vllm_facts().runtime_lora_env, "value": "true"})
        env.append({"name": "PYTHONPATH", "value": SCRIPT_DIR})  # where vLLM imports --middleware from
    # huggingface_hub reads the token from the file HF_TOKEN_PATH names: only the path is in the pod spec.
    if inp.hf_token_secret:
        env.append({"name": contract.HF_TOKEN_PATH_ENV, "value": f"{HF_TOKEN_DIR}/{TOKEN_KEY}"})
    return env


def script_files(w: ServeWorkloadConfig, source: ModelSource, where: Placement | None = None) -> dict[str, str]:
    """The ConfigMap's files: MII's entry script, or the evaluator's (vLLM itself runs from the image alone), the
    adapters' named chat template (vLLM's --chat-template file), and a group's launch script (on a GPU fabric pool
    with the fabric's NCCL environment script; `where`: the pool)."""
    names = ([SERVER_SCRIPT, *CONTRACT_FILES] if w.serving.engine == MII
             else [*EVALUATOR_FILES, CLIENT_ENDPOINTS_FILE] if evaluates(w) else [])
    # MII's entry script and the evaluator's modules import the recipes package (serve.py its options: SERVE): its
    # __init__ goes with them (recipes.py).
    files = contract.sources(*names) if names else {}
    template = chat_templates.template(source.chat_template) if source.chat_template else None
    if template is not None and w.serving.engine == VLLM:
        files[CHAT_TEMPLATE_FILE] = template
    if w.multi_node:
        files.update(serving_group.files(where))
    if serving_fleet.apart(w):  # each replica's adapter loader
        files[serving_fleet.LOADER_SCRIPT] = (SCRIPTS_DIR / serving_fleet.LOADER_SCRIPT).read_text(encoding="utf-8")
    return files


def wait_script(waits: tuple[Wait, ...]) -> str:
    """The init container's loop: until every training workload has written its marker (read through the same FUSE
    mount), an adapter's marker saying it is one; one marker after the other, each named with its trainer."""
    steps = []
    for i, wait in enumerate(waits):
        ready = f'[ -f "$MARKER{i}" ]' + (f" && grep -q '{ADAPTER_MARKER_TEXT}' \"$MARKER{i}\"" if wait.adapter else "")
        what = "an adapter export, written last" if wait.adapter else "written last"
        steps.append(f'until {ready}; do echo "waiting for $MARKER{i} ({what} by the training workload '
                     f'{wait.trainer})"; sleep {MARKER_POLL_SECONDS}; done; echo "{wait.trainer} ready:"; '
                     f'cat "$MARKER{i}"')
    return "; ".join(steps)


def wait_container(inp: ServerInputs, mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """Waits for every MODEL_DIR/.complete before the server starts: the pod stays in Init until training has ended
    (GKE injects the FUSE sidecar as the first, native-sidecar init container, so this one sees the mount)."""
    src = inp.source
    gcs_mounts = [mnt for mnt in mounts if mnt["name"] == gcs_fuse.VOLUME]
    return {
        "name": "wait-for-model",
        "image": inp.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", wait_script(src.waits)],
        "env": [{"name": f"MARKER{i}", "value": wait.marker} for i, wait in enumerate(src.waits)],
        "resources": {"requests": dict(WAIT_RESOURCES), "limits": dict(WAIT_RESOURCES)},
        "volumeMounts": gcs_mounts,
        "securityContext": hardened(),
    }


def pod_template(inp: ServerInputs) -> dict[str, Any]:
    """The Deployment's pod template: placement and resources from the pool, hardened, probed."""
    w, where = inp.workload, inp.placement
    volumes, mounts = _volumes(inp)
    limits = where.limits()
    # A new script rolls the pods.
    annotations = {CONFIG_DIGEST_ANNOTATION: config_digest(script_files(w, inp.source, where))}
    if inp.gcs:
        annotations.update(gcs_fuse.POD_ANNOTATIONS)
    cmd, args = command(inp)
    container = {
        "name": "server",
        "image": inp.image,
        "imagePullPolicy": "IfNotPresent",
        "command": cmd,
        "args": args,
        "ports": container_ports(w),
        "env": _env(inp),
        "resources": {"requests": dict(limits), "limits": dict(limits)},
        "volumeMounts": mounts,
        **probes(w),
        "securityContext": hardened(),
    }
    spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": USER_ID, "runAsGroup": USER_ID, "fsGroup": USER_ID,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "nodeSelector": dict(where.node_selector),
        "tolerations": [dict(t) for t in where.tolerations],
        "terminationGracePeriodSeconds": 60,
        "containers": [container],
        "volumes": volumes,
    }
    if inp.source.waits_for_training:
        spec["initContainers"] = [wait_container(inp, mounts)]
    if inp.source.evaluated and inp.gcs and serving_fleet.apart(w) and inp.role == serving_fleet.SERVER:
        serving_fleet.with_loader(spec, inp, EVALS_VOLUME)  # a replica of a fleet: it loads what was decided
    elif inp.source.evaluated and inp.gcs:
        spec["containers"].append(evaluator_container(inp, mounts))
        spec["volumes"] += evaluator_volumes(inp)
    if inp.gcs:
        spec["serviceAccountName"] = inp.gcs.service_account
    labels = pod_labels(w) if inp.role == serving_fleet.SERVER else {**pod_labels(w),
                                                                     **serving_fleet.evaluator_selector(w)}
    return {"metadata": {"labels": labels, "annotations": annotations}, "spec": spec}
