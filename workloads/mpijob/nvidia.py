"""The NVIDIA MPIJob: the stack's own image on a GKE GPU pool, the launcher running `deepspeed --hostfile` over the
operator's hostfile, the script and ds_config.json shipped in the job's ConfigMap (mounted at CONFIG_DIR).

Entry point for a kind built on this path (e.g. `finetune`): describe what every rank runs as an `NvidiaLaunch`
and render with it; the rest (the shape, the stack's image, hardening, placement, the GPU fabric, the token) is
this path's:

    launch = NvidiaLaunch(
        rank_command=[f"{CONFIG_DIR}/finetune.py", "--deepspeed", f"{CONFIG_DIR}/{DS_CONFIG_KEY}", ...],
        env={"CHECKPOINT_DIR": ..., "MODEL_DIR": ...},       # on launcher and workers, and sent to every rank
        volumes=[...], mounts=[...],                          # extra volumes, mounted on launcher and workers
        files={"finetune.py": text},                          # extra files in the job's ConfigMap
        hf_trainer=True)                                      # ds_config.json for the Hugging Face Trainer
    spec = render_spec(MpiJobInputs(workload=w, placement=where, image=..., config_map=...), launch)
    files = config_map_data(w, where, has_token, launch)     # the ConfigMap the pods mount (same `launch`)

`w` is any MpiJobBaseConfig (model/workload_training.py: launch, deepspeed, storage, hfHome, proxy); the TrainingJob
component (workloads/training_job.py) creates the job, its ConfigMap, claim, token Secret and NetworkPolicies
from the same pair when given `launch` (TrainingJobArgs.launch).
"""

from __future__ import annotations

import shlex
from typing import Any

import msgspec

from model.types import MpiJobBaseConfig
from recipes.contract import EXIT_PREEMPTED, FINAL_EXIT_STATUSES
from workloads import fabric, maintenance, pod_security, recovery
from workloads.ds_config import runs_hf_trainer
from workloads.mpijob import script_source
from workloads.mpijob.pod_templates import launcher_template, worker_template
from workloads.mpijob.shape import (
    CONFIG_DIR,
    CONFIG_VOLUME,
    DS_CONFIG_KEY,
    HOSTFILE_PREAMBLE,
    SSH_CLIENT_KEY,
    SSH_PORT,
    SSH_READINESS,
    MpiJobInputs,
    base_env,
    base_forwarded,
    ds_config_text,
    fabric_env,
    quote_args,
    ssh_client_config,
    sshd_worker_script,
    token_names,
)
from workloads.mpijob.shape import render_spec as shape_spec
from workloads.placement import Placement

# The stack's image (workloads/images/deepspeed) runs as 1001 with sshd on 2222 (a port it may bind);
# the operator mounts the job's SSH key pair where that user's ssh looks for it.
NVIDIA_USER = pod_security.NVIDIA_USER
NVIDIA_HOME = pod_security.NVIDIA_HOME
NVIDIA_SSH_PORT = SSH_PORT


class NvidiaLaunch(msgspec.Struct, frozen=True):
    """What the job runs on every rank, and what it needs besides the shape."""

    rank_command: list[str]  # the script and its arguments, as `deepspeed --hostfile ...` runs them on every rank
    # on launcher and workers, and sent to every rank over ssh
    env: dict[str, str] = msgspec.field(default_factory=dict)
    volumes: list[dict[str, Any]] = msgspec.field(default_factory=list)  # extra pod volumes (launcher and workers)
    mounts: list[dict[str, Any]] = msgspec.field(default_factory=list)  # their mounts (launcher and workers)
    files: dict[str, str] = msgspec.field(default_factory=dict)  # extra files of the job's ConfigMap, under CONFIG_DIR
    hf_trainer: bool = False  # the ranks run the Hugging Face Trainer: ds_config.json leaves it its own values
    # `launch.command`: the launcher runs it instead of the DeepSpeed command line, after the same set-up.
    command: str | None = None
    worker_volumes: list[dict[str, Any]] = msgspec.field(default_factory=list)  # extra pod volumes of the workers only
    worker_mounts: list[dict[str, Any]] = msgspec.field(default_factory=list)  # their mounts
    # Never: a worker whose sshd died stays failed (the launcher's restarts cannot reach it). OnFailure: it restarts
    # in place under the same host name, and the launcher's next attempt finds it.
    worker_restart_policy: str = "Never"
    # Paths (e.g. the data in the bucket) the launcher waits for before it starts the ranks: one `pulumi up` creates
    # the bucket and the job, and the data is uploaded after.
    wait_for: list[str] = msgspec.field(default_factory=list)
    # A command the launcher runs after that wait, before the ranks (finetune.py --check-data reads the data): its
    # final status (FINAL_EXIT_STATUSES) is remembered like the ranks', any other failure retried.
    check: list[str] = msgspec.field(default_factory=list)
    # Run `check` on the first worker over the job's ssh (on_first_worker), not on the launcher's one CPU: the
    # finetune data step tokenizes with every CPU of a GPU node's worker, before any rank starts there.
    check_on_first_worker: bool = False


def launch_of(w: MpiJobBaseConfig) -> NvidiaLaunch:
    """The `launch` keys' launch: `launch.script` (workloads/mpijob/script_source.py: shipped from recipes,
    or a file of the bucket or the image) with `--deepspeed_config` and `launch.args`; `launch.command` replaces the
    DeepSpeed command line (and ships no script)."""
    script = script_source.source(w)
    return NvidiaLaunch(
        rank_command=[script.path, "--deepspeed_config", f"{CONFIG_DIR}/{DS_CONFIG_KEY}", *w.launch.args],
        env=output_env(w), files=script.files, hf_trainer=runs_hf_trainer(w.launch.script),
        command=w.launch.command)


def output_env(w: MpiJobBaseConfig) -> dict[str, str]:
    """Where the scripts write (the fine-tuning contract; smoke_train.py reads CHECKPOINT_DIR too): checkpoints, and
    a finished model, under the bucket's mount, else the claim's."""
    return {"CHECKPOINT_DIR": w.checkpoint_dir, "MODEL_DIR": w.model_dir}


def image(w: MpiJobBaseConfig, stack_image: str | None) -> str:
    """`image` overrides; else the stack's built image."""
    if w.image:
        return w.image
    if stack_image is None:
        raise ValueError(f"workload {w.name}: an nvidia MPIJob needs the stack's image or `image`")
    return stack_image


def plain_env(w: MpiJobBaseConfig, where: Placement, launch: NvidiaLaunch | None = None) -> dict[str, str]:
    """Non-secret variables of the launcher and workers."""
    return {**base_env(w), **(launch or launch_of(w)).env, **fabric_env(where)}


def forwarded_env(w: MpiJobBaseConfig, where: Placement, has_token: bool,
                  launch: NvidiaLaunch | None = None) -> list[str]:
    """Variables the launcher's ssh sends to the training processes on the workers; the image's ENV (python venv,
    GKE's driver libraries) is lost over ssh as well."""
    return [*base_forwarded(w), *(launch or launch_of(w)).env, "PATH", "LD_LIBRARY_PATH", *token_names(has_token)]


def config_map_data(w: MpiJobBaseConfig, where: Placement, has_token: bool,
                    launch: NvidiaLaunch | None = None) -> dict[str, str]:
    """ds_config.json, the launcher's ssh client config, the fabric's NCCL env script, and the script(s)."""
    launch = launch or launch_of(w)
    data = {DS_CONFIG_KEY: ds_config_text(w, where, launch.hf_trainer),
            SSH_CLIENT_KEY: ssh_client_config(forwarded_env(w, where, has_token, launch))}
    contract = fabric.pod_contract(where)
    if contract is not None:
        data.update(contract.files())
    if maintenance.watched(w, where):  # the launcher's maintenance watch (workloads/maintenance.py)
        data.update(maintenance.files())
    return {**data, **recovery.stop_ranks_file(), **launch.files}


# Final errors are not retried. finetune.py and smoke_train.py exit 2 (their EXIT_USAGE, argparse's own status) on
# bad arguments or data, which no restart can fix; DeepSpeed's launcher hands a rank's status back (launch.py exits
# with the failed rank's, pdsh -S with the largest of the nodes', runner.py with pdsh's). The MPIJob cannot say "do
# not restart on 2": v2beta1 has no podFailurePolicy, and the operator builds the launcher's Job from backoffLimit,
# activeDeadlineSeconds and ttlSecondsAfterFinished only (mpi-operator v0.8.0 newLauncherJob). So the launcher keeps
# OnFailure and remembers: the status goes into an emptyDir, which outlives a container restart in place (not the
# pod), and every later attempt of the pod exits at once with it, without waiting for the workers or running the
# ranks, until backoffLimit ends the job as Failed. Exiting 0 instead would end it faster but mark it Succeeded.
LAUNCHER_STATE_VOLUME = "launcher-state"
LAUNCHER_STATE_DIR = "/run/deepspeed-stack"
FINAL_STATUS_FILE = f"{LAUNCHER_STATE_DIR}/final-status"
RUN_RANKS = "run_ranks"  # the launcher's shell function that runs the DeepSpeed command line


def final_status_guard() -> str:
    """The launcher's first step: an earlier attempt of this pod stopped on a final error; stop again at once."""
    return (f'if [ -f {FINAL_STATUS_FILE} ]; then echo "deepspeed-stack: an earlier attempt stopped with exit status '
            f'$(cat {FINAL_STATUS_FILE}) (bad arguments or data, see its log), which no restart fixes: not running '
            'the ranks again. Fix the input, then re-create the job (pulumi up after the change)" >&2; '
            f'exit "$(cat {FINAL_STATUS_FILE})"; fi')


STOP_WORKERS = "stop_workers"  # the launcher's shell function that asks every worker's ranks to save and stop


def stop_workers_function(grace: int) -> list[str]:
    """A shell function the launcher's SIGTERM trap runs: on every host of the hostfile, over the job's ssh, the
    workers' own preStop hook (stop_ranks.py: SIGTERM to the ranks only, then wait for their save), in the
    background. Never DeepSpeed's runner: its PDSH handler (deepspeed 0.19.8 launcher/runner.py 621-632) would run
    `pkill -f deepspeed.launcher.launch` on every worker, whose handler SIGKILLs the ranks 30 s later (launch.py
    121-132, 251-270), and killing pdsh closes the ranks' stdout mid-save."""
    hook = shlex.join(recovery.stop_ranks_command(CONFIG_DIR, grace))
    return [
        f"{STOP_WORKERS}() {{",
        '  echo "deepspeed-stack: SIGTERM: asking every worker\'s ranks to save and stop, then waiting for them" >&2',
        '  for host in $(sed -n "s/[[:space:]]slots.*//p" "$HOSTSFILE"); do',
        f'    ssh -o ConnectTimeout=5 -o BatchMode=yes "$host" {shlex.quote(hook)} &',
        "  done",
        "}",
    ]


def run_ranks_function(group: bool = False, stop: str | None = None) -> list[str]:
    """A shell function that runs its arguments (DeepSpeed's runner) as a child: the launcher's shell stays the
    container's main process, which is what the kubelet sends SIGTERM to; then it exits with the runner's status,
    remembering a final one (FINAL_EXIT_STATUSES). On TERM (and INT), with `stop` (NVIDIA: stop_workers) it does not
    signal the runner: it runs `stop`, which asks the workers to stop their ranks (on a whole-job stop their preStop
    hooks do the same at the same moment), and waits until the runner ends by itself, when every rank has saved and
    exited. Without `stop` it passes TERM on to the runner (whose handler stops the ranks on every node). `group`:
    the runner is a grandchild (Gaudi: gaudi_spawn.py starts DeepSpeed's runner through `bash -c`, and dies of TERM
    itself), so the child leads a process group of its own (setsid: the background child of a shell without job
    control is no group leader, so setsid makes its own pid the group's), TERM goes to the whole group, and the
    function waits until the group is gone (the runner's handler still stopping the ranks over pdsh).

    After a stop, a runner status of 255 (ssh's: a connection closed) is the stop's EXIT_PREEMPTED: on a whole-job
    stop each worker's pod ends once its preStop hook saw the ranks exit, and its sshd may close the launcher's
    connection before the rank's status reaches it (make e2e's finetune scenario saw one of two workers do so). The
    ranks saved either way; the launcher reports the stop, not the cut connection."""
    final = " -o ".join(f'"$status" -eq {code}' for code in FINAL_EXIT_STATUSES)
    target = '-- "-$ranks"' if group else '"$ranks"'
    return [
        f"{RUN_RANKS}() {{",
        '  setsid "$@" &' if group else '  "$@" &',
        "  ranks=$!",
        "  stopping=0",
        f"  trap 'stopping=1; {stop}' TERM INT" if stop
        else f"  trap 'stopping=1; kill -TERM {target} 2>/dev/null' TERM INT",
        '  status=0; wait "$ranks" || status=$?',
        # A trapped signal ends `wait` early: wait again, until the runner is gone, for its own status.
        '  while kill -0 "$ranks" 2>/dev/null; do status=0; wait "$ranks" || status=$?; done',
        *(['  while kill -0 -- "-$ranks" 2>/dev/null; do sleep 1; done'] if group else []),
        f'  if [ "$stopping" -eq 1 ] && [ "$status" -eq 255 ]; then echo "deepspeed-stack: stopped: a worker\'s '
        f'connection closed as its pod stopped (ssh 255); exit status {EXIT_PREEMPTED}" >&2; '
        f"status={EXIT_PREEMPTED}; fi",
        f'  if [ {final} ]; then {{ echo "$status" > {FINAL_STATUS_FILE}; }} 2>/dev/null || true; '
        'echo "deepspeed-stack: the ranks stopped with exit status $status (bad arguments or data): final, the '
        "launcher's restarts will not run them again\" >&2; fi",
        '  exit "$status"',
        "}",
    ]


CHECK_INPUTS = "check_inputs"  # the launcher's shell function that runs the input check


def on_first_worker(command: list[str]) -> str:
    """`command` as the launcher runs it on the hostfile's first worker ($MASTER_ADDR, where rank 0 will run):
    over the job's ssh (its client config sends the run's variables, as to the ranks), in the ConfigMap's folder,
    with the launcher's PATH and LD_LIBRARY_PATH (sshd resets PATH; the ranks get them from ~/.deepspeed_env). ssh
    exits with the command's status (a final one stays final) or 255 when the worker cannot be reached (retried)."""
    prefix = (f'"cd {CONFIG_DIR} && exec env PATH=$(printf %q "$PATH") '
              'LD_LIBRARY_PATH=$(printf %q "${LD_LIBRARY_PATH:-}")"')
    return f'ssh -o BatchMode=yes "$MASTER_ADDR" {prefix} {shlex.quote(quote_args(command))}'


def check_inputs_function() -> list[str]:
    """A shell function that runs the input check: on success the launch goes on; a final status is remembered as
    the ranks' is (no attempt of the pod runs anything again); any other failure exits and is retried."""
    final = " -o ".join(f'"$status" -eq {code}' for code in FINAL_EXIT_STATUSES)
    return [
        f"{CHECK_INPUTS}() {{",
        '  status=0; "$@" || status=$?',
        '  if [ "$status" -eq 0 ]; then return 0; fi',
        f'  if [ {final} ]; then {{ echo "$status" > {FINAL_STATUS_FILE}; }} 2>/dev/null || true; '
        'echo "deepspeed-stack: the input check stopped with exit status $status (bad arguments or data, said above): '
        "final, the launcher's restarts will not run the ranks\" >&2; fi",
        '  exit "$status"',
        "}",
    ]


def launcher_state() -> tuple[dict[str, Any], dict[str, Any]]:
    """(volume, mount): the launcher's emptyDir for what its attempts remember (the final status)."""
    return ({"name": LAUNCHER_STATE_VOLUME, "emptyDir": {"sizeLimit": "1Mi"}},
            {"name": LAUNCHER_STATE_VOLUME, "mountPath": LAUNCHER_STATE_DIR})


def launcher_script(where: Placement | None, launch: NvidiaLaunch,
                    grace: int = recovery.TERMINATION_GRACE_SECONDS) -> str:
    """The launcher's script; `grace`: the job's terminationGracePeriodSeconds (what the stop request waits)."""
    # On a GPU fabric each rank runs through the fabric's NCCL env script (workloads/fabric.py).
    rank = "" if fabric.pod_contract(where) is None else (
        " ".join(fabric.LAUNCH_FLAGS) + " " + fabric.rank_command(f"{CONFIG_DIR}/{fabric.ENV_SCRIPT}") + " ")
    script, *args = launch.rank_command
    # --force_multi: the launcher has no GPU and is not in the hostfile, even with one worker.
    deepspeed = (f'{RUN_RANKS} deepspeed --force_multi --hostfile "$HOSTSFILE" --master_addr "$MASTER_ADDR" '
                 f"{rank}{shlex.quote(script)} {quote_args(args)}".rstrip())
    checks = launch.check and not launch.command
    final = [] if launch.command else [final_status_guard(), *stop_workers_function(grace),
                                       *run_ranks_function(stop=STOP_WORKERS),
                                       *(check_inputs_function() if checks else [])]
    return "\n".join([
        "set -eo pipefail",
        *final,
        *HOSTFILE_PREAMBLE,
        # sshd resets PATH whatever the client sends (SendEnv): DeepSpeed's runner exports what ~/.deepspeed_env
        # lists to every rank, so the ranks find the image's venv (ninja for JIT-built ops) and driver libraries.
        'printf "PATH=%s\\nLD_LIBRARY_PATH=%s\\n" "$PATH" "${LD_LIBRARY_PATH:-}" >> "$HOME/.deepspeed_env"',
        # DeepSpeed runs `cd <this directory>` on every worker: the ConfigMap is mounted there too.
        f"cd {CONFIG_DIR}",
        *([wait_for_paths(launch.wait_for)] if launch.wait_for else []),
        *([f"{CHECK_INPUTS} {check_command(launch)}"] if checks else []),
        # `launch.command` replaces only this line: $HOSTSFILE and $MASTER_ADDR are set, the workers answer on ssh.
        launch.command or deepspeed,
    ])


def check_command(launch: NvidiaLaunch) -> str:
    return on_first_worker(launch.check) if launch.check_on_first_worker else quote_args(launch.check)


# How long the launcher waits for a path (10 s apart): then it fails, restarts (OnFailure) and waits again, up to
# runPolicy.backoffLimit times.
WAIT_TRIES = 180


def wait_for_paths(paths: list[str], how: str = "upload it to the bucket") -> str:
    """One shell line: wait (bounded) until every path exists, saying what it waits for and `how` it gets there."""
    return (f"for path in {quote_args(paths)}; do tries={WAIT_TRIES}; until [ -e \"$path\" ]; do "
            'tries=$((tries - 1)); [ "$tries" -gt 0 ] || { echo "$path never appeared" >&2; exit 1; }; '
            f'echo "waiting for $path ({how})"; sleep 10; done; done')


def nvidia_launcher_script(w: MpiJobBaseConfig, where: Placement | None = None) -> str:
    """The launcher's script for the workload's `launch` keys (without the token's export)."""
    return launcher_script(where, launch_of(w))


def nvidia_worker_script(send_env: list[str]) -> str:
    return sshd_worker_script(send_env)


def secure(spec: dict[str, Any]) -> dict[str, Any]:
    """Hardened as the Gaudi pods (workloads/pod_security.py), as the image's user, with a writable /tmp (the
    workers' host key, sshd's pid file) and home (the launcher's ~/.deepspeed_env, the ranks' JIT and Triton caches).
    fsGroup makes the operator's SSH key Secret readable by the image's user."""
    return pod_security.harden(spec, NVIDIA_USER, NVIDIA_HOME)


def waivers(role: str, where: Placement | None) -> dict[str, str]:
    """checkov's skip annotations of a pod: the image's, and on the workers the fabric daemon's."""
    contract = fabric.pod_contract(where) if role == "worker" else None
    return pod_security.skip_annotations(pod_security.merge_waivers(
        pod_security.NVIDIA_WAIVERS[role], contract.waivers if contract else {}))


def render_spec(inputs: MpiJobInputs, launch: NvidiaLaunch | None = None) -> dict[str, Any]:
    """The NVIDIA MPIJob's spec: the workload's `launch` keys, or a kind's own `launch`."""
    w, where = inputs.workload, inputs.placement
    launch = launch or launch_of(w)
    files = config_map_data(w, where, inputs.has_token, launch)
    env = plain_env(w, where, launch)
    state_volume, state_mount = launcher_state()
    script = launcher_script(where, launch, recovery.grace_seconds(w, where.pool))
    launcher = launcher_template(inputs, script=script, env=env, files=files, secure=secure,
                                 ssh_client=True, resources=pod_security.NVIDIA_LAUNCHER_RESOURCES,
                                 annotations=waivers("launcher", where), volumes=[*launch.volumes, state_volume],
                                 mounts=[*launch.mounts, state_mount])
    worker = worker_template(
        inputs, script=nvidia_worker_script(forwarded_env(w, where, inputs.has_token, launch)), env=env,
        files=files, secure=secure, annotations=waivers("worker", where),
        probes={"readinessProbe": SSH_READINESS, "livenessProbe": pod_security.SSH_LIVENESS},
        volumes=[*launch.volumes, *launch.worker_volumes], mounts=[*launch.mounts, *launch.worker_mounts])
    if maintenance.watched(w, where):  # saves before a node's host maintenance (workloads/maintenance.py)
        maintenance.with_watch(launcher, w, inputs.image,
                               {"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True}, state_mount)
    if where.on_nvidia and where.pool is not None:  # a GKE pool: no node with pending maintenance first
        maintenance.prefer_no_maintenance(worker)
    spec = shape_spec(inputs, launcher, worker, f"{NVIDIA_HOME}/.ssh")
    spec["mpiReplicaSpecs"]["Worker"]["restartPolicy"] = launch.worker_restart_policy
    return spec
