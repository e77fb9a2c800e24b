"""TrainingJob: one `mpijob` workload: Namespace, shared claim, HF token Secret, ds_config ConfigMap, image pull
Secret (a private registry), NetworkPolicies, MPIJob.

Give the component `depends_on` the GKE pool the workers run on: children register only once their parent has,
so everything inside waits for it, and is deleted before it. What admits the MPIJob (the MPI operator, Kueue's
release for a queued job) goes in `TrainingJobArgs.admitted_by`: the MPIJob alone waits for it.

Core objects use pulumi_kubernetes' typed Args; the MPIJob is a CustomResource whose spec comes from
`workloads.mpijob.render_spec` (a plain dict, validated in tests against the operator's CRD).
"""

from __future__ import annotations

from typing import Any

import msgspec
import pulumi
import pulumi_kubernetes as k8s

from model.types import MpiJobBaseConfig
from workloads import gcs_fuse, kueue, maintenance, mpijob, network_policy, pull_secret
from workloads.placement import Placement, labels


class TrainingJobArgs(msgspec.Struct, frozen=True):
    config: MpiJobBaseConfig
    placement: Placement
    # The stack's built image (nvidia); Gaudi jobs use Habana's image unless `image` overrides.
    stack_image: pulumi.Input[str] | None = None
    hf_token: pulumi.Output[str] | None = None
    # What the claim waits for: the NFS provisioner (its storage class) when the stack installs it.
    claim_depends_on: list[pulumi.Resource] = msgspec.field(default_factory=list)
    bucket: gcs_fuse.BucketAccess | None = None  # the stack's bucket, mounted when gcsFuse.enabled
    operator_version: str = "v0.8.0"  # mpiOperator.version: the fields the cluster's operator knows
    gaudi_image: pulumi.Input[str] | None = None  # the stack's Gaudi image, pinned by digest
    registry: pull_secret.RegistryLogin | None = None  # credentials the pods pull the image with
    queue: str | None = None  # the Kueue LocalQueue the job waits in (workloads/kueue.py); None: not queued
    # On an existing cluster the namespace and the claim may predate the stack (adopted, see ExistingCluster):
    # `pulumi destroy` leaves them, and the claim's data, in place.
    retain_on_delete: bool = False
    # On an existing cluster, the provider of the namespace and the claim (ExistingCluster.provider: it adopts them);
    # the rest, the MPIJob first, goes through the parent's, which adopts nothing (ExistingCluster.create_only): an
    # MPIJob of the same name that the stack did not create (Omnia's by-hand run) stops `pulumi up` and stays,
    # instead of being taken over and deleted with its logs on destroy. None: the parent's provider for all.
    adopt_provider: pulumi.ProviderResource | None = None
    # A kind built on the NVIDIA MPIJob's own launch (workloads/mpijob/nvidia.py); None: the workload's `launch`.
    launch: mpijob.NvidiaLaunch | None = None
    # The bucket's GCS FUSE mount options (data/gcs_fuse.yaml's profiles): a kind that checkpoints there says so.
    gcs_mount_options: str = gcs_fuse.MOUNT_OPTIONS
    # What admits the MPIJob (kinds.Platform.mpijob_admitted_by): the MPI operator, and Kueue's release for a queued
    # job; the MPIJob alone waits for them.
    admitted_by: list[pulumi.Resource] = msgspec.field(default_factory=list)


# The size of a claim the stack adopts: left as it is on every update (TrainingJob._claim).
ADOPTED_CLAIM_SIZE = "spec.resources.requests.storage"


class TrainingJob(pulumi.ComponentResource):
    def __init__(self, name: str, args: TrainingJobArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepspeed-stack:workloads:TrainingJob", name, None, opts)
        w, where = args.config, args.placement
        self.namespace = k8s.core.v1.Namespace(
            f"{name}-namespace",
            # A queued job's namespace is one Kueue manages (its webhooks see only those).
            metadata=k8s.meta.v1.ObjectMetaArgs(name=w.namespace, labels={**labels(w),
                                                                          **kueue.namespace_labels(args.queue)}),
            opts=pulumi.ResourceOptions(parent=self, provider=args.adopt_provider,
                                        retain_on_delete=args.retain_on_delete),
        )
        ns = self.namespace.metadata.name
        self.claim = self._claim(name, w, ns, args.claim_depends_on, args.retain_on_delete, args.adopt_provider)
        self.hf_token = self._token(name, w, ns, args.hf_token) if args.hf_token is not None else None
        self.config_map = k8s.core.v1.ConfigMap(
            f"{name}-config",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=mpijob.config_map_name(w.name), namespace=ns, labels=labels(w)),
            data=mpijob.config_map_data(w, where, has_token=args.hf_token is not None, launch=args.launch),
            opts=pulumi.ResourceOptions(parent=self),
        )
        access = args.bucket if w.gcs_fuse.enabled else None
        self.service_account: k8s.core.v1.ServiceAccount | None = gcs_fuse.service_account(
            f"{name}-ksa", ns, access, pulumi.ResourceOptions(parent=self)) if access else None
        self.pull_secret: k8s.core.v1.Secret | None = pull_secret.secret(
            f"{name}-pull-secret", pull_secret.name(w.name), ns, labels(w), args.registry,
            pulumi.ResourceOptions(parent=self)) if args.registry is not None else None
        self.network_policies: list[k8s.networking.v1.NetworkPolicy] = [k8s.networking.v1.NetworkPolicy(
            f"{name}-{role}-policy",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=network_policy.names(w)[role], namespace=ns, labels=labels(w)),
            spec=spec,
            opts=pulumi.ResourceOptions(parent=self),
        ) for role, spec in network_policy.specs(w).items()]
        # The launcher's maintenance watch may read the workers and their nodes and evict the workers: granted to
        # the bucket's account, else to the launcher's own (never the namespace's default, which every pod shares).
        watched = maintenance.watched(w, where)
        self.launcher_account: k8s.core.v1.ServiceAccount | None = k8s.core.v1.ServiceAccount(
            f"{name}-launcher-ksa",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=maintenance.launcher_account(w), namespace=ns, labels=labels(w)),
            automount_service_account_token=False,  # only the watch's container mounts a token (projected)
            opts=pulumi.ResourceOptions(parent=self)) if watched and not access else None
        account = access.kubernetes_service_account if access else maintenance.launcher_account(w)
        holder = self.service_account or self.launcher_account
        self.maintenance_access = [_rbac(f"{name}-maintenance-{o['kind'].lower()}", o, ns, pulumi.ResourceOptions(
            parent=self, depends_on=[holder] if holder else None))
            for o in (maintenance.access(w, account) if watched else [])]
        self.job: k8s.apiextensions.CustomResource = self._job(name, args, ns)
        self.summary: pulumi.Output[dict[str, Any]] = pulumi.Output.from_input({
            "kind": w.kind, "job": w.name, "namespace": ns, "claim": w.storage.claim_name,
            "accelerator": where.resource, "acceleratorsPerWorker": where.per_worker, "workers": w.workers,
            "pool": w.pool,
        })
        self.register_outputs({"namespace": ns, "claim": self.claim.metadata.name, "job": w.name})

    def _claim(self, name: str, w: MpiJobBaseConfig, ns: pulumi.Output[str], depends_on: list[pulumi.Resource],
               retain: bool = False,
               provider: pulumi.ProviderResource | None = None) -> k8s.core.v1.PersistentVolumeClaim:
        s = w.storage
        return k8s.core.v1.PersistentVolumeClaim(
            f"{name}-claim",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=s.claim_name, namespace=ns, labels=labels(w)),
            spec=k8s.core.v1.PersistentVolumeClaimSpecArgs(
                # ReadWriteMany: the launcher and the workers run on different nodes and mount it at once.
                access_modes=[s.access_mode],
                storage_class_name=s.storage_class,
                resources=k8s.core.v1.VolumeResourceRequirementsArgs(requests={"storage": s.size}),
            ),
            # An adopted claim (Omnia's shared-model, made by hand) keeps its size after the first `pulumi up`: a
            # later storage.size is not applied over it (Kubernetes never shrinks a claim, and grows one only on a
            # class with allowVolumeExpansion). The first apply sends storage.size, which the stack cannot compare
            # with the claim's offline: the preview's "Existing objects" says so (preview/sections/adopted.py).
            opts=pulumi.ResourceOptions(parent=self, provider=provider, depends_on=depends_on or None,
                                        retain_on_delete=retain,
                                        ignore_changes=[ADOPTED_CLAIM_SIZE] if provider is not None else None),
        )

    def _token(self, name: str, w: MpiJobBaseConfig, ns: pulumi.Output[str],
               token: pulumi.Output[str]) -> k8s.core.v1.Secret:
        return k8s.core.v1.Secret(
            f"{name}-hf-token",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=mpijob.token_secret_name(w.name), namespace=ns, labels=labels(w)),
            type="Opaque",
            string_data={mpijob.HF_TOKEN_KEY: pulumi.Output.secret(token)},
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _job(self, name: str, args: TrainingJobArgs, ns: pulumi.Output[str]) -> k8s.apiextensions.CustomResource:
        w, where = args.config, args.placement
        secret_name = self.hf_token.metadata.name if self.hf_token is not None else None
        image = pulumi.Output.from_input(args.stack_image) if args.stack_image is not None else None
        gaudi = pulumi.Output.from_input(args.gaudi_image) if args.gaudi_image is not None else None
        pull = self.pull_secret.metadata.name if self.pull_secret is not None else None

        access = args.bucket if w.gcs_fuse.enabled else None

        def spec(values: list) -> dict:
            stack_image, secret, bucket, gaudi_image, pull_name = values
            gcs = gcs_fuse.GcsMount(bucket, w.gcs_fuse.mount_path, access.kubernetes_service_account,
                                    args.gcs_mount_options) if access else None
            return mpijob.render_spec(mpijob.MpiJobInputs(
                workload=w, placement=where, image=mpijob.launcher_image(w, stack_image, gaudi_image),
                config_map=mpijob.config_map_name(w.name), hf_token_secret=secret, gcs=gcs,
                operator_version=args.operator_version, image_pull_secret=pull_name, queue=args.queue), args.launch)

        return k8s.apiextensions.CustomResource(
            f"{name}-mpijob",
            api_version=mpijob.API_VERSION,
            kind=mpijob.KIND,
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=w.name, namespace=ns, labels={**labels(w), **kueue.job_labels(args.queue)},
                annotations=kueue.job_annotations(args.queue, [where.pool, where.fallback]) or None),
            # The ConfigMap and the claim are referenced by name inside the spec: depend on them explicitly; and on
            # what admits the job (its CRD's controller, Kueue's webhooks).
            spec=pulumi.Output.all(image, secret_name, access.bucket if access else None, gaudi, pull).apply(spec),
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=[self.config_map, self.claim,
                            *[a for a in (self.service_account, self.launcher_account) if a is not None],
                            *args.admitted_by],
                # The operator runs a job once; a changed spec must start a new run, under the same name.
                replace_on_changes=["spec"],
                delete_before_replace=True,
                ignore_changes=kueue.owned_fields(args.queue),
            ),
        )


def _rbac(logical: str, obj: dict[str, Any], ns: pulumi.Output[str],
          opts: pulumi.ResourceOptions) -> pulumi.CustomResource:
    """A Role, RoleBinding, ClusterRole or ClusterRoleBinding from its dict (workloads/maintenance.py access): the
    namespaced ones in the job's Namespace (its output, so they wait for it)."""
    kind, meta = obj["kind"], obj["metadata"]
    namespaced = kind in ("Role", "RoleBinding")
    metadata = k8s.meta.v1.ObjectMetaArgs(name=meta["name"], labels=meta["labels"],
                                          namespace=ns if namespaced else None)
    if kind in ("Role", "ClusterRole"):
        rules = [k8s.rbac.v1.PolicyRuleArgs(api_groups=r["apiGroups"], resources=r["resources"],
                                            resource_names=r.get("resourceNames"), verbs=r["verbs"])
                 for r in obj["rules"]]
        return (k8s.rbac.v1.Role if namespaced else k8s.rbac.v1.ClusterRole)(
            logical, metadata=metadata, rules=rules, opts=opts)
    ref = obj["roleRef"]
    return (k8s.rbac.v1.RoleBinding if namespaced else k8s.rbac.v1.ClusterRoleBinding)(
        logical, metadata=metadata, opts=opts,
        role_ref=k8s.rbac.v1.RoleRefArgs(api_group=ref["apiGroup"], kind=ref["kind"], name=ref["name"]),
        subjects=[k8s.rbac.v1.SubjectArgs(kind=x["kind"], name=x["name"], namespace=ns) for x in obj["subjects"]])
