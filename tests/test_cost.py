"""Honest cost (issue 20.5): $/h with the declared workloads running (training and serving apart), then the floor
at min nodes; Filestore claims and the Vertex AI job priced from the catalog; spot and DWS marked as estimates.

Every expected number is computed here from data/gpu_catalog.yaml itself, never from planner/cost.py."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from conftest import PROJECT_DIR, changed, config_model, stack_run, stack_yaml, yaml_load

from planner import cost, cost_markdown, pool_cost
from preview import engine, summary

CATALOG_FILE = PROJECT_DIR / "data" / "gpu_catalog.yaml"


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    with open(CATALOG_FILE, encoding="utf-8") as fh:
        return yaml_load(fh)


def _od(raw: dict[str, Any], gpu: str, machine: str) -> float:
    return raw["gpus"][gpu]["machines"][machine]["price"]["onDemand"]


def _floor_parts(raw: dict[str, Any]) -> float:
    """The cluster fee and one on-demand e2-standard-4 system node: every repo stack's system pool at min."""
    return raw["gkeClusterFeePerHour"] + raw["generalMachines"]["e2-standard-4"]["price"]["onDemand"]


def test_prod_headline_is_training_running_not_the_floor(raw: dict[str, Any]) -> None:
    """The failing input of the issue: the headline said "$x/h at min nodes" while `pulumi up` starts the helm
    release's 2 workers, each on a g2-standard-8 node of its own (the chart's client runs on the system pool)."""
    costs = cost.stack_costs(config_model(stack_yaml("prod")))
    l4 = _od(raw, "nvidia-l4", "g2-standard-8")
    assert costs["running"]["training"]["perHour"] == pytest.approx(_floor_parts(raw) + 2 * l4)
    assert costs["running"]["training"]["nodes"] == {"system": 1, "l4": 2}
    assert costs["floorPerHour"] == pytest.approx(_floor_parts(raw) + 1 * l4)  # l4.minNodes 1
    assert set(costs["running"]) == {"training"}
    line = cost_markdown.headline(costs)
    assert line.startswith(f"Estimated cost: **${_floor_parts(raw) + 2 * l4:,.2f}/h with training running**")
    assert f"floor **${_floor_parts(raw) + l4:,.2f}/h** at min nodes" in line


def test_training_and_serving_apart_and_together(raw: dict[str, Any]) -> None:
    """prod's helm release (2 nodes) and serve's one-replica server on the same l4 pool (min 1, max 4)."""
    config = stack_yaml("prod")
    server = copy.deepcopy(stack_yaml("serve")["deepspeed-stack:workloads"]["chat"])
    config["deepspeed-stack:workloads"]["chat"] = server
    costs = cost.stack_costs(config_model(config))
    l4, base = _od(raw, "nvidia-l4", "g2-standard-8"), _floor_parts(raw)
    running = costs["running"]
    assert running["training"]["perHour"] == pytest.approx(base + 2 * l4)
    assert running["serving"]["perHour"] == pytest.approx(base + 1 * l4)  # one replica: the pool's min node
    assert running["all"]["perHour"] == pytest.approx(base + 3 * l4)
    assert (running["training"]["workloads"], running["serving"]["workloads"]) == (["zero3-smoke"], ["chat"])
    line = cost_markdown.headline(costs)
    assert f"**${base + 2 * l4:,.2f}/h with training running**" in line
    assert f"**${base + l4:,.2f}/h with serving running**" in line
    assert f"${base + 3 * l4:,.2f}/h with both" in line


def test_serving_replicas_take_a_node_each_at_most_max_nodes(raw: dict[str, Any]) -> None:
    l4, base = _od(raw, "nvidia-l4", "g2-standard-8"), _floor_parts(raw)
    two = cost.stack_costs(config_model(changed("serve", {"workloads.chat.serving.replicas": 2})))
    assert two["running"]["serving"]["perHour"] == pytest.approx(base + 2 * l4)
    one = cost.stack_costs(config_model(stack_yaml("serve")))
    assert one["running"]["serving"]["perHour"] == pytest.approx(base + l4) == pytest.approx(one["floorPerHour"])


def test_spot_running_cost_is_marked_an_estimate(raw: dict[str, Any]) -> None:
    costs = cost.stack_costs(config_model(stack_yaml("dev")))
    t4 = raw["n1Machines"]["n1-standard-8"]["price"]["spot"] + raw["gpus"]["nvidia-tesla-t4"]["price"]["spot"]
    assert costs["running"]["training"]["perHour"] == pytest.approx(_floor_parts(raw) + 2 * t4)
    assert costs["running"]["training"]["estimatedAt"] == ["spot"]
    assert "(spot prices: estimate)" in cost_markdown.headline(costs)
    assert any(n.startswith("Spot: spot prices move daily") for n in costs["estimates"])


def test_dws_price_is_marked_an_estimate() -> None:
    """dws's pretrain job prefers the reservation; with the reservation pool gone it runs on the DWS pool."""
    config = stack_yaml("dws")
    config["deepspeed-stack:workloads"]["pretrain"]["pool"] = "h100-dws"
    del config["deepspeed-stack:workloads"]["pretrain"]["fallbackPool"]
    costs = cost.stack_costs(config_model(config))
    assert costs["pools"]["h100-dws"]["capacity"] == "DWS"
    assert costs["pools"]["h100-dws"]["priceNote"].startswith("at most on-demand")
    assert costs["running"]["training"]["estimatedAt"] == ["DWS", "spot"]  # and finetune on l4-spot
    assert "(DWS and spot prices: estimate)" in cost_markdown.headline(costs)
    assert "DWS pool h100-dws: at most on-demand (DWS discount not in the catalog)." in costs["estimates"]


def test_filestore_claim_is_priced_at_its_billed_size(raw: dict[str, Any]) -> None:
    """h100's MPIJob claims 1Ti of standard-rwx (Filestore Basic HDD): billed whether a job runs or not."""
    fs = raw["filestore"]
    assert fs["classes"]["standard-rwx"] == "basic-hdd"  # GKE Filestore CSI driver docs
    rate = fs["tiers"]["basic-hdd"]["perGiBHour"]
    assert rate == 0.000274  # cloud.google.com/filestore/pricing, Basic HDD example, $ per GiB-hour
    costs = cost.stack_costs(config_model(stack_yaml("h100")))
    (claim,) = costs["filestore"]["claims"]
    assert (claim["claim"], claim["tier"], claim["billedGiB"]) == ("h100-shared", "basic-hdd", 1024)
    assert claim["perHour"] == pytest.approx(1024 * rate, abs=1e-4)  # rounded to 4 places
    assert costs["floorPerHour"] == pytest.approx(_floor_parts(raw) + 1024 * rate, abs=1e-4)  # h100 pool min 0
    assert "Filestore claim `h100-shared`" in cost_markdown.costs_markdown(costs)


def test_small_filestore_claim_bills_the_tier_minimum_and_unknown_tiers_are_unpriced(raw: dict[str, Any]) -> None:
    small = cost.stack_costs(config_model(changed("h100", {"workloads.smoke.storage.size": "50Gi"})))
    (claim,) = small["filestore"]["claims"]
    assert claim["billedGiB"] == 100  # Filestore service tiers: "Basic HDD (on GKE)" from 100 GiB
    ssd = cost.stack_costs(config_model(changed("h100", {"workloads.smoke.storage.storageClass": "premium-rwx"})))
    (claim,) = ssd["filestore"]["claims"]
    assert (claim["tier"], claim["billedGiB"], claim["perHour"]) == ("basic-ssd", 2560, None)
    assert ssd["filestore"]["unpriced"] == ["smoke"]
    assert "unpriced (tier price not in the catalog)" in cost_markdown.costs_markdown(ssd)


def test_vertex_job_is_priced_machine_plus_gpus_times_replicas(raw: dict[str, Any]) -> None:
    """vertex: the primary and 1 worker, each n1-standard-4 + 1 T4, at Vertex's rate (the markup)."""
    markup = raw["vertexTraining"]["markup"]
    assert raw["vertexTraining"]["confirmed"] is False  # not read offline: shown as an estimate
    node = raw["n1Machines"]["n1-standard-4"]["price"]["onDemand"] + raw["gpus"]["nvidia-tesla-t4"]["price"][
        "onDemand"]
    costs = cost.stack_costs(config_model(stack_yaml("vertex")))
    assert costs["vertex"]["replicas"] == 2
    assert costs["vertex"]["perHour"] == pytest.approx(2 * node * markup)
    assert costs["pools"] == {} and costs["running"] == {}
    assert f"Vertex AI job **${2 * node * markup:,.2f}/h** while it runs (Vertex markup: estimate)" in \
        cost_markdown.headline(costs)
    spot = cost.stack_costs(config_model(changed("vertex", {"vertex.spot": True, "vertex.workers": 3})))
    spot_node = raw["n1Machines"]["n1-standard-4"]["price"]["spot"] + raw["gpus"]["nvidia-tesla-t4"]["price"]["spot"]
    assert spot["vertex"]["perHour"] == pytest.approx(4 * spot_node * markup)


def test_vertex_stack_exports_costs_and_the_summary_headline_shows_it() -> None:
    run = stack_run("vertex")
    assert "vertex" in run.outputs["costs"]
    md = summary.markdown(run, [], 0)
    title, line = md.splitlines()[0], md.splitlines()[2]
    assert title.startswith("### Stack `vertex`")
    assert line == cost_markdown.headline(run.outputs["costs"])


def test_summary_headline_comes_right_after_the_title(prod: engine.RunResult) -> None:
    md = summary.markdown(prod, [], 0).splitlines()
    assert md[0].startswith("### Stack `prod`")
    assert md[2] == cost_markdown.headline(prod.outputs["costs"])
    assert "with training running" in md[2]
    assert summary.text(prod, [], 0).splitlines()[0].startswith("Estimated cost: $")


@pytest.mark.parametrize(("stack", "name", "nodes"), [
    ("dev", "smoke", 2), ("prod", "zero3-smoke", 2),  # helm, 2 workers (the chart's client runs on the system pool)
    ("h100", "smoke", 2), ("dws", "pretrain", 2),  # mpijob, 2 workers (the launcher runs on the system pool)
    ("dws", "finetune", 2),
])
def test_workload_nodes_agree_with_the_max_nodes_rule(stack: str, name: str, nodes: int) -> None:
    """The node count the cost uses and the maxNodes rule checks (WorkloadConfig.nodes_needed), from the stack
    files' workers."""
    w = config_model(stack_yaml(stack)).workloads[name]
    assert pool_cost.workload_nodes(w) == nodes
    assert w.nodes_needed()[0] == nodes
