"""evaluate.py's copies of the exports it scores: each in its own versioned folder (NAME-STEP-TIME), the marker
copied last; served.json naming the one served; the older copies removed after a switch. Standard library only."""

from __future__ import annotations

import datetime
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from recipes.contract import MARKER, SERVED  # noqa: F401 (SERVED: this module's name for its readers too)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None


def read_marker(folder: Path) -> dict[str, Any] | None:
    return read_json(folder / MARKER)


def copy_adapter(candidate: Path, target: Path) -> None:
    """The candidate's files into `target` (a fresh folder), its marker last: a server restarting from the copy
    sees a whole adapter or none."""
    staging = target.with_name(target.name + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(candidate, staging, ignore=shutil.ignore_patterns(MARKER))
    if (candidate / MARKER).is_file():
        shutil.copy2(candidate / MARKER, staging / MARKER)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)


def version_name(adapter: str, marker: Mapping[str, Any] | None, now: datetime.datetime) -> str:
    """NAME-STEP-TIME: the export's step and the time its marker says it finished (else now), so that every export
    has its own path."""
    step = (marker or {}).get("step", 0)
    finished = str((marker or {}).get("finished") or now.isoformat(timespec="seconds"))
    stamp = "".join(c for c in finished.split("+")[0] if c.isalnum())
    return f"{adapter}-{step}-{stamp}"


def write_served(path: Path, adapter: str, copy: Path, marker: Mapping[str, Any] | None) -> None:
    """EVALS_DIR/served.json, replaced whole (a reader sees the old one or the new one)."""
    staging = path.with_name(path.name + ".new")
    staging.write_text(json.dumps({"adapter": adapter, "path": str(copy), "marker": dict(marker or {})}, indent=2,
                                  sort_keys=True) + "\n", encoding="utf-8")
    os.replace(staging, path)


def remove_other_versions(versions: Path, keep: Path) -> list[str]:
    """The copies that are not served any more (after the switch), removed; their names."""
    gone = sorted(p.name for p in versions.iterdir() if p.is_dir() and p != keep) if versions.is_dir() else []
    for name in gone:
        shutil.rmtree(versions / name, ignore_errors=True)
    return gone
