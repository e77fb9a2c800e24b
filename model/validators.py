"""Small helpers every rule shares, in the lowest layer so that rules anywhere (checks/, and each workload kind's
own rules in workloads/kinds/) can use them: key paths as `pulumi config set --path` spells them, the names
Kubernetes accepts, and list formatting."""

from __future__ import annotations

import re
from pathlib import Path

from model.types import key_path

# DNS-1123 label: what Kubernetes accepts for namespace, Service and pod-name parts.
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_MAX = 63
# DNS-1123 subdomain: what Kubernetes accepts for PersistentVolumeClaim and StorageClass names.
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1123_SUBDOMAIN_MAX = 253


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
