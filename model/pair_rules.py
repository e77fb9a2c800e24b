"""Pair rules as data (issue 41 item 3): "X needs Y" and "X not with Y" between two keys of a stack's config,
written as a table and read by one function, where each was an `if` of its own in checks/.

A rule is about the items of one scope: the stack itself (""), each of `nodePools` or each of `workloads`. Its keys
are camelCase paths relative to that item (`gcsFuse.enabled`); a key starting with "/" is read from the stack's root
(`/storage.enabled`). A key is *set* when its value is neither None, False nor an empty string (a block such as
`cluster` is set when present). The problem is reported at `when`, the key the user set, as
`pulumi config set --path` spells it, with the rule's text. Problems come item by item, and within an item in the
table's order, as the `if`s they replace gave them.

Rules that compare values (a CIDR's size, a version, a value against its default) stay code; this table holds only
the yes/no pairs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import msgspec

from model.problems import Level, Problem
from model.types import StackConfig, key_path, snake

Scope = Literal["", "nodePools", "workloads"]


class PairRule(msgspec.Struct, frozen=True):
    when: str  # the key whose being set brings the rule in; the problem is reported there
    text: str  # what is wrong and what would be valid, as users read it after the key
    needs: str = ""  # "X needs Y": a problem when this key is not set
    excludes: tuple[str, ...] = ()  # "X not with Y": a problem when any of these is set (one problem for all)
    level: Level = "error"


def _value(root: StackConfig, item: object, key: str) -> object:
    value: object = root if key.startswith("/") else item
    for part in key.lstrip("/").split("."):
        if value is None:
            return None
        value = getattr(value, snake(part))
    return value


def _set(root: StackConfig, item: object, key: str) -> bool:
    value = _value(root, item, key)
    if value is None or value is False:
        return False
    return value != "" if isinstance(value, str) else True


def _items(m: StackConfig, scope: Scope) -> list[tuple[tuple[object, ...], object]]:
    if scope == "nodePools":
        return [(("nodePools", i), p) for i, p in enumerate(m.node_pools)]
    if scope == "workloads":
        return [(("workloads", name), w) for name, w in m.workloads.items()]
    return [((), m)]


def broken(m: StackConfig, rule: PairRule, item: object) -> bool:
    """Whether `item` (of the rule's scope, in stack `m`) breaks the rule."""
    if not _set(m, item, rule.when):
        return False
    if rule.needs and not _set(m, item, rule.needs):
        return True
    return any(_set(m, item, key) for key in rule.excludes)


def pair_problems(m: StackConfig, scope: Scope, rules: Sequence[PairRule]) -> list[Problem]:
    """The problems of every item of `scope` against `rules`: item by item, each in the rules' order."""
    return [Problem(key_path([*prefix, *rule.when.split(".")]), rule.text, rule.level)
            for prefix, item in _items(m, scope) for rule in rules if broken(m, rule, item)]
