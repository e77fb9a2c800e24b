"""The rules: stack config -> typed model (model/config.py) -> every rule below -> the validated model.

The rules sit above what they check (model, planner, workloads), so nothing below imports them. Each area
keeps its rules in its own module as a `CHECKS` list of named functions, each returning its problems; each
workload kind keeps its own rules in its module (workloads/kinds/), run here through the registry for the
workloads of that kind. `load()` runs them all and reports every problem at once in one ConfigError (a
`pulumi.RunError`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from checks import (
    capacity,
    cluster_wide,
    fabric,
    gated,
    gaudi,
    image,
    machine_disks,
    node_fit,
    offload,
    planner,
    platform,
    reachability,
    vertex,
    workloads,
)
from checks.common import Check
from model.config import ConfigError, parse_all
from model.problems import Problem, lines
from model.types import StackConfig
from workloads.kinds import kind_of


def kind_rules(m: StackConfig) -> list[Problem]:
    """Each workload's own kind's rules (workloads/kinds/<kind>.py)."""
    return [p for w in m.workloads.values() for p in kind_of(w).problems(m, w)]


def kind_warnings(m: StackConfig) -> list[Problem]:
    return [p for w in m.workloads.values() for rule in kind_of(w).warnings for p in rule(m, w)]


ALL_CHECKS: list[Check] = [*platform.CHECKS, *workloads.CHECKS, kind_rules, *gaudi.CHECKS, *planner.CHECKS,
                           *vertex.CHECKS, *capacity.CHECKS, *fabric.CHECKS, *offload.CHECKS, *machine_disks.CHECKS,
                           *cluster_wide.CHECKS, *image.CHECKS, *reachability.CHECKS,
                           *node_fit.CHECKS, *gated.CHECKS]


def run_all(m: StackConfig) -> list[Problem]:
    found = [problem for check in ALL_CHECKS for problem in check(m)]
    strays = [p for p in found if not isinstance(p, Problem)]
    if strays:  # a rule that still returns text: model/repair.py would have to parse it back into a key
        raise TypeError(f"rules must return model.problems.Problem values, got {strays[:3]!r}")
    return found


def load(cfg: dict[str, Any] | None = None, secret_keys: set[str] | None = None) -> StackConfig:
    """Validate the stack's config and return the typed model, or raise ConfigError with every problem."""
    parsed = parse_all(cfg, secret_keys)
    # The rules also run when the schema rejected some values (those are dropped first), so every problem
    # is reported in one run; theirs on keys the schema already reported are left out, and so are those that
    # change when the defaults standing in beside a rejected key change (parsed.variant).
    rules = []
    if parsed.model is not None:
        variant = run_all(parsed.variant) if parsed.variant is not None else None
        rules = parsed.rule_problems(run_all(parsed.model), variant)
    problems = [*parsed.problems, *rules]
    if problems:
        raise ConfigError(problems)
    return parsed.model


def warnings(m: StackConfig) -> list[str]:
    """Tight fits that deploy but deserve a reviewer's eye (each a sentence starting with its key), as logged."""
    return lines(warning_problems(m))


def warning_problems(m: StackConfig) -> list[Problem]:
    """The warnings as values (level "warning")."""
    found = (planner.warnings(m) + capacity.warnings(m) + fabric.warnings(m) + gaudi.warnings(m)
             + platform.warnings(m) + image.warnings(m) + vertex.warnings(m)
             + workloads.warnings(m) + kind_warnings(m))
    return [msgspec.structs.replace(p, level="warning") if isinstance(p, Problem) else p for p in found]


__all__ = ["ALL_CHECKS", "ConfigError", "Problem", "load", "run_all", "warning_problems", "warnings"]
