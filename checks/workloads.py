"""Pre-deploy checks for workloads (Helm release, MPIJob, ds_config, cluster target), one function per rule."""

from __future__ import annotations

import re

from checks.common import PROJECT_DIR, Check, at, is_file
from model import catalog as gpu_catalog
from model.types import NodePoolConfig, StackConfig, WorkloadConfig
from workloads import mpijob
from workloads.ds_config import batch_problems, nvme_offload_path
from workloads.placement import placement
from workloads.target import needs_kubernetes

# --- Helm release (Bitnami DeepSpeed chart on a GKE pool) and the generated ds_config.json --------

# DNS-1123 label: what Kubernetes accepts for namespace, Service and pod-name parts.
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_MAX = 63
# Helm refuses longer release names (they end up in object names with suffixes such as "-worker-0").
HELM_RELEASE_MAX = 53
SCRIPTS_DIR = PROJECT_DIR / "workloads" / "scripts"
PINNED_OPERATOR = "v0.8.0"  # workloads/mpi_operator.py applies this release's manifest


def _helm(m: StackConfig) -> list[tuple[str, WorkloadConfig]]:
    return [(name, w) for name, w in m.workloads.items() if w.kind == "helm"]


def _pool_facts(m: StackConfig, w: WorkloadConfig) -> NodePoolConfig | None:
    """The workload's GKE pool when its GPU facts can be trusted: an NVIDIA workload on an existing pool whose
    GPU, machine type and count the catalog knows. A broken pool has its own problem; rules derived from it
    would only add noise."""
    pool = m.pool(w.pool or "") if w.accelerator.kind == "nvidia" else None
    if pool is None or gpu_catalog.load().shape(pool.gpu.type, pool.machine_type, pool.gpu.count) is None:
        return None
    return pool


def check_workload_names(m: StackConfig) -> list[str]:
    """Workload names become Kubernetes object names (and Helm release names for kind helm)."""
    problems = []
    for name, w in m.workloads.items():
        limit = HELM_RELEASE_MAX if w.kind == "helm" else DNS1123_MAX
        if not DNS1123_LABEL.match(name) or len(name) > limit:
            problems.append(f"{at('workloads', name)}: {name!r} is not a valid workload name (a DNS-1123 label: "
                            f"lowercase letters, digits and hyphens, starting and ending with a letter or digit, "
                            f"at most {limit} characters)")
    return problems


def check_workload_namespaces(m: StackConfig) -> list[str]:
    """Every workload creates (and on removal deletes) its own namespace, so no two may share one."""
    problems, seen = [], {}
    for name, w in m.workloads.items():
        key = at("workloads", name, "namespace")
        if not DNS1123_LABEL.match(w.namespace) or len(w.namespace) > DNS1123_MAX:
            problems.append(f"{key}: {w.namespace!r} is not a valid namespace (a DNS-1123 label)")
        if w.namespace in seen:
            problems.append(f"{key}: {w.namespace!r} is also the namespace of {seen[w.namespace]}; each workload "
                            "creates and deletes its own namespace, so give it one of its own")
        seen.setdefault(w.namespace, name)
    return problems


def _nodes_needed(w: WorkloadConfig) -> tuple[int, str]:
    """Each worker takes a node of its own (its CPU/memory are fitted to a whole node); so does the helm client."""
    if w.kind == "helm":
        return w.workers + 1, f"{w.workers} worker(s) + 1 client"
    return w.workers, f"{w.workers} worker(s)"


def check_gpu_pool_placement(m: StackConfig) -> list[str]:
    """An NVIDIA workload (helm, or an nvidia MPIJob) runs on an existing pool of the stack's GKE cluster, with
    at most the pool's GPUs per worker and enough nodes for its pods."""
    problems, pools = [], [p.name for p in m.node_pools]
    for name, w in m.workloads.items():
        if w.accelerator.kind != "nvidia":
            continue
        if m.cluster is None:
            problems.append(f"{at('workloads', name, 'accelerator', 'kind')}: NVIDIA workloads run on a GPU pool "
                            "of this stack's GKE cluster; set `cluster` and `nodePools`, or run an MPIJob with "
                            "accelerator.kind gaudi on an existing cluster")
        pool = m.pool(w.pool) if w.pool is not None else None
        needed, who = _nodes_needed(w)
        if w.pool is None:
            problems.append(f"{at('workloads', name, 'pool')}: required for an NVIDIA workload; name a nodePools "
                            f"entry ({', '.join(pools) or 'none defined'})")
        elif pool is None:
            problems.append(f"{at('workloads', name, 'pool')}: no nodePools entry is named {w.pool!r} "
                            f"(known: {', '.join(pools) or 'none'})")
        elif w.accelerator.count is not None and w.accelerator.count > pool.gpu.count:
            problems.append(f"{at('workloads', name, 'accelerator', 'count')}: {w.accelerator.count} GPUs per "
                            f"worker, but nodes of pool {pool.name} have {pool.gpu.count}")
        elif needed > pool.max_nodes:
            problems.append(f"{at('workloads', name, 'workers')}: {who} need {needed} nodes of pool {pool.name}, "
                            f"but {at('nodePools', m.node_pools.index(pool), 'maxNodes')} is {pool.max_nodes}; "
                            "raise maxNodes or lower workers")
    return problems


def check_helm_accelerator(m: StackConfig) -> list[str]:
    return [f"{at('workloads', name, 'accelerator', 'kind')}: kind helm runs on NVIDIA GKE pools only, got "
            f"{w.accelerator.kind}; use kind mpijob for Gaudi"
            for name, w in _helm(m) if w.accelerator.kind != "nvidia"]


def check_launch_script(m: StackConfig) -> list[str]:
    """Helm workloads and nvidia MPIJobs ship `launch.script` from workloads/scripts in a ConfigMap."""
    problems = []
    for name, w in m.workloads.items():
        ships_script = w.kind == "helm" or w.accelerator.kind == "nvidia"
        if not ships_script or w.launch.command:
            continue
        script = w.launch.script
        if "/" in script or not is_file(SCRIPTS_DIR / script):
            known = sorted(p.name for p in SCRIPTS_DIR.glob("*.py"))
            problems.append(f"{at('workloads', name, 'launch', 'script')}: no file {script!r} in workloads/scripts "
                            f"(there: {', '.join(known) or 'nothing'}); add it there or set launch.command")
    return problems


def check_batch_size(m: StackConfig) -> list[str]:
    """DeepSpeed's train_batch_size must equal workers x accelerators per worker x micro batch x accumulation."""
    problems = []
    for name, w in m.workloads.items():
        where = placement(m, w)
        if where is not None and (w.accelerator.kind == "gaudi" or _pool_facts(m, w) is not None):
            problems += batch_problems(at("workloads", name), w.deepspeed, w.workers, where.per_worker)
    return problems


def check_zero_offload(m: StackConfig) -> list[str]:
    """Offloading needs ZeRO: optimizer states from stage 1, parameters only at stage 3."""
    problems = []
    for name, w in m.workloads.items():
        ds = w.deepspeed
        if ds.offload_params != "none" and ds.zero_stage != 3:
            problems.append(f"{at('workloads', name, 'deepspeed', 'offloadParams')}: {ds.offload_params} offload "
                            f"of parameters needs zeroStage 3, got zeroStage {ds.zero_stage}")
        if ds.offload_optimizer != "none" and ds.zero_stage < 1:
            problems.append(f"{at('workloads', name, 'deepspeed', 'offloadOptimizer')}: {ds.offload_optimizer} "
                            f"offload of optimizer states needs zeroStage 1 or higher, got zeroStage {ds.zero_stage}")
    return problems


def check_nvme_offload_has_local_ssd(m: StackConfig) -> list[str]:
    """nvme offload writes to an emptyDir: on a pool without local SSDs that is the network boot disk."""
    problems = []
    for name, w in m.workloads.items():
        pool = _pool_facts(m, w)
        if pool is None or nvme_offload_path(w.deepspeed) is None or pool.local_ssd_count:
            continue
        problems.append(f"{at('workloads', name, 'deepspeed')}: offloading to nvme needs local SSDs on pool "
                        f"{pool.name}; set {at('nodePools', m.node_pools.index(pool), 'localSsdCount')} to 1 "
                        "or more, or offload to cpu")
    return problems


def check_bf16_support(m: StackConfig) -> list[str]:
    """bf16 needs Ampere or newer; T4, P100 and V100 would fail at the first step."""
    problems, gpus = [], gpu_catalog.load().gpus
    for name, w in m.workloads.items():
        pool = _pool_facts(m, w) if w.kind != "serve" else None  # a server trains nothing: checks/serving.py
        gpu = gpus.get(pool.gpu.type) if pool else None
        if gpu is not None and w.deepspeed.precision == "bf16" and not gpu.bf16:
            problems.append(f"{at('workloads', name, 'deepspeed', 'precision')}: {gpu.display_name} "
                            f"({gpu.name}) of pool {pool.name} has no bf16 support; use fp16")
    return problems


# --- MPIJob (Gaudi or NVIDIA), its cluster target, the shared claim and the NFS provisioner ---------

# DNS-1123 subdomain: what Kubernetes accepts for PersistentVolumeClaim and StorageClass names.
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1123_SUBDOMAIN_MAX = 253


def _mpijobs(m: StackConfig) -> list[tuple[str, WorkloadConfig]]:
    return [(name, w) for name, w in m.workloads.items() if w.kind == "mpijob"]


def check_kubernetes_target(m: StackConfig) -> list[str]:
    """Without `cluster`, MPIJobs (and the operator/provisioner) go to an existing cluster: it must be named.
    With `cluster`, kubeconfig and kubernetes.context would be silently ignored, so they are errors."""
    if m.cluster is None:
        if needs_kubernetes(m) and m.kubeconfig is None and not m.kubernetes.context:
            return ["kubeconfig: the stack has no `cluster`, so its MPIJobs go to an existing cluster; set its "
                    "credentials with `pulumi config set --secret kubeconfig \"$(cat ~/.kube/config)\"` and/or "
                    "kubernetes.context"]
        return []
    problems = []
    if m.kubeconfig is not None:
        problems.append("kubeconfig: unused, the stack deploys to its own GKE cluster (`cluster` is set); "
                        "remove kubeconfig, or remove `cluster` to deploy to an existing cluster")
    if m.kubernetes.context:
        problems.append("kubernetes.context: unused, the stack deploys to its own GKE cluster (`cluster` is set); "
                        "remove kubernetes.context, or remove `cluster` to deploy to an existing cluster")
    return problems


def _gaudi_placement(m: StackConfig, name: str, w: WorkloadConfig) -> list[str]:
    problems = []
    if w.pool is not None:
        problems.append(f"{at('workloads', name, 'pool')}: a Gaudi MPIJob runs on habana.ai/gaudi nodes of an "
                        "existing cluster, not on a GKE pool; remove pool")
    if m.cluster is not None:
        problems.append(f"{at('workloads', name, 'accelerator', 'kind')}: gaudi needs an existing Gaudi cluster "
                        "(GKE has no Gaudi nodes); remove `cluster` and set kubeconfig or kubernetes.context")
    return problems


def check_gaudi_placement(m: StackConfig) -> list[str]:
    """Gaudi MPIJobs run on an existing cluster, on no GKE pool (NVIDIA placement: check_gpu_pool_placement)."""
    return [p for name, w in _mpijobs(m) if w.accelerator.kind == "gaudi" for p in _gaudi_placement(m, name, w)]


def check_mpijob_names(m: StackConfig) -> list[str]:
    """The operator names pods (and their host names) `<job>-worker-<i>`: the last must be a DNS-1035 label."""
    problems = []
    for name, w in _mpijobs(m):
        host = mpijob.worker_pod_name(name, w.workers)
        if not mpijob.DNS1035_LABEL.match(host) or len(host) > mpijob.DNS_LABEL_MAX:
            problems.append(f"{at('workloads', name)}: the MPI operator would name the last worker {host!r}, "
                            f"which is not a DNS-1035 label (start with a letter; lowercase letters, digits, "
                            f"hyphens; at most {mpijob.DNS_LABEL_MAX} characters); shorten or rename the workload")
    return problems


def check_mpijob_storage(m: StackConfig) -> list[str]:
    """The shared claim: mountable by launcher and workers at once, a valid name, HF_HOME on it."""
    problems = []
    for name, w in _mpijobs(m):
        s = w.storage
        if s.access_mode == "ReadWriteOnce":
            problems.append(f"{at('workloads', name, 'storage', 'accessMode')}: ReadWriteOnce cannot be mounted by "
                            f"the launcher and {w.workers} worker(s) on different nodes at once; use ReadWriteMany "
                            "with an RWX storage class (nfs-client, Filestore)")
        for key, value in (("claimName", s.claim_name), ("storageClass", s.storage_class)):
            if not DNS1123_SUBDOMAIN.match(value) or len(value) > DNS1123_SUBDOMAIN_MAX:
                problems.append(f"{at('workloads', name, 'storage', key)}: {value!r} is not a valid Kubernetes name "
                                "(a DNS-1123 subdomain: lowercase letters, digits, '-' and '.')")
        mount = s.mount_path.rstrip("/") or "/"
        if not s.mount_path.startswith("/"):
            problems.append(f"{at('workloads', name, 'storage', 'mountPath')}: {s.mount_path!r} must be absolute")
        elif w.hf_home != mount and not w.hf_home.startswith(mount.rstrip("/") + "/"):
            problems.append(f"{at('workloads', name, 'hfHome')}: {w.hf_home} is not on the claim mounted at "
                            f"{s.mount_path}; every pod would download the model again")
    return problems


def check_training_args(m: StackConfig) -> list[str]:
    """Flags the stack sets from other keys may not be repeated: a second batch size or precision would
    disagree with ds_config.json, and the HF Trainer refuses to start on such a mismatch."""
    problems = []
    for name, w in _mpijobs(m):
        if w.accelerator.kind != "gaudi" or w.launch.command:
            continue
        for i, arg in enumerate(w.training.args):
            source = mpijob.reserved_flag(arg)
            if source:
                problems.append(f"{at('workloads', name, 'training', 'args', i)}: {arg.split('=', 1)[0]} is set "
                                f"by the stack from {at('workloads', name, *source)}; change it there instead")
    return problems


def check_mpi_operator_install(m: StackConfig) -> list[str]:
    """The stack pins only the v0.8.0 release manifest; older versions are for clusters that already run them."""
    op = m.mpi_operator
    if op.install and op.version != PINNED_OPERATOR:
        return [f"mpiOperator.version: the stack installs {PINNED_OPERATOR} only, got {op.version}; "
                f"set {PINNED_OPERATOR}, or install: false when the cluster already runs {op.version}"]
    return []


def check_nfs_provisioner(m: StackConfig) -> list[str]:
    nfs, problems = m.nfs_provisioner, []
    if nfs.install and not nfs.server:
        problems.append("nfsProvisioner.server: required when nfsProvisioner.install is true "
                        "(the NFS server's address, e.g. 10.0.0.5 or nfs.example.internal)")
    if not DNS1123_SUBDOMAIN.match(nfs.storage_class) or len(nfs.storage_class) > DNS1123_SUBDOMAIN_MAX:
        problems.append(f"nfsProvisioner.storageClass: {nfs.storage_class!r} is not a valid StorageClass name "
                        "(a DNS-1123 subdomain)")
    if not nfs.path.startswith("/"):
        problems.append(f"nfsProvisioner.path: {nfs.path!r} must be an absolute path on the NFS server")
    return problems


CHECKS: list[Check] = [
    check_workload_names,
    check_workload_namespaces,
    check_gpu_pool_placement,
    check_helm_accelerator,
    check_launch_script,
    check_batch_size,
    check_zero_offload,
    check_bf16_support,
    check_nvme_offload_has_local_ssd,
    check_kubernetes_target,
    check_gaudi_placement,
    check_mpijob_names,
    check_mpijob_storage,
    check_training_args,
    check_mpi_operator_install,
    check_nfs_provisioner,
]
