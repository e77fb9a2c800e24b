"""Every problem at once: drop what the schema rejects, so the rules can still check everything it accepted.

A schema error used to stop the loader before the rules ran, so a user with four mistakes in one pool saw two,
fixed them, and met the other two on the next run. Here each rejected value is dropped (its default, if it
has one, takes its place) until the config is schema-valid; the rules then run on that repaired config, and
their problems on keys already reported, or caused by a dropped value, are left out (they would only repeat
the schema's message in other words).

Dropping whole list items would renumber the items after them, and every later message would name the
wrong index; so a rejected list item drops the list that holds it instead. Dropping a whole top-level key
(`nodePools`, `cluster`) would make the rules see a different stack (no pools, no cluster), so then the rules
do not run at all and only the schema's problems are reported.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    import jsonschema

from model.problems import Problem
from model.types import key_path

MAX_ROUNDS = 8  # each round drops at least one value; real configs settle in one or two


Key = tuple[str | int, ...]  # a key's parts: ("nodePools", 0, "maxNodes") is `nodePools[0].maxNodes`


class Repaired(msgspec.Struct):
    config: dict[str, Any] | None  # schema-valid with the rejected values dropped; None: the rules must not run
    dropped: list[Key] = msgspec.field(default_factory=list)  # the keys of the dropped values


def _drop_path(error: jsonschema.ValidationError) -> list[list[Any]]:
    path = list(error.absolute_path)
    if error.validator == "additionalProperties":
        known = set(error.schema.get("properties", {}))
        return [[*path, extra] for extra in sorted(set(error.instance) - known)]
    return [path]


def _without_list_items(path: list[Any]) -> list[Any]:
    """A rejected list item drops the list itself, so no later item changes its index."""
    while path and isinstance(path[-1], int):
        path = path[:-1]
    return path


def _delete(config: dict[str, Any], path: list[Any]) -> bool:
    node: Any = config
    for part in path[:-1]:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return False
    if isinstance(node, dict) and path[-1] in node:
        del node[path[-1]]
        return True
    return False


def repair(config: dict[str, Any], validator: jsonschema.protocols.Validator,
           fill: Callable[[dict[str, Any]], dict[str, Any]],
           errors: list[jsonschema.ValidationError] | None = None) -> Repaired:
    """`config` minus what `validator` rejects, re-filled with `fill` (the schema's defaults) after each round.
    `errors`: what `validator` already found in `config`, where the caller has them (the first round reads those)."""
    current, dropped = copy.deepcopy(config), []
    for _ in range(MAX_ROUNDS):
        errors = list(validator.iter_errors(current)) if errors is None else errors
        if not errors:
            return Repaired(current, dropped)
        paths = [_without_list_items(p) for e in errors for p in _drop_path(e)]
        if any(len(p) <= 1 for p in paths):
            return Repaired(None, dropped)  # a whole top-level key (or the root): the rules would see another stack
        progress = False
        for path in sorted(paths, key=len, reverse=True):  # inner values first: an outer drop removes them anyway
            if _delete(current, path):
                dropped.append(tuple(path))
                progress = True
        if not progress:
            return Repaired(None, dropped)
        current, errors = fill(current), None
    return Repaired(None, dropped)


def _under(key: str, prefix: str) -> bool:
    return key == prefix or key.startswith((f"{prefix}.", f"{prefix}["))


def _mentions(text: str, name: str | int) -> bool:
    """Whether the text names a key as a word (`maxNodes` in "2 is more than maxNodes 1")."""
    return re.search(rf"\b{re.escape(str(name))}\b", text) is not None


def _child_below(other: Key, key: str) -> str | int | None:
    """The part of `other` just below `key` (`podLabels` of workloads.a.podLabels.app below workloads.a), if
    `other` is under `key`."""
    for i in range(1, len(other)):
        if key_path(other[:i]) == key:
            return other[i]
    return None


def is_echo(problem: Problem, reported: Iterable[Key]) -> bool:
    """A rule's problem that only repeats a reported (or dropped) key's problem: on that key or under it, naming
    it, or on a sibling that names its leaf (`minNodes ... more than maxNodes` after a rejected maxNodes)."""
    key = problem.path
    for parts in reported:
        if not parts:
            continue
        other = key_path(parts)
        if _under(key, other) or other in str(problem):
            return True
        child = _child_below(parts, key) if other != key and _under(other, key) else None
        if isinstance(child, str) and _mentions(problem.text, child):
            return True  # on an enclosing object, about its dropped child (allowFrom[0] after podLabels.app)
        parent = key_path(parts[:-1])
        if parent and _under(key, parent) and _mentions(str(problem), parts[-1]):
            return True
    return False


def without_echoes(problems: list[Problem], reported: Iterable[Key]) -> list[Problem]:
    reported = list(reported)
    return [p for p in problems if not is_echo(p, reported)]
