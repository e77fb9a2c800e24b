"""A problem with a stack's config as a value: the key it is on, what is wrong there, and how bad it is (issue 41
item 3). The schema (model/config.py), the rules (checks/) and the workload kinds (workloads/kinds/) return these;
model/repair.py reads `path` instead of recovering it from a line of text, and `str()` is the line users read in the
pulumi.RunError (`nodePools[0].maxNodes: must be at least 1, got 0`), unchanged from when problems were strings.

In the bottom layer (model/), so every layer above can make and read them; like cluster-toolkit's validators'
(path, error) results.

"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import msgspec

Level = Literal["error", "warning"]


class Problem(msgspec.Struct, frozen=True):  # a Struct, as the model's types are (tests/test_startup.py)
    path: str  # the key as `pulumi config set --path` spells it (`workloads.tune.finetune.saveSteps`)
    text: str  # what is wrong there and what would be valid
    level: Level = "error"  # an error stops the run (pulumi.RunError); a warning is logged and reaches the summary

    def __str__(self) -> str:
        return f"{self.path}: {self.text}"


def lines(problems: Iterable[Problem]) -> list[str]:
    """The lines users read, one per problem, in order."""
    return [str(p) for p in problems]
