"""'Did you mean' for a name the user typed: a key, a stack, a model, a GPU type, a region or a zone.

difflib's ratio with its default cutoff (0.6), as the schema's unknown-key messages have always used it; case is
ignored for the match and the option is named as the catalog spells it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

CUTOFF = 0.6


def closest(word: str, options: Iterable[str], cutoff: float = CUTOFF) -> str | None:
    """The option closest to `word` (case ignored), or None when none is close enough."""
    by_lower: dict[str, str] = {}
    for option in options:
        by_lower.setdefault(option.lower(), option)
    match = difflib.get_close_matches(word.lower(), list(by_lower), n=1, cutoff=cutoff)
    return by_lower[match[0]] if match else None


def did_you_mean(word: str, options: Iterable[str], cutoff: float = CUTOFF) -> str:
    """`; did you mean `x`?` for the closest option, or '' when none is close."""
    match = closest(word, options, cutoff)
    return f"; did you mean `{match}`?" if match else ""
