"""Model ids checked where they are written (issue 36 item 7): the hub takes OWNER/NAME, and a typo of a listed id
is refused with "did you mean" at finetune.model (GKE), vertex.finetune.model and serving.model, before anything is
created; an id the catalog does not list, and a bucket folder, still pass."""

from __future__ import annotations

import pytest
from conftest import problems

from planner.model_ids import id_problem

NO_OWNER = ("'Llama-3.1-70B-Instruct' is not a Hugging Face id: the hub needs OWNER/NAME (the organisation or user, "
            "then the repository); did you mean `meta-llama/Llama-3.1-70B-Instruct`?; a model in the bucket goes in ")
TYPO = ("'Qwen/Qwen2.5-7B-Instuct' is not a model data/models.yaml lists, and it is 'Qwen/Qwen2.5-7B-Instruct' with "
        "letters changed; did you mean `Qwen/Qwen2.5-7B-Instruct`? (The hub would answer 404 once GPU nodes are up.)")


@pytest.mark.parametrize("value", ["Qwen/Qwen2.5-7B-Instruct", "qwen/qwen2.5-7b-instruct", "my-org/my-model",
                                   "Qwen/Qwen2.5-7B-Instruct-1M", "meta-llama/Llama-3.3-70B-Instruct"])
def test_listed_ids_and_others_repositories_pass(value: str) -> None:
    # A listed id in any case (the hub ignores it), an id of one's own, a listed id with more after it and one with
    # another version number: real repositories the catalog does not list.
    assert id_problem(value, "k") is None


def test_no_owner_and_typos_are_refused() -> None:
    assert id_problem("Llama-3.1-70B-Instruct", "k") == NO_OWNER + "k"
    assert id_problem("Qwen/Qwen2.5-7B-Instuct", "k") == TYPO
    assert id_problem("gpt2", "k").startswith("'gpt2' is not a Hugging Face id") and "`openai-community/gpt2`" in \
        id_problem("gpt2", "k")


def test_finetune_model_is_refused_at_its_key() -> None:
    found = problems("finetune", {"workloads.tune.finetune.model": "Llama-3.1-70B-Instruct",
                                  "workloads.chat.model.name": "Llama-3.1-70B"})
    assert f"workloads.tune.finetune.model: {NO_OWNER}workloads.tune.finetune.modelPath" in found
    # With model.name the run was sized anyway: the typo was printed in the tables and failed on the GPU nodes.
    found = problems("finetune", {"workloads.tune.finetune.model": "Qwen/Qwen2.5-7B-Instuct",
                                  "workloads.tune.model": {"name": "Qwen2.5-7B"}})
    assert f"workloads.tune.finetune.model: {TYPO}" in found


def test_vertex_and_serving_models_are_refused_at_their_keys() -> None:
    found = problems("vertex", {"vertex.finetune.model": "facebook/opt-125n"})
    assert ("vertex.finetune.model: 'facebook/opt-125n' is not a model data/models.yaml lists, and it is "
            "'facebook/opt-125m' with letters changed; did you mean `facebook/opt-125m`? (The hub would answer 404 "
            "once GPU nodes are up.)") in found
    found = problems("vertex", {"vertex.finetune.model": "opt-125m"})
    assert any(p.startswith("vertex.finetune.model: 'opt-125m' is not a Hugging Face id") and
               "`facebook/opt-125m`" in p for p in found)
    found = problems("serve", {"workloads.chat.serving.model": "Qwen2.5-7B-Instruct"})
    assert ("workloads.chat.serving.model: 'Qwen2.5-7B-Instruct' is not a Hugging Face id: the hub needs OWNER/NAME "
            "(the organisation or user, then the repository); did you mean `Qwen/Qwen2.5-7B-Instruct`?; a model in "
            "the bucket goes in workloads.chat.serving.modelPath") in found
