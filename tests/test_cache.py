"""The start-up caches (model/cache.py): parsed YAML (model/yamlio.py) and the schema's verdict on a valid config
(model/config_validate.py) answer only for the inputs they were made from, and are never needed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from conftest import stack_yaml

from model import cache as model_cache
from model import config_problems, config_read, config_schema, config_validate, yamlio
from preview import engine


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(model_cache, "CACHE_DIR", tmp_path / "cache")
    return tmp_path / "cache" / "yaml"


def test_a_changed_file_is_parsed_again(tmp_path: Path, cache: Path) -> None:
    f = tmp_path / "data.yaml"
    f.write_text("gpus: {t4: 16}\n", encoding="utf-8")
    assert yamlio.load_yaml(f) == {"gpus": {"t4": 16}}
    assert len(list(cache.iterdir())) == 1
    f.write_text("gpus: {t4: 15}\n", encoding="utf-8")  # same size, same second: only the bytes differ
    assert yamlio.load_yaml(f) == {"gpus": {"t4": 15}}
    f.write_text("gpus: {t4: 16}\n", encoding="utf-8")
    assert yamlio.load_yaml(f) == {"gpus": {"t4": 16}}
    assert len(list(cache.iterdir())) == 2


def test_the_cached_value_is_what_pyyaml_parses(cache: Path) -> None:
    catalog = Path(yamlio.__file__).resolve().parent.parent / "data" / "gpu_catalog.yaml"
    expected = yaml.safe_load(catalog.read_text(encoding="utf-8"))
    assert yamlio.load_yaml(catalog) == expected  # parsed, stored
    assert yamlio.load_yaml(catalog) == expected  # from the cache


def test_a_damaged_or_unwritable_cache_is_ignored(tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "data.yaml"
    f.write_text("a: [1, 2]\n", encoding="utf-8")
    yamlio.load_yaml(f)
    (entry,) = cache.iterdir()
    entry.write_bytes(b"\x00garbage")
    assert yamlio.load_yaml(f) == {"a": [1, 2]}
    monkeypatch.setattr(model_cache, "CACHE_DIR", f / "not-a-folder")  # a file's child: mkdir fails
    assert yamlio.load_yaml(f) == {"a": [1, 2]}


def test_errors_still_name_the_file_and_are_not_cached(tmp_path: Path, cache: Path) -> None:
    f = tmp_path / "Pulumi.x.yaml"
    f.write_text("config:\n  a: 1\n  a: 2\n", encoding="utf-8")
    for _ in range(2):
        with pytest.raises(yamlio.DuplicateKeyError) as err:
            yamlio.load_yaml(f)
        assert (err.value.key, err.value.line, err.value.problem_mark.name) == ("a", 3, str(f))
    assert not cache.exists()


def _raw(stack: str, **changes: object) -> dict:
    cfg, secret_keys = engine.engine_config_from_yaml({**stack_yaml(stack), **changes})
    return config_schema.with_defaults(config_schema.schema(), config_read.read_raw(cfg, set(secret_keys), []))


def test_a_valid_config_passes_once_through_jsonschema(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = _raw("dev")
    assert config_problems.schema_problems(raw) == []
    assert len(list((cache.parent / "schema-valid").iterdir())) == 1
    monkeypatch.setitem(sys.modules, "jsonschema", None)  # importing it now fails: the verdict must be cached
    assert config_problems.schema_problems(raw) == []


def test_an_invalid_or_changed_config_is_validated_again(cache: Path) -> None:
    assert config_problems.schema_problems(_raw("dev")) == []
    bad = _raw("dev", **{"deepspeed-stack:registry": {"name": "deepspeed", "keepVersions": "ten"}})
    for _ in range(2):  # problems are never cached
        assert config_problems.schema_problems(bad) == ['registry.keepVersions: expected integer, got "ten"']
    assert len(list((cache.parent / "schema-valid").iterdir())) == 1


def test_a_secret_enters_the_key_only_as_some_string(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    one = {**_raw("gaudi"), "kubeconfig": "apiVersion: v1\nkind: Config\n"}
    other = {**one, "kubeconfig": "apiVersion: v1\nkind: Config\n# another cluster\n"}
    assert config_validate._verdict_key(one) == config_validate._verdict_key(other) is not None
    strict = {**config_schema.schema(), "properties": {**config_schema.schema()["properties"], "kubeconfig": {
        "type": "string", "x-secret": True, "minLength": 10}}}
    monkeypatch.setattr(config_validate, "schema", lambda: strict)
    assert config_validate._verdict_key(one) is None  # the verdict would hang on the secret's value: never cached
