"""What of a run goes past a reservation's end (issue 31 items 1 and 4): a pure function of the run's hours, the time
it starts and the time the reservation ends.

A reservation is paid whether its nodes work or not, so a run uses it to its end; what is left of the run then
goes to the fallback capacity (DWS flex-start or spot, the same machines) and is paid there, on top. The run's
hours are a range (planner/run_estimate.py: the fast end at the high assumed MFU, the slow end at the low one),
and so is what spills over.
"""

from __future__ import annotations

import datetime

import msgspec

from model import reservation


class Spill(msgspec.Struct, frozen=True):
    """`hours_left`: the reservation's hours from the run's start to its end; `fast`/`slow`: the run's hours past
    the end at either end of its range (0: it ends in time)."""

    start: datetime.datetime
    end: datetime.datetime
    hours_left: float
    fast: float
    slow: float

    @property
    def outlives(self) -> bool:
        """The run may go past the end (at least at its slow end)."""
        return self.slow > 0

    def cost(self, per_hour: float) -> tuple[float, float]:
        """$ for the hours past the end at the fallback's $/h: (fast, slow)."""
        return self.fast * per_hour, self.slow * per_hour


def spill(hours_fast: float, hours_slow: float, start: datetime.datetime, end: datetime.datetime) -> Spill:
    """The run of `hours_fast`-`hours_slow` hours started at `start` against a reservation that ends at `end`."""
    left = max(0.0, reservation.hours_until(end, start))
    return Spill(start, end, left, max(0.0, hours_fast - left), max(0.0, hours_slow - left))
