"""The "Estimated cost" section, from the `costs` stack output (planner/cost.py computes it, planner/cost_markdown.py
renders it)."""

from __future__ import annotations

from planner.cost_markdown import costs_markdown
from preview.engine import RunResult
from preview.sections import Section


def section(run: RunResult) -> list[Section]:
    costs = run.outputs.get("costs")
    return [("Estimated cost", costs_markdown(costs))] if isinstance(costs, dict) else []
