"""A gated model needs a token: one named rule.

Meta's Llama, Mistral's and Google's Gemma repos ask each account to accept their terms; a pod that downloads one
without a token gets 401 and crash-loops (data/gated_models.yaml, with sources). A workload's kind says which
model ids its pods download (`hub_models`: the kind's model keys, and the ids its script's arguments name); without
`hfToken` a gated one is refused before anything is created.
"""

from __future__ import annotations

from checks.common import Check, at
from model.config_read import secret_ways
from model.gated_models import gated_family
from model.problems import Problem
from model.training_blocks import hub_ids
from model.types import StackConfig

OPEN_EXAMPLE = "Qwen/Qwen2.5-7B-Instruct"  # Apache-2.0, not gated; its shape is in data/models.yaml


def check_gated_models_have_a_token(m: StackConfig) -> list[Problem]:
    if m.hf_token is not None:
        return []
    problems = []
    for name, w in m.workloads.items():
        for key, model_id in w.hub_models():
            family = gated_family(model_id)
            if family is None:
                continue
            # A script's argument may be a folder (relative to its working directory) that happens to look like an id.
            folder = (f" (if {model_id} is a folder, not a Hugging Face id, give its absolute path)"
                      if key[0] == "launch" else "")
            problems.append(
                Problem(at('workloads', name, *key), f"{model_id} is gated on Hugging Face (data/gated_models.yaml: "
                f"{family.family}) and the stack has no hfToken, so the download would fail with 401 and the "
                f"pod crash-loop. Accept the model's terms at https://huggingface.co/{model_id} with your account, "
                f"then give the stack a read token of that account: {secret_ways('hfToken')}; or use a model that "
                f"is not gated, e.g. {OPEN_EXAMPLE}{folder}"))
    return problems


def check_vertex_job_downloads_no_gated_model(m: StackConfig) -> list[Problem]:
    """The Vertex AI job gets no Hugging Face token from the stack (hfToken reaches the GKE pods only), so a gated id
    it downloads, in its script's arguments or as the recipe's `vertex.finetune.model`, fails with 401 whatever the
    stack holds."""
    if not m.vertex.enabled:
        return []
    recipe = m.vertex.finetune
    named = [(("vertex", "launch", "args", j), model_id) for j, model_id in hub_ids(m.vertex.launch.args)]
    if recipe is not None and recipe.model:
        named.append((("vertex", "finetune", "model"), recipe.model))
    instead = {"model": "give finetune.modelPath, its folder in the bucket,"}
    return [Problem(at(*key), f"{model_id} is gated on Hugging Face (data/gated_models.yaml: {family.family}), and the "
            "stack gives the Vertex AI job no token (hfToken reaches the GKE pods only), so its download would fail "
            f"with 401. Copy the model into the stack's bucket and "
            f"{instead.get(key[-1], 'pass its /gcs/<bucket>/... folder')}, or use a model that is not gated, "
            f"e.g. {OPEN_EXAMPLE}")
            for key, model_id in named if (family := gated_family(model_id)) is not None]


CHECKS: list[Check] = [check_gated_models_have_a_token, check_vertex_job_downloads_no_gated_model]
