"""The shape every MPIJob of the stack shares, whatever its accelerator: names, the ConfigMap and claim every pod
mounts, the environment and how it reaches the training processes, the job's spec, and what the MPI operator
itself refuses.

The accelerator paths (nvidia.py, gaudi.py) decide what the pods run and how they are secured, and build their
pod templates with pod_templates.py `launcher_template` and `worker_template`; `render_spec` below puts them into
the job.

How environment reaches the training processes: DeepSpeed starts them on the workers over ssh (pdsh), and sshd
never passes its pod's environment on. The launcher's ssh client sends the variables a path names (SendEnv) and
the workers' sshd accepts them (AcceptEnv), so the token travels from the launcher's Secret-backed environment, not
through a file or a command line.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

import msgspec

from model.types import MpiJobBaseConfig
from workloads import fabric, gcs_fuse, kueue, recovery
from workloads.ds_config import build_ds_config
from workloads.placement import Placement, labels

API_VERSION = "kubeflow.org/v2beta1"
KIND = "MPIJob"

# The ConfigMap the launcher and every worker mount (DeepSpeed reads ds_config.json on every rank).
CONFIG_DIR = "/etc/deepspeed"
DS_CONFIG_KEY = "ds_config.json"
SSH_CLIENT_KEY = "ssh_client.conf"
HF_TOKEN_KEY = "token"
# Both names: huggingface_hub reads HF_TOKEN, older transformers/optimum-habana HUGGING_FACE_HUB_TOKEN.
TOKEN_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
# The HF token reaches the launcher as a mounted file (never an env var in the pod spec); its script exports
# it for itself and for ssh to send on to the training processes.
TOKEN_VOLUME = "hf-token"
TOKEN_DIR = "/var/run/secrets/huggingface"

CLAIM_VOLUME = "shared"
CONFIG_VOLUME = "deepspeed-config"
SSH_CONFIG_VOLUME = "ssh-client-config"
SHM_VOLUME = "dshm"

# Both of the stack's images (workloads/images/deepspeed and gaudi) run sshd on 2222, a port their user may bind.
SSH_PORT = 2222

# DNS-1035 label: what the operator requires of `<job>-worker-<N-1>` (it becomes a Service host name).
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_LABEL_MAX = 63
RESTART_POLICIES = ("Never", "OnFailure")
CLEAN_POD_POLICIES = ("None", "Running", "All")

# The pods' role, as the NetworkPolicy selects them (the operator copies template labels onto its pods).
ROLE_LABEL = "deepspeed-stack/role"


class MpiJobInputs(msgspec.Struct, frozen=True):
    """Everything the MPIJob needs besides the workload config: where it runs, what it runs, and the
    names of the objects created beside it."""

    workload: MpiJobBaseConfig
    placement: Placement
    image: str
    config_map: str
    hf_token_secret: str | None = None
    operator_version: str = "v0.8.0"  # what the cluster's mpi-operator knows decides the fields we may set
    gcs: gcs_fuse.GcsMount | None = None  # the stack's bucket over GCS FUSE (GKE only)
    image_pull_secret: str | None = None  # a kubernetes.io/dockerconfigjson Secret for a private registry
    queue: str | None = None  # the Kueue LocalQueue: the job is created suspended and waits to be admitted

    @property
    def has_token(self) -> bool:
        return self.hf_token_secret is not None


# --- names ----------------------------------------------------------------------------------------

def config_map_name(job: str) -> str:
    return f"{job}-deepspeed"


def token_secret_name(job: str) -> str:
    return f"{job}-hf-token"


def worker_pod_name(job: str, workers: int) -> str:
    """The last worker's pod (and host) name the operator creates."""
    return f"{job}-worker-{workers - 1}"


def pod_labels(w: MpiJobBaseConfig, role: str) -> dict[str, str]:
    return {"deepspeed-stack/workload": labels(w)["deepspeed-stack/workload"], ROLE_LABEL: role}


# --- environment ----------------------------------------------------------------------------------

def proxy_env(w: MpiJobBaseConfig) -> dict[str, str]:
    """Proxy variables from config, both spellings (pip/git read lowercase, some tools uppercase)."""
    env: dict[str, str] = {}
    for name, value in (("http_proxy", w.proxy.http), ("https_proxy", w.proxy.https)):
        if value:
            env[name] = env[name.upper()] = value
    env["no_proxy"] = env["NO_PROXY"] = w.proxy.no_proxy
    return env


def base_env(w: MpiJobBaseConfig) -> dict[str, str]:
    """What every launcher and worker gets: HF_HOME on the claim and the proxy."""
    return {"HF_HOME": w.cache_home, **proxy_env(w)}


def fabric_env(where: Placement) -> dict[str, str]:
    """A GPU fabric's NCCL variables; on the launcher too: DeepSpeed passes NCCL_* on to every rank."""
    contract = fabric.pod_contract(where)
    return contract.env_dict() if contract is not None else {}


def base_forwarded(w: MpiJobBaseConfig) -> list[str]:
    """What the launcher's ssh sends to every rank, whatever the path: HF_HOME and the proxy."""
    return ["HF_HOME", *proxy_env(w)]


def token_names(has_token: bool) -> list[str]:
    return list(TOKEN_ENV) if has_token else []


def env_list(values: dict[str, str]) -> list[dict[str, Any]]:
    return [{"name": k, "value": v} for k, v in values.items()]


def token_preamble() -> str:
    return "\n".join(f'{name}="$(cat {TOKEN_DIR}/{HF_TOKEN_KEY})"; export {name}' for name in TOKEN_ENV) + "\n"


def ssh_client_config(send_env: list[str], extra: list[str] | None = None) -> str:
    return "\n".join([
        "# deepspeed-stack: the workers' sshd listens on the image's port; their host keys are made at start-up.",
        f"Port {SSH_PORT}",
        "StrictHostKeyChecking no",
        "UserKnownHostsFile /dev/null",
        "LogLevel ERROR",
        f"SendEnv {' '.join(send_env)}",
        *(extra or []),
        "",
    ])


def ds_config(w: MpiJobBaseConfig, where: Placement, hf_trainer: bool) -> dict[str, Any]:
    """ds_config.json; `hf_trainer`: the ranks run the Hugging Face Trainer, which fills what it owns itself."""
    return build_ds_config(w.deepspeed, w.workers, where.per_worker, hf_trainer=hf_trainer)


def ds_config_text(w: MpiJobBaseConfig, where: Placement, hf_trainer: bool) -> str:
    return json.dumps(ds_config(w, where, hf_trainer), indent=2, sort_keys=True) + "\n"


# --- launcher and worker commands -----------------------------------------------------------------

def quote_args(args: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)


# The operator writes the workers into this hostfile ("<host> slots=N"); the first one is the master.
HOSTFILE_PREAMBLE = [
    'HOSTSFILE="$OMPI_MCA_orte_default_hostfile"',
    'export MASTER_ADDR="$(head -n 1 "$HOSTSFILE" | sed -n "s/[[:space:]]slots.*//p")"',
    # The API server must not go through the proxy.
    'export no_proxy="${no_proxy:+$no_proxy,}$KUBERNETES_SERVICE_HOST"',
    'export NO_PROXY="${NO_PROXY:+$NO_PROXY,}$KUBERNETES_SERVICE_HOST"',
    # Wait (bounded: 10 minutes) until every worker's sshd answers; the only guard on operators older than
    # v0.5.0, and cheap on newer ones.
    'for host in $(sed -n "s/[[:space:]]slots.*//p" "$HOSTSFILE"); do tries=120; '
    'until ssh -o ConnectTimeout=5 -o BatchMode=yes "$host" true 2>/dev/null; do '
    'tries=$((tries - 1)); [ "$tries" -gt 0 ] || { echo "worker $host never answered on ssh" >&2; exit 1; }; '
    'sleep 5; done; done',
]


def sshd_worker_script(send_env: list[str], sshd_config: str | None = None) -> str:
    """The stack's images' worker: a host key of its own, then sshd in the foreground on SSH_PORT."""
    key = "/tmp/ssh_host_ed25519_key"
    config = f"-f {sshd_config} " if sshd_config else ""
    return "\n".join([
        "set -e",
        # The image ships no host key (nothing private in an image); each worker makes its own.
        f"rm -f {key} {key}.pub",
        f"ssh-keygen -q -t ed25519 -N '' -f {key}",
        # StrictModes off: the operator's key Secret is mounted root-owned and group-readable (fsGroup).
        f"exec /usr/sbin/sshd -D -e {config}-h {key} -o StrictModes=no "
        f"-o {shlex.quote('AcceptEnv=' + ' '.join(send_env))}",
    ])


# Ready only once sshd listens, so WaitForWorkersReady really means "reachable".
SSH_READINESS = {"tcpSocket": {"port": SSH_PORT}, "periodSeconds": 5}


# --- the job --------------------------------------------------------------------------------------

def render_spec(inputs: MpiJobInputs, launcher: dict[str, Any], worker: dict[str, Any],
                ssh_auth_mount_path: str | None) -> dict[str, Any]:
    """The MPIJob's spec from a path's launcher and worker templates; `ssh_auth_mount_path`: where the image's
    user's ssh looks for the job's key pair (None: the operator's default, root's)."""
    w, where = inputs.workload, inputs.placement
    spec: dict[str, Any] = {
        "slotsPerWorker": where.per_worker,
        # Queued: no pods until Kueue admits the job (and unsuspends it) when all of them fit. The launcher
        # restarts OnFailure and the script resumes from its checkpoint; backoffLimit ends a run that can never
        # succeed (workloads/recovery.py).
        "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": recovery.MPIJOB_BACKOFF_LIMIT,
                      **({"suspend": True} if inputs.queue else {})},
        "mpiImplementation": "OpenMPI",
        "mpiReplicaSpecs": {
            "Launcher": {"replicas": 1, "restartPolicy": "OnFailure", "template": launcher},
            "Worker": {"replicas": w.workers, "restartPolicy": "Never", "template": worker},
        },
    }
    if operator_knows_launcher_policy(inputs.operator_version):
        # mpi-operator >= 0.5: the launcher starts once every worker is Ready, so mpirun/pdsh do not race
        # the workers' sshd (the Omnia job had no such guard). An older operator's CRD has no such field, and
        # a server-side apply with an unknown field is refused: there the launcher's own wait covers it.
        spec["launcherCreationPolicy"] = "WaitForWorkersReady"
    if ssh_auth_mount_path:
        spec["sshAuthMountPath"] = ssh_auth_mount_path
    return spec


def operator_knows_launcher_policy(version: str) -> bool:
    major, minor, *_ = (int(part) for part in version.lstrip("v").split("."))
    return (major, minor) >= (0, 5)


def render(inputs: MpiJobInputs, spec: dict[str, Any], namespace: str,
           labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The whole MPIJob object (apiVersion, kind, metadata, spec)."""
    meta: dict[str, Any] = {"name": inputs.workload.name, "namespace": namespace}
    labels = {**(labels or {}), **kueue.job_labels(inputs.queue)}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": spec}


# --- the operator's own rules ---------------------------------------------------------------------

def operator_problems(job: dict[str, Any]) -> list[str]:
    """What mpi-operator's validation rejects that the CRD schema does not (v2beta1 validation.go)."""
    problems: list[str] = []
    spec = job.get("spec") or {}
    name = (job.get("metadata") or {}).get("name", "")
    replicas = spec.get("mpiReplicaSpecs") or {}
    launcher, worker = replicas.get("Launcher"), replicas.get("Worker")
    if launcher is None:
        problems.append("spec.mpiReplicaSpecs.Launcher: required")
    elif launcher.get("replicas", 1) != 1:
        problems.append(f"spec.mpiReplicaSpecs.Launcher.replicas: must be 1, got {launcher.get('replicas')}")
    workers = (worker or {}).get("replicas", 1)
    if worker is not None and workers < 1:
        problems.append(f"spec.mpiReplicaSpecs.Worker.replicas: must be at least 1, got {workers}")
    for role, rs in replicas.items():
        policy = rs.get("restartPolicy", "Never")
        if policy not in RESTART_POLICIES:
            problems.append(f"spec.mpiReplicaSpecs.{role}.restartPolicy: must be Never or OnFailure, got {policy}")
        if not ((rs.get("template") or {}).get("spec") or {}).get("containers"):
            problems.append(f"spec.mpiReplicaSpecs.{role}.template.spec.containers: at least one container")
    clean = (spec.get("runPolicy") or {}).get("cleanPodPolicy")
    if clean is not None and clean not in CLEAN_POD_POLICIES:
        problems.append(f"spec.runPolicy.cleanPodPolicy: must be None, Running or All, got {clean}")
    if worker is not None and workers >= 1:
        host = worker_pod_name(name, workers)
        if not DNS1035_LABEL.match(host) or len(host) > DNS_LABEL_MAX:
            problems.append(f"metadata.name: {host!r} (the last worker) is not a DNS-1035 label "
                            f"(lowercase letters, digits, hyphens, starting with a letter, at most {DNS_LABEL_MAX})")
    return problems
