"""TensorBoardServer: one `tensorboard` workload: a TensorBoard server of the event files finetune workloads write.

finetune.py writes TensorBoard's event files to TENSORBOARD_LOGGING_DIR = <out>/logs/<workload>
(workloads/finetune_progress.py), in the bucket when the run has `gcsFuse.enabled`. The server reads them there:

- a Namespace; the Kubernetes service account `storage.kubernetesServiceAccount`, which Workload Identity maps to
  the bucket's Google account (components/storage.py binds it in every namespace of a bucket reader);
- a Deployment of one pod on the system pool (no GPU node held), running `tensorboard --logdir_spec
  NAME:<mount>/logs/NAME,...` from the stack's image (TensorBoard 2.21.0, data/versions.yaml) over a read-only GCS
  FUSE mount of the bucket; hardened as the stack's other pods of that image (its user 1001, no privilege
  escalation, every capability dropped, read-only root with /tmp an emptyDir, no service-account token: the GCS
  FUSE driver gets the account's token itself), probed on TensorBoard's /data/environment;
- a ClusterIP Service on `tensorboard.port`, and a NetworkPolicy that admits nobody from the network (`kubectl
  port-forward` goes through the kubelet, which no policy stops) and lets out only DNS, HTTPS to Cloud Storage and
  the metadata server's ports (data/tensorboard.yaml).

The Deployment and the Service carry pulumi-kubernetes' skipAwait annotation: `pulumi up` does not wait for the
first pull of the stack's CUDA image onto a system node (minutes) for a server nobody needs for the run to start.
The pod template and the policy are plain dicts (tests validate them: a core/v1 Pod, networking/v1).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import msgspec
import pulumi
import pulumi_kubernetes as k8s

from model import serving_engines
from model.types import FinetuneWorkloadConfig, StackConfig, TensorboardWorkloadConfig
from model.yamlio import load_yaml
from workloads import gcs_fuse, pod_security
from workloads.finetune_progress import logs_folder
from workloads.placement import SYSTEM_POOL_SELECTOR, labels

DATA_PATH = Path(__file__).resolve().parent.parent / "data" / "tensorboard.yaml"
COMPONENT_LABEL = "app.kubernetes.io/component"
USER_ID = pod_security.NVIDIA_USER  # the stack's image's one user (workloads/images/deepspeed/Dockerfile)
TMP_SIZE = "1Gi"  # TensorBoard's own files (its .tensorboard-info under the temporary folder)
PROBE_PERIOD_SECONDS = 10
# Reading every event file once at start through GCS FUSE: a few seconds for a few runs; the listening socket comes
# first, so the startup probe only waits for the interpreter and the plugins.
STARTUP_SECONDS = 300


@functools.cache
def facts() -> dict[str, Any]:
    """data/tensorboard.yaml: the server's command, port, health path, and the pod's egress."""
    return load_yaml(DATA_PATH)


def shown(m: StackConfig, w: TensorboardWorkloadConfig) -> list[FinetuneWorkloadConfig]:
    """The finetune workloads whose runs the server shows: those `tensorboard.workloads` names (in its order), or
    every finetune workload that writes to the bucket. Names that are not such a workload are left out (the kind's
    rules refuse them)."""
    names = w.tensorboard.workloads or sorted(m.workloads)
    found = [m.workloads.get(name) for name in names]
    return [t for t in found if isinstance(t, FinetuneWorkloadConfig) and t.gcs_fuse.enabled]


def log_dir(w: TensorboardWorkloadConfig, trainer: FinetuneWorkloadConfig) -> str:
    """A run's TensorBoard folder as the server's pod sees it: `logs/<workload>` under its own mount of the bucket."""
    return f"{w.gcs_fuse.mount_path.rstrip('/')}/{logs_folder(trainer)}"


def logdir_spec(m: StackConfig, w: TensorboardWorkloadConfig) -> str:
    """--logdir_spec: `NAME:PATH` per run, comma-separated (each run under its workload's name)."""
    return ",".join(f"{t.name}:{log_dir(w, t)}" for t in shown(m, w))


def args(m: StackConfig, w: TensorboardWorkloadConfig) -> list[str]:
    """TensorBoard's flags: the runs, every interface of the pod (the Service and port-forward reach it there), the
    port, how often it reads the files again."""
    tb = w.tensorboard
    return ["--logdir_spec", logdir_spec(m, w), "--host", "0.0.0.0", "--port", str(tb.port),
            "--reload_interval", str(tb.reload_seconds)]


def selector(w: TensorboardWorkloadConfig) -> dict[str, str]:
    return {"deepspeed-stack/workload": w.name, COMPONENT_LABEL: "tensorboard"}


def probes() -> dict[str, dict[str, Any]]:
    get = {"path": facts()["server"]["healthPath"], "port": "http", "scheme": "HTTP"}
    return {
        "startupProbe": {"httpGet": dict(get), "periodSeconds": PROBE_PERIOD_SECONDS, "timeoutSeconds": 5,
                         "failureThreshold": STARTUP_SECONDS // PROBE_PERIOD_SECONDS},
        "readinessProbe": {"httpGet": dict(get), "periodSeconds": PROBE_PERIOD_SECONDS, "timeoutSeconds": 5,
                           "failureThreshold": 3, "successThreshold": 1},
        "livenessProbe": {"httpGet": dict(get), "periodSeconds": 30, "timeoutSeconds": 5, "failureThreshold": 3},
    }


class ServerInputs(msgspec.Struct, frozen=True):
    """What the pod template is rendered from (resolved values, no Outputs)."""

    cfg: StackConfig
    workload: TensorboardWorkloadConfig
    image: str
    gcs: gcs_fuse.GcsMount


def read_only_bucket(gcs: gcs_fuse.GcsMount) -> tuple[dict[str, Any], dict[str, Any]]:
    """(volume, mount): the bucket, read-only in the driver and in the container: the server cannot change a run's
    files (nor anything else of the bucket)."""
    volume = gcs_fuse.volume(gcs)
    volume["csi"]["readOnly"] = True
    return volume, {**gcs_fuse.volume_mount(gcs), "readOnly": True}


def pod_template(inp: ServerInputs) -> dict[str, Any]:
    w, tb = inp.workload, inp.workload.tensorboard
    bucket, bucket_mount = read_only_bucket(inp.gcs)
    tmp, tmp_mount = pod_security.tmp_volume()
    tmp["emptyDir"]["sizeLimit"] = TMP_SIZE
    resources = {"cpu": tb.cpu, "memory": tb.memory}
    container = {
        "name": "tensorboard",
        "image": inp.image,
        "imagePullPolicy": "IfNotPresent",
        "command": [facts()["server"]["command"]],
        "args": args(inp.cfg, w),
        "ports": [{"name": "http", "containerPort": tb.port, "protocol": "TCP"}],
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "volumeMounts": [bucket_mount, tmp_mount],
        **probes(),
        "securityContext": pod_security.container_security_context(USER_ID),
    }
    spec = {
        "automountServiceAccountToken": False,  # the GCS FUSE driver asks for the account's token itself
        "enableServiceLinks": False,
        "serviceAccountName": inp.gcs.service_account,
        "securityContext": pod_security.pod_security_context(USER_ID),
        "nodeSelector": dict(SYSTEM_POOL_SELECTOR),
        "terminationGracePeriodSeconds": 10,
        "containers": [container],
        "volumes": [bucket, tmp],
    }
    return {"metadata": {"labels": {**labels(w), **selector(w)}, "annotations": dict(gcs_fuse.POD_ANNOTATIONS)},
            "spec": spec}


def network_policy_spec(w: TensorboardWorkloadConfig) -> dict[str, Any]:
    """No ingress rule (nobody in the network; port-forward is not subject to it); egress to data/tensorboard.yaml's
    ports only."""
    ports = [{"protocol": p["protocol"], "port": p["port"]} for p in facts()["egress"]]
    return {"podSelector": {"matchLabels": selector(w)}, "policyTypes": ["Ingress", "Egress"], "ingress": [],
            "egress": [{"ports": ports}]}


def port_forward_command(w: TensorboardWorkloadConfig) -> str:
    port = w.tensorboard.port
    return f"kubectl port-forward svc/{w.name} {port}:{port} -n {w.namespace}"


def url(w: TensorboardWorkloadConfig) -> str:
    return f"http://localhost:{w.tensorboard.port}"


def skip_await() -> dict[str, str]:
    return {serving_engines.skip_await_annotation(): "true"}


class TensorBoardArgs(msgspec.Struct, frozen=True):
    cfg: StackConfig
    workload: TensorboardWorkloadConfig
    image_ref: pulumi.Input[str]  # the stack's image (the workload's `image` overrides)
    bucket: gcs_fuse.BucketAccess


class TensorBoardServer(pulumi.ComponentResource):
    """Pass the cluster's Kubernetes provider (and what the pod waits for: the image's read grant) in `opts`."""

    def __init__(self, name: str, args: TensorBoardArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepspeed-stack:workloads:TensorBoardServer", name, None, opts)
        w, access = args.workload, args.bucket
        child = pulumi.ResourceOptions(parent=self)
        self.namespace = k8s.core.v1.Namespace(
            f"{name}-ns", metadata=k8s.meta.v1.ObjectMetaArgs(name=w.namespace, labels=labels(w)), opts=child)
        ns = self.namespace.metadata.name
        self.service_account = gcs_fuse.service_account(f"{name}-ksa", ns, access, child)

        def template(values: list[str]) -> dict[str, Any]:
            image_ref, bucket = values
            gcs = gcs_fuse.GcsMount(bucket, w.gcs_fuse.mount_path, access.kubernetes_service_account)
            return pod_template(ServerInputs(args.cfg, w, image_ref, gcs))

        image = pulumi.Output.from_input(w.image or args.image_ref)
        # The component's own depends_on (the image's read grant): Pulumi does not pass it on to children.
        deps = (opts.depends_on if opts else None) or []
        waits = [d for d in (deps if isinstance(deps, list) else [deps]) if isinstance(d, pulumi.Resource)]
        self.deployment = k8s.apps.v1.Deployment(
            f"{name}-deployment",
            # The waiver of the image's user where a scan of the manifests reads it (not on the pod template).
            metadata=k8s.meta.v1.ObjectMetaArgs(name=w.name, namespace=ns, labels=labels(w), annotations={
                **skip_await(), **pod_security.skip_annotations(pod_security.NVIDIA_IMAGE_UID_WAIVER)}),
            spec=k8s.apps.v1.DeploymentSpecArgs(
                replicas=1, selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector(w)),
                # One pod, no state: the old one goes before the new one starts (no second pod on a small node).
                strategy=k8s.apps.v1.DeploymentStrategyArgs(type="Recreate"), revision_history_limit=3,
                template=pulumi.Output.all(image, access.bucket).apply(template)),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.service_account, *waits],
                                        delete_before_replace=True))
        port = w.tensorboard.port
        self.service = k8s.core.v1.Service(
            f"{name}-service",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=w.name, namespace=ns, labels=labels(w), annotations=skip_await()),
            spec=k8s.core.v1.ServiceSpecArgs(type="ClusterIP", selector=selector(w), ports=[
                k8s.core.v1.ServicePortArgs(name="http", port=port, target_port="http", protocol="TCP")]),
            opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True))
        self.network_policy = k8s.networking.v1.NetworkPolicy(
            f"{name}-netpol",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=w.name, namespace=ns, labels=labels(w)),
            spec=network_policy_spec(w), opts=child)
        shows = [t.name for t in shown(args.cfg, w)]
        self.summary: pulumi.Output[dict[str, Any]] = pulumi.Output.from_input({
            "kind": "tensorboard", "deployment": w.name, "namespace": ns, "workloads": shows,
            "logDirs": {t.name: log_dir(w, t) for t in shown(args.cfg, w)},
            "portForward": port_forward_command(w), "url": url(w)})
        self.register_outputs({"namespace": ns, "deployment": self.deployment.metadata.name,
                               "service": self.service.metadata.name})
