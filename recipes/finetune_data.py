"""finetune.py's data: where the records are, which of the formats people bring they are in, and each record as one
of TRL's standard forms (SFTTrainer's dataset types): text to learn whole, a prompt with its completion (plain text,
or lists of messages), or a conversation. finetune_render.py turns a form into tokens and labels.

Record formats (--records; the stack's `finetune.recordFormat`), with the fields each reads:
- `text`: {"text": "..."} (--text-field): language modeling, every token learned.
- `prompt-completion`: {"prompt": ..., "completion": ...} (--prompt-field, --response-field): both text (TRL's plain
  prompt-completion, the stack's prompt/response) or both lists of messages (TRL's conversational
  prompt-completion); the completion is learned.
- `messages`: {"messages": [{"role": "system" | "user" | "assistant", "content": "..."}, ...]}: OpenAI's chat
  format and TRL's conversational language modeling, one or many turns; every assistant turn is learned.
- `alpaca`: {"instruction": ..., "input": ... (may be empty or absent), "output": ...} (tatsu-lab/stanford_alpaca's
  alpaca_data.json); the output is learned.
- `sharegpt`: {"conversations": [{"from": "system" | "human" | "gpt", "value": "..."}, ...]}: `messages` under
  other names.
- `auto`: the first record's fields decide, in that order: messages, conversations, instruction + output, prompt +
  completion, text; a field flag given (--messages-field, --prompt-field, --text-field) decides before them.

Field mapping, as axolotl's `field_messages` and `message_property_mappings`: --messages-field names the list,
--role-field and --content-field a message's keys, --roles NAME=ROLE maps the data's role names onto system, user
and assistant (sharegpt's human and gpt are mapped already).

Every malformed record is a RecordError naming the flag whose stack key a person changes (finetune_config.StackKeys
turns it into `workloads.<name>.finetune.<key>`), with the record's number: the launcher's data check reads the first
records and the ranks read them all, and either stops with exit status 2, which the launcher does not retry.

Standard library only at the top: the stack and the unit tests import this module without `datasets`, which is
imported inside the functions that load a whole data set.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recipes.contract import CHECK_RECORDS, FORMATS, RECORD_FORMATS  # noqa: F401 (this module's names too)
from recipes.finetune_config import StackKeys, UsageError

# File name endings of each format (a folder's files decide its format).
SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".txt": "text", ".text": "text"}
# The loader `datasets.load_dataset` names for each format.
LOADERS = {"jsonl": "json", "parquet": "parquet", "text": "text"}
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")

CHAT_ROLES = ("system", "user", "assistant")
# ShareGPT's role names (FastChat's conversation files, which named the format), as axolotl maps them by default.
SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "system": "system", "user": "user", "assistant": "assistant"}
# The prompts of Stanford Alpaca (tatsu-lab/stanford_alpaca train.py PROMPT_DICT), the format raw alpaca records are
# trained in: the output follows "### Response:" directly, then EOS.
ALPACA_PROMPT = ("Below is an instruction that describes a task, paired with an input that provides further context. "
                 "Write a response that appropriately completes the request.\n\n"
                 "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:")
ALPACA_PROMPT_NO_INPUT = ("Below is an instruction that describes a task. "
                          "Write a response that appropriately completes the request.\n\n"
                          "### Instruction:\n{instruction}\n\n### Response:")


class RecordError(ValueError):
    """A malformed record: `flag` is the setting to change (its stack key is named), `text` says what and where."""

    def __init__(self, flag: str, text: str) -> None:
        super().__init__(text)
        self.flag, self.text = flag, text

    def named(self, keys: StackKeys) -> str:
        return f"{keys.of(self.flag)}: {self.text}"


# --- where the records are -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class DataSource:
    """Where the records come from: `datasets.load_dataset(loader, data_files=files)` or a hub id."""

    loader: str  # json | parquet | text | hub
    files: tuple[str, ...] = ()
    hub_id: str | None = None


def data_source(dataset: str, fmt: str = "auto") -> DataSource:
    """The format of a file or folder (by suffix unless --format says), or a Hugging Face dataset id."""
    path = Path(dataset)
    if path.is_dir():
        files = sorted(str(p) for p in path.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        if not files:
            raise UsageError(f"--dataset {dataset}: no {', '.join(SUFFIXES)} files in the folder")
        kinds = sorted({SUFFIXES[Path(f).suffix.lower()] for f in files})
        if fmt == "auto" and len(kinds) > 1:
            raise UsageError(f"--dataset {dataset}: the folder mixes formats ({', '.join(kinds)}): give --format "
                             "or keep one kind of file")
        kind = kinds[0] if fmt == "auto" else fmt
        if fmt != "auto":
            files = [f for f in files if SUFFIXES[Path(f).suffix.lower()] == fmt]
            if not files:
                raise UsageError(f"--dataset {dataset}: no {fmt} files in the folder (found {', '.join(kinds)})")
        return DataSource(LOADERS[kind], tuple(files))
    if path.is_file():
        kind = SUFFIXES.get(path.suffix.lower()) if fmt == "auto" else fmt
        if kind is None:
            raise UsageError(f"--dataset {dataset}: unknown suffix {path.suffix!r}: give --format "
                             f"({', '.join(FORMATS[1:])})")
        return DataSource(LOADERS[kind], (str(path),))
    if dataset.startswith(("/", "./", "../")) or not HUB_ID.match(dataset):
        raise UsageError(f"--dataset {dataset}: no such file or folder (and not a Hugging Face dataset id)")
    return DataSource("hub", hub_id=dataset)


# --- which format, under which field names -------------------------------------------------------------------

@dataclass(frozen=True)
class FieldSpec:
    """What the flags say: the record format and the field names given (None: the format's own)."""

    format: str = "auto"
    text_field: str | None = None
    prompt_field: str | None = None
    completion_field: str | None = None
    messages_field: str | None = None
    role_field: str | None = None
    content_field: str | None = None
    roles: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Layout:
    """A record format with its field names settled: how every record of the data set is read."""

    format: str
    text: str = "text"
    prompt: str = "prompt"
    completion: str = "completion"
    messages: str = "messages"
    role: str = "role"
    content: str = "content"
    roles: Mapping[str, str] = field(default_factory=dict)  # the data's role name -> system | user | assistant


def parse_roles(pairs: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """--roles NAME=ROLE ...: the mapping, and what is wrong with it."""
    roles, problems = {}, []
    for pair in pairs:
        name, sep, role = pair.partition("=")
        if not sep or not name or role not in CHAT_ROLES:
            problems.append(f"--roles {pair!r}: expected NAME=ROLE with ROLE one of {', '.join(CHAT_ROLES)}")
        else:
            roles[name] = role
    return roles, problems


def _fields_of(record: Mapping[str, Any]) -> str:
    return ", ".join(sorted(record)) or "none"


def _first_message(value: Any) -> Mapping[str, Any]:
    return value[0] if isinstance(value, list) and value and isinstance(value[0], Mapping) else {}


def detect_format(spec: FieldSpec, record: Mapping[str, Any]) -> str:
    """The record format: --records, else the field flag given, else the first record's fields (TRL decides its
    dataset type from the first example too)."""
    if spec.format != "auto":
        return spec.format
    if spec.messages_field:
        return "sharegpt" if "from" in _first_message(record.get(spec.messages_field)) else "messages"
    if spec.prompt_field:
        return "prompt-completion"
    if spec.text_field:
        return "text"
    if "messages" in record:
        return "messages"
    if "conversations" in record:
        return "sharegpt" if "from" in _first_message(record["conversations"]) else "messages"
    if "instruction" in record and "output" in record:
        return "alpaca"
    if "prompt" in record and "completion" in record:
        return "prompt-completion"
    if "text" in record:
        return "text"
    raise RecordError("--records", f"record 1 has the fields {_fields_of(record)}: none of a known format (messages, "
                      "conversations, instruction + output, prompt + completion, text); set it and the field names")


def layout(spec: FieldSpec, record: Mapping[str, Any]) -> Layout:
    """How every record is read, settled from the flags and the first record."""
    fmt = detect_format(spec, record)
    if fmt == "sharegpt":
        messages = spec.messages_field or "conversations"
        roles = {**SHAREGPT_ROLES, **spec.roles}
        return Layout(fmt, messages=messages, role=spec.role_field or "from", content=spec.content_field or "value",
                      roles=roles)
    if fmt == "messages":
        messages = spec.messages_field or ("messages" if "messages" in record or "conversations" not in record
                                           else "conversations")
        return Layout(fmt, messages=messages, role=spec.role_field or "role", content=spec.content_field or "content",
                      roles={**{r: r for r in CHAT_ROLES}, **spec.roles})
    return Layout(fmt, text=spec.text_field or "text", prompt=spec.prompt_field or "prompt",
                  completion=spec.completion_field or "completion", role=spec.role_field or "role",
                  content=spec.content_field or "content", roles={**{r: r for r in CHAT_ROLES}, **spec.roles})


# --- each record as one of TRL's forms -----------------------------------------------------------------------

@dataclass(frozen=True)
class Sample:
    """One record in TRL's standard forms. Raw: `text` (language modeling, learned whole) or `prompt` + `completion`
    (the completion learned). As a chat: `messages`, every assistant turn learned; with `completion_from`, TRL's
    conversational prompt-completion, messages[completion_from:] are the completion, learned whole. A plain
    prompt-completion or alpaca record has both forms (finetune_render.py picks one); a conversation only the chat
    one."""

    text: str | None = None
    prompt: str | None = None
    completion: str | None = None
    messages: tuple[Mapping[str, str], ...] = ()
    completion_from: int | None = None

    @property
    def chat_only(self) -> bool:
        return self.text is None and self.prompt is None


def kind_of(lay: Layout, first: Sample | None) -> str:
    """What the data needs of the rendering: `text` (never a chat template), `plain` (a chat template when the model
    has one, else raw) or `chat` (a chat template, always)."""
    if lay.format == "text":
        return "text"
    if lay.format in ("messages", "sharegpt") or (first is not None and first.chat_only):
        return "chat"
    return "plain"


def _field(record: Mapping[str, Any], name: str, flag: str, number: int, what: str) -> Any:
    if name not in record or record[name] is None:
        raise RecordError(flag, f"record {number} has no field {name!r} ({what}; it has {_fields_of(record)})")
    return record[name]


def _text(value: Any, flag: str, number: int, name: str) -> str:
    if not isinstance(value, str):
        raise RecordError(flag, f"record {number}: {name!r} is a {type(value).__name__}, not text")
    return value


def _message(value: Any, lay: Layout, number: int, index: int) -> dict[str, str]:
    where = f"record {number}, message {index + 1}"
    if not isinstance(value, Mapping):
        raise RecordError("--dataset", f"{where} is a {type(value).__name__}, not an object with {lay.role!r} and "
                          f"{lay.content!r}")
    if value.get(lay.role) is None:
        raise RecordError("--role-field", f"{where} has no {lay.role!r} (it has {_fields_of(value)}): name the key "
                          "that holds the role")
    if lay.content not in value:
        raise RecordError("--content-field", f"{where} has no {lay.content!r} (it has {_fields_of(value)}): name the "
                          "key that holds the text")
    role = lay.roles.get(str(value[lay.role]))
    if role is None:
        raise RecordError("--roles", f"{where} has the role {value[lay.role]!r}: map it onto system, user or "
                          f"assistant (NAME=ROLE; known: {', '.join(sorted(lay.roles))})")
    content = value[lay.content]
    if not isinstance(content, str):
        kind = "nothing" if content is None else f"a {type(content).__name__}"
        raise RecordError("--dataset", f"{where} ({role}) holds {kind}, not text: only text turns are trained "
                          "(no images, tool calls or content parts)")
    if role == "assistant" and not content.strip():
        raise RecordError("--dataset", f"{where} is an empty assistant turn: the model would learn to answer "
                          "nothing; fill it or remove the turn")
    return {"role": role, "content": content}


def _messages(value: Any, lay: Layout, number: int, name: str, *, start: int = 0) -> list[dict[str, str]]:
    if not isinstance(value, list):
        raise RecordError("--dataset", f"record {number}: {name!r} is a {type(value).__name__}, not a list of "
                          "messages")
    if not value:
        raise RecordError("--dataset", f"record {number}: {name!r} is an empty list of messages")
    return [_message(m, lay, number, start + i) for i, m in enumerate(value)]


def _has_assistant(messages: Sequence[Mapping[str, str]], number: int, where: str) -> None:
    if not any(m["role"] == "assistant" for m in messages):
        raise RecordError("--dataset", f"record {number}: {where} has no assistant turn, so nothing to learn")


def _conversation(record: Mapping[str, Any], lay: Layout, number: int) -> Sample:
    value = _field(record, lay.messages, "--messages-field", number, "the conversation")
    messages = _messages(value, lay, number, lay.messages)
    _has_assistant(messages, number, f"{lay.messages!r}")
    return Sample(messages=tuple(messages))


def _prompt_completion(record: Mapping[str, Any], lay: Layout, number: int) -> Sample:
    prompt = _field(record, lay.prompt, "--prompt-field", number, "the prompt")
    completion = _field(record, lay.completion, "--response-field", number, "what is learned")
    if isinstance(prompt, str) and isinstance(completion, str):
        if not completion.strip():
            raise RecordError("--dataset", f"record {number}: {lay.completion!r} is empty: the model would learn to "
                              "answer nothing")
        return Sample(prompt=prompt, completion=completion, messages=(
            {"role": "user", "content": prompt}, {"role": "assistant", "content": completion}))
    if isinstance(prompt, list) and isinstance(completion, list):
        asked = _messages(prompt, lay, number, lay.prompt)
        answered = _messages(completion, lay, number, lay.completion, start=len(asked))
        _has_assistant(answered, number, f"{lay.completion!r}")
        return Sample(messages=(*asked, *answered), completion_from=len(asked))
    raise RecordError("--dataset", f"record {number}: {lay.prompt!r} is a {type(prompt).__name__} and "
                      f"{lay.completion!r} a {type(completion).__name__}: both text, or both lists of messages")


def _alpaca(record: Mapping[str, Any], number: int) -> Sample:
    instruction = _text(_field(record, "instruction", "--records", number, "alpaca's instruction"), "--dataset",
                        number, "instruction")
    given = record.get("input")
    context = "" if given is None else _text(given, "--dataset", number, "input")
    output = _text(_field(record, "output", "--records", number, "alpaca's output"), "--dataset", number, "output")
    if not instruction.strip():
        raise RecordError("--dataset", f"record {number}: 'instruction' is empty")
    if not output.strip():
        raise RecordError("--dataset", f"record {number}: 'output' is empty: the model would learn to answer nothing")
    # As a chat: LLaMA-Factory's alpaca converter (the user turn is the instruction, then the input, a line apart).
    user = f"{instruction}\n{context}" if context.strip() else instruction
    prompt = (ALPACA_PROMPT.format(instruction=instruction, input=context) if context.strip()
              else ALPACA_PROMPT_NO_INPUT.format(instruction=instruction))
    return Sample(prompt=prompt, completion=output,
                  messages=({"role": "user", "content": user}, {"role": "assistant", "content": output}))


def sample(record: Mapping[str, Any], lay: Layout, number: int) -> Sample | None:
    """Record `number` (1-based) as one of TRL's forms; None for a text record with nothing in it (a blank line)."""
    if lay.format == "text":
        text = _text(_field(record, lay.text, "--text-field", number, "the text"), "--dataset", number, lay.text)
        return Sample(text=text) if text.strip() else None
    if lay.format == "prompt-completion":
        return _prompt_completion(record, lay, number)
    if lay.format == "alpaca":
        return _alpaca(record, number)
    return _conversation(record, lay, number)
