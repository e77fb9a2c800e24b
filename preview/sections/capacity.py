"""The "Capacity plan" section, from the `capacityPlan` stack output (planner/capacity_plan.py computes it)."""

from __future__ import annotations

from planner.capacity_plan import capacity_markdown
from preview.engine import RunResult
from preview.sections import Section


def section(run: RunResult) -> list[Section]:
    plan = run.outputs.get("capacityPlan")
    return [("Capacity plan", capacity_markdown(plan))] if isinstance(plan, dict) and plan else []
