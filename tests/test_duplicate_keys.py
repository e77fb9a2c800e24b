"""A key given twice in a stack file is an error naming the key and both lines (issue 19.15): PyYAML keeps the
last value silently, the Pulumi CLI (Go yaml.v3) refuses the file ("mapping key ... already defined")."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from model.yamlio import DuplicateKeyError, loads_yaml
from preview import __main__ as preview_cli
from preview import stackfile

STACK = """\
config:
  gcp:project: my-gcp-project
  gcp:region: us-west1
  deepspeed-stack:nodePools:
    - name: t4
      machineType: n1-standard-8
      minNodes: 0
      maxNodes: 2
      minNodes: 1
"""


def test_a_duplicate_key_names_the_key_and_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "Pulumi.dup.yaml"
    path.write_text(STACK, encoding="utf-8")
    with pytest.raises(stackfile.StackFileError) as err:
        stackfile.read(path)
    assert str(err.value).startswith(f"{path}:")
    assert "duplicate key `minNodes` at line 9 (first given at line 7); keep one of the two" in str(err.value)


def test_the_preview_refuses_it_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "Pulumi.dup.yaml"
    path.write_text(STACK.replace("  gcp:region: us-west1\n", "  gcp:region: us-west1\n  gcp:region: us-east1\n"),
                    encoding="utf-8")
    code = preview_cli.main(["--stack", "dup", "--stack-file", str(path), "--out", str(tmp_path / "b")])
    err = capsys.readouterr().err
    assert code == preview_cli.EXIT_CONFIG
    assert "duplicate key `gcp:region` at line 4 (first given at line 3)" in err and "Traceback" not in err


@pytest.mark.parametrize("text", [
    "a: 1\nb: 2\n",
    "a: {x: 1}\nb: {x: 1}\n",  # the same key in two different mappings
    "base: &b {x: 1, y: 2}\nderived:\n  <<: *b\n  x: 3\n",  # a merge key's value may be overridden
])
def test_distinct_keys_and_merges_load(text: str) -> None:
    assert loads_yaml(text) == yaml.safe_load(text)


def test_top_level_and_flow_duplicates() -> None:
    with pytest.raises(DuplicateKeyError) as err:
        loads_yaml("config: {}\nconfig: {}\n")
    assert (err.value.key, err.value.first_line, err.value.line) == ("config", 1, 2)
    with pytest.raises(DuplicateKeyError):
        loads_yaml("pool: {min: 1, min: 2}\n")
