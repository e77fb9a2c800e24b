"""finetune.py's checkpoints: which checkpoint-N folder a restarted run resumes from (make e2e's finetune scenario
reads the same rule to know when a checkpoint exists). Standard library only."""

from __future__ import annotations

import re
from pathlib import Path

CHECKPOINT_PREFIX = "checkpoint-"  # the Trainer's PREFIX_CHECKPOINT_DIR
# What the Trainer writes last into a checkpoint folder: a folder without it was cut off while saving.
CHECKPOINT_DONE_FILE = "trainer_state.json"


def checkpoint_step(name: str) -> int | None:
    match = re.fullmatch(rf"{CHECKPOINT_PREFIX}(\d+)", name)
    return int(match.group(1)) if match else None


def newest_checkpoint(directory: str | Path, done_file: str | None = None) -> Path | None:
    """The checkpoint-N folder with the highest N that was saved to the end (it holds trainer_state.json, which
    the Trainer writes after the model, optimizer and scheduler; `done_file`: that file instead, e.g. the tiered
    copy's marker, finetune_tiered.py); None when there is none."""
    root = Path(directory)
    if not root.is_dir():
        return None
    done = done_file or CHECKPOINT_DONE_FILE
    found = [(step, p) for p in root.iterdir() if p.is_dir() and (step := checkpoint_step(p.name)) is not None
             and (p / done).is_file()]
    return max(found)[1] if found else None
