"""The GPU catalog (`data/gpu_catalog.yaml`): machine shapes, zones and prices per accelerator.

Config validation, the planner and the docs all read this one file, so a fact is changed in one place.
"""

from __future__ import annotations

import functools
from pathlib import Path

import msgspec

from model.suggest import did_you_mean
from model.yamlio import load_yaml

CATALOG_PATH = Path(__file__).resolve().parent.parent / "data" / "gpu_catalog.yaml"


class Price(msgspec.Struct, frozen=True):
    on_demand: float
    spot: float

    def for_spot(self, spot: bool) -> float:
        return self.spot if spot else self.on_demand


class Shape(msgspec.Struct, frozen=True):
    """One machine type with a fixed number of one GPU type, priced per machine-hour (GPUs included)."""

    machine_type: str
    gpu_type: str
    gpus: int
    vcpus: int
    memory_gb: float
    price: Price


class Gpu(msgspec.Struct, frozen=True):
    name: str
    display_name: str
    memory_gb: float
    bf16: bool
    family: str
    shapes: tuple[Shape, ...]
    zones: dict[str, tuple[str, ...]]
    price_per_gpu: Price
    compute_capability: tuple[int, int] = (0, 0)  # CUDA (major, minor); (0, 0) where the catalog gives none
    # Zones one view of the zone source lists and another does not: accepted with a warning, never a default.
    unconfirmed_zones: dict[str, tuple[str, ...]] = msgspec.field(default_factory=dict)
    # Peak dense TFLOPS per training precision (fp32, fp16, bf16); a precision the GPU lacks has no entry.
    peak_tflops: dict[str, float] = msgspec.field(default_factory=dict)

    @property
    def compute_capability_text(self) -> str:
        return "{}.{}".format(*self.compute_capability)


class Machine(msgspec.Struct, frozen=True):
    """A machine type without GPUs (e.g. the system pool's e2-standard-4), priced per machine-hour."""

    machine_type: str
    vcpus: int
    memory_gb: float
    price: Price


class FilestoreTier(msgspec.Struct, frozen=True):
    """A Filestore service tier: the least it provisions (and bills) and its price; None where not in the catalog.
    `gke_min_gib` from GKE `gke_since`: the smaller instances GKE's CSI driver provisions from that version."""

    name: str
    min_gib: float
    per_gib_hour: float | None
    gke_min_gib: float | None = None
    gke_since: tuple[int, int] | None = None

    def min_gib_on(self, gke_minor: tuple[int, int] | None) -> float:
        """The least a claim of a cluster on this GKE minor is provisioned (and billed) at; an unknown minor gets
        the tier's own minimum, the larger one."""
        if self.gke_min_gib is not None and self.gke_since is not None and gke_minor is not None \
                and gke_minor >= self.gke_since:
            return self.gke_min_gib
        return self.min_gib


class Filestore(msgspec.Struct, frozen=True):
    """GKE's Filestore CSI StorageClasses, the tier each provisions, and the tiers' prices."""

    classes: dict[str, str] = msgspec.field(default_factory=dict)  # StorageClass -> tier name
    tiers: dict[str, FilestoreTier] = msgspec.field(default_factory=dict)
    source: str = ""
    date: str = ""

    def tier(self, storage_class: str) -> FilestoreTier | None:
        name = self.classes.get(storage_class)
        return self.tiers.get(name) if name else None


class VertexPricing(msgspec.Struct, frozen=True):
    """Vertex AI custom training: the Compute Engine price of machine + GPUs times `markup`."""

    markup: float = 1.0
    confirmed: bool = False
    source: str = ""
    date: str = ""


class Catalog(msgspec.Struct, frozen=True):
    source: str
    date: str
    regions: dict[str, tuple[str, ...]]
    gpus: dict[str, Gpu]
    gaudi: dict[str, dict]
    general_machines: dict[str, Machine] = msgspec.field(default_factory=dict)
    gke_cluster_fee_per_hour: float = 0.0
    currency: str = "USD"
    filestore: Filestore = msgspec.field(default_factory=Filestore)
    vertex: VertexPricing = msgspec.field(default_factory=VertexPricing)
    priced_regions: tuple[str, ...] = ()  # the regions whose list prices these are

    def region_problem(self, region: str) -> str | None:
        """Why `region` is not one of the catalog's (`not a region of ...`, with the closest), or None."""
        if region in self.regions:
            return None
        return (f"not a region of data/gpu_catalog.yaml, which lists every region that offers one of its GPUs "
                f"(known: {', '.join(self.regions)}){did_you_mean(region, self.regions)}")

    def priced_as(self, region: str) -> str | None:
        """The region whose prices stand in for `region`'s: None where the catalog has `region`'s own."""
        if not self.priced_regions or region in self.priced_regions:
            return None
        return self.priced_regions[0]

    def prices_of(self, region: str) -> str:
        """What the prices printed for `region` are: `us-central1 list prices`, or `asia-southeast1 priced as
        us-central1` where the catalog has no prices of that region."""
        stand_in = self.priced_as(region)
        return f"{region} priced as {stand_in}" if stand_in else f"{region} list prices"

    def gpu_hour(self, gpu_type: str, spot: bool = False) -> float:
        """Estimated price of one GPU-hour (attached GPUs: the GPU alone; bundled: the cheapest shape per GPU)."""
        return self.gpus[gpu_type].price_per_gpu.for_spot(spot)

    def machine_hour(self, machine_type: str, spot: bool = False, gpu_type: str | None = None,
                     count: int = 1) -> float | None:
        """Estimated price of one machine-hour, GPUs included when `gpu_type` is given; None when unknown."""
        if gpu_type is not None:
            shape = self.shape(gpu_type, machine_type, count)
            return shape.price.for_spot(spot) if shape else None
        machine = self.general_machines.get(machine_type)
        return machine.price.for_spot(spot) if machine else None

    def shape(self, gpu_type: str, machine_type: str, count: int) -> Shape | None:
        """The shape for this GPU type, machine type and count, or None where GCE does not offer it."""
        gpu = self.gpus.get(gpu_type)
        if gpu is None:
            return None
        for shape in gpu.shapes:
            if shape.machine_type == machine_type and shape.gpus == count:
                return shape
        return None

    def machine_types(self, gpu_type: str, count: int | None = None) -> list[str]:
        """Machine types that carry this GPU (that many of it, when `count` is given), smallest first."""
        gpu = self.gpus[gpu_type]
        shapes = sorted((s for s in gpu.shapes if count is None or s.gpus == count),
                        key=lambda s: (s.vcpus, s.memory_gb, s.gpus, s.machine_type))
        return list(dict.fromkeys(s.machine_type for s in shapes))

    def knows_machine_type(self, machine_type: str) -> bool:
        """Whether any GPU shape or general machine of the catalog is this machine type."""
        return machine_type in self.general_machines or any(
            s.machine_type == machine_type for gpu in self.gpus.values() for s in gpu.shapes)

    def counts(self, gpu_type: str, machine_type: str) -> list[int]:
        gpu = self.gpus[gpu_type]
        return sorted(s.gpus for s in gpu.shapes if s.machine_type == machine_type)

    def zones(self, gpu_type: str, region: str) -> tuple[str, ...]:
        """The region's zones that offer the GPU (confirmed ones only: these are what pools default to)."""
        gpu = self.gpus.get(gpu_type)
        return gpu.zones.get(region, ()) if gpu else ()

    def unconfirmed_zones(self, gpu_type: str, region: str) -> tuple[str, ...]:
        gpu = self.gpus.get(gpu_type)
        return gpu.unconfirmed_zones.get(region, ()) if gpu else ()


def _price(raw: dict) -> Price:
    return Price(on_demand=float(raw["onDemand"]), spot=float(raw["spot"]))


def _attached_shapes(name: str, raw: dict, n1: dict) -> tuple[Shape, ...]:
    """N1 + attached GPU: every N1 shape whose vCPUs the GPU count allows; price = machine + GPUs."""
    gpu_price = _price(raw["price"])
    shapes = []
    for count, max_vcpus in raw["counts"].items():
        for machine_type, m in n1.items():
            if m["vcpus"] <= max_vcpus:
                vm = _price(m["price"])
                price = Price(vm.on_demand + count * gpu_price.on_demand, vm.spot + count * gpu_price.spot)
                shapes.append(Shape(machine_type, name, int(count), m["vcpus"], m["memoryGb"], price))
    return tuple(shapes)


def _bundled_shapes(name: str, raw: dict) -> tuple[Shape, ...]:
    return tuple(
        Shape(mt, name, m["gpus"], m["vcpus"], m["memoryGb"], _price(m["price"]))
        for mt, m in raw["machines"].items()
    )


def _per_gpu_price(raw: dict, shapes: tuple[Shape, ...]) -> Price:
    if "price" in raw:
        return _price(raw["price"])
    # Bundled machines are priced whole; the cheapest shape per GPU stands for the GPU-hour price.
    return min((Price(s.price.on_demand / s.gpus, s.price.spot / s.gpus) for s in shapes),
               key=lambda p: p.on_demand)


def _compute_capability(raw: object) -> tuple[int, int]:
    """`"8.9"` -> (8, 9); a string in the YAML, so that "10.0" is not read as the float 10."""
    if raw is None:
        return (0, 0)
    major, _, minor = str(raw).partition(".")
    return int(major), int(minor or 0)


def _gke_minor(raw: object) -> tuple[int, int]:
    """`"1.33"` -> (1, 33): a string in the YAML, so that "1.30" is not read as the float 1.3."""
    major, _, minor = str(raw).partition(".")
    return int(major), int(minor)


def _filestore(raw: dict | None) -> Filestore:
    if not raw:
        return Filestore()
    tiers = {name: FilestoreTier(name, float(t["minGiB"]),
                                 None if t.get("perGiBHour") is None else float(t["perGiBHour"]),
                                 float(t["gke"]["minGiB"]) if "gke" in t else None,
                                 _gke_minor(t["gke"]["since"]) if "gke" in t else None)
             for name, t in raw["tiers"].items()}
    return Filestore(dict(raw["classes"]), tiers, str(raw["source"]), str(raw["date"]))


def _vertex(raw: dict | None) -> VertexPricing:
    if not raw:
        return VertexPricing()
    return VertexPricing(float(raw["markup"]), bool(raw.get("confirmed", False)), str(raw["source"]), str(raw["date"]))


def parse(raw: dict) -> Catalog:
    gpus = {}
    for name, g in raw["gpus"].items():
        shapes = _attached_shapes(name, g, raw["n1Machines"]) if g["kind"] == "attached" else _bundled_shapes(name, g)
        gpus[name] = Gpu(
            name=name,
            display_name=g["displayName"],
            memory_gb=float(g["memoryGb"]),
            bf16=bool(g["bf16"]),
            family=g["family"],
            shapes=shapes,
            zones={region: tuple(z) for region, z in g["zones"].items()},
            price_per_gpu=_per_gpu_price(g, shapes),
            compute_capability=_compute_capability(g.get("computeCapability")),
            unconfirmed_zones={region: tuple(z) for region, z in g.get("unconfirmedZones", {}).items()},
            peak_tflops={precision: float(t) for precision, t in g.get("peakTflops", {}).items()},
        )
    return Catalog(
        source=raw["source"],
        date=str(raw["date"]),
        regions={r: tuple(z) for r, z in raw["regions"].items()},
        gpus=gpus,
        gaudi=dict(raw.get("gaudi", {})),
        general_machines={mt: Machine(mt, m["vcpus"], float(m["memoryGb"]), _price(m["price"]))
                          for mt, m in raw.get("generalMachines", {}).items()},
        gke_cluster_fee_per_hour=float(raw.get("gkeClusterFeePerHour", 0.0)),
        currency=str(raw.get("currency", "USD")),
        filestore=_filestore(raw.get("filestore")),
        vertex=_vertex(raw.get("vertexTraining")),
        priced_regions=tuple(raw.get("pricedRegions", ())),
    )


@functools.cache
def load(path: Path = CATALOG_PATH) -> Catalog:
    return parse(load_yaml(path))
