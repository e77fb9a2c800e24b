"""The pod templates of an MPIJob's launcher and workers, whatever its accelerator: the claim, the job's ConfigMap
and the bucket mounted on every pod; the launcher's ssh client settings and token; a worker's accelerators, memory,
/dev/shm, offload scratch, placement and GPU fabric. A path (nvidia.py, gaudi.py) brings its script, environment,
probes and pod security (`secure`); shape.py `render_spec` puts the two templates into the job.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from workloads import fabric, gcs_fuse, recovery
from workloads.ds_config import nvme_volume
from workloads.mpijob.shape import (
    CLAIM_VOLUME,
    CONFIG_DIR,
    CONFIG_VOLUME,
    SHM_VOLUME,
    SSH_CLIENT_KEY,
    SSH_CONFIG_VOLUME,
    TOKEN_DIR,
    TOKEN_VOLUME,
    MpiJobInputs,
    env_list,
    pod_labels,
    token_preamble,
)
from workloads.placement import CONFIG_DIGEST_ANNOTATION, config_digest

# A path's pod security: the spec in, the spec with its securityContext out.
Secure = Callable[[dict[str, Any]], dict[str, Any]]


def _volumes(inputs: MpiJobInputs, extra: list[dict[str, Any]]) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = [
        {"name": CLAIM_VOLUME, "persistentVolumeClaim": {
            "claimName": inputs.workload.storage.claim_name, "readOnly": False}},
        {"name": CONFIG_VOLUME, "configMap": {"name": inputs.config_map}},
    ]
    if inputs.gcs:
        volumes.append(gcs_fuse.volume(inputs.gcs))
    return [*volumes, *extra]


def _mounts(inputs: MpiJobInputs) -> list[dict[str, Any]]:
    mounts = [{"name": CLAIM_VOLUME, "mountPath": inputs.workload.storage.mount_path},
              {"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True}]
    return [*mounts, gcs_fuse.volume_mount(inputs.gcs)] if inputs.gcs else mounts


def _container(name: str, image: str, script: str, env: list[dict[str, Any]],
               mounts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": name, "image": image, "imagePullPolicy": "IfNotPresent",
            "command": ["/bin/bash", "-c"], "args": [script], "env": env, "volumeMounts": mounts}


def _template(inputs: MpiJobInputs, spec: dict[str, Any], role: str, files: dict[str, str], secure: Secure,
              annotations: dict[str, str]) -> dict[str, Any]:
    """A pod template; with the bucket mounted, as the Workload Identity account with the FUSE sidecar."""
    spec = secure(spec)
    if inputs.image_pull_secret:
        spec["imagePullSecrets"] = [{"name": inputs.image_pull_secret}]
    # The ConfigMap's content in the spec: a new script or ds_config.json is a new spec, hence a new run.
    meta_annotations = {CONFIG_DIGEST_ANNOTATION: config_digest(files)}
    # Time to save on SIGTERM (with tiered saves, and to copy that save).
    spec["terminationGracePeriodSeconds"] = recovery.grace_seconds(inputs.workload, inputs.placement.pool)
    if inputs.gcs is not None:
        spec["serviceAccountName"] = inputs.gcs.service_account
        meta_annotations.update(gcs_fuse.POD_ANNOTATIONS)
    meta_annotations.update(annotations)
    return {"metadata": {"annotations": meta_annotations, "labels": pod_labels(inputs.workload, role)},
            "spec": spec}


def launcher_template(inputs: MpiJobInputs, *, script: str, env: dict[str, str], files: dict[str, str],
                      secure: Secure, ssh_client: bool, resources: dict[str, str] | None = None,
                      annotations: dict[str, str] | None = None, volumes: list[dict[str, Any]] | None = None,
                      mounts: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The launcher's pod template: `script` (after the token's export, with a token), the claim, the ConfigMap,
    the bucket, `ssh_client`: the ConfigMap's ssh client settings as /etc/ssh/ssh_config.d/deepspeed.conf, and a
    path's extra `volumes` and `mounts`."""
    w = inputs.workload
    extra_volumes, pod_mounts = [], [*_mounts(inputs), *(mounts or [])]
    if ssh_client:
        extra_volumes.append({"name": SSH_CONFIG_VOLUME, "configMap": {
            "name": inputs.config_map, "items": [{"key": SSH_CLIENT_KEY, "path": "deepspeed.conf"}]}})
        pod_mounts.append({"name": SSH_CONFIG_VOLUME, "mountPath": "/etc/ssh/ssh_config.d", "readOnly": True})
    if inputs.has_token:
        # Group-readable for fsGroup: the image's user reads it, nobody else.
        extra_volumes.append({"name": TOKEN_VOLUME, "secret": {"secretName": inputs.hf_token_secret,
                                                               "defaultMode": 0o440}})
        pod_mounts.append({"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True})
        script = token_preamble() + script
    container = _container(f"{w.name}-launcher", inputs.image, script, env_list(env), pod_mounts)
    if resources:
        container["resources"] = {"limits": dict(resources), "requests": dict(resources)}
    spec: dict[str, Any] = {"containers": [container],
                            "volumes": _volumes(inputs, [*(volumes or []), *extra_volumes])}
    return _template(inputs, spec, "launcher", files, secure, annotations or {})


def worker_template(inputs: MpiJobInputs, *, script: str, env: dict[str, str], files: dict[str, str],
                    secure: Secure, probes: dict[str, dict[str, Any]], annotations: dict[str, str] | None = None,
                    volumes: list[dict[str, Any]] | None = None,
                    mounts: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A worker's pod template: `script` with its accelerators, CPU and memory (requests = limits), a memory-backed
    /dev/shm, the nvme offload's scratch, its placement on the nodes, `probes`, and on a GPU fabric the fabric's
    NICs and sidecars."""
    w, where = inputs.workload, inputs.placement
    limits = where.limits()
    pod_mounts = [*_mounts(inputs), {"name": SHM_VOLUME, "mountPath": "/dev/shm"}, *(mounts or [])]
    nvme = nvme_volume(w.deepspeed)  # the training ranks run on the workers: offloaded states go there
    # Workers carry no token: the training processes get it from the launcher over ssh.
    container = _container(f"{w.name}-worker", inputs.image, script, env_list(env), pod_mounts)
    container["resources"] = {"limits": dict(limits), "requests": dict(limits)}
    # The ranks run here: they get the notice.
    container["lifecycle"] = recovery.stop_ranks_hook(CONFIG_DIR, recovery.grace_seconds(w, where.pool))
    if nvme:
        container["volumeMounts"].append(nvme[1])
    container.update({k: dict(v) for k, v in probes.items()})
    spec: dict[str, Any] = {
        "containers": [container],
        "volumes": _volumes(inputs, [*(volumes or []), {"name": SHM_VOLUME, "emptyDir": {
            "medium": "Memory", "sizeLimit": w.resources.shm_size}}, *([nvme[0]] if nvme else [])]),
    }
    if w.shares_host_ipc:
        spec["hostIPC"] = True
    if where.node_selector:
        spec["nodeSelector"] = dict(where.node_selector)
    if where.tolerations:
        spec["tolerations"] = [dict(t) for t in where.tolerations]
    if where.affinity:
        spec["affinity"] = copy.deepcopy(where.affinity)
    template = _template(inputs, spec, "worker", files, secure, annotations or {})
    return _with_fabric(template, fabric.pod_contract(where))


def _with_fabric(template: dict[str, Any], contract: fabric.PodContract | None) -> dict[str, Any]:
    """A worker on a GPU fabric: its NICs, the RxDM daemon as a native sidecar, the host's NCCL plugin and
    a /dev/shm for 8 GPUs (the NCCL variables are in the path's env already)."""
    if contract is None:
        return template
    template["metadata"]["annotations"].update(contract.annotations)
    spec = template["spec"]
    spec["volumes"] += contract.volumes
    spec["containers"][0]["volumeMounts"] += contract.mounts
    if contract.sidecars:
        spec["initContainers"] = [*spec.get("initContainers", []), *contract.sidecars]
    if contract.shm_size:
        next(v for v in spec["volumes"] if v["name"] == SHM_VOLUME)["emptyDir"]["sizeLimit"] = contract.shm_size
    return template
