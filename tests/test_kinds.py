"""The workload kinds: one registry (workloads/kinds/), one typed class per kind (model/workload_types.py), one
schema branch per kind (model/schema.yaml), and nothing else that names kinds."""

from __future__ import annotations

import re

import pytest
from conftest import PROJECT_DIR, model, problems

from model.config_schema import kind_branches, schema
from model.types import (
    WORKLOAD_TYPES,
    HelmWorkloadConfig,
    MpiJobWorkloadConfig,
    ServeWorkloadConfig,
    StackConfig,
    build,
)
from workloads.kinds import KINDS, kind_of

WORKLOAD_NODE = schema()["properties"]["workloads"]["additionalProperties"]


def test_one_list_of_kinds_everywhere() -> None:
    kinds = ["helm", "mpijob", "finetune", "serve", "tensorboard"]
    assert list(KINDS) == kinds
    assert list(WORKLOAD_TYPES) == kinds
    assert WORKLOAD_NODE["properties"]["kind"]["enum"] == kinds
    assert list(kind_branches(WORKLOAD_NODE)) == kinds
    for name, kind in KINDS.items():
        assert kind.name == name and kind.config is WORKLOAD_TYPES[name]


@pytest.mark.parametrize(("stack", "name", "cls"), [
    ("dev", "smoke", HelmWorkloadConfig), ("gaudi", "gaudi-llm-ds-ft", MpiJobWorkloadConfig),
    ("h100", "smoke", MpiJobWorkloadConfig), ("serve", "chat", ServeWorkloadConfig),
])
def test_each_workload_is_built_as_its_kinds_class(stack: str, name: str, cls: type) -> None:
    w = model(stack).workloads[name]
    assert type(w) is cls
    assert kind_of(w) is KINDS[w.kind]


def test_a_kinds_class_has_only_its_keys() -> None:
    serve = model("serve").workloads["chat"]
    assert not hasattr(serve, "deepspeed") and not hasattr(serve, "storage") and not hasattr(serve, "chart")
    helm = model("dev").workloads["smoke"]
    assert not hasattr(helm, "serving") and not hasattr(helm, "gaudi") and not hasattr(helm, "storage")


def test_a_key_of_another_kind_names_the_kinds_keys() -> None:
    assert problems("dev", {"workloads.smoke.serving": {"replicas": 2}}) == [
        "workloads.smoke.serving: not a key of kind helm (its keys: accelerator, chart, deepspeed, fallbackPool, "
        "gcsFuse, image, kind, launch, model, namespace, pool, resources, workers); it is a key of kind serve"]
    assert problems("serve", {"workloads.chat.deepspeed": {"zeroStage": 3}}) == [
        "workloads.chat.deepspeed: not a key of kind serve (its keys: accelerator, fallbackPool, gcsFuse, image, "
        "kind, model, namespace, pool, resources, serving, workers); it is a key of kind helm, mpijob, finetune"]


def test_a_misspelt_key_of_the_kind_is_suggested() -> None:
    assert problems("dev", {"workloads.smoke.chrt": {"version": "2.3.51"}}) == [
        "workloads.smoke.chrt: unknown key; did you mean `chart`?"]


def test_an_unknown_kind_lists_the_kinds_and_nothing_else() -> None:
    # No follow-on errors: with no kind to check them against, the other keys say nothing.
    assert problems("dev", {"workloads.smoke.kind": "finetuning"}) == [
        'workloads.smoke.kind: "finetuning" is not one of helm, mpijob, finetune, serve, tensorboard; did you mean '
        '`finetune`?']


def test_a_workload_gets_only_its_kinds_defaults() -> None:
    serve = model("serve").workloads["chat"]
    assert serve.serving.openai.port == 8000  # model/schema.yaml: serving.openai.port's default
    helm = model("dev").workloads["smoke"]
    assert helm.chart.repository == "oci://registry-1.docker.io/bitnamicharts"


def test_build_refuses_a_key_with_no_field() -> None:
    with pytest.raises(TypeError, match="StackConfig has no field for the schema key"):
        build(StackConfig, {"notAKey": 1}, project="p", region="r")


# A comparison of a workload's kind or accelerator kind: `w.kind == ...`, `accelerator.kind != ...`,
# `kind == "mpijob"`. Only the registry and the typed classes may make one.
KIND_COMPARISON = re.compile(r"(\.kind|accelerator_kind)\s*(==|!=|\bin\b|\bnot in\b)"
                             r"|\bkind\s*(==|!=)\s*[\"'](helm|mpijob|serve|nvidia|gaudi)[\"']")
MAY_COMPARE = {"model/workload_base.py"}  # WorkloadConfig.on_gaudi and on_nvidia: the accelerator kind, once


def test_nothing_outside_the_kinds_compares_kinds() -> None:
    found = []
    # build/ holds what targets make (make check-data's venv, with its packages' sources), none of ours.
    sources = [*PROJECT_DIR.glob("*.py"), *(p for d in PROJECT_DIR.iterdir()
                                           if d.is_dir() and not d.name.startswith(".")
                                           and d.name not in ("tests", "build") for p in d.rglob("*.py"))]
    assert PROJECT_DIR / "__main__.py" in sources and PROJECT_DIR / "checks" / "__init__.py" in sources
    for path in sorted(sources):
        rel = path.relative_to(PROJECT_DIR).as_posix()
        if rel.startswith("workloads/kinds/") or rel in MAY_COMPARE:
            continue
        found += [f"{rel}:{i}: {line.strip()}" for i, line in enumerate(path.read_text().splitlines(), 1)
                  if KIND_COMPARISON.search(line)]
    assert found == []


def test_the_kind_comparison_pattern_catches_what_it_should() -> None:
    for line in ('if w.kind == "helm":', "x = w.accelerator.kind != 'nvidia'", 'if where.accelerator_kind == "gaudi":',
                 'if kind == "mpijob":'):
        assert KIND_COMPARISON.search(line), line
    assert not KIND_COMPARISON.search('if kind == "string_value":')


@pytest.mark.parametrize(("stack", "name", "pulls", "on_gaudi", "nodes"), [
    ("dev", "smoke", True, False, (2, "2 worker(s)")),  # helm: the stack's image; its client on the system pool
    ("gaudi", "gaudi-llm-ds-ft", False, True, (1, "1 worker(s)")),  # Gaudi: the stack's Gaudi image, no grant
    ("serve", "chat", True, False, (1, "1 worker(s)")),
])
def test_what_the_typed_classes_say_about_a_workload(stack: str, name: str, pulls: bool, on_gaudi: bool,
                                                     nodes: tuple[int, str]) -> None:
    w = model(stack).workloads[name]
    assert (w.pulls_stack_image, w.on_gaudi, w.on_nvidia, w.nodes_needed()) == (pulls, on_gaudi, not on_gaudi, nodes)
