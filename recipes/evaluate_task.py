"""evaluate.py's held-out task: the records in the formats training takes, rendered as the export was trained (its
marker says how), and lm-eval's two local tasks over them.

- Records (one JSON object a line): the evaluator's own {"prompt": ..., "reference": ...}, and every format
  finetune.py trains on, recognised by the same code (finetune_data.py, shipped beside this file): `messages`
  and sharegpt `conversations` (the reference is the last turn, which must be the assistant's; the turns before it
  are the prompt), prompt/completion, alpaca. Text records have no reference and are refused.
- Rendering (the export's marker, `rendering`, written by finetune.py): `chat`: the turns before the reference
  through the chat template saved with the export (its tokenizer), with the generation prompt, as text, and that
  text tokenized without special tokens: what vLLM's /v1/chat/completions does to a request (apply_chat_template,
  then add_special_tokens false), so the tokens are the served chat endpoint's. `raw`: the prompt as text, as
  /v1/completions takes it (the tokenizer's BOS first), the reference after it.
- Two lm-eval tasks on the same records (`local-completions`, token ids from that tokenizer):
  * `exact_match`: greedy generation (chat: until the end of the turn; raw: also a newline), the reply stripped
    equal to the reference: for short answers;
  * `loglikelihood`: the mean log-likelihood per reference token of the reference (chat: the answer as the
    template renders it, without the end of the turn after it, which any model that learned the format predicts
    alike) given the rendered prompt, from
    vLLM's prompt logprobs (echo); lm-eval's loglikelihood requests, this file's process_results and aggregation
    (evaluate_metrics.py) per token: it separates a better model on paragraph-long answers, where exact match is
    0 for base and tuned alike.

Standard library only at the top (the tokenizer is passed in).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipes.contract_programs import EVAL_METRICS, EXACT_MATCH, LOGLIKELIHOOD
from recipes.finetune_data import FieldSpec, RecordError, layout, sample

CHAT, RAW = "chat", "raw"
RENDERINGS = (CHAT, RAW)
METRICS = EVAL_METRICS  # the choices of evaluate.py's and evaluator.py's --metric, declared once
GENERATE_TASK, LIKELIHOOD_TASK = "deepspeed_stack_heldout", "deepspeed_stack_heldout_ll"
FILTER = "strip"  # the generation task's filter: lm-eval reports its metric as "exact_match,strip"
METRICS_MODULE = "evaluate_metrics"  # process_results and the aggregation, copied beside the task files
HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Record:
    """One held-out record: the prompt as turns (chat) and as text (raw), and the reference answer."""

    messages: tuple[Mapping[str, str], ...]
    prompt: str | None
    reference: str


def _record(value: dict[str, Any], number: int) -> Record:
    """One record of any format training takes, plus the evaluator's own prompt/reference."""
    if isinstance(value.get("prompt"), str) and "reference" in value and "completion" not in value:
        reference = value["reference"]
        if not value["prompt"].strip() or not isinstance(reference, str) or not reference.strip():
            raise RecordError("--task", f"line {number}: 'prompt' and 'reference' must be non-empty strings")
        return Record(({"role": "user", "content": value["prompt"]},), value["prompt"], reference)
    try:
        lay = layout(FieldSpec(), value)
    except RecordError:
        raise RecordError("--task", f"line {number} has the fields {', '.join(sorted(value)) or 'none'}: none of a "
                          "known format (messages, conversations, instruction + output, prompt + completion, "
                          "prompt + reference)") from None
    if lay.format == "text":
        raise RecordError("--task", f"line {number}: a text record has no reference to score; give messages (the "
                          "last assistant turn is the reference), prompt + completion or prompt + reference")
    if lay.format in ("messages", "sharegpt"):
        turns = value.get(lay.messages)
        last = turns[-1] if isinstance(turns, list) and turns and isinstance(turns[-1], Mapping) else {}
        if lay.roles.get(str(last.get(lay.role))) != "assistant":
            raise RecordError("--task", f"line {number}: the last turn of {lay.messages!r} is not the assistant's: "
                              "the reference is the conversation's last assistant turn")
    try:
        found = sample(value, lay, number)
    except RecordError as error:
        said, head = error.text, f"record {number}"
        text = f"line {number}{said[len(head):]}" if said.startswith(head) else f"line {number}: {said}"
        raise RecordError("--task", text) from None
    assert found is not None and found.messages
    *before, answer = found.messages
    return Record(tuple(before), found.prompt, answer["content"])


def read_records(lines: Sequence[str]) -> tuple[list[Record], list[str]]:
    """The task file's records and every problem (each with its line)."""
    records, problems = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as error:
            problems.append(f"line {number}: not JSON ({error.msg})")
            continue
        if not isinstance(value, dict):
            problems.append(f"line {number}: a JSON object expected (messages, or prompt and reference)")
            continue
        try:
            records.append(_record(value, number))
        except RecordError as error:
            problems.append(error.text)
    if not records and not problems:
        problems.append("no records")
    return records, problems


def raw_problems(records: Sequence[Record]) -> list[str]:
    """A raw-trained export is asked with text prompts: conversations cannot be."""
    return [f"record {i}: a conversation, but the export was trained raw (no chat template, its marker says): "
            "give prompt + reference records, or train through a chat template" for i, r in enumerate(records, 1)
            if r.prompt is None]


def _ids(tokenizer: Any, text: str, special: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])


def rendered(records: Sequence[Record], rendering: str, tokenizer: Any) -> list[dict[str, Any]]:
    """Each record as lm-eval's documents read it: the context, the continuation (the reference as the model
    learned it), the bare reference (exact match), and the continuation's token count (the per-token mean)."""
    docs = []
    for number, r in enumerate(records, 1):
        if rendering == CHAT:
            context = tokenizer.apply_chat_template(list(r.messages), tokenize=False, add_generation_prompt=True)
            whole = tokenizer.apply_chat_template([*r.messages, {"role": "assistant", "content": r.reference}],
                                                  tokenize=False)
            if not whole.startswith(context):
                raise RecordError("--task", f"record {number}: the chat template renders the conversation with its "
                                  "answer differently from the prompt before it, so the answer cannot be scored alone")
            continuation, special = answer_text(whole[len(context):], r.reference), False
        else:
            context, continuation, special = str(r.prompt), r.reference, True
        # lm-eval moves the context's trailing whitespace (a chat template's newline after the generation prompt)
        # into the continuation before it splits the tokens: counted the same way here.
        tokens = (len(_ids(tokenizer, context + continuation, special))
                  - len(_ids(tokenizer, context.rstrip(), special)))
        docs.append({"context": context, "continuation": continuation, "reference": r.reference,
                     "tokens": max(tokens, 1)})
    return docs


def answer_text(turn: str, reference: str) -> str:
    """The answer as the template renders it, without what the template puts after it (the end of the turn, which
    every model that learned the format predicts alike): the rendered turn up to the end of the reference (a
    template may trim it); the whole turn where the reference is not found in it as written."""
    found = turn.find(reference.strip())
    return turn[:found + len(reference.strip())] if found >= 0 else turn


def _yaml(task: Mapping[str, Any], functions: Mapping[str, str]) -> str:
    """A task file: each key's value as JSON (JSON is YAML), and lm-eval's `!function` tags for `functions`."""
    lines = [f"{key}: {json.dumps(value)}" for key, value in task.items()]
    lines += [f"{key}: !function {value}" for key, value in functions.items()]
    return "\n".join(lines) + "\n"


def generate_yaml(data_file: Path, rendering: str, max_tokens: int) -> str:
    """Greedy replies scored by exact match of the stripped reply: raw replies end at a newline too (a short
    answer on a line), a chat reply at the end of its turn (the tokenizer's EOS, which lm-eval adds)."""
    until = ["\n"] if rendering == RAW else []
    return _yaml({
        "task": GENERATE_TASK, "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data_file)}},
        "test_split": "test", "num_fewshot": 0, "output_type": "generate_until", "doc_to_text": "context",
        "doc_to_target": "reference",
        "generation_kwargs": {"until": until, "do_sample": False, "temperature": 0.0, "max_gen_toks": max_tokens},
        "filter_list": [{"name": FILTER, "filter": [{"function": "remove_whitespace"}, {"function": "take_first"}]}],
        "metric_list": [{"metric": EXACT_MATCH, "aggregation": "mean", "higher_is_better": True,
                         "ignore_case": False, "ignore_punctuation": False}],
        "metadata": {"version": 2.0}}, {})


def likelihood_yaml(data_file: Path) -> str:
    """The continuation's log-likelihood given the context (no delimiter between them: the rendering has it)."""
    return _yaml({
        "task": LIKELIHOOD_TASK, "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data_file)}},
        "test_split": "test", "num_fewshot": 0, "output_type": "loglikelihood", "doc_to_text": "context",
        "doc_to_target": "continuation", "target_delimiter": "", "metadata": {"version": 1.0}},
        {"process_results": f"{METRICS_MODULE}.process_results"}) + (
        f"metric_list:\n  - metric: {LOGLIKELIHOOD}\n    aggregation: !function {METRICS_MODULE}.per_token\n"
        "    higher_is_better: true\n")


def write_tasks(folder: Path, docs: Sequence[Mapping[str, Any]], rendering: str, max_tokens: int) -> None:
    """Both tasks in `folder` (lm-eval's include_path), their data file and the metric functions beside them."""
    data = folder / "task.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    (folder / f"{GENERATE_TASK}.yaml").write_text(generate_yaml(data, rendering, max_tokens), encoding="utf-8")
    (folder / f"{LIKELIHOOD_TASK}.yaml").write_text(likelihood_yaml(data), encoding="utf-8")
    shutil.copy2(HERE / f"{METRICS_MODULE}.py", folder / f"{METRICS_MODULE}.py")
