"""kind serve: a model server Deployment (vLLM, or DeepSpeed-MII) on one GKE GPU pool.

Config: ServeWorkloadConfig (model/workload_types.py; its keys: the common ones and `serving`). Builder: the
ModelServer component (workloads/serving.py). Summary: the model, GPUs per replica, replicas, the in-cluster
endpoint, the port-forward and prompt commands (`workloads.<name>`, and `servingEndpoints.<name>`).

One replica per node, the model tensor-parallel over that node's GPUs: the engine (`serving.engine`, facts in
data/serving.yaml through model/serving_engines.py) must run on the pool's GPU, serve the precision there and split
the model's attention heads over those GPUs; the planner's estimate for that engine must fit; what would is
searched on one node of each GPU type. The served model is the sized one (`serving.model` through
data/models.yaml), and a server of what training writes (`serving.fromWorkload`) names a workload that trains.
LoRA adapters (`serving.adapters`, or fromWorkload's when it exports one) come from finetune workloads that export
one, trained on the base the server serves, with a rank vLLM's --max-lora-rank holds; vLLM serves them (MII
cannot), and their memory is sized with the model. `serving.evaluation` scores them before they are served (an
evaluator container, workloads/serving_evaluator.py): only with adapters, read from the bucket.
"""

from __future__ import annotations

import ipaddress

import msgspec
import pulumi

from model import catalog as gpu_catalog
from model import chat_templates, serving_engines, versions
from model.config import workload_default
from model.serving_engines import MII, VLLM, Engine, capability_text
from model.suggest import did_you_mean
from model.types import FinetuneWorkloadConfig, ServeWorkloadConfig, StackConfig, WorkloadConfig
from model.validators import DNS1123_LABEL, at, or_list
from planner.cost import pool_costs
from planner.model_ids import id_problem
from planner.recommend import Option, cheapest_for_gpu, serving_problem, short_name
from planner.requests import workload_request
from planner.sizing import INFERENCE, Request, estimate, known_models
from workloads.kinds.kind import Built, Kind, Platform
from workloads.kinds.shared import changed_keys
from workloads.placement import placement
from workloads.serving import ModelServer, ModelServerArgs, most_replicas, surge_node_spare
from workloads.serving_command import engine_of, mii_reserved_ports, served_port
from workloads.serving_source import (
    adapter_names,
    adapter_trainer,
    model_source,
    served_base,
    trained_base,
    vllm_lora_rank,
)

SUGGESTIONS = 3
# What `servingEndpoints.<name>` exports of a server's summary: how to reach it.
ENDPOINT_KEYS = ("endpoint", "portForward", "prompt", "servedModel", "loadBalancerIp")


def _pool_index(m: StackConfig, w: ServeWorkloadConfig) -> int | None:
    pool = m.pool(w.pool or "")
    return m.node_pools.index(pool) if pool is not None else None


def _image_runs(m: StackConfig, w: ServeWorkloadConfig, capability: tuple[int, int]) -> bool:
    """The stack's image has torch kernels for the GPU (a prebuilt image or the workload's own is the user's)."""
    return bool(m.image.prebuilt or w.image) or versions.load().supports(capability)


def _runs(m: StackConfig, w: ServeWorkloadConfig, e: Engine, gpu_type: str) -> bool:
    gpu = gpu_catalog.load().gpus[gpu_type]
    return e.runs_kernels_on(gpu.compute_capability) and _image_runs(m, w, gpu.compute_capability)


def _servable_gpus(m: StackConfig, w: ServeWorkloadConfig, e: Engine) -> list[str]:
    """GPU types the engine runs on that the stack's region offers, cheapest GPU-hour first."""
    cat = gpu_catalog.load()
    return sorted((g for g in cat.gpus if _runs(m, w, e, g) and cat.zones(g, m.region)), key=lambda g: cat.gpu_hour(g))


def _gpu_text(gpu_type: str) -> str:
    gpu = gpu_catalog.load().gpus[gpu_type]
    return f"{short_name(gpu.display_name)} ({gpu_type}, {gpu.compute_capability_text})"


def _alternatives(m: StackConfig, w: ServeWorkloadConfig, e: Engine) -> str:
    servable = _servable_gpus(m, w, e)
    if not servable:
        return f"no GPU {e.display_name} runs on is offered in {m.region} (data/gpu_catalog.yaml); pick another region"
    cat = gpu_catalog.load()
    best = cat.gpus[servable[0]]
    shape = min(best.shapes, key=lambda sh: (sh.gpus, sh.price.on_demand))
    others = [_gpu_text(g) for g in servable[:3]]
    return (f"serve from a pool of {short_name(best.display_name)} instead (gpu.type {best.name}, e.g. machineType "
            f"{shape.machine_type}); GPUs it runs on in {m.region}, cheapest first: {or_list(others)}")


def check_serve_accelerator(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """The server runs on NVIDIA GPUs of a GKE pool (the pool rules themselves: checks/workloads.py)."""
    if w.on_nvidia:
        return []
    return [f"{at('workloads', w.name, 'accelerator', 'kind')}: kind serve runs vLLM or DeepSpeed-MII on NVIDIA GKE "
            f"pools only, got {w.accelerator.kind}"]


def check_serve_engine_gpu(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """The engine's kernels run on the pool's GPU: MII's deepspeed-kernels only on compute capability 8.0, 8.6, 8.9
    and 9.0 (no T4, no B200); vLLM from 7.0, in the image's torch (no V100 or P100)."""
    pool = m.pool(w.pool or "")
    gpu = gpu_catalog.load().gpus.get(pool.gpu.type) if pool else None
    if pool is None or gpu is None:
        return []
    e, cc = engine_of(w), gpu.compute_capability
    where = (f"pool {pool.name} has {short_name(gpu.display_name)} ({gpu.name}), compute capability "
             f"{capability_text(cc)}")
    if e.name == MII and not e.runs_kernels_on(cc):
        vllm = serving_engines.engine(VLLM)
        on_pool = "engine vllm (the default) on this pool, or " if _runs(m, w, vllm, gpu.name) else ""
        return [f"{at('workloads', w.name, 'serving', 'engine')}: mii cannot run on {where}: DeepSpeed-MII's FastGen "
                f"kernels (deepspeed-kernels) are built for compute capability {e.kernel_archs_text()} only "
                f"(data/serving.yaml). Valid: {on_pool}engine mii on a pool of A100, L4, H100 or H200; "
                f"{_alternatives(m, w, e)}"]
    if not e.runs_kernels_on(cc):
        return [f"{at('workloads', w.name, 'pool')}: {where}; {e.display_name} needs compute capability "
                f"{capability_text(e.min_compute_capability)} or newer (data/serving.yaml). {_alternatives(m, w, e)}"]
    if not _image_runs(m, w, cc):
        vs = versions.load()
        return [f"{at('workloads', w.name, 'pool')}: {where}, and the stack's image runs torch {vs.python['torch']} "
                f"(CUDA {vs.cuda}) with kernels for compute capability {vs.torch_archs_text()} only "
                f"(data/versions.yaml): {e.display_name} would fail at its first kernel. {_alternatives(m, w, e)}"]
    return []


def check_serve_model_block(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """The planner sizes every server: a `model` block in inference mode, in a precision the engine serves there."""
    mb, e = w.model, engine_of(w)
    if mb is None:
        return [f"{at('workloads', w.name, 'model')}: a serve workload needs its model block for the planner's "
                "memory check, e.g. {name: Qwen2.5-7B, mode: inference, sequenceLength: 4096}"]
    problems = []
    key = at("workloads", w.name, "model", "precision")
    if mb.mode != "inference":
        problems.append(f"{at('workloads', w.name, 'model', 'mode')}: a serve workload is sized for inference "
                        f"(weights + KV cache), got {mb.mode}; set mode: inference")
    if mb.precision not in e.precisions:
        problems.append(f"{key}: {e.display_name} serves {or_list(list(e.precisions))}, not {mb.precision}; the "
                        f"planner can still size {mb.precision} (`make gpus ... MODE=inference "
                        f"PRECISION={mb.precision}`), but this server cannot run it"
                        + ("; engine vllm (the default) serves int8/int4 checkpoints" if e.name == MII
                           and mb.precision in serving_engines.engine(VLLM).precisions else ""))
        return problems
    pool = m.pool(w.pool or "")
    gpu = gpu_catalog.load().gpus.get(pool.gpu.type) if pool else None
    if mb.precision == "bf16" and gpu is not None and not (gpu.bf16 and e.serves_bf16_on(gpu.compute_capability)):
        problems.append(f"{key}: {short_name(gpu.display_name)} (compute capability {gpu.compute_capability_text}) "
                        f"has no bf16, and {e.display_name} refuses it there; set precision: fp16 (the same bytes, "
                        "--dtype float16)")
    if mb.precision in e.quantised and (w.serving.from_workload or w.serving.model_path):
        what = "training writes a 16-bit model" if w.serving.from_workload else "the stack quantises nothing"
        problems.append(f"{key}: {mb.precision} serves a checkpoint quantised that way, and {what}; size what the "
                        "folder holds (fp16 or bf16)")
    return problems


def check_serve_model_source(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """Exactly one of a Hugging Face id, a folder of the bucket and a training workload's output; the last two
    read the bucket through GCS FUSE."""
    s = w.serving
    key = at("workloads", w.name, "serving")
    given = [k for k, v in (("model", s.model), ("modelPath", s.model_path), ("fromWorkload", s.from_workload)) if v]
    if len(given) != 1:
        found = f" (got {' and '.join(given)})" if given else ", e.g. model: Qwen/Qwen2.5-7B-Instruct"
        return [f"{key}: set exactly one of model (a Hugging Face id), modelPath (a folder of the stack's bucket) and "
                f"fromWorkload (a training workload of this stack){found}"]
    if given[0] != "model" and not w.gcs_fuse.enabled:
        return [f"{key}.{given[0]}: reads the stack's bucket through GCS FUSE; set "
                f"{at('workloads', w.name, 'gcsFuse', 'enabled')}: true (and storage.enabled: true)"]
    problem = id_problem(s.model, at("workloads", w.name, "serving", "modelPath")) if s.model else None
    return [f"{key}.model: {problem}"] if problem else []


def _trainers(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    return [n for n, t in m.workloads.items() if n != w.name and t.writes_model and t.model_folder is not None]


def check_serve_from_workload(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
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
        return [_no_such_workload(m, w, name, key, valid)]
    if name == w.name or not target.writes_model or target.model_folder is None:
        what = "is this server itself" if name == w.name else (
            f"is kind {target.kind}, which trains no model a server can load (only kind finetune, or an NVIDIA "
            "mpijob running finetune.py, writes MODEL_DIR and its marker)")
        return [f"{key}: {name} {what}: nothing writes MODEL_DIR/.complete for it to serve; valid: {valid}"]
    if not target.gcs_fuse.enabled:
        claim = target.claim.claim_name if target.claim else "storage"
        return [f"{key}: {name} writes its model to its volume claim ({claim}, namespace {target.namespace}), which "
                "no other namespace can mount; set "
                f"{at('workloads', name, 'gcsFuse', 'enabled')}: true (storage.enabled) so that MODEL_DIR is in the "
                "stack's bucket"]
    return []


def _catalog_name(text: str | None) -> str | None:
    entry = known_models().get(text.lower()) if text else None
    return entry["name"] if entry else None


def _shape_text(name: str) -> str:
    entry = known_models()[name.lower()]
    return f"{entry['heads']} heads, {entry['kvHeads']} KV heads, {entry['layers']} layers"


def check_serve_model_identity(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """The served model is the sized model (issue 20 item 4): `serving.model` resolves through data/models.yaml to
    the entry `model.name` names (without `model.name` its shape is the sized one); the model training writes is
    the model the server is sized as."""
    mb, s = w.model, w.serving
    if mb is None:
        return []
    name_key, served_key = at("workloads", w.name, "model", "name"), at("workloads", w.name, "serving", "model")
    sized = _catalog_name(mb.name)
    if not w.sized_model_name and mb.parameters is None and not s.from_workload:
        return [f"{name_key}: give the model's name (a model in data/models.yaml) or model.parameters (billions) for "
                "the planner's memory check"]
    if s.model:
        served = _catalog_name(s.model)
        if served is None and not mb.name and mb.parameters is None:
            return [f"{served_key}: {s.model} is not in data/models.yaml, so the planner cannot size it from its id; "
                    f"set {name_key} (a listed model of the same shape) or model.parameters"]
        if served is not None and sized is not None and served != sized:
            return [f"{served_key}: {s.model} is {served} in data/models.yaml ({_shape_text(served)}), but "
                    f"{name_key} is {mb.name} ({_shape_text(sized)}): the planner sized another model. Set "
                    f"{name_key}: {served}, or leave it out (the shape then comes from {served_key})"]
    trainer = m.workloads.get(s.from_workload or "")
    if trainer is not None and trainer.writes_model and trainer.model_folder is not None:
        trained = _trained_model(trainer)
        if not mb.name and mb.parameters is None:
            hint = f" ({trained[1]}, what {s.from_workload} trains)" if trained else ""
            return [f"{name_key}: name the model the server is sized as{hint}, or give model.parameters"]
        if trained is not None and sized is not None and trained[1] != sized:
            key, catalog_name = trained
            return [f"{name_key}: {mb.name} ({_shape_text(sized)}), but "
                    f"{at('workloads', w.name, 'serving', 'fromWorkload')} serves what {s.from_workload} trains, "
                    f"{at('workloads', s.from_workload, *key)} = {catalog_name} ({_shape_text(catalog_name)}); set "
                    f"{name_key}: {catalog_name}"]
    return []


def _positions(text: str | None) -> tuple[int, str] | None:
    """The context length data/models.yaml records for a name or id (its `maxPositionsOf`, else `maxPositions`),
    with the entry's name; None where the catalog does not list it."""
    entry = known_models().get(text.lower()) if text else None
    if entry is None or "maxPositions" not in entry:
        return None
    own = {k.lower(): v for k, v in entry.get("maxPositionsOf", {}).items()}
    return int(own.get(text.lower(), entry["maxPositions"])), text if text.lower() in own else entry["name"]


def check_serve_context_length(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
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
    return [f"{at('workloads', w.name, 'model', 'sequenceLength')}: {w.model.sequence_length:,} tokens, but "
            f"{limit[1]} has {limit[0]:,} positions (config.json max_position_embeddings, data/models.yaml), and "
            f"vLLM refuses a --max-model-len above it at start; set at most {limit[0]}"]


def _trained_model(trainer: WorkloadConfig) -> tuple[tuple[str, ...], str] | None:
    """The data/models.yaml entry a training workload trains, with the key that names it: its `model.name`, else
    the Hugging Face id it downloads (a finetune's `finetune.model`); None where neither is listed."""
    if (name := _catalog_name(trainer.sized_model_name)) is not None:
        return trainer.sized_model_key, name
    for key, hf_id in trainer.hub_models():
        if (name := _catalog_name(hf_id)) is not None:
            return key, name
    return None


def _adapter_trainers(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    return [n for n in m.workloads if n != w.name and adapter_trainer(m, n) is not None]


def _base_text(base: tuple[str, str]) -> str:
    kind, value = base
    return value if kind == "model" else f"the bucket's {value}"


def _no_such_workload(m: StackConfig, w: ServeWorkloadConfig, name: str, key: str, valid: str) -> str:
    """`name` names no workload of the stack: what would be valid, and the closest names."""
    known = sorted(n for n in m.workloads if n != w.name)
    return f"{key}: no workload named {name!r} in this stack; valid: {valid}{did_you_mean(name, known)}"


def _adapter_problem(m: StackConfig, w: ServeWorkloadConfig, name: str, key: str) -> str | None:
    """Why `name` is no adapter this server can load, or None."""
    exporting = _adapter_trainers(m, w)
    valid = (f"finetune workloads of this stack that export an adapter: {or_list(exporting)}" if exporting else
             "a finetune workload with finetune.lora.enabled and finetune.lora.export: adapter (the stack has none)")
    target = m.workloads.get(name)
    if target is None:
        return _no_such_workload(m, w, name, key, valid)
    if name == w.name:
        return f"{key}: {name} is this server itself; valid: {valid}"
    if not isinstance(target, FinetuneWorkloadConfig):
        return f"{key}: {name} is kind {target.kind}; only kind finetune exports a LoRA adapter; valid: {valid}"
    lora, fkey = target.finetune.lora, at("workloads", name, "finetune", "lora")
    if not lora.enabled:
        return (f"{key}: {name} trains every weight ({fkey}.enabled: false), so it writes a whole model, no adapter; "
                f"serve it with serving.fromWorkload in a server of its own, or set {fkey}.enabled: true")
    if not target.exports_adapter:
        return (f"{key}: {name} merges its adapter into the model ({fkey}.export: {lora.export}); set "
                f"{fkey}.export: adapter, or serve the merged model with serving.fromWorkload in a server of its own")
    if not target.gcs_fuse.enabled:
        return (f"{key}: {name} writes its adapter to its volume claim, which no other namespace can mount; set "
                f"{at('workloads', name, 'gcsFuse', 'enabled')}: true (storage.enabled) so that MODEL_DIR is in the "
                "stack's bucket")
    return None


def _adapter_folder_of(m: StackConfig, path: str) -> tuple[str, FinetuneWorkloadConfig] | None:
    """The finetune workload whose MODEL_DIR in the bucket (models/<name>, with gcsFuse) holds a LoRA adapter
    (`finetune.lora.export: adapter`) at or above `path`; None where the stack knows of none there."""
    parts = [p for p in path.strip().split("/") if p not in ("", ".")]
    for name, t in m.workloads.items():
        if isinstance(t, FinetuneWorkloadConfig) and t.exports_adapter and t.gcs_fuse.enabled:
            folder = [p for p in t.model_folder.split("/") if p]
            if parts[:len(folder)] == folder:
                return name, t
    return None


def check_serve_adapter_as_model(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """A folder holding a LoRA adapter given as a whole model (issue 42 item 4): vLLM would fail to load it (an
    adapter has no config.json of the model, only adapter_config.json and the adapter's weights)."""
    path = w.serving.model_path
    found = _adapter_folder_of(m, path) if path else None
    if found is None:
        return []
    trainer, base = found[0], trained_base(found[1])
    adapters = at("workloads", w.name, "serving", "adapters")
    return [f"{at('workloads', w.name, 'serving', 'modelPath')}: {path} is where {at('workloads', trainer)} writes "
            f"its LoRA adapter ({at('workloads', trainer, 'finetune', 'lora', 'export')}: adapter), not a whole "
            f"model, and vLLM cannot load an adapter as one; serve it on its base: serving.{base[0]}: {base[1]} and "
            f"{adapters}: [{trainer}] (or serving.fromWorkload: {trainer}, which does both), or train with "
            "lora.export: merged for a whole model"]


def check_serve_adapters(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """Each of `serving.adapters` is a finetune workload exporting an adapter (into the bucket), named once, trained
    on the base the server serves: an adapter's weights are deltas of that base's layers and mean nothing on
    another model. fromWorkload's own adapter is trained on the base it brings."""
    s = w.serving
    problems = []
    base = served_base(m, w)
    for i, name in enumerate(s.adapters):
        key = at("workloads", w.name, "serving", "adapters", i)
        if name == s.from_workload:
            problems.append(f"{key}: {name} is already served by serving.fromWorkload; list it once")
            continue
        problem = _adapter_problem(m, w, name, key)
        if problem:
            problems.append(problem)
            continue
        trainer = adapter_trainer(m, name)
        assert trainer is not None
        trained = trained_base(trainer)
        tkey = at("workloads", name, "finetune", trained[0])
        if base is None:
            problems.append(f"{key}: {name} is an adapter of {_base_text(trained)} ({tkey}), but "
                            f"serving.fromWorkload {s.from_workload} serves a whole (merged or fully trained) model; "
                            f"adapters need the base they were trained on: serve {_base_text(trained)} "
                            f"(serving.{'model' if trained[0] == 'model' else 'modelPath'})")
        elif (trained[0], trained[1].casefold()) != (base[0], base[1].casefold()):
            where = (f"serving.fromWorkload {s.from_workload}'s base" if s.from_workload else
                     f"serving.{'model' if base[0] == 'model' else 'modelPath'}")
            problems.append(f"{key}: {name} was trained on {_base_text(trained)} ({tkey}), but this server's base is "
                            f"{_base_text(base)} ({where}); an adapter only works on the base it was trained on: "
                            f"serve {name} from a server of {_base_text(trained)}, or train it on "
                            f"{_base_text(base)}")
    return problems


def check_serve_chat_templates(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """vLLM renders every chat request with one template: --chat-template, which the server gets when its adapters
    were trained with a named one (finetune.chatTemplate), else the base's own. Adapters trained with two named
    templates, or with one beside adapters trained with the base's own (`auto`), cannot all be asked in the format
    they learned on one server; raw-trained ones are asked on /v1/completions, so any template suits them."""
    trainers = [t for n in adapter_names(m, w) if (t := adapter_trainer(m, n)) is not None]
    named = sorted({t.finetune.chat_template for t in trainers} - {chat_templates.AUTO, chat_templates.RAW})
    own = [t.name for t in trainers if t.finetune.chat_template == chat_templates.AUTO]
    if not named or (len(named) == 1 and not own):
        return []
    each = ", ".join(f"{t.name}: {t.finetune.chat_template} ({at('workloads', t.name, 'finetune', 'chatTemplate')})"
                     for t in trainers if t.finetune.chat_template != chat_templates.RAW)
    return [f"{at('workloads', w.name, 'serving', 'adapters')}: the adapters were trained with different chat "
            f"templates ({each}; auto is the base's own), and one server renders every chat request with one "
            "(vLLM --chat-template): train them with the same finetune.chatTemplate, or serve them from separate "
            "servers"]


def check_serve_adapter_engine(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """DeepSpeed-MII (FastGen) serves no LoRA adapters: vLLM does (--enable-lora)."""
    names = adapter_names(m, w)
    if w.serving.engine != MII or not names:
        return []
    fix = (f"or set {at('workloads', w.serving.from_workload, 'finetune', 'lora', 'export')}: merged"
           if w.serving.from_workload in names else "or serve the merged models with mii")
    return [f"{at('workloads', w.name, 'serving', 'engine')}: mii serves no LoRA adapters ({', '.join(names)} "
            f"export one); use engine vllm (the default), {fix}"]


def check_serve_lora_rank(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """vLLM loads an adapter only up to --max-lora-rank, which takes one of its ranks (data/serving.yaml
    vllm.loraRanks); `maxLoraRank` unset takes the smallest that holds the largest adapter."""
    names = adapter_names(m, w)
    s, ranks = w.serving, serving_engines.vllm_facts().lora_ranks
    key = at("workloads", w.name, "serving", "maxLoraRank")
    if not names or w.serving.engine != VLLM:
        return []
    trainers = {n: adapter_trainer(m, n) for n in names}
    rank_of = {n: t.finetune.lora.rank for n, t in trainers.items() if t is not None}
    problems = []
    too_large = [n for n, r in rank_of.items() if vllm_lora_rank(r) is None]
    for n in too_large:
        problems.append(f"{at('workloads', n, 'finetune', 'lora', 'rank')}: {rank_of[n]}, but vLLM serves adapters "
                        f"of rank {ranks[-1]} at most (--max-lora-rank, data/serving.yaml); train a rank up to "
                        f"{ranks[-1]}")
    if s.max_lora_rank is None:
        return problems
    if s.max_lora_rank not in ranks:
        fits = vllm_lora_rank(s.max_lora_rank)
        problems.append(f"{key}: {s.max_lora_rank} is not a rank vLLM takes; valid: "
                        f"{', '.join(str(r) for r in ranks)}" + (f" (e.g. {fits})" if fits else ""))
        return problems
    for n, r in rank_of.items():
        if r > s.max_lora_rank and n not in too_large:
            problems.append(f"{key}: {s.max_lora_rank}, but {n} is an adapter of rank {r} "
                            f"({at('workloads', n, 'finetune', 'lora', 'rank')}), which vLLM would refuse to load; "
                            f"set {vllm_lora_rank(r)} or more, or leave maxLoraRank unset")
    return problems


def check_serve_evaluation(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """`serving.evaluation` scores LoRA adapters the server serves, against its base, with a task of the bucket:
    it needs adapters (a refused adapter or engine is said at its own key, not again here), the bucket's mount, and
    room for the reply within the server's max length."""
    ev = w.serving.evaluation
    if ev is None:
        return []
    key, s = at("workloads", w.name, "serving", "evaluation"), w.serving
    problems = []
    # A fromWorkload naming no workload is said at its own key (check_serve_from_workload), not as "serves a whole
    # model" here (issue 40: the follow-on named the typo's cause wrongly).
    unknown = bool(s.from_workload) and s.from_workload not in m.workloads
    if not s.adapters and not adapter_names(m, w) and not unknown:
        what = (f"serving.fromWorkload {s.from_workload} serves a whole model" if s.from_workload else
                "the server serves no adapter")
        problems.append(f"{key}: scores LoRA adapters against the base model, and {what}; list finetune workloads "
                        "that export an adapter (finetune.lora.export: adapter) in serving.adapters or "
                        "serving.fromWorkload, or remove serving.evaluation")
    if not w.gcs_fuse.enabled:
        problems.append(f"{key}.task: read from the stack's bucket, where the results go too (evals/<adapter>/), "
                        f"through GCS FUSE; set {at('workloads', w.name, 'gcsFuse', 'enabled')}: true "
                        "(storage.enabled: true)")
    problems += _one_evaluator_problems(w, key)
    if w.model is not None and ev.max_tokens >= w.model.sequence_length:
        problems.append(f"{key}.maxTokens: {ev.max_tokens} tokens per reply, but the server's max length "
                        f"({at('workloads', w.name, 'model', 'sequenceLength')}) is {w.model.sequence_length}, "
                        "prompt included; set fewer (default 32)")
    return problems


def _one_evaluator_problems(w: ServeWorkloadConfig, key: str) -> list[str]:
    """One verdict per fleet: each server pod runs its own evaluator on the same evals/ folder, with no lock between
    them (the copy is not atomic on GCS FUSE) and no way for a pod to learn what another promoted, so with more than
    one pod the fleet could serve different exports. Refused until one evaluator decides for every replica."""
    s = w.serving
    why = ("each server pod runs its own evaluator on the same evals/ folder: they would race on the served copy, "
           "and a pod never loads an export another pod promoted, so the replicas could serve different adapters; "
           "evaluation needs exactly one server pod")
    problems = []
    if s.replicas > 1:
        problems.append(f"{at('workloads', w.name, 'serving', 'replicas')}: {s.replicas} with {key}: {why}; set 1, "
                        "or remove serving.evaluation")
    if s.autoscaling.enabled:
        problems.append(f"{at('workloads', w.name, 'serving', 'autoscaling', 'enabled')}: true with {key}: {why}; set "
                        "false, or remove serving.evaluation")
    return problems


def lora_request(m: StackConfig, w: ServeWorkloadConfig, request: Request) -> Request:
    """The sizing request with vLLM's adapter slots: --max-loras x --max-lora-rank (what model_source passes)."""
    source = model_source(m, w)
    if not source.adapters or source.max_lora_rank is None or source.max_loras is None:
        return request
    return msgspec.structs.replace(request, adapter_slots=source.max_loras, adapter_rank=source.max_lora_rank)


def serve_request(m: StackConfig, w: ServeWorkloadConfig) -> Request | None:
    """The server's sizing request: its model block, and its adapters' memory."""
    request = workload_request(w)
    return lora_request(m, w, request) if request is not None else None


def check_serve_tensor_parallel(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """The engine splits the model over all of the node's GPUs: its attention heads must allow that split."""
    request, where = workload_request(w), placement(m, w)
    if request is None or where is None or not request.model.shape_known:
        return []
    shape, e, tp = request.model.shape, engine_of(w), where.per_worker
    why = e.tensor_parallel_problem(shape.heads, shape.kv_heads, tp)
    if why is None:
        return []
    valid = [t for t in e.valid_tensor_parallel(shape.heads, shape.kv_heads, 8) if t in (1, 2, 4, 8)]
    return [f"{at('workloads', w.name, 'pool')}: the server splits {request.model.name} over all {tp} GPUs of a node "
            f"of pool {w.pool} (tensor parallel {tp}), and {why} ({e.display_name}); use a pool with "
            f"{or_list([str(t) for t in valid])} GPUs per node"]


def _describe(o: Option) -> str:
    return (f"{o.gpus_per_node} x {short_name(o.gpu_name)} ({o.machine_type}, {o.per_gpu_gb:.1f} GB each, "
            f"${o.on_demand:.2f}/h on-demand)")


def _fitting_nodes(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """One node of each GPU type the engine serves the request on that holds it, cheapest first."""
    request, cat = serve_request(m, w), gpu_catalog.load()
    if request is None:
        return []
    found = [o for g in _servable_gpus(m, w, engine_of(w)) if serving_problem(cat, g, request) is None
             and (o := cheapest_for_gpu(request, INFERENCE, cat, g, cat.zones(g, m.region), max_nodes=1)) is not None]
    return [_describe(o) for o in sorted(found, key=Option.sort_key)[:SUGGESTIONS]]


def check_serve_fits(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """Weights + KV cache (batch x sequence), tensor-parallel over the GPUs of one pod, within what the engine takes
    of each GPU (vLLM: its --gpu-memory-utilization; FastGen: all but its reserve)."""
    cat = gpu_catalog.load()
    request, where = serve_request(m, w), placement(m, w)
    gpu = cat.gpus.get(where.accelerator_type) if where else None
    if (request is None or where is None or gpu is None or request.mode != "inference"
            or request.precision not in engine_of(w).precisions):
        return []  # no model or no pool: other rules say why
    if serving_problem(cat, gpu.name, request) is not None:
        return []  # the engine cannot serve it on this GPU at all: check_serve_engine_gpu or the precision rule says
    if check_serve_context_length(m, w):
        return []  # past the model's positions it would not start on any GPU: no GPUs to recommend
    est = estimate(request, INFERENCE, where.per_worker, 1)
    budget = gpu.memory_gb * (1 - request.headroom)
    if est.per_gpu_gb <= budget:
        return []
    e = engine_of(w)
    fitting = _fitting_nodes(m, w)
    what = (f"{request.model.name} ({request.model.billions:.2f}B parameters) {request.precision} at sequence "
            f"{request.sequence_length} x batch {request.batch_size}")
    within = (f"{e.display_name} takes {e.gpu_memory_utilization:.0%} of each ({budget:.1f} GB)"
              if e.gpu_memory_utilization else f"each has {gpu.memory_gb:g} GB")
    hint = ("Fits on one node: " + "; ".join(fitting)) if fitting else f"No single node in {m.region} holds it"
    return [f"{at('workloads', w.name, 'model')}: {what} needs {est.per_gpu_gb:.1f} GB per GPU ({est.breakdown()}) "
            f"tensor-parallel over {where.per_worker} x {short_name(gpu.display_name)} ({gpu.memory_gb:g} GB); "
            f"{within}. {hint}; or lower sequenceLength or batchSize"]


def check_serve_replicas(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """Each replica takes a node of the pool (its CPU and memory are fitted to a whole node); `workers` is not
    how a server scales: neither engine spans nodes in this stack (data/serving.yaml)."""
    problems = []
    s = w.serving
    if w.workers != 1:
        problems.append(f"{at('workloads', w.name, 'workers')}: a serve workload runs one pod per replica on one node "
                        f"({engine_of(w).display_name} spans no nodes here); set "
                        f"{at('workloads', w.name, 'serving', 'replicas')} instead of workers ({w.workers})")
    if s.autoscaling.enabled and s.autoscaling.max_replicas < s.replicas:
        problems.append(f"{at('workloads', w.name, 'serving', 'autoscaling', 'maxReplicas')}: "
                        f"{s.autoscaling.max_replicas} is fewer than serving.replicas {s.replicas}")
    pool, index = m.pool(w.pool or ""), _pool_index(m, w)
    if pool is not None and most_replicas(w) > pool.max_nodes:
        key = "autoscaling.maxReplicas" if s.autoscaling.enabled else "replicas"
        problems.append(f"{at('workloads', w.name, 'serving')}.{key}: {most_replicas(w)} replica(s) need as many "
                        f"nodes of pool {pool.name}, but {at('nodePools', index, 'maxNodes')} is "
                        f"{pool.max_nodes}; raise maxNodes or lower {key}")
    return problems


def check_serve_ports(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """The API ports may take neither each other's nor the engine's own ports inside the pod; MII's OpenAI server
    is MII's (vLLM's API is OpenAI-compatible itself)."""
    problems = []
    s, where = w.serving, placement(m, w)
    key = at("workloads", w.name, "serving")
    if s.engine == VLLM:
        if s.openai.enabled:
            problems.append(f"{key}.openai.enabled: vLLM's API on serving.port ({served_port(w)}) is OpenAI-compatible "
                            "itself; serving.openai is engine mii's second server, leave it disabled")
        return problems
    reserved = mii_reserved_ports(where.per_worker if where else 1)
    ports = [("port", served_port(w))] + ([("openai.port", s.openai.port)] if s.openai.enabled else [])
    for name, port in ports:
        if port in reserved:
            problems.append(f"{key}.{name}: {port} is taken by {reserved[port]} inside the pod; pick another")
    if s.openai.enabled and served_port(w) == s.openai.port:
        problems.append(f"{key}.openai.port: {s.openai.port} is also serving.port; give the two APIs different ports")
    return problems


def _source_problems(key: str, cidr: str | None, namespace: str | None, labels: dict | None) -> list[str]:
    if cidr is not None and (namespace is not None or labels):
        return [f"{key}: give either cidr or namespace/podLabels, not both (they are different NetworkPolicy peers)"]
    if cidr is None and namespace is None and not labels:
        return [f"{key}: give a cidr, a namespace or podLabels (an empty source would admit every pod)"]
    if cidr is not None:
        try:
            net = ipaddress.IPv4Network(cidr, strict=True)
        except ValueError:
            return [f"{key}.cidr: {cidr!r} is not an IPv4 CIDR with its host bits zero (e.g. 10.0.0.0/8)"]
        if net.prefixlen == 0:
            return [f"{key}.cidr: {cidr} would admit every address; name the clients' ranges"]
    if namespace is not None and not DNS1123_LABEL.match(namespace):
        return [f"{key}.namespace: {namespace!r} is not a namespace name (a DNS-1123 label)"]
    return []


def check_serve_allow_from(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """Each NetworkPolicy source names who may connect, and nothing broader than meant."""
    return [p for i, src in enumerate(w.serving.allow_from)
            for p in _source_problems(at("workloads", w.name, "serving", "allowFrom", i), src.cidr, src.namespace,
                                      src.pod_labels)]


def check_serve_autoscaling(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """The autoscaler reads vLLM's own load (data/serving_metrics.yaml): no CPU autoscaler on a GPU server, and
    none for MII, which reports no load."""
    a, key = w.serving.autoscaling, ("workloads", w.name, "serving", "autoscaling")
    problems = []
    if a.cpu_utilization is not None:
        problems.append(
            f"{at(*key, 'cpuUtilization')}: refused: the server runs the model on its GPUs, so its CPU use does not "
            "follow its load (and the pod requests nearly all of the node's CPUs), and a CPU autoscaler on it scales "
            "late or never (GKE's best practices for LLM inference on GPUs: not CPU alone). Leave cpuUtilization out; "
            f"the autoscaler scales on vLLM's own queue: {at(*key, 'metric')} waiting (the default) or running, "
            f"{at(*key, 'target')} per replica")
    if a.enabled and w.serving.engine == MII:
        problems.append(
            f"{at(*key, 'enabled')}: DeepSpeed-MII reports no load (no /metrics), and CPU use says nothing of a GPU "
            f"server's, so nothing could scale it; set {at('workloads', w.name, 'serving', 'engine')}: vllm (it "
            f"scales on its waiting or running requests), or a fixed {at('workloads', w.name, 'serving', 'replicas')}")
    return problems


# --- warnings: what deploys but deserves a reviewer's eye --------------------------------------------------------

def warn_quantised_checkpoint(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """vLLM serves int8/int4 only from a checkpoint quantised that way; the stack cannot see which the id is."""
    mb, e = w.model, engine_of(w)
    if mb is None or mb.precision not in e.quantised or not w.serving.model:
        return []
    return [f"{at('workloads', w.name, 'model', 'precision')}: {mb.precision} is sized as {mb.precision} weights; "
            f"vLLM reads the quantisation from {w.serving.model}'s quantization_config, so it must be a checkpoint "
            "quantised that way (AWQ, GPTQ); a 16-bit checkpoint would load at 16 bits and not fit"]


def warn_unlisted_model(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """An id data/models.yaml does not list cannot be compared with `model.name`."""
    mb, s = w.model, w.serving
    if mb is None or not s.model or _catalog_name(s.model) is not None or not (mb.name or mb.parameters):
        return []
    return [f"{at('workloads', w.name, 'serving', 'model')}: {s.model} is not in data/models.yaml, so the stack cannot "
            f"confirm it has the shape of the sized model ({mb.name or f'{mb.parameters:g}B'}); add it to that entry's "
            "aliases if it is"]


def warn_unknown_heads(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    request, where = workload_request(w), placement(m, w)
    if request is None or where is None or request.model.shape_known or where.per_worker <= 1:
        return []
    return [f"{at('workloads', w.name, 'model')}: {request.model.name}'s attention heads are unknown (not in "
            f"data/models.yaml); {engine_of(w).display_name} refuses to start unless they divide by the node's "
            f"{where.per_worker} GPUs"]


def warn_no_surge_node(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """A rollout's surge pod needs a node the pool may not have (workloads/serving.py rollout): one replica then
    waits for it, several are replaced one at a time; either way, what one node more costs per hour."""
    where, index = placement(m, w), _pool_index(m, w)
    if where is None or where.pool is None or index is None or surge_node_spare(w, where):
        return []
    pool, s = where.pool, w.serving
    if most_replicas(w) > pool.max_nodes:
        return []  # refused at serving.replicas (check_serve_replicas)
    price = next((p for p in pool_costs(m) if p.name == pool.name and p.known), None)
    cost = (f"${price.pays(1):,.2f}/h {'spot' if price.spot else 'on demand'}" if price else
            "price unknown: not in data/gpu_catalog.yaml")
    fewest = " (the autoscaler's fewest)" if s.autoscaling.enabled else ""
    what = (f"{at('workloads', w.name, 'serving', 'replicas')}{fewest} is 1 and a rollout never takes it down first "
            "(maxUnavailable 0): a new model, image or setting waits, its pod Pending and the old one serving, and "
            "`pulumi up` fails waiting for the Deployment" if s.replicas <= 1 else
            f"a rollout replaces {w.name}'s replicas one at a time, one fewer serving meanwhile")
    return [f"{at('nodePools', index, 'maxNodes')}: {pool.max_nodes} node(s) of pool {pool.name}, all for "
            f"{w.name}'s {most_replicas(w)} replica(s): no node for the surge pod a rollout starts first; {what}. "
            f"Raise maxNodes to {pool.max_nodes + 1} (one {pool.machine_type} node more, {cost}, only while a "
            "rollout runs: the autoscaler removes it after)"]


def warn_autoscaling_unused(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """The autoscaler's bounds when there is no autoscaler: `replicas` pods, always."""
    scaling = w.serving.autoscaling
    if scaling.enabled:
        return []
    defaults = workload_default(w.kind, "serving", "autoscaling")
    return [f"{at('workloads', w.name, 'serving', 'autoscaling', key)}: not used: "
            f"{at('workloads', w.name, 'serving', 'autoscaling', 'enabled')} is false, so no HorizontalPodAutoscaler "
            f"is made and serving.replicas ({w.serving.replicas}) pods run" for key in
            changed_keys(scaling, defaults, ("enabled", "cpuUtilization"))]  # cpuUtilization: refused


def warn_lora_keys_unused(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """vLLM's LoRA sizes when the server loads no adapter."""
    s = w.serving
    if adapter_names(m, w) or s.adapters or (s.from_workload and s.from_workload not in m.workloads):
        return []  # a fromWorkload naming no workload is an error at its own key
    return [f"{at('workloads', w.name, 'serving', key)}: not used: the server loads no LoRA adapter (serving.adapters "
            "is empty and serving.fromWorkload exports none)" for key, value in
            (("maxLoraRank", s.max_lora_rank), ("maxLoras", s.max_loras)) if value is not None]


def warn_openai_port_unused(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """MII's second (OpenAI-compatible) server's port when that server is off."""
    openai = w.serving.openai
    if openai.enabled or openai.port == workload_default(w.kind, "serving", "openai", "port"):
        return []
    return [f"{at('workloads', w.name, 'serving', 'openai', 'port')}: not used: "
            f"{at('workloads', w.name, 'serving', 'openai', 'enabled')} is false (engine mii's OpenAI-compatible "
            "server; vLLM's own API is OpenAI-compatible on serving.port)"]


def build(name: str, w: ServeWorkloadConfig, platform: Platform, opts: pulumi.ResourceOptions) -> Built:
    server = ModelServer(name, ModelServerArgs(
        workload=w, placement=placement(platform.cfg, w), image_ref=platform.image,
        source=model_source(platform.cfg, w), hf_token=platform.hf_token, bucket=platform.bucket,
        protect=platform.protect), opts)
    endpoint = server.summary.apply(lambda s: {k: s[k] for k in ENDPOINT_KEYS if k in s})
    return Built(server, server.summary, endpoint=endpoint)


KIND: Kind[ServeWorkloadConfig] = Kind(
    name="serve",
    config=ServeWorkloadConfig,
    rules=(check_serve_accelerator, check_serve_engine_gpu, check_serve_model_block, check_serve_model_source,
           check_serve_from_workload, check_serve_adapter_as_model, check_serve_adapters, check_serve_chat_templates,
           check_serve_adapter_engine,
           check_serve_lora_rank,
           check_serve_model_identity, check_serve_context_length, check_serve_tensor_parallel, check_serve_fits,
           check_serve_replicas,
           check_serve_autoscaling, check_serve_ports, check_serve_allow_from, check_serve_evaluation),
    build=build,
    warnings=(warn_quantised_checkpoint, warn_unlisted_model, warn_unknown_heads, warn_no_surge_node,
              warn_autoscaling_unused,
              warn_lora_keys_unused, warn_openai_port_unused),
    sizes_its_model=True,
    checks_its_gpu=True,
)
