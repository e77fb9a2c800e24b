"""Hardened pod templates for the MPIJob's stack-built images, and the written waivers of what cannot pass.

Every pod: no service-account token (the job never calls the API server), seccomp RuntimeDefault, a non-root
user, and containers without privilege escalation, with every capability dropped and a read-only root
filesystem; what must be written goes to emptyDirs (/tmp, the user's home) or the shared claim. The launcher
gets CPU and memory requests and limits like the workers.

The Gaudi image (workloads/images/gaudi) is built for this: user 10001, sshd on 2222 from its own config
file, caches under /tmp. The NVIDIA image (workloads/images/deepspeed) runs as 1001 with sshd on 2222 (its
drop-in: PidFile /tmp/sshd.pid, no PAM); the workers' host key goes to /tmp, and the home is an emptyDir: the
launcher's ~/.deepspeed_env, and on the ranks DeepSpeed's JIT-built ops and Triton's cache (~/.cache, ~/.triton:
ranks start over ssh without the image's ENV, so at their default places under the home).
"""

from __future__ import annotations

from typing import Any

# The Gaudi image's user (a high UID, clear of host accounts) and its home, where the operator mounts the
# job's SSH key pair (sshAuthMountPath); its sshd listens on a port an unprivileged user may bind.
GAUDI_USER = 10001
GAUDI_HOME = "/home/deepspeed"
GAUDI_SSH_PORT = 2222
GAUDI_SSHD_CONFIG = "/etc/ssh/sshd_deepspeed_config"
# Where the image's optimum-habana checkout (examples, gaudi_spawn.py) lives.
GAUDI_EXAMPLES_DIR = "/opt/optimum-habana/examples/language-modeling"

# A worker whose sshd died can take no rank: the liveness probe ends it (restartPolicy Never fails the job).
SSH_LIVENESS = {"tcpSocket": {"port": GAUDI_SSH_PORT}, "initialDelaySeconds": 30, "periodSeconds": 30,
                "failureThreshold": 4}

TMP_VOLUME = "tmp"
# Habana logs, graph-compiler and Python caches (XDG_CACHE_HOME, HABANA_LOGS under /tmp); on NVIDIA torchrun's and
# torch's temporary files, sshd's host key and pid file.
TMP_SIZE = "16Gi"
HOME_VOLUME = "home"
# The NVIDIA ranks' ~/.cache/torch_extensions (DeepSpeed's JIT-built ops: CPUAdam, ...) and ~/.triton: the same
# room as /tmp, an assumption [U] (serve workloads size theirs with serving.cacheSize).
HOME_SIZE = "16Gi"
# The launcher only starts the ranks over ssh (DeepSpeed's pdsh runner), holds no accelerator and loads
# optimum-habana's runner once: a small fixed share of a node.
LAUNCHER_RESOURCES = {"cpu": "2", "memory": "8Gi"}
# The NVIDIA launcher runs DeepSpeed's runner alone (no optimum-habana): `import deepspeed,
# deepspeed.launcher.runner` took 249 MB of RSS on the e2e venv's CPU torch (measured 2026-11-23, as for the Helm
# chart's client, workloads/deepspeed_release.py); CUDA torch maps more [U]. 2Gi and 1 CPU, as the client has.
NVIDIA_LAUNCHER_RESOURCES = {"cpu": "1", "memory": "2Gi"}

# The NVIDIA image's user (workloads/images/deepspeed/Dockerfile: `useradd --uid 1001`, `USER 1001`) and home,
# where the operator mounts the job's SSH key pair (sshAuthMountPath).
NVIDIA_USER = 1001
NVIDIA_HOME = "/home/deepspeed"

# Checks the Gaudi pods cannot pass, by role, each with the documentation it rests on (three in all). They go on
# the pod templates as checkov's skip annotations, so a scan of the pods reports them as skipped, not failed.
HOST_IPC_CHECK = "CKV_K8S_18"
LAUNCHER_WAIVERS: dict[str, str] = {
    "CKV_K8S_8": (
        "no liveness probe: the launcher serves nothing and ends with its job; a restart mid-run would start "
        "the training again (https://kubernetes.io/docs/concepts/configuration/liveness-readiness-startup-probes/)"),
    "CKV_K8S_9": (
        "no readiness probe: readiness gates Service traffic and no Service sends any to the launcher "
        "(https://kubernetes.io/docs/concepts/configuration/liveness-readiness-startup-probes/)"),
}
WAIVERS: dict[str, dict[str, str]] = {
    "worker": {
        HOST_IPC_CHECK: (
            "hostIPC (only with hostIPC: true, as in the Omnia example): Intel Gaudi's Kubernetes documentation "
            "runs Gaudi pods with hostIPC: true (https://docs.habana.ai/en/latest/Orchestration/Gaudi_Kubernetes/"
            "index.html) and its docker instructions with the host IPC namespace (docker run --ipc host)"),
    },
    "launcher": dict(LAUNCHER_WAIVERS),
}
# Every pod of the stack's NVIDIA image (MPIJob launcher and workers, the NCCL test, the model server): checkov's
# CKV_K8S_40 wants a UID of 10000 or more, the image's one user is 1001.
IMAGE_UID_CHECK = "CKV_K8S_40"
NVIDIA_IMAGE_UID_WAIVER = {IMAGE_UID_CHECK: (
    "UID 1001, below 10000: the stack's DeepSpeed image has one user, 1001 (workloads/images/deepspeed/Dockerfile), "
    "the user the Bitnami DeepSpeed chart runs every container as (bitnami/deepspeed values.yaml: "
    "containerSecurityContext.runAsUser 1001), and sshd and ssh need a passwd entry for the user they run as")}
NVIDIA_WAIVERS: dict[str, dict[str, str]] = {
    "worker": dict(NVIDIA_IMAGE_UID_WAIVER),
    "launcher": {**LAUNCHER_WAIVERS, **NVIDIA_IMAGE_UID_WAIVER},
}
CHECKOV_SKIP = "checkov.io/skip{n}"


def merge_waivers(*waiver_sets: dict[str, str]) -> dict[str, str]:
    """One reason per check (a pod's annotation skips a check for all of its containers): reasons of the same check
    from several sources (the image, a fabric's daemon) joined."""
    merged: dict[str, str] = {}
    for waivers in waiver_sets:
        for check, why in waivers.items():
            merged[check] = f"{merged[check]}; {why}" if check in merged else why
    return merged


def skip_annotations(waivers: dict[str, str]) -> dict[str, str]:
    """checkov's skip annotations (`checkov.io/skipN: CHECK=reason`), one per waived check."""
    return {CHECKOV_SKIP.format(n=i): f"{check}={why}" for i, (check, why) in enumerate(sorted(waivers.items()), 1)}


def waiver_annotations(role: str, host_ipc: bool) -> dict[str, str]:
    """The Gaudi pods' skip annotations for the waivers that apply to the pod."""
    return skip_annotations({check: why for check, why in WAIVERS.get(role, {}).items()
                             if check != HOST_IPC_CHECK or host_ipc})


# With fsGroup, the kubelet changes the group (and mode) of every file of a volume that supports ownership management
# at each mount, recursively, by default ("Always"): on a shared claim (Filestore, NFS) holding a model cache and
# checkpoints that is a walk over millions of files at every pod start. OnRootMismatch skips it when the volume's
# root already has the group (Kubernetes: "Configure volume permission and ownership change policy for Pods",
# https://kubernetes.io/docs/tasks/configure-pod-container/security-context/; GA since 1.23).
FS_GROUP_CHANGE_POLICY = "OnRootMismatch"


def pod_security_context(user: int) -> dict[str, Any]:
    # fsGroup makes the operator's SSH key Secret and the token Secret readable by the image's user.
    return {"runAsUser": user, "runAsGroup": user, "fsGroup": user, "fsGroupChangePolicy": FS_GROUP_CHANGE_POLICY,
            "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}


def container_security_context(user: int) -> dict[str, Any]:
    return {"runAsUser": user, "runAsGroup": user, "runAsNonRoot": True, "allowPrivilegeEscalation": False,
            "privileged": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"}}


def tmp_volume() -> tuple[dict[str, Any], dict[str, Any]]:
    """(volume, mount): the writable /tmp of a read-only root filesystem."""
    return ({"name": TMP_VOLUME, "emptyDir": {"sizeLimit": TMP_SIZE}}, {"name": TMP_VOLUME, "mountPath": "/tmp"})


def home_volume(home: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(volume, mount): the user's writable home. The operator's SSH key Secret (sshAuthMountPath, home/.ssh) is
    mounted inside it: the runtime mounts the shallower path first."""
    return ({"name": HOME_VOLUME, "emptyDir": {"sizeLimit": HOME_SIZE}}, {"name": HOME_VOLUME, "mountPath": home})


def harden(spec: dict[str, Any], user: int, home: str | None = None) -> dict[str, Any]:
    """Pod and container security of a pod spec (in place): the stack's image, its own user; `home`: the user's
    home is written to (an emptyDir there too)."""
    spec["automountServiceAccountToken"] = False
    spec["securityContext"] = pod_security_context(user)
    writable = [tmp_volume(), *([home_volume(home)] if home else [])]
    spec["volumes"] = [*spec.get("volumes", []), *(volume for volume, _ in writable)]
    for c in spec["containers"]:
        c["securityContext"] = container_security_context(user)
        c["volumeMounts"] = [*c.get("volumeMounts", []), *(mount for _, mount in writable)]
    return spec


def opt_in_security(spec: dict[str, Any]) -> dict[str, Any]:
    """The install-at-start opt-in (Omnia's path as root: pip installs, /etc/ssh edits, mpirun as root): what
    still holds there. No token, RuntimeDefault seccomp, no privilege escalation."""
    spec["automountServiceAccountToken"] = False
    spec["securityContext"] = {"seccompProfile": {"type": "RuntimeDefault"}}
    for c in spec["containers"]:
        c["securityContext"] = {"allowPrivilegeEscalation": False, "privileged": False}
    return spec
