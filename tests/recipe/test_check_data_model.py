"""`make check-data ... MODEL=<folder>` renders the records with the model's tokenizer, in make e2e's venv, on make
e2e's tiny Llama (random weights, a tokenizer trained on the records: nothing downloaded), issue 40 item 3.
`make test-recipe` runs it; without that venv it skips, saying why.

The expected text is written out from the tiny tokenizer's template (ChatML turns after a BOS, EOS <|im_end|>),
not taken from the code under test."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.recipe
ROOT = Path(__file__).resolve().parents[2]
VENV_PYTHON = Path(os.environ.get("E2E_VENV", "/opt/ds-e2e-venv")) / "bin" / "python"
GOOD = [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]},
        {"messages": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}]}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the data file, the tiny model's folder)."""
    if not VENV_PYTHON.is_file():
        pytest.skip(f"{VENV_PYTHON} is missing: e2e/install.sh installs it (make e2e, as root)")
    work = tmp_path_factory.mktemp("check-data")
    data = work / "good.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in GOOD), encoding="utf-8")
    subprocess.run([str(VENV_PYTHON), str(ROOT / "e2e" / "tiny_llm.py"), "make", str(data), str(work / "tiny")],
                   check=True, capture_output=True, timeout=300)
    return data, work / "tiny"


def check_data(*variables: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "--no-print-directory", "check-data", *variables], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False)


def test_a_good_file_prints_the_first_record_as_trained(tiny: tuple[Path, Path]) -> None:
    data, model = tiny
    result = check_data(f"DATA={data}", f"MODEL={model}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "data check, DATA: 2 records read: messages (messages (role/content)); the model's own chat template" in \
        result.stdout
    assert "none is longer than 2048 tokens (SEQ)" in result.stdout
    learned = "<s><|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n[[Hello!<|im_end|>\\n]]"
    assert f"record 1 as trained ([[learned]]): '{learned}'" in result.stdout


def test_a_bad_file_names_both_lines_and_exits_2(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    _, model = tiny
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(GOOD[0]) + "\n{not json\n" + json.dumps({"messages": [{"role": "user", "content": "?"}]})
                   + "\n", encoding="utf-8")
    result = check_data(f"DATA={bad}", f"MODEL={model}")
    assert result.returncode == 2
    assert f"DATA: {bad} line 2 is not JSON" in result.stdout
    assert "DATA: record 3 (line 3): 'messages' has no assistant turn, so nothing to learn" in result.stdout


def test_a_model_not_in_the_cache_is_never_downloaded(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    data, _ = tiny
    result = subprocess.run(["make", "--no-print-directory", "check-data", f"DATA={data}",
                             "MODEL=deepspeed-stack-tests/no-such-model"], cwd=ROOT, capture_output=True, text=True,
                            timeout=300, check=False, env={**os.environ, "HF_HOME": str(tmp_path / "empty-cache")})
    assert result.returncode == 2
    assert ("MODEL: deepspeed-stack-tests/no-such-model is neither a local folder nor in this machine's Hugging Face "
            "cache, and nothing is downloaded here (HF_HUB_OFFLINE=1)") in result.stdout
