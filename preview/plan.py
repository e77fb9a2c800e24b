"""plan.json: the recorded registrations of one stack as a stable JSON document other tools read.

The format is documented by `preview/plan.schema.json` (a JSON Schema) and the README. Resources keep
their registration order (the order `pulumi up` would create them in, parents first); object keys are
sorted so two runs of the same program give byte-identical files and diffs show only real changes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from preview.engine import PROJECT, RunResult

SCHEMA_PATH = Path(__file__).resolve().parent / "plan.schema.json"
RESOURCE_KEYS = ("urn", "type", "name", "parent", "custom", "provider", "inputs", "dependencies")


def _sorted(value: Any) -> Any:
    """Objects with sorted keys, recursively; list order is kept (container order, args order mean something)."""
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def build(run: RunResult) -> dict[str, Any]:
    resources = []
    for reg in run.resources:
        entry = reg.to_plan()
        entry = {key: entry[key] for key in RESOURCE_KEYS}  # the documented order, whatever to_plan grows
        entry["inputs"] = _sorted(entry["inputs"])
        entry["dependencies"] = sorted(entry["dependencies"])
        resources.append(entry)
    return {"project": PROJECT, "stack": run.stack, "resources": resources, "outputs": _sorted(run.outputs),
            "warnings": list(run.warnings)}


def dumps(plan: dict[str, Any]) -> str:
    return json.dumps(plan, indent=2, ensure_ascii=False) + "\n"


def write(plan: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(plan), encoding="utf-8")
    return path


def read(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def schema() -> dict[str, Any]:
    with open(SCHEMA_PATH, encoding="utf-8") as fh:
        return json.load(fh)
