"""The NVIDIA driver branch GKE installs on a GPU node (data/gke_drivers.yaml): by the node's GKE minor version,
the pool's `gpu.driverVersion` and its GPU type.

A cluster's nodes start at its `minMasterVersion` (the release channel's default when unset) and only move up, and
GKE's drivers only get newer with its versions: the floor at creation is what decides.
"""

from __future__ import annotations

import functools
from pathlib import Path

import msgspec

from model.fabric import version_key
from model.types import ClusterConfig
from model.yamlio import load_yaml

DATA_PATH = Path(__file__).resolve().parent.parent / "data" / "gke_drivers.yaml"
CHOICES = ("DEFAULT", "LATEST")  # INSTALLATION_DISABLED installs nothing: the driver is the user's


class MinorDrivers(msgspec.Struct, frozen=True):
    minor: tuple[int, int]
    branches: dict[str, int]  # DEFAULT / LATEST -> branch, for every GPU type
    gpus: dict[str, dict[str, int]]  # GPU type -> its own DEFAULT / LATEST where it differs
    confirmed: bool

    @property
    def text(self) -> str:
        return f"{self.minor[0]}.{self.minor[1]}"

    def branch(self, choice: str, gpu_type: str) -> int:
        return self.gpus.get(gpu_type, {}).get(choice, self.branches[choice])


class GkeDrivers(msgspec.Struct, frozen=True):
    minors: tuple[MinorDrivers, ...]  # oldest first
    channels: dict[str, str]  # release channel -> the minor a new cluster gets
    date: str

    def row(self, minor: tuple[int, int]) -> MinorDrivers:
        """The newest row at or below `minor`; below the first row, the first (an older GKE has no newer driver)."""
        return next((r for r in reversed(self.minors) if r.minor <= minor), self.minors[0])

    def first_minor_with(self, choice: str, gpu_type: str, branch: int) -> MinorDrivers | None:
        return next((r for r in self.minors if r.branch(choice, gpu_type) >= branch), None)


def minor_of(version: str) -> tuple[int, int] | None:
    key = version_key(version)
    return key[:2] if key else None


def cluster_minor(cluster: ClusterConfig) -> tuple[int, int] | None:
    """The GKE minor a new cluster's nodes start at: `minMasterVersion`, else its release channel's default."""
    if cluster.min_master_version:
        return minor_of(cluster.min_master_version)
    channel = load().channels.get(cluster.release_channel)
    return minor_of(channel) if channel else None


def _minor(text: str) -> tuple[int, int]:
    major, _, minor = str(text).partition(".")
    return int(major), int(minor)


def parse(raw: dict) -> GkeDrivers:
    rows = sorted((MinorDrivers(minor=_minor(name),
                                branches={"DEFAULT": int(row["default"]), "LATEST": int(row["latest"])},
                                gpus={gpu: {k.upper(): int(v) for k, v in over.items()}
                                      for gpu, over in (row.get("gpus") or {}).items()},
                                confirmed=row["status"] == "observed")
                   for name, row in raw["minors"].items()), key=lambda r: r.minor)
    return GkeDrivers(minors=tuple(rows), channels={k: str(v) for k, v in raw["channels"].items()},
                      date=str(raw["date"]))


@functools.cache
def load(path: Path = DATA_PATH) -> GkeDrivers:
    return parse(load_yaml(path))
