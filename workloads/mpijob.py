"""The Kubeflow `kubeflow.org/v2beta1` MPIJob of a workload, rendered as a plain dict.

A pure function of the typed config, so tests validate it against the operator's CRD schema and
the operator's own admission rules without running Pulumi. Two launchers share one shape:

- gaudi: the Omnia reference (Habana PyTorch image, optimum-habana's `gaudi_spawn.py` over DeepSpeed),
  minus what it got wrong: the HF token comes from a Secret (never a literal value), and nothing is
  sed-patched into `run_lora_clm.py` (the training processes get their environment through ssh).
- nvidia: the stack's own image on a GKE pool; the launcher runs `deepspeed --hostfile` on the
  operator's hostfile with the script and ds_config.json shipped in a ConfigMap.

How environment reaches the training processes: DeepSpeed starts them on the workers over ssh
(pdsh), and sshd never passes its pod's environment on. The launcher's ssh client sends the
variables named in `forwarded_env` (SendEnv) and the workers' sshd accepts them (AcceptEnv), so the
token travels from the launcher's Secret-backed environment, not through a file or a command line.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model import gaudi_software
from model.types import MpiJobWorkloadConfig
from workloads import fabric, gcs_fuse, kueue, pod_security, recovery
from workloads.ds_config import build_ds_config, nvme_volume, runs_hf_trainer
from workloads.placement import CONFIG_DIGEST_ANNOTATION, Placement, config_digest, labels

API_VERSION = "kubeflow.org/v2beta1"
KIND = "MPIJob"
SCRIPTS_DIR = Path(__file__).resolve().parent / "scripts"

# The ConfigMap the launcher and every worker mount (DeepSpeed reads ds_config.json on every rank).
CONFIG_DIR = "/etc/deepspeed"
DS_CONFIG_KEY = "ds_config.json"
SSH_CLIENT_KEY = "ssh_client.conf"
HF_TOKEN_KEY = "token"
# Both names: huggingface_hub reads HF_TOKEN, older transformers/optimum-habana HUGGING_FACE_HUB_TOKEN.
TOKEN_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")

CLAIM_VOLUME = "shared"
CONFIG_VOLUME = "deepspeed-config"
SSH_CONFIG_VOLUME = "ssh-client-config"
SHM_VOLUME = "dshm"

# Omnia's worker command: generate host keys, start sshd (it daemonizes), keep the pod alive.
GAUDI_SSHD = "/usr/sbin/sshd"
# The Omnia reference pins this key exchange on the launcher's ssh client; kept as it is.
GAUDI_KEX = "KexAlgorithms curve25519-sha256,sntrup761x25519-sha512@openssh.com"
OPTIMUM_HABANA_REPO = "https://github.com/huggingface/optimum-habana"
HABANA_DEEPSPEED_REPO = "https://github.com/HabanaAI/DeepSpeed.git"
GAUDI_EXAMPLE_DIR = "/optimum-habana/examples/language-modeling"

# The stack's image (workloads/images/deepspeed) runs as 1001 with sshd on 2222 (a port it may bind);
# the operator mounts the job's SSH key pair where that user's ssh looks for it.
NVIDIA_USER = 1001
NVIDIA_HOME = "/home/deepspeed"
NVIDIA_SSH_PORT = 2222

# DNS-1035 label: what the operator requires of `<job>-worker-<N-1>` (it becomes a Service host name).
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_LABEL_MAX = 63
RESTART_POLICIES = ("Never", "OnFailure")
CLEAN_POD_POLICIES = ("None", "Running", "All")


@dataclass(frozen=True)
class MpiJobInputs:
    """Everything the MPIJob needs besides the workload config: where it runs, what it runs, and the
    names of the objects created beside it."""

    workload: MpiJobWorkloadConfig
    placement: Placement
    image: str
    config_map: str
    hf_token_secret: str | None = None
    operator_version: str = "v0.8.0"  # what the cluster's mpi-operator knows decides the fields we may set
    gcs: gcs_fuse.GcsMount | None = None  # the stack's bucket over GCS FUSE (GKE only)
    image_pull_secret: str | None = None  # a kubernetes.io/dockerconfigjson Secret for a private registry
    queue: str | None = None  # the Kueue LocalQueue: the job is created suspended and waits to be admitted


# --- names ----------------------------------------------------------------------------------------

def config_map_name(job: str) -> str:
    return f"{job}-deepspeed"


def token_secret_name(job: str) -> str:
    return f"{job}-hf-token"


def worker_pod_name(job: str, workers: int) -> str:
    """The last worker's pod (and host) name the operator creates."""
    return f"{job}-worker-{workers - 1}"


def gaudi_image(w: MpiJobWorkloadConfig) -> str:
    """Habana's PyTorch installer image for the configured Gaudi software, OS and PyTorch versions: the
    pinned tag (and digest) of data/gaudi_software.yaml, or the moving `:latest` when none is recorded."""
    g = w.gaudi
    base = gaudi_software.base_image(g)
    if base is not None:
        return base.ref
    return (f"vault.habana.ai/gaudi-docker/{g.software_version}/{g.os}/habanalabs/"
            f"pytorch-installer-{g.pytorch_version}:latest")


habana_deepspeed_ref = gaudi_software.habana_deepspeed_ref


def gaudi_installs_at_start(w: MpiJobWorkloadConfig) -> bool:
    """Omnia's original path (opt-in): the stock image, software installed at every start, as root."""
    return w.installs_at_start


def runs_stack_gaudi_image(w: MpiJobWorkloadConfig) -> bool:
    """The default Gaudi path: the stack's Gaudi image (or an `image` built from it), hardened."""
    return w.runs_stack_gaudi_image


def launcher_image(w: MpiJobWorkloadConfig, stack_image: str | None, gaudi_built: str | None = None) -> str:
    """`image` overrides; else the stack's Gaudi image (or Habana's with the install-at-start opt-in) for
    gaudi, the stack's built image for nvidia."""
    if w.image:
        return w.image
    if gaudi_installs_at_start(w):
        return gaudi_image(w)
    if w.on_gaudi:
        if gaudi_built is None:
            raise ValueError(f"workload {w.name}: a Gaudi MPIJob needs the stack's Gaudi image or `image`")
        return gaudi_built
    if stack_image is None:
        raise ValueError(f"workload {w.name}: an nvidia MPIJob needs the stack's image or `image`")
    return stack_image


# --- environment ----------------------------------------------------------------------------------

def proxy_env(w: MpiJobWorkloadConfig) -> dict[str, str]:
    """Proxy variables from config, both spellings (pip/git read lowercase, some tools uppercase)."""
    env: dict[str, str] = {}
    for name, value in (("http_proxy", w.proxy.http), ("https_proxy", w.proxy.https)):
        if value:
            env[name] = env[name.upper()] = value
    env["no_proxy"] = env["NO_PROXY"] = w.proxy.no_proxy
    return env


def plain_env(w: MpiJobWorkloadConfig, where: Placement) -> dict[str, str]:
    """Non-secret variables of the launcher and workers."""
    env = {"HF_HOME": w.hf_home, **proxy_env(w)}
    if where.on_gaudi:
        # The names the Omnia launcher uses, so its command reads the same.
        env |= {"LLM_MODEL": w.training.model, "NUM_HPU": str(where.per_worker),
                "NUM_EPOCHS": str(w.training.epochs)}
    contract = fabric.pod_contract(where)
    if contract is not None:  # on the launcher too: DeepSpeed passes NCCL_* on to every rank
        env |= contract.env_dict()
    return env


def forwarded_env(w: MpiJobWorkloadConfig, where: Placement, has_token: bool) -> list[str]:
    """Variables the launcher's ssh sends to the training processes on the workers."""
    names = ["HF_HOME", *proxy_env(w)]
    if where.on_nvidia:
        # The image's ENV (python venv, GKE's driver libraries) is lost over ssh as well.
        names += ["PATH", "LD_LIBRARY_PATH"]
    if has_token:
        names += list(TOKEN_ENV)
    return names


def env_list(values: dict[str, str]) -> list[dict[str, Any]]:
    return [{"name": k, "value": v} for k, v in values.items()]


# The HF token reaches the launcher as a mounted file (never an env var in the pod spec); its script exports
# it for itself and for ssh to send on to the training processes.
TOKEN_VOLUME = "hf-token"
TOKEN_DIR = "/var/run/secrets/huggingface"


def token_preamble() -> str:
    return "\n".join(f'{name}="$(cat {TOKEN_DIR}/{HF_TOKEN_KEY})"; export {name}' for name in TOKEN_ENV) + "\n"


# --- DeepSpeed config and training arguments ------------------------------------------------------

def ds_config(w: MpiJobWorkloadConfig, where: Placement) -> dict[str, Any]:
    # The Gaudi job runs optimum-habana's Hugging Face Trainer; an nvidia job a plain DeepSpeed script, or the
    # Trainer when its script is finetune.py.
    gaudi_trainer = where.on_gaudi and not w.launch.command
    return build_ds_config(w.deepspeed, w.workers, where.per_worker,
                           hf_trainer=gaudi_trainer or runs_hf_trainer(w.launch.script))


def config_map_data(w: MpiJobWorkloadConfig, where: Placement, has_token: bool) -> dict[str, str]:
    """ds_config.json; the launcher's ssh client config (but for the install-at-start opt-in); for nvidia
    also the launch script."""
    data = {DS_CONFIG_KEY: json.dumps(ds_config(w, where), indent=2, sort_keys=True) + "\n"}
    if runs_stack_gaudi_image(w):
        data[SSH_CLIENT_KEY] = ssh_client_config(forwarded_env(w, where, has_token), [GAUDI_KEX])
    if where.on_nvidia:
        data[SSH_CLIENT_KEY] = ssh_client_config(forwarded_env(w, where, has_token))
        contract = fabric.pod_contract(where)
        if contract is not None:
            data[fabric.ENV_SCRIPT] = contract.env_script
        if not w.launch.command:
            data[w.launch.script] = (SCRIPTS_DIR / w.launch.script).read_text(encoding="utf-8")
    return data


def ssh_client_config(send_env: list[str], extra: list[str] | None = None) -> str:
    return "\n".join([
        "# deepspeed-stack: the workers' sshd listens on the image's port; their host keys are made at start-up.",
        f"Port {NVIDIA_SSH_PORT}",
        "StrictHostKeyChecking no",
        "UserKnownHostsFile /dev/null",
        "LogLevel ERROR",
        f"SendEnv {' '.join(send_env)}",
        *(extra or []),
        "",
    ])


def ds_bound_args(ds: dict[str, Any]) -> list[str]:
    """Trainer arguments that must match ds_config.json: the HF Trainer refuses to start when its
    batch size, accumulation, clipping or precision disagree with an explicit DeepSpeed config."""
    args = ["--per_device_train_batch_size", str(ds["train_micro_batch_size_per_gpu"]),
            "--gradient_accumulation_steps", str(ds["gradient_accumulation_steps"]),
            "--max_grad_norm", str(ds["gradient_clipping"])]
    if ds.get("bf16", {}).get("enabled"):
        args += ["--bf16", "True"]
    elif ds.get("fp16", {}).get("enabled"):
        args += ["--fp16", "True"]
    return args


def trainer_args(w: MpiJobWorkloadConfig) -> list[str]:
    """Omnia's knobs from typed keys: the learning rate (also what "auto" in ds_config.json resolves to)
    and the LoRA settings of run_lora_clm.py."""
    args = ["--learning_rate", str(w.deepspeed.learning_rate)]
    lora = w.training.lora
    if lora.enabled:
        args += ["--lora_rank", str(lora.rank), "--lora_alpha", str(lora.alpha), "--lora_dropout", str(lora.dropout),
                 "--lora_target_modules", *lora.target_modules]
    return args


# Flags the stack derives from other keys of the workload (their key paths); `training.args` must not
# repeat them (a model check says so).
RESERVED_TRAINING_FLAGS: dict[str, tuple[str, ...]] = {
    "--model_name_or_path": ("training", "model"),
    "--dataset_name": ("training", "dataset"),
    "--num_train_epochs": ("training", "epochs"),
    "--deepspeed": ("deepspeed",),
    "--per_device_train_batch_size": ("deepspeed", "microBatchPerGpu"),
    "--gradient_accumulation_steps": ("deepspeed", "gradientAccumulation"),
    "--max_grad_norm": ("deepspeed", "gradientClipping"),
    "--learning_rate": ("deepspeed", "learningRate"),
    "--lora_rank": ("training", "lora", "rank"),
    "--lora_alpha": ("training", "lora", "alpha"),
    "--lora_dropout": ("training", "lora", "dropout"),
    "--lora_target_modules": ("training", "lora", "targetModules"),
    "--bf16": ("deepspeed", "precision"),
    "--fp16": ("deepspeed", "precision"),
}


def reserved_flag(arg: str) -> tuple[str, ...] | None:
    """The workload keys that set this training argument, when the stack sets it already."""
    return RESERVED_TRAINING_FLAGS.get(arg.split("=", 1)[0])


# --- launcher and worker commands -----------------------------------------------------------------

def _q(args: list[str]) -> str:
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


def gaudi_setup_script(w: MpiJobWorkloadConfig) -> str:
    """Install optimum-habana and Habana's DeepSpeed; runs on the launcher and once on every worker."""
    ref = w.training.optimum_habana_version
    runner = "optimum/habana/distributed/distributed_runner.py"
    return "; ".join([
        "set -e",
        "rm -rf /optimum-habana",
        f"git clone --depth 1 --branch {shlex.quote(ref)} {OPTIMUM_HABANA_REPO} /optimum-habana",
        "cd /optimum-habana",
        # The launcher holds no cards and is not in the hostfile; with one worker DeepSpeed would run
        # "locally" on the launcher unless forced into multi-node mode. Matched by text (not by line
        # number as in Omnia) and verified, so a changed release fails here instead of training nowhere.
        f"sed -i 's|\"deepspeed --hostfile|\"deepspeed --force_multi --hostfile|' {runner}",
        f"grep -q -- --force_multi {runner}",
        "pip install .",
        "pip install -r examples/language-modeling/requirements.txt",
        f"pip install git+{HABANA_DEEPSPEED_REPO}@{habana_deepspeed_ref(w.gaudi.software_version)}",
    ])


def gaudi_train_command(w: MpiJobWorkloadConfig, where: Placement) -> str:
    world_size = w.workers * where.per_worker
    train = [
        "python", "../gaudi_spawn.py", '--hostfile="$HOSTSFILE"', "--use_deepspeed", "--world_size", str(world_size),
        shlex.quote(w.training.script), '--model_name_or_path "$LLM_MODEL"',
        "--dataset_name", shlex.quote(w.training.dataset), '--num_train_epochs "$NUM_EPOCHS"',
        "--deepspeed", shlex.quote(f"{CONFIG_DIR}/{DS_CONFIG_KEY}"),
        _q(ds_bound_args(ds_config(w, where))),
        _q(trainer_args(w)),
        "--output_dir", shlex.quote(f"{w.storage.mount_path}/output/{w.name}"),
        "--do_train", "--use_habana", "--use_lazy_mode", "--throughput_warmup_steps 3",
        _q(w.training.args),
    ]
    return " ".join(part for part in train if part)


def gaudi_image_launcher_script(w: MpiJobWorkloadConfig, where: Placement) -> str:
    """The stack's Gaudi image has everything installed: wait for the workers' sshd, then train."""
    return "\n".join([
        "set -eo pipefail",
        *HOSTFILE_PREAMBLE,
        f"cd {pod_security.GAUDI_EXAMPLES_DIR}",
        gaudi_train_command(w, where),
    ])


def gaudi_launcher_script(w: MpiJobWorkloadConfig, where: Placement, has_token: bool) -> str:
    """The install-at-start opt-in: Omnia's path (root, installs on every node at every start)."""
    send_env = forwarded_env(w, where, has_token)
    setup_env = " ".join(f"-x {name}" for name in ["HF_HOME", *proxy_env(w)])
    return "\n".join([
        "set -eo pipefail",
        *HOSTFILE_PREAMBLE,
        # ssh (DeepSpeed's pdsh) sends these to the workers, whose sshd accepts them: first lines win.
        f"printf '%s\\n' {shlex.quote('SendEnv ' + ' '.join(send_env))} {shlex.quote(GAUDI_KEX)} "
        "| cat - /etc/ssh/ssh_config > /tmp/ssh_config && cat /tmp/ssh_config > /etc/ssh/ssh_config",
        f"SETUP={shlex.quote(gaudi_setup_script(w))}",
        'bash -c "$SETUP"',
        f'mpirun --npernode 1 --tag-output --allow-run-as-root --prefix "$MPI_ROOT" {setup_env} bash -c "$SETUP"',
        f"cd {GAUDI_EXAMPLE_DIR}",
        gaudi_train_command(w, where),
    ])


def gaudi_worker_script(send_env: list[str]) -> str:
    return "\n".join([
        "/usr/bin/ssh-keygen -A",
        f"{GAUDI_SSHD} -o {shlex.quote('AcceptEnv=' + ' '.join(send_env))}",
        "exec sleep infinity",
    ])


def nvidia_launcher_script(w: MpiJobWorkloadConfig, where: Placement | None = None) -> str:
    script = f"{CONFIG_DIR}/{w.launch.script}"
    # On a GPU fabric each rank runs through the fabric's NCCL env script (workloads/fabric.py).
    rank = "" if fabric.pod_contract(where) is None else (
        " ".join(fabric.LAUNCH_FLAGS) + " " + fabric.rank_command(f"{CONFIG_DIR}/{fabric.ENV_SCRIPT}") + " ")
    return "\n".join([
        "set -eo pipefail",
        *HOSTFILE_PREAMBLE,
        # sshd resets PATH whatever the client sends (SendEnv): DeepSpeed's runner exports what ~/.deepspeed_env
        # lists to every rank, so the ranks find the image's venv (ninja for JIT-built ops) and driver libraries.
        'printf "PATH=%s\\nLD_LIBRARY_PATH=%s\\n" "$PATH" "${LD_LIBRARY_PATH:-}" >> "$HOME/.deepspeed_env"',
        # DeepSpeed runs `cd <this directory>` on every worker: the ConfigMap is mounted there too.
        f"cd {CONFIG_DIR}",
        # --force_multi: the launcher has no GPU and is not in the hostfile, even with one worker.
        'exec deepspeed --force_multi --hostfile "$HOSTSFILE" --master_addr "$MASTER_ADDR" '
        f"{rank}{shlex.quote(script)} --deepspeed_config {CONFIG_DIR}/{DS_CONFIG_KEY} {_q(w.launch.args)}".rstrip(),
    ])


def nvidia_worker_script(send_env: list[str], sshd_config: str | None = None) -> str:
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


# --- pod templates --------------------------------------------------------------------------------

def _volumes(inputs: MpiJobInputs, launcher: bool) -> list[dict[str, Any]]:
    w = inputs.workload
    volumes: list[dict[str, Any]] = [
        {"name": CLAIM_VOLUME, "persistentVolumeClaim": {"claimName": w.storage.claim_name, "readOnly": False}},
        {"name": CONFIG_VOLUME, "configMap": {"name": inputs.config_map}},
    ]
    if inputs.gcs:
        volumes.append(gcs_fuse.volume(inputs.gcs))
    if launcher and _ssh_client_config_mounted(w):
        volumes.append({"name": SSH_CONFIG_VOLUME, "configMap": {
            "name": inputs.config_map, "items": [{"key": SSH_CLIENT_KEY, "path": "deepspeed.conf"}]}})
    if launcher and inputs.hf_token_secret:
        # Group-readable for fsGroup: the image's user reads it, nobody else.
        volumes.append({"name": TOKEN_VOLUME, "secret": {"secretName": inputs.hf_token_secret, "defaultMode": 0o440}})
    return volumes


def _ssh_client_config_mounted(w: MpiJobWorkloadConfig) -> bool:
    """The stack's images read the launcher's ssh client settings from the ConfigMap (not the opt-in)."""
    return w.on_nvidia or runs_stack_gaudi_image(w)


def _mounts(w: MpiJobWorkloadConfig, gcs: gcs_fuse.GcsMount | None = None) -> list[dict[str, Any]]:
    mounts = [{"name": CLAIM_VOLUME, "mountPath": w.storage.mount_path},
              {"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True}]
    return [*mounts, gcs_fuse.volume_mount(gcs)] if gcs else mounts


# The pods' role, as the NetworkPolicy selects them (the operator copies template labels onto its pods).
ROLE_LABEL = "deepspeed-stack/role"


def pod_labels(w: MpiJobWorkloadConfig, role: str) -> dict[str, str]:
    return {"deepspeed-stack/workload": labels(w)["deepspeed-stack/workload"], ROLE_LABEL: role}


def _template(inputs: MpiJobInputs, spec: dict[str, Any], role: str = "") -> dict[str, Any]:
    """A pod template; with the bucket mounted, as the Workload Identity account with the FUSE sidecar."""
    if inputs.placement.on_nvidia:
        spec = _nvidia_security(spec)
    elif runs_stack_gaudi_image(inputs.workload):
        spec = pod_security.harden(spec, pod_security.GAUDI_USER)
    else:
        spec = pod_security.opt_in_security(spec)
    if inputs.image_pull_secret:
        spec["imagePullSecrets"] = [{"name": inputs.image_pull_secret}]
    # The ConfigMap's content in the spec: a new script or ds_config.json is a new spec, hence a new run.
    files = config_map_data(inputs.workload, inputs.placement, has_token=inputs.hf_token_secret is not None)
    annotations = {CONFIG_DIGEST_ANNOTATION: config_digest(files)}
    spec["terminationGracePeriodSeconds"] = recovery.TERMINATION_GRACE_SECONDS  # time to save on SIGTERM
    if inputs.gcs is not None:
        spec["serviceAccountName"] = inputs.gcs.service_account
        annotations.update(gcs_fuse.POD_ANNOTATIONS)
    if runs_stack_gaudi_image(inputs.workload) and role:
        annotations.update(pod_security.waiver_annotations(role, inputs.workload.host_ipc))
    meta: dict[str, Any] = {"annotations": annotations}
    if role:
        meta["labels"] = pod_labels(inputs.workload, role)
    return {"metadata": meta, "spec": spec}


def _container(name: str, image: str, script: str, env: list[dict[str, Any]],
               mounts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": name, "image": image, "imagePullPolicy": "IfNotPresent",
            "command": ["/bin/bash", "-c"], "args": [script], "env": env, "volumeMounts": mounts}


def _nvidia_security(spec: dict[str, Any]) -> dict[str, Any]:
    # fsGroup makes the operator's SSH key Secret readable by the image's user.
    spec["securityContext"] = {"runAsUser": NVIDIA_USER, "runAsGroup": NVIDIA_USER, "fsGroup": NVIDIA_USER,
                               "runAsNonRoot": True}
    return spec


def launcher_template(inputs: MpiJobInputs) -> dict[str, Any]:
    w, where = inputs.workload, inputs.placement
    has_token = inputs.hf_token_secret is not None
    env = env_list(plain_env(w, where))
    mounts = _mounts(w, inputs.gcs)
    if w.launch.command:
        script = w.launch.command
    elif runs_stack_gaudi_image(w):
        script = gaudi_image_launcher_script(w, where)
    elif where.on_gaudi:
        script = gaudi_launcher_script(w, where, has_token)
    else:
        script = nvidia_launcher_script(w, where)
    if _ssh_client_config_mounted(w):
        mounts.append({"name": SSH_CONFIG_VOLUME, "mountPath": "/etc/ssh/ssh_config.d", "readOnly": True})
    if has_token:
        mounts.append({"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True})
        script = token_preamble() + script
    container = _container(f"{w.name}-launcher", inputs.image, script, env, mounts)
    if where.on_gaudi:
        resources = dict(pod_security.LAUNCHER_RESOURCES)
        container["resources"] = {"limits": resources, "requests": dict(resources)}
    spec: dict[str, Any] = {"containers": [container], "volumes": _volumes(inputs, launcher=True)}
    return _template(inputs, spec, "launcher")


def worker_template(inputs: MpiJobInputs) -> dict[str, Any]:
    w, where = inputs.workload, inputs.placement
    send_env = forwarded_env(w, where, inputs.hf_token_secret is not None)
    limits = where.limits()
    mounts = [*_mounts(w, inputs.gcs), {"name": SHM_VOLUME, "mountPath": "/dev/shm"}]
    nvme = nvme_volume(w.deepspeed)  # the training ranks run on the workers: offloaded states go there
    if gaudi_installs_at_start(w):
        script = gaudi_worker_script(send_env)
    elif runs_stack_gaudi_image(w):
        script = nvidia_worker_script(send_env, pod_security.GAUDI_SSHD_CONFIG)
    else:
        script = nvidia_worker_script(send_env)
    # Workers carry no token: the training processes get it from the launcher over ssh.
    container = _container(f"{w.name}-worker", inputs.image, script, env_list(plain_env(w, where)), mounts)
    container["resources"] = {"limits": dict(limits), "requests": dict(limits)}
    if nvme:
        container["volumeMounts"].append(nvme[1])
    if not gaudi_installs_at_start(w):
        # Ready only once sshd listens, so WaitForWorkersReady really means "reachable".
        container["readinessProbe"] = {"tcpSocket": {"port": NVIDIA_SSH_PORT}, "periodSeconds": 5}
    if runs_stack_gaudi_image(w):
        container["livenessProbe"] = dict(pod_security.SSH_LIVENESS)
    spec: dict[str, Any] = {
        "containers": [container],
        "volumes": [*_volumes(inputs, launcher=False), {"name": SHM_VOLUME,
                                        "emptyDir": {"medium": "Memory", "sizeLimit": w.resources.shm_size}},
                    *([nvme[0]] if nvme else [])],
    }
    if w.host_ipc:
        spec["hostIPC"] = True
    if where.node_selector:
        spec["nodeSelector"] = dict(where.node_selector)
    if where.tolerations:
        spec["tolerations"] = [dict(t) for t in where.tolerations]
    if where.affinity:
        spec["affinity"] = copy.deepcopy(where.affinity)
    return _with_fabric(_template(inputs, spec, "worker"), fabric.pod_contract(where))


def _with_fabric(template: dict[str, Any], contract: fabric.PodContract | None) -> dict[str, Any]:
    """A worker on a GPU fabric: its NICs, the RxDM daemon as a native sidecar, the host's NCCL plugin and
    a /dev/shm for 8 GPUs (the NCCL variables are in plain_env already)."""
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


def render_spec(inputs: MpiJobInputs) -> dict[str, Any]:
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
            "Launcher": {"replicas": 1, "restartPolicy": "OnFailure", "template": launcher_template(inputs)},
            "Worker": {"replicas": w.workers, "restartPolicy": "Never", "template": worker_template(inputs)},
        },
    }
    if operator_knows_launcher_policy(inputs.operator_version):
        # mpi-operator >= 0.5: the launcher starts once every worker is Ready, so mpirun/pdsh do not race
        # the workers' sshd (the Omnia job had no such guard). An older operator's CRD has no such field, and
        # a server-side apply with an unknown field is refused: there the launcher's own wait covers it.
        spec["launcherCreationPolicy"] = "WaitForWorkersReady"
    if where.on_nvidia:
        spec["sshAuthMountPath"] = f"{NVIDIA_HOME}/.ssh"
    elif runs_stack_gaudi_image(w):
        spec["sshAuthMountPath"] = f"{pod_security.GAUDI_HOME}/.ssh"
    return spec


def operator_knows_launcher_policy(version: str) -> bool:
    major, minor, *_ = (int(part) for part in version.lstrip("v").split("."))
    return (major, minor) >= (0, 5)


def render(inputs: MpiJobInputs, namespace: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The whole MPIJob object (apiVersion, kind, metadata, spec)."""
    meta: dict[str, Any] = {"name": inputs.workload.name, "namespace": namespace}
    labels = {**(labels or {}), **kueue.job_labels(inputs.queue)}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": render_spec(inputs)}


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
