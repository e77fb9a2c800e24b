"""Dependencies run one way: a module never imports from a layer above it, and no modules import each other
(directly or round a longer circle). Read from the source with `ast`, so a new module is covered when added."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Lowest first. A package may import its own modules and any package of a lower rank, nothing else.
RANK = {"model": 0, "policy": 0, "planner": 1, "workloads": 1, "components": 2, "checks": 3, "preview": 4}
# An area's `preview_hooks.py` plugs that area into the offline preview: it belongs to the preview layer.
PREVIEW_PLUGIN = "preview_hooks"


def _modules() -> dict[str, Path]:
    found = {}
    for package in RANK:
        for path in sorted((ROOT / package).glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            found[name] = path
    return found


def _imports(path: Path, known: set[str]) -> set[str]:
    """First-party modules `path` imports, resolved to the module (not the package) where one exists."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                out.add(name)
    return out


def _layer(module: str) -> str:
    return "preview" if module.rsplit(".", 1)[-1] == PREVIEW_PLUGIN else module.split(".")[0]


def _rank(module: str) -> int:
    return RANK[_layer(module)]


MODULES = _modules()
GRAPH = {m: _imports(p, set(MODULES)) - {m} for m, p in MODULES.items()}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_only_from_lower_layers_or_its_own_package(module):
    upward = sorted(i for i in GRAPH[module]
                    if i.split(".")[0] not in {_layer(module), module.split(".")[0]} and _rank(i) >= _rank(module))
    assert upward == [], f"{module} (layer {_rank(module)}) imports from its layer or above: {upward}"


def test_no_import_cycles():
    cycles, state = [], {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = "open"
        for dep in sorted(GRAPH[m]):
            if state.get(dep) == "open":
                cycles.append([*stack[stack.index(dep):], dep])
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[m] = "done"

    for m in sorted(GRAPH):
        if m not in state:
            visit(m, [m])
    assert cycles == []


def test_the_rules_are_above_what_they_check():
    # The regression this pins (issue: model/checks_*.py imported planner and workloads, and each other).
    assert not any(p.stem.startswith("checks") for p in (ROOT / "model").glob("*.py"))
    used_by_rules = set().union(*(GRAPH[m] for m in MODULES if m.startswith("checks")))
    assert {"planner.sizing", "workloads.placement"} <= used_by_rules


def test_a_module_that_imports_upward_is_caught(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from checks import load\nimport planner.sizing\n")
    assert _imports(bad, set(MODULES)) == {"checks", "planner.sizing"}
    assert _rank("checks") > _rank("model.types")
