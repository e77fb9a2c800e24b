"""What every scenario of `make e2e` (e2e/run.py) shares: the run's constants, the image's and the ranks'
environment, the stack's own rendering of a workload, writing files as a host's user, launching under a timeout,
checking a run's result, and the chart's and the MPIJob's paths (workers, hostfiles, the launcher)."""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import hosts as nshosts  # noqa: E402  (e2e/hosts.py, beside this file)

IMAGE_DIR = ROOT / "workloads" / "images" / "deepspeed"
ENTRYPOINT = IMAGE_DIR / "entrypoint.sh"
DOCKERFILE = IMAGE_DIR / "Dockerfile"
VENV = Path(os.environ.get("E2E_VENV", "/opt/ds-e2e-venv"))
RUN_CACHE = Path(tempfile.gettempdir()) / "ds-e2e-cache"  # main() sets the run's own: what scenarios share
CACHE_LOCK = threading.Lock()
# Processes a scenario started on this machine outside the hosts (finetune_common._venv_popen): main() kills any left
# at the end, as the clusters' teardown does the hosts' (a scenario that failed leaves its own running).
BACKGROUND: list[subprocess.Popen[bytes]] = []
LAUNCH_TIMEOUT = float(os.environ.get("E2E_LAUNCH_TIMEOUT", "150"))
RELEASE = "e2e"
CHART_WORKER = f"{RELEASE}-deepspeed-worker"  # the chart's "deepspeed.v0.worker.fullname"
CHART_CLIENT = f"{RELEASE}-deepspeed-client"
MPIJOB = "ds-e2e"
MPIJOB_NAMESPACE = "e2e"
WORKERS = 2
# The smoke test's size on CPU: a few small steps.
SMOKE_ARGS = ["--steps", "4", "--warmup-steps", "1", "--hidden-size", "64", "--layers", "2"]
DS_BLOCK = {"zeroStage": 1, "precision": "fp32", "microBatchPerGpu": 4, "gradientAccumulation": 1,
            "stepsPerPrint": 1000}
# The chart's defaultSSHServer drop-in (values.yaml config.defaultSSHServer, chart 2.3.x), port as
# worker.containerPorts.ssh.
CHART_SSHD_DROP_IN = "Port 2222\nPasswordAuthentication no\nUsePAM no\nPermitUserEnvironment yes\n"
SSH_PORT = 2222
# Environment every rank needs on CPU here: DeepSpeed's CPU accelerator, gloo on eth0 (the hostname
# resolves to 127.0.1.1 on many machines), the shm op built by install.sh. It reaches remote ranks
# through ~/.deepspeed_env, as a user's variables would.
RANK_ENV = {
    "DS_ACCELERATOR": "cpu",
    "GLOO_SOCKET_IFNAME": "eth0",
    "TORCH_EXTENSIONS_DIR": str(VENV / "torch_extensions"),
    "OMP_NUM_THREADS": "1",
}
# The image's ENV, with the e2e venv where the image has /opt/venv.
IMAGE_ENV = {
    "PATH": f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "PDSH_RCMD_TYPE": "ssh",
    "PYTHONUNBUFFERED": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "LANG": "C.UTF-8",
}
RESULT = re.compile(r"SMOKE_TEST_RESULT (\{.*\})")


# --- the stack's own rendering -----------------------------------------------------------------------

# Each kind's e2e workload: its name and the keys of its own it sets.
# Per kind: the workload's name, its own keys, and the stack's top-level keys it needs (merged into the dev stack's).
KIND_WORKLOADS: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "mpijob": (MPIJOB, {"namespace": MPIJOB_NAMESPACE, "storage": {"storageClass": "standard-rwx"}}, {}),
    "helm": ("smoke", {"namespace": "deepspeed-e2e", "chart": {"version": "2.3.51"}}, {}),
    # The bucket (a local folder at gcsFuse.mountPath on every host) holds the data, the base model and the output.
    "finetune": (MPIJOB, {"namespace": MPIJOB_NAMESPACE, "storage": {"storageClass": "standard-rwx"},
                          "gcsFuse": {"enabled": True, "mountPath": "/gcs"}}, {"storage": {"enabled": True}}),
}


def stack_workload(kind: str, workers: int = WORKERS, args: Sequence[str] = SMOKE_ARGS,
                   script: str = "smoke_train.py", deepspeed: dict[str, Any] | None = None,
                   keys: dict[str, Any] | None = None) -> tuple[Any, Any]:
    """A CPU-sized workload of the dev stack, loaded and checked by the stack's own code."""
    import yaml

    from checks import load
    from model.types import WORKLOAD_TYPES
    from preview.engine import engine_config_from_yaml, stack_file
    from workloads.placement import placement

    with open(stack_file("dev"), encoding="utf-8") as handle:
        config = copy.deepcopy(yaml.safe_load(handle)["config"])
    name, own_keys, stack_keys = KIND_WORKLOADS[kind]
    workload: dict[str, Any] = {"kind": kind, "pool": "t4", "workers": workers,
                                "deepspeed": dict(deepspeed or DS_BLOCK),
                                "launch": {"script": script, "args": list(args)}, **own_keys, **(keys or {})}
    for key, values in stack_keys.items():
        config[f"deepspeed-stack:{key}"] = {**config.get(f"deepspeed-stack:{key}", {}), **values}
    if WORKLOAD_TYPES[kind].runs_as_mpijob:
        # The stack installs the operator (and its MPIJob CRD) on its own cluster.
        config["deepspeed-stack:mpiOperator"] = {**config.get("deepspeed-stack:mpiOperator", {}), "install": True}
    config["deepspeed-stack:workloads"] = {name: workload}
    engine_config, secret_keys = engine_config_from_yaml(config)
    model = load(engine_config, set(secret_keys))
    w = next(iter(model.workloads.values()))
    return w, placement(model, w)


def image_sshd_drop_in() -> str:
    """The image's sshd drop-in, read from the Dockerfile's printf block (50-deepspeed.conf)."""
    text = DOCKERFILE.read_text(encoding="utf-8")
    block = re.search(r"printf '%s\\n' \\\n(.*?)> /etc/ssh/sshd_config\.d/50-deepspeed\.conf", text, re.S)
    if block is None:
        raise RuntimeError("the Dockerfile no longer writes /etc/ssh/sshd_config.d/50-deepspeed.conf")
    return "\n".join(re.findall(r"'([^']*)'", block.group(1))) + "\n"


# --- helpers ----------------------------------------------------------------------------------------

@dataclass
class Outcome:
    scenario: str
    ok: bool
    seconds: float
    detail: str


def write(path: Path, text: str, mode: int = 0o644, owner: int | None = nshosts.UID) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    os.chmod(path, mode)
    if owner is not None:
        os.chown(path, owner, owner)


def keypair(directory: Path, name: str, kind: str = "ed25519") -> tuple[Path, str]:
    key = directory / name
    key.unlink(missing_ok=True)
    Path(f"{key}.pub").unlink(missing_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", name, "-f", str(key)], check=True)
    return key, Path(f"{key}.pub").read_text()


def image_etc(cluster: nshosts.Cluster, drop_in: str) -> None:
    """Every host's /etc/ssh as the image has it (UsePAM off in the main file, the Include line), with
    `drop_in` in sshd_config.d: the image's own, or what the chart mounts over the directory."""
    for host in cluster.hosts:
        main = host.path("/etc/ssh/sshd_config")
        text = main.read_text() if main.exists() else ""
        if "Include /etc/ssh/sshd_config.d/*.conf" not in text:
            text = "Include /etc/ssh/sshd_config.d/*.conf\n" + text
        text = re.sub(r"(?m)^#?UsePAM .*$", "UsePAM no", text)
        write(main, text, owner=0)
        drop_dir = host.path("/etc/ssh/sshd_config.d")
        if drop_dir.exists():
            for old in drop_dir.iterdir():
                old.unlink()
        write(drop_dir / "50-deepspeed.conf", drop_in, owner=0)


def deepspeed_env(host: nshosts.Host, extra: dict[str, str] | None = None) -> None:
    """~/.deepspeed_env: DeepSpeed's runner exports its lines to every rank it starts."""
    variables = {**RANK_ENV, **(extra or {})}
    write(host.home / ".deepspeed_env", "".join(f"{k}={v}\n" for k, v in variables.items()))


def result_of(output: str) -> dict[str, Any] | None:
    found = RESULT.findall(output)
    return json.loads(found[-1]) if found else None


def check_run(output: str, world: int, hosts: Sequence[str]) -> list[str]:
    """What is wrong with a launch's output: every rank reported, the world size, the result line."""
    problems = []
    result = result_of(output)
    if result is None:
        return ["no SMOKE_TEST_RESULT line"]
    if result.get("world_size") != world:
        problems.append(f"world size {result.get('world_size')}, expected {world}")
    if sorted(result.get("hosts", [])) != sorted(hosts):
        problems.append(f"hosts {result.get('hosts')}, expected {sorted(hosts)}")
    if not result.get("ok"):
        problems.append("result not ok")
    for rank in range(world):
        if not re.search(rf"\[smoke\] rank {rank} on \S+: [\d.]+ samples/s", output):
            problems.append(f"rank {rank} did not report")
    return problems


def timed(name: str, outcomes: list[Outcome], work: Path, body: Callable[[], str]) -> None:
    start = time.monotonic()
    print(f"[e2e] {name} ...", flush=True)
    try:
        detail = body()
        ok = True
    except Exception as error:
        detail, ok = str(error), False
    seconds = time.monotonic() - start
    outcomes.append(Outcome(name, ok, seconds, detail))
    print(f"[e2e] {name}: {'ok' if ok else 'FAILED'} in {seconds:.1f} s: {detail}", flush=True)
    if not ok:
        print(f"[e2e]   logs: {work / 'logs'}", flush=True)


def launch(cluster: nshosts.Cluster, host: nshosts.Host, script: str, log: Path,
           env: dict[str, str] | None = None, timeout: float = LAUNCH_TIMEOUT) -> tuple[int, str]:
    """`bash -c script` on `host` as the image's user, under a timeout; (exit status, output)."""
    process = cluster.spawn(host, ["/bin/bash", "-c", script], log=log, env={**IMAGE_ENV, **RANK_ENV, **(env or {})})
    try:
        status = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        cluster.stop_services()
        process.wait(timeout=10)
        raise RuntimeError(f"timed out after {timeout:.0f} s (log {log})") from None
    return status, log.read_text(errors="replace")


def fail_unless(condition: bool, message: str) -> None:
    if not condition:
        raise RuntimeError(message)


# --- the chart's path (pdsh) -------------------------------------------------------------------------

def chart_hostfile(workers: int, slots: int) -> str:
    """config.defaultHostFile as the chart's template renders it."""
    return "".join(f"{CHART_WORKER}-{i}.{CHART_WORKER}-headless slots={slots}\n" for i in range(workers))


def start_chart_workers(cluster: nshosts.Cluster, workers: Sequence[nshosts.Host], client_pub: str,
                        logs: Path) -> None:
    for host in workers:
        ssh = host.home / ".ssh"
        write(ssh / "authorized_keys", client_pub, 0o600)
        # The chart copies PATH and LD_LIBRARY_PATH into ~/.ssh/environment (PermitUserEnvironment yes).
        write(ssh / "environment", f"PATH={IMAGE_ENV['PATH']}\nLD_LIBRARY_PATH=\n", 0o600)
        key, _ = keypair(host.path("/tmp"), "ssh_host_ed25519_key")
        os.chown(key, nshosts.UID, nshosts.UID)
        cluster.spawn_main(host, ["/usr/sbin/sshd", "-D", "-e", "-h", "/tmp/ssh_host_ed25519_key",
                                  "-o", "PidFile=/tmp/sshd.pid"], log=logs / f"sshd-{host.name}.log")


def chart_files(cluster: nshosts.Cluster, client: nshosts.Host, w: Any, where: Any, workers: int) -> None:
    """The release's source ConfigMap at /app on the client and every worker; the hostfile at /job."""
    from workloads import deepspeed_release

    source = cluster.work / "chart-source"
    source.mkdir(exist_ok=True)
    os.chmod(source, 0o755)
    for name, text in deepspeed_release.source_files(w, where.per_worker).items():
        write(source / name, text)
    job = client.root / "job"
    job.mkdir(exist_ok=True)
    write(job / "hostfile", chart_hostfile(workers, where.per_worker))
    for host in cluster.hosts:
        cluster.bind(host, source, deepspeed_release.SOURCE_DIR)
    cluster.bind(client, job, str(Path(deepspeed_release.HOSTFILE).parent))


def chart_ssh_client(client: nshosts.Host, workers: int) -> str:
    """The client's key and the chart's defaultSSHClient blocks (one per worker FQDN)."""
    ssh = client.home / ".ssh"
    key, pub = keypair(ssh, "id_rsa")
    os.chown(key, nshosts.UID, nshosts.UID)
    blocks = [f"Host {CHART_WORKER}-{i}.{CHART_WORKER}-headless\n  Port {SSH_PORT}\n  IdentityFile ~/.ssh/id_rsa\n"
              "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
              for i in range(workers)]
    write(ssh / "config", "".join(blocks), 0o600)
    return pub


def wait_for_workers(cluster: nshosts.Cluster, client: nshosts.Host, names: Sequence[str]) -> None:
    """The chart's wait-for-workers init container: the image entrypoint's retry_while over ssh."""
    loop = " && ".join(f"retry_while {shlex.quote(f'ssh -o ConnectTimeout=2 -o BatchMode=yes {n} true')} 40 0.25"
                       for n in names)
    script = f"source {shlex.quote(str(ENTRYPOINT))} && {loop}"
    result = cluster.run(client, ["/bin/bash", "-c", script], env=IMAGE_ENV, timeout=30)
    fail_unless(result.returncode == 0, f"workers never answered over ssh: {result.stderr.strip()[-500:]}")


# --- the MPIJob's path (pdsh) and OpenMPI's mpirun -------------------------------------------------

MPI_HOSTFILE = "/etc/mpi/hostfile"  # where mpi-operator mounts the hostfile it writes


def mpijob_hostfile(workers: int, slots: int) -> str:
    """The operator's hostfile for OpenMPI: one `<job>-worker-<i>.<job>.<namespace>.svc slots=N` per worker."""
    return "".join(f"{MPIJOB}-worker-{i}.{MPIJOB}.{MPIJOB_NAMESPACE}.svc slots={slots}\n" for i in range(workers))


def start_mpijob(cluster: nshosts.Cluster, logs: Path, rendered: tuple[Any, Any] | None = None,
                 rank_env: dict[str, str] | None = None, launch: Any = None,
                 claim: Path | None = None) -> tuple[Any, dict[str, str], str]:
    """Workers as the NVIDIA MPIJob renders them (of the dev stack's smoke test, or `rendered`: a workload and its
    placement, with a kind's own `launch`); the launcher's files; the job's claim (`claim`, else a new empty one:
    another job's checkpoints would be resumed). Returns (workload, the launcher's environment, its script)."""
    from workloads.mpijob import nvidia
    from workloads.mpijob.shape import CONFIG_DIR, SSH_CLIENT_KEY

    w, where = rendered or stack_workload("mpijob")
    launch = launch or nvidia.launch_of(w)
    launcher, workers = cluster.hosts[0], cluster.hosts[1:]
    send_env = nvidia.forwarded_env(w, where, False, launch)
    files = nvidia.config_map_data(w, where, False, launch)
    image_etc(cluster, image_sshd_drop_in())
    # The operator's SSH Secret at sshAuthMountPath: root-owned, group-readable through fsGroup (hence
    # the worker script's StrictModes=no), an ECDSA key under the name id_rsa.
    keys = cluster.work / "mpijob-ssh"
    keys.mkdir(exist_ok=True)
    key, pub = keypair(keys, "id_rsa", "ecdsa")
    for host in cluster.hosts:
        for name, text in files.items():
            if name != SSH_CLIENT_KEY:
                write(host.path(f"{CONFIG_DIR}/{name}"), text, owner=0)
        ssh = host.home / ".ssh"
        for name, text in (("id_rsa", key.read_text()), ("id_rsa.pub", pub), ("authorized_keys", pub)):
            write(ssh / name, text, 0o640, owner=0)
            os.chown(ssh / name, 0, nshosts.UID)
    # The job's shared claim at storage.mountPath on every pod: CHECKPOINT_DIR, MODEL_DIR (without a bucket) and
    # HF_HOME live there.
    claim = claim or Path(tempfile.mkdtemp(prefix="claim-", dir=cluster.work))
    claim.mkdir(exist_ok=True)
    _chown_dirs(claim)
    for host in cluster.hosts:
        cluster.bind(host, claim, w.storage.mount_path)
    write(launcher.path("/etc/ssh/ssh_config.d/deepspeed.conf"), files[SSH_CLIENT_KEY], owner=0)
    write(launcher.path(MPI_HOSTFILE), mpijob_hostfile(len(workers), where.per_worker), owner=0)
    deepspeed_env(launcher, rank_env)
    plain = nvidia.plain_env(w, where, launch)
    worker_env = {**IMAGE_ENV, **plain}
    for host in workers:
        cluster.spawn_main(host, ["/bin/bash", "-c", nvidia.nvidia_worker_script(send_env)],
                           log=logs / f"mpijob-worker-{host.name}.log", env=worker_env)
    # launcherCreationPolicy WaitForWorkersReady: the launcher starts once every worker's readiness probe
    # (a TCP connect to the ssh port) passes.
    names = [f"{MPIJOB}-worker-{i}.{MPIJOB}.{MPIJOB_NAMESPACE}.svc" for i in range(len(workers))]
    port = nvidia.NVIDIA_SSH_PORT
    probe = " && ".join(f"retry_while {shlex.quote(f'(echo > /dev/tcp/{n}/{port}) 2>/dev/null')} 40 0.25"
                        for n in names)
    ready = cluster.run(launcher, ["/bin/bash", "-c", f"source {shlex.quote(str(ENTRYPOINT))} && {probe}"],
                        env=IMAGE_ENV, timeout=30)
    fail_unless(ready.returncode == 0, "MPIJob workers never became ready (sshd on port 2222)")
    env = {**plain, "OMPI_MCA_orte_default_hostfile": MPI_HOSTFILE}
    return w, env, nvidia.launcher_script(None, launch)


def _chown_dirs(path: Path) -> None:
    for root, _dirs, files in os.walk(path):
        os.chown(root, nshosts.UID, nshosts.UID)
        for name in files:
            os.chown(os.path.join(root, name), nshosts.UID, nshosts.UID)

STEP_LINE = re.compile(r"\[smoke\] step (\d+) loss ([\d.]+)")


def losses(output: str) -> dict[int, float]:
    return {int(step): float(loss) for step, loss in STEP_LINE.findall(output)}
