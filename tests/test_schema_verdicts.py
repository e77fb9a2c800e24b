"""The schema's verdict decided key by key (model/config_validate.py `_each_value_valid`): a config whose every
top-level value was found valid before is valid without validating it whole, and anything else is validated whole, so
the errors are jsonschema's own, as before. Each test answers against jsonschema run directly on the same config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from conftest import stack_yaml

from model import cache as model_cache
from model import config_problems, config_read, config_schema, config_validate
from preview import engine


@pytest.fixture(autouse=True)
def _no_stored_verdicts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty build/.cache: no verdict stored by another run answers first."""
    monkeypatch.setattr(model_cache, "CACHE_DIR", tmp_path / "cache")


def _raw(stack: str, **changes: object) -> dict[str, Any]:
    cfg, secret_keys = engine.engine_config_from_yaml({**stack_yaml(stack), **changes})
    return config_schema.with_defaults(config_schema.schema(), config_read.read_raw(cfg, set(secret_keys), []))


def _jsonschema_errors(raw: dict[str, Any], schema: dict[str, Any] | None = None) -> list[tuple[list[Any], str]]:
    validator = jsonschema.Draft202012Validator(schema or config_schema.schema())
    return sorted((list(e.absolute_path), e.message) for e in validator.iter_errors(raw))


def _errors(raw: dict[str, Any]) -> list[tuple[list[Any], str]]:
    return sorted((list(e.absolute_path), e.message) for e in config_validate.schema_errors(raw))


def test_an_unknown_key_beside_values_found_valid_is_still_reported() -> None:
    raw = _raw("dev")
    assert config_problems.schema_problems(raw) == []
    misspelt = {**raw, "clustr": raw["cluster"]}  # every value seen valid just now, one key unknown
    assert config_problems.schema_problems(misspelt) == ["clustr: unknown key; did you mean `cluster`?"]
    assert _errors(misspelt) == _jsonschema_errors(misspelt) != []


def test_one_bad_value_beside_values_found_valid_gives_jsonschemas_errors() -> None:
    assert config_problems.schema_problems(_raw("dev")) == []
    bad = _raw("dev", **{"deepspeed-stack:registry": {"name": "deepspeed", "keepVersions": "ten"}})
    assert config_problems.schema_problems(bad) == ['registry.keepVersions: expected integer, got "ten"']
    assert _errors(bad) == _jsonschema_errors(bad)


def test_a_value_found_valid_under_one_key_is_not_valid_under_another() -> None:
    raw = _raw("dev")
    assert config_problems.schema_problems(raw) == []
    moved = {**raw, "kueue": raw["registry"]}  # {name, keepVersions}: a registry, not a kueue
    assert config_problems.schema_problems(moved) == ["kueue.keepVersions: unknown key; did you mean `version`?",
                                             "kueue.name: unknown key; known keys: install, queueName, version"]
    assert _errors(moved) == _jsonschema_errors(moved)


def test_a_root_that_ties_keys_together_is_validated_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`required` (or allOf, if...) at the root makes a config's verdict more than its values' verdicts."""
    raw = _raw("dev")
    assert config_problems.schema_problems(raw) == []  # each value found valid
    strict = {**config_schema.schema(), "required": ["storage", "hfToken"]}
    monkeypatch.setattr(config_validate, "schema", lambda: strict)
    monkeypatch.setattr(model_cache, "CACHE_DIR", tmp_path / "other")  # the stored verdict keys on the first schema
    assert _errors(raw) == _jsonschema_errors(raw, strict) == [([], "'hfToken' is a required property")]


def test_a_secret_is_checked_every_time_and_never_remembered() -> None:
    raw = {**_raw("gaudi"), "kubeconfig": "apiVersion: v1\nkind: Config\n"}
    assert config_problems.schema_problems(raw) == []
    (_, _, seen) = config_validate._VALIDATED[0]
    assert {(k, json.dumps(v, sort_keys=True)) for k, v in raw.items() if k != "kubeconfig"} <= seen
    assert not any(key == "kubeconfig" or "apiVersion" in value for key, value in seen)
