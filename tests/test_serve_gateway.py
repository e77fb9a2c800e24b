"""`serving.gateway`: GKE Inference Gateway in front of a server's replicas. Every object it registers validated:
the InferencePool against the Gateway API Inference Extension's v1 CRD (../shared/reference/serving-scale, v1.6.0),
the endpoint picker's Kubernetes objects against Kubernetes' own schemas (kubernetes-validate). The Gateway and the
HTTPRoute are checked field by field against the values GKE's docs name: ../shared holds no Gateway API CRDs. The
cluster's Gateway API and proxy-only subnet, the server's NetworkPolicy, and each rule's failing input."""

from __future__ import annotations

import functools
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from conftest import changed, config_model, problems, reference, stack_run

from checks import warnings
from preview import engine, manifests
from preview.engine import RunResult

W = "workloads.chat"
GATEWAY = {"cluster.minMasterVersion": "1.34.1-gke.1000000", f"{W}.serving.gateway.enabled": True,
           f"{W}.serving.replicas": 2, "nodePools[0].maxNodes": 3}
COMPONENT = "deepspeed-stack:workloads:InferenceGateway"
POOL = "kubernetes:inference.networking.k8s.io/v1:InferencePool"
K8S_VERSION = "1.33.0"


def run(change: dict[str, Any]) -> RunResult:
    return engine.run_program(*engine.engine_config_from_yaml(changed("serve", change)), stack="serve")


@pytest.fixture(scope="module")
def gated() -> RunResult:
    return run(GATEWAY)


@functools.cache
def pool_schema() -> dict[str, Any]:
    path = reference("serving-scale", "inference.networking.k8s.io_inferencepools.v1.6.0.yaml")
    crd = yaml.safe_load(path.read_text(encoding="utf-8"))
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    assert v1["served"] and v1["storage"]
    return v1["schema"]["openAPIV3Schema"]


def objects(run: RunResult) -> dict[str, dict[str, Any]]:
    component = run.one(COMPONENT).urn
    return {f"{r.inputs['kind']}/{r.inputs['metadata']['name']}": manifests.manifest(r)
            for r in run.resources if r.parent == component and manifests.is_object(r)}


def test_inference_pool_validates_against_the_v1_crd(gated: RunResult) -> None:
    pool = objects(gated)["InferencePool/chat"]
    jsonschema.Draft7Validator(pool_schema()).validate(pool)
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["spec"] == {
        "targetPorts": [{"number": 8000}], "appProtocol": "http",
        "selector": {"matchLabels": {"deepspeed-stack/workload": "chat", "app.kubernetes.io/component": "server"}},
        "endpointPickerRef": {"name": "chat-epp", "port": {"number": 9002}, "failureMode": "FailOpen"}}
    # The pool selects the server's pods: the Deployment's pod labels hold the selector.
    server = gated.one("kubernetes:apps/v1:Deployment", "chat-deployment").inputs
    assert pool["spec"]["selector"]["matchLabels"].items() <= server["spec"]["template"]["metadata"]["labels"].items()


def test_the_pool_rejects_what_the_crd_refuses() -> None:
    bad = {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool", "metadata": {"name": "x"},
           "spec": {"selector": {"matchLabels": {"a": "b"}}, "targetPorts": [{"number": 8000}],
                    "endpointPickerRef": {"name": "x-epp", "port": {"number": 9002}, "failureMode": "Sometimes"}}}
    with pytest.raises(jsonschema.ValidationError, match="Sometimes"):
        jsonschema.Draft7Validator(pool_schema()).validate(bad)


def test_gateway_and_route_as_gke_names_them(gated: RunResult) -> None:
    objs = objects(gated)
    gateway, route = objs["Gateway/chat"], objs["HTTPRoute/chat"]
    assert gateway["apiVersion"] == route["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert gateway["spec"] == {"gatewayClassName": "gke-l7-rilb",
                               "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}
    assert route["spec"]["parentRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "chat"}]
    # Every path (so every model name the server serves) to the pool.
    assert route["spec"]["rules"] == [{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}], "backendRefs": [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "chat"}]}]
    external = objects(run({**GATEWAY, f"{W}.serving.gateway.access": "external"}))
    assert external["Gateway/chat"]["spec"]["gatewayClassName"] == "gke-l7-regional-external-managed"


def test_endpoint_picker_objects_are_valid_kubernetes(gated: RunResult) -> None:
    objs = objects(gated)
    kinds = sorted(k.split("/")[0] for k in objs)
    assert kinds == ["ConfigMap", "Deployment", "GCPBackendPolicy", "Gateway", "HTTPRoute", "HealthCheckPolicy",
                     "InferencePool", "NetworkPolicy", "Role", "RoleBinding", "Service", "ServiceAccount"]
    for doc in objs.values():
        if doc["apiVersion"].split("/")[0] in ("v1", "apps", "rbac.authorization.k8s.io", "networking.k8s.io"):
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    pod = objs["Deployment/chat-epp"]["spec"]["template"]["spec"]
    (epp,) = pod["containers"]
    assert epp["image"] == "registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0"
    assert epp["args"][:6] == ["--pool-name", "chat", "--pool-namespace", "serving", "--pool-group",
                               "inference.networking.k8s.io"]
    assert epp["securityContext"]["readOnlyRootFilesystem"] and epp["securityContext"]["capabilities"] == {
        "drop": ["ALL"]}
    assert pod["securityContext"]["runAsUser"] == 65532 and pod["nodeSelector"] == {"deepspeed-stack/pool": "system"}
    assert epp["resources"]["requests"] == epp["resources"]["limits"] == {"cpu": "1", "memory": "4Gi"}
    assert objs["Deployment/chat-epp"]["spec"]["strategy"] == {"type": "Recreate"}
    # The picker reads its namespace's pods and pool, nothing else, and admits only the proxies and health checks.
    rules = objs["Role/chat-epp"]["rules"]
    assert {v for r in rules for v in r["verbs"]} == {"get", "watch", "list"}
    assert {"pods", "inferencepools"} <= {res for r in rules for res in r["resources"]}
    ingress = objs["NetworkPolicy/chat-epp"]["spec"]["ingress"]
    assert [p["ipBlock"]["cidr"] for p in ingress[0]["from"]] == ["10.40.0.0/23", "35.191.0.0/16", "130.211.0.0/22"]
    assert objs["HealthCheckPolicy/chat"]["spec"]["default"]["config"]["httpHealthCheck"] == {
        "requestPath": "/health", "port": 8000}


def test_the_server_admits_the_proxies_and_the_picker(gated: RunResult) -> None:
    ingress = gated.one("kubernetes:networking.k8s.io/v1:NetworkPolicy", "chat-netpol").inputs["spec"]["ingress"]
    cidrs = [p["ipBlock"]["cidr"] for rule in ingress for p in rule["from"] if "ipBlock" in p]
    assert cidrs == ["10.40.0.0/23", "35.191.0.0/16", "130.211.0.0/22"]
    assert any(p.get("podSelector", {}).get("matchLabels", {}).get("inferencepool") == "chat-epp"
               for rule in ingress for p in rule["from"])
    assert not stack_run("serve").by_type(POOL)  # without the option: the Service alone


def test_cluster_gets_gateway_api_and_the_proxy_only_subnet(gated: RunResult) -> None:
    cluster = gated.one("gcp:container/cluster:Cluster").inputs
    assert cluster["gatewayApiConfig"] == {"channel": "CHANNEL_STANDARD"}
    assert cluster["addonsConfig"]["httpLoadBalancing"] == {"disabled": False}
    subnet = gated.one("gcp:compute/subnetwork:Subnetwork", "network-proxy-only").inputs
    assert (subnet["purpose"], subnet["role"], subnet["ipCidrRange"]) == (
        "REGIONAL_MANAGED_PROXY", "ACTIVE", "10.40.0.0/23")
    plain = stack_run("serve")
    assert "gatewayApiConfig" not in plain.one("gcp:container/cluster:Cluster").inputs
    assert not [r for r in plain.by_type("gcp:compute/subnetwork:Subnetwork") if r.name == "network-proxy-only"]


def test_summary_says_where_requests_enter(gated: RunResult) -> None:
    summary = gated.outputs["workloads"]["chat"]
    assert summary["gateway"]["class"] == "gke-l7-rilb"
    assert summary["gateway"]["addressCommand"] == (
        "kubectl -n serving get gateway chat -o jsonpath='{.status.addresses[0].value}'")


@pytest.mark.parametrize(("change", "expected"), [
    ({f"{W}.serving.engine": "mii"}, "workloads.chat.serving.engine: mii with workloads.chat.serving.gateway.enabled"),
    ({"cluster.minMasterVersion": None}, "cluster.minMasterVersion: unset, so GKE may run an older control plane "
                                           "than 1.34.0-gke.1626000"),
    ({"cluster.minMasterVersion": "1.33.5-gke.1000000"}, "cluster.minMasterVersion: 1.33.5-gke.1000000 is below "
                                                         "1.34.0-gke.1626000"),
    ({f"{W}.serving.service": "InternalLoadBalancer"}, "workloads.chat.serving.service: InternalLoadBalancer with "
                                                       "workloads.chat.serving.gateway.enabled"),
    ({"network.proxyOnlyCidr": "10.10.0.0/23"}, "network.proxyOnlyCidr: 10.10.0.0/23 overlaps network.subnetCidr"),
])
def test_refused(change: dict[str, Any], expected: str) -> None:
    merged = {**GATEWAY, **change}
    found = problems("serve", {k: v for k, v in merged.items() if v is not None})
    assert any(p.startswith(expected) for p in found), found


def test_external_warns() -> None:
    found = warnings(config_model(changed("serve", {**GATEWAY, f"{W}.serving.gateway.access": "external"})))
    assert any(w.startswith("workloads.chat.serving.gateway.access: external: a regional external") for w in found)
    internal = warnings(config_model(changed("serve", GATEWAY)))
    assert not any("gateway" in w for w in internal), internal


def test_serving_section_says_replicas_entry_and_fleet_costs(gated: RunResult) -> None:
    """issue 42 item 6: per server, the replicas, where requests enter, one replica's and the fleet's $/h and $/month
    (a replica is a node: the L4 pool's g2-standard-8 on demand, data/gpu_catalog.yaml)."""
    from model import catalog
    from preview.sections import serving

    node = catalog.load().shape("nvidia-l4", "g2-standard-8", 1).price.on_demand
    ((_, body),) = serving.section(gated)
    row = next(line for line in body.splitlines() if line.startswith("| chat |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[4] == "2"
    assert cells[5] == ("Gateway chat (gke-l7-rilb, internal): "
                        "`kubectl -n serving get gateway chat -o jsonpath='{.status.addresses[0].value}'`")
    assert cells[6:] == [f"${node:.2f} (pool l4)", f"${2 * node:,.2f}", f"${2 * node * 730:,.2f}"]
    scaled = run({"cluster.minMasterVersion": "1.34.1-gke.1000000", "nodePools[0].maxNodes": 4,
                  f"{W}.serving.autoscaling.enabled": True, f"{W}.serving.autoscaling.maxReplicas": 3})
    ((_, body),) = serving.section(scaled)
    cells = [c.strip() for c in next(x for x in body.splitlines() if x.startswith("| chat |")).strip("|").split("|")]
    assert cells[7:] == [f"${node:,.2f}-${3 * node:,.2f}", f"${node * 730:,.2f}-${3 * node * 730:,.2f}"]
    assert cells[5] == "Service `http://chat.serving.svc.cluster.local:8000/v1` (in the cluster)"


def canary_config(**more: Any) -> dict[str, Any]:
    """A second server (its own namespace), a new model version, sharing the gateway's requests."""
    chat = changed("serve", {})["deepspeed-stack:workloads"]["chat"]
    v2 = {**chat, "namespace": "serving-v2", "serving": {**chat["serving"], "gateway": {"enabled": True}}}
    return {**GATEWAY, "nodePools[0].maxNodes": 4, "workloads.chat-v2": v2,
            f"{W}.serving.gateway.canary": {"workload": "chat-v2", "percent": 10}, **more}


def test_a_canary_share_is_a_weight_of_the_route() -> None:
    result = run(canary_config(**{"workloads.chat-v2.serving.model": "Qwen/Qwen2.5-7B",
                                  "workloads.chat-v2.model.name": "Qwen2.5-7B"}))
    (route,) = [manifests.manifest(r) for r in result.by_type("kubernetes:gateway.networking.k8s.io/v1:HTTPRoute")
                if r.inputs["metadata"]["name"] == "chat"]
    assert route["spec"]["rules"][0]["backendRefs"] == [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "chat", "weight": 90},
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "chat-v2",
         "namespace": "serving-v2", "weight": 10}]
    # The canary's namespace lets chat's route reach its pool (Gateway API's ReferenceGrant).
    (grant,) = result.by_type("kubernetes:gateway.networking.k8s.io/v1beta1:ReferenceGrant")
    assert grant.inputs["metadata"]["namespace"] == "serving-v2" and grant.inputs["spec"] == {
        "from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "serving"}],
        "to": [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "chat-v2"}]}
    # The canary answers the server's model name too (vLLM's --served-model-name takes several; the first names
    # its answers).
    v2 = result.one("kubernetes:apps/v1:Deployment", "chat-v2-deployment")
    args = v2.inputs["spec"]["template"]["spec"]["containers"][0]["args"]
    i = args.index("--served-model-name")
    assert args[i + 1:i + 3] == ["Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B-Instruct"]
    assert result.outputs["workloads"]["chat"]["gateway"]["canary"] == {"workload": "chat-v2", "percent": 10}
    from preview.sections import serving

    ((_, body),) = serving.section(result)
    assert "; 10% of requests to chat-v2 (canary) |" in body


@pytest.mark.parametrize(("change", "expected"), [
    ({f"{W}.serving.gateway.canary.workload": "chat-v3"},
     "workloads.chat.serving.gateway.canary.workload: chat-v3 names no workload of this stack; valid: the stack's "
     "other serve workloads: chat-v2"),
    ({f"{W}.serving.gateway.canary.workload": "chat"},
     "workloads.chat.serving.gateway.canary.workload: chat is this server itself"),
    ({"workloads.chat-v2.serving.gateway.enabled": False},
     "workloads.chat.serving.gateway.canary.workload: chat-v2 has no InferencePool of its own"),
    ({f"{W}.serving.gateway.enabled": False}, "workloads.chat.serving.gateway.canary: a canary share is a weight"),
    ({f"{W}.serving.gateway.canary.percent": 100}, "workloads.chat.serving.gateway.canary.percent: must be at most 99"),
])
def test_canary_refused(change: dict[str, Any], expected: str) -> None:
    found = problems("serve", canary_config(**change))
    assert any(p.startswith(expected) for p in found), found


def test_a_canary_must_serve_the_servers_adapters() -> None:
    """finetune's chat serves the adapter tune; a canary of the base alone would fail tune's requests on its share."""
    chat = changed("finetune", {})["deepspeed-stack:workloads"]["chat"]
    v2 = {**chat, "namespace": "serving-v2",
          "serving": {"model": "Qwen/Qwen2.5-7B-Instruct", "gateway": {"enabled": True}}}
    found = problems("finetune", {"cluster.minMasterVersion": "1.34.1-gke.1000000", "nodePools[0].maxNodes": 4,
                                  f"{W}.serving.gateway.enabled": True, "workloads.chat-v2": v2,
                                  f"{W}.serving.gateway.canary": {"workload": "chat-v2", "percent": 5}})
    assert any(p.startswith("workloads.chat.serving.gateway.canary.workload: chat-v2 does not serve tune, which this "
                            "server serves") for p in found), found
