"""A content-addressed cache for what every run of the program would otherwise recompute from the same inputs
(parsed YAML, a schema's verdict on a config), under build/.cache/<kind>/ as marshal files.

A key is the SHA-256 of everything the value depends on, so an entry can never answer for other inputs: it is
never stale, only unused (`make clean` empties it). Missing, damaged or unwritable, the caller computes the value
as it would without a cache; the values are plain data (marshal holds no objects of the program's classes).
"""

from __future__ import annotations

import hashlib
import marshal
import os
from pathlib import Path
from typing import Any

CACHE_DIR = Path(__file__).resolve().parent.parent / "build" / ".cache"
MISS = object()


def key(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "little"))  # lengths: ("ab", "c") and ("a", "bc") differ
        digest.update(part)
    return digest.hexdigest()


def get(kind: str, name: str) -> Any:
    """The value stored under `name`, or MISS."""
    try:
        return marshal.loads((CACHE_DIR / kind / name).read_bytes())
    except (OSError, EOFError, ValueError, TypeError):
        return MISS


def put(kind: str, name: str, value: Any) -> None:
    try:
        blob = marshal.dumps(value)
    except ValueError:  # a type marshal cannot hold (e.g. a YAML timestamp): not cached
        return
    folder = CACHE_DIR / kind
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f"{name}.{os.getpid()}.tmp"
        tmp.write_bytes(blob)
        os.replace(tmp, folder / name)  # whole or not at all, whoever writes the same entry at the same time
    except OSError:
        pass
