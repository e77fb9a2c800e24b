"""Which changes against a base plan replace a stateful resource, said in words for the summary.

The mock monitor cannot ask the providers for a diff, so the preview decides from which inputs changed: each
stateful resource type lists its replace-forcing inputs in `data/replacements.yaml` (with the provider source
they come from). A resource with a fixed name replaces delete-first (deleteBeforeReplace), so for a while it
is simply gone; a protected one blocks `pulumi up` until `protect` is lifted.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import msgspec

from model.yamlio import load_yaml
from preview.diff import PlanDiff
from preview.engine import RunResult

DATA = Path(__file__).resolve().parent.parent / "data" / "replacements.yaml"


class Replacement(msgspec.Struct, frozen=True):
    type: str
    name: str
    keys: list[str]  # the changed inputs that force it
    what: str  # "replaces the cluster"
    consequence: str
    protected: bool = False
    delete_first: bool = False

    def sentence(self) -> str:
        keys = ", ".join(self.keys)
        text = f"{self.name} ({self.type}): {keys} changed, so this {self.what}: {self.consequence}."
        if self.delete_first:
            text += " Its name is fixed, so the old one is deleted before the new one is created."
        if self.protected:
            text += " It is protected: `pulumi up` refuses until protect is lifted."
        return text


@functools.cache
def table(path: Path = DATA) -> dict[str, dict[str, Any]]:
    return load_yaml(path)["types"]


def _forces(key: str, inputs: list[str]) -> bool:
    """A changed path forces replacement when it is a listed input or lies below one (`a.b[0].c` under `a.b`)."""
    return any(key == i or key.startswith((f"{i}.", f"{i}[")) for i in inputs)


def replacements(plan_diff: PlanDiff, run: RunResult | None = None) -> list[Replacement]:
    """Every changed resource whose changed inputs force its replacement, with the resource options of this
    run (protect, deleteBeforeReplace) when `run` is given."""
    found = []
    index = run.index() if run is not None else {}
    for change in plan_diff.changed:
        entry = table().get(change.type)
        if entry is None:
            continue
        keys = [k for k in change.keys if _forces(k, entry["inputs"])]
        if not keys:
            continue
        reg = index.get(change.urn)
        found.append(Replacement(change.type, change.name, keys, entry["what"], entry["consequence"],
                                 protected=bool(reg and reg.protect),
                                 delete_first=bool(reg and reg.delete_before_replace)))
    return found


def render_text(found: list[Replacement]) -> str:
    return "\n".join(["Replacements of stateful resources:", *(f"  ! {r.sentence()}" for r in found)])


def render_markdown(found: list[Replacement]) -> str:
    return "\n".join(["> [!WARNING]", "> **Replaces stateful resources:**",
                      *(f"> - {r.sentence()}" for r in found)])
