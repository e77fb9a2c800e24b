"""What changed between a base plan.json (e.g. of the PR's base branch) and this run's plan, by URN."""

from __future__ import annotations

from typing import Any

import msgspec


class Change(msgspec.Struct, frozen=True):
    urn: str
    type: str
    name: str
    keys: list[str]  # dotted paths of the inputs that differ, e.g. nodeConfig.machineType, args[2]


class PlanDiff(msgspec.Struct):
    added: list[dict[str, Any]] = msgspec.field(default_factory=list)
    removed: list[dict[str, Any]] = msgspec.field(default_factory=list)
    changed: list[Change] = msgspec.field(default_factory=list)
    outputs: list[str] = msgspec.field(default_factory=list)  # stack output keys that were added, removed or changed

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed or self.outputs)

    def marks(self, urns: list[str]) -> dict[str, str]:
        """URN -> create|update|same, for the tree."""
        added = {r["urn"] for r in self.added}
        changed = {c.urn for c in self.changed}
        return {u: "create" if u in added else "update" if u in changed else "same" for u in urns}


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def changed_paths(old: Any, new: Any, path: str = "") -> list[str]:
    """Dotted paths where two JSON values differ: objects key by key, lists of equal length item by
    item; a list that grew or shrank is one change at the list's path."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for key in sorted(set(old) | set(new)):
            if key not in old or key not in new:
                out.append(_join(path, key))
            else:
                out += changed_paths(old[key], new[key], _join(path, key))
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [p for i, (a, b) in enumerate(zip(old, new, strict=True)) for p in changed_paths(a, b, f"{path}[{i}]")]
    return [] if old == new else [path or "(value)"]


def diff(base: dict[str, Any], head: dict[str, Any]) -> PlanDiff:
    old = {r["urn"]: r for r in base.get("resources", [])}
    new = {r["urn"]: r for r in head.get("resources", [])}
    result = PlanDiff(
        added=[r for urn, r in new.items() if urn not in old],
        removed=[r for urn, r in old.items() if urn not in new],
    )
    for urn, r in new.items():
        if urn in old:
            keys = changed_paths(old[urn].get("inputs", {}), r.get("inputs", {}))
            if old[urn].get("dependencies", []) != r.get("dependencies", []):
                keys.append("(dependencies)")
            if keys:
                result.changed.append(Change(urn, r["type"], r["name"], keys))
    result.outputs = changed_paths(base.get("outputs", {}), head.get("outputs", {}))
    return result


def render_text(d: PlanDiff) -> str:
    if d.empty:
        return "No changes against the base plan."
    lines = [f"Against the base plan: {len(d.added)} to add, {len(d.changed)} to change, {len(d.removed)} to delete"]
    lines += [f"  + {r['type']}  {r['name']}" for r in d.added]
    for c in d.changed:
        lines.append(f"  ~ {c.type}  {c.name}: {', '.join(c.keys)}")
    lines += [f"  - {r['type']}  {r['name']}" for r in d.removed]
    if d.outputs:
        lines.append(f"  outputs changed: {', '.join(d.outputs)}")
    return "\n".join(lines)


def render_markdown(d: PlanDiff) -> str:
    if d.empty:
        return "No changes against the base branch."
    lines = [f"**{len(d.added)}** to add, **{len(d.changed)}** to change, **{len(d.removed)}** to delete.", "",
             "| | type | name | changed inputs |", "| --- | --- | --- | --- |"]
    lines += [f"| + | `{r['type']}` | `{r['name']}` | |" for r in d.added]
    lines += [f"| ~ | `{c.type}` | `{c.name}` | {', '.join(f'`{k}`' for k in c.keys)} |" for c in d.changed]
    lines += [f"| - | `{r['type']}` | `{r['name']}` | |" for r in d.removed]
    if d.outputs:
        lines += ["", "Stack outputs changed: " + ", ".join(f"`{k}`" for k in d.outputs)]
    return "\n".join(lines)
