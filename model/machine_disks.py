"""Local SSD counts and boot disk types per GPU machine shape (`machineDisks` in data/gpu_catalog.yaml)."""

from __future__ import annotations

import functools
from pathlib import Path

import msgspec

from model.catalog import CATALOG_PATH
from model.yamlio import load_yaml


class MachineDisks(msgspec.Struct, frozen=True):
    machine_type: str
    local_ssds: tuple[int, ...]  # the counts besides 0 a pool may ask for; () when the shape takes none
    bundled: bool  # the shape always comes with its one count
    boot_disks: tuple[str, ...]


@functools.cache
def _raw(path: Path = CATALOG_PATH) -> dict:
    return load_yaml(path)["machineDisks"]


def for_machine(machine_type: str, path: Path = CATALOG_PATH) -> MachineDisks | None:
    """The facts of one machine type; None for a family the catalog does not list (nothing to check)."""
    raw = _raw(path)
    family = raw["families"].get(machine_type.split("-", 1)[0])
    if family is None:
        return None
    shape = {**family, **raw["shapes"].get(machine_type, {})}
    return MachineDisks(machine_type, tuple(shape.get("localSsds", ())), bool(shape.get("bundled", False)),
                        tuple(shape["bootDisks"]))
