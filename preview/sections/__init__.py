"""The preview's extra summary sections and build files, one module per area (fabric, cost, capacity, recovery,
vertex, serving, pods). Each is a plain function of the run (`RunResult`): the recorded registrations and the
program's stack outputs, never a stack file read again, so `--stack-file` previews what it runs.

They are listed, in the order shown, in preview/__main__.py (`SECTIONS`, `FILES`): a new one is added there.

    def section(run: RunResult) -> list[Section]:      # [(title, markdown)]; [] when there is nothing to show
    def files(run: RunResult) -> dict[str, str]:       # {path under build/<stack>/: content}

Secrets: they see the recorded inputs and outputs, where secrets are already "[secret]".
"""

from __future__ import annotations

from collections.abc import Callable

from preview.engine import RunResult

Section = tuple[str, str]  # (title, markdown body)
SectionFn = Callable[[RunResult], list[Section]]
FilesFn = Callable[[RunResult], dict[str, str]]


def render_sections(run: RunResult, fns: tuple[SectionFn, ...] | list[SectionFn]) -> list[Section]:
    return [s for fn in fns for s in (fn(run) or [])]


def render_files(run: RunResult, fns: tuple[FilesFn, ...] | list[FilesFn]) -> dict[str, str]:
    out: dict[str, str] = {}
    for fn in fns:
        out.update(fn(run) or {})
    return out
