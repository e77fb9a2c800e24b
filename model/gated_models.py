"""Gated Hugging Face models (data/gated_models.yaml): which ids need an account's token to download."""

from __future__ import annotations

import fnmatch
import functools
from pathlib import Path

import msgspec

from model.yamlio import load_yaml

DATA_PATH = Path(__file__).resolve().parent.parent / "data" / "gated_models.yaml"


class GatedFamily(msgspec.Struct, frozen=True):
    pattern: str
    family: str
    confirmed: bool


@functools.cache
def load(path: Path = DATA_PATH) -> tuple[GatedFamily, ...]:
    return tuple(GatedFamily(e["pattern"], e["family"], e["status"] == "confirmed") for e in load_yaml(path)["gated"])


def gated_family(model_id: str) -> GatedFamily | None:
    """The first entry whose pattern matches the id (case-insensitively, as the Hub resolves ids), or None."""
    lowered = model_id.lower()
    return next((f for f in load() if fnmatch.fnmatchcase(lowered, f.pattern.lower())), None)
