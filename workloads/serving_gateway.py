"""GKE Inference Gateway for one `serve` workload (`serving.gateway`): the objects as plain dicts (validated in tests
against the upstream CRDs and Kubernetes' schemas), rendered as the Gateway API Inference Extension's chart renders
them for provider gke (data/serving_gateway.yaml names the chart's files).

- Gateway `<name>`: a regional Application Load Balancer (GatewayClass gke-l7-rilb, or
  gke-l7-regional-external-managed for `access: external`), one HTTP listener.
- HTTPRoute `<name>`: every request on `/` to the InferencePool. Routing by model name needs no rule of its own:
  every replica serves the base and every adapter the server lists (vLLM's --lora-modules, or the evaluator's
  loads), so each name reaches a replica that holds it, and the endpoint picker prefers the replica that has the
  adapter in its batch (vLLM's lora_requests_info).
- InferencePool `<name>`: the server's pods (its selector) on the API port, the endpoint picker as its extension.
- The endpoint picker `<name>-epp`: ServiceAccount, Role/RoleBinding (pods, InferencePools, InferenceObjectives of
  its namespace, read-only), ConfigMap (its plugins), Deployment (one replica, Recreate, as upstream), Service
  (ext-proc 9002, metrics 9090), and a NetworkPolicy that admits only the load balancer's proxies and Google's
  health checkers.
- HealthCheckPolicy and GCPBackendPolicy (networking.gke.io/v1) on the pool: vLLM's /health, a 300 s timeout.
"""

from __future__ import annotations

from typing import Any

from model import serving_gateway
from model.types import ServeWorkloadConfig
from workloads.placement import SYSTEM_POOL_SELECTOR, labels
from workloads.serving_command import hardened, health_path, served_port
from workloads.serving_endpoint import api_selector

GATEWAY_API = "gateway.networking.k8s.io/v1"
INFERENCE_API = "inference.networking.k8s.io/v1"
GKE_NETWORKING_API = "networking.gke.io/v1"
PLUGINS_FILE = "default-plugins.yaml"  # GAIE values.yaml pluginsConfigFile
CONFIG_DIR = "/config"
EPP_COMPONENT = "endpoint-picker"
# The EPP's own checkov waivers: it watches pods and its InferencePool through the API server (an SA token), and its
# image is pinned by upstream's release tag: no digest could be read offline (the registry is not reachable here).
EPP_WAIVERS = {
    "CKV_K8S_38": (
        "the endpoint picker watches its namespace's pods and InferencePool through the API server (upstream's Role, "
        "kubernetes-sigs/gateway-api-inference-extension v1.5.0 config/charts/inferencepool/templates/rbac.yaml), so "
        "it needs its service account's token; the Role grants get/watch/list there and nothing else"),
    "CKV_K8S_43": (
        "registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0, upstream's release tag (the chart's own "
        "reference, config/charts/inferencepool/values.yaml); images on registry.k8s.io are promoted by the "
        "Kubernetes image promoter, which does not move a promoted tag; the digest is to be pinned once read from "
        "the registry (docs/serving.md, Inference Gateway)"),
}


def enabled(w: ServeWorkloadConfig) -> bool:
    return w.serving.gateway.enabled


def epp_name(w: ServeWorkloadConfig) -> str:
    return f"{w.name}-epp"


def epp_selector(w: ServeWorkloadConfig) -> dict[str, str]:
    # GAIE _helpers.tpl selectorLabels: `inferencepool: <name>-epp`; with the stack's workload label.
    return {"inferencepool": epp_name(w), "deepspeed-stack/workload": w.name,
            "app.kubernetes.io/component": EPP_COMPONENT}


def gateway_class(w: ServeWorkloadConfig) -> str:
    return serving_gateway.load().gateway_class(w.serving.gateway.access)


def gateway(w: ServeWorkloadConfig) -> dict[str, Any]:
    f = serving_gateway.load()
    return {"apiVersion": GATEWAY_API, "kind": "Gateway",
            "metadata": {"name": w.name, "namespace": w.namespace, "labels": labels(w)},
            "spec": {"gatewayClassName": gateway_class(w),
                     "listeners": [{"name": "http", "port": f.listener_port, "protocol": "HTTP"}]}}


def http_route(w: ServeWorkloadConfig, backends: list[tuple[str, str, int]] | None = None) -> dict[str, Any]:
    """Every path to the pool; `backends` (pool, its namespace, weight) splits it (the canary: a pool of another
    namespace, which a ReferenceGrant there admits), default: the server's own."""
    refs = [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": name,
             **({"namespace": namespace} if namespace != w.namespace else {}),
             **({"weight": weight} if backends and len(backends) > 1 else {})}
            for name, namespace, weight in (backends or [(w.name, w.namespace, 1)])]
    return {"apiVersion": GATEWAY_API, "kind": "HTTPRoute",
            "metadata": {"name": w.name, "namespace": w.namespace, "labels": labels(w)},
            "spec": {"parentRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": w.name}],
                     "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}], "backendRefs": refs}]}}


def reference_grant(w: ServeWorkloadConfig, from_namespaces: list[str]) -> dict[str, Any]:
    """Gateway API's ReferenceGrant in the canary's namespace: HTTPRoutes of those namespaces may send requests to
    its InferencePool (a backendRef to another namespace needs one there)."""
    return {"apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "ReferenceGrant",
            "metadata": {"name": f"{w.name}-canary", "namespace": w.namespace, "labels": labels(w)},
            "spec": {"from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": ns}
                              for ns in from_namespaces],
                     "to": [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": w.name}]}}


def inference_pool(w: ServeWorkloadConfig) -> dict[str, Any]:
    f = serving_gateway.load().epp
    return {"apiVersion": INFERENCE_API, "kind": "InferencePool",
            "metadata": {"name": w.name, "namespace": w.namespace, "labels": labels(w)},
            "spec": {"targetPorts": [{"number": served_port(w)}], "appProtocol": "http",
                     "selector": {"matchLabels": api_selector(w)},
                     "endpointPickerRef": {"name": epp_name(w), "port": {"number": f.ext_proc_port},
                                           "failureMode": f.failure_mode}}}


def _pool_target() -> dict[str, str]:
    return {"group": "inference.networking.k8s.io", "kind": "InferencePool"}


def health_check_policy(w: ServeWorkloadConfig) -> dict[str, Any]:
    f = serving_gateway.load()
    return {"apiVersion": GKE_NETWORKING_API, "kind": "HealthCheckPolicy",
            "metadata": {"name": w.name, "namespace": w.namespace, "labels": labels(w)},
            "spec": {"targetRef": {**_pool_target(), "name": w.name},
                     "default": {**f.health_check, "config": {
                         "type": "HTTP", "httpHealthCheck": {"requestPath": health_path(w), "port": served_port(w)}}}}}


def backend_policy(w: ServeWorkloadConfig) -> dict[str, Any]:
    f = serving_gateway.load()
    return {"apiVersion": GKE_NETWORKING_API, "kind": "GCPBackendPolicy",
            "metadata": {"name": w.name, "namespace": w.namespace, "labels": labels(w)},
            "spec": {"targetRef": {**_pool_target(), "name": w.name},
                     "default": {"timeoutSec": f.backend_timeout_sec, "logging": {"enabled": True}}}}


def plugins() -> str:
    return serving_gateway.load().epp.plugins


def epp_rules() -> list[dict[str, Any]]:
    return [dict(r) for r in serving_gateway.load().epp.rules]


def epp_args(w: ServeWorkloadConfig) -> list[str]:
    f = serving_gateway.load().epp
    return ["--pool-name", w.name, "--pool-namespace", w.namespace, "--pool-group", "inference.networking.k8s.io",
            *f.args[:2], "--config-file", f"{CONFIG_DIR}/{PLUGINS_FILE}", *f.args[2:]]


def epp_pod_template(w: ServeWorkloadConfig) -> dict[str, Any]:
    """GAIE _deployment.yaml's pod for one replica, hardened: the image's non-root user, read-only root, no
    capabilities, RuntimeDefault seccomp, requests = limits, on the system pool (it holds no GPU)."""
    f = serving_gateway.load().epp
    health = {"grpc": {"port": f.health_port, "service": "inference-extension"}}
    container = {
        # Always, as upstream's chart: the image is pinned by its release tag, not a digest (EPP_WAIVERS).
        "name": "epp", "image": f.image, "imagePullPolicy": "Always", "args": epp_args(w),
        "ports": [{"name": "grpc", "containerPort": f.ext_proc_port, "protocol": "TCP"},
                  {"name": "grpc-health", "containerPort": f.health_port, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": f.metrics_port, "protocol": "TCP"}],
        "env": [{"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "resources": {"requests": dict(f.resources), "limits": dict(f.resources)},
        "livenessProbe": {**health, "initialDelaySeconds": 5, "periodSeconds": 10},
        "readinessProbe": {**health, "periodSeconds": 2},
        "volumeMounts": [{"name": "plugins-config-volume", "mountPath": CONFIG_DIR, "readOnly": True},
                         {"name": "tmp", "mountPath": "/tmp"}],
        "securityContext": hardened(),
    }
    return {"metadata": {"labels": {**labels(w), **epp_selector(w)}},
            "spec": {"serviceAccountName": epp_name(w), "automountServiceAccountToken": True,
                     "enableServiceLinks": False, "terminationGracePeriodSeconds": f.termination_grace_period_seconds,
                     "securityContext": {"runAsNonRoot": True, "runAsUser": f.user, "runAsGroup": f.user,
                                         "fsGroup": f.user, "seccompProfile": {"type": "RuntimeDefault"}},
                     "nodeSelector": dict(SYSTEM_POOL_SELECTOR), "containers": [container],
                     "volumes": [{"name": "plugins-config-volume",
                                  "configMap": {"name": epp_name(w), "defaultMode": 0o444}},
                                 {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}]}}


def epp_deployment_spec(w: ServeWorkloadConfig) -> dict[str, Any]:
    # Recreate: one active picker (its prefix-cache state), as upstream's chart.
    return {"replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": epp_selector(w)},
            "template": epp_pod_template(w)}


def epp_service_ports() -> list[dict[str, Any]]:
    f = serving_gateway.load().epp
    return [{"name": "grpc-ext-proc", "protocol": "TCP", "port": f.ext_proc_port},
            {"name": "http-metrics", "protocol": "TCP", "port": f.metrics_port}]


def proxy_peers(proxy_cidr: str) -> list[dict[str, Any]]:
    """The load balancer's Envoy proxies (the proxy-only subnet) and Google's health checkers."""
    return [{"ipBlock": {"cidr": cidr}} for cidr in (proxy_cidr, *serving_gateway.load().health_check_ranges)]


def epp_network_policy_spec(w: ServeWorkloadConfig, proxy_cidr: str) -> dict[str, Any]:
    f = serving_gateway.load().epp
    return {"podSelector": {"matchLabels": epp_selector(w)}, "policyTypes": ["Ingress"],
            "ingress": [{"from": proxy_peers(proxy_cidr),
                         "ports": [{"port": f.ext_proc_port, "protocol": "TCP"},
                                   {"port": f.health_port, "protocol": "TCP"}]}]}


def server_ingress(w: ServeWorkloadConfig, proxy_cidr: str) -> list[dict[str, Any]]:
    """What the server's NetworkPolicy admits besides `allowFrom`: the proxies' requests and health checks, and the
    endpoint picker scraping vLLM's /metrics, on the API port."""
    ports = [{"port": served_port(w), "protocol": "TCP"}]
    return [{"from": proxy_peers(proxy_cidr), "ports": ports},
            {"from": [{"podSelector": {"matchLabels": epp_selector(w)}}], "ports": ports}]


def address_command(w: ServeWorkloadConfig) -> str:
    return f"kubectl -n {w.namespace} get gateway {w.name} -o jsonpath='{{.status.addresses[0].value}}'"
