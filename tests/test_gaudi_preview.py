"""The Gaudi preview says what an HPC admin on Omnia needs (issue 39 item 5): a Training section with the run's
estimate where `finetune.datasetTokens` is given and the commands that copy the model off the claim after the run;
HCCL variable names checked against Habana's documented ones; LoRA checkpoints sized as LoRA."""

from __future__ import annotations

import json
import re
import shlex

import pytest
from conftest import DELETE, model
from test_gaudi_launcher import run_gaudi

import checks
from planner import recovery
from preview.engine import RunResult
from preview.sections import training

JOB = "gaudi-llm-ds-ft"
KEY = f"workloads.{JOB}"
RECIPE = {"model": "Qwen/Qwen2.5-7B-Instruct", "datasetPath": "data/chat.jsonl", "recordFormat": "messages",
          "datasetTokens": 50_000_000, "epochs": 2}


@pytest.fixture(scope="module")
def with_tokens() -> RunResult:
    return run_gaudi(RECIPE)


def body(run: RunResult) -> str:
    [(title, text)] = training.section(run)
    assert title == "Training"
    return text


def test_the_training_section_estimates_the_run_on_the_gaudi_cards(with_tokens: RunResult) -> None:
    text = body(with_tokens)
    (row,) = [line for line in text.splitlines() if line.startswith(f"| {JOB} |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:4] == ["Qwen/Qwen2.5-7B-Instruct", "1 worker(s) x 8 Gaudi cards",
                          "`/storage/data/chat.jsonl` (claim)"]
    assert cells[5] == f"`/storage/deepspeed-stack/models/{JOB}` (claim)"
    hours = re.fullmatch(r"about ([0-9.]+)–([0-9.]+) h \(([0-9,]+)–([0-9,]+) card-hours\)", cells[4])
    assert hours is not None, cells[4]
    fast, slow, card_fast, card_slow = (float(g.replace(",", "")) for g in hours.groups())
    assert 0 < fast < slow and abs(card_fast - 8 * fast) <= 1 and abs(card_slow - 8 * slow) <= 1
    (said,) = [line for line in text.splitlines() if line.startswith(f"- `{JOB}`: about ") and "card-hours" in line]
    # Gaudi 2's peak BF16 (Intel, Hot Chips 2024: 432 TFLOPs), the tokens from the keys.
    assert "of 8 gaudi2 x 432 TFLOPS bf16 (data/gpu_catalog.yaml)" in said
    assert f"tokens: {KEY}.finetune.datasetTokens 50,000,000 x 2 epoch(s)" in said
    assert "measured on GPUs, not on Gaudi" in said


def test_twice_the_tokens_twice_the_hours(with_tokens: RunResult) -> None:
    def hours(run: RunResult) -> float:
        (row,) = [line for line in body(run).splitlines() if line.startswith(f"| {JOB} |")]
        return float(re.search(r"about ([0-9.]+)–", row).group(1))  # type: ignore[union-attr]

    more = run_gaudi({**RECIPE, "epochs": 4})
    assert hours(more) == pytest.approx(2 * hours(with_tokens), rel=0.06)  # two significant figures shown


def test_without_a_token_count_the_section_says_what_to_set() -> None:
    text = body(run_gaudi({k: v for k, v in RECIPE.items() if k != "datasetTokens"}))
    (row,) = [line for line in text.splitlines() if line.startswith(f"| {JOB} |")]
    assert "| unknown |" in row
    assert (f"- `{JOB}`: unknown: set {KEY}.finetune.datasetTokens (the data's token count) or "
            f"{KEY}.finetune.maxSteps") in text


def test_next_steps_copy_the_model_off_the_claim(with_tokens: RunResult) -> None:
    text = body(with_tokens)
    steps = text.split("```sh\n", 1)[1].split("\n```", 1)[0].splitlines()
    assert steps[0] == "pulumi up -s gaudi   # the Gaudi image and the job on your cluster"
    assert f"kubectl logs -n workloads -f job/{JOB}-launcher" in steps
    run = next(s for s in steps if s.startswith("kubectl run "))
    words = shlex.split(run)
    assert words[:5] == ["kubectl", "run", "-n", "workloads", f"{JOB}-fetch"]
    overrides = json.loads(next(w for w in words if w.startswith("--overrides=")).split("=", 1)[1])
    assert overrides["spec"]["securityContext"]["runAsUser"] == 10001  # the ranks' files, readable under root_squash
    assert overrides["spec"]["volumes"] == [
        {"name": "claim", "persistentVolumeClaim": {"claimName": "shared-model", "readOnly": True}}]
    (container,) = overrides["spec"]["containers"]
    assert container["volumeMounts"] == [{"name": "claim", "mountPath": "/storage", "readOnly": True}]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert steps[-3:] == [
        f"kubectl exec -n workloads {JOB}-fetch -- test -f /storage/deepspeed-stack/models/{JOB}/.complete   "
        "# finished",
        f"kubectl cp workloads/{JOB}-fetch:/storage/deepspeed-stack/models/{JOB} ./{JOB}",
        f"kubectl delete pod -n workloads {JOB}-fetch"]


def test_omnias_run_has_no_training_section() -> None:
    assert training.section(run_gaudi(None)) == []


# --- HCCL names ---------------------------------------------------------------------------------------------------

def hccl_warnings(env: dict[str, str]) -> list[str]:
    return [w for w in checks.warnings(model("gaudi", {f"{KEY}.env": env})) if "HCCL variable" in w]


def test_a_misspelt_hccl_name_is_warned_with_the_documented_one() -> None:
    assert hccl_warnings({"HCCL_SOCKT_IFNAME": "ens1f0"}) == [
        f"{KEY}.env.HCCL_SOCKT_IFNAME: not an HCCL variable Habana documents (data/hccl_env.yaml), and HCCL reads only "
        "the names it knows, so this one would change nothing; did you mean HCCL_SOCKET_IFNAME?"]
    assert hccl_warnings({"HCL_COM_ID": "10.0.0.1:9999"})[0].endswith("; did you mean HCL_COMM_ID?")
    assert hccl_warnings({"HCCL_XYZZY": "1"}) == [
        f"{KEY}.env.HCCL_XYZZY: not an HCCL variable Habana documents (data/hccl_env.yaml), and HCCL reads only the "
        "names it knows, so this one would change nothing"]


def test_documented_hccl_names_and_other_variables_pass() -> None:
    documented = {"HCCL_SOCKET_IFNAME": "ens1f0", "HCCL_OVER_OFI": "1", "HCL_COMM_ID": "10.0.0.1:9999",
                  "HCCL_DEFAULT_NIC_COUNT": "2", "PT_HPU_LAZY_MODE": "1", "LOG_LEVEL_ALL": "3"}
    assert hccl_warnings(documented) == []


# --- LoRA checkpoints -----------------------------------------------------------------------------------------------

def test_a_lora_run_on_gaudi_checkpoints_the_adapters_only() -> None:
    """Omnia's run_lora_clm.py (training.lora: rank 8 on q_proj, v_proj) with a `model` block: Qwen2.5-7B has 28
    layers, hidden 3584, 4 KV heads of 128 (v_proj 3584 -> 512): rank 8 x (3584 + 3584) + 8 x (3584 + 512) = 90,112
    adapter parameters a layer, 2,523,136 in all, each with bf16 weights and Adam's 12 bytes: 35.3 MB, not the whole
    model's 7.6B x 14 bytes (issue 39 saw 112.4 GB)."""
    plan = recovery.stack_recovery(model("gaudi", {f"{KEY}.model": {"name": "Qwen/Qwen2.5-7B-Instruct"}}))[JOB]
    assert plan["checkpointGb"] == pytest.approx(2_523_136 * 14 / 1e9)
    full = recovery.stack_recovery(model("gaudi", {f"{KEY}.model": {"name": "Qwen/Qwen2.5-7B-Instruct"},
                                                   f"{KEY}.training.lora.enabled": False}))[JOB]
    assert full["checkpointGb"] > 100


def test_the_recipe_on_gaudi_is_sized_as_lora_without_a_model_block() -> None:
    changes = {f"{KEY}.training": DELETE, f"{KEY}.finetune": {**RECIPE, "lora": {"rank": 8,
                                                                               "targetModules": ["q_proj", "v_proj"]}}}
    plan = recovery.stack_recovery(model("gaudi", changes))[JOB]
    assert plan["checkpointGb"] == pytest.approx(2_523_136 * 14 / 1e9)
