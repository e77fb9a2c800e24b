"""Pre-deploy checks for workloads (Helm release, MPIJob, ds_config, cluster target), one function per rule."""

from __future__ import annotations

from model.checks import Check

CHECKS: list[Check] = []
