"""What every rule module shares: the rule type, and (from model/validators.py, where the workload kinds' own
rules reach them too) key paths as `pulumi config set --path` spells them and small formatting helpers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from model.problems import Problem
from model.types import StackConfig
from model.validators import at, is_file, or_list

PROJECT_DIR = Path(__file__).resolve().parent.parent

# A rule: one named function that returns every problem it finds, each on its config key.
Check = Callable[[StackConfig], list[Problem]]

__all__ = ["PROJECT_DIR", "Check", "Problem", "at", "is_file", "or_list"]
