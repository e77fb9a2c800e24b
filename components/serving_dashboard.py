"""ServingDashboard: one Cloud Monitoring dashboard of the stack's vLLM servers (queue, batch, KV cache, time to first
token, latency, tokens per second; a row per server), from what Managed Service for Prometheus scrapes of their
/metrics. Charts and sources: data/serving_dashboard.yaml."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pulumi
import pulumi_gcp as gcp

from model import serving_dashboard
from model.types import ServeWorkloadConfig, StackConfig
from workloads.serving_metrics import scraped


class Server(msgspec.Struct, frozen=True):
    name: str  # the workload (its PodMonitoring's name: the series' `job`)
    namespace: str


class ServingDashboardArgs(msgspec.Struct, frozen=True):
    project: str
    stack: str
    servers: list[Server]


def scraped_servers(cfg: StackConfig) -> list[Server]:
    """The serve workloads whose /metrics Managed Prometheus scrapes (vLLM's), in the stack's order."""
    return [Server(name, w.namespace) for name, w in cfg.workloads.items()
            if isinstance(w, ServeWorkloadConfig) and scraped(w)]


def selector(server: Server) -> str:
    return f'{{namespace="{server.namespace}",job="{server.name}"}}'


def _chart(server: Server, chart: serving_dashboard.Chart) -> dict[str, Any]:
    queries = [chart.query] + ([chart.second] if chart.second else [])
    return {"title": f"{server.name}: {chart.title}", "xyChart": {
        "dataSets": [{"timeSeriesQuery": {"prometheusQuery": q.replace("{sel}", selector(server))},
                      "plotType": "LINE"} for q in queries],
        "yAxis": {"label": chart.unit, "scale": "LINEAR"}}}


def dashboard(stack: str, servers: list[Server]) -> dict[str, Any]:
    """The dashboard's JSON (Cloud Monitoring's Dashboard resource): a mosaic, each server's charts side by side,
    wrapping at the grid's width."""
    f = serving_dashboard.load()
    per_row = f.columns // f.tile_width
    tiles, y = [], 0
    for server in servers:
        for i, chart in enumerate(f.charts):
            tiles.append({"xPos": (i % per_row) * f.tile_width, "yPos": y + (i // per_row) * f.tile_height,
                          "width": f.tile_width, "height": f.tile_height, "widget": _chart(server, chart)})
        y += -(-len(f.charts) // per_row) * f.tile_height
    return {"displayName": f"deepspeed-stack {stack}: vLLM servers",
            "mosaicLayout": {"columns": f.columns, "tiles": tiles}}


class ServingDashboard(pulumi.ComponentResource):
    def __init__(self, name: str, args: ServingDashboardArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepspeed-stack:gcp:ServingDashboard", name, None, opts)
        self.dashboard = gcp.monitoring.Dashboard(
            f"{name}-dashboard", project=args.project,
            dashboard_json=json.dumps(dashboard(args.stack, args.servers), sort_keys=True),
            opts=pulumi.ResourceOptions(parent=self))
        self.register_outputs({"dashboard": self.dashboard.id})
