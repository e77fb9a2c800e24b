"""kind serve's rules on what model is served (workloads/kinds/serve.py lists them): exactly one source, a
`serving.fromWorkload` that trains, the served model is the sized one (data/models.yaml), and its context length.
"""

from __future__ import annotations

from model.problems import Problem
from model.suggest import did_you_mean
from model.types import ServeWorkloadConfig, StackConfig, WorkloadConfig
from model.validators import at, or_list
from planner.model_catalog import known_models
from planner.model_ids import id_problem


def check_serve_model_source(m: StackConfig, w: ServeWorkloadConfig) -> list[Problem]:
    """Exactly one of a Hugging Face id, a folder of the bucket and a training workload's output; the last two
    read the bucket through GCS FUSE."""
    s = w.serving
    key = at("workloads", w.name, "serving")
    given = [k for k, v in (("model", s.model), ("modelPath", s.model_path), ("fromWorkload", s.from_workload)) if v]
    if len(given) != 1:
        found = f" (got {' and '.join(given)})" if given else ", e.g. model: Qwen/Qwen2.5-7B-Instruct"
        return [Problem(key,
                        f"set exactly one of model (a Hugging Face id), modelPath (a folder of the stack's bucket) and "
                        f"fromWorkload (a training workload of this stack){found}")]
    if given[0] != "model" and not w.gcs_fuse.enabled:
        return [Problem(f"{key}.{given[0]}", f"reads the stack's bucket through GCS FUSE; set "
                f"{at('workloads', w.name, 'gcsFuse', 'enabled')}: true (and storage.enabled: true)")]
    problem = id_problem(s.model, at("workloads", w.name, "serving", "modelPath")) if s.model else None
    return [Problem(f"{key}.model", f"{problem}")] if problem else []


def _trainers(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    return [n for n, t in m.workloads.items() if n != w.name and t.writes_model and t.model_folder is not None]


def check_serve_from_workload(m: StackConfig, w: ServeWorkloadConfig) -> list[Problem]:
    """`serving.fromWorkload` names another workload of the stack that trains a model into the bucket (MODEL_DIR of
    the fine-tuning contract): not itself, not a workload that trains nothing, not one writing to its own claim."""
    name = w.serving.from_workload
    if not name:
        return []
    key = at("workloads", w.name, "serving", "fromWorkload")
    trainers = _trainers(m, w)
    valid = (f"the stack's workloads that train a model: {or_list(trainers)}" if trainers else
             "a workload of kind finetune (the stack has none)")
    target = m.workloads.get(name)
    if target is None:
        return [no_such_workload(m, w, name, key, valid)]
    if name == w.name or not target.writes_model or target.model_folder is None:
        what = "is this server itself" if name == w.name else (
            f"is kind {target.kind}, which trains no model a server can load (only kind finetune, or an NVIDIA "
            "mpijob running finetune.py, writes MODEL_DIR and its marker)")
        return [Problem(key, f"{name} {what}: nothing writes MODEL_DIR/.complete for it to serve; valid: {valid}")]
    if not target.gcs_fuse.enabled:
        claim = target.claim.claim_name if target.claim else "storage"
        return [Problem(key,
                        f"{name} writes its model to its volume claim ({claim}, namespace {target.namespace}), which "
                        "no other namespace can mount; set "
                f"{at('workloads', name, 'gcsFuse', 'enabled')}: true (storage.enabled) so that MODEL_DIR is in the "
                "stack's bucket")]
    return []


def _catalog_name(text: str | None) -> str | None:
    entry = known_models().get(text.lower()) if text else None
    return entry["name"] if entry else None


def _shape_text(name: str) -> str:
    entry = known_models()[name.lower()]
    return f"{entry['heads']} heads, {entry['kvHeads']} KV heads, {entry['layers']} layers"


def check_serve_model_identity(m: StackConfig, w: ServeWorkloadConfig) -> list[Problem]:
    """The served model is the sized model (issue 20 item 4): `serving.model` resolves through data/models.yaml to
    the entry `model.name` names (without `model.name` its shape is the sized one); the model training writes is
    the model the server is sized as."""
    mb, s = w.model, w.serving
    if mb is None:
        return []
    name_key, served_key = at("workloads", w.name, "model", "name"), at("workloads", w.name, "serving", "model")
    sized = _catalog_name(mb.name)
    if not w.sized_model_name and mb.parameters is None and not s.from_workload:
        return [Problem(name_key,
                        "give the model's name (a model in data/models.yaml) or model.parameters (billions) for "
                        "the planner's memory check")]
    if s.model:
        served = _catalog_name(s.model)
        if served is None and not mb.name and mb.parameters is None:
            return [Problem(served_key,
                            f"{s.model} is not in data/models.yaml, so the planner cannot size it from its id; "
                            f"set {name_key} (a listed model of the same shape) or model.parameters")]
        if served is not None and sized is not None and served != sized:
            return [Problem(served_key, f"{s.model} is {served} in data/models.yaml ({_shape_text(served)}), but "
                    f"{name_key} is {mb.name} ({_shape_text(sized)}): the planner sized another model. Set "
                    f"{name_key}: {served}, or leave it out (the shape then comes from {served_key})")]
    trainer = m.workloads.get(s.from_workload or "")
    if trainer is not None and trainer.writes_model and trainer.model_folder is not None:
        trained = _trained_model(trainer)
        if not mb.name and mb.parameters is None:
            hint = f" ({trained[1]}, what {s.from_workload} trains)" if trained else ""
            return [Problem(name_key, f"name the model the server is sized as{hint}, or give model.parameters")]
        if trained is not None and sized is not None and trained[1] != sized:
            key, catalog_name = trained
            return [Problem(name_key, f"{mb.name} ({_shape_text(sized)}), but "
                    f"{at('workloads', w.name, 'serving', 'fromWorkload')} serves what {s.from_workload} trains, "
                    f"{at('workloads', s.from_workload, *key)} = {catalog_name} ({_shape_text(catalog_name)}); set "
                    f"{name_key}: {catalog_name}")]
    return []


def _positions(text: str | None) -> tuple[int, str] | None:
    """The context length data/models.yaml records for a name or id (its `maxPositionsOf`, else `maxPositions`),
    with the entry's name; None where the catalog does not list it."""
    entry = known_models().get(text.lower()) if text else None
    if entry is None or "maxPositions" not in entry:
        return None
    own = {k.lower(): v for k, v in entry.get("maxPositionsOf", {}).items()}
    return int(own.get(text.lower(), entry["maxPositions"])), text if text.lower() in own else entry["name"]


def check_serve_context_length(m: StackConfig, w: ServeWorkloadConfig) -> list[Problem]:
    """vLLM refuses to start with --max-model-len (`model.sequenceLength`) above the model's positions (config.json
    max_position_embeddings, data/models.yaml `maxPositions`). The model is the served id, else the Hugging Face id
    fromWorkload trains, else `model.name`; a model the catalog does not list is not checked."""
    if w.model is None:
        return []
    trainer = m.workloads.get(w.serving.from_workload or "")
    names = [w.serving.model, *(hf for _, hf in (trainer.hub_models() if trainer else ())), w.model.name]
    limit = next((found for found in map(_positions, names) if found is not None), None)
    if limit is None or w.model.sequence_length <= limit[0]:
        return []
    return [Problem(at('workloads', w.name, 'model', 'sequenceLength'), f"{w.model.sequence_length:,} tokens, but "
            f"{limit[1]} has {limit[0]:,} positions (config.json max_position_embeddings, data/models.yaml), and "
            f"vLLM refuses a --max-model-len above it at start; set at most {limit[0]}")]


def _trained_model(trainer: WorkloadConfig) -> tuple[tuple[str, ...], str] | None:
    """The data/models.yaml entry a training workload trains, with the key that names it: its `model.name`, else
    the Hugging Face id it downloads (a finetune's `finetune.model`); None where neither is listed."""
    if (name := _catalog_name(trainer.sized_model_name)) is not None:
        return trainer.sized_model_key, name
    for key, hf_id in trainer.hub_models():
        if (name := _catalog_name(hf_id)) is not None:
            return key, name
    return None


def no_such_workload(m: StackConfig, w: ServeWorkloadConfig, name: str, key: str, valid: str) -> str:
    """`name` names no workload of the stack: what would be valid, and the closest names."""
    known = sorted(n for n in m.workloads if n != w.name)
    return Problem(key, f"no workload named {name!r} in this stack; valid: {valid}{did_you_mean(name, known)}")


def warn_unlisted_model(m: StackConfig, w: ServeWorkloadConfig) -> list[Problem]:
    """An id data/models.yaml does not list cannot be compared with `model.name`."""
    mb, s = w.model, w.serving
    if mb is None or not s.model or _catalog_name(s.model) is not None or not (mb.name or mb.parameters):
        return []
    return [Problem(at('workloads', w.name, 'serving', 'model'),
                    f"{s.model} is not in data/models.yaml, so the stack cannot "
            f"confirm it has the shape of the sized model ({mb.name or f'{mb.parameters:g}B'}); add it to that entry's "
            "aliases if it is")]
