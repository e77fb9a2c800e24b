"""A vLLM server's load where Kubernetes can act on it: the objects, as plain dicts (validated in tests).

- a PodMonitoring (Managed Service for Prometheus) that scrapes vLLM's `/metrics` on the API port of the server's
  pods every 15 s, so its queue and batch reach Cloud Monitoring;
- the NetworkPolicy peer that admits Managed Prometheus' collectors (pods of the `collector` DaemonSet in
  `gmp-system`, on the pod network) to that port: the server's policy otherwise admits only `serving.allowFrom`;
- the HorizontalPodAutoscaler's spec on vLLM's waiting (or running) requests per replica, a `Pods` metric the
  Custom Metrics Stackdriver Adapter serves (components/metrics_adapter.py installs it).

Facts and their sources: data/serving_metrics.yaml (model/serving_metrics.py).
"""

from __future__ import annotations

from typing import Any

from model import serving_metrics
from model.serving_engines import VLLM
from model.types import ServeWorkloadConfig

METRICS_PORT = "http"  # the container port's name: vLLM serves /metrics on its API port (data file: path)


def scraped(w: ServeWorkloadConfig) -> bool:
    """vLLM reports its load on /metrics; DeepSpeed-MII serves no metrics."""
    return w.serving.engine == VLLM


def pod_monitoring(w: ServeWorkloadConfig, selector: dict[str, str]) -> dict[str, Any]:
    """The PodMonitoring of the server's pods (those `selector` matches, in its namespace)."""
    f = serving_metrics.load()
    return {
        "apiVersion": f.pod_monitoring_api_version, "kind": f.pod_monitoring_kind,
        "metadata": {"name": w.name, "namespace": w.namespace},
        "spec": {"selector": {"matchLabels": dict(selector)},
                 "endpoints": [{"port": METRICS_PORT, "path": f.path, "interval": f.interval}]},
    }


def collector_peer() -> dict[str, Any]:
    """Managed Prometheus' collector pods: both selectors in one peer, so only those pods of that namespace."""
    f = serving_metrics.load()
    return {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": f.collector_namespace}},
            "podSelector": {"matchLabels": dict(f.collector_labels)}}


def metric_text(w: ServeWorkloadConfig) -> str:
    """`vllm:num_requests_waiting`: the gauge the autoscaler reads."""
    return serving_metrics.load().metrics[w.serving.autoscaling.metric]


def autoscaler_spec(w: ServeWorkloadConfig) -> dict[str, Any]:
    """Between `replicas` and `maxReplicas` on the metric's average per replica: above the target a replica is
    added (the HPA's own tolerance and stabilization apply)."""
    a, f = w.serving.autoscaling, serving_metrics.load()
    return {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": w.name},
        "minReplicas": w.serving.replicas, "maxReplicas": max(a.max_replicas, w.serving.replicas),
        "metrics": [{"type": "Pods", "pods": {
            "metric": {"name": f.custom_metric_name(a.metric)},
            "target": {"type": "AverageValue", "averageValue": str(serving_metrics.target(w))}}}],
    }


def autoscaler(w: ServeWorkloadConfig) -> dict[str, Any]:
    return {"apiVersion": serving_metrics.load().hpa_api_version, "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": w.name, "namespace": w.namespace}, "spec": autoscaler_spec(w)}


def scaling_text(w: ServeWorkloadConfig) -> str:
    """How the server scales, in its users' terms (the summary and the preview)."""
    s = w.serving
    if not s.autoscaling.enabled:
        return str(s.replicas)
    what = "waiting" if s.autoscaling.metric == serving_metrics.WAITING else "running"
    top = max(s.autoscaling.max_replicas, s.replicas)
    return (f"{s.replicas}-{top}: one more above {serving_metrics.target(w)} {what} requests per replica "
            f"({metric_text(w)})")
