"""finetune.py's data check: the first records read, recognised, validated and rendered as the ranks will train on
them, before any GPU works. The launcher runs it after waiting for the bucket's inputs (`finetune.py --check-data`):
a data error is final there (exit status 2, which the launcher remembers and does not retry), and names the stack's
key to change. The ranks run the same functions over every record (finetune.py).

Standard library only: the tokenizer is passed in (tests/test_finetune_data.py runs this with a stand-in,
tests/recipe with transformers').
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from recipes.finetune_config import StackKeys, UsageError
from recipes.finetune_data import FieldSpec, Layout, RecordError, kind_of, layout, sample
from recipes.finetune_render import Encoded, Rendering, choose, encode, learned_text, learns_something

MAX_PROBLEMS_SHOWN = 5  # the malformed records named one by one; the rest counted
ALL_PROBLEMS_SHOWN = 100  # where every record is read (make check-data): each named, up to this many


@dataclass(frozen=True)
class Plan:
    """How every record of the data set is read and rendered (settled from the flags, the first record and the
    tokenizer)."""

    layout: Layout
    data_kind: str  # finetune_data.kind_of: text | plain | chat
    rendering: Rendering


def plan(first: Mapping[str, Any], spec: FieldSpec, requested: str, own_template: str | None,
         named_template: str | None) -> Plan:
    """From the first record: its format and field names, and the rendering its kind of data gets."""
    lay = layout(spec, first)
    kind = kind_of(lay, sample(first, lay, 1))
    return Plan(lay, kind, choose(kind, requested, own_template, named_template))


@dataclass(frozen=True)
class Report:
    """What the check found in the records it read."""

    records: int
    plan: Plan
    first: Encoded | None  # the first record with something to learn, as trained
    first_number: int
    longer: int  # records longer than --seq-len (cut: what lies past it is not learned)
    nothing: int  # records with nothing to learn within --seq-len (dropped)
    blank: int  # text records with no text (skipped)


def encode_record(record: Mapping[str, Any], number: int, the_plan: Plan, tokenizer: Any,
                  seq_len: int) -> Encoded | None:
    """Record `number` (1-based) as trained, or None for a blank text record. RecordError if malformed."""
    found = sample(record, the_plan.layout, number)
    if found is None:
        return None
    if the_plan.data_kind == "plain" and found.chat_only:
        raise RecordError("--dataset", f"record {number}: its prompt and completion are lists of messages, but "
                          "record 1's are text: one form for the whole data set")
    return encode(found, tokenizer, the_plan.rendering, seq_len, number)


def at_line(error: RecordError, record: Any, number: int) -> RecordError:
    """`record N: ...` as `record N (line L): ...` for a record read from a JSON lines file."""
    line = getattr(record, "line", None)
    prefix = f"record {number}"
    if line is None or not error.text.startswith(prefix):
        return error
    return RecordError(error.flag, f"{prefix} (line {line}){error.text[len(prefix):]}")


def _problems_text(problems: Sequence[RecordError], records: int, keys: StackKeys, read_all: bool = False) -> str:
    shown = [f"  {p.named(keys)}" for p in problems[:ALL_PROBLEMS_SHOWN if read_all else MAX_PROBLEMS_SHOWN]]
    more = len(problems) - len(shown)
    return "\n".join([f"{len(problems)} of the {'' if read_all else 'first '}{records} records cannot be trained on:",
                      *shown,
                      *([f"  (and {more} more)"] if more else [])])


def _first_read(records: Sequence[Mapping[str, Any] | RecordError], keys: StackKeys) -> Mapping[str, Any]:
    """The first record that was read (a JSON line that is none is a RecordError in its place: first_records)."""
    read = [r for r in records if not isinstance(r, RecordError)]
    if not read:
        raise UsageError(_problems_text(list(records), len(records), keys) if records else
                         f"{keys.of('--dataset')}: no records")
    return read[0]


def check_fields(records: Sequence[Mapping[str, Any] | RecordError], spec: FieldSpec, keys: StackKeys,
                 read_all: bool = False) -> str:
    """The records' format and fields only (no tokenizer at hand): UsageError as `check`, or what was found."""
    problems: list[RecordError] = []
    try:
        lay = layout(spec, _first_read(records, keys))
    except RecordError as error:
        raise UsageError(error.named(keys)) from None
    for number, record in enumerate(records, start=1):
        try:
            if isinstance(record, RecordError):
                raise record
            sample(record, lay, number)
        except RecordError as error:
            problems.append(at_line(error, record, number))
    if problems:
        raise UsageError(_problems_text(problems, len(records), keys, read_all))
    return f"{len(records)} records read: {lay.format}, well formed (not rendered)"


def check(records: Sequence[Mapping[str, Any] | RecordError], spec: FieldSpec, tokenizer: Any, requested: str,
          named_template: str | None, seq_len: int, keys: StackKeys, read_all: bool = False) -> Report:
    """Every record read: UsageError naming the stack keys, listing the malformed records (the first few, then a
    count; `read_all`: the whole file was read, up to ALL_PROBLEMS_SHOWN named), or the report."""
    try:
        the_plan = plan(_first_read(records, keys), spec, requested, tokenizer.chat_template, named_template)
    except RecordError as error:
        raise UsageError(error.named(keys)) from None
    problems: list[RecordError] = []
    first, first_number, longer, nothing, blank = None, 0, 0, 0, 0
    for number, record in enumerate(records, start=1):
        try:
            if isinstance(record, RecordError):
                raise record
            encoded = encode_record(record, number, the_plan, tokenizer, seq_len)
        except RecordError as error:
            problems.append(at_line(error, record, number))
            continue
        if encoded is None:
            blank += 1
            continue
        longer += encoded.length > seq_len
        if not learns_something(encoded.as_columns()):
            nothing += 1
        elif first is None:
            first, first_number = encoded, number
    if problems:
        raise UsageError(_problems_text(problems, len(records), keys, read_all))
    if first is None:
        raise UsageError(f"{keys.of('--seq-len')}: none of the first {len(records)} records has anything to learn "
                         f"within {seq_len} tokens: raise it, or shorten the prompts")
    return Report(len(records), the_plan, first, first_number, longer, nothing, blank)


def report_lines(report: Report, tokenizer: Any, seq_len: int, keys: StackKeys) -> list[str]:
    """What the check prints: the format, the rendering, the counts, and the first record as trained."""
    lay = report.plan.layout
    fields = {"text": lay.text, "prompt-completion": f"{lay.prompt}/{lay.completion}",
              "alpaca": "instruction/input/output"}.get(lay.format, f"{lay.messages} ({lay.role}/{lay.content})")
    lines = [f"{report.records} records read: {lay.format} ({fields}); {report.plan.rendering.describe()}"]
    if report.longer:
        lines.append(f"{report.longer} of {report.records} records are longer than {seq_len} tokens "
                     f"({keys.of('--seq-len')}): cut there, what lies past it is not learned")
    else:
        lines.append(f"none is longer than {seq_len} tokens ({keys.of('--seq-len')})")
    if report.nothing:
        lines.append(f"{report.nothing} of {report.records} records have nothing to learn within {seq_len} tokens "
                     "and are left out")
    if report.blank:
        lines.append(f"{report.blank} of {report.records} text records are blank and are left out")
    if report.first is not None:
        lines.append(f"record {report.first_number} as trained ([[learned]]): "
                     f"{learned_text(tokenizer, report.first)!r}")
    return lines
