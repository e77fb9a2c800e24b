"""Chat templates for fine-tuning (data/chat_templates.yaml): the templates `finetune.chatTemplate` can name, and the
Hugging Face ids known to ship a chat template or not."""

from __future__ import annotations

import functools
from pathlib import Path

import msgspec

from model.yamlio import load_yaml

DATA_PATH = Path(__file__).resolve().parent.parent / "data" / "chat_templates.yaml"
AUTO, RAW = "auto", "raw"  # chatTemplate's two values that name no template


class ChatTemplates(msgspec.Struct, frozen=True):
    templates: dict[str, str]  # name -> Jinja text
    has_template: dict[str, bool]  # lower-cased Hugging Face id -> whether its tokenizer ships a chat template


@functools.cache
def load(path: Path = DATA_PATH) -> ChatTemplates:
    raw = load_yaml(path)
    return ChatTemplates(templates={name: entry["template"] for name, entry in raw["templates"].items()},
                         has_template={hub_id.lower(): bool(entry["chatTemplate"])
                                       for hub_id, entry in raw["models"].items()})


def template(name: str) -> str | None:
    """The Jinja text of a named template; None for auto, raw and unknown names."""
    return load().templates.get(name)


def names() -> list[str]:
    return sorted(load().templates)


def ships_template(model_id: str) -> bool | None:
    """Whether the model's tokenizer ships a chat template: True, False, or None when the stack does not know
    (Hugging Face ids are case-insensitive)."""
    return load().has_template.get(model_id.lower())


CHAT_FORMATS = ("messages", "sharegpt")  # record formats that are conversations whatever the model


def asked_on_chat(chat_template: str, record_format: str, model: str | None) -> bool:
    """Whether a model fine-tuned with these keys is asked on /v1/chat/completions (its records went through a
    chat template: finetune_render.choose's rule, as far as the preview knows it) rather than on /v1/completions
    (raw: `chatTemplate: raw`, text records, or plain records on a model known to ship no template). A model the
    stack does not know (or a modelPath) with plain records is taken to have a template, as Instruct models do."""
    if chat_template == RAW or record_format == "text":
        return False
    if chat_template != AUTO or record_format in CHAT_FORMATS:
        return True
    return ships_template(model) is not False if model else True
