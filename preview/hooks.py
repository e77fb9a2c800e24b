"""Extension points of the offline preview: extra summary sections and extra build files.

A later feature (the planner's cost table, the Vertex CustomJob spec, ...) adds itself without editing
the preview: put a `preview_hooks.py` module in its package (e.g. `planner/preview_hooks.py`) that
registers functions with the decorators below. The preview imports every `<package>/preview_hooks.py`
of the project before it renders.

    from preview import hooks

    @hooks.section
    def cost(run):                      # RunResult -> [(title, markdown)] (empty: nothing to show)
        return [("Cost", "| pool | $/h |\\n| --- | --- |\\n| t4 | 0.35 |")]

    @hooks.artifact
    def vertex_spec(run):               # RunResult -> {relative file name: content} under build/<stack>/
        return {"vertex-customjob.yaml": "..."}

Sections appear in the terminal summary and in summary.md, after the built-in ones; files are written
beside plan.json. Secrets: hooks see the recorded inputs, where secrets are already "[secret]".
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

from preview.engine import PROJECT_DIR, RunResult

Section = tuple[str, str]  # (title, markdown body)
SectionHook = Callable[[RunResult], list[Section]]
FileHook = Callable[[RunResult], dict[str, str]]

SECTION_HOOKS: list[SectionHook] = []
FILE_HOOKS: list[FileHook] = []
MODULE_NAME = "preview_hooks"
SKIP_DIRS = {".venv", "venv", "build", "tests", ".git"}


def section(fn: SectionHook) -> SectionHook:
    if fn not in SECTION_HOOKS:
        SECTION_HOOKS.append(fn)
    return fn


def artifact(fn: FileHook) -> FileHook:
    if fn not in FILE_HOOKS:
        FILE_HOOKS.append(fn)
    return fn


def hook_modules(root: Path = PROJECT_DIR) -> list[str]:
    """`<package>.preview_hooks` for every top-level package of the project that has one."""
    return sorted(f"{p.parent.name}.{MODULE_NAME}" for p in root.glob(f"*/{MODULE_NAME}.py")
                  if p.parent.name not in SKIP_DIRS)


def load(root: Path = PROJECT_DIR) -> None:
    for name in hook_modules(root):
        importlib.import_module(name)  # registering is the import's side effect


def sections(run: RunResult, hooks: list[SectionHook] | None = None) -> list[Section]:
    return [s for hook in (SECTION_HOOKS if hooks is None else hooks) for s in (hook(run) or [])]


def files(run: RunResult, hooks: list[FileHook] | None = None) -> dict[str, str]:
    out: dict[str, str] = {}
    for hook in FILE_HOOKS if hooks is None else hooks:
        out.update(hook(run) or {})
    return out
