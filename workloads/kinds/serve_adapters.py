"""kind serve's rules on LoRA adapters and their evaluation (workloads/kinds/serve.py lists them): each adapter is
exported by a finetune workload into the bucket, trained on the base the server serves, with one chat template and a
rank vLLM's --max-lora-rank holds; vLLM serves them (MII cannot); `serving.evaluation` needs adapters and one pod.
"""

from __future__ import annotations

from model import chat_templates, serving_engines
from model.problems import Problem
from model.serving_engines import MII, VLLM
from model.types import AdapterFolder, FinetuneWorkloadConfig, ServeWorkloadConfig, StackConfig
from model.validators import at, or_list
from workloads.kinds.serve_model import no_such_workload
from workloads.serving_source import (
    adapter_names,
    adapter_trainer,
    served_base,
    trained_base,
    vllm_lora_rank,
)


def _adapter_trainers(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    return [n for n in m.workloads if n != w.name and adapter_trainer(m, n) is not None]


def _base_text(base: tuple[str, str]) -> str:
    kind, value = base
    return value if kind == "model" else f"the bucket's {value}"


def _adapter_problem(m: StackConfig, w: ServeWorkloadConfig, name: str, key: str) -> Problem | None:
    """Why `name` is no adapter this server can load, or None."""
    exporting = _adapter_trainers(m, w)
    valid = (f"finetune workloads of this stack that export an adapter: {or_list(exporting)}" if exporting else
             "a finetune workload with finetune.lora.enabled and finetune.lora.export: adapter (the stack has none)")
    target = m.workloads.get(name)
    if target is None:
        return no_such_workload(m, w, name, key, valid)
    if name == w.name:
        return Problem(key, f"{name} is this server itself; valid: {valid}")
    if not isinstance(target, FinetuneWorkloadConfig):
        return Problem(key, f"{name} is kind {target.kind}; only kind finetune exports a LoRA adapter; valid: {valid}")
    lora, fkey = target.finetune.lora, at("workloads", name, "finetune", "lora")
    if not lora.enabled:
        return (Problem(key,
                        f"{name} trains every weight ({fkey}.enabled: false), so it writes a whole model, no adapter; "
                        f"serve it with serving.fromWorkload in a server of its own, or set {fkey}.enabled: true"))
    if not target.exports_adapter:
        return (Problem(key, f"{name} merges its adapter into the model ({fkey}.export: {lora.export}); set "
                f"{fkey}.export: adapter, or serve the merged model with serving.fromWorkload in a server of its own"))
    if not target.gcs_fuse.enabled:
        return (Problem(key, f"{name} writes its adapter to its volume claim, which no other namespace can mount; set "
                f"{at('workloads', name, 'gcsFuse', 'enabled')}: true (storage.enabled) so that MODEL_DIR is in the "
                "stack's bucket"))
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


def check_serve_adapter_as_model(m: StackConfig, w: ServeWorkloadConfig) -> list[Problem]:
    """A folder holding a LoRA adapter given as a whole model (issue 42 item 4): vLLM would fail to load it (an
    adapter has no config.json of the model, only adapter_config.json and the adapter's weights)."""
    path = w.serving.model_path
    found = _adapter_folder_of(m, path) if path else None
    if found is None:
        return []
    trainer, base = found[0], trained_base(found[1])
    adapters = at("workloads", w.name, "serving", "adapters")
    return [Problem(at('workloads', w.name, 'serving', 'modelPath'),
                    f"{path} is where {at('workloads', trainer)} writes "
            f"its LoRA adapter ({at('workloads', trainer, 'finetune', 'lora', 'export')}: adapter), not a whole "
            f"model, and vLLM cannot load an adapter as one; serve it on its base: serving.{base[0]}: {base[1]} and "
            f"{adapters}: [{trainer}] (or serving.fromWorkload: {trainer}, which does both), or train with "
            "lora.export: merged for a whole model")]


def check_serve_adapters(m: StackConfig, w: ServeWorkloadConfig) -> list[Problem]:
    """Each of `serving.adapters` is a finetune workload exporting an adapter (into the bucket), named once, trained
    on the base the server serves: an adapter's weights are deltas of that base's layers and mean nothing on
    another model. fromWorkload's own adapter is trained on the base it brings."""
    s = w.serving
    problems = []
    base = served_base(m, w)
    for i, name in enumerate(s.adapters):
        if not isinstance(name, str):
            continue  # a folder of the bucket: check_serve_adapter_folders
        key = at("workloads", w.name, "serving", "adapters", i)
        if name == s.from_workload:
            problems.append(Problem(key, f"{name} is already served by serving.fromWorkload; list it once"))
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
            problems.append(Problem(key, f"{name} is an adapter of {_base_text(trained)} ({tkey}), but "
                            f"serving.fromWorkload {s.from_workload} serves a whole (merged or fully trained) model; "
                            f"adapters need the base they were trained on: serve {_base_text(trained)} "
                            f"(serving.{'model' if trained[0] == 'model' else 'modelPath'})"))
        elif (trained[0], trained[1].casefold()) != (base[0], base[1].casefold()):
            where = (f"serving.fromWorkload {s.from_workload}'s base" if s.from_workload else
                     f"serving.{'model' if base[0] == 'model' else 'modelPath'}")
            problems.append(Problem(key,
                                    f"{name} was trained on {_base_text(trained)} ({tkey}), but this server's base is "
                            f"{_base_text(base)} ({where}); an adapter only works on the base it was trained on: "
                            f"serve {name} from a server of {_base_text(trained)}, or train it on "
                            f"{_base_text(base)}"))
    return problems


def check_serve_chat_templates(m: StackConfig, w: ServeWorkloadConfig) -> list[Problem]:
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
    return [Problem(at('workloads', w.name, 'serving', 'adapters'), f"the adapters were trained with different chat "
            f"templates ({each}; auto is the base's own), and one server renders every chat request with one "
            "(vLLM --chat-template): train them with the same finetune.chatTemplate, or serve them from separate "
            "servers")]


def check_serve_adapter_engine(m: StackConfig, w: ServeWorkloadConfig) -> list[Problem]:
    """DeepSpeed-MII (FastGen) serves no LoRA adapters: vLLM does (--enable-lora)."""
    names = adapter_names(m, w) + [f.name for _, f in w.serving.adapter_folders]
    if w.serving.engine != MII or not names:
        return []
    fix = (f"or set {at('workloads', w.serving.from_workload, 'finetune', 'lora', 'export')}: merged"
           if w.serving.from_workload in names else "or serve the merged models with mii")
    return [Problem(at('workloads', w.name, 'serving', 'engine'), f"mii serves no LoRA adapters ({', '.join(names)} "
            f"export one); use engine vllm (the default), {fix}")]


def check_serve_lora_rank(m: StackConfig, w: ServeWorkloadConfig) -> list[Problem]:
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
        problems.append(Problem(at('workloads', n, 'finetune', 'lora', 'rank'),
                                f"{rank_of[n]}, but vLLM serves adapters "
                                f"of rank {ranks[-1]} at most (--max-lora-rank, data/serving.yaml); train a rank up to "
                                f"{ranks[-1]}"))
    if s.max_lora_rank is None:
        return problems
    if s.max_lora_rank not in ranks:
        fits = vllm_lora_rank(s.max_lora_rank)
        problems.append(Problem(key, f"{s.max_lora_rank} is not a rank vLLM takes; valid: "
                        f"{', '.join(str(r) for r in ranks)}" + (f" (e.g. {fits})" if fits else "")))
        return problems
    for n, r in rank_of.items():
        if r > s.max_lora_rank and n not in too_large:
            problems.append(Problem(key, f"{s.max_lora_rank}, but {n} is an adapter of rank {r} "
                            f"({at('workloads', n, 'finetune', 'lora', 'rank')}), which vLLM would refuse to load; "
                            f"set {vllm_lora_rank(r)} or more, or leave maxLoraRank unset"))
    return problems


def check_serve_evaluation(m: StackConfig, w: ServeWorkloadConfig) -> list[Problem]:
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
        problems.append(Problem(key,
                                f"scores LoRA adapters against the base model, and {what}; list finetune workloads "
                                "that export an adapter (finetune.lora.export: adapter) in serving.adapters or "
                                "serving.fromWorkload, or remove serving.evaluation"))
    if not w.gcs_fuse.enabled:
        problems.append(Problem(f"{key}.task",
                                f"read from the stack's bucket, where the results go too (evals/<adapter>/), "
                                f"through GCS FUSE; set {at('workloads', w.name, 'gcsFuse', 'enabled')}: true "
                                "(storage.enabled: true)"))
    if w.model is not None and ev.max_tokens >= w.model.sequence_length:
        problems.append(Problem(f"{key}.maxTokens", f"{ev.max_tokens} tokens per reply, but the server's max length "
                        f"({at('workloads', w.name, 'model', 'sequenceLength')}) is {w.model.sequence_length}, "
                        "prompt included; set fewer (default 32)"))
    return problems


def warn_lora_keys_unused(m: StackConfig, w: ServeWorkloadConfig) -> list[Problem]:
    """vLLM's LoRA sizes when the server loads no adapter."""
    s = w.serving
    if adapter_names(m, w) or s.adapters or (s.from_workload and s.from_workload not in m.workloads):
        return []  # a fromWorkload naming no workload is an error at its own key
    return [Problem(at('workloads', w.name, 'serving', key),
                    "not used: the server loads no LoRA adapter (serving.adapters "
                    "is empty and serving.fromWorkload exports none)") for key, value in
            (("maxLoraRank", s.max_lora_rank), ("maxLoras", s.max_loras)) if value is not None]


def _folder_base_problem(m: StackConfig, w: ServeWorkloadConfig, key: str, folder: AdapterFolder) -> Problem | None:
    """The base an adapter folder records is the base this server serves (a Hugging Face id, or a bucket folder)."""
    base = served_base(m, w)
    if folder.base is None:
        return None
    if base is None:
        return (Problem(f"{key}.base",
                        f"{folder.base}, but serving.fromWorkload {w.serving.from_workload} serves a whole model; "
                        f"an adapter needs the base it was trained on: serve {folder.base} (serving.model or "
                        "serving.modelPath) from a server of its own"))
    if folder.base.strip("/").casefold() != base[1].strip("/").casefold():
        return (Problem(f"{key}.base", f"{folder.name} was trained on {folder.base}, but this server's base is "
                f"{_base_text(base)}; an adapter only works on the base it was trained on: serve it from a server "
                f"of {folder.base}"))
    return None


def _folder_rank_problem(w: ServeWorkloadConfig, key: str, folder: AdapterFolder) -> Problem | None:
    """vLLM loads an adapter only up to --max-lora-rank, one of its ranks (data/serving.yaml vllm.loraRanks)."""
    ranks, s = serving_engines.vllm_facts().lora_ranks, w.serving
    mkey = at("workloads", w.name, "serving", "maxLoraRank")
    if folder.rank is None:
        if s.max_lora_rank is None:
            return (Problem(f"{key}.rank",
                            f"unset, and {mkey} is unset: vLLM holds room for adapters up to --max-lora-rank and "
                    "refuses a larger one at load; give its rank (adapter_config.json's `r`), or set maxLoraRank to "
                    f"one of {', '.join(map(str, ranks))} at least that"))
        return None
    if vllm_lora_rank(folder.rank) is None:
        return (Problem(f"{key}.rank",
                        f"{folder.rank}, but vLLM serves adapters of rank {ranks[-1]} at most (--max-lora-rank, "
                        "data/serving.yaml)"))
    if s.max_lora_rank is not None and folder.rank > s.max_lora_rank:
        return (Problem(mkey, f"{s.max_lora_rank}, but {folder.name} is an adapter of rank {folder.rank} ({key}.rank), "
                f"which vLLM would refuse to load; set {vllm_lora_rank(folder.rank)} or more, or leave it unset"))
    return None


def check_serve_adapter_folders(m: StackConfig, w: ServeWorkloadConfig) -> list[Problem]:
    """Adapter folders of the bucket (issue 42 item 4): read through the server's GCS FUSE mount, named once (not
    as another adapter or the base), of a rank vLLM takes, on the base they record, and not evaluated (the
    evaluator scores training's exports by their markers)."""
    s = w.serving
    problems: list[str] = []
    seen = set(adapter_names(m, w)) | {served_base(m, w)[1] if served_base(m, w) else s.from_workload or ""}
    for i, folder in s.adapter_folders:
        key = at("workloads", w.name, "serving", "adapters", i)
        if folder.name in seen or folder.name in m.workloads:
            problems.append(Problem(f"{key}.name",
                                    f"{folder.name} is already a name this stack serves or a workload's; clients "
                                    "could not tell them apart: give the folder another name"))
        seen.add(folder.name)
        if not w.gcs_fuse.enabled:
            problems.append(Problem(f"{key}.path", f"read from the stack's bucket through GCS FUSE; set "
                            f"{at('workloads', w.name, 'gcsFuse', 'enabled')}: true (storage.enabled: true)"))
        if s.evaluation is not None:
            problems.append(Problem(key,
                                    f"a folder adapter with {at('workloads', w.name, 'serving', 'evaluation')}: the "
                            "evaluator scores the exports training writes (their markers), and a folder of the bucket "
                            "has none; serve folder adapters from a server without evaluation"))
        problems += [p for p in (_folder_rank_problem(w, key, folder), _folder_base_problem(m, w, key, folder)) if p]
    return problems


def warn_adapter_base_unrecorded(m: StackConfig, w: ServeWorkloadConfig) -> list[Problem]:
    """An adapter folder without `base`: the stack cannot check it fits the served base."""
    base = served_base(m, w)
    return [Problem(f"{at('workloads', w.name, 'serving', 'adapters', i)}.base",
                    f"unset, so {f.name} is not checked against "
            f"this server's base ({_base_text(base) if base else 'none'}); an adapter trained on another model loads "
            "but answers nonsense: set it to adapter_config.json's base_model_name_or_path")
            for i, f in w.serving.adapter_folders if f.base is None]
