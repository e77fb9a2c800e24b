"""What a bucket's data costs to move to GKE nodes in another location (data/network_pricing.yaml, with its source)."""

from __future__ import annotations

import functools
from pathlib import Path

import msgspec

from model.yamlio import load_yaml

DATA_PATH = Path(__file__).resolve().parent.parent / "data" / "network_pricing.yaml"


class Transfer(msgspec.Struct, frozen=True):
    """How the data moves between a bucket location and a region: `scope` `same` (free), `continent` (one
    continent, at `per_gib`), or `intercontinental` (`per_gib` None: the general network table, not kept)."""

    scope: str
    per_gib: float | None
    bucket_continent: str | None
    region_continent: str | None


class NetworkPricing(msgspec.Struct, frozen=True):
    source: str
    date: str
    same_continent_per_gib: float
    different_continents_per_gib: float | None
    continents: dict[str, str]
    dual_regions: dict[str, tuple[str, ...]]
    multi_regions: dict[str, tuple[str, tuple[str, ...]]]  # name -> (region prefix, regions outside it)

    def continent(self, location: str) -> str | None:
        """A region's continent (`us-central1` -> North America), or a dual/multi-region's (that of its regions)."""
        upper = location.upper()
        if upper in self.dual_regions:
            return self.continent(self.dual_regions[upper][0])
        if upper in self.multi_regions:
            return self.continent(self.multi_regions[upper][0] + "x")
        return self.continents.get(location.lower().split("-", 1)[0])

    def contains(self, location: str, region: str) -> bool:
        """Whether a bucket in `location` is in `region` for pricing: the region itself, or a dual/multi-region with
        it among its regions."""
        upper, region = location.upper(), region.lower()
        if upper in self.dual_regions:
            return region in self.dual_regions[upper]
        if upper in self.multi_regions:
            prefix, outside = self.multi_regions[upper]
            return region.startswith(prefix) and region not in outside
        return location.lower() == region

    def transfer(self, location: str, region: str) -> Transfer:
        here, there = self.continent(location), self.continent(region)
        if self.contains(location, region):
            return Transfer("same", 0.0, here, there)
        if here is not None and here == there:
            return Transfer("continent", self.same_continent_per_gib, here, there)
        return Transfer("intercontinental", self.different_continents_per_gib, here, there)


def parse(raw: dict) -> NetworkPricing:
    return NetworkPricing(
        source=raw["source"], date=str(raw["date"]),
        same_continent_per_gib=float(raw["transfer"]["sameContinentPerGiB"]),
        different_continents_per_gib=raw["transfer"]["differentContinentsPerGiB"],
        continents={k: str(v) for k, v in raw["continents"].items()},
        dual_regions={k.upper(): tuple(v) for k, v in raw["dualRegions"].items()},
        multi_regions={k.upper(): (v["prefix"], tuple(v["except"])) for k, v in raw["multiRegions"].items()})


@functools.cache
def load(path: Path = DATA_PATH) -> NetworkPricing:
    return parse(load_yaml(path))
