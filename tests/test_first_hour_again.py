"""The first hour, again (issue 28): secrets offline, `make gpus` in the user's terms, and the small rough edges a
new user hit. Each test fails on the code before the fix; expected values come from the issue, the data files'
sources and Google's docs, never from the code under test."""

from __future__ import annotations

import pytest
from conftest import problems, stack_run

from preview import summary
from preview.sections import serving

# --- item 4: the small ones ---------------------------------------------------------------------------------------


def test_the_terminals_serving_section_has_no_stray_code_fence_line() -> None:
    """The section's Markdown fences its commands with ```sh; the terminal printed `sh` as a line of its own."""
    ((_, body),) = serving.section(stack_run("serve"))
    lines = summary.markdown_text(body).splitlines()
    assert "  sh" not in lines and "  ```" not in lines and "  ```sh" not in lines
    start = lines.index('  Send one prompt (README, "Serving a model"):')
    assert lines[start + 1:start + 3] == ["", "  kubectl -n serving port-forward svc/chat 8000:8000 &"]


@pytest.mark.parametrize(("key", "url", "path", "form"), [
    ("workloads.tune.finetune.datasetPath", "gs://my-data/data/train.jsonl", "data/train.jsonl",
     "a file or folder of the bucket such as data/train.jsonl"),
    ("workloads.tune.finetune.modelPath", "gs://my-data/models/base/", "models/base",
     "a folder of the bucket such as models/base/Qwen2.5-7B"),
    ("workloads.chat.serving.modelPath", "gs://my-data/models/tune", "models/tune",
     "a folder in the bucket such as models/Mistral-7B-Instruct-v0.3"),
])
def test_a_gs_url_as_a_bucket_path_is_told_to_drop_the_prefix(key: str, url: str, path: str, form: str) -> None:
    """Was `"gs://..." is not of the form ...`: the user had the right object in mind, in the other spelling."""
    assert problems("finetune", {key: url}) == [
        f'{key}: "{url}" is a gs:// URL; drop the gs:// prefix and the bucket\'s name: "{path}", a path in the '
        f"stack's bucket ({form})"]


def test_a_bucket_path_that_is_not_a_url_keeps_its_message() -> None:
    key = "workloads.tune.finetune.datasetPath"
    assert problems("finetune", {key: "data/x y.jsonl"}) == [
        f'{key}: "data/x y.jsonl" is not of the form a file or folder of the bucket such as data/train.jsonl']
