"""The pod side of a GPU fabric: what a training pod on an A3/A4 pool adds to reach the fabric's bandwidth.

A pure function of the pool's contract (data/gpu_fabric.yaml), applied by both workload kinds (the Helm
release and the MPIJob), so they cannot drift apart. From Google's pinned manifests (container-engine-
accelerators `*/nccl-test-latest.yaml`, `gpudirect-rdma/nccl-test.yaml`) and the TCPXO best practices:

- `networking.gke.io/default-interface` and `networking.gke.io/interfaces`: eth0 on the pod network, the
  fabric's NICs on their Networks (TCPX eth1-4, TCPXO eth1-8, RDMA eth2-9);
- TCPX/TCPXO: the RxDM daemon beside the training container, as a native sidecar (an init container with
  `restartPolicy: Always`, GKE >= 1.29) so a finished job is not kept alive by it, with its GPU devices
  injected by the NRI device injector (`devices.gke.io/container.<daemon>`) instead of running privileged;
- the host's NCCL plugin and driver libraries (and gIB for RDMA) as hostPath volumes, LD_LIBRARY_PATH;
- the NCCL environment, and the fabric's profile script (TCPXO `nccl-env-profile.sh`, gIB `set_nccl_env.sh`)
  sourced by every rank through `nccl_env.sh` (ranks start over ssh and see no pod environment);
- NCCL's INIT lines at INFO (after the profile, which may set WARN) and the network the fabric's plugin registers
  (FABRIC_NCCL_NETWORK), with `nccl_network.py` beside the job's script: the NCCL test and the smoke test read
  NCCL's "Using network" line and fail when NCCL fell back to TCP (issue 32.5);
- a memory-backed /dev/shm sized for 8 GPUs.

Security waivers (each from the pinned manifests): the daemon runs as Google's manifest runs it, as root with
NET_ADMIN (TCPXO also NET_BIND_SERVICE) to program flow steering on the GPU NICs, the runtime's other default
capabilities, a writable root filesystem and no requests, its image by tag pulled Always; its seccomp profile is the
pod's (RuntimeDefault). hostPath volumes for the libraries the installer DaemonSet puts on the node, and for /sys and
/proc/sys the daemon reads. The checkov checks the daemon fails for these are `daemon_waivers`, skipped on the pod
with their reasons. The TCPXO daemon gets the startup probe of Google's best practices. RDMA ranks stay at the
image's UID where Google's manifests run root: each rank raises its locked-memory limit and checks its verbs devices
first (`rank_preflight`; data/gpu_fabric.yaml `rankNeeds`).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

import msgspec

from model.fabric import Fabric, pool_fabric
from model.fabric import load as load_fabrics
from model.types import NodePoolConfig
from recipes import contract as recipe_contract
from workloads.placement import Placement

INTERFACES_ANNOTATION = "networking.gke.io/interfaces"
DEFAULT_INTERFACE_ANNOTATION = "networking.gke.io/default-interface"
DEVICES_ANNOTATION = "devices.gke.io/container.{name}"
LIBRARY_PATH = "/usr/local/nvidia/lib64"
ENV_SCRIPT = "nccl_env.sh"
# What reads NCCL's init lines in a rank (recipes/nccl_network.py), shipped beside the job's script, and the
# variables it reads (the same names as there: tests/test_fabric_in_use.py).
CHECK_SCRIPT = "nccl_network.py"
CHECK_SOURCE = recipe_contract.HERE / CHECK_SCRIPT
NETWORK_ENV = "FABRIC_NCCL_NETWORK"
FABRIC_ENV = "FABRIC_NAME"


class PodContract(msgspec.Struct, frozen=True):
    fabric: str
    annotations: dict[str, str]
    env: list[dict[str, Any]]  # the training container's (and the launcher's: DeepSpeed exports NCCL_* to ranks)
    volumes: list[dict[str, Any]]
    mounts: list[dict[str, Any]]  # the training container's
    sidecars: list[dict[str, Any]] = msgspec.field(default_factory=list)  # native sidecars: initContainers
    shm_size: str = ""  # the memory-backed /dev/shm for 8 GPUs; "" keeps the workload's own
    env_script: str = ""  # nccl_env.sh: every rank runs its command through it
    # checkov checks the sidecars fail as Google's manifests run them: check id -> why (pod_security.skip_annotations)
    waivers: dict[str, str] = msgspec.field(default_factory=dict)

    def env_dict(self) -> dict[str, str]:
        return {e["name"]: e["value"] for e in self.env}

    def files(self) -> dict[str, str]:
        """What a job's ConfigMap ships beside its script on a fabric pool: the env script every rank runs through,
        and the module that reads NCCL's init lines (the programs import it as recipes.nccl_network: with the
        package's recipes.py)."""
        return {ENV_SCRIPT: self.env_script, **recipe_contract.sources(CHECK_SCRIPT)}


def interfaces(f: Fabric) -> list[dict[str, str]]:
    return [{"interfaceName": "eth0", "network": "default"},
            *({"interfaceName": eth, "network": net} for eth, net in f.pod_interfaces.items())]


def annotations(f: Fabric) -> dict[str, str]:
    out = {DEFAULT_INTERFACE_ANNOTATION: "eth0", INTERFACES_ANNOTATION: json.dumps(interfaces(f))}
    if f.daemon:
        out[DEVICES_ANNOTATION.format(name=f.daemon.name)] = "".join(f"- path: {d}\n" for d in f.daemon.devices)
    return out


def log_environment() -> dict[str, str]:
    """NCCL_DEBUG=INFO with INIT: the lines that name the network NCCL chose (data/gpu_fabric.yaml ncclLog)."""
    return dict(load_fabrics().nccl_log_env)


def environment(f: Fabric) -> dict[str, str]:
    return {"LD_LIBRARY_PATH": LIBRARY_PATH, **f.nccl_env, **log_environment(),
            NETWORK_ENV: f.nccl_network, FABRIC_ENV: f.display_name}


def env_script(f: Fabric) -> str:
    """What each rank runs its command through: the contract's NCCL variables, then the fabric's profile
    (which may read them, e.g. NCCL_LIB_DIR), sourced on the rank's own node where the installer put it."""
    lines = ["#!/bin/bash",
             f"# deepspeed-stack: the {f.display_name} NCCL environment for this rank (data/gpu_fabric.yaml).",
             "set -e"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in environment(f).items()]
    lines += rank_preflight(f)
    if f.nccl_profile:
        profile = shlex.quote(f.nccl_profile)
        lines += [f"if [ ! -r {profile} ]; then",
                  f'  echo "{f.nccl_profile} is missing: is the {f.installer.daemon_set} DaemonSet running on '
                  '$(hostname)?" >&2',
                  "  exit 1",
                  "fi",
                  f". {profile}"]
        # After the profile: TCPXO's sets NCCL_DEBUG=WARN, which hides the lines that show the plugin in use.
        lines += [f"export {k}={shlex.quote(v)}" for k, v in log_environment().items()]
    lines.append('exec "$@"')
    return "\n".join(lines) + "\n"


def rank_preflight(f: Fabric) -> list[str]:
    """RDMA: what Google's manifests get from root, checked for the rank's own UID (data/gpu_fabric.yaml rankNeeds):
    the soft locked-memory limit raised to the hard one (a non-root process may; an added IPC_LOCK would never reach
    it) and logged when finite, and the verbs devices readable and writable, else the rank stops with the reason
    before NCCL fails at init with a less telling one."""
    if not f.rank_devices:
        return []
    devices = shlex.quote(f.rank_devices)
    where = 'for UID $(id -u) on $(hostname)'
    return [
        'ulimit -S -l "$(ulimit -H -l)" 2>/dev/null || true',
        'if [ "$(ulimit -l)" != unlimited ]; then',
        f'  echo "deepspeed-stack: locked memory is limited to $(ulimit -l) KiB {where}: RDMA memory registration '
        'may fail (ENOMEM) and NCCL fall back to TCP (README, GPU fabrics: waivers)" >&2',
        "fi",
        f"found=0; for dev in {devices}/uverbs*; do",
        '  [ -e "$dev" ] || continue',
        "  found=1",
        '  if [ ! -r "$dev" ] || [ ! -w "$dev" ]; then',
        f'    echo "deepspeed-stack: cannot open $dev read-write {where}: gIB needs the RDMA NICs\' verbs devices '
        '(README, GPU fabrics: waivers)" >&2',
        "    exit 1",
        "  fi",
        "done",
        'if [ "$found" = 0 ]; then',
        f'  echo "deepspeed-stack: no {f.rank_devices}/uverbs* in this pod on $(hostname): is it on an RDMA pool with '
        'its networking.gke.io/interfaces annotation?" >&2',
        "  exit 1",
        "fi",
    ]


def _startup_probe(d: Any) -> dict[str, Any]:
    return {"env": [{"name": "HEALTH_CHECK_LOG_FILE", "value": d.health_check_file}],
            "startupProbe": dict(d.startup_probe)} if d.health_check_file and d.startup_probe else {}


def _volumes(f: Fabric) -> list[dict[str, Any]]:
    return [{"name": v.name, "hostPath": {"path": v.host_path}} for v in f.host_volumes]


def _mounts(f: Fabric, daemon: bool) -> list[dict[str, Any]]:
    if daemon:
        return [{"name": v.name, "mountPath": v.daemon_mount_path or v.mount_path} for v in f.host_volumes if v.daemon]
    return [{"name": v.name, "mountPath": v.mount_path} for v in f.host_volumes if v.app]


def daemon_sidecar(f: Fabric) -> dict[str, Any] | None:
    """The RxDM daemon as a native sidecar; root with only the capabilities the pinned manifest adds."""
    if f.daemon is None:
        return None
    d = f.daemon
    probe = _startup_probe(d)  # TCPXO: Google's startup probe on the daemon's health-check file
    return {
        "name": d.name,
        "image": d.image,
        # By tag, as the pinned manifest names it (no digest in a pinned source): Always, as there, so that every node
        # runs what the tag is now, not what a node once pulled under it.
        "imagePullPolicy": "Always",
        "restartPolicy": "Always",
        "command": list(d.command),
        "env": [{"name": "LD_LIBRARY_PATH", "value": LIBRARY_PATH}, *probe.get("env", [])],
        **({"startupProbe": probe["startupProbe"]} if probe else {}),
        "securityContext": {"runAsUser": 0, "runAsNonRoot": False, "allowPrivilegeEscalation": False,
                            "capabilities": {"add": list(d.capabilities)}},
        "volumeMounts": _mounts(f, daemon=True),
    }


def daemon_waivers(f: Fabric) -> dict[str, str]:
    """The checkov checks the daemon fails as the pinned manifest runs it, each with its reason. A skip annotation
    covers every container of the pod: the training container's own values for these are asserted in tests."""
    if f.daemon is None:
        return {}
    d = f.daemon
    source = f"container-engine-accelerators {d.manifest}"
    resources = (f"{d.name} has no CPU or memory requests or limits, as in {source}: the training container's "
                 "requests take the node's allocatable (workloads/placement.py) and a native sidecar's requests add "
                 "to the pod's")
    capabilities = (f"{d.name} adds {' and '.join(d.capabilities)} to program flow steering on the GPU NICs and keeps "
                    f"the runtime's default capabilities, as in {source} (not verified with them dropped)")
    return {
        "CKV_K8S_10": resources, "CKV_K8S_11": resources, "CKV_K8S_12": resources, "CKV_K8S_13": resources,
        "CKV_K8S_22": f"{d.name}'s root filesystem is writable, as in {source}"
                      + (" (its command chmods its entrypoint script in the image)" if "chmod" in " ".join(d.command)
                         else ""),
        "CKV_K8S_25": capabilities, "CKV_K8S_28": capabilities, "CKV_K8S_37": capabilities,
        "CKV_K8S_40": f"{d.name} runs as root (runAsUser 0), as in {source}",
        "CKV_K8S_43": f"{d.name}'s image is pinned by tag, as {source} names it (no digest in a pinned source; "
                      "pulled Always, as there)",
    }


def contract(f: Fabric) -> PodContract:
    sidecar = daemon_sidecar(f)
    return PodContract(
        fabric=f.name,
        annotations=annotations(f),
        env=[{"name": k, "value": v} for k, v in environment(f).items()],
        volumes=_volumes(f),
        mounts=_mounts(f, daemon=False),
        sidecars=[sidecar] if sidecar else [],
        shm_size=f.shm_size,
        env_script=env_script(f),
        waivers=daemon_waivers(f),
    )


def pod_contract_for_pool(pool: NodePoolConfig) -> PodContract | None:
    f = pool_fabric(pool)
    return contract(f) if f else None


def pod_contract(where: Placement | None) -> PodContract | None:
    """The contract for a workload's pods, or None off a fabric pool (Gaudi, T4, L4, a pool with fabric off)."""
    if where is None or where.pool is None:
        return None
    return pod_contract_for_pool(where.pool)


# `deepspeed` starts each rank's command through the env script: --no_python (the command names its own
# interpreter) and --no_local_rank (LOCAL_RANK is in the environment; bash would take the flag as its own).
LAUNCH_FLAGS = ("--no_python", "--no_local_rank")


def rank_command(script_path: str) -> str:
    """Shell words before the training script: bash runs the env script, which execs the launcher's python
    (same image on every pod, so the same path; ranks started over ssh may not have it on their PATH)."""
    return f'/bin/bash {shlex.quote(script_path)} "$(command -v python)" -u'
