"""Each record format trains with finetune.py's own `main` on make e2e's tiny Llama (no GPU), with the expected labels
(issue 27 item 1): `make test-recipe` (CI runs it after make e2e's install). The training runs in the e2e venv
(tests/recipe/train_formats.py: torch, transformers, peft, datasets at data/versions.yaml's pins), this test reads what
it printed; without that venv it skips, saying why.

The expected texts are written out here from the tiny tokenizer's template (ChatML turns after a BOS, EOS <|im_end|>),
Stanford's alpaca prompt and the Zephyr format, never taken from the code under test. The assistant turns' learned
text is also held to transformers' own assistant mask of the same template with {% generation %} markers: the two
ways finetune_render.py finds the turns (masks, rendered prefixes) agree on a real tokenizer and template."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.recipe
ROOT = Path(__file__).resolve().parents[2]
VENV_PYTHON = Path(os.environ.get("E2E_VENV", "/opt/ds-e2e-venv")) / "bin" / "python"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not VENV_PYTHON.is_file():
        pytest.skip(f"{VENV_PYTHON} is missing: e2e/install.sh installs it (make e2e, as root)")
    work = tmp_path_factory.mktemp("recipe")
    result = subprocess.run([str(VENV_PYTHON), str(ROOT / "tests" / "recipe" / "train_formats.py"), str(work)],
                            capture_output=True, text=True, timeout=900, check=False,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
                                     # the recipes package, imported before the script's own path inserts run
                                     "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def turn(role: str, content: str) -> str:
    return f"<|im_start|>{role}\n{content}<|im_end|>\n"


ONE_PLUS_ONE = turn("user", "What is one plus one?") + turn("assistant", "one plus one is 2.")
EXPECTED = {
    # Every assistant turn of a multi-turn conversation, its end-of-turn and newline included; nothing else.
    "messages": ("<s>" + turn("system", "You add numbers.") + turn("user", "What is two plus three?")
                 + turn("assistant", "two plus three is 5.") + turn("user", "And three plus two?")
                 + turn("assistant", "three plus two is 5 too."),
                 ["two plus three is 5.<|im_end|>\n", "three plus two is 5 too.<|im_end|>\n"]),
    "sharegpt": ("<s>" + ONE_PLUS_ONE, ["one plus one is 2.<|im_end|>\n"]),
    "prompt-completion": ("<s>" + ONE_PLUS_ONE, ["one plus one is 2.<|im_end|>\n"]),
    # Plain prompt/response on a model with a chat template: through it, as /v1/chat/completions will ask.
    "prompt-response": ("<s>" + ONE_PLUS_ONE, ["one plus one is 2.<|im_end|>\n"]),
    # --chat-template raw: BOS, the prompt, the response, EOS, as /v1/completions will be asked the prompt.
    "prompt-response-raw": ("<s>What is one plus one?one plus one is 2.<|im_end|>", ["one plus one is 2.<|im_end|>"]),
    # alpaca through the template: the instruction and the input a line apart, one user turn.
    "alpaca": ("<s>" + turn("user", "Add the numbers.\ntwo and three") + turn("assistant", "5"), ["5<|im_end|>\n"]),
    # text: learned whole, EOS appended (the first label is never predicted: the model shifts them).
    "text": ("<s>two plus three is 5.<|im_end|>", ["<s>two plus three is 5.<|im_end|>"]),
    # Field mapping: another list, other keys, other role names.
    "mapped": ("<s>" + ONE_PLUS_ONE, ["one plus one is 2.<|im_end|>\n"]),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_format_trains_on_the_tiny_model_with_the_expected_labels(trained: dict[str, Any], name: str) -> None:
    run = trained["runs"][name]
    assert run["exit"] == 0, run["log"]
    assert run["exported"]  # two steps trained, the model (LoRA off: every weight) exported with its marker
    text, learned = EXPECTED[name]
    assert run["text"] == text
    assert run["learned"] == learned
    assert run["labels_match_ids"]


def test_the_learned_turns_are_transformers_assistant_mask(trained: dict[str, Any]) -> None:
    """finetune_render.py found the turns of the tiny template (no markers) by rendering prefixes: the same tokens
    transformers' return_assistant_tokens_mask marks on that template with {% generation %} markers."""
    reference = trained["references"]
    assert reference["marked_text"] == trained["runs"]["messages"]["text"]
    assert reference["marked_learned"] == trained["runs"]["messages"]["learned"]


def test_the_zephyr_template_renders_zephyrs_format(trained: dict[str, Any]) -> None:
    """data/chat_templates.yaml's zephyr: `<|role|>` and a newline, the text, the tokenizer's EOS and a newline; the
    generation prompt `<|assistant|>` and a newline (the alignment handbook's DEFAULT_CHAT_TEMPLATE's output)."""
    reference = trained["references"]
    assert reference["zephyr"] == ("<|system|>\nYou add numbers.<|im_end|>\n<|user|>\nWhat is two plus three?"
                                   "<|im_end|>\n<|assistant|>\ntwo plus three is 5.<|im_end|>\n")
    assert reference["zephyr_prompt"] == ("<|system|>\nYou add numbers.<|im_end|>\n<|user|>\nWhat is two plus three?"
                                          "<|im_end|>\n<|assistant|>\n")


# --- packing and the tokenized data (issue 31 item 2) -----------------------------------------------------------

def test_text_documents_are_packed_into_full_blocks_with_nothing_lost(trained: dict[str, Any]) -> None:
    """--packing auto on text: the documents (each BOS ... EOS, as the tokenizer gives them) end to end, cut into
    --seq-len blocks: every block 16 tokens but the last, every token there once and in order, no padding."""
    run = trained["packed"]["text"]
    assert run["exit"] == [0, 0], run["first_log"][-2000:] + run["again_log"][-2000:]
    blocks, documents = run["blocks"], run["documents"]
    assert [len(b) for b in blocks[:-1]] == [16] * (len(blocks) - 1) and 0 < len(blocks[-1]) <= 16
    assert [t for b in blocks for t in b] == [t for d in documents for t in d]
    assert len(documents[2]) > 16  # a document longer than a block: its tail is in the next block, not cut off
    assert run["columns"] == ["input_ids"]  # text learns every token: the collator's labels are the ids


def test_the_second_start_reuses_the_tokenized_data(trained: dict[str, Any]) -> None:
    run = trained["packed"]["text"]
    assert "[finetune] tokenized 5 records in " in run["first_log"]
    assert "[finetune] tokenized data reused from " in run["again_log"]
    assert "[finetune] tokenized 5 records" not in run["again_log"]


def test_conversations_in_a_padding_free_batch_keep_their_assistant_only_labels(trained: dict[str, Any]) -> None:
    """--packing on with chat records: transformers' DataCollatorWithFlattening puts the two records in one row with
    no padding and no attention mask, position ids restarting at the second record; the labels learn the
    assistant turns only, of both records."""
    run = trained["packed"]["chat"]
    assert run["exit"] == 0, run["log"][-2000:]
    first, second = run["sample_lengths"]
    assert run["shape"] == [1, first + second]
    assert run["batch_keys"] == ["input_ids", "labels", "position_ids"]
    assert run["positions"] == [*range(first), *range(second)]
    assert run["learned"] == ["two plus three is 5.<|im_end|>\n", "three plus two is 5 too.<|im_end|>\n",
                              "two plus three is 5.<|im_end|>\n"]
    assert run["labels_match_ids"]
    assert "padding-free" in run["log"]


def test_no_record_of_a_padding_free_batch_sees_another(trained: dict[str, Any]) -> None:
    """The model as finetune.py trains it: the flattened row's logits are each record's own (fp32, to rounding), so
    the attention kept the records apart; and the exported model's config has its KV cache back on."""
    run = trained["packed"]["chat"]
    assert run["flattened_diff"] < 1e-4, run["flattened_diff"]
    assert run["exported_use_cache"] is True
