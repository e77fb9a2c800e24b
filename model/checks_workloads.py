"""Pre-deploy checks for workloads (Helm release, MPIJob, DeepSpeed config, cluster target): one named function per rule."""

from __future__ import annotations

from model.checks import Check

CHECKS: list[Check] = []
