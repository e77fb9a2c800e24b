"""finetune.py's readers: the first records of a data set, read as `datasets` reads the whole of it (the launcher's
data check, before the GPUs; the ranks load every record with `datasets` itself). A JSON lines file is read line by
line, so that the check can name each line that is no record and go on (make check-data reads a whole file).

Standard library only at the top (pyarrow for parquet and `datasets` for a hub id are imported where used).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from recipes.finetune_config import UsageError
from recipes.finetune_data import CHECK_RECORDS, DataSource, RecordError


class LineRecord(dict):  # type: ignore[type-arg]
    """A record of a JSON lines file with the line it was read from: the data check names it beside the record's
    number, which counts records (a blank line is none)."""

    def __init__(self, record: Mapping[str, Any], line: int) -> None:
        super().__init__(record)
        self.line = line


def _json_records(path: str, keep_broken: bool = False) -> Iterator[dict[str, Any] | RecordError]:
    """A JSON lines file's records, or a JSON file's (one array of records, as alpaca_data.json is), in order.
    `keep_broken`: a line that is not a JSON object comes as its RecordError in its place, and the reading goes on
    (the data check names every such line; the ranks' reader stops at the first)."""
    with open(path, encoding="utf-8") as stream:
        head = stream.read(1)
        while head.isspace():
            head = stream.read(1)
        stream.seek(0)
        if head == "[":
            try:
                records = json.load(stream)
            except json.JSONDecodeError as error:
                raise RecordError("--dataset", f"{path} is not JSON ({error})") from None
            yield from (r if isinstance(r, dict) else {"": r} for r in records)
            return
        for number, line in enumerate(stream, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line.rstrip("\r\n"))  # else a cut-off string ends in a 'control character'
            except json.JSONDecodeError as error:
                broken = RecordError("--dataset", f"{path} line {number} is not JSON ({error.msg}, column "
                                     f"{error.colno})")
            else:
                if isinstance(record, dict):
                    yield LineRecord(record, line=number) if keep_broken else record
                    continue
                broken = RecordError("--dataset", f"{path} line {number} is a JSON {type(record).__name__}, not "
                                     "an object of fields")
            if not keep_broken:
                raise broken
            yield broken


def _parquet_records(path: str, limit: int) -> Iterator[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq  # the image's, with `datasets`
    except ModuleNotFoundError:  # a laptop's data check (make check-data) without pyarrow
        raise UsageError(f"--dataset {path}: reading parquet needs pyarrow, which this python lacks (pip install "
                         "pyarrow; the image has it)") from None

    for batch in pq.ParquetFile(path).iter_batches(batch_size=limit):
        yield from batch.to_pylist()


def _text_records(path: str) -> Iterator[dict[str, Any]]:
    """A text file's lines as `datasets`' text loader reads them: each line a record with the field `text`."""
    with open(path, encoding="utf-8") as stream:
        for line in stream:
            yield {"text": line.rstrip("\n")}


def first_records(source: DataSource, limit: int | None = CHECK_RECORDS, token: str | None = None,
                  keep_broken: bool = False) -> list[Any]:
    """The first `limit` records (None: all), read as the whole data set would be (the launcher's check, before the
    GPUs). `keep_broken`: a JSON line that is no record is its RecordError in the list (_json_records)."""
    if source.loader == "hub":
        import datasets

        stream = datasets.load_dataset(source.hub_id, split="train", streaming=True, token=token)
        return [dict(r) for r in itertools.islice(stream, limit)]
    readers = {"json": lambda f: _json_records(f, keep_broken), "text": _text_records}
    records: Iterable[dict[str, Any]] = itertools.chain.from_iterable(
        readers[source.loader](f) if source.loader in readers else _parquet_records(f, limit or 10_000)
        for f in source.files)
    return list(itertools.islice(records, limit))
