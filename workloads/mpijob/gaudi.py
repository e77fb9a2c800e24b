"""The Gaudi MPIJob: the Omnia reference (optimum-habana's `gaudi_spawn.py` over DeepSpeed on `habana.ai/gaudi`
nodes of an existing cluster), minus what it got wrong: the HF token comes from a Secret (never a literal value),
and nothing is sed-patched into `run_lora_clm.py` (the training processes get their environment through ssh).

Two variants:
- the stack's Gaudi image (the default, workloads/images/gaudi): everything installed, hardened pods (non-root,
  sshd on SSH_PORT, written waivers for what Habana's runtime needs);
- the install-at-start opt-in (`gaudi.installAtStart`): Habana's stock image as root, optimum-habana and Habana's
  DeepSpeed installed on every node at every start, Omnia's worker command.
"""

from __future__ import annotations

import shlex
from typing import Any

from model import gaudi_software
from model.types import MpiJobWorkloadConfig
from recipes.contract import STACK_KEYS_ENV
from workloads import pod_security, recipe, recovery
from workloads.ds_config import runs_hf_trainer

# run_lora_clm.py's flags the stack sets or that `training.args` cannot give (workloads/kinds/mpijob.py reads them).
from workloads.mpijob.gaudi_flags import LAUNCHER_FLAGS, RESERVED_TRAINING_FLAGS, reserved_flag  # noqa: F401
from workloads.mpijob.nvidia import (
    CHECK_INPUTS,
    RUN_RANKS,
    STOP_WORKERS,
    check_inputs_function,
    final_status_guard,
    launcher_state,
    run_ranks_function,
    stop_workers_function,
    wait_for_paths,
)
from workloads.mpijob.shape import (
    CONFIG_DIR,
    DS_CONFIG_KEY,
    HOSTFILE_PREAMBLE,
    SSH_CLIENT_KEY,
    SSH_READINESS,
    MpiJobInputs,
    base_env,
    base_forwarded,
    ds_config,
    ds_config_text,
    fabric_env,
    launcher_template,
    proxy_env,
    quote_args,
    ssh_client_config,
    sshd_worker_script,
    token_names,
    worker_template,
)
from workloads.mpijob.shape import render_spec as shape_spec
from workloads.placement import Placement

# Omnia's worker command: generate host keys, start sshd (it daemonizes), keep the pod alive.
GAUDI_SSHD = "/usr/sbin/sshd"
# The Omnia reference pins this key exchange on the launcher's ssh client; kept as it is.
GAUDI_KEX = "KexAlgorithms curve25519-sha256,sntrup761x25519-sha512@openssh.com"
OPTIMUM_HABANA_REPO = "https://github.com/huggingface/optimum-habana"
HABANA_DEEPSPEED_REPO = "https://github.com/HabanaAI/DeepSpeed.git"
GAUDI_EXAMPLE_DIR = "/optimum-habana/examples/language-modeling"

habana_deepspeed_ref = gaudi_software.habana_deepspeed_ref
GAUDI_RANKS_USER = pod_security.GAUDI_USER  # the stack's Gaudi image's user and group (workloads/images/gaudi)


def gaudi_image(w: MpiJobWorkloadConfig) -> str:
    """Habana's PyTorch installer image for the configured Gaudi software, OS and PyTorch versions: the
    pinned tag (and digest) of data/gaudi_software.yaml, or the moving `:latest` when none is recorded."""
    g = w.gaudi
    base = gaudi_software.base_image(g)
    if base is not None:
        return base.ref
    return (f"vault.habana.ai/gaudi-docker/{g.software_version}/{g.os}/habanalabs/"
            f"pytorch-installer-{g.pytorch_version}:latest")


def image(w: MpiJobWorkloadConfig, gaudi_built: str | None) -> str:
    """`image` overrides; else Habana's stock image with the install-at-start opt-in, the stack's Gaudi image."""
    if w.image:
        return w.image
    if w.installs_at_start:
        return gaudi_image(w)
    if gaudi_built is None:
        raise ValueError(f"workload {w.name}: a Gaudi MPIJob needs the stack's Gaudi image or `image`")
    return gaudi_built


# --- environment ----------------------------------------------------------------------------------

# `env` reaches the ranks through DeepSpeed's runner, not ssh: the image's sshd sets its own variables (SetEnv, which
# wins over what a client sends) and accepts only the names the stack forwards, so an HCCL_* of the pod would never
# reach a rank. DeepSpeed's runner reads NAME=VALUE lines from DS_ENV_FILE (deepspeed/launcher/runner.py,
# DEEPSPEED_ENVIRONMENT_NAME; an absolute path is used as it is) and prefixes every rank's command with
# `export NAME=VALUE;` (PDSHRunner), after the ssh session's environment is set.
ENV_FILE_KEY = "deepspeed_env"
DS_ENV_FILE = "DS_ENV_FILE"
RECIPE_KEYS_ENV = STACK_KEYS_ENV

# Names `env` may not set, and the key (or the part of the stack) that sets each.
STACK_ENV: dict[str, str] = {
    "HF_HOME": "hfHome", "LLM_MODEL": "training.model", "NUM_HPU": "accelerator.count",
    "NUM_EPOCHS": "training.epochs", "http_proxy": "proxy.http", "HTTP_PROXY": "proxy.http",
    "https_proxy": "proxy.https", "HTTPS_PROXY": "proxy.https", "no_proxy": "proxy.noProxy",
    "NO_PROXY": "proxy.noProxy", "HF_TOKEN": "hfToken", "HUGGING_FACE_HUB_TOKEN": "hfToken",
    DS_ENV_FILE: "env itself (the file of these variables)", "MASTER_ADDR": "the launcher (the first worker)",
    "HOSTSFILE": "the launcher (the operator's hostfile)", "PATH": "the image", "LD_LIBRARY_PATH": "the image",
    "HOME": "the image", "USER": "the image", "K_MPI_JOB_ROLE": "the MPI operator",
    "CHECKPOINT_DIR": "the stack (finetune: <claim>/deepspeed-stack/checkpoints/<workload>)",
    "MODEL_DIR": "the stack (finetune: <claim>/deepspeed-stack/models/<workload>)",
    RECIPE_KEYS_ENV: "the stack (finetune)",
}
# The MPI operator sets Open MPI's variables on the launcher (the hostfile, the ssh agent).
STACK_ENV_PREFIXES: dict[str, str] = {"OMPI_": "the MPI operator"}


def stack_env_owner(name: str) -> str | None:
    """Who sets an environment variable of the Gaudi job already (None: `env` may set it)."""
    if name in STACK_ENV:
        return STACK_ENV[name]
    return next((owner for prefix, owner in STACK_ENV_PREFIXES.items() if name.startswith(prefix)), None)


def env_file(w: MpiJobWorkloadConfig) -> str:
    """`env` as DeepSpeed's runner reads it: NAME=VALUE lines (it quotes each value itself)."""
    return "".join(f"{name}={value}\n" for name, value in w.env.items())


def recipe_roots(w: MpiJobWorkloadConfig) -> recipe.RecipeRoots:
    """The recipe's roots on Gaudi: your data and the outputs on the shared claim, ds_config.json and the script in
    the job's ConfigMap."""
    return recipe.RecipeRoots(data=w.storage.mount_path.rstrip("/") or "/", output=w.output_root, config=CONFIG_DIR,
                              name=w.name)


def recipe_env(w: MpiJobWorkloadConfig) -> dict[str, str]:
    """With `finetune`: the contract's folders (as finetune.py's arguments say too) and the stack's key for each
    flag (the script's errors name workloads.<name>.finetune.*)."""
    if w.finetune is None:
        return {}
    where = recipe_roots(w)
    return {"CHECKPOINT_DIR": where.checkpoint_dir, "MODEL_DIR": where.model_dir, **recipe_launch(w).env}


def recipe_launch(w: MpiJobWorkloadConfig) -> recipe.RecipeLaunch:
    """The recipe's launch on Gaudi (workloads/recipe.py `launch`, as on GKE and Vertex AI)."""
    assert w.finetune is not None
    return recipe.launch(w.finetune, w.deepspeed.learning_rate, recipe_roots(w), ("workloads", w.name),
                         w.launch.args)


def plain_env(w: MpiJobWorkloadConfig, where: Placement) -> dict[str, str]:
    """Non-secret variables of the launcher and workers; LLM_MODEL, NUM_HPU and NUM_EPOCHS are the names the Omnia
    launcher uses, so its command reads the same (`training`'s run only). `env` too, and where DeepSpeed's runner
    finds it for the ranks."""
    ranks = {**w.env, DS_ENV_FILE: f"{CONFIG_DIR}/{ENV_FILE_KEY}"} if w.env else {}
    omnia = {} if w.finetune is not None else {"LLM_MODEL": w.training.model, "NUM_EPOCHS": str(w.training.epochs)}
    return {**base_env(w), **omnia, "NUM_HPU": str(where.per_worker), **recipe_env(w), **fabric_env(where), **ranks}


def forwarded_env(w: MpiJobWorkloadConfig, where: Placement, has_token: bool) -> list[str]:
    """Variables the launcher's ssh sends to the training processes on the workers."""
    return [*base_forwarded(w), *recipe_env(w), *token_names(has_token)]


def hf_trainer(w: MpiJobWorkloadConfig) -> bool:
    """optimum-habana's script runs the Hugging Face Trainer (so do finetune.py and a `launch.command` running one
    of ours)."""
    return w.finetune is not None or not w.launch.command or runs_hf_trainer(w.launch.script)


def config_map_data(w: MpiJobWorkloadConfig, where: Placement, has_token: bool) -> dict[str, str]:
    """ds_config.json; with `finetune` the recipe (finetune.py, its modules, a named chat template); the launcher's
    ssh client config (but for the install-at-start opt-in)."""
    text = ds_config_text(w, where, hf_trainer(w))
    shipped = recipe.recipe_files(w.finetune, text) if w.finetune is not None else {}
    data = {**shipped, DS_CONFIG_KEY: text, **recovery.stop_ranks_file()}
    if w.env:
        data[ENV_FILE_KEY] = env_file(w)
    if w.runs_stack_gaudi_image:
        data[SSH_CLIENT_KEY] = ssh_client_config(forwarded_env(w, where, has_token), [GAUDI_KEX])
    return data


# --- training arguments ---------------------------------------------------------------------------

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


# --- launcher and worker commands -----------------------------------------------------------------

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


def recipe_args(w: MpiJobWorkloadConfig) -> list[str]:
    """finetune.py's arguments on Gaudi: the recipe's (workloads/recipe.py, as on GKE and Vertex AI), then
    `launch.args`."""
    assert w.finetune is not None
    return recipe_launch(w).args


def recipe_train_command(w: MpiJobWorkloadConfig, where: Placement) -> str:
    """finetune.py on every card through optimum-habana's launcher (gaudi_spawn.py: DeepSpeed's runner over the
    operator's hostfile, as for its own examples); on HPU the script trains with optimum-habana's GaudiTrainer
    (finetune_hpu.py)."""
    world_size = w.workers * where.per_worker
    return " ".join([RUN_RANKS, "python", "../gaudi_spawn.py", '--hostfile="$HOSTSFILE"', "--use_deepspeed",
                     "--world_size", str(world_size),
                     quote_args([f"{CONFIG_DIR}/{recipe.SCRIPT.name}", *recipe_args(w)])])


def train_command(w: MpiJobWorkloadConfig, where: Placement) -> str:
    """The recipe with `finetune`, else `training`'s optimum-habana example (Omnia's run), through the launcher's
    run_ranks (the final status remembered, a stop passed on)."""
    return recipe_train_command(w, where) if w.finetune is not None else gaudi_train_command(w, where)


def data_inputs(w: MpiJobWorkloadConfig) -> list[str]:
    """The recipe's inputs on the claim, as the pods see them: the launcher waits for them (copied onto the claim
    after `pulumi up`)."""
    return [recipe_roots(w).under(path) for path in recipe.data_paths(w.finetune)] if w.finetune else []


def data_step_command(w: MpiJobWorkloadConfig) -> list[str]:
    """The launcher's data step before gaudi_spawn.py starts the ranks, as on GKE (workloads/finetune.py
    data_check_command): finetune.py --prepare-data checks the data (exit 2: bad data, final) and tokenizes every
    record once into <checkpoints>/tokenized/ on the claim, which the ranks memory-map. It needs no card: the
    tokenizer and datasets only."""
    if w.finetune is None:
        return []
    return ["python", f"{CONFIG_DIR}/{recipe.SCRIPT.name}", "--prepare-data", *recipe_args(w)]


def final_errors(w: MpiJobWorkloadConfig) -> list[str]:
    """The NVIDIA launcher's guard and stop (workloads/mpijob/nvidia.py): an earlier attempt's final status (exit 2:
    bad arguments or data) stops every later attempt at once, the input check's and the ranks' alike; on SIGTERM
    the launcher asks every worker's preStop hook (stop_ranks.py over ssh: the ranks save, then stop) and waits
    until gaudi_spawn.py ends with the ranks' status, never signalling DeepSpeed's runner (whose PDSH handler would
    SIGKILL the ranks 30 s later: workloads/recovery.py). gaudi_spawn.py and the runner under it run in a process
    group of their own, which the launcher waits out."""
    grace = recovery.grace_seconds(w)
    return [final_status_guard(), *stop_workers_function(grace), *run_ranks_function(group=True, stop=STOP_WORKERS),
            *check_inputs_function()]


def data_step(w: MpiJobWorkloadConfig) -> list[str]:
    """Wait for the recipe's inputs on the claim, then its data step (nothing without `finetune`)."""
    if w.finetune is None:
        return []
    waits = data_inputs(w)
    return [*([wait_for_paths(waits, "copy it onto the claim")] if waits else []),
            f"{CHECK_INPUTS} {quote_args(data_step_command(w))}"]


def gaudi_train_command(w: MpiJobWorkloadConfig, where: Placement) -> str:
    world_size = w.workers * where.per_worker
    train = [
        RUN_RANKS, "python", "../gaudi_spawn.py", '--hostfile="$HOSTSFILE"', "--use_deepspeed",
        "--world_size", str(world_size),
        shlex.quote(w.training.script), '--model_name_or_path "$LLM_MODEL"',
        "--dataset_name", shlex.quote(w.training.dataset), '--num_train_epochs "$NUM_EPOCHS"',
        "--deepspeed", shlex.quote(f"{CONFIG_DIR}/{DS_CONFIG_KEY}"),
        quote_args(ds_bound_args(ds_config(w, where, hf_trainer(w)))),
        quote_args(trainer_args(w)),
        "--output_dir", shlex.quote(output_dir(w)),
        "--do_train", "--use_habana", "--use_lazy_mode", "--throughput_warmup_steps 3",
        quote_args(w.training.args),
    ]
    return " ".join(part for part in train if part)


def output_dir(w: MpiJobWorkloadConfig) -> str:
    """Where the trainer writes its checkpoints and the adapter: beside the caches, in the ranks' folder."""
    return f"{w.output_root}/output/{w.name}"


def ranks_folders(w: MpiJobWorkloadConfig) -> list[tuple[str, str]]:
    """The folders the ranks write, each with the folder an admin makes for them when they cannot: the ranks'
    own folder for what lies in it, else (an `hfHome` elsewhere on the claim) that folder itself."""
    mount, own = w.storage.mount_path.rstrip("/"), w.ranks_root.rstrip("/")

    def for_admin(folder: str) -> str:
        return own if folder == own or folder.startswith(own + "/") else folder

    return [(folder, for_admin(folder)) for folder in (w.cache_home, *outputs(w)) if folder.startswith(mount)]


def outputs(w: MpiJobWorkloadConfig) -> list[str]:
    """What the run writes besides the caches: the recipe's checkpoints and model, or the trainer's --output_dir."""
    if w.finetune is not None:
        where = recipe_roots(w)
        return [where.checkpoint_dir, where.model_dir]
    return [output_dir(w)]


def nfs_folder_hint(w: MpiJobWorkloadConfig) -> str:
    """How an admin finds the claim's folder on the NFS server (an NFS volume: its PersistentVolume's nfs.path;
    nfs-subdir-external-provisioner, Omnia's nfs-client, makes one folder per claim)."""
    volume = f"$(kubectl get pvc -n {w.namespace} {w.storage.claim_name} -o jsonpath={{.spec.volumeName}})"
    return f'kubectl get pv "{volume}" -o jsonpath={{.spec.nfs.path}}'


def relative(w: MpiJobWorkloadConfig, folder: str) -> str:
    """A folder of the claim as a path in it ("" for its root)."""
    return folder[len(w.storage.mount_path.rstrip("/")):].strip("/")


def admin_command(w: MpiJobWorkloadConfig, rel: str) -> str:
    """The one command, on the NFS server, that gives the ranks a folder of the claim (CLAIM: the claim's folder)."""
    user = f"{GAUDI_RANKS_USER}:{GAUDI_RANKS_USER}"
    return f'mkdir -p "$CLAIM/{rel}" && chown -R {user} "$CLAIM/{rel}"'


def in_double_quotes(text: str) -> str:
    """Text as the inside of a shell double-quoted string prints it: nothing expanded."""
    return "".join("\\" + c if c in '\\"$`' else c for c in text)


# The launcher's first lines (shellcheck-clean; tests run them on a temporary claim): make each folder the ranks
# write and write a probe file in it as the ranks' user, or stop at once naming the folder in the way, its owner and
# the admin's command, instead of every rank failing after the model's download.
def writable_folders_check(w: MpiJobWorkloadConfig) -> str:
    """The ranks' folders made and write-tested as the ranks' user before anything else."""
    fix = in_double_quotes(admin_command(w, "FOLDER")).replace("FOLDER", "$2")  # the folder: the 2nd argument
    hint = in_double_quotes(nfs_folder_hint(w))
    return "\n".join([
        'ranks_folder() {  # $1: a folder the ranks write; $2: the folder, relative to the claim, an admin makes',
        '  if mkdir -p "$1" 2>/dev/null && touch "$1/.deepspeed-stack-write-test" 2>/dev/null; then',
        '    rm -f "$1/.deepspeed-stack-write-test"; return 0',
        "  fi",
        '  top="$1"; while [ ! -e "$top" ]; do top=$(dirname "$top"); done',
        '  echo "$1: uid $(id -u) cannot write $top (owner $(stat -c %u:%g "$top")): another run made it first" \\',
        '    "(Omnia\'s by-hand run is root), or the claim\'s root is not open to the ranks. On the NFS server," \\',
        f'    "run once \\`{fix}\\`, CLAIM being the claim\'s folder there (\\`{hint}\\`): NFS volumes take no" \\',
        '    "fsGroup, and root_squash stops a root pod\'s chown" >&2',
        "  exit 1",
        "}",
        *(f"ranks_folder {quote_args([folder, relative(w, admin)])}" for folder, admin in ranks_folders(w)),
    ])


def gaudi_image_launcher_script(w: MpiJobWorkloadConfig, where: Placement) -> str:
    """The stack's Gaudi image has everything installed: check the claim's folders, wait for the workers' sshd,
    then train."""
    return "\n".join([
        "set -eo pipefail",
        *final_errors(w),
        writable_folders_check(w),
        *HOSTFILE_PREAMBLE,
        f"cd {pod_security.GAUDI_EXAMPLES_DIR}",
        *data_step(w),
        train_command(w, where),
    ])


def gaudi_launcher_script(w: MpiJobWorkloadConfig, where: Placement, has_token: bool) -> str:
    """The install-at-start opt-in: Omnia's path (root, installs on every node at every start)."""
    send_env = forwarded_env(w, where, has_token)
    setup_env = " ".join(f"-x {name}" for name in ["HF_HOME", *proxy_env(w)])
    return "\n".join([
        "set -eo pipefail",
        *final_errors(w),
        *HOSTFILE_PREAMBLE,
        # ssh (DeepSpeed's pdsh) sends these to the workers, whose sshd accepts them: first lines win.
        f"printf '%s\\n' {shlex.quote('SendEnv ' + ' '.join(send_env))} {shlex.quote(GAUDI_KEX)} "
        "| cat - /etc/ssh/ssh_config > /tmp/ssh_config && cat /tmp/ssh_config > /etc/ssh/ssh_config",
        f"SETUP={shlex.quote(gaudi_setup_script(w))}",
        'bash -c "$SETUP"',
        f'mpirun --npernode 1 --tag-output --allow-run-as-root --prefix "$MPI_ROOT" {setup_env} bash -c "$SETUP"',
        f"cd {GAUDI_EXAMPLE_DIR}",
        *data_step(w),
        train_command(w, where),
    ])


def gaudi_worker_script(send_env: list[str]) -> str:
    return "\n".join([
        "/usr/bin/ssh-keygen -A",
        f"{GAUDI_SSHD} -o {shlex.quote('AcceptEnv=' + ' '.join(send_env))}",
        "exec sleep infinity",
    ])


def launcher_script(w: MpiJobWorkloadConfig, where: Placement, has_token: bool) -> str:
    if w.launch.command:
        return w.launch.command
    if w.installs_at_start:
        return gaudi_launcher_script(w, where, has_token)
    return gaudi_image_launcher_script(w, where)


# --- the job --------------------------------------------------------------------------------------

def render_spec(inputs: MpiJobInputs) -> dict[str, Any]:
    """The Gaudi MPIJob's spec: the stack's Gaudi image hardened, or the install-at-start opt-in as root."""
    w, where = inputs.workload, inputs.placement
    assert isinstance(w, MpiJobWorkloadConfig)  # the Gaudi keys are kind mpijob's
    files = config_map_data(w, where, inputs.has_token)
    env = plain_env(w, where)
    send_env = forwarded_env(w, where, inputs.has_token)
    script = launcher_script(w, where, inputs.has_token)
    if w.installs_at_start:
        secure, worker_script, probes, auth = pod_security.opt_in_security, gaudi_worker_script(send_env), {}, None
        annotations: dict[str, dict[str, str]] = {"launcher": {}, "worker": {}}
    else:
        def secure(spec: dict[str, Any]) -> dict[str, Any]:
            return pod_security.harden(spec, pod_security.GAUDI_USER)

        worker_script = sshd_worker_script(send_env, pod_security.GAUDI_SSHD_CONFIG)
        probes = {"readinessProbe": SSH_READINESS, "livenessProbe": pod_security.SSH_LIVENESS}
        auth = f"{pod_security.GAUDI_HOME}/.ssh"
        annotations = {role: pod_security.waiver_annotations(role, w.host_ipc) for role in ("launcher", "worker")}
    # The launcher's attempts remember a final status in an emptyDir (kept across restarts in place), as on GKE.
    state = ([], []) if w.launch.command else ([v] for v in launcher_state())
    state_volumes, state_mounts = state
    launcher = launcher_template(inputs, script=script, env=env, files=files, secure=secure,
                                 ssh_client=w.runs_stack_gaudi_image, resources=pod_security.LAUNCHER_RESOURCES,
                                 annotations=annotations["launcher"], volumes=state_volumes, mounts=state_mounts)
    worker = worker_template(inputs, script=worker_script, env=env, files=files, secure=secure, probes=probes,
                             annotations=annotations["worker"])
    return shape_spec(inputs, launcher, worker, auth)
