"""Stack config -> one typed, validated model.

The data path: the engine's config map (`deepspeed-stack:*` and `gcp:*` keys, objects JSON-encoded)
-> schema validation with defaults (model/schema.yaml) -> typed objects (model/types.py). The semantic
rules run above this layer (checks/). Every problem found is reported at once in one `ConfigError`, a
`pulumi.RunError`, so Pulumi prints it without a traceback and no bad value reaches a cloud API.

This module runs the steps in order and builds the typed model; each step is a module of its own:
model/config_read.py (the engine's map: this project's keys, secrets, gcp:*), model/config_schema.py (the schema and
its defaults), model/config_validate.py (the schema's verdict, cached) and model/config_problems.py (its errors as
problems at their keys).
"""

from __future__ import annotations

from typing import Any

import msgspec
import pulumi
from pulumi.runtime import config as runtime_config

from model import defaults, repair, reservation
from model.config_problems import describe_all
from model.config_read import engine_config, gcp_settings, plain_keys_set_as_secrets, read_raw
from model.config_schema import schema, with_defaults
from model.config_validate import schema_errors, schema_validator
from model.problems import Problem, lines
from model.training_blocks import WRITTEN_KEY
from model.types import StackConfig, build, camel, snake


class ConfigError(pulumi.RunError):
    """All configuration problems of a stack (`found`), one line each (`problems`), each starting with its key path."""

    def __init__(self, found: list[Problem]):
        self.found = found
        self.problems = lines(found)
        listed = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid stack configuration ({len(found)} problem(s)):\n{listed}")


class Parsed(msgspec.Struct, frozen=True):
    """The typed model and the problems found on the way. `model` is built from the config with every value
    the schema rejected dropped (model/repair.py), so the rules can still check the rest; None when too
    much was rejected for that (a whole top-level key). `reported`: keys (their parts) whose problems the rules
    must not repeat. `variant`: the same model with the defaults of every object that had a key rejected set to other
    valid values (None when no object had one): a rule's problem that changes with them was computed from a
    default standing in for what the user meant (`zeroStag: 3` -> the default zeroStage 2 -> "at ZeRO-2 needs
    50.9 GB"), so it is left out."""

    model: StackConfig | None
    problems: list[Problem]
    reported: list[repair.Key]
    variant: StackConfig | None = None

    def rule_problems(self, problems: list[Problem], variant_problems: list[Problem] | None = None) -> list[Problem]:
        """The rules' problems that say something new and do not hang on a stand-in default (those the rules
        also find, word for word, on `variant`)."""
        if variant_problems is not None:
            same = set(variant_problems)
            problems = [p for p in problems if p in same]
        return repair.without_echoes(problems, self.reported)


def written_training(raw: dict[str, Any], filled: dict[str, Any]) -> None:
    """Record in each workload's `training` the keys the stack file wrote there (TrainingConfig.written): a rule
    refuses them beside `finetune` whatever their value, and a value equal to its default tells nothing."""
    for name, workload in (filled.get("workloads") or {}).items():
        given = ((raw.get("workloads") or {}).get(name) or {})
        training = workload.get("training") if isinstance(workload, dict) else None
        if isinstance(training, dict) and isinstance(given, dict) and isinstance(given.get("training"), dict):
            training[WRITTEN_KEY] = sorted(given["training"])


def parse_all(cfg: dict[str, Any] | None = None, secret_keys: set[str] | None = None) -> Parsed:
    """Read the stack's config into the typed model and every schema problem, without stopping at the first."""
    cfg = engine_config() if cfg is None else cfg
    if secret_keys is None:
        secret_keys = set(runtime_config._SECRET_KEYS.get()) | set(runtime_config.get_config_secret_keys_env())
    problems = plain_keys_set_as_secrets(cfg, secret_keys)
    if problems:
        return Parsed(None, problems, [])  # no message may repeat such a value, so nothing else is read
    raw = read_raw(cfg, secret_keys, problems)
    project, region = gcp_settings(cfg, problems, required="cluster" in raw)
    filled = with_defaults(schema(), raw)
    errors = schema_errors(filled)
    # The problems found so far are on top-level keys (the engine's map, gcp:*); the schema's name their parts.
    reported: list[repair.Key] = [(p.path,) for p in problems]
    for parts, problem in describe_all(errors, filled):
        problems.append(problem)
        reported.append(parts)
    valid: dict[str, Any] | None = filled
    if problems:
        fixed = repair.repair(filled, schema_validator(), lambda c: with_defaults(schema(), c), errors)
        valid = fixed.config
        reported += fixed.dropped
    reported = list(dict.fromkeys(reported))
    if valid is None:
        return Parsed(None, problems, reported)
    # A schema-valid config has no unknown keys, so no default stands in for one.
    unknown = defaults.objects_with_unknown_keys(errors)
    variant = defaults.other_defaults(schema(), raw, valid, unknown)
    written_training(raw, valid)
    for parts, problem in reservation.typed_end_times(valid):
        problems.append(problem)
        reported.append(parts)
    if variant is not None:
        written_training(raw, variant)
        reservation.typed_end_times(variant)  # the same problems, reported once
    secrets = {snake(k): pulumi.Output.secret(valid.pop(k)) for k, p in schema()["properties"].items()
               if p.get("x-secret") and k in valid}
    model = build(StackConfig, valid, project=project, region=region, **secrets)
    if variant is not None:
        for k in secrets:
            variant.pop(camel(k), None)
        variant = build(StackConfig, variant, project=project, region=region, **secrets)
    return Parsed(model, problems, reported, variant)


def parse(cfg: dict[str, Any] | None = None, secret_keys: set[str] | None = None) -> StackConfig:
    """Read the stack's config into the typed model, or raise ConfigError with every schema problem.

    Only what the schema and the config engine can say is checked here; the rules that need the catalog, the
    planner or the workloads live above, in checks/ (whose `load()` is what the program calls)."""
    parsed = parse_all(cfg, secret_keys)
    if parsed.problems or parsed.model is None:
        raise ConfigError(parsed.problems)
    return parsed.model
