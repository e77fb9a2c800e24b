"""VertexTraining: what Vertex AI custom training needs, and the CustomJob spec to start runs with.

A training service account with only the roles a run needs, an optional TensorBoard instance, and
the rendered spec as an output (see workloads/vertex_job.py). stop_ranks.py (what vertex_start.sh runs on SIGTERM) and,
with `vertex.finetune`, the recipe's files (finetune.py, its modules, ds_config.json) as objects of the bucket, where
every replica reads them at /gcs/<bucket>/.
"""

from __future__ import annotations

import msgspec
import pulumi
import pulumi_gcp as gcp

from components.node_identity import account_id
from model.types import VertexConfig
from workloads.vertex_job import customjob_spec, vertex_files

TRAINING_ROLES = (
    "roles/aiplatform.user",  # write TensorBoard experiments and read the job's own metadata
    "roles/logging.logWriter",
)


class VertexTrainingArgs(msgspec.Struct, frozen=True):
    project: str
    region: str
    config: VertexConfig
    image_ref: pulumi.Input[str]
    bucket: pulumi.Input[str]
    repository: pulumi.Input[str]
    stack: str = "dev"  # service account ids are per project: the stack name keeps stacks apart


class VertexTraining(pulumi.ComponentResource):
    def __init__(self, name: str, args: VertexTrainingArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepspeed-stack:gcp:VertexTraining", name, None, opts)
        cfg, child = args.config, pulumi.ResourceOptions(parent=self)
        self.account = gcp.serviceaccount.Account(
            f"{name}-sa", project=args.project, account_id=account_id("ds-vertex", args.stack),
            display_name="Vertex AI DeepSpeed training (deepspeed-stack)",
            opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True))  # accountId is fixed
        member = self.account.email.apply(lambda e: f"serviceAccount:{e}")
        for role in TRAINING_ROLES:
            gcp.projects.IAMMember(f"{name}-{role.split('/')[1].replace('.', '-').lower()}",
                                   project=args.project, role=role, member=member, opts=child)
        gcp.storage.BucketIAMMember(f"{name}-objects", bucket=args.bucket, role="roles/storage.objectUser",
                                    member=member, opts=child)
        gcp.artifactregistry.RepositoryIamMember(
            f"{name}-image-reader", project=args.project, location=args.region, repository=args.repository,
            role="roles/artifactregistry.reader", member=member, opts=child)
        self._upload_files(name, args, child)
        tensorboard = None
        if cfg.tensorboard:
            tensorboard = gcp.vertex.AiTensorboard(
                f"{name}-tensorboard", project=args.project, region=args.region,
                display_name=f"{cfg.display_name} (deepspeed-stack)", opts=child).id
        self.spec = pulumi.Output.all(args.image_ref, args.bucket, self.account.email, tensorboard).apply(
            lambda v: customjob_spec(cfg, v[0], v[1], v[2], v[3]))
        self.register_outputs({"serviceAccount": self.account.email, "customJobSpec": self.spec})

    def _upload_files(self, name: str, args: VertexTrainingArgs, opts: pulumi.ResourceOptions) -> None:
        """The GKE ConfigMap's counterpart: what the CustomJob runs, written by `pulumi up`, so a run started from the
        spec runs this stack's recipe, ds_config.json and stop_ranks.py."""
        for object_name, text in vertex_files(args.config).items():
            gcp.storage.BucketObject(f"{name}-{object_name.rsplit('/', 1)[-1].replace('.', '-').replace('_', '-')}",
                                     bucket=args.bucket, name=object_name, content=text, opts=opts)
