"""finetune.py's data preparation: the first record's plan (`read_head`), the launcher's data check and tokenizing
step (`check_data`, `prepare_data`), and the tokenized folder every rank memory-maps (`tokenized_datasets`: made
once, reused on every restart), with the collator that batches it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from recipes.finetune_args import FIELD_FLAGS, Run
from recipes.finetune_check import Plan, check, check_fields, encode_record, plan, report_lines
from recipes.finetune_config import (
    StackKeys,
    UsageError,
    say,
)
from recipes.finetune_data import (
    DataSource,
    RecordError,
)
from recipes.finetune_hpu import (
    hpu_run,
    padding_free_problem,
    token_ids_feature,
)
from recipes.finetune_read import first_records
from recipes.finetune_render import (
    IGNORE_INDEX,
    Encoded,
    learns_something,
    pad_batch,
)
from recipes.finetune_tokenized import (
    BLOCKS,
    EVAL,
    MARKER_FILE,
    PADDING_FREE,
    TOKENIZED_FOLDER,
    TRAIN,
    code_identity,
    describe,
    fingerprint,
    launcher_stamp,
    made_line,
    pack_blocks,
    packing_for,
    read_marker,
    reused_line,
    source_identity,
    stamped_folder,
    this_host_procs,
    tokenized_marker_text,
    tokenizer_identity,
    write_stamp,
)

SAMPLE_FILE = "rendered-sample.json"  # in CHECKPOINT_DIR: the first record as trained


def load_records(source: DataSource, token: str | None, what: str, cache: str | None = None) -> Any:
    """The whole data set (`datasets`, its train split), or UsageError naming `what` (--dataset, --eval-split)."""
    import datasets

    try:
        if source.loader == "hub":
            return datasets.load_dataset(source.hub_id, split="train", token=token)
        # The Arrow cache on this host's own disk: not shared between hosts (their locks would race) nor on the
        # bucket's FUSE mount (no file locks there).
        cache = cache or tempfile.mkdtemp(prefix="finetune-data-")
        return datasets.load_dataset(source.loader, data_files=list(source.files), split="train", cache_dir=cache)
    except (ValueError, TypeError, datasets.exceptions.DatasetGenerationError) as error:
        # A file Arrow cannot read as one table (a line that is not JSON, a field of two types, ...).
        cause = error.__cause__ or error
        raise UsageError(f"{what}: cannot read the records ({type(cause).__name__}: {cause})") from None


def encode_records(data: Any, the_plan: Plan, tokenizer: Any, seq_len: int | None, keys: StackKeys, what: str) -> Any:
    """Every record as trained (finetune_check.encode_record), ids and labels as int32 (half of Python's int64 on
    disk: 8 bytes a token); the samples with nothing to learn left out. seq_len None: not cut (packed into blocks
    after)."""
    import datasets

    cut = sys.maxsize if seq_len is None else seq_len

    def encode(record: dict[str, Any], index: int) -> dict[str, Any]:
        try:
            encoded = encode_record(record, index + 1, the_plan, tokenizer, cut)
        except RecordError as error:
            raise UsageError(error.named(keys)) from None
        if encoded is None:  # a blank text record
            return {"input_ids": [], "labels": [], "length": 0}
        return {"input_ids": encoded.input_ids, "labels": encoded.labels, "length": encoded.length}

    ids = token_ids_feature(datasets)  # datasets' own List or, before 4.0 (the Gaudi image's), Sequence
    features = datasets.Features({"input_ids": ids, "labels": ids, "length": datasets.Value("int64")})
    cpus, procs = this_host_procs()
    # One process a usable CPU (finetune_tokenized.data_procs): on a GPU worker's 100-200 CPUs the step takes
    # minutes, not hours. `datasets` brings a failing record's UsageError back from its process.
    say(f"tokenizing {what} in {procs} process{'es' if procs > 1 else ''} ({cpus} CPUs usable here)")
    encoded = data.map(encode, with_indices=True, remove_columns=list(data.column_names), features=features,
                       desc=f"tokenize {what}", num_proc=procs if procs > 1 else None)
    longer = 0 if seq_len is None else sum(1 for length in encoded["length"] if length > seq_len)
    kept = encoded.filter(learns_something).remove_columns(["length"])
    if len(kept) == 0:
        raise UsageError(f"{keys.of('--seq-len')}: no record of {what} has anything to learn within {cut} tokens")
    cut_said = "" if seq_len is None else f" ({longer} longer than {seq_len} tokens, cut;"
    say(f"{what}: {len(kept)} samples of {len(data)} records{cut_said or ' ('}"
        f"{' ' if cut_said else ''}{len(data) - len(kept)} with nothing to learn, left out)")
    return kept


def blocks_of(encoded: Any, seq_len: int, cache: str) -> Any:
    """Text samples packed (finetune_tokenized.pack_blocks), written by `datasets` as they come: memory holds one
    block and one batch of documents, whatever the data's size. Text learns every token: the labels are the ids
    (the collator's), so only the ids are kept."""
    import datasets

    def documents() -> Iterator[list[int]]:
        for batch in encoded.iter(batch_size=1000):
            yield from batch["input_ids"]

    def blocks() -> Iterator[dict[str, list[int]]]:
        for block in pack_blocks(documents(), seq_len):
            yield {"input_ids": block}

    features = datasets.Features({"input_ids": token_ids_feature(datasets)})
    return datasets.Dataset.from_generator(blocks, features=features, cache_dir=cache)


class Head(NamedTuple):
    """What the first record settles for the whole run: how records are read and rendered, the first as trained,
    the packing, and the named chat template (None: the model's own or none)."""

    plan: Plan
    first: Encoded | None
    packing: str
    named: str | None


def read_head(run: Run, tokenizer: Any, token: str | None, keys: StackKeys) -> Head:
    """The first record read (without loading the whole data set), its plan and rendering. The tokenizer gets
    the named chat template afterwards, so the export saves the template the model was trained with."""
    args, named = run.args, run.template
    try:
        head = first_records(run.source, 1, token)
        if not head:
            raise UsageError(f"{keys.of('--dataset')}: no records")
        the_plan = plan(head[0], run.fields, args.chat_template, tokenizer.chat_template, named)
        first = encode_record(head[0], 1, the_plan, tokenizer, args.seq_len)
    except RecordError as error:
        raise UsageError(error.named(keys)) from None
    packing = packing_for(args.packing, the_plan.data_kind)
    if packing == PADDING_FREE:
        import transformers

        problem = padding_free_problem(transformers.__version__, hpu_run(os.environ))
        if problem:
            raise UsageError(f"{keys.of('--packing')}: {problem}")
    return Head(the_plan, first, packing, named)


def tokenized_root(args: argparse.Namespace) -> Path:
    return Path(args.tokenized_dir) if args.tokenized_dir else Path(args.checkpoint_dir) / TOKENIZED_FOLDER


def fingerprint_parts(args: argparse.Namespace, source: DataSource, tokenizer: Any, head: Head,
                      data_fingerprint: str | None) -> dict[str, Any]:
    """Everything that decides the tokenized data (finetune_tokenized.py): its folder's name."""
    identity = source_identity(source)
    if data_fingerprint is not None:
        identity["datasets"] = data_fingerprint
    return {"data": identity, "tokenizer": tokenizer_identity(tokenizer), "records": args.records,
            "fields": [getattr(args, name) for name in FIELD_FLAGS], "format": args.format,
            "chatTemplate": args.chat_template, "namedTemplate": head.named, "seqLen": args.seq_len,
            "packing": head.packing, "evalSplit": args.eval_split, "seed": args.seed,
            "code": code_identity(Path(__file__).resolve().parent)}


def tokenized_datasets(run: Run, tokenizer: Any, token: str | None, keys: StackKeys, head: Head,
                       talk: bool = True, load: bool = True, stamp: str | None = None) -> tuple[Any, Any]:
    """(train, eval or None): the tokenized folder of these settings memory-mapped where it is complete; else the
    records read, rendered, split and packed, saved there (the marker last) and memory-mapped. `datasets` is
    imported only to make or read the folder: the launcher's step on a restart finds it complete and stops there."""
    args, source = run.args, run.source
    data = None
    if source.loader == "hub":  # a hub dataset's id does not name its revision: its download's fingerprint does
        data = load_records(source, token, keys.of("--dataset"))
    parts = fingerprint_parts(args, source, tokenizer, head, None if data is None else data._fingerprint)
    if head.named is not None:
        tokenizer.chat_template = head.named
    folder = tokenized_root(args) / fingerprint(parts)
    marker = read_marker(folder)
    if marker is None:
        started = time.monotonic()
        marker = make_tokenized(run, head, tokenizer, token, keys, data, folder, parts)
        say(made_line(folder, marker["records"], marker["samples"], marker["tokens"], time.monotonic() - started))
    elif talk:
        say(reused_line(folder, marker))
    write_stamp(tokenized_root(args), stamp, folder)  # the launcher's (finetune_tokenized.launcher_stamp)
    if not load:
        return None, None
    import datasets

    train = datasets.load_from_disk(str(folder / TRAIN))
    held_out = datasets.load_from_disk(str(folder / EVAL)) if marker.get("heldOut") is not None else None
    return train, held_out


def make_tokenized(run: Run, head: Head, tokenizer: Any, token: str | None, keys: StackKeys,
                   data: Any, folder: Path, parts: dict[str, Any]) -> dict[str, Any]:
    """Every record read, split, rendered and packed; saved into `folder` with `datasets`' save_to_disk, then the
    marker, last. The working copies go into a temporary folder of this host's disk, removed afterwards."""
    args = run.args
    cache = tempfile.mkdtemp(prefix="finetune-data-")
    started = time.monotonic()
    try:
        if data is None:
            data = load_records(run.source, token, keys.of("--dataset"), cache)
        if len(data) == 0:
            raise UsageError(f"{keys.of('--dataset')}: no records")
        records = len(data)
        held_out = None
        if isinstance(run.held_out, float):
            split = data.train_test_split(test_size=run.held_out, seed=args.seed)
            data, held_out = split["train"], split["test"]
        elif run.held_out is not None:
            held_out = load_records(run.held_out, token, keys.of("--eval-split"), cache)
        seq_len = None if head.packing == BLOCKS else args.seq_len
        train = encode_records(data, head.plan, tokenizer, seq_len, keys, "the training records")
        evaluation = (None if held_out is None
                      else encode_records(held_out, head.plan, tokenizer, seq_len, keys, "the held-out records"))
        if head.packing == BLOCKS:
            train = blocks_of(train, args.seq_len, cache)
            evaluation = None if evaluation is None else blocks_of(evaluation, args.seq_len, cache)
        folder.mkdir(parents=True, exist_ok=True)
        train.save_to_disk(str(folder / TRAIN))
        if evaluation is not None:
            evaluation.save_to_disk(str(folder / EVAL))
        tokens = sum(len(ids) for batch in train.iter(batch_size=1000) for ids in batch["input_ids"])
        marker = {"records": records, "samples": len(train), "tokens": tokens, "packing": head.packing,
                  "heldOut": None if evaluation is None else len(evaluation)}
        (folder / MARKER_FILE).write_text(tokenized_marker_text(
            marker, seconds=time.monotonic() - started, parts=parts, made=datetime.datetime.now(datetime.timezone.utc)),
            encoding="utf-8")
        return marker
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def write_sample(checkpoint_dir: str, first: Any, tokenizer: Any) -> None:
    """CHECKPOINT_DIR/rendered-sample.json: the first record as the ranks train on it (make e2e compares it with
    the tokenizer's own rendering; a person reads what the model learns)."""
    path = Path(checkpoint_dir) / SAMPLE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    learned = [t for t, label in zip(first.input_ids, first.labels, strict=True) if label != -100]
    path.write_text(json.dumps({"record": 1, "input_ids": first.input_ids,
                                "labels": first.labels, "text": tokenizer.decode(first.input_ids),
                                "learned": tokenizer.decode(learned)}, indent=1) + "\n", encoding="utf-8")


def check_data(run: Run, token: str | None, keys: StackKeys) -> Any:
    """--check-data: the first records (and the held-out file's) read, checked and rendered as the ranks will;
    what was found printed; the tokenizer, or None where it cannot be loaded here. A data error is a UsageError
    (exit 2, final at the launcher)."""
    args, named = run.args, run.template
    sources = [("--dataset", run.source)]
    if run.held_out_source is not None:
        sources.append(("--eval-split", run.held_out_source))
    tokenizer = check_tokenizer(args, token, keys)
    limit, read_all = args.check_records or None, not args.check_records
    for flag, source in sources:
        try:
            records = first_records(source, limit, token, keep_broken=True)
        except RecordError as error:
            raise UsageError(error.named(keys)) from None
        if tokenizer is None:
            say(f"data check, {keys.of(flag)}: {check_fields(records, run.fields, keys, read_all)}")
            continue
        report = check(records, run.fields, tokenizer, args.chat_template, named, args.seq_len, keys,
                       read_all)
        first, *rest = report_lines(report, tokenizer, args.seq_len, keys)
        say(f"data check, {keys.of(flag)}: {first}")
        for line in rest:
            say(f"  {line}")
    return tokenizer


def check_tokenizer(args: argparse.Namespace, token: str | None, keys: StackKeys) -> Any:
    """The model's tokenizer for the data check, or None (the fields are then checked without rendering): no
    --model given, transformers not installed here (a laptop), or a hub model that cannot be fetched now."""
    if not args.model:
        say("no --model: the records' formats and fields are checked, not rendered (give the model, a local "
            "folder or a Hugging Face id in this machine's cache, for the first record as trained)")
        return None
    try:
        return load_tokenizer(args.model, token)
    except ModuleNotFoundError as error:
        say(f"{error.name} is not installed in this python: the records' fields are checked without rendering them "
            "(`make check-data` installs it)")
    except OSError as error:
        if Path(args.model).exists():  # the bucket's folder: no restart brings its tokenizer
            raise UsageError(f"{keys.of('--model')}: cannot load its tokenizer ({error})") from None
        if os.environ.get("HF_HUB_OFFLINE") == "1":  # make check-data: nothing is downloaded there
            raise UsageError(f"{keys.of('--model')}: {args.model} is neither a local folder nor in this machine's "
                             "Hugging Face cache, and nothing is downloaded here (HF_HUB_OFFLINE=1): give a local "
                             "folder, or download the model first (`hf download MODEL`)") from None
        # A hub model the launcher cannot fetch now (the network, the hub): the ranks will try again.
        say(f"the tokenizer of {args.model} cannot be loaded here ({error}): the records' fields are checked "
            "without rendering them")
    return None


def prepare_data(run: Run, token: str | None, keys: StackKeys) -> int:
    """--prepare-data: the check, then the tokenized folder made (or found): the ranks then only memory-map it. A
    restart with the same inputs finds the folder by the launcher's stamp, without loading the tokenizer."""
    root = tokenized_root(run.args)
    stamp = launcher_stamp(run.args, [s for s in (run.source, run.held_out_source) if s is not None])
    found = stamped_folder(root, stamp)
    if found is not None:
        say(f"{reused_line(*found)}; the same files and flags as when it was checked and made (its stamp)")
        return 0
    tokenizer = check_data(run, token, keys)
    if tokenizer is None:
        say("the ranks tokenize the data (rank 0 first, the others wait)")
        return 0
    head = read_head(run, tokenizer, token, keys)
    say(f"records: {head.plan.layout.format}; {describe(head.packing, run.args.seq_len)}")
    tokenized_datasets(run, tokenizer, token, keys, head, load=False, stamp=stamp)
    return 0


def load_tokenizer(model: str, token: str | None) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model, token=token)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def padding_free_line(examples: Sequence[Mapping[str, Sequence[int]]], row: int) -> str:
    longest = max(len(e["input_ids"]) for e in examples)
    return (f"padding-free batch: {len(examples)} records in one row of {row} tokens (padded, "
            f"{len(examples)} x {longest} = {len(examples) * longest})")


def collator(pad_id: int, packing: str) -> Any:
    """Padding-free: transformers' DataCollatorWithFlattening (a micro batch's records in one row, position ids
    restarting at each, the first label of each masked); else right-padded to the longest sample (text blocks are
    all full but the last)."""
    if packing == PADDING_FREE:
        from transformers import DataCollatorWithFlattening

        flatten = DataCollatorWithFlattening(return_position_ids=True, separator_id=IGNORE_INDEX)
        said: list[bool] = []

        def flattened(examples: list[dict[str, list[int]]]) -> dict[str, Any]:
            batch = flatten(examples)
            if not said:  # the first batch, as the model gets it (the log shows the packing at work)
                said.append(True)
                say(padding_free_line(examples, int(batch["input_ids"].shape[-1])))
            return batch

        return flattened
    import torch

    def collate(examples: list[dict[str, list[int]]]) -> dict[str, Any]:
        return {k: torch.tensor(v) for k, v in pad_batch(examples, pad_id).items()}

    return collate
