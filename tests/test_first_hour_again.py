"""The first hour, again (issue 28): secrets offline, `make gpus` in the user's terms, and the small rough edges a
new user hit. Each test fails on the code before the fix; expected values come from the issue, the data files'
sources and Google's docs, never from the code under test."""

from __future__ import annotations

from conftest import stack_run

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
