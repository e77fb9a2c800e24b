"""What a storage class's volumes are (`data/storage_classes.yaml`): file storage any node mounts, or block and
local storage one node holds at a time."""

from __future__ import annotations

import functools
from pathlib import Path

import msgspec

from model.yamlio import load_yaml

DATA_PATH = Path(__file__).resolve().parent.parent / "data" / "storage_classes.yaml"
FILE = "file"


class StorageClass(msgspec.Struct, frozen=True):
    name: str
    storage: str  # file, block or local
    provisioner: str
    confirmed: bool


@functools.cache
def storage_classes() -> dict[str, StorageClass]:
    data = load_yaml(DATA_PATH)["classes"]
    return {name: StorageClass(name=name, storage=e["storage"], provisioner=e["provisioner"],
                               confirmed=bool(e["confirmed"])) for name, e in data.items()}


def file_classes() -> tuple[str, ...]:
    return tuple(name for name, c in storage_classes().items() if c.storage == FILE)


def is_file_storage(name: str) -> bool:
    """Whether the class's volumes are file storage (NFS, Filestore): mounted by many nodes, never attached."""
    known = storage_classes().get(name)
    return known is not None and known.storage == FILE
