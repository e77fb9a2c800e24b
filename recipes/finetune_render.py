"""finetune.py's rendering: each record (finetune_data.Sample) as the token ids the model is trained on and the
labels the loss reads (IGNORE_INDEX where it does not learn), the same way the model will be used.

- Chat data goes through a chat template: the tokenizer's own, or the one --chat-template names (then saved with the
  tokenizer, so a server renders requests with it). vLLM's /v1/chat/completions renders every request through the
  served tokenizer's template, so the model learns on exactly what it will be asked.
- The loss covers the assistant turns only, every one of them in a multi-turn conversation (TRL's
  assistant_only_loss), and for TRL's conversational prompt-completion all of the completion (its
  completion_only_loss). Two ways to find them, said in the data check's log:
  * `generation`: the template marks assistant output with {% generation %} ... {% endgeneration %}; transformers'
    apply_chat_template(return_assistant_tokens_mask=True) returns the mask (what TRL's SFTTrainer requires for
    assistant_only_loss);
  * `prefix`: otherwise (Llama 3's and Qwen 2.5's own templates have no such markers), by rendering prefixes, as TRL
    finds a completion: an assistant turn starts where the conversation before it, rendered with the generation
    prompt, stops matching the whole (TRL's common_prefix_length), and ends where the conversation up to and
    including it does. Its end-of-turn token (<|eot_id|>, <|im_end|>) is learned: that is how the model learns to
    stop. A template that renders a turn differently in place than at the end is caught: an empty turn is an error.
- Plain prompt/completion and alpaca records on a model with a chat template go through it too, as one user turn
  and one assistant turn (an Instruct model is served through /v1/chat/completions), unless --chat-template raw.
- Raw (text; prompt/completion without a template or with `raw`): the tokenizer's own special tokens (BOS), then
  EOS after what is learned, as TRL appends eos_token; the prompt and the completion are tokenized apart and
  joined (TRL tokenizes them together and masks their common prefix): a served /v1/completions request tokenizes
  the prompt alone, and the model then continues from exactly those tokens.
- Samples are cut at --seq-len (TRL's truncation_mode keep_start); one with nothing left to learn is dropped.

The tokenizer is passed in (a transformers tokenizer on the cluster; its calls: __call__, apply_chat_template,
decode, eos_token_id, chat_template): standard library only here, so the unit tests run it with a stand-in and the
recipe tests (tests/recipe, `make test-recipe`) with transformers' own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from recipes.contract import CHAT_TEMPLATE_AUTO, CHAT_TEMPLATE_RAW
from recipes.finetune_config import UsageError
from recipes.finetune_data import RecordError, Sample

IGNORE_INDEX = -100  # labels the loss skips (the Trainer's models' CrossEntropyLoss ignore_index)
# TRL's has_generation_markers (trl/chat_template_utils.py), whitespace-trim variants included.
GENERATION_MARKER = re.compile(r"\{%-?\s*generation\s*-?%\}")


@dataclass(frozen=True)
class Rendering:
    """How every sample of a run is rendered: through a chat template (`template`: None for raw), with the
    assistant tokens found by `masks` (generation | prefix)."""

    template: str | None
    masks: str | None = None
    named: bool = False  # the template is --chat-template's, not the tokenizer's own

    @property
    def chat(self) -> bool:
        return self.template is not None

    def describe(self) -> str:
        if not self.chat:
            return "raw (no chat template: the tokenizer's special tokens, EOS after what is learned)"
        whose = "the chat template --chat-template names" if self.named else "the model's own chat template"
        how = ("the template's {% generation %} masks" if self.masks == "generation"
               else "rendering prefixes (the template has no {% generation %} markers)")
        return f"{whose}; the loss on the assistant turns, found by {how}"


def has_generation_markers(template: str) -> bool:
    return GENERATION_MARKER.search(template) is not None


def choose(kind: str, requested: str, own_template: str | None, named_template: str | None = None) -> Rendering:
    """The rendering for data of `kind` (finetune_data.kind_of): --chat-template `auto` (the tokenizer's template
    where the data can use one), `raw`, or a template's text (`named_template`, read from the file it names).
    RecordError (naming --chat-template) where the data cannot be rendered so."""
    if requested == CHAT_TEMPLATE_RAW:
        if kind == "chat":
            raise RecordError("--chat-template", "raw renders text and plain prompt/completion records only; "
                              "conversations need a chat template (auto: the model's own, or name one)")
        return Rendering(None)
    template = named_template if requested != CHAT_TEMPLATE_AUTO else own_template
    if kind == "text" or template is None:
        if kind == "chat":
            raise RecordError("--chat-template", "the model's tokenizer has no chat template, and conversations are "
                              "rendered through one: name a template for it (then served with the model), or train "
                              "on text or prompt/completion records")
        return Rendering(None)
    masks = "generation" if has_generation_markers(template) else "prefix"
    return Rendering(template, masks, named=requested != CHAT_TEMPLATE_AUTO)


# --- tokens and labels ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Encoded:
    """One training sample, and how long the record was before it was cut at --seq-len."""

    input_ids: list[int]
    labels: list[int]
    length: int

    def as_columns(self) -> dict[str, Any]:
        return {"input_ids": self.input_ids, "attention_mask": [1] * len(self.input_ids), "labels": self.labels,
                "length": self.length}


def common_prefix_length(ids: Sequence[int], other: Sequence[int]) -> int:
    """How many leading tokens two sequences share (TRL's data_utils.common_prefix_length)."""
    length = 0
    for a, b in zip(ids, other, strict=False):
        if a != b:
            break
        length += 1
    return length


def _chat(tokenizer: Any, messages: Sequence[Mapping[str, str]], template: str, number: int,
          **options: Any) -> dict[str, list[int]]:
    try:
        out = tokenizer.apply_chat_template([dict(m) for m in messages], chat_template=template, tokenize=True,
                                            return_dict=True, **options)
    except Exception as error:  # the template's own refusals (raise_exception: roles must alternate, ...)
        raise RecordError("--chat-template", f"record {number}: the chat template cannot render it "
                          f"({type(error).__name__}: {error})") from None
    return {key: list(value) for key, value in out.items()}


def _generation_labels(tokenizer: Any, messages: Sequence[Mapping[str, str]], template: str,
                       number: int) -> tuple[list[int], list[int]]:
    out = _chat(tokenizer, messages, template, number, return_assistant_tokens_mask=True)
    ids, mask = out["input_ids"], out["assistant_masks"]
    if not any(mask):
        raise RecordError("--chat-template", f"record {number}: the chat template's {{% generation %}} markers mark "
                          "no token of its assistant turns")
    return ids, [token if learned else IGNORE_INDEX for token, learned in zip(ids, mask, strict=True)]


def _span(tokenizer: Any, messages: Sequence[Mapping[str, str]], template: str, number: int, full: list[int],
          start_at: int, end_at: int) -> tuple[int, int]:
    """Where messages[start_at:end_at] lie in `full`: from where the conversation before them, rendered with the
    generation prompt, stops matching (TRL's common prefix: a template may render the prompt alone a little
    differently), to the end of the conversation through them, which must be a prefix of the whole (else the
    template renders the turn differently in place than at the end, e.g. a reasoning block only in the last turn,
    and its tokens cannot be found this way)."""
    before = _chat(tokenizer, messages[:start_at], template, number, add_generation_prompt=True)["input_ids"]
    start = common_prefix_length(before, full)
    if end_at == len(messages):
        return start, len(full)
    through = _chat(tokenizer, messages[:end_at], template, number)["input_ids"]
    if common_prefix_length(through, full) < len(through):
        raise RecordError("--chat-template", f"record {number}, message {start_at + 1}: the chat template renders "
                          "this assistant turn differently in place than at the end of the conversation, so its "
                          "tokens cannot be told apart; use a template with {% generation %} markers")
    return start, len(through)


def _prefix_labels(tokenizer: Any, sample: Sample, template: str, number: int) -> tuple[list[int], list[int]]:
    messages = sample.messages
    full = _chat(tokenizer, messages, template, number)["input_ids"]
    labels = [IGNORE_INDEX] * len(full)
    if sample.completion_from is not None:
        turns = [(sample.completion_from, len(messages))]
    else:
        turns = [(i, i + 1) for i, m in enumerate(messages) if m["role"] == "assistant"]
    for start_at, end_at in turns:
        start, end = _span(tokenizer, messages, template, number, full, start_at, end_at)
        if end <= start:
            raise RecordError("--chat-template", f"record {number}, message {start_at + 1}: the chat template "
                              "renders no token for this assistant turn")
        labels[start:end] = full[start:end]
    return full, labels


def _raw(tokenizer: Any, sample: Sample) -> tuple[list[int], list[int]]:
    eos = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    if sample.text is not None:
        ids = [*tokenizer(sample.text, add_special_tokens=True)["input_ids"], *eos]
        return ids, list(ids)
    prompt = list(tokenizer(sample.prompt or "", add_special_tokens=True)["input_ids"])
    completion = [*tokenizer(sample.completion or "", add_special_tokens=False)["input_ids"], *eos]
    return [*prompt, *completion], [IGNORE_INDEX] * len(prompt) + completion


def encode(sample: Sample, tokenizer: Any, rendering: Rendering, seq_len: int, number: int) -> Encoded:
    """Record `number`'s sample as token ids and labels, cut at seq_len."""
    if rendering.template is not None and sample.messages:
        if rendering.masks == "generation" and sample.completion_from is None:
            ids, labels = _generation_labels(tokenizer, sample.messages, rendering.template, number)
        else:
            ids, labels = _prefix_labels(tokenizer, sample, rendering.template, number)
    elif sample.chat_only:
        raise RecordError("--dataset", f"record {number} is a conversation, but the data set's first record is "
                          "plain text: one form for the whole data set")
    else:
        ids, labels = _raw(tokenizer, sample)
    return Encoded(ids[:seq_len], labels[:seq_len], len(ids))


def build_example(prompt_ids: Sequence[int], response_ids: Sequence[int], eos_id: int | None,
                  seq_len: int, mask_prompt: bool = True) -> dict[str, list[int]]:
    """One raw training sample: prompt + response (+ EOS), cut at seq_len; the prompt's labels masked so only the
    response is learned. A text record is a response without a prompt."""
    ids = [*prompt_ids, *response_ids, *([eos_id] if eos_id is not None else [])][:seq_len]
    prompt_len = min(len(prompt_ids), len(ids)) if mask_prompt else 0
    labels = [IGNORE_INDEX] * prompt_len + ids[prompt_len:]
    return {"input_ids": ids, "attention_mask": [1] * len(ids), "labels": labels}


def learns_something(example: Mapping[str, Sequence[int]]) -> bool:
    """A sample whose labels are all masked (a prompt longer than seq_len) adds nothing but a NaN-free zero."""
    return any(label != IGNORE_INDEX for label in example["labels"][1:])


def pad_batch(examples: Sequence[Mapping[str, Sequence[int]]], pad_id: int) -> dict[str, list[list[int]]]:
    """Right-padded to the longest sample: pad ids, attention 0, labels masked. The tokenized data keeps no
    attention mask (every token attends), and packed text blocks no labels (every token is learned)."""
    longest = max(len(e["input_ids"]) for e in examples)
    out: dict[str, list[list[int]]] = {"input_ids": [], "attention_mask": [], "labels": []}
    for e in examples:
        ids = list(e["input_ids"])
        pad = longest - len(ids)
        out["input_ids"].append([*ids, *[pad_id] * pad])
        out["attention_mask"].append([*e.get("attention_mask", [1] * len(ids)), *[0] * pad])
        out["labels"].append([*e.get("labels", ids), *[IGNORE_INDEX] * pad])
    return out


def learned_text(tokenizer: Any, encoded: Encoded) -> str:
    """The sample as text with what the loss learns in [[...]]: what the data check prints of the first record."""
    parts: list[str] = []
    for learned, group in _runs(encoded.input_ids, encoded.labels):
        text = tokenizer.decode(group)
        parts.append(f"[[{text}]]" if learned else text)
    return "".join(parts)


def _runs(ids: Sequence[int], labels: Sequence[int]) -> list[tuple[bool, list[int]]]:
    runs: list[tuple[bool, list[int]]] = []
    for token, label in zip(ids, labels, strict=True):
        learned = label != IGNORE_INDEX
        if runs and runs[-1][0] == learned:
            runs[-1][1].append(token)
        else:
            runs.append((learned, [token]))
    return runs


def template_file(path: str) -> str:
    """The text of the chat template --chat-template names (the stack ships it beside the script)."""
    try:
        with open(path, encoding="utf-8") as stream:
            text = stream.read()
    except OSError as error:
        raise UsageError(f"--chat-template {path}: {error.strerror}") from None
    if not text.strip():
        raise UsageError(f"--chat-template {path}: the file is empty")
    return text
