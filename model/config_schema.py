"""The schema (model/schema.yaml) as the program reads it: the file, parsed once; each workload kind's branch; and the
defaults it fills into a config (what the typed model is built from, and what the rules compare a key with).
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

from model.yamlio import load_yaml

SCHEMA_PATH = Path(__file__).resolve().parent / "schema.yaml"


@functools.cache
def schema() -> dict[str, Any]:
    return load_yaml(SCHEMA_PATH)


def kind_branches(node: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A node that dispatches on `kind` (a workload): each kind's branch (`allOf: [{if: kind is K, then: ...}]`),
    which lists every key of that kind."""
    return {b["then"]["x-kind"]: b["then"] for b in node.get("allOf", []) if "x-kind" in b.get("then", {})}


def workload_default(kind: str, *path: str) -> Any:
    """What the schema fills in for a key of a workload of this kind (`workload_default("finetune", "lora")`: the
    block with its defaults; None where the key has no default). Rules that say a key is unused compare with it:
    a value equal to its default cannot be told from one never set, so it is never called unused."""
    node = kind_branches(schema()["properties"]["workloads"]["additionalProperties"])[kind]
    for part in path:
        node = node["properties"][part]
    return with_defaults(node, {}) if node.get("type") == "object" else copy.deepcopy(node.get("default"))


def kind_branch(node: dict[str, Any], value: dict[str, Any]) -> dict[str, Any]:
    """The branch of `value`'s kind, or `node` itself (no dispatch, or an unknown kind: the schema says so)."""
    branches = kind_branches(node)
    chosen = value.get("kind")
    return branches.get(chosen, node) if isinstance(chosen, str) else node


def with_defaults(node: dict[str, Any], value: Any) -> Any:
    """Fill the schema's `default`s into `value` (objects recursively, array items too); a workload gets its own
    kind's defaults only."""
    if isinstance(value, dict) and node.get("type") == "object":
        node = kind_branch(node, value)
        out = dict(value)
        if isinstance(node.get("additionalProperties"), dict):  # a map, e.g. workloads: fill each entry
            out = {k: with_defaults(node["additionalProperties"], v) for k, v in out.items()}
        for name, sub in node.get("properties", {}).items():
            if name not in out and "default" in sub:
                out[name] = copy.deepcopy(sub["default"])
            if name in out:
                out[name] = with_defaults(sub, out[name])
        return out
    if isinstance(value, list) and isinstance(node.get("items"), dict):
        return [with_defaults(node["items"], v) for v in value]
    return value
