"""A reservation's end time: RFC 3339 text, parsed and compared with "now" (issue 31 items 1 and 4).

The stack (`nodePools[].reservationEndTime`, parsed once into the typed model: typed_end_times) and the planner
(`make gpus RESERVATION=NAME:SIZE:END`) read the end the same way: a date, a time to the minute or second and a
zone (`Z` or an offset); the seconds may be left out, as people write the time a reservation ends
(`2026-12-04T00:00Z`). "Now" is the machine's clock in UTC, or DEEPSPEED_STACK_NOW (the same form) where a test or
a reviewer fixes the date, so that a stack whose reservation ended is refused the same way on every machine that
runs its tests.
"""

from __future__ import annotations

import datetime
import os
import re
from typing import Any

from model.problems import Problem
from model.repair import Key
from model.types import END_KEY, END_TEXT_KEY, key_path

NOW_ENV = "DEEPSPEED_STACK_NOW"
# RFC 3339's date-time, with the seconds optional (the end of a reservation is given to the minute).
END_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?([Zz]|[+-]\d{2}:\d{2})")
FORM = "an RFC 3339 time with its zone, such as 2026-12-04T00:00:00Z"


def parse_time(text: str) -> datetime.datetime:
    """`2026-12-04T00:00Z` -> an aware datetime in UTC; ValueError naming the form for anything else (no zone, a
    13th month, a date alone)."""
    if not isinstance(text, str) or not END_TIME.fullmatch(text.strip()):
        raise ValueError(f"{text!r} is not {FORM}")
    try:
        parsed = datetime.datetime.fromisoformat(text.strip().replace("z", "Z"))
    except ValueError as err:
        raise ValueError(f"{text!r} is not {FORM} ({err})") from None
    return parsed.astimezone(datetime.UTC)


def now() -> datetime.datetime:
    """The time the plan and the checks measure from: DEEPSPEED_STACK_NOW if set, else the clock (UTC)."""
    fixed = os.environ.get(NOW_ENV)
    return parse_time(fixed) if fixed else datetime.datetime.now(datetime.UTC)


def hours_until(end: datetime.datetime, start: datetime.datetime) -> float:
    return (end - start).total_seconds() / 3600


def show(when: datetime.datetime) -> str:
    """`2026-12-04 00:00 UTC`: how messages name a time."""
    return when.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def typed_end_times(config: dict[str, Any]) -> list[tuple[Key, Problem]]:
    """Each pool's reservationEndTime parsed once, here, as the model is built (model/config.py), for every
    layer above: an aware datetime (UTC) in its place and the text as written beside it (END_TEXT_KEY). A text
    that is no time (a 13th month, no zone) is a problem at its key, with the form that is valid, and the key is
    dropped, as the schema's rejects are (model/repair.py), so the rules still check the rest. Pools keep their
    indices (repair never drops a list item)."""
    found: list[tuple[Key, Problem]] = []
    for i, pool in enumerate(config.get("nodePools") or []):
        text = pool.get(END_KEY) if isinstance(pool, dict) else None
        if not isinstance(text, str):
            continue
        try:
            pool[END_KEY], pool[END_TEXT_KEY] = parse_time(text), text
        except ValueError as err:
            del pool[END_KEY]
            parts = ("nodePools", i, END_KEY)
            found.append((parts, Problem(key_path(list(parts)), str(err))))
    return found
