"""Pre-deploy checks across workloads (names, namespaces, GPU pools, the generated ds_config.json, the cluster
target, the MPI operator and NFS provisioner), one function per rule. Each kind's own rules live in its module
(workloads/kinds/); checks/__init__.py runs them through the registry."""

from __future__ import annotations

from checks.common import Check, at
from model import catalog as gpu_catalog
from model.config_schema import workload_default
from model.pair_rules import PairRule, pair_problems
from model.problems import Problem
from model.types import DeepSpeedWorkloadConfig, NodePoolConfig, StackConfig, WorkloadConfig, snake
from model.validators import (
    DNS1123_LABEL,
    DNS1123_MAX,
    DNS1123_SUBDOMAIN,
    DNS1123_SUBDOMAIN_MAX,
    RESERVED_NAMESPACES,
    bucket_path_problem,
)
from workloads.ds_config import batch_problems, nvme_offload_path
from workloads.kinds import kind_of
from workloads.placement import placement
from workloads.target import needs_kubernetes

PINNED_OPERATOR = "v0.8.0"  # workloads/mpi_operator.py applies this release's manifest


def _trainers(m: StackConfig) -> list[tuple[str, DeepSpeedWorkloadConfig]]:
    """The workloads that train with DeepSpeed (a generated ds_config.json)."""
    return [(name, w) for name, w in m.workloads.items() if isinstance(w, DeepSpeedWorkloadConfig)]


def _pool_facts(m: StackConfig, w: WorkloadConfig) -> NodePoolConfig | None:
    """The workload's GKE pool when its GPU facts can be trusted: an NVIDIA workload on an existing pool whose
    GPU, machine type and count the catalog knows. A broken pool has its own problem; rules derived from it
    would only add noise."""
    pool = m.pool(w.pool or "") if w.on_nvidia else None
    if pool is None or gpu_catalog.load().shape(pool.gpu.type, pool.machine_type, pool.gpu.count) is None:
        return None
    return pool


def check_workload_names(m: StackConfig) -> list[Problem]:
    """Workload names become Kubernetes object names (and e.g. Helm release names: a kind may allow fewer
    characters)."""
    problems = []
    for name, w in m.workloads.items():
        limit = min(DNS1123_MAX, kind_of(w).max_name)
        if not DNS1123_LABEL.match(name) or len(name) > limit:
            problems.append(Problem(at('workloads', name), f"{name!r} is not a valid workload name (a DNS-1123 label: "
                            f"lowercase letters, digits and hyphens, starting and ending with a letter or digit, "
                            f"at most {limit} characters)"))
    return problems


def check_workload_namespaces(m: StackConfig) -> list[Problem]:
    """Every workload creates (and on removal deletes) its own namespace, so no two may share one."""
    problems, seen = [], {}
    for name, w in m.workloads.items():
        key = at("workloads", name, "namespace")
        if not DNS1123_LABEL.match(w.namespace) or len(w.namespace) > DNS1123_MAX:
            problems.append(Problem(key, f"{w.namespace!r} is not a valid namespace (a DNS-1123 label)"))
        elif w.namespace in RESERVED_NAMESPACES:
            problems.append(Problem(key, f"{w.namespace!r} is a namespace every cluster has, and the stack puts the "
                            "workload's NetworkPolicies (and, on GKE, deletes the namespace with the workload) in it; "
                            "choose one of its own (e.g. the workload's name)"))
        if w.namespace in seen:
            problems.append(Problem(key, f"{w.namespace!r} is also the namespace of {seen[w.namespace]}; each workload "
                            "creates and deletes its own namespace, so give it one of its own"))
        seen.setdefault(w.namespace, name)
    return problems


def check_gpu_pool_placement(m: StackConfig) -> list[Problem]:
    """An NVIDIA workload (helm, or an nvidia MPIJob) runs on an existing pool of the stack's GKE cluster, with
    at most the pool's GPUs per worker and enough nodes for its pods."""
    problems, pools = [], [p.name for p in m.node_pools]
    for name, w in m.workloads.items():
        if not w.on_nvidia:
            continue
        if m.cluster is None:
            problems.append(Problem(at('workloads', name, 'accelerator', 'kind'), "NVIDIA workloads run on a GPU pool "
                            "of this stack's GKE cluster; set `cluster` and `nodePools`, or run an MPIJob with "
                            "accelerator.kind gaudi on an existing cluster"))
        pool = m.pool(w.pool) if w.pool is not None else None
        needed, who = w.nodes_needed()
        if w.pool is None:
            problems.append(Problem(at('workloads', name, 'pool'), f"required for an NVIDIA workload; name a nodePools "
                            f"entry ({', '.join(pools) or 'none defined'})"))
        elif pool is None:
            problems.append(Problem(at('workloads', name, 'pool'), f"no nodePools entry is named {w.pool!r} "
                            f"(known: {', '.join(pools) or 'none'})"))
        elif w.accelerator.count is not None and w.accelerator.count > pool.gpu.count:
            problems.append(Problem(at('workloads', name, 'accelerator', 'count'), f"{w.accelerator.count} GPUs per "
                            f"worker, but nodes of pool {pool.name} have {pool.gpu.count}"))
        elif needed > pool.max_nodes:
            problems.append(Problem(at('workloads', name, 'workers'), f"{who} need {needed} nodes of pool {pool.name}, "
                            f"but {at('nodePools', m.node_pools.index(pool), 'maxNodes')} is {pool.max_nodes}; "
                            "raise maxNodes or lower workers"))
    return problems


def check_bucket_paths(m: StackConfig) -> list[Problem]:
    """Every path a workload reads from the stack's bucket stays in it: the pods see the bucket as a folder under
    `gcsFuse.mountPath`, so `../x` names a file of the pod's own file system, which the launcher would wait hours
    for (workloads/mpijob/nvidia.py's wait for the inputs) and nobody can upload."""
    problems = []
    for name, w in m.workloads.items():
        for key, path in w.bucket_paths():
            problem = bucket_path_problem(path)
            if problem is not None:
                problems.append(Problem(at('workloads', name, *key),
                                        f"the bucket path {path!r} {problem} (the pods see "
                                        f"the bucket at {w.gcs_fuse.mount_path}, and nothing outside it is uploaded)"))
    return problems


def check_batch_size(m: StackConfig) -> list[Problem]:
    """DeepSpeed's train_batch_size must equal workers x accelerators per worker x micro batch x accumulation."""
    problems = []
    for name, w in _trainers(m):
        where = placement(m, w)
        if where is not None and (w.on_gaudi or _pool_facts(m, w) is not None):
            problems += batch_problems(at("workloads", name), w.deepspeed, w.workers, where.per_worker)
    return problems


def check_zero_offload(m: StackConfig) -> list[Problem]:
    """Offloading needs ZeRO: optimizer states from stage 1, parameters only at stage 3."""
    problems = []
    for name, w in _trainers(m):
        ds = w.deepspeed
        if ds.offload_params != "none" and ds.zero_stage != 3:
            problems.append(Problem(at('workloads', name, 'deepspeed', 'offloadParams'), f"{ds.offload_params} offload "
                            f"of parameters needs zeroStage 3, got zeroStage {ds.zero_stage}"))
        if ds.offload_optimizer != "none" and ds.zero_stage < 1:
            problems.append(Problem(at('workloads', name, 'deepspeed', 'offloadOptimizer'), f"{ds.offload_optimizer} "
                            f"offload of optimizer states needs zeroStage 1 or higher, got zeroStage {ds.zero_stage}"))
    return problems


def check_nvme_offload_has_local_ssd(m: StackConfig) -> list[Problem]:
    """nvme offload writes to an emptyDir: on a pool without local SSDs that is the network boot disk."""
    problems = []
    for name, w in _trainers(m):
        pool = _pool_facts(m, w)
        if pool is None or nvme_offload_path(w.deepspeed) is None or pool.local_ssd_count:
            continue
        problems.append(Problem(at('workloads', name, 'deepspeed'), f"offloading to nvme needs local SSDs on pool "
                        f"{pool.name}; set {at('nodePools', m.node_pools.index(pool), 'localSsdCount')} to 1 "
                        "or more, or offload to cpu"))
    return problems


def check_bf16_support(m: StackConfig) -> list[Problem]:
    """bf16 needs Ampere or newer; T4, P100 and V100 would fail at the first step."""
    problems, gpus = [], gpu_catalog.load().gpus
    for name, w in _trainers(m):  # a server trains nothing (its own rules: workloads/kinds/serve.py)
        pool = _pool_facts(m, w)
        gpu = gpus.get(pool.gpu.type) if pool else None
        if gpu is not None and w.deepspeed.precision == "bf16" and not gpu.bf16:
            problems.append(Problem(at('workloads', name, 'deepspeed', 'precision'), f"{gpu.display_name} "
                            f"({gpu.name}) of pool {pool.name} has no bf16 support; use fp16"))
    return problems


def check_launch_args_with_command(m: StackConfig) -> list[Problem]:
    """`launch.command` replaces the command line `launch.args` would be appended to (the chart's client command,
    the MPIJob launcher's DeepSpeed line, a Gaudi job's run): the arguments would be silently dropped."""
    return [Problem(at('workloads', name, 'launch', 'args'), f"not used: {at('workloads', name, 'launch', 'command')} "
            "replaces the command line they are passed on; put them in the command") for name, w in _trainers(m)
            if w.launch.command and w.launch.args]


# --- keys the chosen mode ignores: warnings (each key's default cannot be told from unset, so only others warn) --


def _set(w: WorkloadConfig, *key: str) -> bool:
    """Whether the workload's key holds a value other than its kind's default (one the user set)."""
    value: object = w
    for part in key:
        value = getattr(value, snake(part))
    return value != workload_default(w.kind, *key)


def warn_nvme_path_unused(m: StackConfig) -> list[Problem]:
    return [Problem(at('workloads', name, 'deepspeed', 'nvmePath'),
                    "not used: neither offloadOptimizer nor offloadParams "
                    "is nvme") for name, w in _trainers(m)
            if nvme_offload_path(w.deepspeed) is None and _set(w, "deepspeed", "nvmePath")]


def warn_bucket_sizes_unused(m: StackConfig) -> list[Problem]:
    """ds_config.json has reduce_bucket_size from ZeRO stage 1 on and allgather_bucket_size at stages 1-2 only
    (workloads/ds_config.py, as DeepSpeed reads them)."""
    out = []
    for name, w in _trainers(m):
        stage = w.deepspeed.zero_stage
        if stage == 0 and _set(w, "deepspeed", "reduceBucketSize"):
            out.append(Problem(at('workloads', name, 'deepspeed', 'reduceBucketSize'), "not used at zeroStage 0"))
        if stage in (0, 3) and _set(w, "deepspeed", "allgatherBucketSize"):
            out.append(Problem(at('workloads', name, 'deepspeed', 'allgatherBucketSize'), f"not used at zeroStage "
                       f"{stage} (stages 1-2 only; stage 3 gathers by stage3_prefetch_bucket_size)"))
    return out


def warn_gcs_mount_path_unused(m: StackConfig) -> list[Problem]:
    return [Problem(at('workloads', name, 'gcsFuse', 'mountPath'),
                    f"not used: {at('workloads', name, 'gcsFuse', 'enabled')}"
                    " is false (the pods mount no bucket)") for name, w in m.workloads.items()
            if not w.gcs_fuse.enabled and _set(w, "gcsFuse", "mountPath")]


def warn_accelerator_type_on_nvidia(m: StackConfig) -> list[Problem]:
    return [Problem(at('workloads', name, 'accelerator', 'type'),
                    f"not used: {w.accelerator.type} is a Gaudi generation, "
            "and an NVIDIA workload's GPU is its pool's (nodePools[].gpu.type)") for name, w in m.workloads.items()
            if w.on_nvidia and _set(w, "accelerator", "type")]


def warnings(m: StackConfig) -> list[Problem]:
    return [*warn_nvme_path_unused(m), *warn_bucket_sizes_unused(m), *warn_gcs_mount_path_unused(m),
            *warn_accelerator_type_on_nvidia(m)]


# --- the cluster target, the MPI operator and the NFS provisioner ----------------------------------------


def _unused_with_cluster(key: str) -> PairRule:
    return PairRule(key, "unused, the stack deploys to its own GKE cluster (`cluster` is set); "
                    f"remove {key}, or remove `cluster` to deploy to an existing cluster", excludes=("/cluster",))


# With `cluster`, kubeconfig and kubernetes.context would be silently ignored, so they are errors.
OWN_CLUSTER = (_unused_with_cluster("kubeconfig"), _unused_with_cluster("kubernetes.context"))


def check_kubernetes_target(m: StackConfig) -> list[Problem]:
    """Without `cluster`, MPIJobs (and the operator/provisioner) go to an existing cluster: it must be named.
    With `cluster`, kubeconfig and kubernetes.context would be silently ignored, so they are errors."""
    if m.cluster is None:
        if needs_kubernetes(m) and m.kubeconfig is None and not m.kubernetes.context:
            return [Problem("kubeconfig",
                            "the stack has no `cluster`, so its MPIJobs go to an existing cluster; set its "
                            "credentials with `pulumi config set --secret kubeconfig \"$(cat ~/.kube/config)\"` and/or "
                            "kubernetes.context")]
        return []
    return pair_problems(m, "", OWN_CLUSTER)


def check_mpi_operator_install(m: StackConfig) -> list[Problem]:
    """The stack pins only the v0.8.0 release manifest; older versions are for clusters that already run them."""
    op = m.mpi_operator
    if op.install and op.version != PINNED_OPERATOR:
        return [Problem("mpiOperator.version", f"the stack installs {PINNED_OPERATOR} only, got {op.version}; "
                f"set {PINNED_OPERATOR}, or install: false when the cluster already runs {op.version}")]
    return []


def check_nfs_provisioner(m: StackConfig) -> list[Problem]:
    nfs, problems = m.nfs_provisioner, []
    if nfs.install and not nfs.server:
        problems.append(Problem("nfsProvisioner.server", "required when nfsProvisioner.install is true "
                        "(the NFS server's address, e.g. 10.0.0.5 or nfs.example.internal)"))
    if not DNS1123_SUBDOMAIN.match(nfs.storage_class) or len(nfs.storage_class) > DNS1123_SUBDOMAIN_MAX:
        problems.append(Problem("nfsProvisioner.storageClass",
                                f"{nfs.storage_class!r} is not a valid StorageClass name "
                                "(a DNS-1123 subdomain)"))
    if not nfs.path.startswith("/"):
        problems.append(Problem("nfsProvisioner.path", f"{nfs.path!r} must be an absolute path on the NFS server"))
    return problems


CHECKS: list[Check] = [
    check_workload_names,
    check_workload_namespaces,
    check_gpu_pool_placement,
    check_bucket_paths,
    check_batch_size,
    check_zero_offload,
    check_bf16_support,
    check_nvme_offload_has_local_ssd,
    check_launch_args_with_command,
    check_kubernetes_target,
    check_mpi_operator_install,
    check_nfs_provisioner,
]
