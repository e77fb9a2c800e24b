"""finetune.py's tiered checkpoints (--local-checkpoint-dir, the stack's `localCheckpoints`): the Trainer saves to the
node's local SSD, and a thread on each node copies every save to CHECKPOINT_DIR (the bucket) while training goes on.

Why this and not DeepSpeed's or torch's own: the save itself stays the Trainer's (DeepSpeed's engine, the Trainer's
files), written to a local disk at local speed; what is slow is the bucket, and only a copy taken off the training's
path helps there. DeepSpeed's fast writer (checkpoint.writer, deepspeed 0.19.8 FastCheckpointEngine) speeds the
write itself with libaio/GDS, which the image does not build, and its decoupled writer hands the write to another
process but commits it only at the next save (DecoupledCheckpointEngine: the marker a resume needs would lag a whole
interval). torch.distributed.checkpoint's async_save stages an FSDP/DTensor state dict; the Trainer under DeepSpeed
saves through the engine's save_checkpoint, not through DCP. What DeepSpeed does offer is used:
checkpoint.use_node_local_storage, with which the local rank 0 of every node (not only global rank 0) writes the
model states, so every node's disk holds what its ranks need and the copies of all nodes make a whole checkpoint;
the Trainer's save_on_each_node does the same for its own files.

Order in the bucket: each node copies its files into <checkpoint_dir>/checkpoint-N/ (the Trainer's trainer_state.json
last), then writes copied-node-<i>.json; global rank 0 waits for every node's, then writes checkpoint-copied.json:
only a folder with it is resumed from (finetune_checkpoints.newest_checkpoint). A copy the node does not finish (a
preemption without time) leaves a folder without the marker, skipped on resume and removed once a newer one is
complete. On SIGTERM the save being copied is dropped for the stop's own save (the newest; the pods' grace period
covers one save and its copy), and finetune.py waits for that copy before it exits. Standard library only, but for
the Trainer's callback and the ranks' barrier (imported when used).
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recipes.finetune_checkpoints import CHECKPOINT_DONE_FILE, CHECKPOINT_PREFIX, checkpoint_step

COPIED_MARKER = "checkpoint-copied.json"  # in the bucket's checkpoint-N: every node's files are there
NODE_MARKER = "copied-node-{node}.json"
CHUNK = 1 << 20
POLL_SECONDS = 0.2


class CopyAbandonedError(Exception):
    """A newer save superseded the one being copied (on SIGTERM), or its files went away (the Trainer's rotation)."""


def node_of(process_index: int, world_size: int, environ: dict[str, str]) -> tuple[int, int]:
    """(this node's index, the number of nodes): DeepSpeed's launcher sets LOCAL_SIZE, torchrun LOCAL_WORLD_SIZE."""
    local = int(environ.get("LOCAL_SIZE") or environ.get("LOCAL_WORLD_SIZE") or 1)
    return process_index // local, max(1, world_size // local)


def copy_file(source: Path, target: Path, rate: float | None, check: Callable[[], None]) -> int:
    """`source` to `target`, at most `rate` bytes a second (None: as fast as it goes); `check` between chunks."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if rate is None:
        check()
        shutil.copyfile(source, target)
        return source.stat().st_size
    done, started = 0, time.monotonic()
    with open(source, "rb") as src, open(target, "wb") as dst:
        while chunk := src.read(min(CHUNK, max(1, int(rate)))):
            check()
            dst.write(chunk)
            done += len(chunk)
            ahead = done / rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
    return done


def files_in_order(folder: Path) -> list[Path]:
    """Every file under a local checkpoint folder, the Trainer's trainer_state.json (its own last write) last."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    return [p for p in files if p.name != CHECKPOINT_DONE_FILE] + [p for p in files if p.name == CHECKPOINT_DONE_FILE]


class Copier:
    """One per node (its local rank 0): copies each save from `local` to `bucket` in a thread, the newest first."""

    def __init__(self, local: Path, bucket: Path, node: int, nodes: int, first: bool, keep: int,
                 stopping: Callable[[], bool], rate: float | None = None, say: Callable[[str], None] = print) -> None:
        self.local, self.bucket, self.node, self.nodes, self.first, self.keep = local, bucket, node, nodes, first, keep
        self.stopping, self.rate, self.say = stopping, rate, say
        self.pending: queue.Queue[int | None] = queue.Queue()
        self.newest_queued = -1
        self.thread = threading.Thread(target=self._run, name="checkpoint-copy", daemon=True)
        self.thread.start()

    def submit(self, step: int) -> None:
        self.newest_queued = max(self.newest_queued, step)
        self.pending.put(step)

    def drain(self, timeout: float | None = None) -> bool:
        """Waits until every queued copy is done (or `timeout`); True when none is left."""
        self.pending.put(None)
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def _run(self) -> None:
        while (step := self.pending.get()) is not None:
            if step < self.newest_queued:
                continue  # a newer save is queued: copy that one
            try:
                self.copy(step)
            except CopyAbandonedError as why:
                self.say(f"copy of {CHECKPOINT_PREFIX}{step} abandoned: {why}")
            except OSError as error:
                self.say(f"copy of {CHECKPOINT_PREFIX}{step} failed, the next save's copy will retry: {error}")

    def copy(self, step: int) -> None:
        name = f"{CHECKPOINT_PREFIX}{step}"
        source, target = self.local / name, self.bucket / name
        started = time.monotonic()

        def check() -> None:
            if self.stopping() and self.newest_queued > step:
                raise CopyAbandonedError(f"stopping, and {CHECKPOINT_PREFIX}{self.newest_queued} is newer")

        try:
            size = sum(copy_file(f, target / f.relative_to(source), self.rate, check) for f in files_in_order(source))
        except FileNotFoundError as gone:
            raise CopyAbandonedError(f"{gone.filename} went away (the Trainer's rotation)") from None
        took = time.monotonic() - started
        (target / NODE_MARKER.format(node=self.node)).write_text(json.dumps({"step": step, "bytes": size}))
        self.say(f"node {self.node}: {name} copied to {self.bucket} ({size / 1e6:.1f} MB in {took:.1f} s)")
        if self.first:
            self._complete(step, target)

    def _complete(self, step: int, target: Path) -> None:
        """Rank 0: once every node's files are in, the marker, then the older copies beyond `keep` go."""
        markers = [target / NODE_MARKER.format(node=n) for n in range(self.nodes)]
        while not all(m.is_file() for m in markers):
            if self.stopping() and self.newest_queued > step:
                raise CopyAbandonedError("stopping, and a newer save is queued")
            time.sleep(POLL_SECONDS)
        (target / COPIED_MARKER).write_text(json.dumps({"step": step, "nodes": self.nodes}))
        self.say(f"{target.name} complete in {self.bucket} ({COPIED_MARKER})")
        self.prune(step)

    def prune(self, newest: int) -> None:
        """The bucket keeps the newest `keep` complete copies; incomplete ones older than `newest` were cut off."""
        found = sorted((s, p) for p in self.bucket.iterdir()
                       if p.is_dir() and (s := checkpoint_step(p.name)) is not None)
        complete = [s for s, p in found if (p / COPIED_MARKER).is_file()]
        kept = set(complete[-self.keep:])
        for s, p in found:
            if s < newest and s not in kept:
                shutil.rmtree(p, ignore_errors=True)


def copy_callback(copier: Copier | None) -> Any:
    """The Trainer's callback: after each save, every rank waits for the others' files (a barrier), then the
    node's copier (on local rank 0; None elsewhere) queues the copy."""
    from transformers import TrainerCallback

    class CopyToBucket(TrainerCallback):  # type: ignore[misc]
        def on_save(self, args: Any, state: Any, control: Any, **_: Any) -> Any:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                dist.barrier()
            if copier is not None:
                copier.submit(state.global_step)
            return control

    return CopyToBucket()


def local_ds_config(ds: dict[str, Any] | None) -> dict[str, Any] | None:
    """ds_config.json with DeepSpeed's checkpoint.use_node_local_storage: each node's local rank 0 writes the model
    states too, so every node's local disk holds what its ranks load."""
    if ds is None:
        return None
    return {**ds, "checkpoint": {**ds.get("checkpoint", {}), "use_node_local_storage": True}}


def start(local_dir: str, checkpoint_dir: str, process_index: int, local_index: int, world_size: int, keep: int,
          stopping: Callable[[], bool], rate_mb: float | None, say: Callable[[str], None]) -> Copier | None:
    """The node's copier on its local rank 0; None on the other ranks."""
    if local_index != 0:
        return None
    node, nodes = node_of(process_index, world_size, dict(os.environ))
    Path(local_dir).mkdir(parents=True, exist_ok=True)
    return Copier(Path(local_dir), Path(checkpoint_dir), node, nodes, process_index == 0, keep, stopping,
                  rate_mb * 1e6 if rate_mb else None, say)
