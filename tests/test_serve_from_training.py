"""Serving the trained result (issue 18 item 3): Pulumi.finetune.yaml's server `chat` serves what the finetune
workload `tune` writes (`serving.fromWorkload`): its LoRA adapter on the base model (issue 27 item 3: adapters are
exported alone by default), or the merged model with `finetune.lora.export: merged`. Its pods read MODEL_DIR through
the bucket's FUSE mount and wait in an init container for the marker training writes last; `pulumi up` does not wait
for them (pulumi-kubernetes' skipAwait on the Deployment and the Service), so one `pulumi up` deploys both and the
server becomes Ready when the model exists. The rules refuse a server of a workload that trains nothing, or of none."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import msgspec
import pytest
from conftest import DELETE, changed, config_model, model, problems, stack_run

from model.problems import lines
from preview.engine import RunResult
from workloads.kinds.serve_model import check_serve_from_workload

DEPLOYMENT = "kubernetes:apps/v1:Deployment"
SERVICE = "kubernetes:core/v1:Service"
S = "workloads.chat"
T = "workloads.tune"
MARKER = "/gcs/models/tune/.complete"  # MODEL_DIR of tune (the fine-tuning contract) + its marker
MERGED = {f"{T}.finetune.lora.export": "merged"}
SKIP_AWAIT = {"pulumi.com/skipAwait": "true"}  # pulumi-kubernetes provider/pkg/metadata/annotations.go


@pytest.fixture(scope="module")
def finetune() -> RunResult:
    return stack_run("finetune")


def _pod(run: RunResult) -> dict[str, Any]:
    return run.one(DEPLOYMENT, "chat-deployment").inputs["spec"]["template"]["spec"]


def test_the_server_loads_the_base_and_the_adapter_under_the_trainers_name(finetune: RunResult) -> None:
    (server,) = _pod(finetune)["containers"]
    assert server["command"] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    # tune's base (finetune.model) under its id, and tune's adapter (MODEL_DIR) under tune's name; rank 16 is one of
    # vLLM's --max-lora-rank values (vllm/config/lora.py MaxLoRARanks), one adapter a batch.
    assert server["args"] == ["--model", "Qwen/Qwen2.5-7B-Instruct", "--served-model-name",
                              "Qwen/Qwen2.5-7B-Instruct", "--host", "0.0.0.0",
                              "--port", "8000", "--tensor-parallel-size", "1", "--gpu-memory-utilization", "0.90",
                              "--max-model-len", "4096", "--dtype", "bfloat16", "--enable-lora", "--max-lora-rank",
                              "16", "--max-loras", "1", "--lora-modules", "tune=/gcs/models/tune"]
    summary = finetune.outputs["workloads"]["chat"]
    assert (summary["servedModel"], summary["baseModel"], summary["adapters"]) == (
        "tune", "Qwen/Qwen2.5-7B-Instruct", {"tune": "/gcs/models/tune"})
    # The same folder the trainer's ranks write (its MODEL_DIR), through the same bucket.
    ranks = finetune.one("kubernetes:kubeflow.org/v2beta1:MPIJob").inputs["spec"]["mpiReplicaSpecs"]["Worker"]
    env = {e["name"]: e["value"] for e in ranks["template"]["spec"]["containers"][0]["env"]}
    assert env["MODEL_DIR"] == "/gcs/models/tune"
    # tune's prompt/response records went through Qwen's chat template: it is asked on the chat endpoint.
    assert finetune.outputs["servingEndpoints"]["chat"]["prompt"] == (
        'python -m recipes.send_prompt --openai --chat --url http://localhost:8000 --model tune '
        '"What is DeepSpeed?"')


@pytest.mark.parametrize(("finetune_keys", "chat"), [
    ({"chatTemplate": "raw"}, False),   # prompt and response joined as text: /v1/completions
    ({"recordFormat": "messages", "promptField": DELETE, "responseField": DELETE}, True),
])
def test_the_prompt_command_matches_the_training_format(finetune_keys: dict[str, Any], chat: bool) -> None:
    """Issue 36 item 6: the printed command asks the model the way it was trained."""
    from workloads.serving_endpoint import prompt_command
    from workloads.serving_source import model_source

    m = model("finetune", {f"workloads.tune.finetune.{k}": v for k, v in finetune_keys.items()})
    w = m.workloads["chat"]
    assert (" --chat " in prompt_command(w, model_source(m, w))) is chat


def test_plain_records_on_a_model_without_a_template_are_asked_raw() -> None:
    from model.chat_templates import asked_on_chat

    assert asked_on_chat("auto", "prompt-completion", "openai-community/gpt2") is False  # no template: raw
    assert asked_on_chat("auto", "prompt-completion", "Qwen/Qwen2.5-7B-Instruct") is True
    assert asked_on_chat("zephyr", "alpaca", "openai-community/gpt2") is True  # a named template
    assert asked_on_chat("auto", "text", None) is False


def test_the_pod_waits_for_the_marker_in_a_hardened_init_container(finetune: RunResult) -> None:
    pod = _pod(finetune)
    (server,) = pod["containers"]
    (wait,) = pod["initContainers"]
    assert wait["name"] == "wait-for-model"
    assert wait["image"] == server["image"]  # already pulled for the server, pinned by digest
    assert wait["command"][:2] == ["sh", "-c"]
    assert wait["env"] == [{"name": "MARKER0", "value": MARKER}]
    # It reads the bucket through the pod's own FUSE mount, read-only, and nothing else.
    (gcs,) = [v for v in pod["volumes"] if "csi" in v]
    assert gcs["csi"]["readOnly"] is True
    assert wait["volumeMounts"] == [{"name": gcs["name"], "mountPath": "/gcs", "readOnly": True}]
    assert wait["securityContext"] == {"allowPrivilegeEscalation": False, "privileged": False,
                                       "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                                       "capabilities": {"drop": ["ALL"]}}
    assert wait["resources"] == {"requests": {"cpu": "100m", "memory": "64Mi"},
                                 "limits": {"cpu": "100m", "memory": "64Mi"}}
    # The probes start after the init containers: startupMinutes counts the load, not the training.
    assert server["startupProbe"]["httpGet"] == {"path": "/health", "port": "http", "scheme": "HTTP"}
    template = finetune.one(DEPLOYMENT, "chat-deployment").inputs["spec"]["template"]
    # GKE injects the FUSE sidecar (a native sidecar, first of the init containers since 1.29) for this annotation.
    assert template["metadata"]["annotations"]["gke-gcsfuse/volumes"] == "true"
    doc = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "chat"}, "spec": pod}
    kubernetes_validate.validate(doc, "1.33.0", strict=True)


def test_pulumi_up_does_not_wait_for_a_model_training_has_not_written(finetune: RunResult) -> None:
    assert finetune.one(DEPLOYMENT, "chat-deployment").inputs["metadata"]["annotations"].items() >= SKIP_AWAIT.items()
    # The Service would otherwise wait for ready endpoints (pulumi_kubernetes core/v1/Service's await logic).
    assert finetune.one(SERVICE, "chat-service").inputs["metadata"]["annotations"] == SKIP_AWAIT
    # Nor does the server wait for the training job's resources: they start side by side.
    job = finetune.one("deepspeed-stack:workloads:TrainingJob")
    server = finetune.one("deepspeed-stack:workloads:ModelServer")
    assert job.urn not in server.dependencies
    assert not any(d.startswith(job.urn) for d in finetune.one(DEPLOYMENT, "chat-deployment").dependencies)


def _fake_sleep(bin_dir: Path, marker: Path, text: str = '{"step": 3, "export": "adapter"}') -> None:
    """A `sleep` that writes the marker instead of sleeping: training finishes during the first wait."""
    sleep = bin_dir / "sleep"
    sleep.write_text(f"#!/bin/sh\necho sleep \"$1\" >> '{bin_dir}/slept'\necho '{text}' > '{marker}'\n")
    sleep.chmod(sleep.stat().st_mode | stat.S_IEXEC)


def test_the_wait_loop_ends_when_the_marker_appears(finetune: RunResult, tmp_path: Path) -> None:
    (wait,) = _pod(finetune)["initContainers"]
    marker = tmp_path / "models" / "tune" / ".complete"
    marker.parent.mkdir(parents=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_sleep(bin_dir, marker)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "MARKER0": str(marker)}
    done = subprocess.run(wait["command"], env=env, capture_output=True, text=True, timeout=30, check=True)
    assert f"waiting for {marker} (an adapter export, written last by the training workload tune)" in done.stdout
    assert done.stdout.rstrip().endswith('{"step": 3, "export": "adapter"}')
    assert (bin_dir / "slept").read_text() == "sleep 30\n"  # one wait, then the marker was there


def test_an_older_merged_models_marker_keeps_the_adapter_server_waiting(finetune: RunResult, tmp_path: Path) -> None:
    """MODEL_DIR of a run exported merged before the stack said adapter: its marker must not start a server that
    would load no adapter there; the wait goes on until an adapter's marker replaces it."""
    (wait,) = _pod(finetune)["initContainers"]
    marker = tmp_path / ".complete"
    marker.write_text('{"export": "merged", "step": 9}\n')
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_sleep(bin_dir, marker)  # the adapter export's marker appears during the first wait
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "MARKER0": str(marker)}
    done = subprocess.run(wait["command"], env=env, capture_output=True, text=True, timeout=30, check=True)
    assert done.stdout.count("waiting for") == 1
    assert (bin_dir / "slept").read_text() == "sleep 30\n"


def test_the_merged_model_is_served_as_it_is() -> None:
    from workloads.placement import placement
    from workloads.serving_command import lora_args, vllm_args
    from workloads.serving_pod import wait_script
    from workloads.serving_source import model_source

    m = model("finetune", MERGED)
    chat = m.workloads["chat"]
    source = model_source(m, chat)
    assert vllm_args(chat, placement(m, chat), source)[:4] == ["--model", "/gcs/models/tune", "--served-model-name",
                                                                "tune"]
    assert lora_args(source) == [] and source.adapters == ()
    # Any marker will do for a whole model; an adapter's must say it is one.
    assert "grep" not in wait_script(source.waits)
    assert "grep -q '\"export\": \"adapter\"'" in wait_script(model_source(model("finetune"), chat).waits)


# --- the rules ----------------------------------------------------------------------------------------------

def test_the_stack_previews_with_and_without_a_token() -> None:
    assert problems("finetune", {}) == []
    assert problems("finetune", {"hfToken": "v1:planted"}, ("hfToken",)) == []


def test_a_workload_that_is_not_there_is_refused() -> None:
    assert problems("finetune", {f"{S}.serving.fromWorkload": "tuen"}) == [
        f"{S}.serving.fromWorkload: no workload named 'tuen' in this stack; valid: the stack's workloads that train a "
        "model: tune; did you mean `tune`?"]


def test_itself_is_refused() -> None:
    assert problems("finetune", {f"{S}.serving.fromWorkload": "chat"}) == [
        f"{S}.serving.fromWorkload: chat is this server itself: nothing writes MODEL_DIR/.complete for it to serve; "
        "valid: the stack's workloads that train a model: tune"]


def test_a_workload_that_trains_nothing_is_refused() -> None:
    # The dws stack's MPIJob `pretrain` runs a script of its own: no MODEL_DIR, no marker.
    dws = config_model(changed("dws"))
    chat = config_model(changed("finetune")).workloads["chat"]
    chat = msgspec.structs.replace(chat, serving=msgspec.structs.replace(chat.serving, from_workload="pretrain"))
    stack = msgspec.structs.replace(dws, workloads={**dws.workloads, "chat": chat})
    assert lines(check_serve_from_workload(stack, chat)) == [
        f"{S}.serving.fromWorkload: pretrain is kind mpijob, which trains no model a server can load (only kind "
        "finetune, or an NVIDIA mpijob running finetune.py, writes MODEL_DIR and its marker): nothing writes "
        "MODEL_DIR/.complete for it to serve; valid: a workload of kind finetune (the stack has none)"]
    # The same MPIJob running the project's finetune.py keeps the contract: it may be served (from the bucket).
    pretrain = stack.workloads["pretrain"]
    trains = msgspec.structs.replace(pretrain, launch=msgspec.structs.replace(pretrain.launch, script="finetune.py"),
                                 gcs_fuse=msgspec.structs.replace(pretrain.gcs_fuse, enabled=True))
    assert trains.writes_model and not pretrain.writes_model
    stack = msgspec.structs.replace(stack, workloads={**stack.workloads, "pretrain": trains})
    assert lines(check_serve_from_workload(stack, chat)) == []


def test_a_model_on_the_trainers_claim_is_refused() -> None:
    # Without the bucket tune writes to its volume claim, which only its own namespace can mount.
    no_bucket = {f"{T}.gcsFuse.enabled": False, f"{T}.finetune.datasetPath": DELETE,
                 f"{T}.finetune.dataset": "tatsu-lab/alpaca", "workloads.board": DELETE}  # TensorBoard's: its own
    assert problems("finetune", no_bucket) == [
        f"{S}.serving.fromWorkload: tune writes its model to its volume claim (finetune-shared, namespace finetune), "
        f"which no other namespace can mount; set {T}.gcsFuse.enabled: true (storage.enabled) so that MODEL_DIR is in "
        "the stack's bucket"]


def test_the_server_reads_through_the_bucket() -> None:
    assert problems("finetune", {f"{S}.gcsFuse.enabled": False}) == [
        f"{S}.serving.fromWorkload: reads the stack's bucket through GCS FUSE; set {S}.gcsFuse.enabled: true (and "
        "storage.enabled: true)"]


def test_the_server_is_sized_as_what_training_trains() -> None:
    assert problems("finetune", {f"{S}.model.name": "Mistral-7B"}) == [
        f"{S}.model.name: Mistral-7B (32 heads, 8 KV heads, 32 layers), but {S}.serving.fromWorkload serves what "
        f"tune trains, {T}.finetune.model = Qwen2.5-7B (28 heads, 4 KV heads, 28 layers); set {S}.model.name: "
        "Qwen2.5-7B"]
    assert problems("finetune", {f"{S}.model.name": DELETE}) == [
        f"{S}.model.name: name the model the server is sized as (Qwen2.5-7B, what tune trains), or give "
        "model.parameters"]


def test_training_writes_16_bit_weights() -> None:
    assert problems("finetune", {f"{S}.model.precision": "int4"}) == [
        f"{S}.model.precision: int4 serves a checkpoint quantised that way, and training writes a 16-bit model; size "
        "what the folder holds (fp16 or bf16)"]


def test_the_readme_quotes_the_previews_cost(finetune: RunResult) -> None:
    from conftest import PROJECT_DIR

    running = finetune.outputs["costs"]["running"]
    # While it trains the server's node is up too (its pod waits in Init): the "both" figure; then serving alone.
    training, serving = running["all"]["perHour"], running["serving"]["perHour"]
    floor = finetune.outputs["costs"]["floorPerHour"]
    readme = (PROJECT_DIR / "docs" / "finetune.md").read_text(encoding="utf-8")
    section = readme[readme.index("## From an empty project to a prompt answered"):]
    assert f"**${training:,.2f}/h while it trains**" in section
    assert f"**${serving:,.2f}/h while it serves**" in section
    assert f"${floor:,.2f}/h idle" in section


ADAPTER_AS_MODEL = (
    f"{S}.serving.modelPath: {{path}} is where {T} writes its LoRA adapter ({T}.finetune.lora.export: adapter), not a "
    "whole model, and vLLM cannot load an adapter as one; serve it on its base: serving.model: "
    f"Qwen/Qwen2.5-7B-Instruct and {S}.serving.adapters: [tune] (or serving.fromWorkload: tune, which does both), or "
    "train with lora.export: merged for a whole model")


@pytest.mark.parametrize("path", ["models/tune", "models/tune/extra"])
def test_an_adapter_folder_given_as_a_whole_model_is_refused(path: str) -> None:
    # issue 42 item 4: tune exports its LoRA adapter alone (the default) to models/tune; as serving.modelPath vLLM
    # would take it for a whole model and fail at start.
    as_path = {f"{S}.serving.fromWorkload": DELETE, f"{S}.serving.modelPath": path}
    assert problems("finetune", as_path) == [ADAPTER_AS_MODEL.format(path=path)]
    # The merged export is a whole model there; another folder is not tune's.
    assert problems("finetune", {**as_path, **MERGED}) == []
    assert problems("finetune", {**as_path, f"{S}.serving.modelPath": "models/tuned"}) == []


def test_a_servers_length_is_checked_against_the_model_training_tunes() -> None:
    # issue 42 item 5: fromWorkload serves what tune trains on Qwen/Qwen2.5-7B-Instruct (config.json: 32,768
    # positions), whatever model.name says of its shape.
    assert problems("finetune", {f"{S}.model.sequenceLength": 40000, f"{S}.model.batchSize": 1}) == [
        f"{S}.model.sequenceLength: 40,000 tokens, but Qwen/Qwen2.5-7B-Instruct has 32,768 positions (config.json "
        "max_position_embeddings, data/models.yaml), and vLLM refuses a --max-model-len above it at start; set at "
        "most 32768"]
