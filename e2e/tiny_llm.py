"""The `finetune` scenario's model side, run with the e2e venv's python (torch, transformers, tokenizers):

    python e2e/tiny_llm.py make DATA.jsonl OUT_DIR [MESSAGES]  # a tiny Llama (random weights) and its tokenizer;
        # with MESSAGES (JSON), `render`'s figures for that conversation too (one import of transformers)
    python e2e/tiny_llm.py generate MODEL_DIR PROMPT N  # transformers' greedy tokens, as JSON
    python e2e/tiny_llm.py references MODEL_DIR TRAINED HELD_OUT N
        # apply_chat_template's ids and assistant mask of the conversation TRAINED (JSON messages), and the greedy
        # N tokens after apply_chat_template(HELD_OUT, add_generation_prompt=True): what finetune.py trained on and
        # what vLLM's /v1/chat/completions must answer

No model hub: the tokenizer is a byte-level BPE trained here on the scenario's own records with the
`tokenizers` library, and the model is a LlamaForCausalLM built from a config. Its attention heads are 32 wide:
vLLM's CPU attention needs a head size of 32 or more (head size 16 passes /health and crashes on the first
request; ../shared/reference/serving/FACTS.md).

The tokenizer has a chat template, ChatML's turns after a BOS as Llama 3's starts: like Llama 3's and Qwen 2.5's own
templates it has no {% generation %} markers, so finetune.py finds the assistant turns by rendering prefixes.
`render` uses the same template with the markers added around each assistant turn (its text, <|im_end|> and the
newline: what the model must learn to say, and to stop), so transformers' own assistant mask is the reference
finetune.py's labels are held to. EOS is <|im_end|>, as Qwen 2.5 Instruct's: a server stops at the end of a turn.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

VOCAB = 512
HIDDEN = 64
HEADS = 2  # head size HIDDEN / HEADS = 32
LAYERS = 2
INTERMEDIATE = 128
MAX_POSITIONS = 256
SPECIAL = {"bos_token": "<s>", "eos_token": "<|im_end|>", "pad_token": "<pad>", "unk_token": "<unk>"}
TURN_START = "<|im_start|>"
TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['role'] == 'assistant' -%}{{- ASSISTANT -}}"
    "{%- else -%}{{- message['content'] + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}")
ASSISTANT = "message['content'] + '<|im_end|>\\n'"


def chat_template(marked: bool = False) -> str:
    """The model's template; `marked`: the same with {% generation %} around each assistant turn."""
    turn = "{{- " + ASSISTANT + " -}}"
    return TEMPLATE.replace("{{- ASSISTANT -}}", "{% generation %}" + turn + "{% endgeneration %}" if marked else turn)


def corpus(record: dict[str, Any]) -> str:
    """A record's text in any of the formats finetune.py reads, for the tokenizer's training."""
    parts: list[str] = []
    for value in record.values():
        if isinstance(value, str):
            parts.append(value)
        elif isinstance(value, list):
            parts += [str(v) for m in value if isinstance(m, dict) for v in m.values()]
    return " ".join(parts) + " system user assistant"


def make(data: Path, out: Path, messages: list[dict[str, str]] | None = None) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    records = [json.loads(line) for line in data.read_text(encoding="utf-8").splitlines() if line.strip()]
    texts = [corpus(r) for r in records]
    bpe = Tokenizer(models.BPE(unk_token=SPECIAL["unk_token"]))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[*SPECIAL.values(), TURN_START],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(texts, trainer=trainer)
    bos = bpe.token_to_id(SPECIAL["bos_token"])
    # A BOS before every prompt, as Llama's tokenizers add one.
    bpe.post_processor = processors.TemplateProcessing(single=f"{SPECIAL['bos_token']} $A",
                                                       special_tokens=[(SPECIAL["bos_token"], bos)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, additional_special_tokens=[TURN_START], **SPECIAL)
    tokenizer.chat_template = chat_template()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                         num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                         max_position_embeddings=MAX_POSITIONS, bos_token_id=bos,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    made = {"vocab": len(tokenizer), "parameters": sum(p.numel() for p in model.parameters())}
    print(json.dumps({**made, **({"render": render(out, messages)} if messages else {})}))


def _greedy(model_dir: Path, ids: list[int], tokens: int) -> list[int]:
    """`tokens` new tokens by argmax, EOS ignored (as vLLM's ignore_eos): the tokens vLLM must match."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    # The plain argmax loop: generate()'s min_new_tokens would mask EOS, where ignore_eos only does not stop on it.
    out = torch.tensor([ids])
    with torch.no_grad():
        for _ in range(tokens):
            logits = model(out).logits[:, -1, :]
            out = torch.cat([out, logits.argmax(dim=-1, keepdim=True)], dim=1)
    return out[0, len(ids):].tolist()


def generate(model_dir: Path, prompt: str, tokens: int) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    ids = tokenizer(prompt)["input_ids"]
    new = _greedy(model_dir, ids, tokens)
    print(json.dumps({"prompt_token_ids": ids, "token_ids": new,
                      "text": tokenizer.decode(new, skip_special_tokens=True)}))


def chat(model_dir: Path, messages: list[dict[str, str]], tokens: int) -> dict[str, Any]:
    """The greedy reply to a conversation as /v1/chat/completions asks for it: the served tokenizer's template with
    the generation prompt."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    ids = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                             return_dict=True)["input_ids"])
    new = _greedy(model_dir, ids, tokens)
    return {"prompt_token_ids": ids, "token_ids": new, "text": tokenizer.decode(new, skip_special_tokens=True)}


def render(model_dir: Path, messages: list[dict[str, str]]) -> dict[str, Any]:
    """apply_chat_template's ids for the conversation (the served template), and transformers' assistant mask from
    the same template with the markers."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    marked = tokenizer.apply_chat_template(messages, chat_template=chat_template(marked=True), tokenize=True,
                                           return_dict=True, return_assistant_tokens_mask=True)
    plain = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
    return {"input_ids": list(plain), "marked_ids": list(marked["input_ids"]),
            "assistant_masks": list(marked["assistant_masks"])}


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "make" and len(sys.argv) in (4, 5):
        make(Path(sys.argv[2]), Path(sys.argv[3]), json.loads(sys.argv[4]) if len(sys.argv) == 5 else None)
    elif command == "generate" and len(sys.argv) == 5:
        generate(Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
    elif command == "references" and len(sys.argv) == 6:
        print(json.dumps({"render": render(Path(sys.argv[2]), json.loads(sys.argv[3])),
                          "chat": chat(Path(sys.argv[2]), json.loads(sys.argv[4]), int(sys.argv[5]))}))
    else:
        sys.exit(__doc__)
