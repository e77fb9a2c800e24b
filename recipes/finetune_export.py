"""finetune.py's export: what MODEL_DIR holds at the end (the adapter alone, the base with the adapter merged in,
or every weight), written by rank 0 once every rank took part in the save, and the completion marker, last.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from recipes.contract import MARKER
from recipes.finetune_check import Plan
from recipes.finetune_config import say
from recipes.finetune_hpu import (
    dtype_keyword,
)

# What MODEL_DIR holds, as the marker says: a LoRA adapter, the base with the adapter merged in, or every weight.
ADAPTER, MERGED, FULL = "adapter", "merged", "full"


# peft's adapter folder (PeftModel.save_pretrained: SAFETENSORS_WEIGHTS_NAME, CONFIG_NAME) and a whole model's
# files (transformers' save_pretrained): an export of one kind removes the other's, so that MODEL_DIR never holds
# both a stale model and a new adapter.
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")


MODEL_FILE_GLOBS = ("config.json", "generation_config.json", "model*.safetensors", "model.safetensors.index.json",
                    "pytorch_model*.bin")


def export_kind(lora: bool, lora_export: str) -> str:
    """What MODEL_DIR holds: ADAPTER, MERGED (LoRA merged into the base) or FULL (every weight trained)."""
    return FULL if not lora else (ADAPTER if lora_export == ADAPTER else MERGED)


def marker_text(step: int, model: str, *, lora: bool, dataset: str, precision: str, world_size: int,
                finished: datetime.datetime, export: str = FULL, lora_rank: int | None = None,
                rendering: Mapping[str, str] | None = None) -> str:
    """MODEL_DIR/.complete: what a server waiting on it (and a person) wants to know; written last. `export` says
    what the folder holds; an adapter's marker also has its rank (vLLM's --max-lora-rank must hold it) and its base
    is `model`. `rendering` (marker_rendering) says how the records were rendered: what evaluate.py renders its
    task with, without being told."""
    fields: dict[str, Any] = {"step": step, "model": model, "lora": lora, "export": export, "dataset": dataset,
                              "precision": precision, "world_size": world_size,
                              "finished": finished.isoformat(timespec="seconds"), **(rendering or {})}
    if export == ADAPTER and lora_rank is not None:
        fields["lora_rank"] = lora_rank
    return json.dumps(fields, sort_keys=True) + "\n"


def marker_rendering(the_plan: Plan, chat_template: str) -> dict[str, str]:
    """The marker's account of how the model learned its records: `rendering` chat (through the chat template
    saved with the export: the model is asked on /v1/chat/completions) or raw (prompt text: /v1/completions),
    `chatTemplate` (--chat-template: auto, raw or the named template's file) and the records' `recordFormat`."""
    return {"rendering": "chat" if the_plan.rendering.chat else "raw", "chatTemplate": chat_template,
            "recordFormat": the_plan.layout.format}


def stale_files(model_dir: Path, export: str) -> list[Path]:
    """Files of the other kind of export in MODEL_DIR (an adapter's beside a new whole model, or the reverse)."""
    if not model_dir.is_dir():
        return []
    if export == ADAPTER:
        return sorted({p for pattern in MODEL_FILE_GLOBS for p in model_dir.glob(pattern) if p.is_file()})
    return sorted(p for name in ADAPTER_FILES if (p := model_dir / name).is_file())


def export(trainer: Any, args: argparse.Namespace, tokenizer: Any, token: str | None, precision: str,
            step: int, the_plan: Plan | None = None) -> None:
    """Every rank takes part in saving (ZeRO-3 gathers the weights); rank 0 writes MODEL_DIR and the marker. An
    adapter export is the Trainer's own save of the peft model (adapter_config.json, adapter_model.safetensors);
    a merged one saves the adapter aside first and merges it into the base on rank 0."""

    model_dir = Path(args.model_dir)
    export = export_kind(args.lora, args.lora_export)
    if trainer.is_world_process_zero():
        model_dir.mkdir(parents=True, exist_ok=True)
        (model_dir / MARKER).unlink(missing_ok=True)  # an older model's marker: not this one's
        for stale in stale_files(model_dir, export):
            stale.unlink()
    saved = Path(args.checkpoint_dir) / "adapter-export" if export == MERGED else model_dir
    # MODEL_DIR is shared: only rank 0 writes it. Tiered saves had every node write its own checkpoint files
    # (save_on_each_node); here the other nodes would overwrite rank 0's gathered weights with their empty shards.
    trainer.args.save_on_each_node = False
    trainer.save_model(str(saved))
    trainer.accelerator.wait_for_everyone()
    if trainer.is_world_process_zero():
        if export == MERGED:
            merge_adapter(args, saved, token, precision)
            shutil.rmtree(saved, ignore_errors=True)
        tokenizer.save_pretrained(str(model_dir))
        world = trainer.args.world_size
        text = marker_text(step, args.model, lora=args.lora, dataset=args.dataset, precision=precision,
                           world_size=world, finished=datetime.datetime.now(datetime.timezone.utc), export=export,
                           lora_rank=args.lora_rank if args.lora else None,
                           rendering=marker_rendering(the_plan, args.chat_template) if the_plan else None)
        (model_dir / MARKER).write_text(text, encoding="utf-8")
        say(f"exported step {step} to {model_dir} ({export})")
    trainer.accelerator.wait_for_everyone()


def merge_adapter(args: argparse.Namespace, adapter: Path, token: str | None,
                   precision: str) -> None:
    """The base model, whole on this host's CPU (outside ZeRO-3's partitioning), with the adapter merged in."""
    import torch
    import transformers
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()  # else from_pretrained would partition the base model across the ranks again
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[precision]
    base = AutoModelForCausalLM.from_pretrained(args.model, token=token,
                                                **{dtype_keyword(transformers.__version__): dtype})
    merged = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
    merged.save_pretrained(args.model_dir, safe_serialization=True)
