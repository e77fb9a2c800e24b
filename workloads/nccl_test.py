"""NcclTest: the first thing to run on a new GPU fabric pool. An Indexed Job with one pod per node (all its
GPUs), a headless Service that gives each pod a DNS name, and a ConfigMap with the benchmark; `torchrun`
starts one rank per GPU on every node and rank 0 prints the bus bandwidth of all_gather / all_reduce
(recipes/nccl_bench.py), to compare with Google's figures in the README.

Like Google's nccl-test manifests (container-engine-accelerators `*/nccl-test-latest.yaml`), each pod gets the
fabric's pod contract (workloads/fabric.py): its NICs, the RxDM daemon, the plugin libraries and the NCCL
environment. Unlike them it runs the stack's own image, so it measures the PyTorch NCCL the training uses,
and needs no ssh or MPI between pods. Read the result with `kubectl logs -n <namespace> job/<name>`.

Rendered as plain dicts by pure functions, validated with kubernetes-validate in tests.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

import msgspec
import pulumi
import pulumi_kubernetes as k8s

from model import serving_engines
from model.fabric import pass_line, pool_fabric
from model.types import NcclTestConfig, NodePoolConfig
from recipes import contract
from recipes.contract_programs import NCCL_BENCH
from workloads import fabric, pod_security
from workloads.placement import GKE_ACCELERATOR_LABEL, NVIDIA_RESOURCE, fitted_cpu_memory

SCRIPT = contract.HERE / "nccl_bench.py"
CONFIG_DIR = "/etc/nccl-test"
RUN_SCRIPT = "run.sh"
BENCH_SCRIPT = "nccl_bench.py"
SHM_VOLUME = "dshm"
CONFIG_VOLUME = "nccl-test"
MASTER_PORT = 29500
IMAGE_USER = pod_security.NVIDIA_USER  # the stack's image (workloads/images/deepspeed)
POOL_LABEL = "deepspeed-stack/pool"
PASS_LINE_ANNOTATION = "deepspeed-stack/pass-line"
ACTIVE_DEADLINE_SECONDS = 3600  # like Google's JobSet example: a stuck rendezvous does not hold 16 GPUs for ever
# An awaited test: `pulumi up` waits past the Job's own deadline (which counts from its start), so that it reports
# the Job's failure (DeadlineExceeded, or a failed rank) rather than a timeout of its own; pulumi-kubernetes' default
# (serving_engines.job_await_seconds, 10 minutes) would end the wait before nodes had scaled up and the test ran.
AWAIT_SECONDS = ACTIVE_DEADLINE_SECONDS + 600


class NcclTestInputs(msgspec.Struct, frozen=True):
    test: NcclTestConfig
    pools: list[NodePoolConfig]
    image: str
    nccl_version: str | None = None  # the NCCL the stack's image ships (data/versions.yaml); None for a prebuilt one
    # Something waits for the test to finish (workloads/first_up.py): `pulumi up` awaits the Job's completion.
    awaited: bool = False


def nccl_values(inputs: NcclTestInputs) -> dict[str, str | None]:
    """What nccl_bench.py checks the NCCL torch ran against: the image's own, and the fabric's minimum and the
    version Google qualifies its plugin with; and the bus bandwidth the machine type must reach (its pass line),
    with where that line comes from (data/gpu_fabric.yaml). The pools share one fabric (checks/fabric.py) and,
    mixed machine types aside, one line: the first pool's. By option name (NCCL_BENCH); None: not passed."""
    f = pool_fabric(inputs.pools[0])
    line = pass_line(inputs.pools[0])
    values = {"expect_nccl": inputs.nccl_version, "min_nccl": f.nccl_minimum if f else None,
              "qualified_nccl": f.nccl_qualified if f else None, "pass_line": line.flag() if line else None,
              "pass_line_note": line.note() if line else None}
    return {name: value or None for name, value in values.items()}  # an empty one is left out too


def labels(test: NcclTestConfig) -> dict[str, str]:
    return {"app.kubernetes.io/managed-by": "pulumi", "deepspeed-stack/nccl-test": test.name}


def run_script(test: NcclTestConfig, gpus: int, nccl: Mapping[str, str | None] | None = None) -> str:
    """torchrun on every node: rank 0's pod is the rendezvous (static: node rank = the Job's completion index)."""
    bench = [f"{CONFIG_DIR}/{BENCH_SCRIPT}", *NCCL_BENCH.argv({
        "benchmarks": ",".join(test.benchmarks), "min_bytes": test.min_bytes, "max_bytes": test.max_bytes,
        **(nccl or {})})]
    return "\n".join([
        "set -eo pipefail",
        f'exec python -u -m torch.distributed.run --nnodes="$NODES" --nproc-per-node={gpus} '
        '--node-rank="$JOB_COMPLETION_INDEX" --master-addr="$MASTER_ADDR" '
        f"--master-port={MASTER_PORT} " + " ".join(shlex.quote(p) for p in bench),
        "",
    ])


def config_map_data(inputs: NcclTestInputs) -> dict[str, str]:
    contract = fabric.pod_contract_for_pool(inputs.pools[0])
    data = {BENCH_SCRIPT: SCRIPT.read_text(encoding="utf-8"),
            RUN_SCRIPT: run_script(inputs.test, inputs.pools[0].gpu.count, nccl_values(inputs))}
    if contract is not None:
        data.update(contract.files())
    return data


def _resources(pool: NodePoolConfig) -> dict[str, str]:
    cpu, memory = fitted_cpu_memory([pool]) or ("8", "32Gi")
    return {NVIDIA_RESOURCE: str(pool.gpu.count), "cpu": cpu, "memory": memory}


def pod_spec(inputs: NcclTestInputs, service: str, job: str) -> dict[str, Any]:
    test, pool = inputs.test, inputs.pools[0]
    contract = fabric.pod_contract_for_pool(pool)
    limits = _resources(pool)
    command = ["/bin/bash", f"{CONFIG_DIR}/{RUN_SCRIPT}"]
    if contract is not None:
        command = ["/bin/bash", f"{CONFIG_DIR}/{fabric.ENV_SCRIPT}", *command]
    env = [{"name": "NODES", "value": str(test.nodes)},
           {"name": "MASTER_ADDR", "value": f"{job}-0.{service}"},
           *(contract.env if contract else [])]
    # A read-only root filesystem: torchrun's and torch's temporary files go to /tmp.
    tmp, tmp_mount = pod_security.tmp_volume()
    mounts = [{"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True},
              {"name": SHM_VOLUME, "mountPath": "/dev/shm"}, tmp_mount, *(contract.mounts if contract else [])]
    volumes = [{"name": CONFIG_VOLUME, "configMap": {"name": job}},
               {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory",
                                                 "sizeLimit": (contract.shm_size if contract else "") or "8Gi"}},
               tmp, *(contract.volumes if contract else [])]
    spec: dict[str, Any] = {
        "subdomain": service,  # <job>-<index>.<service>: the rendezvous address
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "securityContext": {"runAsUser": IMAGE_USER, "runAsGroup": IMAGE_USER, "runAsNonRoot": True,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": POOL_LABEL, "operator": "In", "values": [p.name for p in inputs.pools]},
                                  {"key": GKE_ACCELERATOR_LABEL, "operator": "In",
                                   "values": sorted({p.gpu.type for p in inputs.pools})}]}]}},
            # One pod per node: each takes all of its node's GPUs and NICs.
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                "labelSelector": {"matchLabels": labels(test)}, "topologyKey": "kubernetes.io/hostname"}]}},
        "tolerations": [{"key": NVIDIA_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [{
            "name": "nccl-test",
            "image": inputs.image,
            "imagePullPolicy": "IfNotPresent",
            "command": command,
            "env": env,
            "resources": {"requests": dict(limits), "limits": dict(limits)},
            "securityContext": pod_security.container_security_context(IMAGE_USER),
            "volumeMounts": mounts,
        }],
        "volumes": volumes,
    }
    if contract is not None and contract.sidecars:
        spec["initContainers"] = list(contract.sidecars)
    return spec


def await_annotations(awaited: bool) -> dict[str, str]:
    """pulumi-kubernetes' skipAwait on a test nothing waits for."""
    return {} if awaited else {serving_engines.skip_await_annotation(): "true"}


def pass_line_annotations(pool: NodePoolConfig) -> dict[str, str]:
    """What the test must reach, on the Job for `kubectl describe` and the preview's GPU fabric section."""
    line = pass_line(pool)
    return {PASS_LINE_ANNOTATION: line.summary()} if line else {}


def waiver_annotations(contract: fabric.PodContract | None) -> dict[str, str]:
    """checkov's skip annotations: the image's user, and the fabric daemon's waivers."""
    return pod_security.skip_annotations(pod_security.merge_waivers(
        pod_security.NVIDIA_IMAGE_UID_WAIVER, contract.waivers if contract else {}))


def job_manifest(inputs: NcclTestInputs, namespace: str, service: str) -> dict[str, Any]:
    test = inputs.test
    contract = fabric.pod_contract_for_pool(inputs.pools[0])
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        # `pulumi up` waits for the test to finish only where something runs after it (workloads/first_up.py);
        # else it leaves it running (nodes may first have to scale up): read its log.
        # The waivers on the Job (what a scan of the manifests reads) and on its pods (what a cluster's scan reads).
        "metadata": {"name": test.name, "namespace": namespace, "labels": labels(test),
                     "annotations": {**await_annotations(inputs.awaited), **waiver_annotations(contract),
                                     **pass_line_annotations(inputs.pools[0])}},
        "spec": {
            "completionMode": "Indexed",
            "completions": test.nodes,
            "parallelism": test.nodes,
            "backoffLimit": 0,  # a failed rank fails the test: its log says why
            "activeDeadlineSeconds": ACTIVE_DEADLINE_SECONDS,
            "template": {
                "metadata": {"labels": labels(test), "annotations": {
                    **(contract.annotations if contract else {}), **waiver_annotations(contract)}},
                "spec": pod_spec(inputs, service, test.name),
            },
        },
    }


def service_manifest(test: NcclTestConfig, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": test.name, "namespace": namespace, "labels": labels(test)},
        # DNS names before the pods are ready: rank 0 is the rendezvous from its first second.
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": labels(test)},
    }


def network_policy_spec(test: NcclTestConfig) -> dict[str, Any]:
    return {"podSelector": {"matchLabels": labels(test)}, "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": labels(test)}}]}]}


class NcclTest(pulumi.ComponentResource):
    """Pass the cluster's Kubernetes provider and `depends_on=[pools..., the fabric]` in `opts`."""

    def __init__(self, name: str, inputs: NcclTestInputs, image: pulumi.Input[str],
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepspeed-stack:workloads:NcclTest", name, None, opts)
        test = inputs.test
        child = pulumi.ResourceOptions(parent=self)
        meta = labels(test)
        ns = k8s.core.v1.Namespace(f"{name}-ns", metadata=k8s.meta.v1.ObjectMetaArgs(name=test.namespace,
                                                                                      labels=meta), opts=child)
        namespace = ns.metadata.name
        config = k8s.core.v1.ConfigMap(
            f"{name}-config", metadata=k8s.meta.v1.ObjectMetaArgs(name=test.name, namespace=namespace, labels=meta),
            data=config_map_data(inputs), opts=child)
        service = k8s.core.v1.Service(
            f"{name}-service", metadata=k8s.meta.v1.ObjectMetaArgs(name=test.name, namespace=namespace, labels=meta),
            spec=service_manifest(test, test.namespace)["spec"], opts=child)
        # Only the test's own pods reach its pods (rendezvous and NCCL bootstrap on eth0; the GPU NICs carry the
        # data and are outside Kubernetes network policy).
        k8s.networking.v1.NetworkPolicy(
            f"{name}-policy", metadata=k8s.meta.v1.ObjectMetaArgs(name=test.name, namespace=namespace, labels=meta),
            spec=network_policy_spec(test), opts=child)
        deps = opts.depends_on if opts and isinstance(opts.depends_on, list) else []
        job = pulumi.Output.all(image, namespace).apply(lambda v: job_manifest(
            NcclTestInputs(test, inputs.pools, v[0], inputs.nccl_version, inputs.awaited), v[1], test.name))
        awaits = f"{AWAIT_SECONDS}s"
        self.job = k8s.batch.v1.Job(
            f"{name}-job",
            metadata=job.apply(lambda j: j["metadata"]),
            spec=job.apply(lambda j: j["spec"]),
            # A Job's pod template cannot change in place: a changed test replaces the Job (a fixed name).
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=[*deps, config, service], delete_before_replace=True,
                replace_on_changes=["spec"],
                custom_timeouts=pulumi.CustomTimeouts(create=awaits, update=awaits) if inputs.awaited else None),
        )
        self.summary = pulumi.Output.from_input({
            "kind": "nccl-test", "namespace": namespace, "job": test.name, "pools": test.pools,
            "nodes": test.nodes, "benchmarks": test.benchmarks,
            "fabric": f.name if (f := pool_fabric(inputs.pools[0])) else None,
            "passLine": line.summary() if (line := pass_line(inputs.pools[0])) else None,
            "logs": f"kubectl logs -n {test.namespace} job/{test.name}",
        })
        self.register_outputs({"job": test.name, "namespace": namespace})
