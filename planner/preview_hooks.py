"""The planner's section of the offline preview summary: the stack's estimated cost (the `costs` output)."""

from __future__ import annotations

from planner.capacity_plan import capacity_markdown
from planner.cost import costs_markdown
from preview import hooks
from preview.engine import RunResult


@hooks.section
def estimated_cost(run: RunResult) -> list[hooks.Section]:
    costs = run.outputs.get("costs")
    return [("Estimated cost", costs_markdown(costs))] if isinstance(costs, dict) else []


@hooks.section
def capacity_plan(run: RunResult) -> list[hooks.Section]:
    plan = run.outputs.get("capacityPlan")
    return [("Capacity plan", capacity_markdown(plan))] if isinstance(plan, dict) and plan else []
