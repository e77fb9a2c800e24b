"""InferenceGateway: GKE Inference Gateway in front of one model server (`serving.gateway`; the objects and their
sources: workloads/serving_gateway.py). A child of the ModelServer, in its namespace."""

from __future__ import annotations

from typing import Any

import msgspec
import pulumi
import pulumi_kubernetes as k8s

from model.types import ServeWorkloadConfig
from workloads import pod_security, serving_gateway
from workloads.placement import labels


class InferenceGatewayArgs(msgspec.Struct, frozen=True):
    workload: ServeWorkloadConfig
    namespace: pulumi.Output[str]
    proxy_cidr: str  # the region's proxy-only subnet, where the load balancer's proxies run
    backends: list[tuple[str, str, int]] | None = None  # the route's pools, namespaces, weights; None: its own
    grants_from: list[str] = msgspec.field(default_factory=list)  # namespaces whose routes send it a canary share


def _meta(name: str, w: ServeWorkloadConfig, ns: pulumi.Output[str], **extra: Any) -> k8s.meta.v1.ObjectMetaArgs:
    return k8s.meta.v1.ObjectMetaArgs(name=name, namespace=ns, labels=labels(w), **extra)


class InferenceGateway(pulumi.ComponentResource):
    def __init__(self, name: str, args: InferenceGatewayArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepspeed-stack:workloads:InferenceGateway", name, None, opts)
        w, ns, child = args.workload, args.namespace, pulumi.ResourceOptions(parent=self)
        epp = serving_gateway.epp_name(w)
        self.service_account = k8s.core.v1.ServiceAccount(f"{name}-epp-sa", metadata=_meta(epp, w, ns), opts=child)
        self.role = k8s.rbac.v1.Role(f"{name}-epp-role", metadata=_meta(epp, w, ns), rules=[
            k8s.rbac.v1.PolicyRuleArgs(api_groups=r["apiGroups"], resources=r["resources"], verbs=r["verbs"])
            for r in serving_gateway.epp_rules()], opts=child)
        self.role_binding = k8s.rbac.v1.RoleBinding(
            f"{name}-epp-binding", metadata=_meta(epp, w, ns),
            role_ref=k8s.rbac.v1.RoleRefArgs(api_group="rbac.authorization.k8s.io", kind="Role", name=epp),
            subjects=[k8s.rbac.v1.SubjectArgs(kind="ServiceAccount", name=epp, namespace=ns)], opts=child)
        self.config_map = k8s.core.v1.ConfigMap(
            f"{name}-epp-config", metadata=_meta(epp, w, ns),
            data={serving_gateway.PLUGINS_FILE: serving_gateway.plugins()}, opts=child)
        self.deployment = k8s.apps.v1.Deployment(
            f"{name}-epp", metadata=_meta(epp, w, ns, annotations=pod_security.skip_annotations(
                serving_gateway.EPP_WAIVERS)),
            spec=serving_gateway.epp_deployment_spec(w),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.config_map, self.role_binding]))
        self.service = k8s.core.v1.Service(
            f"{name}-epp-service", metadata=_meta(epp, w, ns),
            spec=k8s.core.v1.ServiceSpecArgs(type="ClusterIP", selector=serving_gateway.epp_selector(w), ports=[
                k8s.core.v1.ServicePortArgs(name=p["name"], port=p["port"], protocol=p["protocol"])
                for p in serving_gateway.epp_service_ports()]), opts=child)
        self.network_policy = k8s.networking.v1.NetworkPolicy(
            f"{name}-epp-netpol", metadata=_meta(epp, w, ns),
            spec=serving_gateway.epp_network_policy_spec(w, args.proxy_cidr), opts=child)
        objects = [serving_gateway.inference_pool(w), serving_gateway.gateway(w),
                   serving_gateway.http_route(w, args.backends), serving_gateway.health_check_policy(w),
                   serving_gateway.backend_policy(w)]
        self.pool, self.gateway, self.route, self.health_check, self.backend_policy = (
            self._custom(name, obj, ns) for obj in objects)
        self.grant = self._custom(name, serving_gateway.reference_grant(w, args.grants_from), ns) \
            if args.grants_from else None
        self.register_outputs({"gateway": w.name, "pool": w.name, "endpointPicker": self.deployment.metadata.name})

    def _custom(self, name: str, obj: dict[str, Any], ns: pulumi.Output[str]) -> k8s.apiextensions.CustomResource:
        meta = obj["metadata"]
        return k8s.apiextensions.CustomResource(
            f"{name}-{obj['kind'].lower()}", api_version=obj["apiVersion"], kind=obj["kind"],
            metadata=k8s.meta.v1.ObjectMetaArgs(name=meta["name"], namespace=ns, labels=meta["labels"]),
            spec=obj["spec"], opts=pulumi.ResourceOptions(parent=self))
