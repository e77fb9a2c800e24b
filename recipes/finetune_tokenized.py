"""finetune.py's tokenized data: every record rendered once, packed as --packing says, and saved with `datasets`'
save_to_disk (Arrow files every rank memory-maps with load_from_disk) in a folder beside the checkpoints, named by a
fingerprint of everything that decides its tokens; reused on every restart and resume, made again when any of that
changes.

- Where: --tokenized-dir (default CHECKPOINT_DIR/tokenized, on the bucket or the claim the ranks share), then
  <fingerprint>/ with train/ (and eval/ with held-out records), and MARKER_FILE written last: a folder without it was
  cut off while being written and is made again.
- The fingerprint covers the data (each file's path, size and modification time; a hub dataset's id and the
  fingerprint `datasets` gives its download), the tokenizer (its whole tokenizer.json, chat template, BOS/EOS), the
  rendering flags (record format and fields, chat template and the named template's text), --seq-len, --packing,
  --eval-split with the seed that splits it, and the text of the modules that render (a changed rendering is a new
  folder, never stale tokens).
- Packing (--packing): `blocks` for text records (pre-training style, TRL's "wrapped" packing): the records' tokens,
  each document ending with EOS, concatenated and cut into --seq-len blocks, every block full but the last; nothing
  padded, no tail dropped. `padding-free` for conversations and prompt/completion records (TRL's padding_free, with
  transformers' DataCollatorWithFlattening): each record stays one sample with its own labels (the loss on the
  assistant turns only), and a micro batch is its records end to end in one row with position ids restarting at
  each record, so nothing is padded and no record sees another (transformers' masks and flash attention find the
  boundaries from the position ids). `auto` (the default): blocks for text, off for chat and prompt/completion,
  since padding-free needs a model whose attention reads the boundaries from the position ids (transformers' own
  models do; a model with its own attention code would let the records of a batch attend to each other without a
  word).

Standard library only: the stack and the unit tests import this module without `datasets`.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from recipes.contract import PACKING_FLAGS, TOKENIZED_FOLDER  # noqa: F401 (this module's names too)
from recipes.finetune_data import DataSource

MARKER_FILE = "tokenized.json"  # written last: the folder is complete
TRAIN, EVAL = "train", "eval"
BLOCKS, PADDING_FREE, OFF = "blocks", "padding-free", "off"
# The modules whose code decides the tokens (a changed one makes a new folder).
RENDERING_MODULES = ("finetune_data.py", "finetune_render.py", "finetune_check.py", "finetune_tokenized.py")
FINGERPRINT_LENGTH = 16  # hex digits of sha256: 64 bits, no two settings of one run's folder collide
# The data step's processes (datasets' map num_proc): the CPUs this process may use, at most this many. The
# rendering and tokenizing is the map's and splits by records; the packing into blocks and save_to_disk after it run
# in one process, so past some tens of processes they dominate [assumption: 64, a GPU node's worker has 100-200].
MAX_DATA_PROCS = 64
CPU_MAX_FILE = "/sys/fs/cgroup/cpu.max"  # cgroup v2: the container's CPU limit, "<quota> <period>" or "max <period>"


def usable_cpus(affinity: int, cpu_max: str | None) -> int:
    """The CPUs this process may use: the CPUs it may run on (os.sched_getaffinity), fewer where the container's
    CPU limit (cgroup v2 cpu.max) allows less; at least 1."""
    cpus = max(1, affinity)
    fields = (cpu_max or "").split()
    if len(fields) == 2 and fields[0] != "max":
        try:
            quota, period = int(fields[0]), int(fields[1])
        except ValueError:
            return cpus
        if quota > 0 and period > 0:
            cpus = min(cpus, max(1, quota // period))
    return cpus


def data_procs(cpus: int) -> int:
    """datasets' num_proc for the data step on `cpus` usable CPUs: all of them up to MAX_DATA_PROCS, at least 1."""
    return max(1, min(cpus, MAX_DATA_PROCS))


def this_host_procs() -> tuple[int, int]:
    """(usable CPUs here, the data step's processes)."""
    try:
        text: str | None = Path(CPU_MAX_FILE).read_text(encoding="utf-8")
    except OSError:
        text = None
    cpus = usable_cpus(len(os.sched_getaffinity(0)), text)
    return cpus, data_procs(cpus)


def packing_for(flag: str, data_kind: str) -> str:
    """What --packing does with data of `data_kind` (finetune_data.kind_of: text | plain | chat): BLOCKS for text
    (auto or on), PADDING_FREE for the rest with on, OFF otherwise."""
    if flag == "off":
        return OFF
    if data_kind == "text":
        return BLOCKS
    return PADDING_FREE if flag == "on" else OFF


def describe(packing: str, seq_len: int) -> str:
    """The packing in words, for the log."""
    if packing == BLOCKS:
        return f"packed: the documents end to end (EOS between them) in {seq_len}-token blocks, no padding"
    if packing == PADDING_FREE:
        return ("padding-free: each micro batch's records end to end in one row, position ids restarting at each "
                "record (transformers' DataCollatorWithFlattening)")
    return f"not packed: one record a sample, cut at {seq_len} tokens, padded to the longest of its micro batch"


def pack_blocks(documents: Iterable[Sequence[int]], seq_len: int) -> Iterator[list[int]]:
    """The documents' tokens end to end, cut into seq_len blocks: every block full but the last, every token kept
    in order (TRL's pack_dataset strategy "wrapped", across the whole data set rather than per map batch)."""
    buffer: list[int] = []
    for document in documents:
        buffer.extend(document)
        while len(buffer) >= seq_len:
            yield buffer[:seq_len]
            del buffer[:seq_len]
    if buffer:
        yield buffer


# --- the fingerprint -------------------------------------------------------------------------------------------

def source_identity(source: DataSource) -> dict[str, Any]:
    """What names the data's content without reading it: each file's path, size and modification time (a file
    rewritten in place gets a new time); a hub dataset's id (its download's fingerprint is added by the caller)."""
    if source.loader == "hub":
        return {"hub": source.hub_id}
    files = []
    for name in source.files:
        stat = os.stat(name)
        files.append([name, stat.st_size, stat.st_mtime_ns])
    return {"loader": source.loader, "files": files}


def tokenizer_identity(tokenizer: Any) -> str:
    """A digest of what decides the tokenizer's ids: its whole tokenizer.json (vocabulary, merges, normalizer,
    pre-tokenizer, the post-processor that adds BOS, added tokens) where it has one, its chat template and special
    ids."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    body = backend.to_str() if backend is not None else repr(getattr(tokenizer, "name_or_path", type(tokenizer)))
    parts = [body, str(getattr(tokenizer, "chat_template", None)), str(getattr(tokenizer, "bos_token_id", None)),
             str(getattr(tokenizer, "eos_token_id", None))]
    return hashlib.sha256("\0".join(parts).encode("utf-8")).hexdigest()


def code_identity(folder: Path) -> str:
    """A digest of the rendering modules' text (shipped beside finetune.py)."""
    digest = hashlib.sha256()
    for name in RENDERING_MODULES:
        path = folder / name
        digest.update(name.encode("utf-8") + b"\0" + (path.read_bytes() if path.is_file() else b"") + b"\0")
    return digest.hexdigest()


def fingerprint(parts: Mapping[str, Any]) -> str:
    """The folder's name: a digest of `parts` (JSON with sorted keys: the same settings give the same name)."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:FINGERPRINT_LENGTH]


# --- the folder ------------------------------------------------------------------------------------------------

def read_marker(folder: Path) -> dict[str, Any] | None:
    """The folder's marker (what was made, how long it took), or None where the folder is not complete."""
    try:
        marker = json.loads((folder / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def tokenized_marker_text(held: Mapping[str, Any], *, seconds: float, parts: Mapping[str, Any],
                          made: datetime.datetime) -> str:
    """MARKER_FILE: what the folder holds (`held`: records, samples, tokens, packing, heldOut), how long it took and
    what it was made from; written after the data."""
    return json.dumps({**held, "seconds": round(seconds, 1), "made": made.isoformat(timespec="seconds"),
                       "from": parts}, sort_keys=True, default=str) + "\n"


# --- the launcher's stamp: a restart's data step without transformers ---------------------------------------------
# The launcher's data step (--prepare-data) names the folder by the tokenizer's content, so it loads transformers and
# the tokenizer (about 10 CPU seconds) only to find, on every restart after a preemption, the folder it made before.
# Once the folder is complete it leaves a stamp named by what it can see without loading anything: the data files',
# the model folder's tokenizer files' and a chat template file's size and modification time, every argument, and the
# rendering code. A restart with the same stamp reuses that folder at once; any change (a file rewritten, another
# flag) misses the stamp and runs the whole step (the check, the tokenizer, the fingerprint) as before.
STAMPS_FOLDER = "launcher-stamps"
TOKENIZER_FILES = ("tokenizer", "special_tokens_map", "added_tokens", "chat_template", "vocab", "merges")


def _file_facts(path: Path) -> list[Any]:
    stat = path.stat()
    return [str(path), stat.st_size, stat.st_mtime_ns]


def launcher_stamp(args: Any, sources: Sequence[DataSource]) -> str | None:
    """The stamp of this data step's inputs, or None where they are not all files here (a hub model or dataset)."""
    model = Path(args.model) if getattr(args, "model", None) else None
    if model is None or not model.is_dir() or any(source.loader == "hub" for source in sources):
        return None
    tokenizer = [_file_facts(f) for f in sorted(model.iterdir()) if f.name.startswith(TOKENIZER_FILES)]
    arguments = {k: str(v) for k, v in sorted(vars(args).items())}
    # A template file's text decides the tokens; ds_config.json and the like do not (and a new pod's ConfigMap
    # files are new files: their times would miss the stamp at every restart).
    template = getattr(args, "chat_template", None)
    files = [_file_facts(Path(template))] if template and os.path.isfile(template) else []
    return fingerprint({"stamp": 1, "data": [source_identity(s) for s in sources], "tokenizer": tokenizer,
                        "arguments": arguments, "files": files, "code": code_identity(Path(__file__).parent)})


def stamped_folder(root: Path, stamp: str | None) -> tuple[Path, dict[str, Any]] | None:
    """The complete folder a stamp names, with its marker; None without a stamp or where the folder is gone."""
    if stamp is None:
        return None
    try:
        folder = root / (root / STAMPS_FOLDER / stamp).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    marker = read_marker(folder)
    return None if marker is None else (folder, marker)


def write_stamp(root: Path, stamp: str | None, folder: Path) -> None:
    """The stamp of a complete folder (written after its marker; a lost stamp only costs the whole step again)."""
    if stamp is not None:
        (root / STAMPS_FOLDER).mkdir(parents=True, exist_ok=True)
        (root / STAMPS_FOLDER / stamp).write_text(folder.name + "\n", encoding="utf-8")


def reused_line(folder: Path, marker: Mapping[str, Any]) -> str:
    return (f"tokenized data reused from {folder} ({marker.get('samples')} samples, {marker.get('tokens')} tokens, "
            f"{marker.get('packing')}; made {marker.get('made')} in {marker.get('seconds')} s)")


def made_line(folder: Path, records: int, samples: int, tokens: int, seconds: float) -> str:
    rate = f", {tokens / seconds:,.0f} tokens/s" if seconds > 0 else ""
    return (f"tokenized {records} records in {seconds:.1f} s ({samples} samples, {tokens} tokens{rate}) into "
            f"{folder}")
