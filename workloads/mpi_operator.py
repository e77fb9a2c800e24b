"""MpiOperator: the Kubeflow MPI operator's pinned release manifest (CRD, RBAC, Deployment).

`yaml.v2.ConfigFile` is a provider-side component: the Kubernetes provider fetches and applies the
manifest during `pulumi up`, so the program itself never downloads it (and offline runs under mocks
register only the ConfigFile). Workloads depend on this component so the MPIJob CRD exists first.
"""

from __future__ import annotations

import msgspec
import pulumi
import pulumi_kubernetes as k8s

from model.types import MpiOperatorConfig

# The v2beta1 deployment of the release, pinned by tag (the schema allows only released versions).
MANIFEST_URL = "https://raw.githubusercontent.com/kubeflow/mpi-operator/{version}/deploy/v2beta1/mpi-operator.yaml"


def manifest_url(version: str) -> str:
    return MANIFEST_URL.format(version=version)


class MpiOperatorArgs(msgspec.Struct, frozen=True):
    config: MpiOperatorConfig


class MpiOperator(pulumi.ComponentResource):
    def __init__(self, name: str, args: MpiOperatorArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepspeed-stack:workloads:MpiOperator", name, None, opts)
        url = manifest_url(args.config.version)
        self.manifest = k8s.yaml.v2.ConfigFile(
            f"{name}-manifest",
            file=url,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"version": args.config.version, "manifest": url})
