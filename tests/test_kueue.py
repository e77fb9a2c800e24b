"""Kueue: its objects validated against the v0.19.2 CRDs, the ClusterQueue's flavors and quotas, and a queued
MPIJob's label and suspension, as the dws stack registers them under mocks."""

from __future__ import annotations

import functools
import re
from typing import Any

import jsonschema
import pytest
import yaml
from conftest import model, reference, stack_run, stack_yaml

from model import capacity
from preview.engine import RunResult
from workloads import kueue, mpijob
from workloads.placement import placement

KUEUE = "kubernetes:kueue.x-k8s.io/v1beta2:"
MPIJOB = "kubernetes:kubeflow.org/v2beta1:MPIJob"
CRD_FILES = {"ResourceFlavor": "resourceflavors", "ClusterQueue": "clusterqueues", "LocalQueue": "localqueues",
             "AdmissionCheck": "admissionchecks", "ProvisioningRequestConfig": "provisioningrequestconfigs"}


@pytest.fixture(scope="module")
def dws() -> RunResult:
    return stack_run("dws")


@functools.cache
def crd_schema(kind: str) -> dict[str, Any]:
    path = reference("gke-gpu-fabric", "kueue-v0.19.2", "crd", f"kueue.x-k8s.io_{CRD_FILES[kind]}.yaml")
    with open(path, encoding="utf-8") as fh:
        crd = yaml.load(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1beta2"]
    assert served["served"] and served["storage"]  # v1beta2: Kueue 0.19's storage version (FACTS.md section 3)
    return python_patterns(served["schema"]["openAPIV3Schema"])


def python_patterns(node: Any) -> Any:
    """Go's RE2 takes `^(?i)...`; Python wants inline flags first: `(?i)^...` means the same."""
    if isinstance(node, dict):
        return {k: (v.replace("^(?i)", "(?i)^") if k == "pattern" and isinstance(v, str) else python_patterns(v))
                for k, v in node.items()}
    if isinstance(node, list):
        return [python_patterns(v) for v in node]
    return node


def crd_problems(obj: dict[str, Any]) -> list[str]:
    schema = crd_schema(obj["kind"])
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in jsonschema.Draft7Validator(schema).iter_errors(obj)]


def registered(run: RunResult, kind: str) -> list[dict[str, Any]]:
    """The Kueue objects of a kind as the program registered them (apiVersion, kind, metadata, spec)."""
    return [{"apiVersion": r.inputs["apiVersion"], "kind": r.inputs["kind"], "metadata": r.inputs["metadata"],
             "spec": r.inputs["spec"]} for r in run.by_type(KUEUE + kind)]


@pytest.mark.parametrize("kind", list(CRD_FILES))
def test_registered_objects_match_the_crds(dws: RunResult, kind: str) -> None:
    objects = registered(dws, kind)
    assert objects
    for obj in objects:
        assert obj["apiVersion"] == "kueue.x-k8s.io/v1beta2"
        assert crd_problems(obj) == []


def test_crd_validation_catches_a_bad_object() -> None:
    # The validator does refuse what the CRD refuses: an unknown queueing strategy, a bad merge policy.
    queue = kueue.cluster_queue("q", model("dws").node_pools)
    queue["spec"]["queueingStrategy"] = "FirstComeFirstServed"
    assert any("queueingStrategy" in p for p in crd_problems(queue))
    config = kueue.provisioning_request_config()
    config["spec"]["podSetMergePolicy"] = "Anything"
    assert any("podSetMergePolicy" in p for p in crd_problems(config))


def test_a_flavor_per_pool_a_queued_job_uses_none_other(dws: RunResult) -> None:
    flavors = {f["metadata"]["name"]: f["spec"] for f in registered(dws, "ResourceFlavor")}
    # pretrain (the one queued job) runs on h100-reserved or h100-dws; finetune (Helm, not queued) is not
    # Kueue's: its L4 pools get no flavor, so no quota nobody queues on.
    assert flavors == {name: {"nodeLabels": {"deepspeed-stack/pool": name}}
                       for name in ("h100-reserved", "h100-dws")} | {"cpu-memory": {}}
    (queue,) = registered(dws, "ClusterQueue")
    gpus, cpu_memory = queue["spec"]["resourceGroups"]
    assert gpus["coveredResources"] == ["nvidia.com/gpu"]
    # pretrain's order (pool h100-reserved, fallbackPool h100-dws); quota = maxNodes x GPUs per node
    # (Pulumi.dws.yaml: 2 and 4 nodes).
    assert gpus["flavors"] == [
        {"name": "h100-reserved", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 16}]},
        {"name": "h100-dws", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 32}]}]
    # a3-highgpu-8g: 208 vCPUs, 1872 GB (data/gpu_catalog.yaml); 6 nodes.
    assert cpu_memory == {"coveredResources": ["cpu", "memory"], "flavors": [{"name": "cpu-memory", "resources": [
        {"name": "cpu", "nominalQuota": 6 * 208}, {"name": "memory", "nominalQuota": f"{6 * 1872}G"}]}]}
    assert queue["metadata"]["name"] == "deepspeed"


H100 = {"machineType": "a3-highgpu-8g", "gpu": {"type": "nvidia-h100-80gb", "count": 8}, "maxNodes": 2}


def test_flavor_order_is_what_the_queued_jobs_prefer() -> None:
    pools = stack_yaml("dws")["deepspeed-stack:nodePools"]
    job = stack_yaml("dws")["deepspeed-stack:workloads"]["pretrain"]
    spot_first = {**job, "namespace": "spot", "pool": "h100-spot", "fallbackPool": "h100"}
    m = model("dws", {"nodePools": [*pools, {**H100, "name": "h100-spot", "spot": True}, {**H100, "name": "h100"}],
                      "workloads.spot": spot_first})
    # spot's job wants h100-spot before h100 (capacity order would put on-demand first); pretrain's two pools
    # keep their order; no job orders the two pairs against each other, so capacity order decides between them.
    assert [p.name for p in kueue.flavor_pools(m)] == ["h100-reserved", "h100-dws", "h100-spot", "h100"]
    (queue,) = [o for o in kueue.cluster_objects(m.kueue, kueue.flavor_pools(m)) if o["kind"] == "ClusterQueue"]
    assert [f["name"] for f in queue["spec"]["resourceGroups"][0]["flavors"]] == [
        "h100-reserved", "h100-dws", "h100-spot", "h100"]
    assert crd_problems(queue) == []


def test_contradicting_queued_preferences_are_refused() -> None:
    from conftest import problems

    job = stack_yaml("dws")["deepspeed-stack:workloads"]["pretrain"]
    found = problems("dws", {"workloads.other": {**job, "namespace": "other", "pool": "h100-dws",
                                                 "fallbackPool": "h100-reserved"}})
    assert "workloads.other.fallbackPool: Kueue tries the ClusterQueue's flavors in one order for every queued " \
           "job, and the jobs' preferences contradict each other (pretrain: h100-reserved before h100-dws; other: " \
           "h100-dws before h100-reserved); give them the same order" in found


def test_kueue_without_a_queued_job_is_refused() -> None:
    from conftest import DELETE, problems

    found = problems("dws", {"workloads.pretrain": DELETE, "nodePools[1].queuedProvisioning": False})
    assert "kueue.install: no workload waits in Kueue (it queues `mpijob` workloads on the stack's GPU pools), so " \
           "its ClusterQueue would have no GPU flavor; add such a workload or set kueue.install: false" in found


def test_dws_admission_check_only_on_the_queued_pool(dws: RunResult) -> None:
    (queue,) = registered(dws, "ClusterQueue")
    assert queue["spec"]["admissionChecksStrategy"] == {
        "admissionChecks": [{"name": "dws-provisioning", "onFlavors": ["h100-dws"]}]}
    (check,) = registered(dws, "AdmissionCheck")
    assert check["spec"] == {"controllerName": "kueue.x-k8s.io/provisioning-request", "parameters": {
        "apiGroup": "kueue.x-k8s.io", "kind": "ProvisioningRequestConfig", "name": "dws-provisioning"}}
    (config,) = registered(dws, "ProvisioningRequestConfig")
    # queued-provisioning.gke.io: GKE's class (CT dws example); only GPU PodSets go into the request.
    assert config["spec"] == {"provisioningClassName": "queued-provisioning.gke.io",
                              "managedResources": ["nvidia.com/gpu"]}


def test_no_admission_check_without_a_queued_pool() -> None:
    pools = [p for p in model("dws").node_pools if not p.queued_provisioning]
    objects = kueue.cluster_objects(model("dws").kueue, pools)
    assert [o["kind"] for o in objects] == ["ResourceFlavor"] * 4 + ["ClusterQueue"]
    assert "admissionChecksStrategy" not in objects[-1]["spec"]


def test_local_queue_in_the_jobs_namespace(dws: RunResult) -> None:
    (local,) = dws.by_type(KUEUE + "LocalQueue")
    assert local.inputs["metadata"]["namespace"] == "pretrain"
    assert local.inputs["metadata"]["name"] == "deepspeed"
    assert local.inputs["spec"] == {"clusterQueue": "deepspeed"}
    namespace = dws.one("kubernetes:core/v1:Namespace", "pretrain-namespace")
    assert namespace.urn in local.dependencies  # created once the namespace exists


def test_kueue_chart_pinned_and_after_the_mpi_operator(dws: RunResult) -> None:
    release = dws.one("kubernetes:helm.sh/v3:Release", "kueue-release")
    # Kueue's chart as its README installs it: oci://registry.k8s.io/kueue/charts/kueue, version 0.19.2,
    # namespace kueue-system (kubernetes-sigs/kueue v0.19.2 charts/kueue/README.md).
    assert (release.inputs["chart"], release.inputs["version"], release.inputs["namespace"]) == (
        "oci://registry.k8s.io/kueue/charts/kueue", "0.19.2", "kueue-system")
    assert release.inputs["name"] == "kueue" and release.inputs["createNamespace"] is True
    image = release.inputs["values"]["controllerManager"]["manager"]["image"]
    assert image == {"repository": "registry.k8s.io/kueue/kueue", "tag": "v0.19.2", "pullPolicy": "IfNotPresent"}
    component = dws.one("deepspeed-stack:workloads:Kueue", "kueue")
    operator = dws.one("deepspeed-stack:workloads:MpiOperator", "mpi-operator")
    # Depending on a component means depending on its children: the operator's manifest (the MPIJob CRD).
    assert {r.urn for r in dws.children(operator.urn)} <= set(component.dependencies)
    for reg in dws.by_type(KUEUE + "ResourceFlavor"):
        assert release.urn in reg.dependencies  # Kueue's CRDs and webhooks first


# --- The manager's Configuration and the webhooks (issue 19 items 7 and 8) -------------------------

def reference_yaml(*parts: str) -> list[dict[str, Any]]:
    with open(reference("gke-gpu-fabric", "kueue-v0.19.2", *parts), encoding="utf-8") as fh:
        return [d for d in yaml.safe_load_all(fh) if d]


def rendered_config(run: RunResult) -> dict[str, Any]:
    """The Configuration as the chart gets it (the string it writes into the kueue-manager-config ConfigMap)."""
    values = run.one("kubernetes:helm.sh/v3:Release", "kueue-release").inputs["values"]
    return yaml.safe_load(values["managerConfig"]["controllerManagerConfigYaml"])


def test_manager_config_is_the_releases_default_with_the_stacks_changes(dws: RunResult) -> None:
    (default,) = reference_yaml("config", "controller_manager_config.yaml")
    config = rendered_config(dws)
    changed = {"integrations", "managedJobsNamespaceSelector", "waitForPodsReady"}
    # Everything else is the release's default (kubernetes-sigs/kueue v0.19.2
    # config/components/manager/controller_manager_config.yaml): same API, leader election, ports, limits.
    assert {k: v for k, v in config.items() if k not in changed} == \
        {k: v for k, v in default.items() if k not in changed}
    assert config["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"


def test_only_the_mpijob_integration(dws: RunResult) -> None:
    (default,) = reference_yaml("config", "controller_manager_config.yaml")
    frameworks = rendered_config(dws)["integrations"]["frameworks"]
    # The stack queues MPIJobs only (kueue.queue_name); the default turns on 11 frameworks, among them pod,
    # deployment and statefulset, whose webhooks intercept every pod, Deployment and StatefulSet.
    assert {"pod", "deployment", "statefulset", "batch/job"} <= set(default["integrations"]["frameworks"])
    assert frameworks == ["kubeflow.org/mpijob"]
    assert set(frameworks) <= set(default["integrations"]["frameworks"])  # a name Kueue knows


# The Kueue v0.19.2 chart (charts/kueue/templates/webhook/manifests.yaml) sets every job webhook's
# namespaceSelector to the Configuration's managedJobsNamespaceSelector, and failurePolicy Ignore on the pod,
# deployment and statefulset webhooks when that integration is off. Kueue's own objects are not scoped.
KUEUE_GROUP = "kueue.x-k8s.io"
POD_BASED = {"pods": "pod", "deployments": "deployment", "statefulsets": "statefulset"}


def chart_webhooks(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The reference's webhooks as the chart renders them for this Configuration."""
    out = []
    for doc in reference_yaml("config", "webhook-manifests.yaml"):
        for hook in doc["webhooks"]:
            hook = dict(hook, kind=doc["kind"])
            groups = {g for rule in hook["rules"] for g in rule["apiGroups"]}
            if groups != {KUEUE_GROUP}:
                hook["namespaceSelector"] = config["managedJobsNamespaceSelector"]
            resources = {r for rule in hook["rules"] for r in rule["resources"]}
            pod_based = {POD_BASED[r] for r in resources & POD_BASED.keys()}
            if pod_based and not pod_based & set(config["integrations"]["frameworks"]):
                hook["failurePolicy"] = "Ignore"
            out.append(hook)
    return out


def selects(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    if selector is None:
        return True  # no namespaceSelector: every namespace
    assert set(selector) == {"matchLabels"}  # the only form the stack writes
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def failing_closed(hooks: list[dict[str, Any]], labels: dict[str, str], resource: str) -> list[str]:
    return [h["name"] for h in hooks if h["failurePolicy"] == "Fail" and selects(h.get("namespaceSelector"), labels)
            and any(resource in rule["resources"] for rule in h["rules"])]


def test_pod_creation_outside_queued_namespaces_never_waits_for_kueue(dws: RunResult) -> None:
    (default,) = reference_yaml("config", "controller_manager_config.yaml")
    elsewhere = {"kubernetes.io/metadata.name": "finetune"}  # the Helm workload's namespace: not queued
    # Today's defaults: the pod webhooks fail closed in every namespace (the kustomize component has no selector).
    assert failing_closed(chart_webhooks({**default, "managedJobsNamespaceSelector": None}), elsewhere, "pods") == [
        "mpod.kb.io", "vpod.kb.io"]
    hooks = chart_webhooks(rendered_config(dws))
    for resource in ("pods", "deployments", "statefulsets", "jobs", "mpijobs"):
        assert failing_closed(hooks, elsewhere, resource) == [], resource
        assert failing_closed(hooks, {"kubernetes.io/metadata.name": "kube-system"}, resource) == []
    # In the queued job's namespace, which the stack labels, Kueue's MPIJob webhooks still apply.
    namespace = dws.one("kubernetes:core/v1:Namespace", "pretrain-namespace").inputs["metadata"]["labels"]
    assert namespace["deepspeed-stack/kueue"] == "managed"
    assert failing_closed(hooks, namespace, "mpijobs") == ["mmpijob.kb.io", "vmpijob.kb.io"]
    assert failing_closed(hooks, namespace, "pods") == []
    unqueued = dws.one("kubernetes:core/v1:Namespace", "finetune-namespace") if any(
        r.name == "finetune-namespace" for r in dws.resources) else None
    assert unqueued is None or "deepspeed-stack/kueue" not in (unqueued.inputs["metadata"].get("labels") or {})


def test_controller_survives_a_rescheduled_pod(dws: RunResult) -> None:
    manager = reference_yaml("config", "manager.yaml")[1]
    assert manager["spec"]["replicas"] == 1  # the release's default: one pod serves every webhook
    values = dws.one("kubernetes:helm.sh/v3:Release", "kueue-release").inputs["values"]["controllerManager"]
    assert values["replicas"] == 2
    assert values["podDisruptionBudget"] == {"enabled": True, "minAvailable": 1}
    assert rendered_config(dws)["leaderElection"]["leaderElect"] is True  # one replica reconciles at a time
    (spread,) = values["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"


# WaitForPodsReady and RequeuingStrategy fields of config.kueue.x-k8s.io/v1beta2
# (kubernetes-sigs/kueue v0.19.2 apis/config/v1beta2/configuration_types.go); v1beta2 has no `enable`.
WAIT_FIELDS = {"timeout", "blockAdmission", "requeuingStrategy", "recoveryTimeout"}
REQUEUE_FIELDS = {"timestamp", "backoffLimitCount", "backoffBaseSeconds", "backoffMaxSeconds"}


def test_wait_for_pods_ready_evicts_and_requeues_a_job_that_does_not_start(dws: RunResult) -> None:
    wait = rendered_config(dws)["waitForPodsReady"]
    assert set(wait) <= WAIT_FIELDS and set(wait["requeuingStrategy"]) <= REQUEUE_FIELDS
    assert wait == {"timeout": "20m", "recoveryTimeout": "10m", "blockAdmission": False, "requeuingStrategy": {
        "timestamp": "Eviction", "backoffLimitCount": 5, "backoffBaseSeconds": 60, "backoffMaxSeconds": 1800}}
    # recoveryTimeout is a waitForPodsReady key of the release's own (commented) default config.
    with open(reference("gke-gpu-fabric", "kueue-v0.19.2", "config", "controller_manager_config.yaml"),
              encoding="utf-8") as fh:
        assert re.search(r"^#waitForPodsReady:\n(#  .*\n)*#  recoveryTimeout: \d+m$", fh.read(), flags=re.M)
    # A Go duration Kueue parses.
    assert re.fullmatch(r"(\d+h)?(\d+m)?(\d+s)?", wait["timeout"])
    # Kueue re-admits a requeued job to the first flavor with quota (kueue#2560, KEP 1282 story 2): the stack
    # does not claim a fall-through it does not get.
    assert capacity.load().kueue_install.falls_through_on_stockout is False


def test_queued_mpijob_is_labelled_and_suspended(dws: RunResult) -> None:
    job = dws.one(MPIJOB).inputs
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "deepspeed"
    assert job["spec"]["runPolicy"]["suspend"] is True
    assert job["metadata"]["annotations"] == {"provreq.kueue.x-k8s.io/maxRunDurationSeconds": "86400"}
    replicas = job["spec"]["mpiReplicaSpecs"]
    # Workers tolerate the queued-provisioning taint; the launcher asks for no GPU and no GPU node, so the
    # ProvisioningRequest gets one PodSet (the workers) and the launcher runs on the system pool.
    worker, launcher = replicas["Worker"]["template"]["spec"], replicas["Launcher"]["template"]["spec"]
    assert {"key": "cloud.google.com/gke-queued", "operator": "Exists", "effect": "NoSchedule"} in \
        worker["tolerations"]
    assert worker["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert "nvidia.com/gpu" not in str(launcher.get("containers", [{}])[0].get("resources", {}))
    assert "nodeSelector" not in launcher and "tolerations" not in launcher


def test_unqueued_mpijob_is_not_suspended() -> None:
    m = model("dws", {"kueue.install": False, "nodePools[1].queuedProvisioning": False})
    w = m.workloads["pretrain"]
    assert kueue.queue_name(m, w) is None
    job = mpijob.render(mpijob.MpiJobInputs(workload=w, placement=placement(m, w), image="img",
                                            config_map="cm"), w.namespace)
    assert "suspend" not in job["spec"]["runPolicy"]
    assert "kueue.x-k8s.io/queue-name" not in job["metadata"].get("labels", {})
    # A flex-start pool without queued provisioning carries no gke-queued taint to tolerate.
    assert all(t["key"] != capacity.load().queued_taint for t in placement(m, w).tolerations)


def test_flavor_limit_is_the_crds() -> None:
    from checks.capacity import KUEUE_MAX_FLAVORS

    groups = crd_schema("ClusterQueue")["properties"]["spec"]["properties"]["resourceGroups"]
    assert groups["items"]["properties"]["flavors"]["maxItems"] == KUEUE_MAX_FLAVORS


def test_kueue_owns_suspension_after_creation(dws: RunResult) -> None:
    # Kueue unsuspends the admitted job; Pulumi must not put `suspend: true` back or see a diff there.
    job = dws.one(MPIJOB)
    assert job.ignore_changes == ["spec.runPolicy.suspend"]
    assert kueue.owned_fields(None) is None
