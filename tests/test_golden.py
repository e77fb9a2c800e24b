"""The preview of every example stack is what tests/golden/ holds (issue 41: a refactor changes no behaviour).

A refactor leaves the golden files byte-identical. A change that means to change the preview rewrites them with
`make golden` and says in its commit what changed and why (docs/preview.md, Golden previews)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import golden_previews
import pytest
from conftest import examples, stack_run

HINT = ("\n\nThe preview of this example differs from tests/golden/ (above: golden -> now). A refactor must not change "
        "it; a change that means to runs `make golden` and says why in its commit.")


@pytest.mark.parametrize("stack", examples())
def test_the_preview_of_each_example_is_its_golden_copy(stack: str) -> None:
    found = golden_previews.differences(golden_previews.render(stack_run(stack)))
    assert not found, "\n\n".join(found) + HINT


def test_every_golden_file_belongs_to_an_example() -> None:
    assert golden_previews.examples() == examples()
    assert golden_previews.stray() == []
    names = sorted(p.name for p in golden_previews.GOLDEN_DIR.iterdir())
    assert names == sorted(f"{s}{suffix}" for s in examples() for suffix in golden_previews.SUFFIXES)


def _files(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    return tmp_path


def test_a_changed_line_is_shown_as_a_diff_naming_the_file(tmp_path: Path) -> None:
    golden = _files(tmp_path, {"dev.preview.txt": "a\nb\nc\n", "dev.summary.md": "same\n"})
    found = golden_previews.differences({"dev.preview.txt": "a\nB\nc\n", "dev.summary.md": "same\n"}, golden)
    assert found == ["--- golden/dev.preview.txt\n+++ now\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c"]
    # A file the folder lacks is all added lines; a long diff is cut, saying how much more there is.
    (missing,) = golden_previews.differences({"new.preview.txt": "x\n"}, golden)
    assert missing.splitlines()[-1] == "+x"
    (long,) = golden_previews.differences({"dev.summary.md": "".join(f"{i}\n" for i in range(100))}, golden)
    assert long.splitlines()[-1] == f"... {104 - golden_previews.DIFF_LINES} more diff lines"


def test_a_golden_file_of_no_example_is_stray(tmp_path: Path) -> None:
    golden = _files(tmp_path, {"dev.preview.txt": "", "staging.preview.txt": "", "README.md": ""})
    assert "staging.preview.txt" in golden_previews.stray(golden)
    assert "README.md" not in golden_previews.stray(golden)


class _Reg:
    """The fields of preview.engine.Registration the resources file reads."""

    def __init__(self, **fields: Any) -> None:
        defaults = {"parent": None, "provider": None, "dependencies": [], "protect": False, "ignore_changes": [],
                    "delete_before_replace": False, "retain_on_delete": False, "custom_timeouts": {},
                    "transforms": [], "secret_paths": [], "custom": True}
        self.__dict__.update({**defaults, **fields})


class _Run:
    def __init__(self, resources: list[_Reg]) -> None:
        self.stack, self.outputs, self.warnings, self.resources = "t", {"b": 1, "a": "[secret]"}, [], resources


def test_resources_are_sorted_by_type_and_name_with_keys_sorted_and_a_carried_file_shown_by_its_digest() -> None:
    script = (golden_previews.PROJECT_DIR / "recipes" / "stop_ranks.py").read_text(encoding="utf-8")
    parent = "urn:pulumi:t::deepspeed-stack::deepspeed-stack:workloads:TrainingJob::job"
    regs = [_Reg(urn=f"{parent[:-5]}$kubernetes:core/v1:ConfigMap::job-config", type="kubernetes:core/v1:ConfigMap",
                 name="job-config", parent=parent, protect=True, secret_paths=["data.token"],
                 inputs={"data": {"stop_ranks.py": script, "token": "[secret]", "run.sh": "set -e\nexit 0\n"}}),
            _Reg(urn=parent, type="deepspeed-stack:workloads:TrainingJob", name="job", custom=False, inputs={})]
    text = golden_previews.resources_yaml(_Run(regs))
    lines = len(script.splitlines())
    digest = golden_previews._digest(script)[:16]
    assert text.index("urn: urn:pulumi:t::deepspeed-stack::deepspeed-stack:workloads:TrainingJob::job\n") < \
        text.index("ConfigMap::job-config")  # by type and name, not registration order
    assert f"stop_ranks.py: '<file: {lines} lines, sha256 {digest}>'" in text
    assert "      run.sh: |\n        set -e\n        exit 0\n" in text  # a stack-built script reads as it is
    assert "parent: deepspeed-stack:workloads:TrainingJob::job\n" in text
    assert "  protect: true\n" in text and "  secretPaths:\n  - data.token\n" in text
    assert "retainOnDelete" not in text  # options at their defaults are left out
    assert text.index("  a: '[secret]'") < text.index("  b: 1")
