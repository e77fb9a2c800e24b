"""The Cloud Monitoring dashboard of the stack's vLLM servers: data/serving_dashboard.yaml (sources there)."""

from __future__ import annotations

import functools
from pathlib import Path

import msgspec

from model.yamlio import load_yaml

DASHBOARD_PATH = Path(__file__).resolve().parent.parent / "data" / "serving_dashboard.yaml"


class Chart(msgspec.Struct, frozen=True):
    title: str
    unit: str
    query: str  # PromQL, `{sel}` the server's series selector
    second: str | None = None  # a second line on the same chart (p50 beside p95)


class DashboardFacts(msgspec.Struct, frozen=True, rename="camel"):
    source: str
    date: str
    columns: int
    tile_width: int
    tile_height: int
    charts: tuple[Chart, ...]


@functools.cache
def load() -> DashboardFacts:
    return msgspec.convert(load_yaml(DASHBOARD_PATH), DashboardFacts)
