"""The resource tree, drawn like `pulumi preview`: the stack root, components with their children
nested in registration order, a mark per resource (`+` create; with a base plan `~` update, `-` delete)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

import msgspec

from preview.engine import PROJECT, Registration, RunResult

STACK_TYPE = "pulumi:pulumi:Stack"
MARKS = {"create": "+", "update": "~", "delete": "-", "same": " "}


class Row(msgspec.Struct, frozen=True):
    mark: str
    type: str
    name: str
    depth: int
    prefix: str  # the tree glyphs before the type, e.g. "│  ├─ "


def _children(run: RunResult) -> dict[str | None, list[Registration]]:
    """Parent URN -> children in registration order; resources whose parent is unknown (the stack root,
    which the recorder does not list) hang under None."""
    known = run.index()
    out: dict[str | None, list[Registration]] = defaultdict(list)
    for reg in run.resources:
        out[reg.parent if reg.parent in known else None].append(reg)
    return out


def rows(run: RunResult, changes: dict[str, str] | None = None) -> Iterator[Row]:
    """The stack root, then every resource depth-first. `changes` maps URN -> create|update|same|delete;
    without it every resource is a create."""
    # Against a base plan the stack already exists; without one everything, the root too, is new.
    yield Row(MARKS["same"] if changes is not None else MARKS["create"], STACK_TYPE, f"{PROJECT}-{run.stack}", 0, "")
    changes = changes or {}
    children = _children(run)

    def walk(parent: str | None, depth: int, indent: str) -> Iterator[Row]:
        kids = children.get(parent, [])
        for i, reg in enumerate(kids):
            last = i == len(kids) - 1
            mark = MARKS[changes.get(reg.urn, "create")]
            yield Row(mark, reg.type, reg.name, depth, indent + ("└─ " if last else "├─ "))
            yield from walk(reg.urn, depth + 1, indent + ("   " if last else "│  "))

    yield from walk(None, 1, "")


def render(run: RunResult, changes: dict[str, str] | None = None,
           removed: list[tuple[str, str]] | None = None) -> str:
    """The table: mark, type (indented by depth), name. `removed` lists (type, name) of deleted resources."""
    table = list(rows(run, changes))
    table += [Row(MARKS["delete"], type_, name, 1, "   ") for type_, name in (removed or [])]
    width = max(len(r.prefix) + len(r.type) for r in table)
    lines = [f"     {'Type':<{width}}  Name"]
    lines += [f" {r.mark}   {(r.prefix + r.type):<{width}}  {r.name}" for r in table]
    return "\n".join(lines)
