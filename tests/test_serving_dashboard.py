"""The Cloud Monitoring dashboard of the stack's vLLM servers (issue 42 item 5): one gcp.monitoring.Dashboard whose
charts query, in PromQL, the vLLM metrics Managed Prometheus scrapes from each server (data/serving_dashboard.yaml
names each metric's source in vLLM 0.32.0). No Cloud Monitoring schema is available offline: the JSON is checked
against the API's documented limits (a mosaic of at most 48 columns, tiles inside it, none overlapping)."""

from __future__ import annotations

import json
import re
from typing import Any

from conftest import changed, stack_run

from components.serving_dashboard import Server, dashboard
from preview import engine

DASHBOARD = "gcp:monitoring/dashboard:Dashboard"
METRICS = {"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
           "vllm:time_to_first_token_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
           "vllm:generation_tokens_total"}


def tiles_of(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return doc["mosaicLayout"]["tiles"]


def queries(doc: dict[str, Any]) -> list[str]:
    return [d["timeSeriesQuery"]["prometheusQuery"] for t in tiles_of(doc) for d in t["widget"]["xyChart"]["dataSets"]]


def test_the_serve_stack_charts_its_server() -> None:
    (reg,) = stack_run("serve").by_type(DASHBOARD)
    doc = json.loads(reg.inputs["dashboardJson"])
    assert doc["displayName"] == "deepspeed-stack serve: vLLM servers" and reg.inputs["project"] == "my-gcp-project"
    assert len(tiles_of(doc)) == 6
    found = queries(doc)
    assert all('{namespace="serving",job="chat"}' in q for q in found)
    assert {m for q in found for m in re.findall(r"vllm:[a-z0-9_]+", q)} == METRICS
    for q in found:  # balanced, so Cloud Monitoring can parse it
        assert q.count("(") == q.count(")") and q.count("{") == q.count("}")


def test_tiles_fit_the_mosaic_and_do_not_overlap() -> None:
    doc = dashboard("x", [Server("a", "ns-a"), Server("b", "ns-b")])
    columns = doc["mosaicLayout"]["columns"]
    assert 1 <= columns <= 48
    cells: set[tuple[int, int]] = set()
    for t in tiles_of(doc):
        assert t["xPos"] + t["width"] <= columns
        mine = {(x, y) for x in range(t["xPos"], t["xPos"] + t["width"])
                for y in range(t["yPos"], t["yPos"] + t["height"])}
        assert not cells & mine
        cells |= mine
    assert [t["widget"]["title"].split(":")[0] for t in tiles_of(doc)] == ["a"] * 6 + ["b"] * 6


def test_no_dashboard_without_a_vllm_server() -> None:
    mii = {"workloads.chat.serving.engine": "mii"}
    run = engine.run_program(*engine.engine_config_from_yaml(changed("serve", mii)), stack="serve")
    assert not run.by_type(DASHBOARD)
    assert not stack_run("dev").by_type(DASHBOARD)
