"""finetune.py's data (issue 27 item 1): the formats people bring (messages, TRL's prompt/completion plain and
conversational, alpaca, sharegpt, text) read under their field names, each malformed record kind refused with one
clear error naming the stack key to change, and the rendering's tokens and labels (assistant turns only) checked
against a stand-in tokenizer here; tests/recipe holds the same code to transformers' own tokenizer and template on a
tiny model (`make test-recipe`).

Expected values are written out by hand from the formats' definitions (OpenAI's chat messages, TRL's dataset types,
tatsu-lab/stanford_alpaca's PROMPT_DICT, ShareGPT's from/value), never read from the code under test."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from workloads.finetune import script_module

SCRIPTS = Path(__file__).resolve().parent.parent / "recipes"
KEY = "workloads.tune.finetune"
# The stack's names for the flags (workloads/finetune.py sends them as FINETUNE_STACK_KEYS).
STACK = {"--dataset": f"{KEY}.datasetPath", "--records": f"{KEY}.recordFormat", "--text-field": f"{KEY}.textField",
         "--prompt-field": f"{KEY}.promptField", "--response-field": f"{KEY}.responseField",
         "--messages-field": f"{KEY}.messagesField", "--role-field": f"{KEY}.roleField",
         "--content-field": f"{KEY}.contentField", "--roles": f"{KEY}.roles",
         "--chat-template": f"{KEY}.chatTemplate", "--seq-len": f"{KEY}.sequenceLength"}


@pytest.fixture(scope="module")
def fd() -> ModuleType:
    return script_module("finetune_data")


@pytest.fixture(scope="module")
def fr() -> ModuleType:
    return script_module("finetune_render")


@pytest.fixture(scope="module")
def fc() -> ModuleType:
    return script_module("finetune_check")


@pytest.fixture(scope="module")
def keys() -> Any:
    return script_module("finetune_config").StackKeys(STACK)


def test_the_modules_import_only_the_standard_library_at_the_top() -> None:
    """The stack imports them at preview and the launcher's check runs them: torch and the rest load inside the run
    functions only."""
    heavy = ("torch", "transformers", "peft", "datasets", "deepspeed", "accelerate", "pyarrow", "jinja2")
    for path in sorted(SCRIPTS.glob("finetune*.py")):
        top = [line for line in path.read_text().splitlines() if line.startswith(("import ", "from "))]
        assert not [line for line in top if any(re.search(rf"\b{h}\b", line) for h in heavy)], path.name


# --- a stand-in tokenizer with a ChatML template -----------------------------------------------------------------

CHATML = "chatml"  # the stand-in's template names; `{% generation %}` in the name: the marked variant
CHATML_MARKED = "chatml {% generation %}"
# A template that renders the last assistant turn differently than the same turn in place (as Qwen3's keeps the
# reasoning block of the last turn only): its tokens cannot be told apart by rendering prefixes.
CHATML_LAST_DIFFERENT = "chatml, the last turn with a thought block"
STRICT = "chatml, roles must alternate"


class ChatTokenizer:
    """Characters as tokens (ord); BOS 1 from __call__ only, EOS 2; chat templates rendered here in Python as
    ChatML (`<|im_start|>role\\ncontent<|im_end|>\\n`), the assistant mask around content, <|im_end|> and the
    newline, as transformers returns it for a {% generation %} template."""

    eos_token_id = 2

    def __init__(self, chat_template: str | None = CHATML) -> None:
        self.chat_template = chat_template
        self.calls: list[tuple[int, bool]] = []  # (messages rendered, add_generation_prompt)

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": [1] * add_special_tokens + [ord(c) for c in text]}

    def decode(self, ids: Sequence[int]) -> str:
        return "".join({1: "<s>", 2: "</s>"}.get(i, chr(i)) for i in ids)

    def apply_chat_template(self, messages: list[dict[str, str]], chat_template: str | None = None,
                            tokenize: bool = True, return_dict: bool = True, add_generation_prompt: bool = False,
                            return_assistant_tokens_mask: bool = False) -> dict[str, list[int]]:
        template = chat_template or self.chat_template
        assert template is not None and tokenize and return_dict
        self.calls.append((len(messages), add_generation_prompt))
        if template == STRICT and any(a["role"] == b["role"] for a, b in itertools.pairwise(messages)):
            raise ValueError("Conversation roles must alternate user/assistant/user/assistant/...")
        text, mask = "", []
        for i, m in enumerate(messages):
            head = f"<|im_start|>{m['role']}\n"
            last = template == CHATML_LAST_DIFFERENT and i == len(messages) - 1 and m["role"] == "assistant"
            body = f"{'<think></think>' if last else ''}{m['content']}<|im_end|>\n"
            text += head + body
            mask += [0] * len(head) + [int(m["role"] == "assistant")] * len(body)
        if add_generation_prompt:
            text += "<|im_start|>assistant\n"
            mask += [0] * len("<|im_start|>assistant\n")
        out = {"input_ids": [ord(c) for c in text]}
        if return_assistant_tokens_mask:
            assert "{% generation %}" in template, "transformers refuses masks without the markers"
            out["assistant_masks"] = mask
        return out


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def learned(encoded: Any) -> str:
    """The learned tokens as text, one run per learned stretch."""
    runs, current = [], ""
    for token, label in zip(encoded.input_ids, encoded.labels, strict=True):
        if label != -100:
            assert label == token
            current += chr(token) if token > 2 else {1: "<s>", 2: "</s>"}[token]
        elif current:
            runs.append(current)
            current = ""
    return "|".join([*runs, current] if current else runs)


CONVERSATION = [{"role": "system", "content": "Add."}, {"role": "user", "content": "1+1?"},
                {"role": "assistant", "content": "2"}, {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "4"}]


def encode(fd: ModuleType, fc: ModuleType, record: Mapping[str, Any], tokenizer: Any, requested: str = "auto",
           seq_len: int = 512, **spec: Any) -> Any:
    the_plan = fc.plan(record, fd.FieldSpec(**spec), requested, tokenizer.chat_template, None)
    return fc.encode_record(record, 1, the_plan, tokenizer, seq_len)


# --- the formats ---------------------------------------------------------------------------------------------

def test_the_format_is_told_by_the_first_records_fields(fd: ModuleType) -> None:
    detect = fd.detect_format
    spec = fd.FieldSpec()
    assert detect(spec, {"messages": [], "text": "x"}) == "messages"
    assert detect(spec, {"conversations": [{"from": "human", "value": "hi"}]}) == "sharegpt"
    assert detect(spec, {"conversations": [{"role": "user", "content": "hi"}]}) == "messages"
    assert detect(spec, {"instruction": "a", "input": "", "output": "b"}) == "alpaca"
    assert detect(spec, {"prompt": "a", "completion": "b"}) == "prompt-completion"
    assert detect(spec, {"text": "a", "id": 3}) == "text"
    # A field flag decides first; --records over everything.
    assert detect(fd.FieldSpec(prompt_field="q"), {"q": "a", "text": "b"}) == "prompt-completion"
    assert detect(fd.FieldSpec(messages_field="chat"), {"chat": [{"from": "gpt", "value": "x"}]}) == "sharegpt"
    assert detect(fd.FieldSpec(format="text", text_field="body"), {"messages": []}) == "text"


def test_each_format_becomes_one_of_trls_forms(fd: ModuleType) -> None:
    def sample(record: dict[str, Any], **spec: Any) -> Any:
        return fd.sample(record, fd.layout(fd.FieldSpec(**spec), record), 1)

    user, bot = {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}
    assert sample({"text": "abc"}) == fd.Sample(text="abc")
    assert sample({"prompt": "hi", "completion": "yo"}) == fd.Sample(prompt="hi", completion="yo",
                                                                     messages=(user, bot))
    assert sample({"q": "hi", "a": "yo"}, prompt_field="q", completion_field="a").completion == "yo"
    # TRL's conversational prompt-completion: the completion's messages are what is learned.
    assert sample({"prompt": [user], "completion": [bot]}) == fd.Sample(messages=(user, bot), completion_from=1)
    assert sample({"messages": CONVERSATION}) == fd.Sample(messages=tuple(CONVERSATION))
    assert sample({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}) == \
        fd.Sample(messages=(user, bot))
    # Field mapping: another list, other keys, other role names (axolotl's field_messages and property mappings).
    mapped = {"dialog": [{"speaker": "customer", "text": "hi"}, {"speaker": "agent", "text": "yo"}]}
    assert sample(mapped, format="messages", messages_field="dialog", role_field="speaker", content_field="text",
                  roles={"customer": "user", "agent": "assistant"}) == fd.Sample(messages=(user, bot))


def test_alpaca_has_stanfords_prompt_raw_and_one_user_turn_as_a_chat(fd: ModuleType) -> None:
    def sample(record: dict[str, Any]) -> Any:
        return fd.sample(record, fd.layout(fd.FieldSpec(), record), 1)

    with_input = sample({"instruction": "Add them.", "input": "2 and 3", "output": "5"})
    assert with_input.prompt == (
        "Below is an instruction that describes a task, paired with an input that provides further context. "
        "Write a response that appropriately completes the request.\n\n### Instruction:\nAdd them.\n\n### Input:\n"
        "2 and 3\n\n### Response:")
    # LLaMA-Factory's alpaca converter: instruction and input a line apart, as the user's turn.
    assert with_input.messages == ({"role": "user", "content": "Add them.\n2 and 3"},
                                   {"role": "assistant", "content": "5"})
    bare = sample({"instruction": "Say hi.", "input": "", "output": "hi"})
    assert bare.prompt == ("Below is an instruction that describes a task. Write a response that appropriately "
                           "completes the request.\n\n### Instruction:\nSay hi.\n\n### Response:")
    assert bare.messages[0] == {"role": "user", "content": "Say hi."}
    assert sample({"instruction": "Say hi.", "output": "hi"}) == bare  # input absent: as empty


def test_roles_are_given_as_name_equals_role(fd: ModuleType) -> None:
    assert fd.parse_roles(["bot=assistant", "human=user"]) == ({"bot": "assistant", "human": "user"}, [])
    assert fd.parse_roles(["bot", "x=robot"])[1] == [
        "--roles 'bot': expected NAME=ROLE with ROLE one of system, user, assistant",
        "--roles 'x=robot': expected NAME=ROLE with ROLE one of system, user, assistant"]


# --- each malformed record: one error, naming the key ---------------------------------------------------------

MESSAGES = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
MALFORMED = [
    ({"text": "x"}, {"format": "messages"}, f"{KEY}.messagesField",
     "record 1 has no field 'messages' (the conversation; it has text)"),
    ({"messages": "hi"}, {}, f"{KEY}.datasetPath", "record 1: 'messages' is a str, not a list of messages"),
    ({"messages": []}, {}, f"{KEY}.datasetPath", "record 1: 'messages' is an empty list of messages"),
    ({"messages": ["hi"]}, {}, f"{KEY}.datasetPath",
     "record 1, message 1 is a str, not an object with 'role' and 'content'"),
    ({"messages": [{"content": "hi"}]}, {}, f"{KEY}.roleField",
     "record 1, message 1 has no 'role' (it has content): name the key that holds the role"),
    ({"messages": [{"role": "user", "text": "hi"}]}, {}, f"{KEY}.contentField",
     "record 1, message 1 has no 'content' (it has role, text): name the key that holds the text"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "bot", "content": "yo"}]}, {}, f"{KEY}.roles",
     "record 1, message 2 has the role 'bot': map it onto system, user or assistant (NAME=ROLE; known: assistant, "
     "system, user)"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}, {}, f"{KEY}.datasetPath",
     "record 1, message 1 (user) holds a list, not text: only text turns are trained (no images, tool calls or "
     "content parts)"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": " "}]}, {},
     f"{KEY}.datasetPath", "record 1, message 2 is an empty assistant turn: the model would learn to answer nothing; "
     "fill it or remove the turn"),
    ({"messages": [{"role": "system", "content": "be nice"}, {"role": "user", "content": "hi"}]}, {},
     f"{KEY}.datasetPath", "record 1: 'messages' has no assistant turn, so nothing to learn"),
    ({"conversations": [{"from": "human", "value": "hi"}, {"from": "bot", "value": "yo"}]}, {}, f"{KEY}.roles",
     "record 1, message 2 has the role 'bot': map it onto system, user or assistant (NAME=ROLE; known: assistant, "
     "gpt, human, system, user)"),
    ({"question": "hi", "completion": "yo"}, {"format": "prompt-completion"}, f"{KEY}.promptField",
     "record 1 has no field 'prompt' (the prompt; it has completion, question)"),
    ({"prompt": "hi", "answer": "yo"}, {"format": "prompt-completion"}, f"{KEY}.responseField",
     "record 1 has no field 'completion' (what is learned; it has answer, prompt)"),
    ({"prompt": "hi", "completion": ""}, {}, f"{KEY}.datasetPath",
     "record 1: 'completion' is empty: the model would learn to answer nothing"),
    ({"prompt": "hi", "completion": [{"role": "assistant", "content": "yo"}]}, {}, f"{KEY}.datasetPath",
     "record 1: 'prompt' is a str and 'completion' a list: both text, or both lists of messages"),
    ({"prompt": [{"role": "user", "content": "hi"}], "completion": [{"role": "user", "content": "more"}]}, {},
     f"{KEY}.datasetPath", "record 1: 'completion' has no assistant turn, so nothing to learn"),
    ({"instruction": "Add.", "answer": "5"}, {"format": "alpaca"}, f"{KEY}.recordFormat",
     "record 1 has no field 'output' (alpaca's output; it has answer, instruction)"),
    ({"instruction": "Add.", "input": "", "output": ""}, {}, f"{KEY}.datasetPath",
     "record 1: 'output' is empty: the model would learn to answer nothing"),
    ({"instruction": "Add.", "input": 3, "output": "5"}, {}, f"{KEY}.datasetPath", "record 1: 'input' is a int, "
     "not text"),
    ({"body": "x"}, {"format": "text"}, f"{KEY}.textField", "record 1 has no field 'text' (the text; it has body)"),
    ({"text": ["x"]}, {}, f"{KEY}.datasetPath", "record 1: 'text' is a list, not text"),
    ({"id": 1, "body": "x"}, {}, f"{KEY}.recordFormat", "record 1 has the fields body, id: none of a known format "
     "(messages, conversations, instruction + output, prompt + completion, text); set it and the field names"),
]


@pytest.mark.parametrize(("record", "spec", "key", "text"), MALFORMED, ids=[m[3][:40] for m in MALFORMED])
def test_each_malformed_record_kind_gets_one_error_naming_its_key(fd: ModuleType, keys: Any,
                                                                  record: dict[str, Any], spec: dict[str, Any],
                                                                  key: str, text: str) -> None:
    with pytest.raises(fd.RecordError) as caught:
        fd.sample(record, fd.layout(fd.FieldSpec(**spec), record), 1)
    assert caught.value.named(keys) == f"{key}: {text}"


def test_a_file_that_is_not_json_lines_is_named_by_line(fd: ModuleType, keys: Any, tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(MESSAGES) + "\n\n{oops\n")
    with pytest.raises(fd.RecordError) as caught:
        fr_first(fd.data_source(str(data)))
    assert caught.value.named(keys) == (f"{KEY}.datasetPath: {data} line 3 is not JSON (Expecting property name "
                                        "enclosed in double quotes, column 2)")
    data.write_text('[1, 2]\n')
    assert fr_first(fd.data_source(str(data))) == [{"": 1}, {"": 2}]  # a JSON array: its items
    data.write_text('"text"\n')
    with pytest.raises(fd.RecordError, match="line 1 is a JSON str, not an object of fields"):
        fr_first(fd.data_source(str(data)))


def test_the_first_records_are_read_in_order_across_a_folders_files(fd: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": f"a{i}"}) + "\n" for i in range(3)))
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "b0"}) + "\n")
    assert [r["text"] for r in fr_first(fd.data_source(str(tmp_path)), limit=4)] == ["a0", "a1", "a2", "b0"]
    (tmp_path / "lines.txt").write_text("one\n\ntwo\n")
    assert fr_first(fd.data_source(str(tmp_path / "lines.txt"))) == [{"text": "one"}, {"text": ""},
                                                                            {"text": "two"}]


def fr_first(source: Any, limit: int = 200) -> list[Any]:
    return script_module("finetune_read").first_records(source, limit)


# --- rendering ---------------------------------------------------------------------------------------------------

def test_every_assistant_turn_is_learned_and_nothing_else(fd: ModuleType, fc: ModuleType) -> None:
    encoded = encode(fd, fc, {"messages": CONVERSATION}, ChatTokenizer())
    text = ("<|im_start|>system\nAdd.<|im_end|>\n<|im_start|>user\n1+1?<|im_end|>\n<|im_start|>assistant\n"
            "2<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n")
    assert encoded.input_ids == ids(text)  # the template's own rendering, no BOS or EOS added
    # Each turn's text, its end-of-turn and the newline (the model learns to stop); no user or system token.
    assert learned(encoded) == "2<|im_end|>\n|4<|im_end|>\n"


def test_prefix_rendering_finds_what_the_generation_markers_mark(fd: ModuleType, fc: ModuleType) -> None:
    """The two ways to find the assistant tokens agree on a template that has the markers."""
    marked = encode(fd, fc, {"messages": CONVERSATION}, ChatTokenizer(CHATML_MARKED))
    tokenizer = ChatTokenizer(CHATML)
    by_prefix = encode(fd, fc, {"messages": CONVERSATION}, tokenizer)
    assert marked.input_ids == by_prefix.input_ids and marked.labels == by_prefix.labels
    # Prefix rendering: the whole, then per assistant turn the conversation before it with the generation prompt
    # and the conversation through it (the last turn's end is the whole's).
    assert tokenizer.calls[-4:] == [(5, False), (2, True), (3, False), (4, True)]


def test_a_template_that_renders_the_last_turn_differently_is_refused(fd: ModuleType, fc: ModuleType,
                                                                      keys: Any) -> None:
    with pytest.raises(fd.RecordError) as caught:
        encode(fd, fc, {"messages": CONVERSATION}, ChatTokenizer(CHATML_LAST_DIFFERENT))
    assert caught.value.named(keys) == (
        f"{KEY}.chatTemplate: record 1, message 3: the chat template renders this assistant turn differently in place "
        "than at the end of the conversation, so its tokens cannot be told apart; use a template with "
        "{% generation %} markers")


def test_the_templates_own_refusal_names_the_template(fd: ModuleType, fc: ModuleType, keys: Any) -> None:
    record = {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
                           {"role": "assistant", "content": "c"}]}
    with pytest.raises(fd.RecordError) as caught:
        encode(fd, fc, record, ChatTokenizer(STRICT))
    assert caught.value.named(keys) == (
        f"{KEY}.chatTemplate: record 1: the chat template cannot render it (ValueError: Conversation roles must "
        "alternate user/assistant/user/assistant/...)")


def test_a_conversational_completion_is_learned_whole(fd: ModuleType, fc: ModuleType) -> None:
    record = {"prompt": [{"role": "user", "content": "1+1?"}],
              "completion": [{"role": "assistant", "content": "2"}]}
    for template in (CHATML, CHATML_MARKED):  # TRL's completion mask, markers or not
        assert learned(encode(fd, fc, record, ChatTokenizer(template))) == "2<|im_end|>\n"


def test_plain_prompt_completion_goes_through_the_models_template_or_raw(fd: ModuleType, fc: ModuleType) -> None:
    record = {"prompt": "1+1?", "completion": "2"}
    chat = encode(fd, fc, record, ChatTokenizer())
    assert chat.input_ids == ids("<|im_start|>user\n1+1?<|im_end|>\n<|im_start|>assistant\n2<|im_end|>\n")
    assert learned(chat) == "2<|im_end|>\n"
    # raw (or a model without a template): BOS and the prompt masked, the completion and EOS learned.
    for tokenizer, requested in ((ChatTokenizer(), "raw"), (ChatTokenizer(None), "auto")):
        raw = encode(fd, fc, record, tokenizer, requested)
        assert raw.input_ids == [1, *ids("1+1?"), *ids("2"), 2]
        assert raw.labels == [-100] * 5 + [*ids("2"), 2]


def test_text_is_learned_whole_and_cut_at_the_sequence_length(fd: ModuleType, fc: ModuleType) -> None:
    encoded = encode(fd, fc, {"text": "abcdef"}, ChatTokenizer(), seq_len=4)
    assert encoded.input_ids == encoded.labels == [1, *ids("abc")] and encoded.length == 8


def test_conversations_need_a_template(fd: ModuleType, fc: ModuleType, keys: Any) -> None:
    for tokenizer, requested, text in (
            (ChatTokenizer(), "raw", "raw renders text and plain prompt/completion records only; conversations need "
             "a chat template (auto: the model's own, or name one)"),
            (ChatTokenizer(None), "auto", "the model's tokenizer has no chat template, and conversations are "
             "rendered through one: name a template for it (then served with the model), or train on text or "
             "prompt/completion records")):
        with pytest.raises(fd.RecordError) as caught:
            encode(fd, fc, MESSAGES, tokenizer, requested)
        assert caught.value.named(keys) == f"{KEY}.chatTemplate: {text}"
    # A named template serves a model without its own.
    the_plan = fc.plan(MESSAGES, fd.FieldSpec(), "/etc/deepspeed/chat_template.jinja", None, CHATML)
    assert the_plan.rendering.template == CHATML and the_plan.rendering.named
    assert "the chat template --chat-template names" in the_plan.rendering.describe()


def test_the_rendering_says_how_the_assistant_tokens_are_found(fr: ModuleType) -> None:
    assert fr.choose("chat", "auto", CHATML_MARKED).masks == "generation"
    assert fr.choose("chat", "auto", CHATML).masks == "prefix"
    # TRL's has_generation_markers: the whitespace-trim variants count.
    assert fr.has_generation_markers("{%- generation -%}x{% endgeneration %}")
    assert not fr.has_generation_markers("{{ 'generation' }}")
    assert fr.choose("text", "auto", CHATML).template is None  # text is never templated
    assert "rendering prefixes" in fr.choose("plain", "auto", CHATML).describe()


# --- the launcher's check ----------------------------------------------------------------------------------------

def test_the_check_reports_the_format_the_rendering_and_the_long_records(fd: ModuleType, fc: ModuleType,
                                                                         keys: Any) -> None:
    long = {"messages": [{"role": "user", "content": "x" * 80}, {"role": "assistant", "content": "y"}]}
    records = [MESSAGES, long, MESSAGES]
    tokenizer = ChatTokenizer()
    report = fc.check(records, fd.FieldSpec(), tokenizer, "auto", None, 80, keys)
    assert (report.records, report.longer, report.nothing, report.first_number) == (3, 1, 1, 1)
    assert fc.report_lines(report, tokenizer, 80, keys) == [
        "3 records read: messages (messages (role/content)); the model's own chat template; the loss on "
        "the assistant turns, found by rendering prefixes (the template has no {% generation %} markers)",
        f"1 of 3 records are longer than 80 tokens ({KEY}.sequenceLength): cut there, what lies past it is not learned",
        "1 of 3 records have nothing to learn within 80 tokens and are left out",
        "record 1 as trained ([[learned]]): "
        "'<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n[[yo<|im_end|>\\n]]'"]


def test_the_check_names_every_malformed_record_up_to_five(fd: ModuleType, fc: ModuleType, keys: Any) -> None:
    bad = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]}
    with pytest.raises(script_module("finetune_config").UsageError) as caught:
        fc.check([MESSAGES, *[bad] * 7], fd.FieldSpec(), ChatTokenizer(), "auto", None, 64, keys)
    lines = str(caught.value).splitlines()
    assert lines[0] == "7 of the first 8 records cannot be trained on:"
    assert lines[1] == (f"  {KEY}.datasetPath: record 2, message 2 is an empty assistant turn: the model would learn "
                        "to answer nothing; fill it or remove the turn")
    assert lines[5].startswith(f"  {KEY}.datasetPath: record 6,") and lines[6] == "  (and 2 more)"


def test_the_check_refuses_data_with_nothing_to_learn(fd: ModuleType, fc: ModuleType, keys: Any) -> None:
    long = {"prompt": "x" * 40, "completion": "y"}
    with pytest.raises(script_module("finetune_config").UsageError, match=re.escape(
            f"{KEY}.sequenceLength: none of the first 1 records has anything to learn within 16 tokens")):
        fc.check([long], fd.FieldSpec(), ChatTokenizer(None), "auto", None, 16, keys)


def test_one_form_for_the_whole_data_set(fd: ModuleType, fc: ModuleType, keys: Any) -> None:
    chat = {"prompt": [{"role": "user", "content": "hi"}], "completion": [{"role": "assistant", "content": "yo"}]}
    with pytest.raises(script_module("finetune_config").UsageError) as caught:
        fc.check([{"prompt": "hi", "completion": "yo"}, chat], fd.FieldSpec(), ChatTokenizer(None), "auto", None,
                 64, keys)
    assert f"{KEY}.datasetPath: record 2: its prompt and completion are lists of messages, but record 1's are " \
        "text: one form for the whole data set" in str(caught.value)


def test_a_blank_text_line_is_left_out(fd: ModuleType, fc: ModuleType, keys: Any) -> None:
    report = fc.check([{"text": "a"}, {"text": "  "}], fd.FieldSpec(), ChatTokenizer(), "auto", None, 64, keys)
    assert report.blank == 1
    assert fc.check_fields([{"text": "a"}], fd.FieldSpec(), keys) == "1 records read: text, well formed (not rendered)"
