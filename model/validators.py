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
# Namespaces every cluster already has (kube-system, kube-public, kube-node-lease, default): a workload's namespace
# is one the stack creates and, on `destroy`, deletes, so it must not be one of these.
RESERVED_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
# Cloud Storage bucket names (cloud.google.com/storage/docs/buckets#naming): lowercase letters, digits, - _ .;
# start and end with a letter or digit; 3-63 characters, or up to 222 with dots, each dot-separated part at most
# 63; not an IP address in dotted-decimal; not starting with "goog"; not containing "google" or a close misspelling.
BUCKET_PART = re.compile(r"^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$")
DOTTED_DECIMAL = re.compile(r"^[0-9]{1,3}(\.[0-9]{1,3}){3}$")
GOOGLE_LOOKALIKES = ("google", "g00gle", "go0gle", "g0ogle")


def bucket_name_problem(name: str) -> str | None:
    """Why Cloud Storage would refuse this bucket name, or None."""
    limit = 222 if "." in name else 63
    if not 3 <= len(name) <= limit:
        return f"must be 3-{limit} characters long"
    if not all(BUCKET_PART.match(part) for part in name.split(".")):
        return ("only lowercase letters, digits, - _ and ., starting and ending with a letter or digit, each "
                "dot-separated part at most 63 characters")
    if DOTTED_DECIMAL.match(name):
        return "must not be an IP address"
    if name.startswith("goog") or any(word in name for word in GOOGLE_LOOKALIKES):
        return "must not start with goog nor contain google (or a look-alike)"
    return None


def bucket_path_problem(path: str, store: str = "the bucket") -> str | None:
    """Why a path that should name something in the stack's bucket (relative to its root, as the pods see it under
    the bucket's mount) would name something else, or None. GCS FUSE shows the bucket as a folder: `..` climbs out
    of it, `.` and an empty part (`//`) name no object, and an absolute path is not under it at all. A trailing `/`
    names a folder, and an empty path is the bucket itself: each key's own rule says whether that will do. `store`:
    what the path is relative to in the words of the message (a Gaudi job's data is on "the claim")."""
    item = "object" if store == "the bucket" else "file"  # Cloud Storage holds objects
    if path.startswith("/"):
        return f"is absolute; a path in {store} starts at its root (e.g. data/train.jsonl)"
    parts = path.split("/")
    if parts[-1] == "":
        parts.pop()  # a folder
    if "" in parts:
        return f"has an empty part (//), which no {item} of {store} has"
    for part in (".", ".."):
        if part in parts:
            where = f"climbs out of {store}" if part == ".." else f"names no {item} of {store}"
            return f"has a {part!r} part, which {where}; write the path from {store}'s root"
    return None


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
