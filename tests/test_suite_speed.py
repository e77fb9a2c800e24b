"""How `make test` stays fast (docs/measurements.md): ruff and lint-imports run beside pytest and still fail the
target, and each xdist worker rewrites the asserts of its own share of the test modules (conftest)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import PROJECT_DIR, _share

TOOLS = ("python", "ruff", "lint-imports")


def _make_test(tmp_path: Path, failing: str | None) -> tuple[int, list[str], str]:
    """`make test` with each tool replaced by a script that logs its arguments and exits 1 if it is `failing`."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    for tool in TOOLS:
        script = bin_dir / tool
        script.write_text(f'#!/bin/sh\necho "{tool} $*" >> "{log}"\nexit {1 if tool == failing else 0}\n',
                          encoding="utf-8")
        script.chmod(0o755)
    # STAMP= and TEST_STAMP=: no install (a copy of the project has no .venv of its own).
    result = subprocess.run(["make", "-s", "--no-print-directory", "-C", str(PROJECT_DIR), "test", "STAMP=",
                             "TEST_STAMP=", f"BIN={bin_dir}", f"LINT_LOGS={tmp_path / 'logs'}"],
                            capture_output=True, text=True, check=False, timeout=60, env={**os.environ})
    calls = sorted(log.read_text(encoding="utf-8").splitlines()) if log.exists() else []
    return result.returncode, calls, result.stdout


def test_make_test_runs_pytest_ruff_and_the_contracts_then_the_examples_note(tmp_path: Path) -> None:
    code, calls, out = _make_test(tmp_path, None)
    assert code == 0
    assert calls == ["lint-imports --no-cache --no-logo", "python -m pytest -n 2 --dist load",
                     "python tests/user_stacks.py --examples-check --note", "ruff check ."]
    # The lint tools' output follows the tests', each under its command.
    assert out.index("-m pytest -n 2") < out.index("/ruff check .") < out.index("/lint-imports --no-cache")


@pytest.mark.parametrize("failing", TOOLS)
def test_make_test_fails_when_any_of_the_three_fails(tmp_path: Path, failing: str) -> None:
    code, calls, _ = _make_test(tmp_path, failing)
    assert code == 2  # GNU make's status for a failed recipe
    # All three ran (beside each other); the examples' note is only for a passing run.
    assert calls == ["lint-imports --no-cache --no-logo", "python -m pytest -n 2 --dist load", "ruff check ."]


def test_each_test_module_is_rewritten_by_one_worker_and_the_shares_weigh_alike(tmp_path: Path) -> None:
    sizes = {"a": 900, "b": 500, "c": 400, "d": 300, "e": 100, "f": 100}
    modules = []
    for name, size in sizes.items():
        (tmp_path / f"test_{name}.py").write_text("#" * size, encoding="utf-8")
        modules.append(tmp_path / f"test_{name}.py")
    shares = [_share(modules, index, 2) for index in range(2)]
    # Largest first, each to the lighter worker (the first on a tie): a -> 0 (900 | 0), b -> 1 (900 | 500),
    # c -> 1 (900 | 900), d -> 0 (1200 | 900), e -> 1 (1200 | 1000), f -> 1 (1200 | 1100).
    assert [[p.stem for p in share] for share in shares] == [["test_a", "test_d"],
                                                             ["test_b", "test_c", "test_e", "test_f"]]
    assert _share(modules, 0, 1) == sorted(modules)
