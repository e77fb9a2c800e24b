"""The import contracts (pyproject.toml, [tool.importlinter]; `make test` runs `lint-imports`) are complete, hold
no exemption, and fail on a back-import: checked on a copy of the packages with deliberate breaks, so a contract
that silently stopped matching (a renamed package, a typo in a layer) fails here."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    binary = Path(sys.executable).with_name("lint-imports")
    command = [str(binary)] if binary.exists() else [sys.executable, "-c",
                                                     "from importlinter.cli import lint_imports_command as c; c()"]
    # A fresh process with only the copy on its path: grimp finds packages by import name.
    return subprocess.run([*command, "--no-cache", "--no-logo"], cwd=cwd, capture_output=True, text=True,
                          env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"}, timeout=60, check=False)


def test_every_package_of_the_project_is_under_contract() -> None:
    packages = sorted(p.parent.name for p in ROOT.glob("*/__init__.py"))
    assert sorted(CONFIG["root_packages"]) == packages
    layered = {name.strip() for layer in CONFIG["contracts"][0]["layers"] for name in layer.split("|")}
    assert layered == set(packages)
    assert {c["type"] for c in CONFIG["contracts"]} == {"layers", "acyclic_siblings", "forbidden"}
    assert all("ignore_imports" not in c for c in CONFIG["contracts"])  # no exemptions


def test_the_rules_are_above_what_they_check() -> None:
    # The regression this pins (issue: model/checks_*.py imported planner and workloads, and each other).
    assert not any(p.stem.startswith("checks") for p in (ROOT / "model").glob("*.py"))
    graph = grimp.build_graph("checks", "planner", "workloads", cache_dir=None)
    used_by_rules = {m for c in graph.find_descendants("checks") for m in graph.find_modules_directly_imported_by(c)}
    assert {"planner.sizing", "workloads.placement"} <= used_by_rules


def test_a_back_import_a_sibling_import_and_a_cycle_break_the_contracts(tmp_path: Path) -> None:
    for package in CONFIG["root_packages"]:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    # (The untouched tree keeping them is `make test`'s `lint-imports`.)
    (tmp_path / "model" / "back.py").write_text("from preview import engine\n")  # model -> preview: upward
    (tmp_path / "planner" / "sibling.py").write_text("import workloads.placement\n")  # independent siblings
    (tmp_path / "workloads" / "ring_a.py").write_text("from workloads import ring_b\n")
    (tmp_path / "workloads" / "ring_b.py").write_text("from workloads import ring_a\n")
    (tmp_path / "recipes" / "back.py").write_text("from model import types\n")  # a program importing the stack
    floor = tmp_path / "workloads" / "pull_secret.py"  # the bottom floor of workloads/ importing its top one
    floor.write_text(floor.read_text(encoding="utf-8") + "\nimport workloads.serving  # noqa\n", encoding="utf-8")
    result = _lint_imports(tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "Contracts: 0 kept, 4 broken." in out
    assert "workloads.pull_secret -> workloads.serving" in out
    assert "model.back -> preview.engine" in out
    assert "planner.sibling -> workloads.placement" in out
    assert "recipes.back -> model.types" in out
    assert "No cycles are allowed in workloads.\n" in out and "- .ring_b -> .ring_a (1 import)" in out
