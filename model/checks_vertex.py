"""Pre-deploy checks for storage and Vertex AI: one named function per rule."""

from __future__ import annotations

from model.checks import Check

CHECKS: list[Check] = []
