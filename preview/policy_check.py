"""Run the policy pack (policy/rules.py) over the offline preview's records, as `pulumi preview
--policy-pack policy` would over the engine's: same functions, same camelCase properties."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
from pulumi_policy import (
    EnforcementLevel,
    PolicyCustomTimeouts,
    PolicyResourceOptions,
    ResourceValidationArgs,
    ResourceValidationPolicy,
)
from pulumi_policy.policy import _NotApplicableError

from policy.rules import POLICIES
from preview.engine import Registration, RunResult

PACK_LEVEL = EnforcementLevel.MANDATORY  # policy/__main__.py's pack default


class Violation(msgspec.Struct, frozen=True):
    policy: str
    level: str  # mandatory | advisory
    urn: str
    type: str
    name: str
    message: str

    @property
    def mandatory(self) -> bool:
        return self.level == EnforcementLevel.MANDATORY.value


def validation_args(reg: Registration, config: dict[str, Any] | None = None) -> ResourceValidationArgs:
    """What the analyzer hands a resource validation, built from one recorded registration."""
    opts = PolicyResourceOptions(protect=reg.protect, ignore_changes=[], delete_before_replace=None, aliases=[],
                                 custom_timeouts=PolicyCustomTimeouts(0, 0, 0), additional_secret_outputs=[],
                                 parent=reg.parent)
    return ResourceValidationArgs(reg.type, reg.inputs, reg.urn, reg.name, opts, None, config or {})


def load_config(path: Path | None) -> dict[str, Any]:
    """A `--policy-pack-config` file: {"policy-name": "advisory" | {"enforcementLevel": ..., key: value}}."""
    if path is None:
        return {}
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def _level_and_config(policy: ResourceValidationPolicy, pack_config: dict[str, Any]) -> tuple[str, dict]:
    entry = pack_config.get(policy.name, pack_config.get("all"))
    level = (policy.enforcement_level or PACK_LEVEL).value
    if isinstance(entry, str):
        return entry, {}
    if isinstance(entry, dict):
        config = {k: v for k, v in entry.items() if k != "enforcementLevel"}
        return entry.get("enforcementLevel", level), config
    return level, {}


def validate(policy: ResourceValidationPolicy, reg: Registration, config: dict[str, Any] | None = None) -> list[str]:
    """The messages one policy reports for one resource (the tests' entry point too)."""
    messages: list[str] = []
    try:
        policy.validate(validation_args(reg, config), lambda message, urn=None: messages.append(message))
    except _NotApplicableError:  # what args.not_applicable() raises
        return []
    return messages


def evaluate(run: RunResult, pack_config: dict[str, Any] | None = None) -> list[Violation]:
    pack_config = pack_config or {}
    found: list[Violation] = []
    for policy in POLICIES:
        level, config = _level_and_config(policy, pack_config)
        if level == EnforcementLevel.DISABLED.value:
            continue
        for reg in run.resources:
            found += [Violation(policy.name, level, reg.urn, reg.type, reg.name, m)
                      for m in validate(policy, reg, config)]
    return found
