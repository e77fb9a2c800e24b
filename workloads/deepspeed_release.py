"""DeepSpeedRelease: the Bitnami DeepSpeed Helm chart (a client + SSH workers) on one GKE GPU pool.

The component creates the workload's Namespace, a ConfigMap with the launch script and the generated
`ds_config.json` (the chart mounts it at /app on the client and on every worker), a Secret with the
Hugging Face token when the stack has one, and the Helm release. Values are built from the typed
config; the image is the stack's own, pinned by digest, never the chart's default (Bitnami moved its
images to docker.io/bitnamilegacy in August 2025).
"""

from __future__ import annotations

import copy
import json
import shlex
from typing import Any

import msgspec
import pulumi
import pulumi_kubernetes as k8s

from model.types import HelmWorkloadConfig
from recipes.contract import HERE as RECIPES_DIR
from recipes.contract import HF_TOKEN_PATH_ENV, program_sources
from workloads import fabric, gcs_fuse, pod_security, recovery
from workloads.ds_config import build_ds_config, nvme_volume, runs_hf_trainer
from workloads.placement import CONFIG_DIGEST_ANNOTATION, SYSTEM_POOL_SELECTOR, Placement, config_digest
from workloads.placement import labels as workload_labels

SCRIPTS_DIR = RECIPES_DIR  # recipes/
CHART = "deepspeed"
# The chart mounts the source ConfigMap at /app (client and workers) and its generated hostfile
# (`<worker>-N.<worker>-headless slots=<slotsPerNode>`) as /job/hostfile on the client.
SOURCE_DIR = "/app"
HOSTFILE = "/job/hostfile"
DS_CONFIG_FILE = "ds_config.json"
SHM_VOLUME = "dshm"
TOKEN_VOLUME = "hf-token"
TOKEN_KEY = "HF_TOKEN"
# The token reaches the pods only as a read-only file from the Secret, never as env (checkov CKV_K8S_35; and ranks
# that DeepSpeed starts over SSH (pdsh) would not see the container's env anyway). `.deepspeed_env` in /app
# (DeepSpeed's runner exports its lines to every rank) and the pods' env name it in HF_TOKEN_PATH, which
# huggingface_hub reads the token from, so only the path is on a command line or in a log.
# Not under $HF_HOME: a mount point there would leave root-owned directories in the writable cache.
HF_TOKEN_DIR = "/etc/huggingface"
HF_TOKEN_FILE = f"{HF_TOKEN_DIR}/token"
DEEPSPEED_ENV_FILE = ".deepspeed_env"
# GPU nodes scale from zero: node creation, driver install and a multi-GB image pull take minutes, so
# the release waits up to 30 minutes for the client and workers to be ready before it counts as failed.
RELEASE_TIMEOUT_SECONDS = 1800
MAX_HISTORY = 5


class DeepSpeedReleaseArgs(msgspec.Struct, frozen=True):
    workload: HelmWorkloadConfig
    placement: Placement
    image_ref: pulumi.Input[str]  # HOST/PROJECT/REPO/NAME@sha256:... (the stack's image output)
    hf_token: pulumi.Output[str] | None = None
    bucket: gcs_fuse.BucketAccess | None = None  # the stack's bucket, mounted when gcsFuse.enabled


def image_values(ref: str) -> dict[str, str]:
    """`HOST/PATH/NAME@sha256:...` (or `:TAG`) -> the chart's image registry, repository and digest (or tag)."""
    name, _, digest = ref.partition("@")
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        registry, repository = first, rest
    else:  # no registry host: Docker Hub, as docker pull reads it
        registry, repository = "docker.io", name
    if digest:
        return {"registry": registry, "repository": repository, "digest": digest}
    repository, _, tag = repository.partition(":")
    return {"registry": registry, "repository": repository, "tag": tag or "latest"}


def launch_command(w: HelmWorkloadConfig, where: Placement | None = None) -> str:
    """What the client runs once the workers answer on SSH; launch.command replaces it. On a GPU fabric
    each rank runs through the fabric's NCCL env script (workloads/fabric.py)."""
    if w.launch.command:
        return w.launch.command
    script = [w.launch.script, "--deepspeed_config", DS_CONFIG_FILE, *w.launch.args]
    # --force_multi: the client is not in the hostfile. With one worker DeepSpeed would otherwise start the
    # training on the client itself, against the worker's address as master, and hang (found by make e2e).
    deepspeed = ["deepspeed", "--force_multi", "--hostfile", HOSTFILE]
    if fabric.pod_contract(where) is None:
        return f"cd {SOURCE_DIR} && " + " ".join(shlex.quote(p) for p in [*deepspeed, *script])
    launcher = " ".join(shlex.quote(p) for p in [*deepspeed, *fabric.LAUNCH_FLAGS])
    rank = fabric.rank_command(f"{SOURCE_DIR}/{fabric.ENV_SCRIPT}")
    return f"cd {SOURCE_DIR} && {launcher} {rank} " + " ".join(shlex.quote(p) for p in script)


def source_files(w: HelmWorkloadConfig, per_worker: int, with_token: bool = False,
                 where: Placement | None = None) -> dict[str, str]:
    """The source ConfigMap's files: the launch script (when it exists), the generated ds_config.json and,
    with a token, the `.deepspeed_env` that points every rank at the token file."""
    ds = build_ds_config(w.deepspeed, w.workers, per_worker, hf_trainer=runs_hf_trainer(w.launch.script))
    files = {DS_CONFIG_FILE: json.dumps(ds, indent=2) + "\n", **recovery.stop_ranks_file()}
    if with_token:
        files[DEEPSPEED_ENV_FILE] = f"{HF_TOKEN_PATH_ENV}={HF_TOKEN_FILE}\n"
    contract = fabric.pod_contract(where)
    if contract is not None:
        files.update(contract.files())
    script = SCRIPTS_DIR / w.launch.script
    if script.is_file():  # a config check requires it unless launch.command is set
        files.update(program_sources(w.launch.script))  # its modules, and recipes.py: the package's __init__
    return files


# The client only launches the job: DeepSpeed's runner starts the ranks on the workers over ssh (pdsh), and the chart
# probes it with `python -c "import deepspeed"`. `import deepspeed, deepspeed.launcher.runner` took 249 MB of RSS on
# the e2e venv's CPU torch (measured 2026-11-23); CUDA torch maps more [U]. 2Gi holds the runner and a probe's
# second interpreter; 1 CPU keeps the import well inside the probes' 60-90 s timeouts (chart values.yaml).
CLIENT_RESOURCES = {"cpu": "1", "memory": "2Gi"}


def _placement_values(w: HelmWorkloadConfig, where: Placement, worker: bool) -> dict[str, Any]:
    """Workers (and a `chart.clientGpu` client) take the pool's GPUs; the client otherwise runs on the system pool
    with CPU and memory only, so it holds no GPU node (on an A3 pool: an idle 8-GPU node)."""
    if not worker and not w.chart.client_gpu:
        resources = dict(CLIENT_RESOURCES)
        return {"resources": {"requests": resources, "limits": dict(resources)},
                "nodeSelector": dict(SYSTEM_POOL_SELECTOR), "tolerations": []}
    limits = where.limits()
    out: dict[str, Any] = {"resources": {"requests": dict(limits), "limits": dict(limits)},
                           "nodeSelector": dict(where.node_selector),
                           "tolerations": [dict(t) for t in where.tolerations]}
    if where.affinity:
        out["affinity"] = copy.deepcopy(where.affinity)  # spot first, the fallback pool when it has no room
    return out


def _pod_values(w: HelmWorkloadConfig, where: Placement, token_secret: str | None,
                gcs: gcs_fuse.GcsMount | None = None, worker: bool = True) -> dict[str, Any]:
    """What client and workers share: placement and resources, /dev/shm, the token and the bucket."""
    volumes: list[dict[str, Any]] = [
        # NCCL and PyTorch data loaders need far more shared memory than the container runtime's 64 MiB.
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": w.resources.shm_size}},
    ]
    mounts: list[dict[str, Any]] = [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}]
    nvme = nvme_volume(w.deepspeed)
    if nvme:
        volumes.append(nvme[0])
        mounts.append(nvme[1])
    files = source_files(w, where.per_worker, with_token=token_secret is not None, where=where)
    pod: dict[str, Any] = {
        # A new script or ds_config.json rolls the client and workers (the chart hashes only its own ConfigMap).
        "podAnnotations": {CONFIG_DIGEST_ANNOTATION: config_digest(files)},
        **_placement_values(w, where, worker),
        **security_values(),
    }
    if token_secret:
        volumes.append({"name": TOKEN_VOLUME, "secret": {"secretName": token_secret, "defaultMode": 0o440,
                                                         "items": [{"key": TOKEN_KEY, "path": "token"}]}})
        mounts.append({"name": TOKEN_VOLUME, "mountPath": HF_TOKEN_DIR, "readOnly": True})
        pod["extraEnvVars"] = [{"name": HF_TOKEN_PATH_ENV, "value": HF_TOKEN_FILE}]  # the path, not the token
    if gcs:
        volumes.append(gcs_fuse.volume(gcs))
        mounts.append(gcs_fuse.volume_mount(gcs))
        pod["podAnnotations"].update(gcs_fuse.POD_ANNOTATIONS)
        # The component creates the Workload Identity account; the chart must use it, not make its own.
        pod["serviceAccount"] = {"create": False, "name": gcs.service_account}
    pod["extraVolumes"] = volumes
    pod["extraVolumeMounts"] = mounts
    _apply_fabric(pod, fabric.pod_contract(where), worker)
    return pod


def security_values() -> dict[str, Any]:
    """The chart's hardening of the client and the workers, set here rather than left to its defaults (the same
    values in chart 2.3.x, bitnami/deepspeed values.yaml): a chart whose defaults loosen cannot loosen the release.
    The chart gives the read-only root filesystem its writable emptyDirs itself."""
    return {"automountServiceAccountToken": False,
            "containerSecurityContext": {"enabled": True,
                                         **pod_security.container_security_context(pod_security.NVIDIA_USER)}}


def _apply_fabric(pod: dict[str, Any], contract: fabric.PodContract | None, worker: bool) -> None:
    """The GPU fabric's pod contract: the client only needs the NCCL environment (DeepSpeed passes NCCL_* on
    to every rank); workers, where the ranks run, get the NICs, the daemon, the libraries and /dev/shm, and the
    daemon's waivers as checkov's skip annotations (for a scan of the running pods)."""
    if contract is None:
        return
    pod["extraEnvVars"] = [*pod.get("extraEnvVars", []), *contract.env]
    if not worker:
        return
    pod["podAnnotations"].update(contract.annotations)
    pod["podAnnotations"].update(pod_security.skip_annotations(contract.waivers))
    pod["extraVolumes"] += contract.volumes
    pod["extraVolumeMounts"] += contract.mounts
    if contract.sidecars:
        pod["initContainers"] = [*pod.get("initContainers", []), *contract.sidecars]
    if contract.shm_size:
        shm = next(v for v in pod["extraVolumes"] if v["name"] == SHM_VOLUME)
        shm["emptyDir"]["sizeLimit"] = contract.shm_size


def chart_fullname(release: str) -> str:
    """Bitnami common's `common.names.fullname` without fullnameOverride/nameOverride: the release name when it
    contains the chart's name, else `<release>-deepspeed`, cut to 63 characters (bitnami/charts
    bitnami/common/templates/_names.tpl)."""
    full = release if CHART in release else f"{release}-{CHART}"
    return full[:63].rstrip("-")


def client_label(release: str) -> str:
    """The pod label the chart's worker NetworkPolicy admits to the workers' SSH port when
    `worker.networkPolicy.allowExternal` is false: `<fullname>-client: "true"`
    (bitnami/deepspeed templates/worker/networkpolicy.yaml)."""
    return f"{chart_fullname(release)}-client"


def chart_values(w: HelmWorkloadConfig, where: Placement, image: dict[str, str], source_config_map: str,
                 token_secret: str | None = None, gcs: gcs_fuse.GcsMount | None = None) -> dict[str, Any]:
    """The chart's values for this workload (validated in tests against the chart's values.yaml and schema)."""
    return {
        # Our own image is not one Bitnami signed; without this the chart refuses to render.
        "global": {"security": {"allowInsecureImages": True}},
        "image": {**image, "pullPolicy": "IfNotPresent"},
        # configmap (never git): the git-clone init container would pull docker.io/bitnami/git.
        "source": {"type": "configmap", "existingConfigMap": source_config_map,
                   "launchCommand": launch_command(w, where)},
        # The os-shell init container (docker.io/bitnami/os-shell) stays off; no PVC needs chown.
        "volumePermissions": {"enabled": False},
        # A Deployment, not a Job: the chart's Job template sets no restartPolicy, which the API rejects.
        # The client carries the label the workers' NetworkPolicy admits to SSH; nothing else in the cluster may
        # reach port 2222 (the chart's default, allowExternal: true, admits any pod).
        "client": {"enabled": True, "useJob": False, "podLabels": {client_label(w.name): "true"},
                   **_pod_values(w, where, token_secret, gcs, worker=False),
                   # A restarted client relaunches and the script resumes from its checkpoint (workloads/recovery.py).
                   "terminationGracePeriodSeconds": str(recovery.grace_seconds(w))},
        "worker": {"enabled": True, "replicaCount": w.workers, "slotsPerNode": where.per_worker,
                   "networkPolicy": {"enabled": True, "allowExternal": False},
                   **_pod_values(w, where, token_secret, gcs),
                   # The ranks run on the workers, whose main process is sshd: the hook gives them the notice.
                   "lifecycleHooks": recovery.stop_ranks_hook(SOURCE_DIR, recovery.grace_seconds(w)),
                   "terminationGracePeriodSeconds": str(recovery.grace_seconds(w))},
    }


def _depends_on(opts: pulumi.ResourceOptions | None) -> list[pulumi.Resource]:
    """The component's own depends_on (its GPU pool): Pulumi does not pass it on to children."""
    deps = opts.depends_on if opts else None
    if deps is None:
        return []
    return [d for d in (deps if isinstance(deps, list) else [deps]) if isinstance(d, pulumi.Resource)]


def _mount(w: HelmWorkloadConfig, access: gcs_fuse.BucketAccess | None, bucket: str | None) -> gcs_fuse.GcsMount | None:
    if access is None or bucket is None:
        return None
    return gcs_fuse.GcsMount(bucket=bucket, mount_path=w.gcs_fuse.mount_path,
                             service_account=access.kubernetes_service_account)


def _status(status: Any) -> str:
    """Helm's release status (deployed, failed, ...); "pending" until the provider reports one."""
    value = status.get("status") if isinstance(status, dict) else getattr(status, "status", None)
    return value or "pending"


class DeepSpeedRelease(pulumi.ComponentResource):
    """Pass the cluster's Kubernetes provider and `depends_on=[<the pool's GpuNodePool>]` in `opts`."""

    def __init__(self, name: str, args: DeepSpeedReleaseArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepspeed-stack:workloads:DeepSpeedRelease", name, None, opts)
        w, where = args.workload, args.placement
        labels = workload_labels(w)
        child = pulumi.ResourceOptions(parent=self)
        self.namespace = k8s.core.v1.Namespace(
            f"{name}-ns", metadata=k8s.meta.v1.ObjectMetaArgs(name=w.namespace, labels=labels), opts=child)
        ns = self.namespace.metadata.name
        self.source = k8s.core.v1.ConfigMap(
            f"{name}-source",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=f"{w.name}-source", namespace=ns, labels=labels),
            data=source_files(w, where.per_worker, with_token=args.hf_token is not None, where=where),
            opts=child,
        )
        self.token: k8s.core.v1.Secret | None = self._token_secret(name, w, ns, labels, args.hf_token)
        image = pulumi.Output.from_input(w.image or args.image_ref)  # workloads.<name>.image overrides
        access = args.bucket if w.gcs_fuse.enabled else None
        self.service_account = gcs_fuse.service_account(f"{name}-ksa", ns, access, child) if access else None
        values = pulumi.Output.all(
            image, self.source.metadata.name, self.token.metadata.name if self.token else None,
            access.bucket if access else None,
        ).apply(lambda v: chart_values(w, where, image_values(v[0]), v[1], v[2], _mount(w, access, v[3])))
        self.release = k8s.helm.v3.Release(
            f"{name}-release",
            k8s.helm.v3.ReleaseArgs(
                name=w.name,
                chart=f"{w.chart.repository.rstrip('/')}/{CHART}",  # oci://...: no repositoryOpts for OCI
                version=w.chart.version,
                namespace=ns,
                values=values,
                # atomic: a release that does not become ready in time is rolled back (uninstalled on the
                # first install) instead of leaving GPU nodes running half a deployment.
                atomic=True,
                cleanup_on_fail=True,
                timeout=RELEASE_TIMEOUT_SECONDS,
                # No Jobs (client.useJob is false); awaiting readiness is what makes `status` meaningful.
                wait_for_jobs=False,
                skip_await=False,
                max_history=MAX_HISTORY,
            ),
            # Only the release needs GPU nodes: it alone waits for the pool the component depends on.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[
                *_depends_on(opts), self.source,
                *(r for r in (self.token, self.service_account) if r is not None)]),
        )
        self.release_name: pulumi.Output[str] = self.release.name
        self.namespace_name: pulumi.Output[str] = ns
        self.status: pulumi.Output[str] = self.release.status.apply(_status)
        self.summary: pulumi.Output[dict[str, Any]] = pulumi.Output.from_input({
            "kind": "helm", "release": self.release_name, "namespace": self.namespace_name, "status": self.status,
            "chart": f"{CHART} {w.chart.version}", "pool": w.pool, "workers": w.workers,
            "gpusPerWorker": where.per_worker,
        })
        self.register_outputs({"releaseName": self.release_name, "namespace": self.namespace_name,
                               "status": self.status})

    def _token_secret(self, name: str, w: HelmWorkloadConfig, ns: pulumi.Output[str], labels: dict[str, str],
                      token: pulumi.Output[str] | None) -> k8s.core.v1.Secret | None:
        """The HF token as a Secret the pods mount as a file; it stays a Pulumi secret. None without a token."""
        if token is None:
            return None
        secret_token = pulumi.Output.secret(token)
        return k8s.core.v1.Secret(
            f"{name}-hf-token",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=f"{w.name}-hf-token", namespace=ns, labels=labels),
            type="Opaque",
            string_data={TOKEN_KEY: secret_token},
            opts=pulumi.ResourceOptions(parent=self, additional_secret_outputs=["data", "stringData"]),
        )
