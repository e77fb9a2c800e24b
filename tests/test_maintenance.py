"""Maintenance seen coming (workloads/maintenance.py, recipes/maintenance_watch.py): the launcher's watch
under a stub API server (no real one), the MPIJob's sidecar, token and affinity, the least access, and the preview's
warnings, each with an input that fails it."""

from __future__ import annotations

import copy
import functools
import sys
from typing import Any

import msgspec
import pytest
from conftest import PROJECT_DIR, load_file, model

from checks import capacity as capacity_checks
from model.problems import lines
from workloads import maintenance, mpijob, recovery
from workloads.placement import placement

SCRIPTS = PROJECT_DIR / "recipes"
LABEL = "cloud.google.com/scheduled-maintenance-time"  # GKE "Monitor maintenance events", restated
NOW = 1_800_000_000.0


@functools.cache
def program() -> Any:
    sys.path.insert(0, str(SCRIPTS))
    try:
        return load_file(SCRIPTS / "maintenance_watch.py", "maintenance_watch_under_test")
    finally:
        sys.path.remove(str(SCRIPTS))


class FakeApi:
    """Pods on nodes, nodes with labels; records every request, answers as the API server does (404 for none)."""

    def __init__(self, pods: dict[str, str], labels: dict[str, dict[str, str]], evict_status: int | None = None):
        self.pods, self.labels, self.evict_status, self.calls = pods, labels, evict_status, []

    def __call__(self, method: str, path: str, body: Any, content_type: str | None) -> Any:
        p = program()
        self.calls.append((method, path, copy.deepcopy(body)))
        parts = path.strip("/").split("/")
        if method == "POST":
            if self.evict_status:
                raise p.ApiError(self.evict_status, "Cannot evict pod as it would violate the pod's disruption budget")
            self.pods.pop(parts[5])
            return {}
        if parts[2] == "nodes":
            return {"metadata": {"name": parts[3], "labels": self.labels.get(parts[3], {})}}
        if parts[5] not in self.pods:
            raise p.ApiError(404, "not found")
        return {"metadata": {"name": parts[5]}, "spec": {"nodeName": self.pods[parts[5]]}}


def _watch(api: FakeApi, now: float = NOW, state: str = "", lead: float = 600) -> tuple[Any, list[str]]:
    p = program()
    args = p.parse_args(["--namespace", "pretrain", "--pods", "pretrain-worker-0,pretrain-worker-1",
                         "--lead-seconds", str(lead), "--state", state, "--once"])
    said: list[str] = []
    return p.Watcher(p.Api(api), args, now=lambda: now, say=said.append), said


def _evictions(api: FakeApi) -> list[tuple[str, Any]]:
    return [(path, body) for method, path, body in api.calls if method == "POST"]


def test_a_worker_is_evicted_before_its_nodes_maintenance() -> None:
    api = FakeApi({"pretrain-worker-0": "node-a", "pretrain-worker-1": "node-b"},
                  {"node-b": {LABEL: str(int(NOW + 500))}})  # in 500 s, within the 600 s lead
    watcher, said = _watch(api)
    assert watcher.round() == ["pretrain-worker-1"]
    assert _evictions(api) == [("/api/v1/namespaces/pretrain/pods/pretrain-worker-1/eviction", {
        "apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": "pretrain-worker-1", "namespace": "pretrain"}})]
    assert said[0].startswith("maintenance of node node-b in 500 s")
    # The node is acted on once: the worker made again there (no other node free) is left to run.
    api.pods["pretrain-worker-1"] = "node-b"
    assert watcher.round() == []


def test_a_maintenance_far_off_or_absent_waits() -> None:
    api = FakeApi({"pretrain-worker-0": "node-a", "pretrain-worker-1": "node-b"},
                  {"node-a": {LABEL: str(int(NOW + 601))}, "node-b": {"other": "1"}})
    watcher, said = _watch(api)
    assert watcher.round() == [] and _evictions(api) == [] and said == []
    later, _ = _watch(api, now=NOW + 2)  # now 599 s away
    assert later.round() == ["pretrain-worker-0"]


@pytest.mark.parametrize("value", ["", "soon", "1.8e9x"])
def test_a_label_that_is_not_seconds_is_ignored(value: str) -> None:
    api = FakeApi({"pretrain-worker-0": "node-a"}, {"node-a": {LABEL: value}})
    assert _watch(api)[0].round() == []


def test_a_missing_worker_and_a_budget_are_waited_out() -> None:
    api = FakeApi({"pretrain-worker-1": "node-b"}, {"node-b": {LABEL: str(int(NOW))}}, evict_status=429)
    watcher, said = _watch(api)
    assert watcher.round() == []  # worker-0 between its deletion and its new pod: 404, skipped
    assert said[-1].startswith("eviction of pretrain-worker-1: HTTP 429")
    api.evict_status = None
    assert watcher.round() == ["pretrain-worker-1"]  # the next round tries again


def test_the_nodes_acted_on_survive_a_restart(tmp_path: Any) -> None:
    state = tmp_path / "maintenance-nodes"
    api = FakeApi({"pretrain-worker-0": "node-a"}, {"node-a": {LABEL: str(int(NOW))}})
    assert _watch(api, state=str(state))[0].round() == ["pretrain-worker-0"]
    assert state.read_text() == "node-a\n"
    api.pods["pretrain-worker-0"] = "node-a"
    assert _watch(api, state=str(state))[0].round() == []  # a restarted sidecar remembers


# --- what the MPIJob carries ----------------------------------------------------------------------------------------

def _spec(stack: str, name: str, changes: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
    m = model(stack, changes)
    w = m.workloads[name]
    where = placement(m, w)
    inputs = mpijob.MpiJobInputs(workload=w, placement=where, image="registry.example/deepspeed@sha256:" + "0" * 64,
                                 config_map=mpijob.config_map_name(w.name))
    return w, mpijob.render_spec(inputs)


def test_the_launcher_watches_and_the_workers_prefer_nodes_without_maintenance() -> None:
    w, spec = _spec("dws", "pretrain")
    launcher = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    (watch,) = [c for c in launcher["initContainers"] if c["name"] == "maintenance-watch"]
    assert watch["restartPolicy"] == "Always"  # a native sidecar: the launcher's Job still completes
    grace = recovery.grace_seconds(w)
    assert watch["args"] == ["/etc/deepspeed/maintenance_watch.py", "--namespace", "pretrain",
                             "--pods", "pretrain-worker-0,pretrain-worker-1", "--lead-seconds", str(grace + 300),
                             "--poll-seconds", "60", "--state", "/run/deepspeed-stack/maintenance-nodes"]
    # Only the sidecar holds an API token: the pod's automount stays off.
    assert launcher["automountServiceAccountToken"] is False
    token = [m for m in watch["volumeMounts"] if m["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount"]
    assert token and not [m for c in launcher["containers"] for m in c["volumeMounts"] if m["name"] == token[0]["name"]]
    worker = spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    preferred = worker["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    absent = {"matchExpressions": [{"key": LABEL, "operator": "DoesNotExist"}]}
    assert {"weight": 100, "preference": absent} in preferred
    # The required either-pool term stays (Kueue picks the flavor).
    assert worker["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    files = mpijob.config_map_data(w, placement(model("dws"), w), False)
    assert {"maintenance_watch.py", "kube_api.py"} <= set(files)


def test_the_watch_objects_are_valid_kubernetes() -> None:
    import kubernetes_validate

    w, spec = _spec("dws", "pretrain")
    launcher = spec["mpiReplicaSpecs"]["Launcher"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pretrain-launcher", "namespace": "pretrain"},
           "spec": launcher["spec"]}
    kubernetes_validate.validate(pod, "1.33.0", strict=True)
    for obj in maintenance.access(w, "default"):
        kubernetes_validate.validate(obj, "1.33.0", strict=True)


def test_the_watch_is_granted_to_the_launchers_own_account_never_the_namespaces_default() -> None:
    """Without the bucket's account the launcher gets one of its own: a grant to `default` would reach every pod of
    the namespace (checkov CKV_K8S_42 failed on the dws and h100 stacks)."""
    from conftest import stack_run

    run = stack_run("dws")
    (account,) = [r for r in run.by_type("kubernetes:core/v1:ServiceAccount")
                  if r.inputs["metadata"]["name"] == "pretrain-launcher"]
    assert account.inputs["metadata"]["namespace"] == "pretrain"
    assert account.inputs["automountServiceAccountToken"] is False
    bindings = [r for r in run.resources if r.type.endswith(("/v1:RoleBinding", "/v1:ClusterRoleBinding"))
                and "maintenance" in r.inputs["metadata"]["name"]]
    assert len(bindings) == 2 and all(
        b.inputs["subjects"] == [{"kind": "ServiceAccount", "name": "pretrain-launcher", "namespace": "pretrain"}]
        for b in bindings)
    _, spec = _spec("dws", "pretrain")
    assert spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["serviceAccountName"] == "pretrain-launcher"
    assert "serviceAccountName" not in spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]


def test_the_watch_access_is_the_minimum() -> None:
    w = model("dws").workloads["pretrain"]
    rules = {(o["kind"], o["metadata"].get("namespace")): o.get("rules") for o in maintenance.access(w, "ksa")}
    workers = ["pretrain-worker-0", "pretrain-worker-1"]
    assert rules == {
        ("Role", "pretrain"): [
            {"apiGroups": [""], "resources": ["pods"], "resourceNames": workers, "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["pods/eviction"], "resourceNames": workers, "verbs": ["create"]}],
        ("RoleBinding", "pretrain"): None,
        ("ClusterRole", None): [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}],
        ("ClusterRoleBinding", None): None,
    }
    for b in maintenance.access(w, "ksa"):
        if "subjects" in b:
            assert b["subjects"] == [{"kind": "ServiceAccount", "name": "ksa", "namespace": "pretrain"}]


def test_a_job_with_its_own_image_is_not_watched_and_is_warned() -> None:
    changes = {"workloads.pretrain.image": "registry.example/mine@sha256:" + "1" * 64}
    _, spec = _spec("dws", "pretrain", changes)
    launcher = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    assert not [c for c in launcher.get("initContainers", []) if c["name"] == "maintenance-watch"]
    found = [w for w in lines(capacity_checks.warnings(model("dws", changes))) if "maintenance watch" in w]
    assert found == ["workloads.pretrain.image: the launcher's maintenance watch runs in the stack's image only; with "
                     "an image of your own this run is not saved ahead of its nodes' host maintenance (its workers "
                     "still prefer nodes without pending maintenance)"]


def test_a_gke_version_without_the_label_is_warned() -> None:
    """Below 1.31.1-gke.2008000 GKE does not label GPU nodes (the driver rule refuses such versions for the stack's
    image today, so the model is changed after loading)."""
    m = model("dws")
    assert capacity_checks.maintenance_warnings(m) == []
    old = msgspec.structs.replace(m, cluster=msgspec.structs.replace(m.cluster,
                                                                     min_master_version="1.31.1-gke.2007999"))
    (found,) = lines(capacity_checks.maintenance_warnings(old))
    assert found.startswith("cluster.minMasterVersion: 1.31.1-gke.2007999 is below 1.31.1-gke.2008000, from which "
                            "GKE labels a GPU node cloud.google.com/scheduled-maintenance-time")
    new = msgspec.structs.replace(m, cluster=msgspec.structs.replace(m.cluster,
                                                                     min_master_version="1.31.1-gke.2008000"))
    assert capacity_checks.maintenance_warnings(new) == []


def test_the_preview_says_how_it_works_and_which_gke() -> None:
    from conftest import stack_run

    from preview.sections.recovery import section

    ((title, text),) = section(stack_run("finetune"))
    assert title == "Preemption recovery"
    assert ("Host maintenance of a GPU node (no live migration): GKE 1.31.1-gke.2008000 and later labels the node "
            "`cloud.google.com/scheduled-maintenance-time` with its start; the MPIJob launcher's maintenance watch "
            "evicts the worker on it once the start is within the grace period plus 5 minutes") in text
