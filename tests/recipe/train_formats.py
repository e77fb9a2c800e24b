"""Run with the e2e venv's python (torch, transformers, peft, datasets: e2e/install.sh) by test_formats.py:

    /opt/ds-e2e-venv/bin/python tests/recipe/train_formats.py WORK_DIR

finetune.py's own `main` trains the tiny Llama of make e2e (e2e/tiny_llm.py: random weights, a BPE tokenizer trained
on these records, a ChatML chat template without {% generation %} markers, EOS <|im_end|>) for two steps on CPU, once
per record format, each from a JSON lines file; then prints one JSON line: per run its exit status, whether the model
was exported, and the first record as trained (CHECKPOINT_DIR/rendered-sample.json) decoded, the learned tokens
apart. Beside that: transformers' assistant mask of the same template with the markers (the reference the labels are
held to), and data/chat_templates.yaml's zephyr template rendered by transformers (it has no other test).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

from recipes import finetune_prepare as fp
from recipes import finetune_train as fr

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the recipes package (this file runs as a script in the e2e venv too)
sys.path.insert(0, str(ROOT / "e2e"))

CONVERSATION = [{"role": "system", "content": "You add numbers."},
                {"role": "user", "content": "What is two plus three?"},
                {"role": "assistant", "content": "two plus three is 5."},
                {"role": "user", "content": "And three plus two?"},
                {"role": "assistant", "content": "three plus two is 5 too."}]
# Each format's file: two records, the first one the test reads back.
FORMATS: dict[str, tuple[list[dict[str, Any]], list[str]]] = {
    "messages": ([{"messages": CONVERSATION}, {"messages": CONVERSATION[1:3]}], []),
    "sharegpt": ([{"conversations": [{"from": "human", "value": "What is one plus one?"},
                                     {"from": "gpt", "value": "one plus one is 2."}]}] * 2, []),
    "prompt-completion": ([{"prompt": [{"role": "user", "content": "What is one plus one?"}],
                            "completion": [{"role": "assistant", "content": "one plus one is 2."}]}] * 2, []),
    "prompt-response": ([{"question": "What is one plus one?", "answer": "one plus one is 2."}] * 2,
                        ["--prompt-field", "question", "--response-field", "answer"]),
    "prompt-response-raw": ([{"question": "What is one plus one?", "answer": "one plus one is 2."}] * 2,
                            ["--prompt-field", "question", "--response-field", "answer", "--chat-template", "raw"]),
    "alpaca": ([{"instruction": "Add the numbers.", "input": "two and three", "output": "5"}] * 2, []),
    "text": ([{"text": "two plus three is 5."}] * 2, []),
    "mapped": ([{"dialog": [{"speaker": "customer", "text": "What is one plus one?"},
                            {"speaker": "agent", "text": "one plus one is 2."}]}] * 2,
               ["--records", "messages", "--messages-field", "dialog", "--role-field", "speaker",
                "--content-field", "text", "--roles", "customer=user", "agent=assistant"]),
}


def corpus_file(work: Path) -> Path:
    """Every record of every format, for the tokenizer's training."""
    path = work / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for records, _ in FORMATS.values() for r in records),
                    encoding="utf-8")
    return path


def learned_runs(tokenizer: Any, ids: list[int], learned: list[bool]) -> list[str]:
    """Each stretch of learned tokens, decoded."""
    runs: list[str] = []
    current: list[int] = []
    for token, learn in zip(ids, learned, strict=True):
        if learn:
            current.append(token)
        elif current:
            runs.append(tokenizer.decode(current))
            current = []
    return [*runs, tokenizer.decode(current)] if current else runs


def train(name: str, model: Path, work: Path) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from recipes import finetune

    records, flags = FORMATS[name]
    data = work / name / "data.jsonl"
    data.parent.mkdir(parents=True)
    data.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = finetune.main(["--model", str(model), "--dataset", str(data), "--checkpoint-dir",
                              str(work / name / "checkpoints"), "--model-dir", str(work / name / "model"),
                              "--max-steps", "2", "--save-steps", "100", "--seq-len", "128", "--logging-steps", "1",
                              "--learning-rate", "0.001", *flags])
    sys.stdout = sys.__stdout__  # main wraps the streams; put them back
    sys.stderr = sys.__stderr__
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    sample_path = work / name / "checkpoints" / "rendered-sample.json"
    sample = json.loads(sample_path.read_text()) if sample_path.is_file() else {}
    ids, labels = sample.get("input_ids", []), sample.get("labels", [])
    return {"exit": code, "exported": (work / name / "model" / ".complete").is_file(),
            "text": tokenizer.decode(ids), "learned": learned_runs(tokenizer, ids, [label != -100 for label in labels]),
            "labels_match_ids": all(label in (-100, t) for t, label in
                                    zip(sample.get("input_ids", []), sample.get("labels", []), strict=True)),
            "log": out.getvalue()[-2000:] if code else ""}


# Packing (issue 31 item 2): text documents of different lengths, packed into --seq-len 16 blocks; conversations in
# padding-free batches (--packing on). The documents' words are the records' own, so the tokenizer knows them.
PACKED_SEQ_LEN = 16
DOCUMENTS = ["two plus three is 5.", "And three plus two?", "one plus one is 2. " * 4, "5", "You add numbers."]


def packed(model: Path, work: Path) -> dict[str, Any]:
    """The text documents trained packed, then started again on the same folders (the tokenized data reused);
    the conversations trained padding-free, and transformers' DataCollatorWithFlattening's batch of them (what the
    Trainer handed the model). Per run: its log, and what the tokenized folder holds."""
    import datasets
    from transformers import AutoTokenizer

    from recipes import finetune

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    out: dict[str, Any] = {}
    text = work / "packed-text"
    text.mkdir()
    (text / "data.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCUMENTS), encoding="utf-8")
    argv = ["--model", str(model), "--dataset", str(text / "data.jsonl"), "--checkpoint-dir", str(text / "checkpoints"),
            "--model-dir", str(text / "model"), "--save-steps", "100", "--seq-len", str(PACKED_SEQ_LEN),
            "--logging-steps", "1", "--learning-rate", "0.001"]
    first = run_main(finetune, [*argv, "--max-steps", "1"])
    again = run_main(finetune, [*argv, "--max-steps", "2"])
    (folder,) = (text / "checkpoints" / "tokenized").iterdir()
    blocks = [list(b) for b in datasets.load_from_disk(str(folder / "train"))["input_ids"]]
    out["text"] = {"exit": [first[0], again[0]], "first_log": first[1], "again_log": again[1],
                   "blocks": blocks, "columns": datasets.load_from_disk(str(folder / "train")).column_names,
                   # Each document as the tokenizer gives it (BOS first), then EOS: what the blocks must hold.
                   "documents": [[*tokenizer(d)["input_ids"], tokenizer.eos_token_id] for d in DOCUMENTS]}
    chat = work / "packed-chat"
    chat.mkdir()
    records, _ = FORMATS["messages"]
    (chat / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    code, log = run_main(finetune, ["--model", str(model), "--dataset", str(chat / "data.jsonl"), "--checkpoint-dir",
                                    str(chat / "checkpoints"), "--model-dir", str(chat / "model"), "--max-steps", "2",
                                    "--save-steps", "100", "--seq-len", "128", "--logging-steps", "1",
                                    "--learning-rate", "0.001", "--packing", "on"])
    (folder,) = (chat / "checkpoints" / "tokenized").iterdir()
    samples = list(datasets.load_from_disk(str(folder / "train")))
    batch = fp.collator(tokenizer.pad_token_id, "padding-free")(samples)
    ids, labels = batch["input_ids"][0].tolist(), batch["labels"][0].tolist()
    out["chat"] = {"exit": code, "log": log, "batch_keys": sorted(batch), "shape": list(batch["input_ids"].shape),
                   "positions": batch["position_ids"][0].tolist(),
                   "sample_lengths": [len(sample["input_ids"]) for sample in samples],
                   "learned": learned_runs(tokenizer, ids, [label != -100 for label in labels]),
                   "labels_match_ids": all(label in (-100, t) for t, label in zip(ids, labels, strict=True)),
                   "exported_use_cache": json.loads((chat / "model" / "config.json").read_text())["use_cache"],
                   "flattened_diff": flattened_diff(finetune, model, samples, batch)}
    return out


def flattened_diff(finetune: Any, model: Path, samples: list[dict[str, Any]], batch: Any) -> float:
    """The largest difference between the logits of the padding-free batch (the records in one row) and each record's
    own, from the model as finetune.py loads it for training, in train mode (dropout is 0 in the tiny config)."""
    import torch
    import transformers

    trained, _ = fr.training_model(str(model), None, transformers.__version__, torch.float32)
    trained.train()
    with torch.no_grad():
        flat = trained(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits[0]
        alone = torch.cat([trained(input_ids=torch.tensor([s["input_ids"]])).logits[0] for s in samples])
    return float((flat - alone).abs().max())


def run_main(finetune: Any, argv: list[str]) -> tuple[int, str]:
    """finetune.main's exit status and what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = finetune.main(argv)
    sys.stdout = sys.__stdout__  # main wraps the streams; put them back
    sys.stderr = sys.__stderr__
    return code, out.getvalue()


def references(model: Path) -> dict[str, Any]:
    """transformers' assistant mask (the template with the markers) of CONVERSATION, decoded as learned text; and
    zephyr's rendering."""
    import tiny_llm
    import yaml
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    marked = tokenizer.apply_chat_template(CONVERSATION, chat_template=tiny_llm.chat_template(marked=True),
                                           tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    ids = marked["input_ids"]
    runs = learned_runs(tokenizer, ids, [bool(m) for m in marked["assistant_masks"]])
    template = yaml.safe_load((ROOT / "data" / "chat_templates.yaml").read_text())["templates"]["zephyr"]["template"]
    return {"marked_learned": runs, "marked_text": tokenizer.decode(ids),
            "zephyr": tokenizer.apply_chat_template(CONVERSATION[:3], chat_template=template, tokenize=False),
            "zephyr_prompt": tokenizer.apply_chat_template(CONVERSATION[:2], chat_template=template, tokenize=False,
                                                           add_generation_prompt=True)}


def main(work: Path) -> None:
    import tiny_llm

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = work / "tiny"
    with contextlib.redirect_stdout(io.StringIO()):
        tiny_llm.make(corpus_file(work), model)
    results = {name: train(name, model, work) for name in FORMATS}
    print(json.dumps({"runs": results, "references": references(model), "packed": packed(model, work)}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
