"""Hugging Face model ids as a stack key writes them: the hub takes OWNER/NAME (the organisation or user, then the
repository), and a misspelt id is found only when the pods download it, after `pulumi up` has brought up GPU
nodes. Checked against data/models.yaml's ids (its aliases), "did you mean" as `make gpus` says it.

- No owner (`Llama-3.1-70B-Instruct`): refused, with the id data/models.yaml has for that name when it has one.
- A typo of a listed id (`Qwen/Qwen2.5-7B-Instuct`): refused when it differs from one by at most TYPO_CHARACTERS
  letters under the same owner (case ignored, as the hub ignores it). Digits are never a typo (Llama-3.3 is a
  model of its own, not a misspelt Llama-3.1), nor is a listed id with more after it (Qwen2.5-7B-Instruct-1M), so
  a real repository the catalog does not list passes (the planner then asks for its shape).
"""

from __future__ import annotations

import difflib
import functools

from model.suggest import did_you_mean
from planner.model_catalog import hub_id, known_models

TYPO_CHARACTERS = 2  # at most this many letters inserted, removed or replaced


@functools.cache
def listed_ids() -> tuple[str, ...]:
    """Every Hugging Face id of data/models.yaml (the aliases with an owner), as written there."""
    return tuple(sorted({a for entry in known_models().values() for a in entry.get("aliases", []) if "/" in a}))


def _typo_of(value: str, listed: str) -> bool:
    """`value` is `listed` with a few letters wrong (same owner; no digit changed; not `listed` with more after)."""
    owner, _, name = value.lower().partition("/")
    listed_owner, _, listed_name = listed.lower().partition("/")
    if owner != listed_owner or name == listed_name or name.startswith(listed_name) or listed_name.startswith(name):
        return False
    changed = 0
    for op, a1, a2, b1, b2 in difflib.SequenceMatcher(None, name, listed_name, autojunk=False).get_opcodes():
        if op == "equal":
            continue
        text = name[a1:a2] + listed_name[b1:b2]
        if any(c.isdigit() for c in text):
            return False
        changed += max(a2 - a1, b2 - b1)
    return changed <= TYPO_CHARACTERS


def id_problem(value: str, folder_key: str) -> str | None:
    """What is wrong with a model id a stack key gives, or None (`folder_key`: where a bucket folder goes)."""
    if "/" not in value:
        meant = hub_id(value)
        hint = f"; did you mean `{meant}`?" if meant else did_you_mean(value, listed_ids())
        return (f"{value!r} is not a Hugging Face id: the hub needs OWNER/NAME (the organisation or user, then the "
                f"repository){hint}; a model in the bucket goes in {folder_key}")
    if value.lower() in (i.lower() for i in listed_ids()):
        return None
    typo = next((i for i in listed_ids() if _typo_of(value, i)), None)
    if typo is None:
        return None
    return (f"{value!r} is not a model data/models.yaml lists, and it is {typo!r} with letters changed; did you mean "
            f"`{typo}`? (The hub would answer 404 once GPU nodes are up.)")
