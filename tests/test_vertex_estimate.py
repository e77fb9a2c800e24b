"""The same numbers on Vertex AI as on GKE (issue 37 item 6): the fit check on the Vertex GPUs, the run's estimate at
Vertex's prices from `vertex.finetune.datasetTokens` (read, never ignored), and the progress inputs (peak, model
FLOPs, $/h, the estimate) on every replica of the CustomJob."""

from __future__ import annotations

import json

import pytest
from conftest import DELETE, changed, config_model, stack_run

from model.config import ConfigError
from planner import cost, cost_markdown
from workloads import vertex_job

V = "deepspeed-stack:vertex"


def test_a_7b_full_fine_tune_on_one_t4_is_refused_as_on_gke() -> None:
    """Qwen2.5-7B, every parameter, ZeRO-3, on one n1-standard-4 + 1 T4 (16 GB): refused with the need and the
    GPU's memory; the same keys on a GKE pool are refused by check_model_fits."""
    with pytest.raises(ConfigError) as err:
        config_model(changed("vertex", {f"{V}.finetune.model": "Qwen/Qwen2.5-7B-Instruct", f"{V}.workers": 0}))
    (problem,) = [p for p in err.value.problems if p.startswith("vertex.finetune.model:")]
    assert "Qwen2.5-7B (7.62B parameters) fp16 every parameter" in problem
    assert "nvidia-tesla-t4 has 16 GB (1 replica x 1 GPU)" in problem and "GB per GPU" in problem


def test_the_vertex_example_prints_hours_and_dollars_per_run() -> None:
    """Pulumi.vertex.yaml: OPT-125m (0.13B) full, 2 replicas x 1 T4 (fp16 65 TFLOPS), datasetTokens 20,000,000 x 1
    epoch, at Vertex's $/h for both replicas; the rows are the 8B ones (the nearest size), said so."""
    costs = cost.stack_costs(config_model(changed("vertex")))
    v = costs["vertex"]
    r = v["run"]
    assert r["tokens"] == 20_000_000 and "vertex.finetune.datasetTokens 20,000,000" in r["tokensFrom"]
    assert r["perHour"] == v["perHour"] and r["gpus"] == 2 and r["peakTflops"] == 65
    # hours = tokens / (2 GPUs x tokens/s per GPU) / 3600 at each end, + the saves
    tps = r["tokensPerSecondPerGpu"]
    assert r["trainingHours"]["fast"] == pytest.approx(20e6 / (2 * tps["high"]) / 3600, abs=2e-3)
    assert r["perRun"]["slow"] == pytest.approx(r["hours"]["slow"] * v["perHour"], abs=0.01)
    assert any("outside the rows' sizes" in n for n in r["notes"])
    line = cost_markdown.headline(costs)
    assert f"about {r['hours']['fast']:.2f}–{r['hours']['slow']:.2f} h" in line and "per run** on Vertex AI" in line
    md = stack_run("vertex")
    assert "Vertex AI run: 20,000,000 tokens" in cost_markdown.costs_markdown(md.outputs["costs"])


def test_without_a_token_count_the_run_says_which_key_to_set() -> None:
    costs = cost.stack_costs(config_model(changed("vertex", {f"{V}.finetune.datasetTokens": DELETE})))
    assert costs["vertex"]["run"] == {
        "missing": "set vertex.finetune.datasetTokens (the data's token count) or vertex.finetune.maxSteps"}


def test_dataset_tokens_with_max_steps_warn_unread() -> None:
    import checks
    m = config_model(changed("vertex", {f"{V}.finetune.epochs": DELETE, f"{V}.finetune.maxSteps": 10}))
    assert "vertex.finetune.datasetTokens: not used: with vertex.finetune.maxSteps" in " ".join(checks.warnings(m))


def test_every_replica_gets_the_progress_inputs() -> None:
    """OPT-125m (0.13B in data/models.yaml), full: 6N FLOPs a token; the T4's fp16 peak 65; Vertex's $/h."""
    m = config_model(changed("vertex"))
    spec = vertex_job.customjob_spec(m.vertex, "image", "bucket", "sa@p.iam.gserviceaccount.com")
    costs = cost.stack_costs(m)
    for pool in spec["workerPoolSpecs"]:
        env = {e["name"]: e["value"] for e in pool["containerSpec"]["env"]}
        assert env["FINETUNE_PEAK_TFLOPS"] == "65"
        assert float(env["FINETUNE_MODEL_FLOPS"]) == pytest.approx(costs["vertex"]["run"]["modelFlopsPerToken"])
        assert float(env["FINETUNE_PRICE_PER_HOUR"]) == costs["vertex"]["perHour"]
        assert json.loads(env["FINETUNE_ESTIMATE"])["hours"] == costs["vertex"]["run"]["hours"]
