"""`make check-data DATA=file.jsonl [MODEL=...] [FORMAT=...]`: the recipe's own data check (finetune.py --check-data,
the launcher's) on a laptop, every record read (issue 40 item 3).

Without MODEL it runs on any python3 (the check is the standard library): formats and fields, each malformed record
by its number and line, exit 2. With MODEL it needs transformers (make e2e's venv or build/check-data-venv); that
path runs in tests/recipe/test_check_data_model.py on make e2e's tiny Llama. Nothing here installs or downloads
anything.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PROJECT_DIR, yaml_load

SCRIPT = PROJECT_DIR / "recipes" / "finetune.py"


def turn(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


GOOD = [{"messages": [turn("user", "Hi"), turn("assistant", "Hello!")]},
        {"messages": [turn("user", "What is 2+2?"), turn("assistant", "4")]}]
NO_ANSWER = {"messages": [turn("user", "No answer here")]}


def messages_file(tmp_path: Path, broken: bool) -> Path:
    """Lines 1-2 good; with `broken`, line 3 not JSON and line 4 a conversation with no assistant turn; then a good
    one."""
    lines = [json.dumps(r) for r in GOOD]
    if broken:
        lines += ['{"messages": [{"role": "user", "content": "cut off', json.dumps(NO_ANSWER)]
    lines.append(json.dumps({"messages": [turn("user", "Bye"), turn("assistant", "Goodbye.")]}))
    path = tmp_path / ("bad.jsonl" if broken else "good.jsonl")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def make_check_data(*variables: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    return subprocess.run(["make", "--no-print-directory", "check-data", *variables], cwd=PROJECT_DIR,
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "PYTHON": sys.executable})


def test_a_broken_line_and_a_record_with_no_answer_are_both_named(tmp_path: Path) -> None:
    data = messages_file(tmp_path, broken=True)
    result = make_check_data(f"DATA={data}")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert (f"FAILED: 2 of the 5 records cannot be trained on:\n"
            # column 43: the quote that opens "cut off, counted by hand
            f"  DATA: {data} line 3 is not JSON (Unterminated string starting at, column 43)\n"
            "  DATA: record 4 (line 4): 'messages' has no assistant turn, so nothing to learn\n") in result.stdout


def test_a_good_file_without_a_model_gets_its_format_and_fields(tmp_path: Path) -> None:
    result = make_check_data(f"DATA={messages_file(tmp_path, broken=False)}", "FORMAT=messages")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no --model: the records' formats and fields are checked, not rendered" in result.stdout
    assert "data check, DATA: 3 records read: messages, well formed (not rendered)" in result.stdout


def test_a_format_that_is_not_the_datas_names_the_variable(tmp_path: Path) -> None:
    result = make_check_data(f"DATA={messages_file(tmp_path, broken=False)}", "FORMAT=alpaca")
    assert result.returncode == 2
    assert "FORMAT" in result.stdout and "record 1 (line 1)" in result.stdout


def test_no_data_is_a_usage_error() -> None:
    result = make_check_data()
    assert result.returncode == 2
    assert "error: give the file: make check-data DATA=train.jsonl" in result.stderr


def test_a_model_without_transformers_checks_the_fields_and_never_tracebacks(tmp_path: Path) -> None:
    """finetune.py --check-data --model M run with a python that lacks transformers (the issue: a clean line, then
    ModuleNotFoundError's traceback): said, and the fields checked."""
    try:
        import transformers  # noqa: F401
        pytest.skip("this python has transformers")
    except ModuleNotFoundError:
        pass
    data = messages_file(tmp_path, broken=True)
    result = subprocess.run([sys.executable, str(SCRIPT), "--check-data", "--dataset", str(data), "--model",
                             str(tmp_path / "model")], capture_output=True, text=True, timeout=60, check=False)
    assert "Traceback" not in result.stdout + result.stderr
    assert "transformers is not installed in this python: the records' fields are checked without rendering" in \
        result.stdout
    assert result.returncode == 2 and "record 4 (line 4)" in result.stdout


def test_the_launcher_reads_the_first_200_and_names_five(tmp_path: Path) -> None:
    """The launcher's check is unchanged in size: the first 200 records, 5 problems named, the rest counted."""
    data = tmp_path / "many.jsonl"
    data.write_text("".join(json.dumps(NO_ANSWER) + "\n" for _ in range(250)), encoding="utf-8")
    result = subprocess.run([sys.executable, str(SCRIPT), "--check-data", "--dataset", str(data)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert "FAILED: 200 of the first 200 records cannot be trained on:" in result.stdout
    assert "(and 195 more)" in result.stdout


def test_the_default_sequence_length_is_the_stacks() -> None:
    from model.config_schema import schema

    assert schema()["$defs"]["finetuneRun"]["properties"]["sequenceLength"]["default"] == 2048
    assert "\nSEQ_DEFAULT := 2048\n" in (PROJECT_DIR / "Makefile").read_text(encoding="utf-8")


def test_the_check_venv_pins_data_versions_transformers() -> None:
    pins = dict(line.split("==") for line in (PROJECT_DIR / "requirements-data-check.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    versions = yaml_load((PROJECT_DIR / "data" / "versions.yaml").read_text(encoding="utf-8"))["python"]
    assert pins["transformers"] == versions["transformers"]
    assert "torch" not in pins  # a tokenizer needs none


def test_with_a_model_it_runs_offline_with_the_whole_file() -> None:
    """make -n: the model's check never downloads (HF_HUB_OFFLINE=1), reads every record (--check-records 0), in
    make e2e's venv when it is there, else in the check's own venv (installed first)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    result = subprocess.run(["make", "-n", "check-data", "DATA=d.jsonl", "MODEL=./tiny", "FORMAT=messages"],
                            cwd=PROJECT_DIR, capture_output=True, text=True, timeout=60, check=True)
    commands = " ".join(result.stdout.replace("\\\n", " ").split())
    assert "HF_HUB_OFFLINE=1" in commands
    assert ('finetune.py --check-data --check-records 0 --dataset "d.jsonl" --model "./tiny" --records "messages" '
            '--seq-len "2048"' in commands)
    e2e = Path("/opt/ds-e2e-venv/bin/python")
    assert (str(e2e) if e2e.exists() else "build/check-data-venv/bin/python") in commands
    if not e2e.exists():
        assert "uv pip install --quiet --python build/check-data-venv/bin/python -r requirements-data-check.txt" in \
            commands
