"""What keeps the program's start-up close to the bare SDK's (`make bench`, docs/measurements.md)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import msgspec
import pulumi
import pytest
from conftest import PROJECT_DIR

PROGRAM_PACKAGES = ("model", "planner", "workloads", "components", "checks")


def _modules() -> list[str]:
    names = []
    for package in PROGRAM_PACKAGES:
        for info in pkgutil.walk_packages([str(PROJECT_DIR / package)], prefix=f"{package}."):
            if ".scripts" in info.name or ".images" in info.name:  # programs of the image, not of the stack
                continue
            names.append(info.name)
    return names


def _classes() -> list[type]:
    found = []
    for name in _modules():
        module = importlib.import_module(name)
        found += [c for c in vars(module).values() if inspect.isclass(c) and c.__module__ == name]
    return found


def test_the_walk_finds_the_components_and_the_model() -> None:
    names = {c.__qualname__ for c in _classes()}
    assert {"GkeCluster", "GpuNodePool", "ModelServer", "TrainingJob", "StackConfig", "NodePoolConfig"} <= names


@pytest.mark.parametrize("cls", [c for c in _classes() if issubclass(c, pulumi.Resource)], ids=lambda c: c.__name__)
def test_no_resource_class_declares_class_level_annotations(cls: type) -> None:
    # Pulumi reads a resource class's own annotations as its output types at every registration
    # (pulumi/_types.py resource_types -> get_type_hints, called from rpc.resolve_outputs, uncached): each one is
    # evaluated again, and `k8s.autoscaling.v2.HorizontalPodAutoscaler` imports that SDK module (70 ms) in a stack
    # that creates none. Annotate the attribute where __init__ assigns it: Python keeps no such annotation.
    assert inspect.get_annotations(cls) == {}


def test_the_model_is_made_of_structs_not_dataclasses() -> None:
    # ~120 frozen dataclasses generated their methods with exec at import: 150 ms of the program's 185 ms of
    # its own imports on the 2-core machine (docs/measurements.md). msgspec builds a Struct class in C.
    plain = [c.__qualname__ for c in _classes() if hasattr(c, "__dataclass_fields__")]
    assert plain == []
    structs = [c for c in _classes() if issubclass(c, msgspec.Struct)]
    assert len(structs) >= 100


def test_a_frozen_struct_keeps_what_the_frozen_dataclasses_gave() -> None:
    from model.types import GpuConfig

    a, b = (GpuConfig(type="nvidia-l4", count=1, driver_version="LATEST") for _ in range(2))
    assert a == b and hash(a) == hash(b) and a != msgspec.structs.replace(a, count=2)  # by value, hashable
    with pytest.raises(AttributeError):
        a.count = 2  # type: ignore[misc]
    assert a.count == 1

