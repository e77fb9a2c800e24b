"""Render the configuration reference (docs/reference.md) from model/schema.yaml (`make docs`).

The schema is the one description of every key; tests fail when the reference drifts from it.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from model.config_schema import kind_branches, schema

START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"


def _type(node: dict[str, Any]) -> str:
    if "enum" in node:
        return " \\| ".join(f"`{v}`" for v in node["enum"])
    t = node.get("type", "any")
    if isinstance(t, list):  # a key of two types (finetune.evalSplit: a number or a path)
        return " or ".join(t)
    if t == "array" and isinstance(node.get("items"), dict):
        return f"list of {_type(node['items'])}"
    if t == "object" and isinstance(node.get("additionalProperties"), dict):
        inner = node["additionalProperties"]
        return "map of " + ("objects (keys below)" if inner.get("properties") else inner.get("type", "any"))
    return t + (" (secret)" if node.get("x-secret") else "")


def _default(node: dict[str, Any]) -> str:
    if "default" not in node:
        return "required" if node.get("_required") else "—"
    value = node["default"]
    return f"`{json.dumps(value)}`"


def _with_kind_keys(node: dict[str, Any]) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The node's keys, then each kind's own (a workload: the keys every kind has, then its kind's branch), with
    the kinds that have each of those."""
    props = dict(node.get("properties", {}))
    kinds: dict[str, list[str]] = {}
    for kind, branch in kind_branches(node).items():
        for name, sub in branch.get("properties", {}).items():
            if name not in node.get("properties", {}):
                props.setdefault(name, sub)
                kinds.setdefault(name, []).append(kind)
    return props, kinds


def rows(node: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, str, str, str]]:
    required = set(node.get("required", []))
    props, kinds = _with_kind_keys(node)
    for name, sub in props.items():
        key = f"{prefix}.{name}" if prefix else name
        sub = {**sub, "_required": name in required}
        only = f"Kind {', '.join(kinds[name])} only. " if name in kinds else ""
        yield key, _type(sub), _default(sub), only + sub.get("description", "")
        if sub.get("type") == "object" and isinstance(sub.get("additionalProperties"), dict):
            yield from rows(sub["additionalProperties"], f"{key}.<name>")
        elif sub.get("type") == "object":
            yield from rows(sub, key)
        elif sub.get("type") == "array" and sub.get("items", {}).get("type") == "object":
            yield from rows(sub["items"], f"{key}[i]")


def render() -> str:
    lines = [START, "", "| key | type | default | what it changes |", "| --- | --- | --- | --- |"]
    lines += [f"| `{k}` | {t} | {d} | {desc} |" for k, t, d, desc in rows(schema())]
    return "\n".join([*lines, "", END])


def replace_in(text: str) -> str:
    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"the file has no {START} ... {END} block")
    return pattern.sub(lambda _: render(), text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", type=Path, help="update the reference block in this Markdown file")
    args = parser.parse_args()
    if args.write:
        args.write.write_text(replace_in(args.write.read_text()))
    else:
        print(render())


if __name__ == "__main__":
    main()
