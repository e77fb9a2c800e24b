"""Pre-deploy checks for the planner (model memory vs accelerator memory): one named function per rule."""

from __future__ import annotations

from model.checks import Check

CHECKS: list[Check] = []
