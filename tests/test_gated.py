"""Gated models need a token (issue 19.2): a workload whose pods download a gated Hugging Face model is refused
at preview when the stack has no hfToken, naming the key and the fix; the example stacks deploy as written."""

from __future__ import annotations

import pytest
from conftest import DELETE, problems, yaml_load

from model.gated_models import DATA_PATH, gated_family
from planner.model_catalog import MODELS_PATH

MISTRAL = "mistralai/Mistral-7B-Instruct-v0.3"


def test_a_gated_served_model_without_a_token_is_refused() -> None:
    (msg,) = problems("serve", {"workloads.chat.serving.model": MISTRAL, "workloads.chat.model.name": "Mistral-7B"})
    assert msg.startswith(f"workloads.chat.serving.model: {MISTRAL} is gated on Hugging Face (data/gated_models.yaml: "
                          "Mistral 7B (base and instruct, v0.1-v0.3)) and the stack has no hfToken")
    assert f"https://huggingface.co/{MISTRAL}" in msg and "`pulumi config set --secret hfToken hf_...`" in msg


def test_with_a_token_it_deploys() -> None:
    changes = {"workloads.chat.serving.model": MISTRAL, "workloads.chat.model.name": "Mistral-7B",
               "hfToken": {"secure": "v1:planted"}}
    assert problems("serve", changes) == []


def test_a_model_from_the_bucket_downloads_nothing() -> None:
    changes = {"workloads.chat.serving.model": DELETE, "workloads.chat.serving.modelPath": "models/llama",
               "workloads.chat.gcsFuse.enabled": True, "storage": {"enabled": True}}
    assert [p for p in problems("serve", changes) if "gated" in p] == []


def test_omnias_gated_llama_on_gaudi_needs_the_token() -> None:
    llama = "meta-llama/Meta-Llama-3.1-8B-Instruct"
    (msg,) = problems("gaudi", {"workloads.gaudi-llm-ds-ft.training.model": llama})
    assert msg.startswith(f"workloads.gaudi-llm-ds-ft.training.model: {llama} is gated")
    # The training.model default is Omnia's Llama too: left out, it is still refused.
    (msg,) = problems("gaudi", {"workloads.gaudi-llm-ds-ft.training.model": DELETE})
    assert msg.startswith(f"workloads.gaudi-llm-ds-ft.training.model: {llama} is gated")
    # A job with its own launch command does not run the Omnia trainer that downloads training.model.
    assert problems("gaudi", {"workloads.gaudi-llm-ds-ft.training.model": llama,
                              "workloads.gaudi-llm-ds-ft.launch.command": "python train.py"}) == []


@pytest.mark.parametrize(("model_id", "gated"), [
    ("meta-llama/Llama-2-7b-hf", True), ("META-LLAMA/llama-2-7B-HF", True),  # the Hub ignores case
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", True), ("google/gemma-2-9b-it", True),
    ("Qwen/Qwen2.5-7B-Instruct", False), ("tiiuae/falcon-7b", False), ("openai-community/gpt2", False),
    ("google/flan-t5-base", False),
])
def test_gated_families(model_id: str, gated: bool) -> None:
    assert (gated_family(model_id) is not None) is gated


def test_every_known_model_of_a_gated_org_is_gated() -> None:
    with open(MODELS_PATH, encoding="utf-8") as fh:
        aliases = [a for m in yaml_load(fh)["models"].values() for a in m.get("aliases", [])]
    gated_orgs = ("meta-llama/", "mistralai/", "google/gemma")
    assert [a for a in aliases if a.lower().startswith(gated_orgs) and gated_family(a) is None] == []


def test_the_data_file_says_how_each_entry_is_known() -> None:
    with open(DATA_PATH, encoding="utf-8") as fh:
        entries = yaml_load(fh)["gated"]
    for e in entries:
        assert e["status"] in ("confirmed", "assumed"), e
        assert e["seen"] or e["status"] == "assumed", e  # a confirmed family names the repos seen gated
        assert all(gated_family(s) is not None for s in e["seen"]), e


# --- issue 31.5: a gated model anywhere a workload downloads it, script arguments included -----------------------

LLAMA_70B = "meta-llama/Llama-3.1-70B"
FOLDER_HINT = f" (if {LLAMA_70B} is a folder, not a Hugging Face id, give its absolute path)"


def _finetune_py(args: list[str], **more: object) -> list[str]:
    """The h100 MPIJob running finetune.py with `args`: its gated-model problems."""
    changes = {"workloads.smoke.launch.script": "finetune.py", "workloads.smoke.launch.args": args, **more}
    return [p for p in problems("h100", changes) if "is gated" in p]


def test_a_gated_model_in_an_mpijobs_script_arguments_needs_the_token() -> None:
    (msg,) = _finetune_py(["--model", LLAMA_70B, "--dataset", "/data/train.jsonl"])
    assert msg.startswith(f"workloads.smoke.launch.args[1]: {LLAMA_70B} is gated on Hugging Face (data/"
                          "gated_models.yaml: Meta Llama (Llama 2, Llama 3/3.1/3.2/3.3, Code Llama under meta-llama/)) "
                          "and the stack has no hfToken")
    assert msg.endswith(FOLDER_HINT)
    (msg,) = _finetune_py([f"--model={LLAMA_70B}", "--dataset", "/data/train.jsonl"])
    assert msg.startswith(f"workloads.smoke.launch.args[0]: {LLAMA_70B} is gated")
    # With the token, a folder on the claim, or an open model: nothing to refuse.
    assert _finetune_py(["--model", LLAMA_70B], **{"hfToken": {"secure": "v1:planted"}}) == []
    assert _finetune_py(["--model", f"/data/{LLAMA_70B}", "--dataset", "/data/train.jsonl"]) == []
    assert _finetune_py(["--model", "Qwen/Qwen2.5-72B", "--dataset", "/data/train.jsonl"]) == []


def test_a_gated_model_in_a_launch_command_needs_the_token() -> None:
    changes = {"workloads.smoke.launch.command": f"python /data/train.py --model_name_or_path '{LLAMA_70B}'",
               "workloads.smoke.launch.args": DELETE}
    (msg,) = [p for p in problems("h100", changes) if "is gated" in p]
    assert msg.startswith(f"workloads.smoke.launch.command: {LLAMA_70B} is gated") and msg.endswith(FOLDER_HINT)


def test_the_planners_training_stack_is_checked_with_the_token_it_asks_for() -> None:
    """`make gpus MODEL=Llama-3.1-70B MODE=training` writes the finetune kind training every parameter of the id
    (issue 28.3; it wrote an MPIJob of finetune.py with `--model <id>`): the writer knows it downloads a gated model
    (its header asks for hfToken, and it checks the plan as it will run), and the plan as written, without the
    token, is refused at the key that names it."""
    from conftest import config_problems

    from planner import stack_writer
    from planner.model_catalog import resolve
    from planner.requests import mode_request
    from preview import write_stack_choice

    request = mode_request(stack_writer.TRAINING, resolve("Llama-3.1-70B"))
    candidate = stack_writer.candidates(request, "us-central1", "big", writer=stack_writer.TRAINING)[0]
    (workload,) = candidate.config["deepspeed-stack:workloads"].values()
    assert (workload["kind"], workload["finetune"]["model"]) == ("finetune", LLAMA_70B)
    assert write_stack_choice.gated_model(candidate) == LLAMA_70B
    (name,) = candidate.config["deepspeed-stack:workloads"]
    gated = [p for p in config_problems(candidate.config) if "is gated" in p]
    assert [p.split(":")[0] for p in gated] == [f"workloads.{name}.finetune.model"]


@pytest.mark.parametrize(("args", "ids"), [
    (["--model", "meta-llama/Llama-3.1-70B", "--seq-len", "2048"], [(1, "meta-llama/Llama-3.1-70B")]),
    (["--model_name_or_path=Qwen/Qwen2.5-7B"], [(0, "Qwen/Qwen2.5-7B")]),
    (["--dataset", "/data/x/train.jsonl", "--out", "./a/b", "gs://bucket/x", "--lr", "1e-5"], []),
])
def test_what_counts_as_a_hugging_face_id_in_arguments(args: list[str], ids: list[tuple[int, str]]) -> None:
    from model.training_blocks import hub_ids

    assert hub_ids(args) == ids


# The vertex stack running your own script (not the recipe, whose --model the stack sets from vertex.finetune).
YOUR_SCRIPT = {"vertex.finetune": DELETE, "vertex.deepspeed": DELETE, "vertex.launch.script": "/gcs/b/code/train.py"}


def test_the_vertex_job_gets_no_token_so_a_gated_model_in_its_arguments_is_refused() -> None:
    args = ["--model", LLAMA_70B]
    (msg,) = problems("vertex", {**YOUR_SCRIPT, "vertex.launch.args": args})
    assert msg.startswith(f"vertex.launch.args[1]: {LLAMA_70B} is gated on Hugging Face (data/gated_models.yaml: "
                          "Meta Llama") and "the stack gives the Vertex AI job no token" in msg
    # hfToken does not reach it: still refused.
    assert problems("vertex", {**YOUR_SCRIPT, "vertex.launch.args": args, "hfToken": {"secure": "v1:planted"}}) == [msg]
    assert problems("vertex", {**YOUR_SCRIPT, "vertex.launch.args": ["--model", "/gcs/bucket/models/llama"]}) == []


def test_the_vertex_recipe_downloading_a_gated_model_is_refused() -> None:
    """vertex.finetune.model is downloaded by every replica of the CustomJob, which gets no token (issue 31 item 5:
    a gated model anywhere a workload downloads it)."""
    found = problems("vertex", {"vertex.finetune.model": LLAMA_70B})
    (msg,) = [p for p in found if " is gated on " in p]
    assert msg.startswith(f"vertex.finetune.model: {LLAMA_70B} is gated on Hugging Face (data/gated_models.yaml: "
                          "Meta Llama") and "give finetune.modelPath, its folder in the bucket," in msg
    # the other problem: a 70B does not fit the example's two T4s (the fit check, as on GKE)
    (fit,) = [p for p in found if p != msg]
    assert "needs" in fit and "nvidia-tesla-t4 has 16 GB" in fit
    assert sorted(problems("vertex", {"vertex.finetune.model": LLAMA_70B, "hfToken": {"secure": "v1:planted"}})) == \
        sorted([msg, fit])
    assert problems("vertex", {"vertex.finetune.model": DELETE, "vertex.finetune.modelPath": "models/llama"}) == []
