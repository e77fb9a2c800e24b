"""The README for users and the docs/ pages it links (issue 28 item 1): short, with contents, no broken link.

Links are checked the way GitHub renders them: a relative link names a file of the repository, and a `#anchor`
names a heading of that file (lower case, punctuation dropped, spaces as hyphens).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import PROJECT_DIR

PAGES = [PROJECT_DIR / "README.md", *sorted((PROJECT_DIR / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
README_MAX_LINES = 450
PROSE_MAX = 120


def _outside_code(text: str) -> list[str]:
    lines, fence = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence:
            lines.append(line)
    return lines


def anchor(title: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {anchor(m.group(1)) for line in _outside_code(page.read_text(encoding="utf-8"))
            if (m := re.match(r"^#{1,6} (.+)$", line))}


def broken_links(page: Path) -> list[str]:
    broken = []
    for line in _outside_code(page.read_text(encoding="utf-8")):
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target):  # https:, mailto:
                continue
            path, _, fragment = target.partition("#")
            where = (page.parent / path).resolve() if path else page
            if not where.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif fragment and where.suffix == ".md" and fragment not in anchors(where):
                broken.append(f"{page.name}: {target} (no such heading)")
    return broken


def test_the_anchor_rule_matches_githubs() -> None:
    assert anchor("Training at scale: GPU fabrics on A3 and A4") == "training-at-scale-gpu-fabrics-on-a3-and-a4"
    assert anchor("End-to-end launch test (`make e2e`)") == "end-to-end-launch-test-make-e2e"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[ok](#title) [gone](#nothing) [file](missing.md)\n", encoding="utf-8")
    assert broken_links(page) == ["page.md: #nothing (no such heading)", "page.md: missing.md (no such file)"]


def test_the_readme_is_short_and_has_contents() -> None:
    readme = (PROJECT_DIR / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= README_MAX_LINES
    assert "Contents:" in readme.split("\n## ", 1)[0]  # before the first section
    for journey in ("Preview a stack", "Fine-tune and serve your own model", "Training at scale",
                    "Deploying for real"):
        assert f"\n## {journey}" in readme


def test_every_docs_page_has_contents_and_is_linked_from_the_readme() -> None:
    readme = (PROJECT_DIR / "README.md").read_text(encoding="utf-8")
    for page in PAGES[1:]:
        assert f"(docs/{page.name})" in readme, f"docs/{page.name} is not linked from the README"
        text = page.read_text(encoding="utf-8")
        if text.count("\n## ") >= 3:
            assert "Contents" in text.split("\n## ", 1)[0], f"docs/{page.name} has no contents list"


def test_readme_prose_lines_fit_120_characters() -> None:
    long = [line for line in _outside_code((PROJECT_DIR / "README.md").read_text(encoding="utf-8"))
            if len(line) > PROSE_MAX and not line.startswith("|")]
    assert long == []
