"""smoke_train.py's checkpoints (the preemption-recovery contract): where they go, the state file rank 0 writes
after each save, when a periodic save is due, and the resume at the same or a different world size.

The helpers above `Resume` need neither torch nor deepspeed, so they are unit-tested anywhere
(tests/test_smoke_train_run.py).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from recipes.smoke_train_ranks import Place, say


def checkpoint_dir(argument: str | None, env: Mapping[str, str]) -> str | None:
    """Where checkpoints go: ``--checkpoint-dir``, else Vertex AI's AIP_CHECKPOINT_DIR (mapped to the
    /gcs/ FUSE path by the image's start script), else CHECKPOINT_DIR (the stack's bucket or NFS path)."""
    for value in (argument, env.get("AIP_CHECKPOINT_DIR"), env.get("CHECKPOINT_DIR")):
        if value and value.strip():
            return value.strip()
    return None


STATE_FILE = "smoke_state.json"


def read_resume_state(directory: str | None) -> dict[str, Any] | None:
    """The state file rank 0 writes after each checkpoint (step, world size, tag, loss), or None."""
    if not directory:
        return None
    path = os.path.join(directory, STATE_FILE)
    try:
        with open(path, encoding="utf-8") as handle:
            state = json.load(handle)
    except FileNotFoundError:
        return None
    if not isinstance(state, dict) or not {"step", "world_size", "tag"} <= state.keys():
        raise ValueError(f"{path}: not a smoke-test checkpoint state (step, world_size, tag)")
    return state


def write_resume_state(directory: str, state: Mapping[str, Any]) -> None:
    """Atomically (write, then rename): a preemption mid-write leaves the previous state intact."""
    path = os.path.join(directory, STATE_FILE)
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(dict(state), handle, sort_keys=True)
    os.replace(path + ".tmp", path)


def universal_tag(tag: str) -> str:
    return f"{tag}_universal"


def due_for_checkpoint(step: int, every: int) -> bool:
    """A periodic checkpoint after every `every` steps (0: none, only on SIGTERM and at the end)."""
    return every > 0 and step > 0 and step % every == 0


@dataclass(frozen=True)
class Resume:
    """The checkpoint a run starts from: its directory, the saved state, and the tag to load (a universal one at a
    different world size)."""

    directory: str
    state: dict[str, Any]
    tag: str


def resume_point(directory: str | None, place: Place,
                 config: dict[str, Any]) -> tuple[Resume | None, dict[str, Any]]:  # pragma: no cover - e2e
    """The checkpoint to resume from (None: a fresh start), and the DeepSpeed config to load it with. At a different
    world size ZeRO's partitioned optimizer states are re-sliced through DeepSpeed's universal checkpoint
    (converted once, by rank 0, beside the original)."""
    state = read_resume_state(directory)
    if state is None or directory is None:
        return None, config
    if int(state["world_size"]) == place.world_size:
        return Resume(directory, state, state["tag"]), config
    import torch.distributed as dist

    tag = universal_tag(state["tag"])
    if place.rank == 0 and not os.path.isdir(os.path.join(directory, tag)):
        say(f"[smoke] converting {state['tag']} (world size {state['world_size']}) to a universal checkpoint")
        import subprocess

        subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
                        "--input_folder", os.path.join(directory, state["tag"]),
                        "--output_folder", os.path.join(directory, tag),
                        "--inject_missing_state"], check=True)
    dist.barrier()
    return Resume(directory, state, tag), {**config, "checkpoint": {**config.get("checkpoint", {}),
                                                                  "load_universal": True}}


def load_resume(engine: Any, resume: Resume, place: Place) -> int | None:  # pragma: no cover - e2e
    """The step the run resumes at; None when the checkpoint does not load."""
    loaded, client_state = engine.load_checkpoint(resume.directory, tag=resume.tag)
    if loaded is None:
        say(f"[smoke] FAILED: cannot load checkpoint {resume.tag} from {resume.directory}", err=True)
        return None
    state = resume.state
    start_step = int((client_state or {}).get("smoke_step", state["step"]))
    say(f"[smoke] rank {place.rank}: resumed from {resume.directory}/{resume.tag} at step {start_step} "
        f"(saved at world size {state['world_size']}, now {place.world_size}, last loss {state.get('loss')})")
    return start_step
