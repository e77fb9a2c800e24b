"""The Gaudi MPIJob's commands: the launcher's script (the stack's Gaudi image: check the ranks' folders, wait for
the workers, the recipe's data step, then train; the install-at-start opt-in: Omnia's path, optimum-habana and
Habana's DeepSpeed installed on every node first), the training command through optimum-habana's gaudi_spawn.py
(finetune.py with `finetune`, else Omnia's run_lora_clm.py with `training`'s keys), and the worker's script.
"""

from __future__ import annotations

import shlex
from typing import Any

from model import gaudi_software
from model.types import MpiJobWorkloadConfig
from workloads import pod_security, recipe, recovery
from workloads.ds_config import runs_hf_trainer
from workloads.mpijob.gaudi_env import forwarded_env, recipe_launch, recipe_roots
from workloads.mpijob.gaudi_folders import output_dir, writable_folders_check
from workloads.mpijob.nvidia import (
    CHECK_INPUTS,
    RUN_RANKS,
    STOP_WORKERS,
    check_inputs_function,
    final_status_guard,
    run_ranks_function,
    stop_workers_function,
    wait_for_paths,
)
from workloads.mpijob.shape import CONFIG_DIR, DS_CONFIG_KEY, HOSTFILE_PREAMBLE, ds_config, proxy_env, quote_args
from workloads.placement import Placement

# Omnia's worker command: generate host keys, start sshd (it daemonizes), keep the pod alive.
GAUDI_SSHD = "/usr/sbin/sshd"
# The Omnia reference pins this key exchange on the launcher's ssh client; kept as it is.
GAUDI_KEX = "KexAlgorithms curve25519-sha256,sntrup761x25519-sha512@openssh.com"
OPTIMUM_HABANA_REPO = "https://github.com/huggingface/optimum-habana"
HABANA_DEEPSPEED_REPO = "https://github.com/HabanaAI/DeepSpeed.git"
GAUDI_EXAMPLE_DIR = "/optimum-habana/examples/language-modeling"

habana_deepspeed_ref = gaudi_software.habana_deepspeed_ref


# --- training arguments ---------------------------------------------------------------------------

def hf_trainer(w: MpiJobWorkloadConfig) -> bool:
    """optimum-habana's script runs the Hugging Face Trainer (so do finetune.py and a `launch.command` running one
    of ours)."""
    return w.finetune is not None or not w.launch.command or runs_hf_trainer(w.launch.script)


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
