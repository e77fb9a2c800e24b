"""The Gaudi MPIJob: the Omnia reference (optimum-habana's `gaudi_spawn.py` over DeepSpeed on `habana.ai/gaudi`
nodes of an existing cluster), minus what it got wrong: the HF token comes from a Secret (never a literal value),
and nothing is sed-patched into `run_lora_clm.py` (the training processes get their environment through ssh).

Two variants:
- the stack's Gaudi image (the default, workloads/images/gaudi): everything installed, hardened pods (non-root,
  sshd on SSH_PORT, written waivers for what Habana's runtime needs);
- the install-at-start opt-in (`gaudi.installAtStart`): Habana's stock image as root, optimum-habana and Habana's
  DeepSpeed installed on every node at every start, Omnia's worker command.

Here the image, the job's ConfigMap and its spec; the environment in gaudi_env.py, the launcher's and workers'
commands in gaudi_launcher.py, the ranks' folders on the claim in gaudi_folders.py.
"""

from __future__ import annotations

from typing import Any

from model import gaudi_software
from model.types import MpiJobWorkloadConfig
from workloads import pod_security, recipe, recovery
from workloads.mpijob.gaudi_env import ENV_FILE_KEY, env_file, forwarded_env, plain_env

# run_lora_clm.py's flags the stack sets or that `training.args` cannot give (workloads/kinds/mpijob.py reads them).
from workloads.mpijob.gaudi_flags import LAUNCHER_FLAGS, RESERVED_TRAINING_FLAGS, reserved_flag  # noqa: F401
from workloads.mpijob.gaudi_launcher import GAUDI_KEX, gaudi_worker_script, hf_trainer, launcher_script
from workloads.mpijob.nvidia import launcher_state
from workloads.mpijob.pod_templates import launcher_template, worker_template
from workloads.mpijob.shape import (
    DS_CONFIG_KEY,
    SSH_CLIENT_KEY,
    SSH_READINESS,
    MpiJobInputs,
    ds_config_text,
    ssh_client_config,
    sshd_worker_script,
)
from workloads.mpijob.shape import render_spec as shape_spec
from workloads.placement import Placement


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
