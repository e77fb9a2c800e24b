"""Kueue: the pinned release (its Helm chart, configured), a ResourceFlavor per GPU pool, one ClusterQueue, a
LocalQueue per workload namespace and, for DWS queued-provisioning pools, a ProvisioningRequest admission check.

Kueue admits a job only when all of its pods fit (gang admission); for a queued-provisioning pool it first
asks GKE for all the nodes at once through a ProvisioningRequest (`queued-provisioning.gke.io`).

Two resource groups, so the MPI launcher needs no GPU capacity:
- `nvidia.com/gpu`, one flavor per GPU pool a queued job may run on (node label `deepspeed-stack/pool`), in
  the order the jobs prefer them (`pool` before `fallbackPool`; else reservation -> DWS -> on-demand -> spot,
  data/capacity.yaml), quota = maxNodes x GPUs;
- `cpu` and `memory`, one label-less flavor sized to those pools' machines at maxNodes.
The launcher requests no GPU, so Kueue gives it no GPU flavor (no pool's node selector) and the
ProvisioningRequestConfig's `managedResources: [nvidia.com/gpu]` leaves its PodSet out of the request: GKE's
queued provisioning then sees the one PodSet it accepts, the workers, and the launcher runs on the system pool.

The install is Kueue's own Helm chart with the manager's Configuration rendered by the stack
(`manager_config`): only the MPIJob integration, webhooks scoped to the namespaces of queued jobs (labelled
`namespace_labels`), waitForPodsReady with a bounded requeue, and two replicas with a PodDisruptionBudget.

The objects are plain dicts from pure functions, validated in tests against Kueue's CRDs.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pulumi
import pulumi_kubernetes as k8s
import yaml

from model import capacity
from model import catalog as gpu_catalog
from model.types import KueueConfig, NodePoolConfig, StackConfig, WorkloadConfig
from workloads import reservation_end
from workloads.placement import NVIDIA_RESOURCE

POOL_LABEL = "deepspeed-stack/pool"  # the node label every GPU pool sets (components/gpu_node_pool.py)
CPU_FLAVOR = "cpu-memory"  # the label-less flavor of the cpu/memory group (launchers, the workers' CPU and memory)
DWS_CHECK = "dws-provisioning"  # the AdmissionCheck and its ProvisioningRequestConfig


def queue_name(cfg: StackConfig, w: WorkloadConfig) -> str | None:
    """The LocalQueue a workload waits in: every `mpijob` on a stack GPU pool when Kueue is installed. A job
    with a `fallbackPool` may use either pool's flavor: Kueue admits it to the first with free quota in the
    ClusterQueue's order (e.g. its reservation, then DWS)."""
    return cfg.kueue.queue_name if capacity.queued(cfg, w) else None


def flavor_name(pool: NodePoolConfig) -> str:
    return pool.name


def _meta(name: str, namespace: str | None = None) -> dict[str, Any]:
    meta = {"name": name, "labels": {"app.kubernetes.io/managed-by": "pulumi"}}
    return {**meta, "namespace": namespace} if namespace else meta


def _obj(kind: str, name: str, spec: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
    return {"apiVersion": capacity.load().kueue_api_version, "kind": kind, "metadata": _meta(name, namespace),
            "spec": spec}


def flavor_pools(cfg: StackConfig) -> list[NodePoolConfig]:
    """The GPU flavors' pools, in the ClusterQueue's order: only pools a queued job may run on (a flavor nobody
    queues on only inflates the quotas), each job's `pool` before its `fallbackPool`, else capacity order
    (reservation, DWS, on-demand, spot). Contradicting preferences are refused (checks/capacity.py)."""
    return capacity.queue_order(cfg) or []


def resource_flavor(pool: NodePoolConfig) -> dict[str, Any]:
    # Kueue adds nodeLabels to the admitted pods' nodeSelector: the workers land on this pool's nodes.
    return _obj("ResourceFlavor", flavor_name(pool), {"nodeLabels": {POOL_LABEL: pool.name}})


def cpu_flavor() -> dict[str, Any]:
    return _obj("ResourceFlavor", CPU_FLAVOR, {})


def _shape(pool: NodePoolConfig) -> gpu_catalog.Shape | None:
    return gpu_catalog.load().shape(pool.gpu.type, pool.machine_type, pool.gpu.count)


def cpu_memory_quota(pools: list[NodePoolConfig]) -> tuple[int, int]:
    """vCPUs and GB of every GPU pool's machines at maxNodes: what the workers can use at most."""
    shapes = [(p.max_nodes, _shape(p)) for p in pools]
    cpu = sum(n * s.vcpus for n, s in shapes if s)
    memory = sum(n * s.memory_gb for n, s in shapes if s)
    return int(cpu), int(memory)


def cluster_queue(name: str, pools: list[NodePoolConfig]) -> dict[str, Any]:
    """Kueue tries a resource group's flavors first to last: `pools` in that order (flavor_pools)."""
    ordered = pools
    cpu, memory = cpu_memory_quota(pools)
    spec: dict[str, Any] = {
        "namespaceSelector": {},  # LocalQueues decide which namespaces submit here
        "queueingStrategy": "BestEffortFIFO",  # a job that does not fit does not block smaller ones behind it
        "resourceGroups": [
            {"coveredResources": [NVIDIA_RESOURCE],
             "flavors": [{"name": flavor_name(p), "resources": [
                 {"name": NVIDIA_RESOURCE, "nominalQuota": p.max_nodes * p.gpu.count}]} for p in ordered]},
            {"coveredResources": ["cpu", "memory"],
             "flavors": [{"name": CPU_FLAVOR, "resources": [
                 {"name": "cpu", "nominalQuota": cpu}, {"name": "memory", "nominalQuota": f"{memory}G"}]}]},
        ],
    }
    if any(p.reservation_end_time is not None for p in ordered):
        # A job requeued after its reservation's nodes went away goes on to the next flavor rather than wait or
        # preempt for this one (data/capacity.yaml kueue.reservationEnd).
        spec["flavorFungibility"] = dict(capacity.load().reservation_end.flavor_fungibility)
    queued = [flavor_name(p) for p in ordered if p.queued_provisioning]
    if queued:
        # Only jobs admitted to a queued-provisioning pool wait for a ProvisioningRequest.
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": DWS_CHECK, "onFlavors": queued}]}
    return _obj("ClusterQueue", name, spec)


def local_queue(name: str, namespace: str) -> dict[str, Any]:
    return _obj("LocalQueue", name, {"clusterQueue": name}, namespace)


def admission_check() -> dict[str, Any]:
    return _obj("AdmissionCheck", DWS_CHECK, {
        "controllerName": capacity.load().provisioning_controller,
        "parameters": {"apiGroup": "kueue.x-k8s.io", "kind": "ProvisioningRequestConfig", "name": DWS_CHECK}})


def provisioning_request_config() -> dict[str, Any]:
    return _obj("ProvisioningRequestConfig", DWS_CHECK, {
        "provisioningClassName": capacity.load().provisioning_class,
        # Only PodSets that request GPUs go into the request: the workers, never the launcher (one PodSet).
        "managedResources": [NVIDIA_RESOURCE]})


def cluster_objects(config: KueueConfig, pools: list[NodePoolConfig]) -> list[dict[str, Any]]:
    """Every cluster-scoped object, flavors before the queue that names them; `pools` in flavor order."""
    objects = [*(resource_flavor(p) for p in pools), cpu_flavor()]
    if any(p.queued_provisioning for p in pools):
        objects += [provisioning_request_config(), admission_check()]
    return [*objects, cluster_queue(config.queue_name, pools)]


class KueueArgs(msgspec.Struct, frozen=True):
    config: KueueConfig
    pools: list[NodePoolConfig]  # the GPU flavors' pools in the ClusterQueue's order (flavor_pools)
    # A reservation's end (workloads/reservation_end.py): ending pool -> namespaces of the jobs that may use it,
    # and the stack's image the CronJob runs its program in (an Output in the program, a string in tests).
    end_namespaces: dict[str, list[str]] = msgspec.field(default_factory=dict)
    image: Any = None
    end_waits: dict[str, int] = msgspec.field(default_factory=dict)  # ending pool -> the program's --wait-seconds


def end_namespaces(cfg: StackConfig, pools: list[NodePoolConfig]) -> dict[str, list[str]]:
    return {p.name: reservation_end.namespaces(cfg, p) for p in reservation_end.ending(pools)}


def end_waits(cfg: StackConfig, pools: list[NodePoolConfig]) -> dict[str, int]:
    return {p.name: reservation_end.wait_seconds(cfg, p) for p in reservation_end.ending(pools)}


def manager_config() -> dict[str, Any]:
    """Kueue's Configuration (the chart's `managerConfig.controllerManagerConfigYaml`): the release's defaults,
    only the integrations the stack queues, the managed namespaces, and waitForPodsReady (data/capacity.yaml)."""
    install = capacity.load().kueue_install
    key, value = install.managed_namespace_label
    return {
        "apiVersion": install.config_api_version, "kind": "Configuration", **install.manager_defaults,
        # The chart copies this selector onto every job webhook: Kueue's webhooks see only these namespaces.
        "managedJobsNamespaceSelector": {"matchLabels": {key: value}},
        "waitForPodsReady": install.wait_for_pods_ready,
        "integrations": {"frameworks": list(install.integrations)},
    }


def namespace_labels(queue: str | None) -> dict[str, str]:
    """The label that puts a queued job's namespace under Kueue (its webhooks and managedJobsNamespaceSelector)."""
    key, value = capacity.load().kueue_install.managed_namespace_label
    return {key: value} if queue else {}


def chart_values(config: KueueConfig) -> dict[str, Any]:
    install = capacity.load().kueue_install
    return {
        "controllerManager": {
            # Every replica serves the webhooks and one leads: a rescheduled pod does not stop MPIJob creation,
            # and the budget keeps one up while GKE drains a system node.
            "replicas": install.replicas,
            "podDisruptionBudget": {"enabled": True, "minAvailable": install.min_available},
            "topologySpreadConstraints": [{
                "maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": install.release_name,
                                                  "control-plane": "controller-manager"}}}],
            "manager": {"image": {"repository": install.image, "tag": config.version,
                                  "pullPolicy": "IfNotPresent"}},
        },
        "managerConfig": {"controllerManagerConfigYaml": yaml.safe_dump(manager_config(), sort_keys=False)},
    }


class Kueue(pulumi.ComponentResource):
    """Created before the workloads: a queued MPIJob depends on `release` (Kueue's MPIJob webhooks fail closed, so
    the job is created once they answer); `queue_in` then adds each queued job's LocalQueue in its namespace."""

    def __init__(self, name: str, args: KueueArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepspeed-stack:workloads:Kueue", name, None, opts)
        self._name, self._queue = name, args.config.queue_name
        install = capacity.load().kueue_install
        # Provider-side: the Kubernetes provider pulls the pinned chart and installs it during `pulumi up`.
        self.release = k8s.helm.v3.Release(
            f"{name}-release",
            name=install.release_name,
            chart=install.chart_repository,
            version=args.config.version.lstrip("v"),
            namespace=install.namespace,
            create_namespace=True,
            values=chart_values(args.config),
            # A failed install is rolled back instead of leaving webhooks that nothing serves.
            atomic=True,
            opts=pulumi.ResourceOptions(parent=self),
        )
        # Kueue's webhooks validate these objects: they wait for the release (its CRDs and Deployment).
        after_install = pulumi.ResourceOptions(parent=self, depends_on=[self.release])
        self.objects: list[k8s.apiextensions.CustomResource] = []
        for obj in cluster_objects(args.config, args.pools):
            # A ClusterQueue names its flavors and admission check, an AdmissionCheck its config: created after
            # them, deleted before them (Kueue keeps an object in use from going).
            names_others = obj["kind"] in ("ClusterQueue", "AdmissionCheck")
            opts_ = pulumi.ResourceOptions.merge(after_install, pulumi.ResourceOptions(
                depends_on=[self.release, *self.objects])) if names_others else after_install
            self.objects.append(self._custom(f"{name}-{obj['kind'].lower()}-{obj['metadata']['name']}", obj, opts_))
        # At a reservation's end its flavor's quota goes to 0 and its jobs are requeued (after the ClusterQueue).
        after_queue = pulumi.ResourceOptions(parent=self, depends_on=[self.release, *self.objects])
        self.reservation_end = [self._plain(f"{name}-{o['kind'].lower()}-{o['metadata']['name']}", o, after_queue)
                                for o in reservation_end.objects(self._queue, args.pools, args.end_namespaces,
                                                                 args.image, args.end_waits)]
        self._end_namespaces = {n for where in args.end_namespaces.values() for n in where}
        self.local_queues: list[k8s.apiextensions.CustomResource] = []
        self.register_outputs({"version": args.config.version, "chart": install.chart_repository,
                               "clusterQueue": self._queue})

    def queue_in(self, namespace: str, namespace_output: pulumi.Input[str]) -> k8s.apiextensions.CustomResource:
        """The LocalQueue of a queued job's namespace: after its ClusterQueue (so after the release), and after the
        Namespace (`namespace_output`, its name as the Namespace's output)."""
        in_queue = pulumi.ResourceOptions(parent=self, depends_on=[self.objects[-1]])  # the ClusterQueue
        queue = self._custom(f"{self._name}-localqueue-{namespace}", local_queue(self._queue, namespace), in_queue,
                             namespace_output)
        self.local_queues.append(queue)
        if namespace in self._end_namespaces:  # the reservation-end CronJob may list and patch its Workloads
            in_namespace = pulumi.ResourceOptions(parent=self, depends_on=[queue])
            self.reservation_end += [self._plain(f"{self._name}-{o['kind'].lower()}-{namespace}", o, in_namespace,
                                                 namespace_output) for o in reservation_end.namespace_access(namespace)]
        return queue

    @staticmethod
    def _plain(logical: str, obj: dict[str, Any], opts: pulumi.ResourceOptions,
               namespace: pulumi.Input[str] | None = None) -> pulumi.CustomResource:
        """A built-in kind from its dict: the ServiceAccount, ConfigMap and RBAC through their typed classes (rules,
        data and subjects are no `spec`), the CronJob's spec as it is. `namespace`: the Namespace's output, so the
        object waits for it."""
        meta = obj["metadata"]
        metadata = k8s.meta.v1.ObjectMetaArgs(name=meta["name"], namespace=namespace or meta.get("namespace"),
                                              labels=meta["labels"], annotations=meta.get("annotations"))
        kind = obj["kind"]
        if kind == "ServiceAccount":
            return k8s.core.v1.ServiceAccount(logical, metadata=metadata, opts=opts)
        if kind == "ConfigMap":
            return k8s.core.v1.ConfigMap(logical, metadata=metadata, data=obj["data"], opts=opts)
        if kind in ("ClusterRole", "Role"):
            rules = [k8s.rbac.v1.PolicyRuleArgs(api_groups=r["apiGroups"], resources=r["resources"],
                                                resource_names=r.get("resourceNames"), verbs=r["verbs"])
                     for r in obj["rules"]]
            role = k8s.rbac.v1.ClusterRole if kind == "ClusterRole" else k8s.rbac.v1.Role
            return role(logical, metadata=metadata, rules=rules, opts=opts)
        if kind in ("ClusterRoleBinding", "RoleBinding"):
            ref = obj["roleRef"]
            binding = k8s.rbac.v1.ClusterRoleBinding if kind == "ClusterRoleBinding" else k8s.rbac.v1.RoleBinding
            return binding(
                logical, metadata=metadata, opts=opts,
                role_ref=k8s.rbac.v1.RoleRefArgs(api_group=ref["apiGroup"], kind=ref["kind"], name=ref["name"]),
                subjects=[k8s.rbac.v1.SubjectArgs(kind=x["kind"], name=x["name"], namespace=x["namespace"])
                          for x in obj["subjects"]])
        return k8s.apiextensions.CustomResource(logical, api_version=obj["apiVersion"], kind=kind,
                                                metadata=metadata, spec=obj.get("spec"), opts=opts)

    @staticmethod
    def _custom(logical: str, obj: dict[str, Any], opts: pulumi.ResourceOptions,
                namespace: pulumi.Input[str] | None = None) -> k8s.apiextensions.CustomResource:
        meta = obj["metadata"]
        return k8s.apiextensions.CustomResource(
            logical,
            api_version=obj["apiVersion"],
            kind=obj["kind"],
            metadata=k8s.meta.v1.ObjectMetaArgs(name=meta["name"], namespace=namespace, labels=meta["labels"]),
            spec=obj["spec"],
            # Fixed names: a replacement must delete the old object first.
            opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(delete_before_replace=True)),
        )


def job_labels(queue: str | None) -> dict[str, str]:
    """The label that puts a job in its namespace's LocalQueue (Kueue then suspends it until admitted)."""
    return {capacity.load().queue_label: queue} if queue else {}


def job_annotations(queue: str | None, pools: list[NodePoolConfig | None]) -> dict[str, str]:
    """On a queued-provisioning pool, the ProvisioningRequest asks for the nodes for the pool's maxRunDuration
    (Kueue passes `provreq.kueue.x-k8s.io/*` annotations on to the request)."""
    queued = [p for p in pools if p is not None and p.queued_provisioning and p.max_run_duration]
    if not queue or not queued:
        return {}
    return {"provreq.kueue.x-k8s.io/maxRunDurationSeconds": str(capacity.seconds(queued[0].max_run_duration))}


def owned_fields(queue: str | None) -> list[str] | None:
    """What Kueue changes on a queued job after Pulumi created it: it unsuspends the job on admission (and
    suspends it again on eviction). Pulumi leaves the field to Kueue, so an update of the job's metadata never
    re-suspends a running job, and Kueue's change is no diff that replaces it."""
    return ["spec.runPolicy.suspend"] if queue else None

