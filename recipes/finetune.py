#!/usr/bin/env python3
"""Fine-tune a causal language model with the Hugging Face Trainer under DeepSpeed ZeRO 0-3.

Run on every rank by the DeepSpeed launcher, as the stack's MPIJob and Helm release do::

    deepspeed --hostfile HOSTFILE finetune.py --deepspeed_config ds_config.json \\
        --model meta-llama/Llama-3.1-8B-Instruct --dataset /gcs/bucket/chats.jsonl --seq-len 2048 --max-steps 1000

- Model: a Hugging Face id or a local folder (--model, FINETUNE_MODEL). A gated model's token is read from
  the file named by HF_TOKEN_PATH (never from an environment value).
- Data (--dataset, FINETUNE_DATASET): a .jsonl/.json, .parquet or .txt file, a folder of them, or a Hugging
  Face dataset id, in one of the formats people bring (--records: text, prompt-completion, messages, alpaca,
  sharegpt, or auto from the fields; finetune_data.py), rendered as the model will be used (finetune_render.py):
  conversations through the chat template with the loss on every assistant turn, plain prompt/completion records
  through it too on a model that has one (--chat-template raw: joined as text), text as it is.
- --check-data: read the first records, check and render them as the ranks would, print what was found and the
  first record as trained, and exit (2 on a data error): the launcher runs it before the ranks
  (finetune_check.py).
- --prepare-data: the data check, then every record tokenized once into --tokenized-dir (default
  CHECKPOINT_DIR/tokenized/<fingerprint>, finetune_tokenized.py), or found there from an earlier start: the
  launcher's step before the ranks, which then memory-map that folder (rank 0 makes it first where it is missing).
- --packing: text records packed into --seq-len blocks (auto, the default, and on); chat and prompt/completion
  records in padding-free batches (on only); off: one record a sample, padded (finetune_tokenized.py says why).
- --eval-split: a held-out fraction of the records, or a file of them; the eval loss is logged at every save.
- DeepSpeed: ds_config.json from --deepspeed (the launcher's --deepspeed_config). Values the Trainer owns may
  be "auto" there; where the file gives a batch size, accumulation, clipping or precision, the Trainer is set
  to the same value, so the two never disagree.
- Optional LoRA (peft): --lora with --lora-rank/--lora-alpha/--lora-dropout/--lora-target-modules; at export
  MODEL_DIR gets the adapter alone (--lora-export adapter, the default: peft's adapter_config.json and
  adapter_model.safetensors, a few MB, served on the base model by vLLM's LoRA support) or the base model with the
  adapter merged in (--lora-export merged).
- On Vertex AI: --checkpoint-dir and --model-dir default to AIP_CHECKPOINT_DIR and AIP_MODEL_DIR, TensorBoard's
  folder to AIP_TENSORBOARD_LOG_DIR (gs:// read as the /gcs mount) where the stack's variables are not set.
- Checkpoints: the Trainer's checkpoint-N folders in --checkpoint-dir (CHECKPOINT_DIR), every --save-steps
  (CHECKPOINT_EVERY_STEPS) steps and when any rank gets SIGTERM (the ranks agree on it every step, then all
  save and stop with exit status 143). A restarted run resumes from the newest complete checkpoint by itself.
  Rank 0 writes the first record as trained into CHECKPOINT_DIR/rendered-sample.json (ids, labels, text).
- Export: rank 0 writes the consolidated model (safetensors, config, tokenizer with its chat template; ZeRO-3
  gathers the weights), or the adapter and the tokenizer, into --model-dir (MODEL_DIR), then MODEL_DIR/.complete,
  last: {"step": N, "model": ..., "export": "adapter" | "merged" | "full", ...}: what a server waiting on it loads.
- Errors in the arguments or the data exit 2, naming the stack's key where FINETUNE_STACK_KEYS gives it.

The script is a small package of flat modules shipped beside it (the stack's ConfigMap ships every finetune_*.py;
Python finds them in the script's own folder): finetune_config.py (errors, ds_config.json), finetune_data.py
(sources and record formats), finetune_read.py (the first records), finetune_render.py (tokens and labels),
finetune_check.py (the data check), finetune_checkpoints.py (resuming). `DS_ACCELERATOR=cpu` runs the same path on
CPUs with gloo: that is how `make e2e` runs it across network-namespace hosts. torch, transformers, peft, datasets
and deepspeed are imported inside functions: the modules' tops are plain Python, unit-tested without them
(tests/test_finetune_script.py, tests/test_finetune_data.py); the run functions and `main` are unit-tested under
stand-ins for those modules, each rank a thread (tests/test_finetune_run.py), and with the real libraries on a tiny
model (tests/recipe).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

from recipes.contract import EXIT_USAGE
from recipes.finetune_args import parse_args, resolve
from recipes.finetune_config import StackKeys, UsageError, hf_token, say
from recipes.finetune_fabric import nccl_divert
from recipes.finetune_hpu import trainer_classes
from recipes.finetune_prepare import check_data, load_tokenizer, prepare_data, read_head
from recipes.finetune_tokenized import describe
from recipes.finetune_train import configure_cpu_deepspeed, setup, start_ranks, train
from recipes.shutdown import ForgivingStream, StopRequest, exit_without_teardown


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv, os.environ)
        keys, token = StackKeys.from_env(os.environ), hf_token(os.environ)
        if args.prepare_data:
            return prepare_data(resolve(args), token, keys)
        if args.check_data:
            check_data(resolve(args), token, keys)
            return 0
        run_setup = setup(args, os.environ)
        run = resolve(args)  # a missing file, a mixed folder, a template file: said before anything loads
    except UsageError as error:
        say(f"FAILED: {error}")
        return EXIT_USAGE
    sys.stdout, sys.stderr = ForgivingStream(sys.stdout), ForgivingStream(sys.stderr)
    stop = StopRequest()
    signal.signal(signal.SIGTERM, stop)
    network = nccl_divert(os.environ)  # before NCCL starts: its init lines into a file this rank reads
    if run_setup.cpu and run_setup.ds is not None:
        configure_cpu_deepspeed()
    # transformers' Trainer, or on Intel Gaudi optimum-habana's GaudiTrainer (finetune_hpu.py): the same keywords.
    classes = trainer_classes(os.environ)
    tokenizer = load_tokenizer(args.model, token)
    try:
        head = read_head(run, tokenizer, token, keys)
    except UsageError as error:
        say(f"FAILED: {error}")
        return EXIT_USAGE
    say(f"records: {head.plan.layout.format}; {head.plan.rendering.describe()}; {describe(head.packing, args.seq_len)}")
    ranks = start_ranks(run, run_setup, head, tokenizer, token, keys, network, classes)
    if isinstance(ranks, int):  # stopped before training: its final status
        return ranks
    return train(run, run_setup, ranks, head, tokenizer, token, stop, classes)


if __name__ == "__main__":
    exit_without_teardown(main)
