"""`make gpu-bench`: this stack's own throughput rows (issue 37 item 2), measured on one GPU of a lent device machine.

    GPU_CHECK_SCRIPT=e2e/gpu_bench.py bash e2e/gpu_check.sh [--cpu] [--quick] [--steps N] [--peak-tflops P]

recipes/finetune.py under the DeepSpeed launcher (--num_gpus 1), as the stack runs it, on real
architectures at random weights (a config of data/models.yaml's shape, no download; e2e/tiny_llm.py's tokenizer):
Llama-3.2-1B and Qwen2.5-7B, ZeRO-2 and ZeRO-3 (the stack's ds_config.json for each, make gpu-wheels writes them),
full fine-tuning and LoRA (rank 16, all-linear, gradient checkpointing), sequence 2048 (text records packed into
blocks), bf16, micro batch 1 and the largest that fits (doubling from 2 until a run runs out of memory). One JSON line
per setting: {"gpu_bench": ..., "tokens_per_second_per_gpu", "mfu", "peak_memory_gib", ...}; the tokens/s are the
median of the progress callback's logged rates after the first logging step (the first holds the warm-up).

The rows go into data/training_speed.yaml `throughput` (`ours: true`, gpu: the catalog's type of the device's GPU)
and docs/measurements.md by hand, with the device's name and the date. `--cpu` runs a tiny shape in fp32 on CPU ranks
(DS_ACCELERATOR=cpu): how it was tested here without a device. Everything above `run_bench` is plain Python,
unit-tested without torch (tests/test_gpu_bench.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FINETUNE = ROOT / "recipes" / "finetune.py"
TINY_LLM = ROOT / "e2e" / "tiny_llm.py"
WHEELS = ROOT / "build" / "gpu-wheels"
# make gpu-wheels writes the stack's ds_config.json for a finetune workload on one GPU at each ZeRO stage
# (e2e/gpu_wheels.py, workloads/ds_config.py's builder); the bench sets its micro batch only.
DS_CONFIGS = {(3, "bf16"): "ds_config_bf16.json", (2, "bf16"): "ds_config_bf16_zero2.json",
              (3, "fp32"): "ds_config_fp32.json", (2, "fp32"): "ds_config_fp32_zero2.json"}
# The shapes, from data/models.yaml (its source: the models' config.json); the device has no project venv, so they
# are written here and tests/test_gpu_bench.py holds them equal to the data file.
SHAPES: dict[str, dict[str, Any]] = {
    "Llama-3.2-1B": {"architecture": "llama", "layers": 16, "hidden": 2048, "heads": 32, "kvHeads": 8,
                     "headDim": 64, "vocab": 128256, "intermediate": 8192, "tie": True},
    "Qwen2.5-7B": {"architecture": "qwen2", "layers": 28, "hidden": 3584, "heads": 28, "kvHeads": 4,
                   "headDim": 128, "vocab": 152064, "intermediate": 18944, "tie": False},
}
CPU_SHAPE = {"tiny-cpu": {"architecture": "llama", "layers": 2, "hidden": 64, "heads": 2, "kvHeads": 2, "headDim": 32,
                          "vocab": 512, "intermediate": 128, "tie": False}}
SEQ_LEN, CPU_SEQ_LEN = 2048, 96
STAGES = (2, 3)
TRAININGS = ("full", "lora")
MAX_MICRO_BATCH = 16
STEPS = 12
LOGGING_STEPS = 2
TIMEOUT = 900.0
# The device's GPU -> data/gpu_catalog.yaml's type and its bf16 dense peak (the catalog's, for MFU).
GPUS = {"H200": ("nvidia-h200-141gb", 989.5), "H100": ("nvidia-h100-80gb", 989.5), "A100": ("nvidia-a100-80gb", 312),
        "L4": ("nvidia-l4", 121)}
RATE = re.compile(r"rank 0: step (\d+)/\d+ .*?, ([\d,.]+) tokens/s \(([\d,.]+) per GPU\)")
OOM = ("CUDA out of memory", "OutOfMemoryError", "CUBLAS_STATUS_ALLOC_FAILED")


def settings(models: Sequence[str]) -> list[dict[str, Any]]:
    """The grid: each model x ZeRO stage x full/LoRA; micro batch 1 and then the largest that fits (found at run
    time), in this order."""
    return [{"model": m, "zero": z, "training": t} for m in models for z in STAGES for t in TRAININGS]


def finetune_args(model: Path, data: Path, ds_config: Path, checkpoints: Path, out: Path, precision: str,
                  lora: bool, steps: int, seq_len: int) -> list[str]:
    """finetune.py's arguments as the stack's finetune kind passes them: text records packed into seq_len blocks,
    gradient checkpointing, LoRA rank 16 on all-linear or every parameter; a save only at the end (not measured)."""
    return ["--deepspeed_config", str(ds_config), "--model", str(model), "--dataset", str(data),
            "--text-field", "text", "--packing", "on", "--seq-len", str(seq_len), "--max-steps", str(steps),
            "--save-steps", str(steps * 10), "--learning-rate", "0.0001", "--precision", precision,
            *(["--lora", "--lora-rank", "16"] if lora else []), "--gradient-checkpointing",
            "--checkpoint-dir", str(checkpoints), "--model-dir", str(out), "--logging-steps", str(LOGGING_STEPS)]


def with_micro_batch(ds_config: Mapping[str, Any], micro_batch: int) -> dict[str, Any]:
    """The stack's ds_config.json with another micro batch on one GPU (the global batch follows)."""
    accumulation = int(ds_config.get("gradient_accumulation_steps", 1))
    return {**ds_config, "train_micro_batch_size_per_gpu": micro_batch,
            "train_batch_size": micro_batch * accumulation}


def rates(output: str) -> list[tuple[int, float]]:
    """(step, tokens/s per GPU) of rank 0's progress lines (recipes/finetune_progress.py)."""
    return [(int(step), float(per.replace(",", ""))) for step, _total, per in RATE.findall(output)]


def steady_rate(output: str) -> float | None:
    """The median tokens/s per GPU after the first logging step (warm-up); None with fewer than two lines."""
    found = rates(output)
    return statistics.median(r for _step, r in found[1:]) if len(found) >= 2 else None


def out_of_memory(output: str) -> bool:
    return any(marker in output for marker in OOM)


def result(setting: Mapping[str, Any], micro_batch: int, output: str, code: int, parameters: float,
           peak_tflops: float | None, peak_memory_gib: float | None, device: str, seq_len: int) -> dict[str, Any]:
    """One JSON line's content: the setting, and what it measured, or why not (oom, fail)."""
    lora = setting["training"] == "lora"
    line: dict[str, Any] = {"gpu_bench": "ok", **setting, "micro_batch": micro_batch, "sequence_length": seq_len,
                            "parameters": parameters, "device": device}
    rate = steady_rate(output) if code == 0 else None
    if rate is None:
        line["gpu_bench"] = "oom" if out_of_memory(output) else "fail"
        line["exit"] = code
        line["tail"] = " | ".join(output.strip().splitlines()[-5:])[-600:]
        return line
    line["tokens_per_second_per_gpu"] = round(rate, 1)
    if peak_tflops:
        line["mfu"] = round(rate * (4 if lora else 6) * parameters / (peak_tflops * 1e12), 4)
    if peak_memory_gib is not None:
        line["peak_memory_gib"] = round(peak_memory_gib, 2)
    return line


def parse_lines(text: str) -> list[dict[str, Any]]:
    """The bench's JSON lines out of its output (other lines skipped)."""
    out = []
    for line in text.splitlines():
        if line.startswith('{"gpu_bench"'):
            out.append(json.loads(line))
    return out


def records(tokens: int) -> list[dict[str, str]]:
    """Text records of about `tokens` tokens in all (about 4 characters a token): numbered words, so that the tiny
    BPE learns real merges."""
    words = " ".join(f"word{i % 997} and number {i}" for i in range(200))
    count = max(8, tokens * 4 // len(words) + 1)
    return [{"text": f"record {i}: {words}"} for i in range(count)]


# --- the run (torch, transformers, deepspeed) ----------------------------------------------------------------------

def make_model(shape: Mapping[str, Any], data: Path, base: Path, precision: str) -> float:
    """tiny_llm's tokenizer, then a model of `shape` at random weights in the training precision; its parameters."""
    import importlib.util

    import torch
    import transformers

    spec = importlib.util.spec_from_file_location("tiny_llm", TINY_LLM)
    assert spec and spec.loader
    tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny)
    tiny.make(data, base)  # the tokenizer (and a tiny model, replaced below)
    kind = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM")}
    config_class, model_class = (getattr(transformers, n) for n in kind[shape["architecture"]])
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(base))
    config = config_class(vocab_size=shape["vocab"], hidden_size=shape["hidden"],
                          intermediate_size=shape["intermediate"], num_hidden_layers=shape["layers"],
                          num_attention_heads=shape["heads"], num_key_value_heads=shape["kvHeads"],
                          head_dim=shape["headDim"], max_position_embeddings=max(SEQ_LEN, 4096),
                          tie_word_embeddings=shape["tie"], bos_token_id=tokenizer.bos_token_id,
                          eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = model_class(config).to(dtype)
    model.save_pretrained(str(base))
    return float(sum(p.numel() for p in model.parameters()))


class MemoryWatch(threading.Thread):
    """The GPU's used memory at its highest while a run trains (nvidia-smi every half second; CUDA's context in it)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak_mib: float | None = None
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=5, check=False).stdout
                used = float(out.strip().splitlines()[0])
                self.peak_mib = max(self.peak_mib or 0.0, used)
            except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
                pass
            self.done.wait(0.5)


def run_once(args: Sequence[str], cpu: bool, port: int, log: Path, timeout: float,
             env: Mapping[str, str]) -> tuple[int, str, float | None]:
    """One launcher run: exit status, output, peak GPU memory in GiB (None on CPU)."""
    watch = None if cpu else MemoryWatch()
    if watch:
        watch.start()
    command = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "1", "--master_port", str(port),
               str(FINETUNE), *args]
    full_env = {**os.environ, **env, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false",
                **({"DS_ACCELERATOR": "cpu"} if cpu else {})}
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=full_env, timeout=timeout, check=False,
                              cwd=str(ROOT))
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as late:
        code, output = 124, f"{late.stdout or ''}{late.stderr or ''}\n[gpu-bench] timed out after {timeout:.0f} s"
    finally:
        if watch:
            watch.done.set()
            watch.join()
    log.write_text(output if isinstance(output, str) else str(output), encoding="utf-8")
    return code, output, (watch.peak_mib / 1024 if watch and watch.peak_mib else None)


def run_bench(cpu: bool, quick: bool, steps: int, work: Path, wheels: Path, timeout: float,
              peak_tflops: float | None) -> int:
    import torch

    precision = "fp32" if cpu else "bf16"
    device = "cpu" if cpu else torch.cuda.get_device_name(0)
    if peak_tflops is None and not cpu:
        peak_tflops = next((p for name, (_t, p) in GPUS.items() if name in device), None)
    shapes = CPU_SHAPE if cpu else SHAPES
    seq_len = CPU_SEQ_LEN if cpu else SEQ_LEN
    grid = settings(list(shapes)[:1] if quick else list(shapes))
    data = work / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records(steps * MAX_MICRO_BATCH * seq_len)),
                    encoding="utf-8")
    bases: dict[str, tuple[Path, float]] = {}
    failures, port = 0, 29600
    for setting in grid:
        name = setting["model"]
        if name not in bases:
            base = work / f"base-{name}"
            bases[name] = (base, make_model(shapes[name], data, base, precision))
        base, parameters = bases[name]
        source = json.loads((wheels / DS_CONFIGS[(setting["zero"], precision)]).read_text(encoding="utf-8"))
        micro = 1
        while micro <= MAX_MICRO_BATCH:
            ds_config = work / f"ds-{setting['zero']}-{micro}.json"
            ds_config.write_text(json.dumps(with_micro_batch(source, micro)), encoding="utf-8")
            tag = f"{name}-z{setting['zero']}-{setting['training']}-mb{micro}"
            args = finetune_args(base, data, ds_config, work / f"ck-{tag}", work / f"out-{tag}", precision,
                                 setting["training"] == "lora", steps, seq_len)
            port += 1
            code, output, memory = run_once(args, cpu, port, work / f"{tag}.log", timeout, {})
            line = result(setting, micro, output, code, parameters, peak_tflops, memory, device, seq_len)
            if micro == 1 or line["gpu_bench"] == "ok":
                print(json.dumps(line), flush=True)  # micro batch 1 always; a larger one when it fits
            if line["gpu_bench"] != "ok":
                failures += line["gpu_bench"] == "fail"
                break
            micro = 2 if micro == 1 else micro * 2
            if cpu or quick:
                break
    return 1 if failures else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="a tiny shape in fp32 on CPU ranks (DS_ACCELERATOR=cpu)")
    parser.add_argument("--quick", action="store_true", help="the first model only, micro batch 1 only")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--timeout", type=float, default=TIMEOUT, help="seconds per finetune.py run")
    parser.add_argument("--peak-tflops", type=float, help="the GPU's dense bf16 peak (default: by its name)")
    parser.add_argument("--work", type=Path, help="working folder (default: a new temporary one)")
    parser.add_argument("--wheels", type=Path, default=WHEELS, help="make gpu-wheels' folder (its ds_config files)")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    code = run_bench(args.cpu, args.quick, args.steps, work, args.wheels, args.timeout, args.peak_tflops)
    print(f"[gpu-bench] {time.monotonic() - start:.0f} s, logs in {work}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
