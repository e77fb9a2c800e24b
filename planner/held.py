"""The capacity a user already holds (`make gpus GPUS=16xH100-MEGA`, `GPUS=2xa3-megagpu-8g`, `GPUS=H200`): the
planner then plans on those nodes only (issue 31 item 1).

A count before an accelerator counts GPUs (16xH100-MEGA: 16 GPUs, two 8-GPU nodes); before a machine type it counts
machines (2xa3-megagpu-8g). With a count, every option uses all of the held nodes: a reservation is paid whether its
nodes work or not, so the plan that uses them all is the one that gets the most of it. Without one, any node count
of that accelerator (or machine) is planned, as without GPUS.
"""

from __future__ import annotations

import datetime
import re

import msgspec

from model import catalog as gpu_catalog
from model import reservation
from model.suggest import did_you_mean
from planner import cli

SPEC = re.compile(r"\s*(?:(\d+)\s*[x×*]\s*)?(\S.*?)\s*", flags=re.IGNORECASE)
MEMORY_SUFFIX = re.compile(r"[\s-]*\d+\s*gb$", flags=re.IGNORECASE)  # "... 80GB", "-80gb": the memory size


class Held(msgspec.Struct, frozen=True):
    gpu_type: str  # the GKE accelerator type (data/gpu_catalog.yaml key)
    gpu_name: str  # its display name
    machine_type: str | None  # a machine type named, else any of the accelerator's shapes
    count: int | None  # how many GPUs (an accelerator named) or machines (a machine type named); None: any
    spec: str  # as the user wrote it

    @property
    def of_machines(self) -> bool:
        return self.machine_type is not None

    def nodes(self, gpus_per_node: int) -> int | None:
        """The held nodes of a shape with `gpus_per_node` GPUs (None: no count held, or the GPUs do not divide)."""
        if self.count is None:
            return None
        if self.of_machines:
            return self.count
        return self.count // gpus_per_node if self.count % gpus_per_node == 0 else None

    def takes(self, machine_type: str, gpus_per_node: int) -> bool:
        """Whether a machine shape is one the held capacity can be (its machine type, whole nodes of its GPUs)."""
        if self.machine_type is not None and machine_type != self.machine_type:
            return False
        return self.count is None or self.nodes(gpus_per_node) is not None

    def describe(self) -> str:
        name = self.gpu_name.removeprefix("NVIDIA ")
        if self.count is None:
            return self.machine_type or name
        return f"{self.count} x {self.machine_type}" if self.of_machines else f"{self.count} x {name}"


def _names(gpu_type: str, display_name: str) -> set[str]:
    """What a user may call an accelerator: its GKE type or display name, with or without its memory size, in any
    case and punctuation (`H100-MEGA`, `h100 mega 80gb`, `nvidia-h100-mega-80gb`)."""
    return {_norm(n) for raw in (gpu_type, display_name) for n in (raw, MEMORY_SUFFIX.sub("", raw))}


def _short(display_name: str) -> str:
    """`NVIDIA H100 Mega 80GB` -> `H100-MEGA`: how GPUS= may name it."""
    return "-".join(MEMORY_SUFFIX.sub("", display_name).removeprefix("NVIDIA ").upper().split())


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower()).replace("nvidia", "").replace("tesla", "")


def parse_held(spec: str, cat: gpu_catalog.Catalog | None = None) -> Held:
    """`16xH100-MEGA` / `2xa3-megagpu-8g` / `H200` -> Held; ValueError naming what is known when it is neither."""
    cat = cat or gpu_catalog.load()
    given = cli.arg("--gpus", repr(spec))  # GPUS='...' under make, --gpus '...' run directly
    match = SPEC.fullmatch(spec)
    if not match:
        raise ValueError(f"{given}: expected [COUNT x] ACCELERATOR or [COUNT x] MACHINE, e.g. 16xH100-MEGA or "
                         "2xa3-megagpu-8g")
    count, name = (int(match.group(1)) if match.group(1) else None), match.group(2)
    if count is not None and count < 1:
        raise ValueError(f"{given}: the count must be at least 1")
    machines = {s.machine_type: gpu_type for gpu_type, g in cat.gpus.items() for s in g.shapes}
    if name.lower() in machines:
        gpu_type = machines[name.lower()]
        return Held(gpu_type, cat.gpus[gpu_type].display_name, name.lower(), count, spec)
    found = [gpu_type for gpu_type, g in cat.gpus.items() if _norm(name) in _names(gpu_type, g.display_name)]
    if len(found) == 1:
        held = Held(found[0], cat.gpus[found[0]].display_name, None, count, spec)
        shapes = {s.gpus for s in cat.gpus[found[0]].shapes}
        if count is not None and not any(count % gpus == 0 for gpus in shapes):
            raise ValueError(f"{given}: {count} {held.gpu_name} GPUs are no whole number of its machines "
                             f"({', '.join(str(g) for g in sorted(shapes))} GPUs each)")
        return held
    known = sorted({_short(g.display_name) for g in cat.gpus.values()})
    if found:
        raise ValueError(f"{given}: {name} is {' or '.join(cat.gpus[t].display_name for t in found)}; name "
                         f"one ({', '.join(found)})")
    raise ValueError(f"{given}: {name} is neither an accelerator ({', '.join(known)}, or a GKE type such as "
                     f"nvidia-h100-mega-80gb) nor a machine type of data/gpu_catalog.yaml"
                     f"{did_you_mean(name.lower(), [*machines, *cat.gpus])}")


# --- A reservation: a name, its size (held capacity with a count) and its end (`make gpus RESERVATION=`) ----------

RESERVATION_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")  # a Compute Engine resource name
RESERVATION_FORM = "NAME:SIZE:END, e.g. h100-res:2xa3-megagpu-8g:2026-12-04T00:00Z"


class Reservation(msgspec.Struct, frozen=True):
    """A specific reservation the user holds: its name, what it holds (a count of GPUs or machines) and its end."""

    name: str
    held: Held
    end: datetime.datetime
    spec: str  # as the user wrote it

    @property
    def end_time(self) -> str:
        """The end as the stack's `reservationEndTime` takes it (RFC 3339, to the second, UTC)."""
        return self.end.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_reservation(spec: str, cat: gpu_catalog.Catalog | None = None,
                      now: datetime.datetime | None = None) -> Reservation:
    """`h100-res:2xa3-megagpu-8g:2026-12-04T00:00Z` -> Reservation; ValueError naming the part that is wrong: the
    name (a Compute Engine name), the size (as GPUS= takes it, with a count), the end (RFC 3339, still to come)."""
    given = cli.arg("--reservation", repr(spec))
    parts = spec.strip().split(":", 2)  # the end has colons of its own
    if len(parts) != 3:
        raise ValueError(f"{given}: expected {RESERVATION_FORM}")
    name, size, end_text = (p.strip() for p in parts)
    if not RESERVATION_NAME.fullmatch(name):
        raise ValueError(f"{given}: {name!r} is no reservation name (lower-case letters, digits and hyphens, "
                         "starting with a letter, at most 63)")
    try:
        held = parse_held(size, cat)
    except ValueError as err:
        raise ValueError(f"{given}: {str(err).split(': ', 1)[1]}") from None
    if held.count is None:
        raise ValueError(f"{given}: {size} says what but not how many; give the reservation's size, e.g. "
                         f"2x{held.machine_type or 'a3-megagpu-8g'}")
    try:
        end = reservation.parse_time(end_text)
    except ValueError as err:
        raise ValueError(f"{given}: the end {err}") from None
    now = now or reservation.now()
    if end <= now:
        raise ValueError(f"{given}: it ended {reservation.show(end)} (now {reservation.show(now)})")
    return Reservation(name, held, end, spec)


def held_capacity(gpus: str | None, reserved: str | None,
                  cat: gpu_catalog.Catalog | None = None) -> tuple[Held | None, Reservation | None]:
    """What the plan is made on: GPUS=, RESERVATION= (its size is the held capacity), or both when they agree."""
    res = parse_reservation(reserved, cat) if reserved else None
    held = parse_held(gpus, cat) if gpus else None
    if res is None:
        return held, None
    if held is not None and not _same(held, res.held, cat or gpu_catalog.load()):
        raise ValueError(f"{cli.arg('--gpus', repr(gpus))} and {cli.arg('--reservation', repr(reserved))} name "
                         f"different capacity ({held.describe()}, {res.held.describe()}); give one of them")
    return held or res.held, res


def _same(held: Held, reserved: Held, cat: gpu_catalog.Catalog) -> bool:
    """GPUS= says what the reservation holds: its GPUs (16xH100-MEGA) or its machines (2xa3-megagpu-8g)."""
    if held.gpu_type != reserved.gpu_type:
        return False
    shapes = [s for s in cat.gpus[reserved.gpu_type].shapes
              if reserved.machine_type in (None, s.machine_type) and held.takes(s.machine_type, s.gpus)]
    return any(held.count is None or held.nodes(s.gpus) == reserved.nodes(s.gpus) for s in shapes)
