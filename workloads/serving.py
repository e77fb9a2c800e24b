"""ModelServer: one `serve` workload: a model server (vLLM, or DeepSpeed-MII) on one GKE GPU pool.

The component creates the workload's Namespace, a ConfigMap with MII's entry script (recipes/serve.py),
a Secret with the Hugging Face token when the stack has one, a Deployment (one pod per replica, the model
tensor-parallel over the GPUs of its node), a Service, a PodDisruptionBudget, a NetworkPolicy that admits only the
sources in `serving.allowFrom` (and, for vLLM, Managed Prometheus' collectors), for vLLM a PodMonitoring of its
`/metrics`, and optionally a HorizontalPodAutoscaler on vLLM's waiting or running requests
(workloads/serving_metrics.py). The pod template, the PodMonitoring and the autoscaler's spec are plain dicts
(validated in tests: a core/v1 Pod, the PodMonitoring CRD's schema, autoscaling/v2); every other object is built
from pulumi_kubernetes' typed Args.

Its parts, a module each: what is served (serving_source.py: the model, its adapters, the markers to wait for), the
server container's command line per engine (serving_command.py), the evaluator beside it (serving_evaluator.py),
the pod template (serving_pod.py), how clients reach it (serving_endpoint.py).

A server of a model that training writes (`serving.fromWorkload`) waits for its marker in an init container; its
Deployment and Service carry pulumi-kubernetes' skipAwait annotation, so `pulumi up` does not wait for a model that
does not exist yet.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pulumi
import pulumi_kubernetes as k8s

from model.types import ServeWorkloadConfig
from workloads import gcs_fuse, pod_security, serving_fleet, serving_gateway, serving_group, serving_metrics
from workloads.fabric import pod_contract
from workloads.inference_gateway import InferenceGateway, InferenceGatewayArgs
from workloads.placement import Placement, labels
from workloads.serving_command import SCRIPT_DIR, TOKEN_KEY, ServerInputs, served_port
from workloads.serving_endpoint import (
    api_selector,
    await_annotations,
    endpoint,
    network_peers,
    port_forward_command,
    prompt_command,
    selector,
    service_ports,
)
from workloads.serving_evaluator import EVALUATOR_READINESS_WAIVER, evaluation_summary
from workloads.serving_pod import pod_template, script_files
from workloads.serving_source import ModelSource

INTERNAL_LB_ANNOTATION = "networking.gke.io/load-balancer-type"
# A GPU node from zero (node creation, driver install, a multi-GB image pull) before the pod even starts.
NODE_PROVISIONING_MINUTES = 20


def most_replicas(w: ServeWorkloadConfig) -> int:
    s = w.serving
    return max(s.replicas, s.autoscaling.max_replicas) if s.autoscaling.enabled else s.replicas


def surge_node_spare(w: ServeWorkloadConfig, where: Placement) -> bool:
    """A surge replica needs nodes of its own (one a node, `nodesPerReplica` for a group): the pool has them
    beyond the most replicas'."""
    nodes = w.serving.nodes_per_replica
    return where.pool is not None and where.pool.max_nodes >= (most_replicas(w) + 1) * nodes + w.evaluator_nodes


def rollout(w: ServeWorkloadConfig, where: Placement) -> dict[str, Any]:
    """Never zero ready replicas (issue 42 item 5). With a node to spare: surge one, none unavailable. Without
    one, several replicas are replaced one at a time (the others serve meanwhile), but a lone replica is never taken
    down first: maxUnavailable 0, so its successor waits Pending for a node the pool cannot give and the old pod
    serves on until maxNodes is raised (the preview warns: workloads/kinds/serve.py warn_no_surge_node)."""
    if surge_node_spare(w, where) or w.serving.replicas <= 1:
        return {"maxSurge": 1, "maxUnavailable": 0}
    return {"maxSurge": 0, "maxUnavailable": 1}


class ModelServerArgs(msgspec.Struct, frozen=True):
    workload: ServeWorkloadConfig
    placement: Placement
    image_ref: pulumi.Input[str]  # the stack's image (workloads.<name>.image overrides)
    source: ModelSource  # what it serves (model_source)
    hf_token: pulumi.Output[str] | None = None
    bucket: gcs_fuse.BucketAccess | None = None  # the stack's bucket, mounted when gcsFuse.enabled
    protect: bool = False  # the cluster's deletion protection: a production endpoint is not deleted by accident
    proxy_cidr: str | None = None  # the region's proxy-only subnet: with serving.gateway, where requests come from
    gateway_backends: list[tuple[str, str, int]] | None = None  # the gateway's pools, namespaces, weights (a canary)
    gateway_grants_from: list[str] = msgspec.field(default_factory=list)  # namespaces it is a canary for
    # One replica across nodes: the LeaderWorkerSet controller the stack installs (its CRD must exist first).
    group_controller: pulumi.Resource | None = None


def _depends_on(opts: pulumi.ResourceOptions | None) -> list[pulumi.Resource]:
    """The component's own depends_on (its GPU pool): Pulumi does not pass it on to children."""
    deps = opts.depends_on if opts else None
    if deps is None:
        return []
    return [d for d in (deps if isinstance(deps, list) else [deps]) if isinstance(d, pulumi.Resource)]


class ModelServer(pulumi.ComponentResource):
    """Pass the cluster's Kubernetes provider and `depends_on=[<the pool's GpuNodePool>]` in `opts`."""

    def __init__(self, name: str, args: ModelServerArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepspeed-stack:workloads:ModelServer", name, None, opts)
        w = args.workload
        child = pulumi.ResourceOptions(parent=self)
        self.namespace = k8s.core.v1.Namespace(
            f"{name}-ns", metadata=k8s.meta.v1.ObjectMetaArgs(name=w.namespace, labels=labels(w)), opts=child)
        ns = self.namespace.metadata.name
        files = script_files(w, args.source, args.placement)
        self.config_map: k8s.core.v1.ConfigMap | None = k8s.core.v1.ConfigMap(
            f"{name}-server",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=f"{w.name}-server", namespace=ns, labels=labels(w)),
            data=files, opts=child) if files else None
        self.token: k8s.core.v1.Secret | None = self._token(name, w, ns, args.hf_token)
        access = args.bucket if w.gcs_fuse.enabled else None
        self.service_account = gcs_fuse.service_account(f"{name}-ksa", ns, access, child) if access else None
        # One pod per replica (a Deployment), or one group of pods per replica across nodes (a LeaderWorkerSet).
        self.deployment: k8s.apps.v1.Deployment | k8s.apiextensions.CustomResource = (
            self._group(name, args, ns, access, opts) if w.multi_node
            else self._deployment(name, args, ns, access, opts))
        # Evaluation for a fleet: its one evaluator in a pod of its own (workloads/serving_fleet.py).
        self.evaluator = self._evaluator(name, args, ns, access, opts) if serving_fleet.apart(w) else None
        self.service: k8s.core.v1.Service = self._service(name, w, ns, args.protect, await_annotations(args.source))
        self.disruption_budget = k8s.policy.v1.PodDisruptionBudget(
            f"{name}-pdb",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=w.name, namespace=ns, labels=labels(w)),
            # One server at a time may go for a node upgrade or drain; a single replica is not held forever.
            spec=k8s.policy.v1.PodDisruptionBudgetSpecArgs(
                max_unavailable=1, selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector(w))),
            opts=child)
        gateway_on = serving_gateway.enabled(w) and args.proxy_cidr is not None
        self.network_policy: k8s.networking.v1.NetworkPolicy = self._network_policy(
            name, w, ns, args.proxy_cidr if gateway_on else None)
        self.gateway = InferenceGateway(f"{name}-gateway", InferenceGatewayArgs(
            w, ns, args.proxy_cidr or "", args.gateway_backends, args.gateway_grants_from), child) \
            if gateway_on else None
        self.pod_monitoring = self._pod_monitoring(name, w, ns) if serving_metrics.scraped(w) else None
        self.autoscaler = self._autoscaler(name, w, ns) if w.serving.autoscaling.enabled else None
        lb_ip = self.service.status.apply(_ingress_ip) if w.serving.service == "InternalLoadBalancer" else None
        src = args.source
        self.summary: pulumi.Output[dict[str, Any]] = pulumi.Output.from_input({
            "kind": "serve", "deployment": w.name, "namespace": ns, "pool": w.pool, "engine": w.serving.engine,
            "model": src.ref, "servedModel": src.default_model,
            **({"baseModel": src.served_name, "adapters": {a.name: a.path for a in src.adapters}}
               if src.adapters else {}),
            "gpusPerReplica": args.placement.per_worker * w.serving.nodes_per_replica, "replicas": w.serving.replicas,
            **({"nodesPerReplica": w.serving.nodes_per_replica, "layout": serving_group.layout_text(
                args.placement.per_worker, w.serving.nodes_per_replica)} if w.multi_node else {}),
            "maxReplicas": most_replicas(w), "service": w.serving.service,
            "scaling": serving_metrics.scaling_text(w),
            "endpoint": endpoint(w), "portForward": port_forward_command(w), "prompt": prompt_command(w, src),
            **({"waitsFor": src.markers_text} if src.waits else {}),
            **({"evaluation": evaluation_summary(w, src)} if src.evaluated else {}),
            **({"loadBalancerIp": lb_ip} if lb_ip is not None else {}),
            **(self._gateway_summary(w) if self.gateway is not None else {}),
        })
        # A custom resource's metadata is untyped: its name is the workload's, as the Deployment's is.
        workload_name = w.name if w.multi_node else self.deployment.metadata.name
        self.register_outputs({"namespace": ns, "deployment": workload_name,
                               "service": self.service.metadata.name, "endpoint": endpoint(w)})

    def _token(self, name: str, w: ServeWorkloadConfig, ns: pulumi.Output[str],
               token: pulumi.Output[str] | None) -> k8s.core.v1.Secret | None:
        """The HF token as a Secret mounted as a file; it stays a Pulumi secret. None without a token."""
        if token is None:
            return None
        return k8s.core.v1.Secret(
            f"{name}-hf-token",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=f"{w.name}-hf-token", namespace=ns, labels=labels(w)),
            type="Opaque",
            string_data={TOKEN_KEY: pulumi.Output.secret(token)},
            opts=pulumi.ResourceOptions(parent=self, additional_secret_outputs=["data", "stringData"]),
        )

    def _template(self, args: ModelServerArgs, access: gcs_fuse.BucketAccess | None,
                  role: str = serving_fleet.SERVER) -> pulumi.Output[dict[str, Any]]:
        """The server's pod template (or the fleet's evaluator's), once the image, the token's Secret and the bucket
        are known."""
        w, where = args.workload, args.placement
        image = pulumi.Output.from_input(w.image or args.image_ref)
        secret = self.token.metadata.name if self.token is not None else None

        def template(values: list) -> dict[str, Any]:
            image_ref, secret_name, bucket = values
            gcs = gcs_fuse.GcsMount(bucket, w.gcs_fuse.mount_path, access.kubernetes_service_account) \
                if access else None
            return pod_template(ServerInputs(w, where, image_ref, f"{w.name}-server", args.source, secret_name, gcs,
                                             role))

        return pulumi.Output.all(image, secret, access.bucket if access else None).apply(template)

    def _group(self, name: str, args: ModelServerArgs, ns: pulumi.Output[str], access: gcs_fuse.BucketAccess | None,
               opts: pulumi.ResourceOptions | None) -> k8s.apiextensions.CustomResource:
        """The LeaderWorkerSet of one replica across nodes (workloads/serving_group.py), after the controller that
        runs it and the pool; `pulumi up` waits for it no more than for any custom resource (it has no await logic)."""
        w, where = args.workload, args.placement
        nodes = w.serving.nodes_per_replica
        pods = self._template(args, access)
        waivers = pod_security.merge_waivers(pod_security.NVIDIA_IMAGE_UID_WAIVER, fabric_waivers(where))
        return k8s.apiextensions.CustomResource(
            f"{name}-group", api_version=serving_group.API_VERSION, kind=serving_group.KIND,
            metadata=k8s.meta.v1.ObjectMetaArgs(name=w.name, namespace=ns, labels=labels(w), annotations={
                **(await_annotations(args.source) or {}), **pod_security.skip_annotations(waivers)}),
            spec=pods.apply(lambda pod: serving_group.spec(
                w.serving.replicas, nodes, serving_group.leader_template(pod, SCRIPT_DIR, nodes, where),
                serving_group.worker_template(pod, SCRIPT_DIR, nodes, where), rollout(w, where))),
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=[*_depends_on(opts), *(r for r in (self.config_map, self.token, self.service_account,
                                                              args.group_controller) if r is not None)],
                delete_before_replace=True, protect=args.protect))

    def _evaluator(self, name: str, args: ModelServerArgs, ns: pulumi.Output[str],
                   access: gcs_fuse.BucketAccess | None, opts: pulumi.ResourceOptions | None) -> k8s.apps.v1.Deployment:
        """The fleet's one evaluator: one pod, Recreate (never two at once), no client (its NetworkPolicy admits
        nobody); `pulumi up` waits for it as for the server."""
        w = args.workload
        match = k8s.meta.v1.LabelSelectorArgs(match_labels=serving_fleet.evaluator_selector(w))
        k8s.networking.v1.NetworkPolicy(
            f"{name}-evaluator-netpol", metadata=k8s.meta.v1.ObjectMetaArgs(
                name=serving_fleet.evaluator_name(w), namespace=ns, labels=labels(w)),
            spec=k8s.networking.v1.NetworkPolicySpecArgs(pod_selector=match, policy_types=["Ingress"], ingress=[]),
            opts=pulumi.ResourceOptions(parent=self))
        timeout = (w.serving.startup_minutes + NODE_PROVISIONING_MINUTES) * 60
        return k8s.apps.v1.Deployment(
            f"{name}-evaluator", metadata=k8s.meta.v1.ObjectMetaArgs(
                name=serving_fleet.evaluator_name(w), namespace=ns, labels=labels(w),
                annotations=pod_security.skip_annotations(evaluator_waivers(True))),
            spec=k8s.apps.v1.DeploymentSpecArgs(
                replicas=1, selector=match, strategy=k8s.apps.v1.DeploymentStrategyArgs(type="Recreate"),
                progress_deadline_seconds=timeout, revision_history_limit=5,
                template=self._template(args, access, serving_fleet.EVALUATOR)),
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=[*_depends_on(opts), *(r for r in (self.config_map, self.token,
                                                                          self.service_account) if r is not None)],
                custom_timeouts=pulumi.CustomTimeouts(create=f"{timeout}s", update=f"{timeout}s"),
                delete_before_replace=True))

    def _deployment(self, name: str, args: ModelServerArgs, ns: pulumi.Output[str],
                    access: gcs_fuse.BucketAccess | None, opts: pulumi.ResourceOptions | None,
                    ) -> k8s.apps.v1.Deployment:
        w, where = args.workload, args.placement
        timeout = (w.serving.startup_minutes + NODE_PROVISIONING_MINUTES) * 60
        surge = rollout(w, where)
        return k8s.apps.v1.Deployment(
            f"{name}-deployment",
            # The waiver of the image's user on the Deployment, where a scan of the manifests reads it (not on the
            # pod template: a changed reason would roll the servers).
            metadata=k8s.meta.v1.ObjectMetaArgs(name=w.name, namespace=ns, labels=labels(w), annotations={
                **(await_annotations(args.source) or {}),
                **pod_security.skip_annotations(evaluator_waivers(
                    args.source.evaluated and not serving_fleet.apart(w)))}),
            spec=k8s.apps.v1.DeploymentSpecArgs(
                # With an autoscaler the HPA owns the count; Pulumi setting it too would undo every scaling.
                replicas=None if w.serving.autoscaling.enabled else w.serving.replicas,
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector(w)),
                strategy=k8s.apps.v1.DeploymentStrategyArgs(
                    type="RollingUpdate", rolling_update=k8s.apps.v1.RollingUpdateDeploymentArgs(
                        max_surge=surge["maxSurge"], max_unavailable=surge["maxUnavailable"])),
                progress_deadline_seconds=timeout,
                revision_history_limit=5,
                template=self._template(args, access),
            ),
            opts=pulumi.ResourceOptions(
                parent=self,
                # Only the Deployment needs GPU nodes: it alone waits for the pool the component depends on.
                depends_on=[*_depends_on(opts),
                            *(r for r in (self.config_map, self.token, self.service_account) if r is not None)],
                # `pulumi up` waits for the rollout: a new GPU node plus the weight download and load (not for a
                # model training has yet to write: skipAwait above).
                custom_timeouts=pulumi.CustomTimeouts(create=f"{timeout}s", update=f"{timeout}s"),
                delete_before_replace=True,  # a fixed name: a replacement must not collide with the old one
                protect=args.protect,
            ),
        )

    def _service(self, name: str, w: ServeWorkloadConfig, ns: pulumi.Output[str], protect: bool,
                 awaits: dict[str, str] | None) -> k8s.core.v1.Service:
        internal_lb = w.serving.service == "InternalLoadBalancer"
        # pulumi-kubernetes waits for a Service's endpoints to be ready: not for a server still waiting for its model.
        annotations = {**({INTERNAL_LB_ANNOTATION: "Internal"} if internal_lb else {}), **(awaits or {})}
        return k8s.core.v1.Service(
            f"{name}-service",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=w.name, namespace=ns, labels=labels(w), annotations=annotations or None),
            spec=k8s.core.v1.ServiceSpecArgs(
                type="LoadBalancer" if internal_lb else "ClusterIP",
                selector=api_selector(w),
                ports=[k8s.core.v1.ServicePortArgs(name=p["name"], port=p["port"], target_port=p["targetPort"],
                                                   protocol=p["protocol"]) for p in service_ports(w)],
                # Local keeps the client's address, so the NetworkPolicy's CIDRs see who really connects.
                external_traffic_policy="Local" if internal_lb else None,
            ),
            opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True, protect=protect),
        )

    def _gateway_summary(self, w: ServeWorkloadConfig) -> dict[str, Any]:
        """Where requests enter through the gateway: its class, and how to read the address GKE gives it (a
        CustomResource's status is not an output of pulumi-kubernetes)."""
        return {"gateway": {"name": w.name, "class": serving_gateway.gateway_class(w),
                            "access": w.serving.gateway.access, "addressCommand": serving_gateway.address_command(w),
                            "endpoint": f"http://<gateway address>{'/v1'}",
                            **({"canary": {"workload": canary.workload, "percent": canary.percent}}
                               if (canary := w.serving.gateway.canary) else {})}}

    def _network_policy(self, name: str, w: ServeWorkloadConfig, ns: pulumi.Output[str],
                        proxy_cidr: str | None = None) -> k8s.networking.v1.NetworkPolicy:
        peers = network_peers(w.serving.allow_from)
        ports = [k8s.networking.v1.NetworkPolicyPortArgs(port=p["port"], protocol="TCP") for p in service_ports(w)]
        ingress = [k8s.networking.v1.NetworkPolicyIngressRuleArgs(from_=[_peer_args(p) for p in peers], ports=ports)] \
            if peers else []
        if serving_metrics.scraped(w):
            # Managed Prometheus' collectors scrape /metrics on the API port (vLLM serves both on one port).
            ingress.append(k8s.networking.v1.NetworkPolicyIngressRuleArgs(
                from_=[_peer_args(serving_metrics.collector_peer())],
                ports=[k8s.networking.v1.NetworkPolicyPortArgs(port=served_port(w), protocol="TCP")]))
        for rule in serving_gateway.server_ingress(w, proxy_cidr) if proxy_cidr else []:
            # The gateway's proxies and health checkers, and the endpoint picker reading /metrics.
            ingress.append(k8s.networking.v1.NetworkPolicyIngressRuleArgs(
                from_=[_peer_args(p) for p in rule["from"]],
                ports=[k8s.networking.v1.NetworkPolicyPortArgs(**p) for p in rule["ports"]]))
        if w.multi_node:
            # The group's own traffic, pod to pod of this server: the torch.distributed store on the leader, NCCL's
            # and vLLM's message queues on ports each process picks at start (so no port list).
            ingress.append(k8s.networking.v1.NetworkPolicyIngressRuleArgs(
                from_=[_peer_args({"podSelector": {"matchLabels": selector(w)}})]))
        return k8s.networking.v1.NetworkPolicy(
            f"{name}-netpol",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=w.name, namespace=ns, labels=labels(w)),
            # Ingress only from the configured sources, to the API ports; no rule at all admits nobody (the
            # kubelet's probes and `kubectl port-forward` are not subject to it).
            spec=k8s.networking.v1.NetworkPolicySpecArgs(
                pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector(w)),
                policy_types=["Ingress"], ingress=ingress),
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _pod_monitoring(self, name: str, w: ServeWorkloadConfig,
                        ns: pulumi.Output[str]) -> k8s.apiextensions.CustomResource:
        """Managed Prometheus scrapes the server's /metrics (its CRD comes with the cluster's managed collection)."""
        obj = serving_metrics.pod_monitoring(w, api_selector(w))
        return k8s.apiextensions.CustomResource(
            f"{name}-metrics", api_version=obj["apiVersion"], kind=obj["kind"],
            metadata=k8s.meta.v1.ObjectMetaArgs(name=w.name, namespace=ns, labels=labels(w)),
            spec=obj["spec"], opts=pulumi.ResourceOptions(parent=self))

    def _autoscaler(self, name: str, w: ServeWorkloadConfig,
                    ns: pulumi.Output[str]) -> k8s.autoscaling.v2.HorizontalPodAutoscaler:
        """On vLLM's queue (or batch) per replica, read through the custom metrics API (the adapter the stack
        installs: components/metrics_adapter.py); it names the Deployment and need not wait for it."""
        return k8s.autoscaling.v2.HorizontalPodAutoscaler(
            f"{name}-hpa",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=w.name, namespace=ns, labels=labels(w)),
            spec=serving_metrics.autoscaler_spec(w),
            opts=pulumi.ResourceOptions(parent=self),
        )


def _peer_args(peer: dict[str, Any]) -> k8s.networking.v1.NetworkPolicyPeerArgs:
    def match(key: str) -> k8s.meta.v1.LabelSelectorArgs | None:
        return k8s.meta.v1.LabelSelectorArgs(match_labels=peer[key]["matchLabels"]) if key in peer else None

    block = k8s.networking.v1.IPBlockArgs(cidr=peer["ipBlock"]["cidr"]) if "ipBlock" in peer else None
    return k8s.networking.v1.NetworkPolicyPeerArgs(ip_block=block, namespace_selector=match("namespaceSelector"),
                                                   pod_selector=match("podSelector"))


def _ingress_ip(status: Any) -> str | None:
    """The internal load balancer's address once GKE has given it one."""
    lb = status.get("loadBalancer") if isinstance(status, dict) else getattr(status, "load_balancer", None)
    ingress = (lb.get("ingress") if isinstance(lb, dict) else getattr(lb, "ingress", None)) if lb else None
    if not ingress:
        return None
    first = ingress[0]
    return first.get("ip") if isinstance(first, dict) else getattr(first, "ip", None)


def fabric_waivers(where: Placement) -> dict[str, str]:
    """The fabric daemon's checkov waivers where a group runs on a GPU fabric pool (workloads/fabric.py)."""
    contract = pod_contract(where)
    return dict(contract.waivers) if contract is not None else {}


def evaluator_waivers(with_evaluator: bool) -> dict[str, str]:
    """The image's user, and where an evaluator container runs in the pod, its readiness check's waiver."""
    return {**pod_security.NVIDIA_IMAGE_UID_WAIVER, **(EVALUATOR_READINESS_WAIVER if with_evaluator else {})}
