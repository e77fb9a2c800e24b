"""What every rule module shares: the rule type, key paths as `pulumi config set --path` spells them, and
small formatting helpers. Imports only the model, so every rule module can import it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from model.types import StackConfig, key_path

PROJECT_DIR = Path(__file__).resolve().parent.parent

# A rule: one named function that returns every problem it finds, each starting with its config key.
Check = Callable[[StackConfig], list[str]]


def at(*parts: object) -> str:
    """The key where a problem is, as `pulumi config set --path` spells it: `at("nodePools", 0, "zones", 1)` ->
    `nodePools[0].zones[1]`."""
    return key_path(list(parts))


def is_file(path: Path) -> bool:
    """Path.is_file, but a name the OS refuses (too long, ...) is simply not a file."""
    try:
        return path.is_file()
    except OSError:
        return False


def or_list(items: list) -> str:
    items = [str(i) for i in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]
