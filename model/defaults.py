"""Defaults that stand in for what the user meant: the defaulted values of an object with a rejected key.

A misspelt key (`zeroStag: 3`) is rejected, and the schema's default for the key the user meant (`zeroStage: 2`)
takes its place; a rule computed from it would report a problem the user never asked about ("at ZeRO-2 needs
50.9 GB"). `other_defaults` builds a second config in which each such default holds another valid value; a rule's
problem that reads differently there was computed from a stand-in default and is left out (model/config.py).
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import jsonschema

Path = tuple[str | int, ...]
SUGGEST_CUTOFF = 0.6  # difflib's default, as the schema's "did you mean" uses it (model/config_problems.py)


def _errors(error: jsonschema.ValidationError) -> Iterator[jsonschema.ValidationError]:
    yield error
    for sub in error.context or ():  # inside oneOf/anyOf branches
        yield from _errors(sub)


def objects_with_unknown_keys(errors: list[jsonschema.ValidationError]) -> dict[Path, set[str]]:
    """The objects in which the schema rejected keys it does not know (in its `errors` on a config), and those
    keys."""
    found: dict[Path, set[str]] = {}
    for top in errors:
        for e in _errors(top):
            if e.validator == "additionalProperties" and isinstance(e.instance, dict):
                known = set(e.schema.get("properties", {}))
                found.setdefault(tuple(e.absolute_path), set()).update(str(k) for k in e.instance if k not in known)
    return found


def stand_ins(unknown: set[str], defaulted: list[str]) -> list[str]:
    """The defaulted keys that stand in for the unknown ones: the one each unknown key most likely meant (the
    schema's "did you mean" match), or every defaulted key when one of them matches none."""
    meant = []
    for key in unknown:
        close = difflib.get_close_matches(key, defaulted, n=1, cutoff=SUGGEST_CUTOFF)
        if not close:
            return defaulted
        meant.append(close[0])
    return sorted(set(meant))


def _get(node: Any, path: Path) -> Any:
    for part in path:
        if isinstance(node, dict) and isinstance(part, str):
            node = node.get(part)
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            return None
    return node


def _resolve(root: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """A schema node with its local `$ref` merged in (the node's own keywords win)."""
    while "$ref" in node and str(node["$ref"]).startswith("#/$defs/"):
        target = root["$defs"][node["$ref"].rsplit("/", 1)[-1]]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _of_kind(node: dict[str, Any], value: Any) -> dict[str, Any]:
    """A workload's node: the branch of its `kind` (model/schema.yaml), which lists all of that kind's keys."""
    kind = value.get("kind") if isinstance(value, dict) else None
    for branch in node.get("allOf", []):
        if isinstance(kind, str) and branch.get("then", {}).get("x-kind") == kind:
            return branch["then"]
    return node


def subschema(root: dict[str, Any], path: Path, config: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The schema node for `path` (in `config`, whose workloads pick their kind's branch); None where a
    combinator (oneOf, anyOf) makes it ambiguous."""
    node = _resolve(root, root)
    for i, part in enumerate(path):
        node = _of_kind(node, _get(config, path[:i]))
        if isinstance(part, int):
            nxt = node.get("items")
        else:
            nxt = node.get("properties", {}).get(part)
            if nxt is None and isinstance(node.get("additionalProperties"), dict):
                nxt = node["additionalProperties"]
        if not isinstance(nxt, dict):
            return None
        node = _resolve(root, nxt)
    return node


def other_value(node: dict[str, Any], value: Any) -> Any:
    """Another value the schema node accepts, or None where none is easily had (strings, lists, objects)."""
    if "enum" in node:
        return next((v for v in node["enum"] if v != value), None)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float) and node.get("type") in ("integer", "number"):
        step = 1 if node.get("type") == "integer" else max(abs(value) * 0.5, 1.0)
        high, low = node.get("maximum"), node.get("minimum")
        for candidate in (value + step, value - step):
            if (high is None or candidate <= high) and (low is None or candidate >= low) and \
                    ("exclusiveMinimum" not in node or candidate > node["exclusiveMinimum"]) and \
                    ("exclusiveMaximum" not in node or candidate < node["exclusiveMaximum"]):
                return candidate
    return None


def other_defaults(schema: dict[str, Any], raw: dict[str, Any], valid: dict[str, Any],
                   objects: dict[Path, set[str]]) -> dict[str, Any] | None:
    """`valid` with the defaults standing in for each object's unknown keys (values the user did not write) set
    to other valid values, one at a time, keeping each change the schema accepts; None when nothing changed."""
    if not objects:
        return None
    import jsonschema  # here: a valid config never needs it (model/config_validate.py)

    validator = jsonschema.Draft202012Validator(schema)
    variant, changed = copy.deepcopy(valid), False
    for path, unknown in objects.items():
        obj, written = _get(variant, path), _get(raw, path)
        if not isinstance(obj, dict):
            continue
        written = written if isinstance(written, dict) else {}
        for key in stand_ins(unknown, sorted(k for k in obj if k not in written)):
            node = subschema(schema, (*path, key), variant)
            alternative = other_value(node, obj[key]) if node is not None else None
            if alternative is None:
                continue
            before = obj[key]
            obj[key] = alternative
            if validator.is_valid(variant):
                changed = True
            else:
                obj[key] = before
    return variant if changed else None
