"""The config is written once: model/schema.yaml says every key (type, default, description) and the typed classes
(model/types.py; the workloads' in model/workload_*.py and model/training_blocks.py) hold them. Walked together
here: every schema key has a field, every field a schema key, and no default is written twice (the schema's fills
every value before `build`)."""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from model.config_schema import kind_branches, schema
from model.training_blocks import TrainingConfig  # written: the reader's record of the keys a file wrote
from model.types import WORKLOAD_TYPES, NodePoolConfig, StackConfig, WorkloadConfig, build, camel

# Fields filled from outside the `deepspeed-stack:` keys: gcp:project and gcp:region; and the keys every workload has
# that a kind fixes in its class instead (a TensorBoard server's GPU keys: it takes none).
NOT_FROM_THE_SCHEMA = {(StackConfig, "project"), (StackConfig, "region"), (TrainingConfig, "written"),
                       (NodePoolConfig, "reservation_end_text"),  # the model keeps the end as written beside its time
                       *((cls, name) for cls in WORKLOAD_TYPES.values() for name in getattr(cls, "FIXED_FIELDS", ()))}


def _key(f: msgspec.structs.FieldInfo) -> str:
    return f.encode_name if f.encode_name != f.name else camel(f.name)


def _is_struct(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, msgspec.Struct)


def _inner(hint: Any) -> Any:
    """`X | None` -> X."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        return inner[0] if len(inner) == 1 else hint  # `float | str`: a key of two scalar types
    return hint


def _pairs(node: dict[str, Any], cls: type, path: str = "") -> Iterator[tuple[str, dict[str, Any], type]]:
    """Each object of the schema with the class it is built as (a workload: each kind's branch and class)."""
    yield path or "(root)", node, cls
    hints = typing.get_type_hints(cls)
    for f in msgspec.structs.fields(cls):
        sub = node.get("properties", {}).get(_key(f))
        if sub is None:
            continue
        hint, where = _inner(hints[f.name]), f"{path}.{_key(f)}".lstrip(".")
        origin = typing.get_origin(hint)
        if _is_struct(hint):
            yield from _pairs(sub, hint, where)
        elif origin is list and _is_struct(typing.get_args(hint)[0]):
            yield from _pairs(sub["items"], typing.get_args(hint)[0], f"{where}[i]")
        elif origin is dict and _is_struct(typing.get_args(hint)[1]):
            item, entry = typing.get_args(hint)[1], sub["additionalProperties"]
            if item is WorkloadConfig:
                for kind, branch in kind_branches(entry).items():
                    yield from _pairs(branch, WORKLOAD_TYPES[kind], f"{where}.<{kind}>")
            else:
                yield from _pairs(entry, item, f"{where}.<name>")


PAIRS = list(_pairs(schema(), StackConfig))


def test_the_walk_reaches_every_object_class() -> None:
    classes = {cls for _, _, cls in PAIRS}
    assert set(WORKLOAD_TYPES.values()) <= classes
    assert len(PAIRS) >= 45  # every object of the schema (cluster, pools, workloads' blocks, serving, vertex, ...)


@pytest.mark.parametrize(("path", "node", "cls"), PAIRS, ids=[p for p, _, _ in PAIRS])
def test_every_schema_key_has_a_field_and_every_field_a_key(path: str, node: dict[str, Any], cls: type) -> None:
    keys = set(node.get("properties", {}))
    fields = {_key(f) for f in msgspec.structs.fields(cls)
              if (cls, f.name) not in NOT_FROM_THE_SCHEMA and not (f.name == "name" and "name" not in keys)}
    assert sorted(keys - fields) == [], f"{path}: schema keys with no field of {cls.__name__}"
    assert sorted(fields - keys) == [], f"{path}: fields of {cls.__name__} with no schema key"


@pytest.mark.parametrize(("path", "node", "cls"), PAIRS, ids=[p for p, _, _ in PAIRS])
def test_no_default_is_written_twice(path: str, node: dict[str, Any], cls: type) -> None:
    props = node.get("properties", {})
    twice = [f.name for f in msgspec.structs.fields(cls) if "default" in props.get(_key(f), {})
             and (f.default is not msgspec.NODEFAULT or f.default_factory is not msgspec.NODEFAULT)]
    assert twice == [], f"{path}: {cls.__name__} repeats the schema's default of {twice}"


def test_build_refuses_a_schema_key_with_no_field() -> None:
    with pytest.raises(TypeError, match="StackConfig has no field for the schema key"):
        build(StackConfig, {"notAKey": 1}, project="p", region="r")
