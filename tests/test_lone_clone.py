"""A user's clone has no ../shared (issue 40 item 1): no test module reaches outside the repository except through
conftest's reference() and seed(), which skip when the folder is absent. `make test-lone-clone` (CI) runs the whole
suite in such a copy; this test names the module that would break it, before anyone clones."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import PROJECT_DIR, SHARED_DIR

TESTS = PROJECT_DIR / "tests"
NAME = SHARED_DIR.name  # conftest names the folder; this module only looks for it
UP = f"../{NAME}"
# conftest names the folder and holds its readers; everything else goes through them.
READERS = {"conftest.py"}


def outside_reads(source: str) -> list[str]:
    """Code that builds a path to the folder beside the checkout (a division by its name, a literal starting with
    `../` and its name) or climbs above the repository (`.parent.parent.parent`); a volume of that name or a
    message is not one."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant)
                and node.right.value == NAME):
            found.append(f"line {node.lineno}: / {NAME!r}")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(UP):
            found.append(f"line {node.lineno}: {node.value!r}")
        if (isinstance(node, ast.Attribute) and node.attr == "parent" and isinstance(node.value, ast.Attribute)
                and node.value.attr == "parent" and isinstance(node.value.value, ast.Attribute)
                and node.value.value.attr == "parent"):
            found.append(f"line {node.lineno}: .parent.parent.parent")
    return found


def test_no_test_module_reads_outside_the_repository() -> None:
    offenders = {}
    for path in sorted(TESTS.rglob("*.py")):
        if path.name not in READERS and (hits := outside_reads(path.read_text(encoding="utf-8"))):
            offenders[str(path.relative_to(PROJECT_DIR))] = hits
    assert offenders == {}, "read ../shared through conftest.reference() or conftest.seed(), which skip without it"


def test_the_rule_finds_a_direct_read() -> None:
    # What tests/test_fabric_gate.py did before issue 40: a FileNotFoundError in every user's clone.
    bad = (f'SHARED = Path(__file__).resolve().parent.parent.parent / "{NAME}" / "reference"\n'
           'text = (SHARED / "x.yaml").read_text()\n')
    assert sorted(outside_reads(bad)) == ["line 1: .parent.parent.parent", f"line 1: / {NAME!r}"]
    assert outside_reads(f'open("{UP}/reference/x.yaml")\n') == [f"line 1: '{UP}/reference/x.yaml'"]
    # A volume named shared, a message about ../shared, a read through the helper: none is a read from outside.
    assert outside_reads(f'mounts["{NAME}"]\nprint("no {UP} here")\ntext = seed("004.txt")\n') == []


def test_the_copy_has_nothing_beside_it(tmp_path: Path) -> None:
    import user_stacks

    (tmp_path / NAME).mkdir()  # a folder beside the temporary parent is not the copy's
    copy = tmp_path / "inner" / "project"
    copy.parent.mkdir()
    user_stacks.user_copy(copy, lone=True)
    assert (copy / "Pulumi.yaml").is_file() and not (copy.parent / NAME).exists()
