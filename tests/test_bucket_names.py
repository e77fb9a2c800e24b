"""Cloud Storage's bucket-name lengths (model/validators.py bucket_name_problem), pinned at their edges.

Fact (cloud.google.com/storage/docs/buckets#naming, as the validator's comment quotes it): 3-63 characters, or up to
222 when the name has dots, each dot-separated component at most 63 characters.
"""

from __future__ import annotations

import pytest
from conftest import problems

from model.validators import bucket_name_problem

PART_RULE = ("only lowercase letters, digits, - _ and ., starting and ending with a letter or digit, each "
             "dot-separated part at most 63 characters")


def _dotted(total: int) -> str:
    """A dotted name of exactly `total` characters, every component at most 63."""
    parts, left = [], total
    while left > 0:
        size = min(63, left if not parts else left - 1)  # each component after the first costs its dot too
        parts.append("a" * size)
        left -= size + (1 if len(parts) > 1 else 0)
    return ".".join(parts)


def test_the_dotted_names_are_what_they_say() -> None:
    assert [len(_dotted(n)) for n in (222, 223)] == [222, 223]
    assert max(len(p) for p in _dotted(223).split(".")) == 63


@pytest.mark.parametrize(("name", "why"), [
    ("abc", None),
    ("ab", "must be 3-63 characters long"),
    ("a" * 63, None),
    ("a" * 64, "must be 3-63 characters long"),
    (_dotted(222), None),
    (_dotted(223), "must be 3-222 characters long"),
    ("a" * 63 + ".example", None),
    ("a" * 64 + ".example", PART_RULE),
    ("data." + "b" * 64 + ".example", PART_RULE),
], ids=["3", "2", "63", "64", "dotted-222", "dotted-223", "dotted-part-63", "dotted-part-64", "middle-part-64"])
def test_bucket_name_lengths(name: str, why: str | None) -> None:
    assert bucket_name_problem(name) == why


def test_a_long_dotted_bucket_name_is_refused_at_its_key() -> None:
    name = _dotted(223)
    assert problems("dev", {"storage.enabled": True, "storage.bucketName": name}) == [
        f"storage.bucketName: {name!r} is not a valid bucket name: must be 3-222 characters long (Cloud Storage's "
        "naming rules)"]
    assert problems("dev", {"storage.enabled": True, "storage.bucketName": _dotted(222)}) == []
