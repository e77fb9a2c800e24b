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
