"""MetricsAdapter: the Custom Metrics Stackdriver Adapter, which serves Kubernetes' custom metrics API from Cloud
Monitoring, so an HPA can scale a vLLM server on its queue as Managed Service for Prometheus collected it.

One per cluster, installed when a `serve` workload autoscales: the adapter's pinned release manifest (namespace
`custom-metrics`, its service account, RBAC, Deployment, Service and the APIServices of the custom and external
metrics APIs) through `yaml.v2.ConfigFile`, which the Kubernetes provider fetches and applies during `pulumi up`
(the program never downloads it; under mocks only the ConfigFile registers), and `roles/monitoring.viewer` on the
project for that service account's Workload Identity principal: it reads the metrics as itself, with no Google
service account and no node-wide scope. Facts and sources: data/serving_metrics.yaml.
"""

from __future__ import annotations

import msgspec
import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from model import serving_metrics


class MetricsAdapterArgs(msgspec.Struct, frozen=True):
    project: str
    # The PROJECT.svc.id.goog identity pool exists once a cluster with Workload Identity does: the grant waits.
    identity_pool_ready: list[pulumi.Resource] = msgspec.field(default_factory=list)


class MetricsAdapter(pulumi.ComponentResource):
    """Pass the cluster's Kubernetes provider in `opts` (the IAM grant uses the stack's Google provider)."""

    def __init__(self, name: str, args: MetricsAdapterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepspeed-stack:workloads:MetricsAdapter", name, None, opts)
        adapter = serving_metrics.load().adapter
        self.manifest = k8s.yaml.v2.ConfigFile(
            f"{name}-manifest", file=adapter.manifest, opts=pulumi.ResourceOptions(parent=self))
        number = gcp.organizations.get_project_output(project_id=args.project).number
        # Additive (IAMMember): the project's other bindings of the role stay as they are.
        self.viewer = gcp.projects.IAMMember(
            f"{name}-viewer", project=args.project, role=adapter.role,
            member=number.apply(lambda n: adapter.member_for(args.project, str(n))),
            opts=pulumi.ResourceOptions(parent=self, depends_on=args.identity_pool_ready))
        self.register_outputs({"version": adapter.version, "manifest": adapter.manifest})
