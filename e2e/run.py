"""`make e2e`: DeepSpeed's launch paths across network-namespace hosts on one machine, on CPU.

Two clusters of three hosts each (e2e/hosts.py), side by side (STREAMS), run the stack's own files, rendered by
the stack's own code:

- mpijob: the Kubeflow MPIJob for NVIDIA as workloads/mpijob/nvidia.py renders it: the worker script (its
          own host key, sshd with StrictModes off for the operator's key Secret) and the launcher script
          over the operator's hostfile, /etc/deepspeed holding the job's ConfigMap; then the same worker pods
          launched with OpenMPI (`deepspeed --launcher openmpi`);
- vertex: the vertex stack's CustomJob: the files `pulumi up` uploads in a local folder standing in for
          the bucket at /gcs, vertex_start.sh with each replica's containerSpec and CLUSTER_SPEC on 2 hosts,
          the recipe (finetune.py) on the tiny Llama for one epoch;
- recovery: the Bitnami chart's path. Workers serve SSH as UID 1001 on port 2222 with the chart's sshd
          drop-in over the image's sshd_config; the client waits for them with the image entrypoint's
          `retry_while`, then runs the release's launch command (`cd /app && deepspeed --hostfile
          /job/hostfile smoke_train.py ...`, pdsh) with /app holding the release's source ConfigMap and
          /job/hostfile written as the chart's template writes it. A run with checkpoints is preempted,
          relaunched (every rank on every host reports) and resumes from the step saved on SIGTERM;
          then the same checkpoint resumes with one worker fewer through DeepSpeed's universal checkpoint.
          A worker pod is stopped as a kubelet stops one and nothing more (hosts.Cluster.terminate_pod):
          its preStop hook, SIGTERM to its main process (sshd) only, SIGKILL when the grace period ends,
          and the rest of the pod SIGKILLed once the main process is gone, as the kernel does to a PID
          namespace whose init exits. The ranks save only because the hook reached them.
- finetune: the `finetune` kind's MPIJob (recipes/finetune.py, ZeRO-3, LoRA) on a tiny Llama in a
          folder standing for the bucket at /gcs: after its first checkpoint the whole job is stopped as
          Kubernetes stops it (the operator deletes every pod at once: SIGTERM to the launcher, each worker's
          preStop hook then SIGTERM to sshd, SIGKILL after each pod's grace); the launcher asks the workers to
          stop their ranks instead of letting DeepSpeed's runner pkill them; saved on SIGTERM, relaunched, resumed
          from that step. Saves are tiered (localCheckpoints): each worker saves to its own folder (its local
          SSD's emptyDir) and copies to the bucket in the background, a marker last; the stop comes after a
          first complete copy, while a later one is under way: that copy is dropped for the stop's own save,
          whose complete copy the relaunch resumes from;
          exported to MODEL_DIR with its marker; then vLLM's CPU build serves MODEL_DIR and send_prompt.py's
          greedy completion must be transformers' greedy tokens.
- adapters: two LoRA runs of the `finetune` kind at once (two workloads of the dev stack on one base, each its
          own answer in chat records, one worker each) export adapter-only folders (each under 5 % of the model's
          bytes, markers saying chat rendering); one vLLM CPU server, with the stack's base and LoRA flags and
          the evaluation's client middleware, lists the base and both adapters, each adapter's greedy tokens are
          transformers + peft's, and another host's load and unload get 403; serving.evaluation's evaluator (one
          pass of recipes/evaluator.py, which runs evaluate.py: lm-eval on 20 held-out conversations,
          chat rendering) scores base vs tuned by log-likelihood per reference token and exact match, equal to
          transformers + peft's, and serves the export from its versioned copy through the gate; a second pass
          scores nothing; a next export trained on the wrong answers gets its own scores, is kept out, and the
          first stays served.

Run as root after e2e/install.sh (the Makefile's `e2e` target does both); skips with a reason where
network namespaces are not permitted. Every launch runs under a timeout; every process and namespace
is torn down at the end, also on failure or Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import re
import shlex
import shutil
import signal
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

import hosts as nshosts  # noqa: E402  (e2e/hosts.py, beside this file)

IMAGE_DIR = ROOT / "workloads" / "images" / "deepspeed"
ENTRYPOINT = IMAGE_DIR / "entrypoint.sh"
DOCKERFILE = IMAGE_DIR / "Dockerfile"
VENV = Path(os.environ.get("E2E_VENV", "/opt/ds-e2e-venv"))
RUN_CACHE = Path(tempfile.gettempdir()) / "ds-e2e-cache"  # main() sets the run's own: what scenarios share
CACHE_LOCK = threading.Lock()
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


def scenario_mpijob(cluster: nshosts.Cluster, logs: Path) -> str:
    """The launcher script as rendered (pdsh), then the same launcher with DeepSpeed's OpenMPI runner on the same
    worker pods (the `mpirun` path): mpirun starts orted over the same ssh, the ranks find each other through
    mpi4py (rank 0's address), gloo on eth0."""
    w, env, script = start_mpijob(cluster, logs)
    workers = cluster.hosts[1:]
    status, output = launch(cluster, cluster.hosts[0], script, logs / "mpijob-launcher.log", env=env)
    problems = check_run(output, len(workers), [h.name for h in workers])
    fail_unless(status == 0 and not problems, f"pdsh: exit {status}; {'; '.join(problems)}")
    # The second launch is another job's: its claim holds no checkpoint of the first (it would resume at the end).
    cluster.run(cluster.hosts[0], ["rm", "-rf", w.checkpoint_dir], env=IMAGE_ENV, timeout=30, check=True)
    fail_unless("run_ranks deepspeed --force_multi " in script, "the MPIJob launcher script no longer runs deepspeed")
    script = script.replace("deepspeed --force_multi ", "deepspeed --launcher openmpi --force_multi ", 1)
    status, output = launch(cluster, cluster.hosts[0], script, logs / "mpirun-launcher.log", env=env)
    problems = check_run(output, len(workers), [h.name for h in workers])
    fail_unless("mpirun -n" in output, "DeepSpeed did not run mpirun")
    fail_unless(status == 0 and not problems, f"openmpi: exit {status}; {'; '.join(problems)}")
    return (f"launcher script as rendered (deepspeed --force_multi, pdsh): {len(workers)} ranks; deepspeed "
            f"--launcher openmpi over the operator's hostfile: {len(workers)} ranks")


# --- Vertex AI's path -------------------------------------------------------------------------------------

BUCKET = "e2e-bucket"
# vertex_start.sh counts `nvidia-smi -L` lines for the hostfile's slots: a CPU host stands in for one GPU.
NVIDIA_SMI_STAND_IN = "#!/bin/sh\necho 'GPU 0: CPU stand-in (UUID: GPU-00000000-e2e)'\n"


def vertex_cluster_spec(task: str, index: int, workers: int) -> str:
    return json.dumps({"cluster": {"workerpool0": ["workerpool0-0:2222"],
                                   "workerpool1": [f"workerpool1-{i}:2222" for i in range(workers)]},
                       "task": {"type": task, "index": index, "trial": ""}, "environment": "cloud"})


# The vertex stack's recipe on the tiny Llama: its `finetune` keys but for the data, the model and the run's
# saves; one epoch, LoRA (its adapter exported). Its data are text records (pre-training style: the conversations'
# words as plain documents), so make e2e shows them packed into full blocks (issue 31 item 2; the chat path is the
# finetune scenario's): 64 documents of ~16 tokens in VERTEX_SEQ_LEN-token blocks, 2 ranks x 4 blocks a step.
VERTEX_RUN = "e2e-vertex"  # vertex.displayName: the run's folders, checkpoints/<run> and models/<run>
VERTEX_SEQ_LEN = 32
VERTEX_BATCH = 8  # microBatchPerGpu 4 (FINETUNE_DS) x 2 ranks
VERTEX_TEXT = "text.jsonl"
VERTEX_JOB_ENV = {"CLOUD_ML_JOB_ID": "e2e-vertex-1", "VERTEX_SSH_WAIT_SLEEP": "0.1", "VERTEX_SSH_WAIT_RETRIES": "600",
                  "VERTEX_PYTHON": f"{VENV}/bin/python", "HF_HUB_OFFLINE": "1"}


def vertex_text_records() -> list[dict[str, str]]:
    """The finetune scenario's questions and answers as plain documents, one a record."""
    return [{"text": f"What is {a} plus {b}? {a} plus {b} is {i + j}."}
            for i, a in enumerate(NUMBERS) for j, b in enumerate(NUMBERS)]


def vertex_keys() -> dict[str, Any]:
    """The e2e's `vertex` keys (the finetune scenario's DeepSpeed block, defined further down; packing unset: text
    records are packed into blocks by default)."""
    return {"displayName": VERTEX_RUN, "tensorboard": True, "launch": {"args": ["--logging-steps", "2"]},
            "deepspeed": FINETUNE_DS,  # the tiny Llama's shape (a bucket folder names none): the progress inputs
            "model": {k: FINETUNE_KEYS["model"][k] for k in ("parameters", "vocabulary", "hidden")},
            "finetune": {"modelPath": f"{BUCKET_INPUTS}/base", "datasetPath": f"{BUCKET_INPUTS}/{VERTEX_TEXT}",
                         "recordFormat": "text", "sequenceLength": VERTEX_SEQ_LEN, "epochs": 1, "saveSteps": 1000}}


def packed_steps(tokenized: dict[str, Any]) -> int:
    """One epoch's steps from the tokenized folder's marker, after checking that the documents were packed: as many
    samples as full blocks of their tokens hold (unpacked, each of the 64 documents would be a sample)."""
    blocks = -(-int(tokenized["tokens"]) // VERTEX_SEQ_LEN)
    fail_unless(tokenized.get("packing") == "blocks" and tokenized.get("samples") == blocks,
                f"the text was not packed into {VERTEX_SEQ_LEN}-token blocks: {tokenized}")
    return -(-blocks // VERTEX_BATCH)


def vertex_aip_env(base_output: str) -> dict[str, str]:
    """What Vertex AI sets on every replica from the CustomJob's baseOutputDirectory."""
    return {"AIP_MODEL_DIR": f"{base_output}/model/", "AIP_CHECKPOINT_DIR": f"{base_output}/checkpoints/",
            "AIP_TENSORBOARD_LOG_DIR": f"{base_output}/logs/"}


def scenario_vertex(cluster: nshosts.Cluster, logs: Path) -> str:
    """The vertex stack's CustomJob as Vertex AI runs it, on 2 hosts: its uploaded files in the bucket, each
    replica's containerSpec (command, args, env) under its own CLUSTER_SPEC and the AIP_* variables. The recipe
    trains the tiny Llama for one epoch; the adapter and .complete land in models/<run>, the event files in
    AIP_TENSORBOARD_LOG_DIR. (SIGTERM to vertex_start.sh, passed on to the ranks, is tested with stand-ins in
    tests/test_vertex_entrypoint.py, and finetune.py's save on SIGTERM and resume by the finetune scenario: a second
    run here would cost make e2e's time budget 20 s.)"""
    from workloads import vertex_job

    phases = Phases("vertex")
    image_etc(cluster, image_sshd_drop_in())
    hosts = cluster.hosts[:2]
    gcs = cluster.work / "gcs"
    bucket = gcs / BUCKET
    finetune_assets(bucket, RUN_CACHE / "tiny-llm")
    write(bucket / BUCKET_INPUTS / VERTEX_TEXT, "".join(json.dumps(r) + "\n" for r in vertex_text_records()))
    _chown_dirs(bucket)
    cfg = _vertex_config(vertex_keys(), len(hosts) - 1)
    for name, text in vertex_job.vertex_files(cfg).items():  # what `pulumi up` uploads
        write(bucket / name, text)
    _chown_dirs(gcs)
    # The image's /app (its WORKDIR): DeepSpeed's runner reads ./.deepspeed_env too (vertex_start.sh rewrites ~'s).
    app = cluster.work / "vertex-app"
    app.mkdir(exist_ok=True)
    write(app / ".deepspeed_env", "".join(f"{k}={v}\n" for k, v in {**RANK_ENV, "HF_HUB_OFFLINE": "1"}.items()))
    stand_in = cluster.work / "vertex-bin"
    write(stand_in / "nvidia-smi", NVIDIA_SMI_STAND_IN, 0o755)
    for host in hosts:
        cluster.bind(host, gcs, "/gcs")
        cluster.bind(host, app, "/app")
    spec = vertex_job.customjob_spec(cfg, "image", BUCKET, "e2e@p.iam.gserviceaccount.com")
    container = spec["workerPoolSpecs"][0]["containerSpec"]
    fail_unless(all(p["containerSpec"] == container for p in spec["workerPoolSpecs"]), "the pools run different things")
    fail_unless(container["command"] == [vertex_job.VERTEX_ENTRYPOINT], f"unexpected command {container['command']}")
    entry = str(IMAGE_DIR / "vertex_start.sh")  # the image installs it at containerSpec.command[0]
    command = "cd /app && exec " + " ".join(shlex.quote(a) for a in [entry, *container["args"]])
    env = {**IMAGE_ENV, "PATH": f"{stand_in}:{IMAGE_ENV['PATH']}", **VERTEX_JOB_ENV,
           **vertex_aip_env(spec["baseOutputDirectory"]["outputUriPrefix"]),
           **{e["name"]: e["value"] for e in container["env"]}}
    run_dir = f"/gcs/{BUCKET}"
    model_dir = outside(f"{run_dir}/models/{VERTEX_RUN}", "/gcs", gcs)
    phases.end("tiny Llama, data and the uploaded recipe")

    workers = len(hosts) - 1
    for i, host in enumerate(hosts[1:]):
        cluster.spawn(host, ["/bin/bash", "-c", command], log=logs / f"vertex-{host.name}.log",
                      env={**env, "CLUSTER_SPEC": vertex_cluster_spec("workerpool1", i, workers)})
    status, output = launch(cluster, hosts[0], command, logs / "vertex-primary.log",
                            env={**env, "CLUSTER_SPEC": vertex_cluster_spec("workerpool0", 0, workers)})
    cluster.stop_services()
    fail_unless(status == 0, f"exit {status} (log {logs / 'vertex-primary.log'})")
    (tokenized,) = outside(f"{run_dir}/checkpoints/{VERTEX_RUN}/tokenized", "/gcs", gcs).glob("*/tokenized.json")
    packed = json.loads(tokenized.read_text())
    steps = packed_steps(packed)
    fail_unless("packed: the documents end to end" in output, "the log does not say the documents were packed")
    marker = json.loads((model_dir / ".complete").read_text())
    fail_unless(marker.get("step") == steps and marker.get("world_size") == len(hosts)
                and marker.get("export") == "adapter", f"marker {marker}: expected one epoch ({steps} steps) "
                f"on {len(hosts)} ranks, the adapter")
    missing = [n for n in ("adapter_model.safetensors", "adapter_config.json", "tokenizer.json")
               if not (model_dir / n).is_file()]
    fail_unless(not missing, f"models/{VERTEX_RUN} lacks {missing}")
    events_dir = outside(f"{run_dir}/vertex/logs", "/gcs", gcs)
    events = sorted(events_dir.rglob("events.out.tfevents.*"))
    fail_unless(bool(events) and events[-1].stat().st_size > 0, "no TensorBoard event files in AIP_TENSORBOARD_LOG_DIR")
    # The progress inputs the CustomJob gives every replica (peak, FLOPs, price): tokens/s and MFU in the events.
    tags = set(json.loads(_venv_python("-c", EVENT_TAGS_SCRIPT, str(events_dir)).strip().splitlines()[-1]))
    fail_unless(not event_problems(tags), f"{'; '.join(event_problems(tags))} (AIP_TENSORBOARD_LOG_DIR)")
    losses = trainer_losses(output)
    phases.end("one epoch, exported")
    return (f"the vertex stack's CustomJob on {len(hosts)} hosts (vertex_start.sh, CLUSTER_SPEC, /gcs): the recipe "
            f"(finetune.py from the bucket) on the tiny Llama for one epoch of {len(vertex_text_records())} text "
            f"documents packed into {packed['samples']} blocks of {VERTEX_SEQ_LEN} tokens ({steps} steps, loss "
            f"{' -> '.join(f'{v:.2f}' for v in losses[:1] + losses[-1:])}): adapter and .complete in "
            f"models/{VERTEX_RUN}, event files in AIP_TENSORBOARD_LOG_DIR with {', '.join(EVENT_TAGS)}. Phases: "
            f"{phases.summary()}")


def _vertex_config(spec: dict[str, Any], workers: int) -> Any:
    """The vertex stack's Vertex AI block, loaded by the stack's code, with the e2e's keys and workers."""
    import yaml

    from checks import load
    from preview.engine import engine_config_from_yaml, stack_file

    with open(stack_file("vertex"), encoding="utf-8") as handle:
        config = copy.deepcopy(yaml.safe_load(handle)["config"])
    config["deepspeed-stack:vertex"] |= {"workers": workers, **spec}
    engine_config, secret_keys = engine_config_from_yaml(config)
    return load(engine_config, set(secret_keys)).vertex


def _chown_dirs(path: Path) -> None:
    for root, _dirs, files in os.walk(path):
        os.chown(root, nshosts.UID, nshosts.UID)
        for name in files:
            os.chown(os.path.join(root, name), nshosts.UID, nshosts.UID)


# --- preemption recovery ----------------------------------------------------------------------------------

GRACE_SECONDS = 20  # the e2e's terminationGracePeriodSeconds: SIGTERM, then SIGKILL after this
EVERY = 5  # --checkpoint-every
RUN_STEPS = 400  # long enough to be preempted mid-run on any machine
STEP_LINE = re.compile(r"\[smoke\] step (\d+) loss ([\d.]+)")


def losses(output: str) -> dict[int, float]:
    return {int(step): float(loss) for step, loss in STEP_LINE.findall(output)}


def chart_run(cluster: nshosts.Cluster, logs: Path, name: str, workers: int, args: Sequence[str],
              checkpoints: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """The chart's launch of `workers` workers with checkpoints in a folder every host shares (the
    bucket's FUSE path or the NFS claim); returns the client's launch process and its log."""
    from workloads import deepspeed_release

    w, where = stack_workload("helm", workers, args)
    client, hosts = cluster.hosts[0], cluster.hosts[1:1 + workers]
    chart_files(cluster, client, w, where, workers)
    deepspeed_env(client, {"CHECKPOINT_DIR": str(checkpoints)})
    # Every launch starts with fresh worker pods (a preempted pod comes back; the others restart with it).
    start_chart_workers(cluster, hosts, (client.home / ".ssh" / "id_rsa.pub").read_text(), logs)
    wait_for_workers(cluster, client, [f"{CHART_WORKER}-{i}.{CHART_WORKER}-headless" for i in range(workers)])
    log = logs / f"{name}.log"
    process = cluster.spawn(client, ["/bin/bash", "-c", deepspeed_release.launch_command(w, where)], log=log,
                            env={**IMAGE_ENV, **RANK_ENV})
    return process, log


def wait_process(cluster: nshosts.Cluster, process: subprocess.Popen[bytes], log: Path, what: str) -> tuple[int, str]:
    try:
        status = process.wait(timeout=LAUNCH_TIMEOUT)
    except subprocess.TimeoutExpired:
        cluster.stop_services()
        raise RuntimeError(f"{what}: timed out after {LAUNCH_TIMEOUT:.0f} s (log {log})") from None
    return status, log.read_text(errors="replace")


def chart_pre_stop() -> list[str]:
    """The chart workers' preStop command, as the stack renders the release's values."""
    from workloads import deepspeed_release

    w, where = stack_workload("helm")
    values = deepspeed_release.chart_values(w, where, image={}, source_config_map="e2e-source")
    return list(values["worker"]["lifecycleHooks"]["preStop"]["exec"]["command"])


def mpijob_pre_stop(w: Any, where: Any, launch: Any) -> list[str]:
    """The MPIJob workers' preStop command, as the stack renders the job."""
    from workloads.mpijob import nvidia
    from workloads.mpijob.shape import MpiJobInputs

    spec = nvidia.render_spec(MpiJobInputs(workload=w, placement=where, image="e2e", config_map="e2e"), launch)
    container = spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    return list(container["lifecycle"]["preStop"]["exec"]["command"])


HOOK_SIGNALLED = re.compile(r"SIGTERM to ranks \[([\d, ]+)\]")


def pre_stop_problems(stop: nshosts.Termination) -> list[str]:
    """A pod stopped as the kubelet does: the hook signalled the ranks and saw them exit, and the main process
    (sshd) ended on its SIGTERM in time. What the kernel then SIGKILLs (ssh sessions closing) is only counted."""
    problems = []
    if not HOOK_SIGNALLED.search(stop.hook_output):
        problems.append(f"the preStop hook signalled no rank: {stop.hook_output!r}")
    elif "every rank exited" not in stop.hook_output:
        problems.append(f"the ranks outlived the preStop hook: {stop.hook_output!r}")
    if not stop.main_exited:
        problems.append(f"the pod's main process needed SIGKILL after {GRACE_SECONDS} s")
    return problems


EXIT_PREEMPTED = 143  # finetune.py's and smoke_train.py's status after the save on SIGTERM
# DeepSpeed's per-node launcher (launch.py sigkill_handler) logs this when it gets SIGTERM itself: what pdsh's pkill
# from the runner's handler does, and it then SIGKILLs its ranks 30 s later.
PER_NODE_LAUNCHER_SIGNALLED = "Main process received SIGTERM"


def whole_job_stop_problems(launcher: nshosts.Termination, status: int, output: str) -> list[str]:
    """The launcher of a job stopped whole: it asked the workers to stop their ranks, never signalled DeepSpeed's
    runner (no per-node launcher got a signal: the ranks exited on their own after their save), and ended by
    itself within its grace period with the ranks' status."""
    problems = []
    if "asking every worker's ranks to save and stop" not in output:
        problems.append("the launcher did not ask the workers to stop their ranks")
    if PER_NODE_LAUNCHER_SIGNALLED in output:
        problems.append("a per-node DeepSpeed launcher was signalled (pdsh's pkill from the runner's handler)")
    if not launcher.main_exited:
        problems.append(f"the launcher needed SIGKILL after {GRACE_SECONDS} s")
    if status != EXIT_PREEMPTED:
        problems.append(f"the launcher exited {status}, not the ranks' {EXIT_PREEMPTED} (saved on SIGTERM)")
    return problems


def tiered_problems(ft: Any, local: dict[str, Path], checkpoints: Path, saved: int, in_flight: int,
                   output: str) -> list[str]:
    """Tiered saves after the stop: every worker's local disk holds the stop's save, the bucket its complete copy
    (the run's newest), and the copy the stop cut short (when it was not the stop's own save) was dropped, never
    marked complete."""
    problems = [f"{name}'s local disk lacks checkpoint-{saved}" for name, folder in local.items()
                if ft.newest_checkpoint(folder) is None or ft.checkpoint_step(ft.newest_checkpoint(folder).name)
                != saved]
    if in_flight != saved:
        from workloads.finetune import script_module

        tiered = script_module("finetune_tiered")
        folder = checkpoints / f"checkpoint-{in_flight}"
        marked = (folder / tiered.COPIED_MARKER).exists()
        # The copy under way when the harness stopped the job is either dropped for the stop's save (the ranks'
        # save queued a newer one while it ran) or, on a loaded machine where the ranks reach their step's end
        # after it, finished first: then it must be whole (every node's part). Never cut short and marked.
        if f"copy of checkpoint-{in_flight} abandoned" in output:
            if marked:
                problems.append(f"checkpoint-{in_flight}, cut short by the stop, is marked complete")
        elif not marked or not all((folder / tiered.NODE_MARKER.format(node=n)).is_file() for n in range(len(local))):
            problems.append(f"the copy of checkpoint-{in_flight} under way at the stop was neither dropped for the "
                            "stop's save nor finished on every node")
    return problems


def pre_stop_summary(stop: nshosts.Termination) -> str:
    found = HOOK_SIGNALLED.search(stop.hook_output)
    ranks = len(found.group(1).split(",")) if found else 0
    return (f"{ranks} rank(s) got SIGTERM and exited, then sshd got its SIGTERM; {stop.killed} process(es) left for "
            "the kernel's SIGKILL")


def scenario_recovery(cluster: nshosts.Cluster, logs: Path) -> str:
    client, workers = cluster.hosts[0], cluster.hosts[1:]
    image_etc(cluster, CHART_SSHD_DROP_IN)
    chart_ssh_client(client, len(workers))
    checkpoints = cluster.work / "checkpoints"
    checkpoints.mkdir(exist_ok=True)
    _chown_dirs(checkpoints)
    base = ["--hidden-size", "256", "--layers", "2", "--lr", "0.003", "--warmup-steps", "0"]

    # 1. A run with a checkpoint every EVERY steps; once the second one is saved, the last worker host
    #    is preempted as the kubelet stops a pod: its preStop hook, SIGTERM to its main process (sshd) only, SIGKILL
    #    after the grace period.
    process, log = chart_run(cluster, logs, "recovery-1-preempted", len(workers),
                             [*base, "--steps", str(RUN_STEPS), "--checkpoint-every", str(EVERY)], checkpoints)
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    target = f"global_step{2 * EVERY} saved"
    while target not in log.read_text(errors="replace"):
        fail_unless(process.poll() is None, f"the run ended before its second checkpoint (log {log})")
        fail_unless(time.monotonic() < deadline, f"no second checkpoint within {LAUNCH_TIMEOUT:.0f} s")
        time.sleep(0.05)
    victim = workers[-1]
    stop = cluster.terminate_pod(victim, GRACE_SECONDS, pre_stop=chart_pre_stop(), env=IMAGE_ENV)
    status, first = wait_process(cluster, process, log, "preempted run")
    cluster.stop_services()
    state = json.loads((checkpoints / "smoke_state.json").read_text())
    before = losses(first)
    stopped = max(before)
    fail_unless(status != 0, "the launcher reported success for a preempted run")
    fail_unless(not pre_stop_problems(stop), f"{'; '.join(pre_stop_problems(stop))} (log {log})")
    fail_unless("(SIGTERM: preempted)" in first, f"the ranks did not save on SIGTERM (log {log})")
    fail_unless(state["step"] >= 2 * EVERY, f"last checkpoint at step {state['step']}, expected >= {2 * EVERY}")
    fail_unless(stopped - state["step"] <= EVERY, f"stopped at {stopped}, saved {state['step']}: lost > {EVERY}")

    # 2. The pods come back (the worker restarted, the client's launch restarted): resume from the saved step.
    total = state["step"] + 2 * EVERY
    process, log = chart_run(cluster, logs, "recovery-2-resumed", len(workers),
                             [*base, "--steps", str(total), "--checkpoint-every", str(EVERY)], checkpoints)
    status, second = wait_process(cluster, process, log, "resumed run")
    cluster.stop_services()
    result = result_of(second) or {}
    after = losses(second)
    fail_unless(status == 0 and result.get("ok") is True, f"resumed run: exit {status} (log {log})")
    problems = check_run(second, len(workers), [h.name for h in workers])  # the chart's launch: every rank, host
    fail_unless(not problems, f"resumed run: {'; '.join(problems)} (log {log})")
    fail_unless(f"resumed from {checkpoints}/{state['tag']} at step {state['step']}" in second,
                f"the relaunch did not resume from {state['tag']}")
    fail_unless(result.get("start_step") == state["step"] and min(after) == state["step"] + 1,
                f"resumed at {result.get('start_step')}, first step {min(after, default=None)}")
    fresh = before[1]
    fail_unless(after[min(after)] < 0.9 * fresh, f"loss after resume {after[min(after)]:.4f} vs fresh {fresh:.4f}: "
                "looks like a fresh start")

    # 3. One worker fewer: DeepSpeed's universal checkpoint re-slices ZeRO's optimizer states.
    final_two = json.loads((checkpoints / "smoke_state.json").read_text())
    process, log = chart_run(cluster, logs, "recovery-3-smaller", len(workers) - 1,
                             [*base, "--steps", str(final_two["step"] + EVERY)], checkpoints)
    status, third = wait_process(cluster, process, log, "resume at a smaller world size")
    cluster.stop_services()
    result3 = result_of(third) or {}
    smaller = losses(third)
    fail_unless(status == 0 and result3.get("ok") is True, f"smaller world: exit {status} (log {log})")
    fail_unless("to a universal checkpoint" in third and f"resumed from {checkpoints}/{final_two['tag']}_universal"
                in third, "no resume through the universal checkpoint")
    fail_unless(result3.get("world_size") == len(workers) - 1 and result3.get("start_step") == final_two["step"],
                f"smaller world: world size {result3.get('world_size')}, start step {result3.get('start_step')}")
    fail_unless(smaller[min(smaller)] < 0.9 * fresh and smaller[min(smaller)] < 1.5 * final_two["loss"],
                f"loss after the universal resume {smaller[min(smaller)]:.4f}, before {final_two['loss']:.4f}")
    return (f"preempted at step {stopped} (preStop: {pre_stop_summary(stop)}; saved on SIGTERM at step "
            f"{state['step']}); "
            f"resumed at {state['step']} (loss {before.get(state['step'], float('nan')):.4f} -> "
            f"{after[min(after)]:.4f}, fresh {fresh:.4f}); {len(workers) - 1} worker resumed at "
            f"{final_two['step']} via the universal checkpoint (loss {final_two['loss']:.4f} -> "
            f"{smaller[min(smaller)]:.4f})")


# --- fine-tune, preempt, resume, export, serve -------------------------------------------------------------

TINY_LLM = Path(__file__).resolve().parent / "tiny_llm.py"
SEND_PROMPT = ROOT / "recipes" / "send_prompt.py"
# ZeRO-3 in fp32 (DeepSpeed's CPU accelerator has no fp16); 2 ranks x 4 samples a step. A LoRA adapter learns a
# random model slowly: a high learning rate.
FINETUNE_DS = {"zeroStage": 3, "precision": "fp32", "microBatchPerGpu": 4, "gradientAccumulation": 1,
               "stepsPerPrint": 1000, "learningRate": 0.01}
FINETUNE_STEPS = 40
FINETUNE_SAVE_STEPS = 5
BUCKET_INPUTS = "e2e-finetune"  # the data and the base model, in the bucket
# The kind's `finetune` keys: its defaults (LoRA on every linear layer; gradient checkpointing) but for the data,
# the model and the run's length, and the export: merged here (the `adapters` scenario serves adapters).
# The data: chat conversations (OpenAI's messages), one in eight held out for the eval loss at every save. Not
# packed (chat's default): padding-free batches took the tiny model twice the CPU time a step (docs/measurements.md);
# make test-recipe trains them (tests/recipe).
FINETUNE_KEYS = {"finetune": {"modelPath": f"{BUCKET_INPUTS}/base", "datasetPath": f"{BUCKET_INPUTS}/data.jsonl",
                              "recordFormat": "messages", "evalSplit": 0.125, "sequenceLength": 96,
                              "maxSteps": FINETUNE_STEPS, "saveSteps": FINETUNE_SAVE_STEPS,
                              "lora": {"export": "merged"}},
                 # A bucket folder names no shape: the tiny Llama's, for the planner's memory check (e2e/tiny_llm.py:
                 # 2 x 512 x 64 embedding and head + 2 layers x (4 x 64^2 + 3 x 64 x 128) = 148k parameters).
                 "model": {"parameters": 0.00015, "vocabulary": 512, "hidden": 64, "precision": "fp32"}}
FINETUNE_LAUNCH_ARGS = ["--logging-steps", "5"]
# Tiered saves (localCheckpoints): each worker's own folder stands for its local SSD emptyDir, and the copy to the
# bucket is capped so that one takes seconds (a checkpoint of the tiny Llama is about 1 MB; a real one takes minutes)
# and the whole-job stop comes while one is under way.
FINETUNE_COPY_ARGS = ["--copy-rate-mb", "0.25"]
FINETUNE_PROMPT = "What is two plus three?"
FINETUNE_SYSTEM = "You add numbers."
# A conversation no record holds (the records' second turns ask other sums): the server's chat reply to it.
FINETUNE_HELD_OUT = [{"role": "system", "content": FINETUNE_SYSTEM},
                     {"role": "user", "content": "What is seven plus one?"},
                     {"role": "assistant", "content": "seven plus one is 8."},
                     {"role": "user", "content": "And six plus seven?"}]
FINETUNE_MAX_TOKENS = 12
VLLM_PORT = 8000
VLLM_START_TIMEOUT = float(os.environ.get("E2E_VLLM_TIMEOUT", "300"))
# vLLM's CPU build as FACTS.md measured it fastest to start (a 1 GiB KV cache, eager mode, the `uni` executor),
# with the model run inside the engine-core process (no third process importing everything again), no hub.
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1"}


def vllm_env() -> dict[str, str]:
    """VLLM_ENV, and caches the run's servers keep in the e2e venv beside DeepSpeed's prebuilt op (install.sh): what
    a pod pays at its first start, make e2e pays at its first run only. vLLM inspects a model's class in a
    subprocess (a third import of torch and vLLM) unless its modelinfos cache has it; its sampler's logprobs helper
    is a torch.compile'd function that inductor builds with the C++ compiler at the first prompt-logprobs request
    (the evaluation's first log-likelihood request: 17 s here)."""
    root = VENV / "e2e_cache"
    caches = {"VLLM_CACHE_ROOT": root / "vllm", "TORCHINDUCTOR_CACHE_DIR": root / "inductor"}
    with CACHE_LOCK:
        for folder in caches.values():
            folder.mkdir(parents=True, exist_ok=True)
            _chown_dirs(folder.parent)
    return {**VLLM_ENV, **{name: str(folder) for name, folder in caches.items()}}
NUMBERS = ("zero", "one", "two", "three", "four", "five", "six", "seven")
LOSS_LINE = re.compile(r"\{'loss': '?([\d.]+)'?")
EVAL_LOSS_LINE = re.compile(r"'eval_loss': '?([\d.]+)'?")
RESUMED = re.compile(r"\[finetune\] rank 0/\d+: .* resuming from (\S+)")
# The progress callback's facts (workloads/finetune_progress.py renders them from the pool on a cluster). Here the
# ranks run on CPUs, which have no peak in data/gpu_catalog.yaml: data/training_speed.yaml's cpuPeakTflops stand-in,
# so MFU is computed the cluster's way against a stated figure; and a stand-in price of $1/h.
E2E_PRICE_PER_HOUR = 1.0
EVENT_TAGS = ("train/loss", "train/tokens_per_second", "train/mfu")  # TensorBoardCallback's names (train/ + key)
ETA_TOLERANCE = 0.5  # the ETA at half-way within 50 % of the real remainder (issue 29 item 2)


def e2e_estimate(w: Any) -> dict[str, Any]:
    """The run's estimate before it starts, as the stack renders one for a GPU pool, from the CPU rows of
    data/training_speed.yaml (this scenario's own measured runs, `toy`): its maxSteps x global batch x sequence
    tokens (an upper bound: chat records are shorter), at the rows' tokens/s per rank, plus its saves (every
    saveSteps, each the checkpoint over the bucket's write rate, planner/recovery.py), at the stand-in $/h."""
    from model import training_speed
    from planner import recovery, run_estimate, run_hours
    from planner.requests import workload_request, workload_strategy

    request = workload_request(w)
    assert request is not None, "the e2e workload's model block gives its size"
    tokens, _said = run_estimate.run_tokens(w, w.workers)
    assert tokens is not None, "the e2e workload trains maxSteps"
    e = run_estimate.estimate(tokens, request, workload_strategy(w), w.workers,
                              training_speed.load().cpu_peak_tflops, gpu_type="cpu")
    save = recovery.plan(request.trained_parameters, w.deepspeed.precision, w.workers,
                         "gcsfuse" if w.gcs_fuse.enabled else "nfs", False, w.writes_model).save_seconds
    saves = FINETUNE_STEPS // w.finetune.save_steps
    return run_hours.summary(e, saves * save / 3600, E2E_PRICE_PER_HOUR)


def e2e_run_env(w: Any) -> dict[str, str]:
    """What the stack renders for the progress callback, with the CPU's stand-in peak (data/training_speed.yaml
    cpuPeakTflops) and price, and the run's estimate from the CPU rows."""
    from model import training_speed
    from workloads import finetune_progress

    flops = finetune_progress.model_flops(w)
    assert flops is not None, "the e2e workload's model block gives its size"
    peak = training_speed.load().cpu_peak_tflops
    return {finetune_progress.LOGS_ENV: finetune_progress.logs_dir(w), finetune_progress.FLOPS_ENV: f"{flops:.6g}",
            finetune_progress.PEAK_ENV: f"{peak:g}", finetune_progress.PRICE_ENV: f"{E2E_PRICE_PER_HOUR:g}",
            finetune_progress.ESTIMATE_ENV: json.dumps(e2e_estimate(w), separators=(",", ":"))}


def run_record_problems(run: dict[str, Any], steps: int, price: float) -> list[str]:
    """run.json against the run: its step, its cost = hours x $/h within the two roundings (the record rounds the
    cost from the unrounded hours to 4 places and the hours to 6: |cost - hours x price| <= 0.5e-4 + price x
    0.5e-6), and the estimate it carries beside the measured tokens/s and MFU."""
    problems = []
    hours, cost = run.get("trainingHours"), run.get("cost")
    if run.get("step") != steps or not isinstance(hours, int | float) or not isinstance(cost, int | float) or \
            abs(cost - hours * price) > 0.5e-4 + price * 0.5e-6 + 1e-12:
        problems.append(f"run.json {run}: expected step {steps} and hours x ${price:g}/h within rounding")
    missing = [k for k in ("estimate", "tokensPerSecondPerGpu", "mfu") if k not in run]
    if missing:
        problems.append(f"run.json lacks {', '.join(missing)} (the estimate beside the measured run)")
    return problems


class ProgressWatch(threading.Thread):
    """Polls CHECKPOINT_DIR/progress.json while a run trains: the first reading at half-way or past it."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path, self.half = path, None
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set() and self.half is None:
            try:
                seen = json.loads(self.path.read_text())
            except (OSError, ValueError):  # not yet written (the writer renames: never half a file)
                seen = None
            if seen and seen.get("progressPercentage", 0) >= 50:
                self.half = seen
            time.sleep(0.05)


def progress_problems(half: dict[str, Any] | None, final: dict[str, Any]) -> list[str]:
    """The progress file ends at 100 %, and its ETA at half-way was within ETA_TOLERANCE of the time that was in
    fact left (the training seconds between the two readings)."""
    problems = []
    if final.get("progressPercentage") != 100 or final.get("estimatedRemainingSeconds") != 0:
        problems.append(f"progress.json ends at {final.get('progressPercentage')} %, ETA "
                        f"{final.get('estimatedRemainingSeconds')} s: expected 100 % and 0 s")
    if half is None or "estimatedRemainingSeconds" not in half:
        return [*problems, f"no ETA read at half-way ({half})"]
    real = final["elapsedSeconds"] - half["elapsedSeconds"]
    eta = half["estimatedRemainingSeconds"]
    if abs(eta - real) > ETA_TOLERANCE * real:
        problems.append(f"ETA at step {half.get('step')} ({half['progressPercentage']} %): {eta} s, but {real:.1f} s "
                        f"were left (more than {ETA_TOLERANCE:.0%} off)")
    return problems


def event_problems(tags: set[str]) -> list[str]:
    return [f"the TensorBoard event files have no {tag}" for tag in EVENT_TAGS if tag not in tags]


EVENT_TAGS_SCRIPT = """
import json, pathlib, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
tags = set()
for path in sorted(pathlib.Path(sys.argv[1]).rglob("events.out.tfevents.*")):
    events = EventAccumulator(str(path))
    events.Reload()
    tags |= {t for t in events.Tags()["scalars"] if events.Scalars(t)}
print(json.dumps(sorted(tags)))
"""


def finetune_records() -> list[dict[str, Any]]:
    """The scenario's data set: 64 conversations (OpenAI's messages) a tiny model learns within a few dozen steps,
    a system turn and a question, every eighth with a second question: two assistant turns, both learned."""
    records = []
    for i, a in enumerate(NUMBERS):
        for j, b in enumerate(NUMBERS):
            messages = [{"role": "system", "content": FINETUNE_SYSTEM},
                        {"role": "user", "content": f"What is {a} plus {b}?"},
                        {"role": "assistant", "content": f"{a} plus {b} is {i + j}."}]
            if j == i:
                messages += [{"role": "user", "content": f"And {b} plus {a}?"},
                             {"role": "assistant", "content": f"{b} plus {a} is {i + j} too."}]
            records.append({"messages": messages})
    return records


TOKENIZED_MADE = re.compile(r"\[finetune\] tokenized (\d+) records in ([\d.]+) s")
TOKENIZED_REUSED = re.compile(r"\[finetune\] tokenized data reused from (\S+) ")


def tokenized_problems(first: str, second: str) -> list[str]:
    """The data tokenized once (issue 31 item 2): by the first start's launcher (--prepare-data, before the ranks),
    whose ranks then memory-map that folder; the second start (the resume) tokenizes nothing and reuses the same
    folder."""
    problems = []
    made, again = TOKENIZED_MADE.findall(first), TOKENIZED_MADE.findall(second)
    if len(made) != 1:
        problems.append(f"the first start tokenized the data {len(made)} times, expected once (the launcher's step)")
    if again:
        problems.append(f"the second start tokenized the data again ({len(again)} times): expected it reused")
    folders = {*TOKENIZED_REUSED.findall(first), *TOKENIZED_REUSED.findall(second)}
    if not TOKENIZED_REUSED.search(first) or not TOKENIZED_REUSED.search(second) or len(folders) != 1:
        problems.append(f"folders reused {sorted(folders)}: expected the first start's ranks and the second start to "
                        "reuse the one folder the launcher made")
    return problems


def trainer_losses(output: str) -> list[float]:
    """The Trainer's logged losses in order (transformers 5 prints them as strings: {'loss': '3.458', ...})."""
    return [float(v) for v in LOSS_LINE.findall(output)]


def eval_losses(output: str) -> list[float]:
    """The eval losses on the held-out records, logged at each save."""
    return [float(v) for v in EVAL_LOSS_LINE.findall(output)]


def sample_problems(sample: dict[str, Any], rendered: dict[str, Any]) -> list[str]:
    """What differs between the first record as finetune.py trained on it (CHECKPOINT_DIR/rendered-sample.json) and
    transformers' apply_chat_template of it: the ids, and the labels everywhere but the assistant turns masked (its
    assistant mask, from the template with {% generation %} markers)."""
    expected = [token if mask else -100 for token, mask in zip(rendered["marked_ids"], rendered["assistant_masks"],
                                                                strict=True)]
    problems = []
    if rendered["marked_ids"] != rendered["input_ids"]:
        problems.append("the marked template renders other ids than the served one")
    if sample.get("input_ids") != rendered["input_ids"]:
        problems.append(f"trained ids {sample.get('input_ids')} != apply_chat_template's {rendered['input_ids']}")
    if sample.get("labels") != expected:
        problems.append(f"trained labels {sample.get('labels')} != the assistant turns' {expected}")
    if not any(label != -100 for label in expected):
        problems.append("the record has no assistant token")
    return problems


def chat_problems(answer: dict[str, Any], reference: dict[str, Any], max_tokens: int) -> list[str]:
    """What differs between vLLM's greedy /v1/chat/completions answer (send_prompt.py --chat --json) and
    transformers' greedy tokens after apply_chat_template(add_generation_prompt=True): vLLM's chat API gives the
    rendered prompt's ids beside the choices, not in them."""
    return _greedy_problems(answer, answer.get("prompt_token_ids"), reference, max_tokens,
                            "vLLM rendered the conversation as {got}, transformers' template as {want}")


def _greedy_problems(answer: dict[str, Any], prompt_ids: Any, reference: dict[str, Any], max_tokens: int,
                     prompt_message: str) -> list[str]:
    choice, usage = (answer.get("choices") or [{}])[0], answer.get("usage") or {}
    problems = []
    if usage.get("completion_tokens") != max_tokens:
        problems.append(f"completion_tokens {usage.get('completion_tokens')}, expected {max_tokens}")
    if prompt_ids != reference["prompt_token_ids"]:
        problems.append(prompt_message.format(got=prompt_ids, want=reference["prompt_token_ids"]))
    if choice.get("token_ids") != reference["token_ids"]:
        problems.append(f"vLLM's tokens {choice.get('token_ids')} != transformers' greedy {reference['token_ids']}")
    return problems


def resumed_from(output: str) -> str | None:
    found = RESUMED.findall(output)
    return found[-1] if found else None


def completion_problems(answer: dict[str, Any], reference: dict[str, Any], max_tokens: int) -> list[str]:
    """What differs between vLLM's greedy completion (send_prompt.py --json) and transformers' greedy tokens."""
    choice = (answer.get("choices") or [{}])[0]
    return _greedy_problems(answer, choice.get("prompt_token_ids"), reference, max_tokens,
                            "prompt tokens {got} != transformers' {want}")


def metrics_problems(text: str) -> list[str]:
    """What vLLM's /metrics (Prometheus' text format) lacks of the gauges the autoscaler reads, each typed gauge
    with a sample (data/serving_metrics.yaml)."""
    from model import serving_metrics

    problems = []
    for name in serving_metrics.load().metrics.values():
        quoted = re.escape(name)
        if not re.search(rf"^# TYPE {quoted} gauge$", text, re.MULTILINE):
            problems.append(f"no gauge {name}")
        elif not re.search(rf"^{quoted}(\{{[^}}]*\}})? \S+$", text, re.MULTILINE):
            problems.append(f"{name} has no sample")
    return problems


class Phases:
    """Each phase's wall time, printed as it ends."""

    def __init__(self, scenario: str) -> None:
        self.scenario = scenario
        self.done: list[tuple[str, float]] = []
        self._start = time.monotonic()

    def end(self, name: str) -> None:
        now = time.monotonic()
        self.done.append((name, now - self._start))
        print(f"[e2e] {self.scenario}: {name} {now - self._start:.1f} s", flush=True)
        self._start = now

    def summary(self) -> str:
        return ", ".join(f"{name} {seconds:.0f} s" for name, seconds in self.done)


def _finetune_script() -> Any:
    """finetune.py's checkpoint rule (newest_checkpoint), the same the ranks resume by."""
    from workloads.finetune import script_module

    return script_module("finetune_checkpoints")


def copied(ft: Any, checkpoints: Path) -> Path | None:
    """The newest checkpoint every node's copy finished (finetune_tiered.py's marker), as a tiered run resumes."""
    from workloads.finetune import script_module

    return ft.newest_checkpoint(checkpoints, script_module("finetune_tiered").COPIED_MARKER)


def copying(ft: Any, checkpoints: Path, after: int) -> int | None:
    """A checkpoint newer than `after` whose copy to the bucket is under way (its folder there, no marker yet)."""
    from workloads.finetune import script_module

    marker = script_module("finetune_tiered").COPIED_MARKER
    steps = [step for p in checkpoints.iterdir() if (step := ft.checkpoint_step(p.name)) is not None
             and step > after and not (p / marker).exists()] if checkpoints.is_dir() else []
    return min(steps, default=None)


def _venv_python(*args: str, timeout: float = 120) -> str:
    """The e2e venv's python on this machine (torch, transformers), outside the hosts; its stdout."""
    result = subprocess.run([str(VENV / "bin" / "python"), *args], capture_output=True, text=True, timeout=timeout,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"},
                            check=False)
    fail_unless(result.returncode == 0, f"{' '.join(args[:2])}: {result.stderr.strip()[-800:]}")
    return result.stdout


def finetune_assets(bucket: Path, cache: Path | None = None) -> None:
    """The data set and the base model (random weights, a tokenizer trained on the data) uploaded to the bucket; the
    model made once a run of make e2e and copied from `cache` after (the vertex and finetune scenarios share it)."""
    base = bucket / BUCKET_INPUTS
    base.mkdir(parents=True, exist_ok=True)
    write(base / "data.jsonl", "".join(json.dumps(r) + "\n" for r in finetune_records()))
    with CACHE_LOCK:  # the clusters' scenarios side by side: one makes it, the other waits and copies
        if cache is not None and (cache / "base").is_dir():
            shutil.copytree(cache / "base", base / "base", dirs_exist_ok=True)
        else:
            _venv_python(str(TINY_LLM), "make", str(base / "data.jsonl"), str(base / "base"))
            if cache is not None:
                shutil.copytree(base / "base", cache / "base")
    _chown_dirs(bucket)


def finetune_workload() -> tuple[Any, Any, Any]:
    """The dev stack's `finetune` workload as the stack renders it: (workload, placement, its MPIJob launch)."""
    from workloads import finetune

    w, where = stack_workload("finetune", args=[*FINETUNE_LAUNCH_ARGS, *FINETUNE_COPY_ARGS], script="finetune.py",
                              deepspeed=FINETUNE_DS, keys={**FINETUNE_KEYS, "localCheckpoints": True})
    return w, where, finetune.launch(w, has_token=False, run_env=e2e_run_env(w))


def outside(path: str, mount: str, folder: Path) -> Path:
    """Where a pod's path under `mount` lies on this machine, `folder` being what is mounted there."""
    return folder / Path(path).relative_to(mount)


def wait_for_vllm(cluster: nshosts.Cluster, host: nshosts.Host, server: subprocess.Popen[bytes], log: Path) -> None:
    """Until /health answers 200 (what a readiness probe asks), or the server dies, or the time is up."""
    probe = (f"import urllib.request as u; u.urlopen('http://127.0.0.1:{VLLM_PORT}/health', timeout=2).read()")
    deadline = time.monotonic() + VLLM_START_TIMEOUT
    while True:
        fail_unless(server.poll() is None, f"vLLM exited with {server.returncode}: "
                    f"{log.read_text(errors='replace').strip()[-1500:]}")
        fail_unless(time.monotonic() < deadline, f"vLLM not healthy within {VLLM_START_TIMEOUT:.0f} s (log {log})")
        if cluster.run(host, ["/usr/bin/python3", "-c", probe], env=IMAGE_ENV, timeout=10).returncode == 0:
            return
        time.sleep(1)


def scenario_finetune(cluster: nshosts.Cluster, logs: Path) -> str:
    phases = Phases("finetune")
    ft = _finetune_script()
    launcher, workers = cluster.hosts[0], cluster.hosts[1:]
    w, where, job_launch = finetune_workload()
    bucket, claim = cluster.work / "bucket", cluster.work / "finetune-claim"  # the claim: the job's, both runs
    finetune_assets(bucket, RUN_CACHE / "tiny-llm")
    for host in cluster.hosts:  # the bucket's FUSE mount on every pod (start_mpijob mounts the claim)
        cluster.bind(host, bucket, w.gcs_fuse.mount_path)
    checkpoints = outside(w.checkpoint_dir, w.gcs_fuse.mount_path, bucket)
    model_dir = outside(w.model_dir, w.gcs_fuse.mount_path, bucket)
    phases.end("tiny Llama, tokenizer and data")

    # 1. Trained under ZeRO-3 on both workers; once a checkpoint is saved the whole job is stopped as Kubernetes
    #    stops it (`kubectl delete mpijob`, Kueue's preemption or eviction): at the same moment SIGTERM to the
    #    launcher's main process and, on each worker, its preStop hook then SIGTERM to sshd; SIGKILL after each pod's
    #    grace period. The launcher must leave DeepSpeed's runner alone (its handler would pkill the per-node
    #    launchers, which SIGKILL the ranks 30 s later) and ask the workers to stop their ranks, which save.
    rank_env = {"HF_HUB_OFFLINE": "1"}  # nothing is downloaded: a hub lookup would only wait for a timeout
    _w, env, script = start_mpijob(cluster, logs, (w, where), rank_env, job_launch, claim)
    fail_unless("/etc/deepspeed/finetune.py --deepspeed" in script, "the MPIJob's launcher does not run finetune.py")
    from workloads.finetune import LOCAL_CHECKPOINTS_DIR

    local = {host.name: cluster.work / f"local-ssd-{host.name}" for host in workers}  # each worker's emptyDir
    for host in workers:
        local[host.name].mkdir(exist_ok=True)
        _chown_dirs(local[host.name])
        cluster.bind(host, local[host.name], LOCAL_CHECKPOINTS_DIR)
    log1 = logs / "finetune-1-preempted.log"
    process = cluster.spawn_main(launcher, ["/bin/bash", "-c", script], log=log1,
                                 env={**IMAGE_ENV, **RANK_ENV, **env})
    # Tiered saves: the first save copied whole to the bucket (its marker), then the stop while a later copy is
    # under way.
    deadline, first_copy, in_flight = time.monotonic() + LAUNCH_TIMEOUT, None, None
    while in_flight is None:
        fail_unless(process.poll() is None, f"the run ended before a copy to the bucket was under way (log {log1})")
        fail_unless(time.monotonic() < deadline, f"no copy under way within {LAUNCH_TIMEOUT:.0f} s (log {log1})")
        first_copy = first_copy or copied(ft, checkpoints)
        in_flight = copying(ft, checkpoints, ft.checkpoint_step(first_copy.name)) if first_copy else None
        time.sleep(0.05)
    hook = mpijob_pre_stop(w, where, job_launch)
    launcher_stop, *stops = cluster.stop_job([(launcher, GRACE_SECONDS, None),
                                              *((host, GRACE_SECONDS, hook) for host in workers)], env=IMAGE_ENV)
    status, first = wait_process(cluster, process, log1, "stopped run")
    cluster.stop_services()
    saved = copied(ft, checkpoints)
    saved_step = ft.checkpoint_step(saved.name)
    on_term = re.search(r"stopped at step (\d+) on SIGTERM", first)
    fail_unless(on_term is not None, f"the ranks did not save on SIGTERM (log {log1})")
    problems = [problem for stop in stops for problem in pre_stop_problems(stop)]
    problems += whole_job_stop_problems(launcher_stop, status, first)
    problems += tiered_problems(ft, local, checkpoints, saved_step, in_flight, first)
    fail_unless(not problems, f"{'; '.join(problems)} (log {log1})")
    fail_unless(0 < saved_step < FINETUNE_STEPS and saved_step == int(on_term.group(1)),
                f"newest complete copy {saved.name}, saved on SIGTERM at step {on_term.group(1)}: expected that "
                f"step, between the first and step {FINETUNE_STEPS}")
    phases.end(f"train, {first_copy.name} copied, whole job stopped while checkpoint-{in_flight} was copied, "
               f"saved at step {saved_step}")

    # 2. The job's pods come back: the same launch resumes from the newest checkpoint and exports the model.
    start_mpijob(cluster, logs, (w, where), rank_env, job_launch, claim)
    watch = ProgressWatch(checkpoints / "progress.json")
    watch.start()
    status, second = launch(cluster, launcher, script, logs / "finetune-2-resumed.log", env=env)
    watch.done.set()
    cluster.stop_services()
    fail_unless(status == 0, f"resumed run: exit {status} (log {logs / 'finetune-2-resumed.log'})")
    fail_unless(resumed_from(second) == f"{w.checkpoint_dir}/{saved.name}",
                f"the relaunch resumed from {resumed_from(second)}, expected {saved.name}")
    first_step = min((int(n) for n in re.findall(r"rank \d+: step (\d+)/", second)), default=None)
    fail_unless(first_step is None or first_step > saved_step, f"the relaunch logged step {first_step}, at or "
                f"before the saved step {saved_step}")
    marker = json.loads((model_dir / ".complete").read_text())
    fail_unless(marker.get("step") == FINETUNE_STEPS and marker.get("world_size") == len(workers)
                and marker.get("lora") is True, f"marker {marker}: expected step {FINETUNE_STEPS} on {len(workers)} "
                "ranks, LoRA merged")
    missing = [n for n in ("model.safetensors", "config.json", "tokenizer.json") if not (model_dir / n).is_file()]
    fail_unless(not missing, f"MODEL_DIR lacks {missing}")
    losses = trainer_losses(first) + trainer_losses(second)
    # A LoRA adapter on a random model learns slowly: measured 5.52-5.61 at step 5 and 4.94-5.13 at step 40 (four
    # runs, the last step at 0.88-0.93 of the first).
    fail_unless(len(losses) >= 2 and losses[-1] < 0.97 * losses[0], f"losses {losses}: the model did not learn")
    held_out = eval_losses(first) + eval_losses(second)
    fail_unless(len(held_out) >= 2, f"eval losses {held_out}: expected one at every save (evalSplit)")
    checked = [line for line in first.splitlines() if line.startswith("[finetune] data check, ")]
    fail_unless(bool(checked) and "messages" in checked[0], "the launcher's data check did not run before the ranks "
                f"(log {log1})")
    problems = tokenized_problems(first, second)
    fail_unless(not problems, f"{'; '.join(problems)} (logs {log1}, {logs / 'finetune-2-resumed.log'})")
    phases.end(f"resume from step {saved_step}, train to {FINETUNE_STEPS}, export")

    # Progress and metrics: progress.json beside the checkpoints, the event files under logs/<workload>, run.json.
    from workloads import finetune_progress

    final = json.loads((checkpoints / "progress.json").read_text())
    problems = progress_problems(watch.half, final)
    logs_dir = outside(finetune_progress.logs_dir(w), w.gcs_fuse.mount_path, bucket)
    tags = set(json.loads(_venv_python("-c", EVENT_TAGS_SCRIPT, str(logs_dir)).strip().splitlines()[-1]))
    problems += event_problems(tags)
    run = json.loads((model_dir / "run.json").read_text())
    problems += run_record_problems(run, FINETUNE_STEPS, E2E_PRICE_PER_HOUR)
    compared = [line.split("] ", 1)[-1] for line in second.splitlines() if "estimate vs measured: " in line]
    if not compared:
        problems.append("the run's end did not print its estimate against the measured run")
    rates = re.findall(r"rank (\d+): step \d+/\d+ .*tokens/s .*MFU", first + second)
    if {int(r) for r in rates} != set(range(len(workers))):
        problems.append(f"ranks logging tokens/s and MFU: {sorted({int(r) for r in rates})}, expected every rank")
    fail_unless(not problems, "; ".join(problems))
    phases.end(f"progress at step {watch.half['step']}: ETA {watch.half['estimatedRemainingSeconds']} s, real "
               f"{final['elapsedSeconds'] - watch.half['elapsedSeconds']:.0f} s; events {', '.join(EVENT_TAGS)}; "
               f"cost {run['trainingHours']:.4f} h = ${run['cost']}; {compared[-1] if compared else ''}")

    # 3. vLLM's CPU build serves MODEL_DIR (a serve pod on the launcher's host). Meanwhile transformers renders the
    #    first record (what finetune.py must have trained on) and answers the held-out conversation greedily (what
    #    vLLM's chat completion must answer).
    served = w.model_dir
    server_log = logs / "finetune-vllm.log"
    server = cluster.spawn(launcher, [str(VENV / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
                                      "--model", served, "--dtype", "float32", "--max-model-len", "256",
                                      "--enforce-eager", "--distributed-executor-backend", "uni",
                                      "--host", "0.0.0.0", "--port", str(VLLM_PORT)],
                           log=server_log, env={**IMAGE_ENV, **vllm_env()})
    reference_start = time.monotonic()
    trained = finetune_records()[0]["messages"]
    references = json.loads(_venv_python(str(TINY_LLM), "references", str(model_dir), json.dumps(trained),
                                         json.dumps(FINETUNE_HELD_OUT), str(FINETUNE_MAX_TOKENS))
                            .strip().splitlines()[-1])
    reference_seconds = time.monotonic() - reference_start
    sample = json.loads((checkpoints / "rendered-sample.json").read_text())
    problems = sample_problems(sample, references["render"])
    fail_unless(not problems, "; ".join(problems))
    learned = sum(1 for label in sample["labels"] if label != -100)
    wait_for_vllm(cluster, launcher, server, server_log)
    phases.end(f"vLLM healthy (transformers' references {reference_seconds:.0f} s meanwhile)")

    # 4. The held-out conversation through /v1/chat/completions, greedy, all max_tokens generated: vLLM renders it
    #    through the served template into the same ids, and answers with the same tokens as transformers.
    asked = cluster.run(launcher, ["/usr/bin/python3", str(SEND_PROMPT), "--openai", "--chat", "--url",
                                   f"http://127.0.0.1:{VLLM_PORT}", "--model", served, "--temperature", "0",
                                   "--ignore-eos", "--token-ids", "--json", "--max-new-tokens",
                                   str(FINETUNE_MAX_TOKENS), "--messages", json.dumps(FINETUNE_HELD_OUT)],
                        env=IMAGE_ENV, timeout=60)
    fail_unless(asked.returncode == 0, f"send_prompt.py: {asked.stderr.strip()[-800:]}; vLLM log {server_log}")
    answer = json.loads(asked.stdout)
    problems = chat_problems(answer, references["chat"], FINETUNE_MAX_TOKENS)
    fail_unless(not problems, "; ".join(problems))
    phases.end("chat answered")

    # 5. vLLM's /metrics on the API port, what Managed Prometheus scrapes: the queue and batch the autoscaler reads.
    scrape = ("import urllib.request as u; "
              f"print(u.urlopen('http://127.0.0.1:{VLLM_PORT}/metrics', timeout=5).read().decode())")
    scraped = cluster.run(launcher, ["/usr/bin/python3", "-c", scrape], env=IMAGE_ENV, timeout=30)
    fail_unless(scraped.returncode == 0, f"GET /metrics: {scraped.stderr.strip()[-800:]}; vLLM log {server_log}")
    missing = metrics_problems(scraped.stdout)
    fail_unless(not missing, f"vLLM's /metrics: {'; '.join(missing)}")
    phases.end("/metrics has the autoscaler's gauges")
    text = (answer["choices"][0].get("message") or {}).get("content") or ""
    stopped = on_term.group(1) if on_term else saved_step
    (records, seconds), = TOKENIZED_MADE.findall(first)
    return (f"kind finetune: chat data (messages, {len(finetune_records())} records, 1/8 held out), tokenized once "
            f"by the launcher ({records} records in {seconds} s; the resume reused it), LoRA under "
            f"ZeRO-3 on {len(workers)} hosts, the whole job stopped at step {stopped} (launcher: SIGTERM, asked the "
            f"workers, exited {EXIT_PREEMPTED} with the ranks; a preStop: {pre_stop_summary(stops[0])}; saved "
            f"{saved.name}), resumed to step {FINETUNE_STEPS} (loss {losses[0]:.2f} -> {losses[-1]:.2f}, eval loss "
            f"{held_out[0]:.2f} -> {held_out[-1]:.2f}), merged and exported; record 1 trained on "
            f"apply_chat_template's {len(sample['input_ids'])} ids with only its {learned} assistant tokens learned; "
            f"vLLM's chat completion of a held-out conversation {text!r}: the same {FINETUNE_MAX_TOKENS} tokens as "
            f"transformers' after the same template. Phases: {phases.summary()}")


# --- adapters: two LoRA runs served by one vLLM, the evaluation and its gate -----------------------------------

EVALUATE = ROOT / "recipes" / "evaluate.py"
EVALUATOR = ROOT / "recipes" / "evaluator.py"  # serving.evaluation's container: it runs EVALUATE
LORA_LLM = Path(__file__).resolve().parent / "lora_llm.py"
ADAPTER_LOADER = ROOT / "recipes" / "adapter_loader.py"  # beside vLLM in every replica of a fleet
REPLICA_STAND_IN = Path(__file__).resolve().parent / "replica_stand_in.py"
ADAPTER_INPUTS = "e2e-adapters"  # the base model, both data sets and the held-out task, in the bucket
# Two finetune workloads on the same base, each taught its own one-word answer in OpenAI chat records (through the
# tiny model's chat template); the server serves `no` (its serving.fromWorkload) and `yes` (serving.adapters), and
# `yes` is evaluated and gated on held-out conversations. `no`'s adapter, taught the wrong answer to the same
# questions, then stands in for a later export of `yes` (copied into its MODEL_DIR as a run would write it).
ADAPTER_ANSWERS = {"no": "no", "yes": "yes"}
GATED = "yes"
ADAPTER_STEPS, ADAPTER_SAVE_STEPS = 20, 10
# Rank 2 on every linear layer: the tiny Llama's adapter is then 4.3 % of its weights (a real 7B's rank-16 adapter
# is about 0.5 %: its embeddings dominate); vLLM holds it in --max-lora-rank 8, its smallest rank above 1.
ADAPTER_DS = {**FINETUNE_DS, "learningRate": 0.1}
ADAPTER_MAX_SHARE = 0.05  # an adapter's weights, at most this share of the (merged) model's
TASK_RECORDS = 20
# One token: the tiny model learns its answer's token (`yes` is one in its tokenizer) within a few steps, but not to
# stop after it (its logits stay small: RMSNorm and the output head's small initialisation), so longer replies are
# `yesyes...`; a user's task generates until the end of the turn or --max-tokens (default 32).
EVAL_MAX_TOKENS = 1
GATE = 0.1  # nats per reference token: the trained adapter must beat the base (then the served one) by this
LIKELIHOOD_TOLERANCE = 1e-3  # vLLM's prompt logprobs against transformers', both float32 on CPU
# The bucket's mount (gcsFuse.mountPath) of this scenario's pods: a folder no other scenario mounts, so that a run of
# older harness code beside this one (which removed /gcs at its end, unmounting it in every run) cannot take it away.
ADAPTER_BUCKET_MOUNT = "/gcs-adapters"


def adapter_pairs() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The 64 prompts' word pairs: 20 held out for the task (every third), the other 44 trained on."""
    pairs = [(a, b) for a in NUMBERS for b in NUMBERS]
    held = pairs[::3][:TASK_RECORDS]
    return [p for p in pairs if p not in held], held


def adapter_prompt(pair: tuple[str, str]) -> str:
    return f"Is {pair[0]} next to {pair[1]}?"


def chat_record(pair: tuple[str, str], answer: str) -> dict[str, Any]:
    """OpenAI's chat format: the question, and the answer as the assistant's (last) turn."""
    return {"messages": [{"role": "user", "content": adapter_prompt(pair)}, {"role": "assistant", "content": answer}]}


def adapter_assets(bucket: Path) -> None:
    """Each workload's data (the same prompts, its own answer), the task (held-out prompts, GATED's answer) and the
    base model, its tokenizer trained on every record (e2e/tiny_llm.py), uploaded to the bucket."""
    base = bucket / ADAPTER_INPUTS
    base.mkdir(parents=True, exist_ok=True)
    train, held = adapter_pairs()
    everything = []
    for name, answer in ADAPTER_ANSWERS.items():
        records = [chat_record(p, answer) for p in train]
        everything += records
        write(base / f"{name}.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    write(base / "task.jsonl", "".join(json.dumps(chat_record(p, ADAPTER_ANSWERS[GATED])) + "\n" for p in held))
    write(base / "all.jsonl", "".join(json.dumps(r) + "\n" for r in everything))
    _venv_python(str(TINY_LLM), "make", str(base / "all.jsonl"), str(base / "base"))
    _chown_dirs(bucket)


def adapters_stack() -> Any:
    """The dev stack with the two finetune workloads and their server, loaded and checked by the stack's own code:
    the server's adapters, LoRA flags and markers are the stack's."""
    import yaml

    from checks import load
    from preview.engine import engine_config_from_yaml, stack_file

    with open(stack_file("dev"), encoding="utf-8") as handle:
        config = copy.deepcopy(yaml.safe_load(handle)["config"])
    config["deepspeed-stack:storage"] = {**config.get("deepspeed-stack:storage", {}), "enabled": True}
    config["deepspeed-stack:mpiOperator"] = {**config.get("deepspeed-stack:mpiOperator", {}), "install": True}
    gcs = {"enabled": True, "mountPath": ADAPTER_BUCKET_MOUNT}
    workloads: dict[str, Any] = {}
    for name in ADAPTER_ANSWERS:
        workloads[name] = {
            "kind": "finetune", "pool": "t4", "workers": 1, "namespace": f"e2e-{name}", "gcsFuse": gcs,
            "storage": {"storageClass": "standard-rwx", "claimName": f"{name}-shared"},
            "deepspeed": dict(ADAPTER_DS), "launch": {"script": "finetune.py", "args": FINETUNE_LAUNCH_ARGS},
            # Chat records through the tiny model's own template (chatTemplate auto): the marker says so, and
            # the evaluation renders the task the same way.
            "finetune": {"modelPath": f"{ADAPTER_INPUTS}/base", "datasetPath": f"{ADAPTER_INPUTS}/{name}.jsonl",
                         "sequenceLength": 32, "maxSteps": ADAPTER_STEPS, "saveSteps": ADAPTER_SAVE_STEPS,
                         "lora": {"rank": 2}},
            "model": FINETUNE_KEYS["model"]}
    names = list(ADAPTER_ANSWERS)
    workloads["serve"] = {
        "kind": "serve", "pool": "t4", "namespace": "e2e-serve", "gcsFuse": gcs,
        "serving": {"fromWorkload": names[0], "adapters": names[1:]},
        "model": {"parameters": 0.00015, "vocabulary": 512, "hidden": 64, "precision": "fp16", "mode": "inference",
                  "sequenceLength": 256}}
    config["deepspeed-stack:workloads"] = workloads
    engine_config, secret_keys = engine_config_from_yaml(config)
    return load(engine_config, set(secret_keys))


def _exported_adapter(model_dir: Path, base: Path, name: str) -> str:
    """MODEL_DIR holds an adapter (marker, files), its weights under ADAPTER_MAX_SHARE of the merged model's (a
    merged model has the base's tensors: the base's safetensors size)."""
    marker = json.loads((model_dir / ".complete").read_text())
    fail_unless(marker.get("export") == "adapter" and marker.get("step") == ADAPTER_STEPS
                and marker.get("rendering") == "chat" and marker.get("recordFormat") == "messages",
                f"{name}'s marker {marker}: expected an adapter export at step {ADAPTER_STEPS}, chat rendering")
    files = sorted(p.name for p in model_dir.iterdir())
    fail_unless("adapter_config.json" in files and "adapter_model.safetensors" in files
                and not [f for f in files if f.startswith("model")], f"{name}'s MODEL_DIR holds {files}")
    share = (model_dir / "adapter_model.safetensors").stat().st_size / (base / "model.safetensors").stat().st_size
    fail_unless(share < ADAPTER_MAX_SHARE, f"{name}'s adapter is {share:.1%} of the model's bytes")
    return f"{name} {share:.1%}"


def _models(cluster: nshosts.Cluster, host: nshosts.Host) -> list[str]:
    probe = (f"import json, urllib.request as u; print(json.dumps([m['id'] for m in json.load(u.urlopen("
             f"'http://127.0.0.1:{VLLM_PORT}/v1/models', timeout=10))['data']]))")
    result = cluster.run(host, ["/usr/bin/python3", "-c", probe], env=IMAGE_ENV, timeout=30)
    fail_unless(result.returncode == 0, f"/v1/models: {result.stderr.strip()[-500:]}")
    return list(json.loads(result.stdout))


def _status(cluster: nshosts.Cluster, host: nshosts.Host, url: str, body: dict[str, Any] | None) -> int:
    """The HTTP status `host` gets for a GET (no body) or a JSON POST to `url`."""
    probe = ("import json, sys, urllib.error, urllib.request as u\n"
             f"body = {json.dumps(body)!r}\n"
             "data = None if body == 'null' else body.encode()\n"
             f"request = u.Request({url!r}, data=data, headers={{'Content-Type': 'application/json'}})\n"
             "try:\n    print(u.urlopen(request, timeout=30).status)\n"
             "except urllib.error.HTTPError as error:\n    print(error.code)\n")
    result = cluster.run(host, ["/usr/bin/python3", "-c", probe], env=IMAGE_ENV, timeout=60)
    fail_unless(result.returncode == 0, f"{url} from {host.name}: {result.stderr.strip()[-500:]}")
    return int(result.stdout.strip())


def _roots(cluster: nshosts.Cluster, host: nshosts.Host) -> dict[str, str]:
    """Each adapter a server on `host` serves, with the path it was loaded from (/v1/models' `root`)."""
    probe = (f"import json, urllib.request as u; print(json.dumps({{m['id']: m['root'] for m in json.load(u.urlopen("
             f"'http://127.0.0.1:{VLLM_PORT}/v1/models', timeout=10))['data'] if m.get('parent')}}))")
    result = cluster.run(host, ["/usr/bin/python3", "-c", probe], env=IMAGE_ENV, timeout=30)
    fail_unless(result.returncode == 0, f"/v1/models on {host.name}: {result.stderr.strip()[-500:]}")
    return dict(json.loads(result.stdout))


def _load_decided(cluster: nshosts.Cluster, host: nshosts.Host, evals: str, name: str, log: Path) -> None:
    """One pass of the fleet's adapter loader (what each replica runs beside vLLM) against the server on `host`:
    exit 0 once every decision is served."""
    result = cluster.run(host, ["/usr/bin/python3", str(ADAPTER_LOADER), "--url", f"http://127.0.0.1:{VLLM_PORT}",
                                "--evals", evals, "--adapter", name, "--once"], env=IMAGE_ENV, timeout=60)
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"--- {host.name}: exit {result.returncode}\n{result.stdout}{result.stderr}")
    fail_unless(result.returncode == 0, f"adapter_loader.py on {host.name}: exit {result.returncode} (log {log})")


def _unload(cluster: nshosts.Cluster, host: nshosts.Host, name: str) -> None:
    """vLLM's /v1/unload_lora_adapter, from inside the pod (127.0.0.1: the evaluator's side)."""
    probe = (f"import json, urllib.request as u; u.urlopen(u.Request('http://127.0.0.1:{VLLM_PORT}/v1/unload_lora_"
             f"adapter', data=json.dumps({{'lora_name': {name!r}}}).encode(), headers={{'Content-Type': "
             "'application/json'}), timeout=30).read()")
    result = cluster.run(host, ["/usr/bin/python3", "-c", probe], env=IMAGE_ENV, timeout=60)
    fail_unless(result.returncode == 0, f"unload {name}: {result.stderr.strip()[-500:]}")


def _ask(cluster: nshosts.Cluster, host: nshosts.Host, model: str, reference: dict[str, Any], log: Path) -> str:
    """One greedy completion from `model` through the OpenAI API: transformers + peft's tokens."""
    asked = cluster.run(host, ["/usr/bin/python3", str(SEND_PROMPT), "--openai", "--url",
                               f"http://127.0.0.1:{VLLM_PORT}", "--model", model, "--temperature", "0",
                               "--ignore-eos", "--token-ids", "--json", "--max-new-tokens",
                               str(FINETUNE_MAX_TOKENS), adapter_prompt(("two", "three"))], env=IMAGE_ENV,
                        timeout=60)
    fail_unless(asked.returncode == 0, f"send_prompt.py --model {model}: {asked.stderr.strip()[-800:]}; log {log}")
    answer = json.loads(asked.stdout)
    problems = completion_problems(answer, reference, FINETUNE_MAX_TOKENS)
    fail_unless(not problems, f"{model}: " + "; ".join(problems))
    return str(answer["choices"][0].get("text", ""))


def _evaluate(cluster: nshosts.Cluster, host: nshosts.Host, logs: Path, name: str, args: list[str],
              script: Path = EVALUATE, scored: bool = True) -> dict[str, Any]:
    """recipes/evaluate.py (or evaluator.py, which runs it) on the server's host, as the image's user,
    against the running server; `scored`: its base vs tuned line is printed."""
    log = logs / f"adapters-evaluate-{name}.log"
    status, output = launch(cluster, host, " ".join(shlex.quote(a) for a in [str(VENV / "bin" / "python"),
                                                                           str(script), *args]), log,
                            env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}, timeout=LAUNCH_TIMEOUT)
    fail_unless(status == 0, f"{script.name}: exit {status} (log {log})")
    line = [t for t in output.splitlines() if t.startswith("[evaluate] ") and " vs tuned " in t]
    fail_unless(bool(line) == scored, f"{script.name} printed {len(line)} base vs tuned line(s) (log {log})")
    if line:
        print(f"[e2e] adapters: {line[-1]}", flush=True)
    return {"output": output}


def scenario_adapters(cluster: nshosts.Cluster, logs: Path) -> str:
    from workloads import finetune
    from workloads.mpijob import nvidia
    from workloads.mpijob.shape import SSH_CLIENT_KEY
    from workloads.placement import placement
    from workloads.serving_command import CLIENT_ENDPOINTS_MIDDLEWARE, lora_args
    from workloads.serving_source import model_source

    phases = Phases("adapters")
    launcher = cluster.hosts[0]
    m = adapters_stack()
    server_w = m.workloads["serve"]
    trainers = [m.workloads[n] for n in ADAPTER_ANSWERS]
    mount = server_w.gcs_fuse.mount_path
    bucket = cluster.work / "bucket-adapters"
    adapter_assets(bucket)
    for host in cluster.hosts:
        cluster.bind(host, bucket, mount)
    base = bucket / ADAPTER_INPUTS / "base"
    phases.end("tiny Llama, two data sets and the task")

    # 1. Two LoRA runs at once, the stack's finetune MPIJobs of one worker each (ZeRO-3 on its host: the two cores
    #    train both in the time of one), each exporting its adapter alone. The jobs' ConfigMaps are the same files
    #    (finetune.py, ds_config.json); each launcher has its own hostfile (its worker) and environment (MODEL_DIR).
    rank_env = {"HF_HUB_OFFLINE": "1"}
    wheres = [placement(m, w) for w in trainers]
    jobs = [finetune.launch(w, has_token=False) for w in trainers]
    files = [{k: v for k, v in nvidia.config_map_data(w, where, False, job).items() if k != SSH_CLIENT_KEY}
             for w, where, job in zip(trainers, wheres, jobs, strict=True)]
    fail_unless(all(f == files[0] for f in files), "the two jobs' ConfigMaps differ: they cannot share the hosts")
    start_mpijob(cluster, logs, (trainers[0], wheres[0]), rank_env, jobs[0])
    runs = []
    for i, (w, where, job) in enumerate(zip(trainers, wheres, jobs, strict=True)):
        script = nvidia.launcher_script(None, job)
        fail_unless("--lora-export adapter" in script, "the MPIJob does not pass --lora-export adapter")
        hostfile = f"{MPI_HOSTFILE}-{w.name}"
        write(launcher.path(hostfile), mpijob_hostfile(WORKERS, where.per_worker).splitlines()[i] + "\n", owner=0)
        env = {**nvidia.plain_env(w, where, job), "OMPI_MCA_orte_default_hostfile": hostfile}
        log = logs / f"adapters-train-{w.name}.log"
        runs.append((w, cluster.spawn(launcher, ["/bin/bash", "-c", script], log=log,
                                      env={**IMAGE_ENV, **RANK_ENV, **env}), log))
    for w, process, log in runs:
        status, _output = wait_process(cluster, process, log, f"{w.name}'s run")
        fail_unless(status == 0, f"{w.name}: exit {status} (log {log})")
    cluster.stop_services()
    sizes = [_exported_adapter(outside(w.model_dir, mount, bucket), base, w.name) for w in trainers]
    phases.end("two LoRA runs at once, adapters exported")

    # 2. One vLLM server: the stack's base and LoRA flags (serving.fromWorkload yes, serving.adapters [no]), with
    #    runtime adapter loading for the evaluation; CPU flags as the finetune scenario's. References meanwhile.
    source = model_source(m, server_w)
    # With evaluation's middleware (recipes/client_endpoints.py on PYTHONPATH, as the pod has it): the
    # runtime adapter endpoints answer this host's loopback (the evaluator) and no other host.
    args = ["--model", source.ref, "--served-model-name", source.served_name, *lora_args(source),
            "--dtype", "float32", "--max-model-len", "256", "--enforce-eager", "--distributed-executor-backend", "uni",
            "--host", "0.0.0.0", "--port", str(VLLM_PORT), "--middleware", CLIENT_ENDPOINTS_MIDDLEWARE]
    server_log = logs / "adapters-vllm.log"
    server = cluster.spawn(launcher, [str(VENV / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
                                      *args], log=server_log,
                           env={**IMAGE_ENV, **vllm_env(), "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true",
                                "PYTHONPATH": str(EVALUATE.parent)})
    task = bucket / ADAPTER_INPUTS / "task.jsonl"
    reference = json.loads(_venv_python(
        str(LORA_LLM), "all", str(base), adapter_prompt(("two", "three")), str(FINETUNE_MAX_TOKENS), str(task),
        str(EVAL_MAX_TOKENS), *(f"{w.name}={outside(w.model_dir, mount, bucket)}" for w in trainers),
        timeout=300).strip().splitlines()[-1])
    refs = reference["generate"]
    gated = m.workloads[GATED]
    expected = {"base": reference["score"]["base"], "candidate": reference["score"][gated.name],
                "wrong": reference["score"][ADAPTER_ANSWERS["no"]]}
    wait_for_vllm(cluster, launcher, server, server_log)
    phases.end("vLLM healthy (transformers + peft references meanwhile)")

    # 3. The base and both adapters listed; each adapter's greedy tokens are transformers + peft's.
    listed = _models(cluster, launcher)
    wanted = [source.served_name, *(w.name for w in trainers)]
    fail_unless(sorted(listed) == sorted(wanted), f"/v1/models lists {listed}, expected {wanted}")
    replies = {w.name: _ask(cluster, launcher, w.name, refs[w.name], server_log) for w in trainers}
    # A client (another host) is served, but may not unload or load an adapter: 403, and both stay listed.
    client = cluster.hosts[1]
    refused = {path: _status(cluster, client, f"http://{launcher.ip}:{VLLM_PORT}{path}", body)
               for path, body in (("/v1/unload_lora_adapter", {"lora_name": GATED}),
                                  ("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(base)}),
                                  ("/v1/models", None))}
    fail_unless(refused == {"/v1/unload_lora_adapter": 403, "/v1/load_lora_adapter": 403, "/v1/models": 200},
                f"a client's requests answered {refused}, expected 403 for the adapter endpoints")
    fail_unless(sorted(_models(cluster, launcher)) == sorted(wanted), "a client changed what is served")
    phases.end("/v1/models and both adapters' tokens; a client's load and unload refused")

    # 4. The evaluation of `yes`'s export by serving.evaluation's evaluator (one pass, --once, a gate), which runs
    #    evaluate.py: the marker says chat, so the 20 held-out conversations are rendered through the template and
    #    the gate reads the likelihood metric; lm-eval's scores are transformers + peft's (log-likelihood per
    #    reference token, exact match), the tuning shows, and the export is served from its own versioned copy.
    #    A second pass scores nothing: results.json names the export it scored (its marker).
    evals = f"{mount}/evals/{gated.name}"
    results = outside(f"{evals}/results.json", mount, bucket)
    task = f"{mount}/{ADAPTER_INPUTS}/task.jsonl"
    url = f"http://127.0.0.1:{VLLM_PORT}"
    one_pass = ["--url", url, "--base", source.served_name, "--task", task, "--evals", f"{mount}/evals",
                "--max-tokens", str(EVAL_MAX_TOKENS), "--max-length", "256", "--min-improvement", str(GATE),
                "--adapter", f"{gated.name}={gated.model_dir}", "--once"]
    # With serving.evaluation the server starts without the adapter (no --lora-modules: the evaluator loads it once
    # it passes); the server here started with it for step 3, so it is unloaded first, as the pod would start.
    _unload(cluster, launcher, gated.name)
    fail_unless(gated.name not in _models(cluster, launcher), f"{gated.name} is still listed after its unload")
    # A second replica (serving.replicas 2: the evaluator then decides for both) on another host: a stand-in of
    # vLLM's adapter endpoints (e2e/replica_stand_in.py; a second vLLM would cost 45 s), with the loader each replica
    # runs beside vLLM. Nothing decided yet: it serves no adapter, and is ready.
    replica, loader_log = cluster.hosts[2], logs / "adapters-loader.log"
    stand_in = cluster.spawn(replica, ["/usr/bin/python3", str(REPLICA_STAND_IN), str(VLLM_PORT),
                                       source.served_name], log=logs / "adapters-replica.log", env=IMAGE_ENV)
    wait_for_vllm(cluster, replica, stand_in, logs / "adapters-replica.log")
    _load_decided(cluster, replica, f"{mount}/evals", gated.name, loader_log)
    fail_unless(_roots(cluster, replica) == {}, f"the second replica serves {_roots(cluster, replica)} before any "
                "decision")
    _evaluate(cluster, launcher, logs, "export", one_pass, script=EVALUATOR)
    again = _evaluate(cluster, launcher, logs, "again", one_pass, script=EVALUATOR, scored=False)
    fail_unless("evaluating" not in again["output"], f"the evaluator scored the same export twice: {again}")
    first = json.loads(results.read_text())
    scores = first["scores"]
    fail_unless(first["records"] == TASK_RECORDS and first["served"] is True and first["metric"] == "loglikelihood"
                and first["rendering"] == "chat", f"results.json {first}: expected {TASK_RECORDS} records, "
                "loglikelihood, chat rendering, served")
    fail_unless(not score_problems(first, expected, "candidate"), "; ".join(score_problems(first, expected,
                                                                                           "candidate")))
    fail_unless(scores["candidate"] > scores["base"] + GATE, f"the tuned adapter does not beat the base: {scores}")
    served_file = outside(f"{evals}/served.json", mount, bucket)
    served = json.loads(served_file.read_text())
    fail_unless(served["path"] == first["candidateCopy"] == first["servedPath"]
                and f"{gated.name}-{ADAPTER_STEPS}-" in served["path"], f"served.json {served}, results {first}")
    fail_unless(_models(cluster, launcher).count(gated.name) == 1, "the served adapter is not listed once")
    # Both replicas' loaders: each serves the version served.json names.
    for host in (launcher, replica):
        _load_decided(cluster, host, f"{mount}/evals", gated.name, loader_log)
    roots = {host.name: _roots(cluster, host).get(gated.name) for host in (launcher, replica)}
    fail_unless(set(roots.values()) == {served["path"]}, f"the replicas serve {roots}, served.json {served['path']}")

    # 5. A next export of `yes` trained on the wrong answers (`no`'s adapter, written into yes's MODEL_DIR with its
    #    own marker, as a later run writes it): scored from its own versioned path with its own scores (the
    #    transformers figures of `no`'s weights, not the first export's), it does not beat the adapter served now
    #    and is kept out; its copy is removed, served.json still names the first, and `yes` answers as before.
    model_dir = outside(gated.model_dir, mount, bucket)
    wrong = outside(m.workloads["no"].model_dir, mount, bucket)
    marker = {**json.loads((wrong / ".complete").read_text()), "finished": "2030-01-01T00:00:00+00:00"}
    (model_dir / ".complete").unlink()
    for item in wrong.iterdir():
        if item.is_file() and item.name != ".complete":
            shutil.copy2(item, model_dir / item.name)
    write(model_dir / ".complete", json.dumps(marker) + "\n")
    gate = _evaluate(cluster, launcher, logs, "gate", one_pass, script=EVALUATOR)
    second = json.loads(results.read_text())
    fail_unless(second["served"] is False and "not served" in second["reason"] and "not served" in gate["output"]
                and second["reference"] == "served", f"the wrong export was served: {second}")
    fail_unless(not score_problems(second, expected, "wrong"), "; ".join(score_problems(second, expected, "wrong")))
    fail_unless(second["candidateCopy"] != first["candidateCopy"] and abs(
        second["scores"]["served"] - scores["candidate"]) < LIKELIHOOD_TOLERANCE,
        f"the second export's copy or the served adapter's score: {second} (first {first})")
    versions = outside(f"{evals}/versions", mount, bucket)
    fail_unless(json.loads(served_file.read_text())["path"] == served["path"]
                and [p.name for p in versions.iterdir()] == [Path(served["path"]).name],
                f"served.json or versions/ changed: {sorted(p.name for p in versions.iterdir())}")
    fail_unless(gated.name in _models(cluster, launcher), f"{gated.name} is no longer served")
    _ask(cluster, launcher, gated.name, refs[gated.name], server_log)
    for host in (launcher, replica):  # the kept-out export changed no decision: both replicas stay as they are
        _load_decided(cluster, host, f"{mount}/evals", gated.name, loader_log)
    roots = {host.name: _roots(cluster, host).get(gated.name) for host in (launcher, replica)}
    fail_unless(set(roots.values()) == {served["path"]}, f"after the kept-out export the replicas serve {roots}")
    phases.end("evaluation and the gate")
    return (f"two LoRA runs exported adapters ({', '.join(sizes)} of the model's bytes); one vLLM served "
            f"{', '.join(wanted)}; {', '.join(f'{k} answered {v!r}' for k, v in replies.items())}, transformers + "
            f"peft's tokens; lm-eval on {TASK_RECORDS} held-out conversations (chat rendering), log-likelihood per "
            f"reference token: base {scores['base']:.3f} vs tuned {scores['candidate']:.3f} (transformers' "
            f"figures), served from {Path(served['path']).name}; a next export trained on the wrong answers scored "
            f"{second['scores']['candidate']:.3f} against the served {second['scores']['served']:.3f} and was kept "
            f"out: {second['reason']}; a second replica's loader serves the same version. Phases: {phases.summary()}")


def score_problems(results: dict[str, Any], expected: dict[str, Any], who: str) -> list[str]:
    """lm-eval's figures in results.json against transformers + peft's: the base's and the candidate's (`who`:
    the transformers figures of the weights the candidate has), both metrics."""
    problems = []
    for mine, theirs in (("base", "base"), ("candidate", who)):
        ll, em = results["byMetric"]["loglikelihood"][mine], results["byMetric"]["exact_match"][mine]
        want = expected[theirs]
        if abs(ll - want["loglikelihood"]) > LIKELIHOOD_TOLERANCE or abs(em - want["exact_match"]) > 1e-9:
            problems.append(f"{mine}: lm-eval's loglikelihood {ll}, exact_match {em} != transformers' "
                            f"{want['loglikelihood']}, {want['exact_match']}")
    return problems


# --- main ---------------------------------------------------------------------------------------------

def host_names(workers: int) -> list[tuple[str, tuple[str, ...]]]:
    """Each host answers to the names every launch path gives it: the chart's pods and headless
    service, the MPIJob's pods and service, Vertex AI's worker pools."""
    names: list[tuple[str, tuple[str, ...]]] = [(f"{CHART_CLIENT}-0", (f"{MPIJOB}-launcher", "workerpool0-0"))]
    for i in range(workers):
        names.append((f"{CHART_WORKER}-{i}", (
            f"{CHART_WORKER}-{i}.{CHART_WORKER}-headless", f"{MPIJOB}-worker-{i}",
            f"{MPIJOB}-worker-{i}.{MPIJOB}.{MPIJOB_NAMESPACE}.svc", f"workerpool1-{i}")))
    return names


SCENARIOS: dict[str, Callable[[nshosts.Cluster, Path], str]] = {
    "mpijob": scenario_mpijob,
    "vertex": scenario_vertex,
    "recovery": scenario_recovery,
    "finetune": scenario_finetune,
    "adapters": scenario_adapters,
}
DEFAULT_SCENARIOS = ("mpijob", "vertex", "recovery", "finetune", "adapters")
# Two clusters of hosts run side by side, each its scenarios in this order: a scenario keeps a core busy for about
# 70 % of its time (process start-ups, one rank a host), so two at once fill the machine's cores. Split so that
# each side's CPU seconds are about equal (docs/measurements.md); the tiny Llama is made by whichever side needs
# it first (finetune_assets).
STREAMS = (("recovery", "finetune"), ("mpijob", "vertex", "adapters"))


def streams_of(scenarios: Sequence[str]) -> list[list[str]]:
    """The requested scenarios split over the two clusters, each side in the order asked."""
    side = {name: i for i, stream in enumerate(STREAMS) for name in stream}
    split: list[list[str]] = [[] for _ in STREAMS]
    for name in scenarios:
        split[side.get(name, 0)].append(name)
    return [names for names in split if names]


def run_stream(cluster: nshosts.Cluster, names: Sequence[str], outcomes: list[Outcome], work: Path,
               logs: Path) -> None:
    for name in names:
        cluster.fresh_homes()
        timed(name, outcomes, work, lambda name=name: SCENARIOS[name](cluster, logs))
        cluster.stop_services()


def run_streams(work: Path, logs: Path, streams: Sequence[Sequence[str]], outcomes: list[Outcome]) -> None:
    """Each stream on its own cluster (own namespaces, bridge and hosts) in a thread; the clusters are torn down
    here, in the main thread, also when a signal or Ctrl-C ends the wait."""
    with contextlib.ExitStack() as stack:
        threads = []
        for index, names in enumerate(streams):
            cluster = stack.enter_context(nshosts.Cluster(work / f"cluster-{index}", host_names(WORKERS),
                                                          prefix=f"dse2e{os.getpid() % 100000}{'ab'[index]}"))
            thread = threading.Thread(target=run_stream, args=(cluster, names, outcomes, work, logs),
                                      name=f"e2e-{index}", daemon=True)
            thread.start()
            threads.append(thread)
        for thread in threads:
            while thread.is_alive():
                thread.join(timeout=0.5)  # short waits: SIGTERM's handler runs in this thread between them


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", default=list(DEFAULT_SCENARIOS),
                        help=f"default: {' '.join(DEFAULT_SCENARIOS)}; known: {' '.join(SCENARIOS)}")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs) after a success")
    parser.add_argument("--one-cluster", action="store_true", help="every scenario on one cluster, one at a time")
    parser.add_argument("--preflight", action="store_true",
                        help="only say whether network-namespace hosts can run here (exit 0) or why not (exit 3)")
    args = parser.parse_args(argv)
    if args.preflight:
        why = nshosts.preflight()
        print(f"[e2e] SKIPPED: {why}" if why else "[e2e] network namespaces: ok", flush=True)
        return 3 if why else 0
    unknown = [s for s in args.scenarios if s not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; known: {list(SCENARIOS)}")
    reason = nshosts.preflight()
    if reason is None and not (VENV / "bin" / "deepspeed").exists():
        reason = f"{VENV} has no DeepSpeed: run e2e/install.sh first (make e2e does)"
    if reason:
        print(f"[e2e] SKIPPED: {reason}", flush=True)
        return 0

    # SIGTERM (a CI timeout) ends the run like Ctrl-C does: through the teardown below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="ds-e2e-", dir="/var/tmp"))
    os.chmod(work, 0o755)  # the clusters' folders below it are the hosts' (UID 1001 reads and writes there)
    logs = work / "logs"
    logs.mkdir()
    global RUN_CACHE
    RUN_CACHE = work / "cache"
    outcomes: list[Outcome] = []
    started = time.monotonic()
    try:
        run_streams(work, logs, [list(args.scenarios)] if args.one_cluster else streams_of(args.scenarios),
                    outcomes)
    finally:
        total = time.monotonic() - started
        print("\n[e2e] summary (two clusters side by side: a scenario's seconds overlap the other side's)")
        print(f"{'scenario':<10} {'result':<7} {'seconds':>8}  detail")
        for item in outcomes:
            print(f"{item.scenario:<10} {'ok' if item.ok else 'FAILED':<7} {item.seconds:>8.1f}  {item.detail}")
        print(f"total {total:.1f} s; work folder {work}")
    failed = [o.scenario for o in outcomes if not o.ok]
    if not failed and not args.keep:
        subprocess.run(["rm", "-rf", str(work)], check=False)
    return 1 if failed or len(outcomes) < len(args.scenarios) else 0

if __name__ == "__main__":
    sys.exit(main())
