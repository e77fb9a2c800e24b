"""ModelServer: one `serve` workload: a DeepSpeed-MII (FastGen) server on one GKE GPU pool.

The component creates the workload's Namespace, a ConfigMap with the server's entry script
(workloads/scripts/serve.py), a Secret with the Hugging Face token when the stack has one, a Deployment
(one pod per replica, the model tensor-parallel over the GPUs of its node), a Service, a
PodDisruptionBudget, a NetworkPolicy that admits only the sources in `serving.allowFrom`, and optionally a
HorizontalPodAutoscaler. The pod template is a plain dict rendered by `pod_template` (validated in tests as
a core/v1 Pod); every other object is built from pulumi_kubernetes' typed Args.

Probes: the entry script answers on HEALTH_PORT, `/ready` only once `mii.serve` has returned (the model is
loaded and MII's load balancer answers), `/live` unless the loaded server has gone away. MII's own
RESTful gateway is no readiness signal: MII starts it before the model has loaded.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from model.types import AllowedSource, ServeWorkloadConfig
from model.yamlio import load_yaml
from workloads import gcs_fuse
from workloads.placement import CONFIG_DIGEST_ANNOTATION, Placement, config_digest, labels

SCRIPTS_DIR = Path(__file__).resolve().parent / "scripts"
SERVER_SCRIPT = "serve.py"
SCRIPT_DIR = "/app"  # where the ConfigMap with the entry script is mounted
HEALTH_PORT = 8081
SERVING_FACTS_PATH = Path(__file__).resolve().parent.parent / "data" / "serving.yaml"


@dataclass(frozen=True)
class MiiFacts:
    """data/serving.yaml: what the pinned DeepSpeed-MII needs and uses (each fact with its source there)."""

    version: str
    min_compute_capability: tuple[int, int]
    precisions: tuple[str, ...]
    load_balancer_port: int
    torch_dist_port: int
    zmq_port: int
    rest_path: str


@functools.cache
def mii_facts(path: Path = SERVING_FACTS_PATH) -> MiiFacts:
    raw = load_yaml(path)
    major, _, minor = str(raw["minComputeCapability"]).partition(".")
    ports = raw["ports"]
    return MiiFacts(version=str(raw["deepspeedMiiVersion"]), min_compute_capability=(int(major), int(minor or 0)),
                    precisions=tuple(raw["precisions"]), load_balancer_port=int(ports["loadBalancer"]),
                    torch_dist_port=int(ports["torchDistributed"]), zmq_port=int(ports["zmq"]),
                    rest_path=str(raw["restPath"]))
# The image's user (workloads/images/deepspeed/Dockerfile) and its home, where HF_HOME, Triton's and torch's
# extension caches live: a scratch volume, because the root filesystem is read-only.
USER_ID = 1001
HOME = "/home/deepspeed"
HF_TOKEN_DIR = "/etc/huggingface"
TOKEN_KEY = "token"
COMPONENT_LABEL = "app.kubernetes.io/component"
INTERNAL_LB_ANNOTATION = "networking.gke.io/load-balancer-type"
PROBE_PERIOD_SECONDS = 10
# A GPU node from zero (node creation, driver install, a multi-GB image pull) before the pod even starts.
NODE_PROVISIONING_MINUTES = 20


def mii_reserved_ports(tensor_parallel: int) -> dict[int, str]:
    """Ports MII and the entry script use inside the pod, with what uses each: the configurable API ports must
    not take them."""
    f = mii_facts()
    ports = {HEALTH_PORT: "the entry script's health endpoint", f.torch_dist_port: "torch.distributed",
             f.zmq_port: "MII's ZMQ broadcast", f.load_balancer_port: "MII's load balancer"}
    for rank in range(tensor_parallel):  # one model-server port per tensor-parallel rank after the balancer's
        ports[f.load_balancer_port + 1 + rank] = f"MII's model server (rank {rank})"
    return ports


@dataclass(frozen=True)
class ServerInputs:
    """What the pod template is rendered from (resolved values, no Outputs)."""

    workload: ServeWorkloadConfig
    placement: Placement
    image: str
    config_map: str
    hf_token_secret: str | None = None
    gcs: gcs_fuse.GcsMount | None = None


def selector(w: ServeWorkloadConfig) -> dict[str, str]:
    return {"deepspeed-stack/workload": w.name, COMPONENT_LABEL: "server"}


def pod_labels(w: ServeWorkloadConfig) -> dict[str, str]:
    return {**labels(w), **selector(w)}


def model_ref(w: ServeWorkloadConfig) -> str:
    """What `mii.serve` loads: a Hugging Face id, or the checkpoint's folder under the bucket's mount."""
    s = w.serving
    if s.model_path:
        return f"{w.gcs_fuse.mount_path.rstrip('/')}/{s.model_path}"
    return s.model or ""


def rest_path(w: ServeWorkloadConfig) -> str:
    """MII's RESTful API path: `/mii/<deployment name>`; the deployment is named after the workload."""
    return f"{mii_facts().rest_path}/{w.name}"


def server_args(w: ServeWorkloadConfig, where: Placement) -> list[str]:
    """The entry script's arguments: the model, tensor-parallel over every GPU of the pod, the planner's
    sequence length as the server's max length, and the ports."""
    s = w.serving
    args = [f"{SCRIPT_DIR}/{SERVER_SCRIPT}", "--model", model_ref(w), "--deployment-name", w.name,
            "--tensor-parallel", str(where.per_worker), "--port", str(s.port), "--health-port", str(HEALTH_PORT)]
    if w.model is not None:
        args += ["--max-length", str(w.model.sequence_length)]
    if s.openai.enabled:
        args += ["--openai-port", str(s.openai.port)]
    return args


def container_ports(w: ServeWorkloadConfig) -> list[dict[str, Any]]:
    ports = [{"name": "http", "containerPort": w.serving.port, "protocol": "TCP"}]
    if w.serving.openai.enabled:
        ports.append({"name": "openai", "containerPort": w.serving.openai.port, "protocol": "TCP"})
    ports.append({"name": "health", "containerPort": HEALTH_PORT, "protocol": "TCP"})
    return ports


def probes(w: ServeWorkloadConfig) -> dict[str, dict[str, Any]]:
    """Startup: up to `startupMinutes` for the download and the weight load; then readiness (model loaded,
    load balancer answering) and liveness (the server has not gone away), which start only after it."""
    get = {"port": "health", "scheme": "HTTP"}
    startup_failures = math.ceil(w.serving.startup_minutes * 60 / PROBE_PERIOD_SECONDS)
    return {
        "startupProbe": {"httpGet": {**get, "path": "/ready"}, "periodSeconds": PROBE_PERIOD_SECONDS,
                         "timeoutSeconds": 5, "failureThreshold": startup_failures},
        "readinessProbe": {"httpGet": {**get, "path": "/ready"}, "periodSeconds": PROBE_PERIOD_SECONDS,
                           "timeoutSeconds": 5, "failureThreshold": 3, "successThreshold": 1},
        "livenessProbe": {"httpGet": {**get, "path": "/live"}, "periodSeconds": 20, "timeoutSeconds": 5,
                          "failureThreshold": 3},
    }


def _volumes(inp: ServerInputs) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    w = inp.workload
    volumes: list[dict[str, Any]] = [
        {"name": "server", "configMap": {"name": inp.config_map, "defaultMode": 0o444}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
        # HF_HOME (the download cache), Triton's and torch's extension caches (FastGen compiles kernels on
        # first use): the only writable place besides /tmp.
        {"name": "home", "emptyDir": {"sizeLimit": w.serving.cache_size}},
        # NCCL between the tensor-parallel ranks needs more than the runtime's 64 MiB of shared memory.
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": w.resources.shm_size}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "server", "mountPath": SCRIPT_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "home", "mountPath": HOME},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    if inp.hf_token_secret:
        volumes.append({"name": "hf-token", "secret": {"secretName": inp.hf_token_secret, "defaultMode": 0o440,
                                                       "items": [{"key": TOKEN_KEY, "path": TOKEN_KEY}]}})
        mounts.append({"name": "hf-token", "mountPath": HF_TOKEN_DIR, "readOnly": True})
    if inp.gcs:
        # The checkpoint is only read: a read-only mount cannot damage the bucket.
        volume = gcs_fuse.volume(inp.gcs)
        volume["csi"]["readOnly"] = True
        volumes.append(volume)
        mounts.append({**gcs_fuse.volume_mount(inp.gcs), "readOnly": True})
    return volumes, mounts


def _env(inp: ServerInputs) -> list[dict[str, str]]:
    # huggingface_hub reads the token from the file HF_TOKEN_PATH names: only the path is in the pod spec.
    return [{"name": "HF_TOKEN_PATH", "value": f"{HF_TOKEN_DIR}/{TOKEN_KEY}"}] if inp.hf_token_secret else []


def script_files() -> dict[str, str]:
    return {SERVER_SCRIPT: (SCRIPTS_DIR / SERVER_SCRIPT).read_text(encoding="utf-8")}


def pod_template(inp: ServerInputs) -> dict[str, Any]:
    """The Deployment's pod template: placement and resources from the pool, hardened, probed."""
    w, where = inp.workload, inp.placement
    volumes, mounts = _volumes(inp)
    limits = where.limits()
    annotations = {CONFIG_DIGEST_ANNOTATION: config_digest(script_files())}  # a new script rolls the pods
    if inp.gcs:
        annotations.update(gcs_fuse.POD_ANNOTATIONS)
    container = {
        "name": "server",
        "image": inp.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python"],
        "args": server_args(w, where),
        "ports": container_ports(w),
        "env": _env(inp),
        "resources": {"requests": dict(limits), "limits": dict(limits)},
        "volumeMounts": mounts,
        **probes(w),
        "securityContext": {"allowPrivilegeEscalation": False, "privileged": False,
                            "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                            "capabilities": {"drop": ["ALL"]}},
    }
    spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": USER_ID, "runAsGroup": USER_ID, "fsGroup": USER_ID,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "nodeSelector": dict(where.node_selector),
        "tolerations": [dict(t) for t in where.tolerations],
        "terminationGracePeriodSeconds": 60,
        "containers": [container],
        "volumes": volumes,
    }
    if inp.gcs:
        spec["serviceAccountName"] = inp.gcs.service_account
    return {"metadata": {"labels": pod_labels(w), "annotations": annotations}, "spec": spec}


def most_replicas(w: ServeWorkloadConfig) -> int:
    s = w.serving
    return max(s.replicas, s.autoscaling.max_replicas) if s.autoscaling.enabled else s.replicas


def rollout(w: ServeWorkloadConfig, where: Placement) -> dict[str, Any]:
    """A surge pod needs a node of its own: surge only when the pool has a node to spare, else replace in place."""
    spare = where.pool is not None and where.pool.max_nodes > most_replicas(w)
    return {"maxSurge": 1, "maxUnavailable": 0} if spare else {"maxSurge": 0, "maxUnavailable": 1}


def network_peers(sources: list[AllowedSource]) -> list[dict[str, Any]]:
    """`serving.allowFrom` as NetworkPolicy peers."""
    peers = []
    for src in sources:
        if src.cidr:
            peers.append({"ipBlock": {"cidr": src.cidr}})
            continue
        peer: dict[str, Any] = {}
        if src.namespace:
            peer["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": src.namespace}}
        if src.pod_labels:
            peer["podSelector"] = {"matchLabels": dict(src.pod_labels)}
        peers.append(peer)
    return peers


def service_ports(w: ServeWorkloadConfig) -> list[dict[str, Any]]:
    ports = [{"name": "http", "port": w.serving.port, "targetPort": "http", "protocol": "TCP"}]
    if w.serving.openai.enabled:
        ports.append({"name": "openai", "port": w.serving.openai.port, "targetPort": "openai", "protocol": "TCP"})
    return ports


def endpoint(w: ServeWorkloadConfig) -> str:
    return f"http://{w.name}.{w.namespace}.svc.cluster.local:{w.serving.port}{rest_path(w)}"


def port_forward_command(w: ServeWorkloadConfig) -> str:
    return f"kubectl -n {w.namespace} port-forward svc/{w.name} {w.serving.port}:{w.serving.port}"


@dataclass(frozen=True)
class ModelServerArgs:
    workload: ServeWorkloadConfig
    placement: Placement
    image_ref: pulumi.Input[str]  # the stack's image (workloads.<name>.image overrides)
    hf_token: pulumi.Output[str] | None = None
    bucket: gcs_fuse.BucketAccess | None = None  # the stack's bucket, mounted when gcsFuse.enabled
    protect: bool = False  # the cluster's deletion protection: a production endpoint is not deleted by accident


def _depends_on(opts: pulumi.ResourceOptions | None) -> list[pulumi.Resource]:
    """The component's own depends_on (its GPU pool): Pulumi does not pass it on to children."""
    deps = opts.depends_on if opts else None
    if deps is None:
        return []
    return [d for d in (deps if isinstance(deps, list) else [deps]) if isinstance(d, pulumi.Resource)]


class ModelServer(pulumi.ComponentResource):
    """Pass the cluster's Kubernetes provider and `depends_on=[<the pool's GpuNodePool>]` in `opts`."""

    namespace: k8s.core.v1.Namespace
    config_map: k8s.core.v1.ConfigMap
    token: k8s.core.v1.Secret | None
    service_account: k8s.core.v1.ServiceAccount | None
    deployment: k8s.apps.v1.Deployment
    service: k8s.core.v1.Service
    disruption_budget: k8s.policy.v1.PodDisruptionBudget
    network_policy: k8s.networking.v1.NetworkPolicy
    autoscaler: k8s.autoscaling.v2.HorizontalPodAutoscaler | None
    summary: pulumi.Output[dict[str, Any]]

    def __init__(self, name: str, args: ModelServerArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepspeed-stack:workloads:ModelServer", name, None, opts)
        w = args.workload
        child = pulumi.ResourceOptions(parent=self)
        self.namespace = k8s.core.v1.Namespace(
            f"{name}-ns", metadata=k8s.meta.v1.ObjectMetaArgs(name=w.namespace, labels=labels(w)), opts=child)
        ns = self.namespace.metadata.name
        self.config_map = k8s.core.v1.ConfigMap(
            f"{name}-server",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=f"{w.name}-server", namespace=ns, labels=labels(w)),
            data=script_files(), opts=child)
        self.token = self._token(name, w, ns, args.hf_token)
        access = args.bucket if w.gcs_fuse.enabled else None
        self.service_account = gcs_fuse.service_account(f"{name}-ksa", ns, access, child) if access else None
        self.deployment = self._deployment(name, args, ns, access, opts)
        self.service = self._service(name, w, ns, args.protect)
        self.disruption_budget = k8s.policy.v1.PodDisruptionBudget(
            f"{name}-pdb",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=w.name, namespace=ns, labels=labels(w)),
            # One server at a time may go for a node upgrade or drain; a single replica is not held forever.
            spec=k8s.policy.v1.PodDisruptionBudgetSpecArgs(
                max_unavailable=1, selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector(w))),
            opts=child)
        self.network_policy = self._network_policy(name, w, ns)
        self.autoscaler = self._autoscaler(name, w, ns) if w.serving.autoscaling.enabled else None
        lb_ip = self.service.status.apply(_ingress_ip) if w.serving.service == "InternalLoadBalancer" else None
        self.summary = pulumi.Output.from_input({
            "kind": "serve", "deployment": w.name, "namespace": ns, "pool": w.pool,
            "model": model_ref(w),
            "gpusPerReplica": args.placement.per_worker, "replicas": w.serving.replicas,
            "endpoint": endpoint(w), "portForward": port_forward_command(w),
            **({"loadBalancerIp": lb_ip} if lb_ip is not None else {}),
        })
        self.register_outputs({"namespace": ns, "deployment": self.deployment.metadata.name,
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

    def _deployment(self, name: str, args: ModelServerArgs, ns: pulumi.Output[str],
                    access: gcs_fuse.BucketAccess | None, opts: pulumi.ResourceOptions | None,
                    ) -> k8s.apps.v1.Deployment:
        w, where = args.workload, args.placement
        image = pulumi.Output.from_input(w.image or args.image_ref)
        secret = self.token.metadata.name if self.token is not None else None

        def template(values: list) -> dict[str, Any]:
            image_ref, secret_name, bucket = values
            gcs = gcs_fuse.GcsMount(bucket, w.gcs_fuse.mount_path, access.kubernetes_service_account) \
                if access else None
            return pod_template(ServerInputs(w, where, image_ref, f"{w.name}-server", secret_name, gcs))

        timeout = (w.serving.startup_minutes + NODE_PROVISIONING_MINUTES) * 60
        surge = rollout(w, where)
        return k8s.apps.v1.Deployment(
            f"{name}-deployment",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=w.name, namespace=ns, labels=labels(w)),
            spec=k8s.apps.v1.DeploymentSpecArgs(
                # With an autoscaler the HPA owns the count; Pulumi setting it too would undo every scaling.
                replicas=None if w.serving.autoscaling.enabled else w.serving.replicas,
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector(w)),
                strategy=k8s.apps.v1.DeploymentStrategyArgs(
                    type="RollingUpdate", rolling_update=k8s.apps.v1.RollingUpdateDeploymentArgs(
                        max_surge=surge["maxSurge"], max_unavailable=surge["maxUnavailable"])),
                progress_deadline_seconds=timeout,
                revision_history_limit=5,
                template=pulumi.Output.all(image, secret, access.bucket if access else None).apply(template),
            ),
            opts=pulumi.ResourceOptions(
                parent=self,
                # Only the Deployment needs GPU nodes: it alone waits for the pool the component depends on.
                depends_on=[*_depends_on(opts), self.config_map,
                            *(r for r in (self.token, self.service_account) if r is not None)],
                # `pulumi up` waits for the rollout: a new GPU node plus the weight download and load.
                custom_timeouts=pulumi.CustomTimeouts(create=f"{timeout}s", update=f"{timeout}s"),
                delete_before_replace=True,  # a fixed name: a replacement must not collide with the old one
                protect=args.protect,
            ),
        )

    def _service(self, name: str, w: ServeWorkloadConfig, ns: pulumi.Output[str], protect: bool) -> k8s.core.v1.Service:
        internal_lb = w.serving.service == "InternalLoadBalancer"
        return k8s.core.v1.Service(
            f"{name}-service",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=w.name, namespace=ns, labels=labels(w),
                annotations={INTERNAL_LB_ANNOTATION: "Internal"} if internal_lb else None),
            spec=k8s.core.v1.ServiceSpecArgs(
                type="LoadBalancer" if internal_lb else "ClusterIP",
                selector=selector(w),
                ports=[k8s.core.v1.ServicePortArgs(name=p["name"], port=p["port"], target_port=p["targetPort"],
                                                   protocol=p["protocol"]) for p in service_ports(w)],
                # Local keeps the client's address, so the NetworkPolicy's CIDRs see who really connects.
                external_traffic_policy="Local" if internal_lb else None,
            ),
            opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True, protect=protect),
        )

    def _network_policy(self, name: str, w: ServeWorkloadConfig,
                        ns: pulumi.Output[str]) -> k8s.networking.v1.NetworkPolicy:
        peers = network_peers(w.serving.allow_from)
        ports = [k8s.networking.v1.NetworkPolicyPortArgs(port=p["port"], protocol="TCP") for p in service_ports(w)]
        ingress = [k8s.networking.v1.NetworkPolicyIngressRuleArgs(from_=[_peer_args(p) for p in peers], ports=ports)] \
            if peers else []
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

    def _autoscaler(self, name: str, w: ServeWorkloadConfig,
                    ns: pulumi.Output[str]) -> k8s.autoscaling.v2.HorizontalPodAutoscaler:
        a = w.serving.autoscaling
        return k8s.autoscaling.v2.HorizontalPodAutoscaler(
            f"{name}-hpa",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=w.name, namespace=ns, labels=labels(w)),
            spec=k8s.autoscaling.v2.HorizontalPodAutoscalerSpecArgs(
                scale_target_ref=k8s.autoscaling.v2.CrossVersionObjectReferenceArgs(
                    api_version="apps/v1", kind="Deployment", name=w.name),
                min_replicas=w.serving.replicas, max_replicas=max(a.max_replicas, w.serving.replicas),
                metrics=[k8s.autoscaling.v2.MetricSpecArgs(
                    type="Resource", resource=k8s.autoscaling.v2.ResourceMetricSourceArgs(
                        name="cpu", target=k8s.autoscaling.v2.MetricTargetArgs(
                            type="Utilization", average_utilization=a.cpu_utilization)))],
            ),
            opts=pulumi.ResourceOptions(parent=self),  # it names the Deployment; it need not wait for it
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
