"""How a `serve` workload's load is measured and scaled on: data/serving_metrics.yaml (sources there).

vLLM's own gauges (waiting and running requests) on its `/metrics`, scraped by Managed Service for Prometheus
through a PodMonitoring, read by the HPA as custom metrics through the Custom Metrics Stackdriver Adapter, which
the stack installs once per cluster when a server autoscales.
"""

from __future__ import annotations

import functools
from pathlib import Path

import msgspec

from model.types import ServeWorkloadConfig, StackConfig
from model.yamlio import load_yaml

METRICS_PATH = Path(__file__).resolve().parent.parent / "data" / "serving_metrics.yaml"
WAITING, RUNNING = "waiting", "running"  # the `serving.autoscaling.metric` values


class Adapter(msgspec.Struct, frozen=True):
    """The Custom Metrics Stackdriver Adapter's pinned release and the identity it reads Cloud Monitoring as."""

    version: str  # the release tag of GoogleCloudPlatform/k8s-stackdriver
    commit: str
    image: str  # what that tag's manifest runs
    manifest: str  # its URL, `{version}` filled in
    namespace: str
    service_account: str
    role: str  # the project role it needs
    member: str  # the Workload Identity principal, `{number}` and `{project}` to fill in

    def member_for(self, project: str, number: str) -> str:
        return self.member.format(number=number, project=project, namespace=self.namespace,
                                  service_account=self.service_account)


class Facts(msgspec.Struct, frozen=True):
    metrics: dict[str, str]  # `serving.autoscaling.metric` -> vLLM's gauge
    path: str
    pod_monitoring_api_version: str
    pod_monitoring_kind: str
    interval: str
    collector_namespace: str
    collector_labels: dict[str, str]
    custom_metric: str  # the HPA's name for a Managed Prometheus gauge, `{metric}` to fill in
    hpa_api_version: str
    default_targets: dict[str, int]
    adapter: Adapter

    def custom_metric_name(self, metric: str) -> str:
        """`prometheus.googleapis.com|vllm:num_requests_waiting|gauge` for `waiting`."""
        return self.custom_metric.format(metric=self.metrics[metric])


@functools.cache
def load(path: Path = METRICS_PATH) -> Facts:
    raw = load_yaml(path)
    pm, collector, hpa, adapter = raw["podMonitoring"], raw["collector"], raw["hpa"], raw["adapter"]
    return Facts(
        metrics={k: str(v) for k, v in raw["metrics"].items()}, path=str(raw["path"]),
        pod_monitoring_api_version=str(pm["apiVersion"]), pod_monitoring_kind=str(pm["kind"]),
        interval=str(pm["interval"]), collector_namespace=str(collector["namespace"]),
        collector_labels={k: str(v) for k, v in collector["podLabels"].items()},
        custom_metric=str(raw["customMetric"]), hpa_api_version=str(hpa["apiVersion"]),
        default_targets={k: int(v) for k, v in hpa["defaultTarget"].items()},
        adapter=Adapter(version=str(adapter["version"]), commit=str(adapter["commit"]), image=str(adapter["image"]),
                        manifest=str(adapter["manifest"]).format(version=adapter["version"]),
                        namespace=str(adapter["namespace"]), service_account=str(adapter["serviceAccount"]),
                        role=str(adapter["role"]), member=str(adapter["member"])),
    )


def target(w: ServeWorkloadConfig) -> int:
    """The per-replica average of the metric above which the HPA adds a replica: `serving.autoscaling.target`, else
    the data file's default (waiting), or the sequences the planner sized the KV cache for (running)."""
    a = w.serving.autoscaling
    if a.target is not None:
        return a.target
    if a.metric == RUNNING:
        return w.model.batch_size if w.model is not None else 1
    return load().default_targets[a.metric]


def autoscales(w: ServeWorkloadConfig) -> bool:
    return w.serving.autoscaling.enabled


def needs_adapter(cfg: StackConfig) -> bool:
    """A server of the stack scales on vLLM's metrics: the cluster needs the custom metrics API."""
    return cfg.cluster is not None and any(
        isinstance(w, ServeWorkloadConfig) and autoscales(w) for w in cfg.workloads.values())
