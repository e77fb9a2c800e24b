"""The `finetune` scenario's model side, run with the e2e venv's python (torch, transformers, tokenizers):

    python e2e/tiny_llm.py make DATA.jsonl OUT_DIR     # a tiny Llama (random weights) and its tokenizer
    python e2e/tiny_llm.py generate MODEL_DIR PROMPT N  # transformers' greedy tokens, as JSON

No model hub: the tokenizer is a byte-level BPE trained here on the scenario's own records with the
`tokenizers` library, and the model is a LlamaForCausalLM built from a config. Its attention heads are 32 wide:
vLLM's CPU attention needs a head size of 32 or more (head size 16 passes /health and crashes on the first
request; ../shared/reference/serving/FACTS.md).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

VOCAB = 512
HIDDEN = 64
HEADS = 2  # head size HIDDEN / HEADS = 32
LAYERS = 2
INTERMEDIATE = 128
MAX_POSITIONS = 256
SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}


def make(data: Path, out: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    records = [json.loads(line) for line in data.read_text(encoding="utf-8").splitlines() if line.strip()]
    texts = [f"{r['prompt']} {r['response']}" for r in records]
    bpe = Tokenizer(models.BPE(unk_token=SPECIAL["unk_token"]))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=list(SPECIAL.values()),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(texts, trainer=trainer)
    bos = bpe.token_to_id(SPECIAL["bos_token"])
    # A BOS before every prompt, as Llama's tokenizers add one.
    bpe.post_processor = processors.TemplateProcessing(single=f"{SPECIAL['bos_token']} $A",
                                                       special_tokens=[(SPECIAL["bos_token"], bos)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, **SPECIAL)
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
    print(json.dumps({"vocab": len(tokenizer), "parameters": sum(p.numel() for p in model.parameters())}))


def generate(model_dir: Path, prompt: str, tokens: int) -> None:
    """Greedy decoding of `tokens` new tokens, EOS ignored (as vLLM's ignore_eos): the tokens vLLM must match."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    # The plain argmax loop: generate()'s min_new_tokens would mask EOS, where ignore_eos only does not stop on it.
    out = ids
    with torch.no_grad():
        for _ in range(tokens):
            logits = model(out).logits[:, -1, :]
            out = torch.cat([out, logits.argmax(dim=-1, keepdim=True)], dim=1)
    new = out[0, ids.shape[1]:].tolist()
    print(json.dumps({"prompt_token_ids": ids[0].tolist(), "token_ids": new,
                      "text": tokenizer.decode(new, skip_special_tokens=True)}))


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "make" and len(sys.argv) == 4:
        make(Path(sys.argv[2]), Path(sys.argv[3]))
    elif command == "generate" and len(sys.argv) == 5:
        generate(Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
    else:
        sys.exit(__doc__)
