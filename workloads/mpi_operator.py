"""MpiOperator: the Kubeflow MPI operator's pinned release manifest (CRD, RBAC, Deployment).

`yaml.v2.ConfigFile` is a provider-side component: the Kubernetes provider fetches and applies the
manifest during `pulumi up`, so the program itself never downloads it (and offline runs under mocks
register only the ConfigFile). Workloads depend on this component so the MPIJob CRD exists first.

What `pulumi destroy` leaves (a transform on the ConfigFile: Pulumi runs a component's transforms on the
children the provider registers for it, www.pulumi.com/docs/iac/concepts/options/transforms/):
- the MPIJob CRD, always: deleting a CustomResourceDefinition deletes every custom object of it in the cluster
  ("When you delete a CustomResourceDefinition, the server will uninstall the RESTful API endpoint and delete all
  custom objects stored in it", kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/
  custom-resource-definitions/#delete-a-customresourcedefinition), so every MPIJob of every user would go with
  the stack. Uninstalling the CRD is left to the user (the preview says so).
- on an existing cluster, every object of the release: the operator may have been there before the stack
  (`install: true` on a cluster that has one adopts it), and other teams' MPIJobs need its controller.
"""

from __future__ import annotations

import msgspec
import pulumi
import pulumi_kubernetes as k8s

from model.types import MpiOperatorConfig

# The v2beta1 deployment of the release, pinned by tag (the schema allows only released versions).
MANIFEST_URL = "https://raw.githubusercontent.com/kubeflow/mpi-operator/{version}/deploy/v2beta1/mpi-operator.yaml"
CRD_TYPE = "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition"
CRD_NAME = "mpijobs.kubeflow.org"


def manifest_url(version: str) -> str:
    return MANIFEST_URL.format(version=version)


def _retained(args: pulumi.ResourceTransformArgs) -> pulumi.ResourceTransformResult:
    return pulumi.ResourceTransformResult(
        props=args.props, opts=pulumi.ResourceOptions.merge(args.opts, pulumi.ResourceOptions(retain_on_delete=True)))


def keep_crds(args: pulumi.ResourceTransformArgs) -> pulumi.ResourceTransformResult | None:
    """The release's CRD outlives the stack (its deletion would delete every MPIJob in the cluster)."""
    return _retained(args) if args.type_ == CRD_TYPE else None


def keep_everything(args: pulumi.ResourceTransformArgs) -> pulumi.ResourceTransformResult | None:
    """On an existing cluster every object of the release outlives the stack (it may predate it)."""
    return _retained(args) if args.custom else None


class MpiOperatorArgs(msgspec.Struct, frozen=True):
    config: MpiOperatorConfig
    own_cluster: bool = True  # the stack's own GKE cluster; False: an existing cluster, where nothing is removed


class MpiOperator(pulumi.ComponentResource):
    def __init__(self, name: str, args: MpiOperatorArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepspeed-stack:workloads:MpiOperator", name, None, opts)
        url = manifest_url(args.config.version)
        self.manifest = k8s.yaml.v2.ConfigFile(
            f"{name}-manifest",
            file=url,
            opts=pulumi.ResourceOptions(parent=self, transforms=[keep_crds if args.own_cluster else keep_everything]),
        )
        self.register_outputs({"version": args.config.version, "manifest": url})
