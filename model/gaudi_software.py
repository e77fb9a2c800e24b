"""Habana base images the Gaudi image builds on (`data/gaudi_software.yaml`), pinned by tag and digest; the
optimum-habana releases, their end of support, and which path runs the training for a Gaudi software release."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import msgspec

from model.types import GaudiConfig
from model.yamlio import load_yaml

DATA_PATH = Path(__file__).resolve().parent.parent / "data" / "gaudi_software.yaml"
DIGEST = re.compile(r"^sha256:[a-f0-9]{64}$")


class BaseImage(msgspec.Struct, frozen=True):
    software_version: str
    os: str
    pytorch: str
    repository: str
    tag: str
    digest: str | None  # None while unconfirmed: the build pins the tag only, and the preview warns

    @property
    def ref(self) -> str:
        """`repository:tag@digest`: the tag says which release, the digest what exactly."""
        pinned = f"{self.repository}:{self.tag}"
        return f"{pinned}@{self.digest}" if self.digest else pinned


@functools.cache
def base_images() -> tuple[BaseImage, ...]:
    data = load_yaml(DATA_PATH)
    return tuple(BaseImage(software_version=str(e["softwareVersion"]), os=e["os"], pytorch=str(e["pytorch"]),
                           repository=e["repository"], tag=str(e["tag"]), digest=e.get("digest"))
                 for e in data["baseImages"])


def base_image(g: GaudiConfig) -> BaseImage | None:
    """The pinned base image for a workload's Gaudi software, OS and PyTorch versions (None: none recorded)."""
    return next((b for b in base_images() if (b.software_version, b.os, b.pytorch) ==
                 (g.software_version, g.os, g.pytorch_version)), None)


def habana_deepspeed_ref(software_version: str) -> str:
    """Habana's DeepSpeed fork is tagged per Gaudi software minor release (1.19.1 -> 1.19.0)."""
    major, minor, *_ = software_version.split(".")
    return f"{major}.{minor}.0"


class OptimumHabanaRelease(msgspec.Struct, frozen=True):
    release: str  # the git tag, as `training.optimumHabanaVersion` spells it
    gaudi: str  # the Gaudi software major.minor it was validated with
    confirmed: bool
    transformers: str | None = None  # its setup.py's pin, e.g. ">=4.45.2,<4.46.0"

    @property
    def transformers_floor(self) -> tuple[int, ...] | None:
        """The oldest transformers the release installs (the pin's `>=` bound), None where not recorded."""
        lower = [part.strip()[2:] for part in (self.transformers or "").split(",") if part.strip().startswith(">=")]
        return version_tuple(lower[0]) if lower else None


@functools.cache
def optimum_habana_releases() -> tuple[OptimumHabanaRelease, ...]:
    data = load_yaml(DATA_PATH)["optimumHabana"]
    return tuple(OptimumHabanaRelease(release=e["release"], gaudi=str(e["gaudi"]), confirmed=bool(e["confirmed"]),
                                      transformers=e.get("transformers"))
                 for e in data["releases"])


def version_tuple(version: str) -> tuple[int, ...]:
    """"4.45.2" -> (4, 45, 2), for comparing release numbers."""
    return tuple(int(part) for part in version.split("."))


@functools.cache
def recipe_min_transformers() -> str:
    """The oldest transformers finetune.py runs on (measured; data/gaudi_software.yaml recipeOnGaudi)."""
    return str(load_yaml(DATA_PATH)["recipeOnGaudi"]["minTransformers"])


def release_named(release: str) -> OptimumHabanaRelease | None:
    return next((r for r in optimum_habana_releases() if r.release == release), None)


def runs_the_recipe(r: OptimumHabanaRelease) -> bool:
    """Whether the transformers this release installs is one finetune.py runs on (unknown: not refused)."""
    floor = r.transformers_floor
    return floor is None or floor >= version_tuple(recipe_min_transformers())


def gaudi_minor(software_version: str) -> str:
    """A Gaudi software release's major.minor (1.19.1 -> 1.19): optimum-habana names the stack it validated so."""
    major, minor, *_ = software_version.split(".")
    return f"{major}.{minor}"


def optimum_habana_for(software_version: str) -> tuple[str, ...]:
    """The optimum-habana releases validated with this Gaudi software release (none: nothing recorded)."""
    minor = gaudi_minor(software_version)
    return tuple(r.release for r in optimum_habana_releases() if r.gaudi == minor)


class EndOfSupport(msgspec.Struct, frozen=True):
    date: str  # from this day optimum-habana is no longer supported (its final release's README)
    final_release: str
    final_gaudi: str  # the Gaudi software major.minor the final release was validated with


@functools.cache
def end_of_support() -> EndOfSupport:
    e = load_yaml(DATA_PATH)["optimumHabana"]["endOfSupport"]
    return EndOfSupport(date=str(e["date"]), final_release=e["finalRelease"], final_gaudi=str(e["finalGaudi"]))


class SoftwarePath(msgspec.Struct, frozen=True):
    """A band of Gaudi software releases and what runs the training there (data/gaudi_software.yaml `paths`)."""

    first: str  # major.minor, inclusive
    last: str
    path: str  # optimum-habana | optimum-habana-frozen
    note: str


@functools.cache
def paths() -> tuple[SoftwarePath, ...]:
    return tuple(SoftwarePath(first=str(b["from"]), last=str(b["to"]), path=b["path"], note=b["note"])
                 for b in load_yaml(DATA_PATH)["paths"]["bands"])


@functools.cache
def native_hpu() -> dict[str, str]:
    """The first transformers and accelerate releases that run on HPU themselves (the path the stack does not build)."""
    return {k: str(v) for k, v in load_yaml(DATA_PATH)["paths"]["native"].items()}


def path_for(software_version: str) -> SoftwarePath | None:
    """The band a Gaudi software release falls in (None: outside every recorded band)."""
    minor = version_tuple(gaudi_minor(software_version))
    return next((p for p in paths() if version_tuple(p.first) <= minor <= version_tuple(p.last)), None)


HCCL_ENV_PATH = DATA_PATH.parent / "hccl_env.yaml"


@functools.cache
def hccl_env() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the prefixes of HCCL's variables, the names Habana documents): data/hccl_env.yaml."""
    data = load_yaml(HCCL_ENV_PATH)
    return tuple(data["prefixes"]), tuple(data["names"])
