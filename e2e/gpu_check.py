"""`make gpu-check`: finetune.py as the stack runs it, on one GPU of a lent device machine (issue 27, item 5).

    bash e2e/gpu_check.sh [--cpu] [--steps N] [--work DIR]   # installs build/gpu-wheels/, then runs this file

1. A tiny Llama (random weights, e2e/tiny_llm.py's builder) with a chat template, and 64 prompt/response records.
2. recipes/finetune.py under the DeepSpeed launcher (--num_gpus 1) with the stack's ds_config.json for a
   finetune workload (ZeRO-3; bf16 on the GPU), LoRA and gradient checkpointing: N steps, adapter export.
3. The same command again with --lora-export merged: it resumes from step N's checkpoint, trains nothing (the run is
   at its last step; transformers alone would train step N+1: seen on CPU before finetune.py stopped it) and writes
   the merged model, ZeRO-3 gathering the weights as on the cluster. Both exports must name step N.
4. Reloads both exports and compares greedy tokens for a held-out conversation rendered by the chat template
   (add_generation_prompt, as vLLM's /v1/chat/completions renders it): the merged export (transformers) must equal
   the adapter of the step its .complete names (that step's checkpoint) merged in memory at the training precision
   (peft), as finetune.py merges; the adapter export on the base, unmerged, must equal it merged in fp32 (in bf16
   rounding may move a near-tied argmax: then it is reported, not failed).
5. Prints one JSON line, {"gpu_check": "pass" | "fail", ...}, last; exit status 0 only on pass.

`--packing` trains both runs padding-free (finetune.py --packing on: transformers' DataCollatorWithFlattening, a
micro batch's records in one row, position ids restarting at each) and first checks, on the device, that the base
model's logits for two records flattened into one row equal each record's own (no record attends to another: the
attention reads the boundaries from the position ids); in fp32 they must agree to PACKED_TOLERANCE, in the training
precision the difference is reported.

`--cpu` runs the same path on CPUs (fp32, DS_ACCELERATOR=cpu, gloo): how it was tested without a device.
Everything above `run_check` is plain Python, unit-tested without torch (tests/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FINETUNE = ROOT / "recipes" / "finetune.py"
TINY_LLM = ROOT / "e2e" / "tiny_llm.py"
WHEELS = ROOT / "build" / "gpu-wheels"
MIB = 1024 * 1024
# The stack's ds_config.json for each precision the check runs (e2e/gpu_wheels.py writes them with
# workloads/ds_config.py's build_ds_config, as the stack does for a finetune workload).
DS_CONFIGS = {"bf16": "ds_config_bf16.json", "fp32": "ds_config_fp32.json"}
STEPS = 20
SEQ_LEN = 64
LEARNING_RATE = 0.01  # a LoRA adapter learns a random model slowly (e2e/finetune_common.py's FINETUNE_DS uses the same)
NEW_TOKENS = 12
# Each finetune.py run; the two runs and the comparison fit the 8 minutes on a GPU.
FINETUNE_TIMEOUT = 200.0
NUMBERS = ("zero", "one", "two", "three", "four", "five", "six", "seven")
# A ChatML-style template, for a tokenizer that has none (e2e/tiny_llm.py's model before it gets its own).
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
HELD_OUT = [{"role": "user", "content": "What is seven plus seven?"}]
# fp32 logits of a record alone and inside a flattened row: the same sums in another order (measured: ~1e-6).
PACKED_TOLERANCE = 1e-3
LOSS_LINE = re.compile(r"\{'loss': '?([\d.]+)'?")
WHEEL_NAME = re.compile(r"^(?P<name>[A-Za-z0-9_.]+?)-(?P<version>[0-9][^-]*?)(-[^-]+-[^-]+-[^-]+\.whl|\.tar\.gz)$")


def normalize(name: str) -> str:
    """PyPI's name normalization (PEP 503): wheel files spell pydantic-core as pydantic_core."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_problems(files: Sequence[str], wanted: Mapping[str, str]) -> list[str]:
    """What the wheel folder lacks or holds twice: one file per wanted package at its version (two versions of one
    stop pip's whole install), deepspeed as its sdist (PyPI has no wheel of it)."""
    found: dict[str, list[tuple[str, str]]] = {}
    for file in files:
        match = WHEEL_NAME.match(file)
        if match:
            found.setdefault(normalize(match["name"]), []).append((match["version"], file))
    problems = []
    for name, version in wanted.items():
        have = found.get(normalize(name), [])
        if not have:
            problems.append(f"no {name}=={version} in the wheel folder (make gpu-wheels)")
        elif len(have) > 1:
            problems.append(f"{name}: {len(have)} files ({', '.join(f for _, f in have)}); keep one")
        elif have[0][0] != version:
            problems.append(f"{name}: {have[0][1]} is not version {version}")
        elif normalize(name) == "deepspeed" and not have[0][1].endswith(".tar.gz"):
            problems.append(f"deepspeed: {have[0][1]} is not the sdist (built on the device against its torch)")
    return problems


def finetune_args(model: Path, data: Path, ds_config: Path, checkpoints: Path, out: Path, precision: str,
                  steps: int, export: str, packing: bool = False) -> list[str]:
    """finetune.py's arguments as the stack's finetune kind passes them, LoRA and gradient checkpointing on;
    `packing`: padding-free batches (finetune.packing: true)."""
    return [*(["--packing", "on"] if packing else []),
            "--deepspeed_config", str(ds_config), "--model", str(model), "--dataset", str(data),
            "--prompt-field", "prompt", "--response-field", "response", "--seq-len", str(SEQ_LEN),
            "--max-steps", str(steps), "--save-steps", str(steps), "--learning-rate", str(LEARNING_RATE),
            "--precision", precision, "--lora", "--lora-export", export, "--gradient-checkpointing",
            "--checkpoint-dir", str(checkpoints), "--model-dir", str(out), "--logging-steps", "5"]


def launcher_command(python: str, port: int, script_args: Sequence[str]) -> list[str]:
    """The DeepSpeed launcher on this host's one GPU (or one CPU rank), as `deepspeed --num_gpus 1` runs it."""
    return [python, "-m", "deepspeed.launcher.runner", "--num_gpus", "1", "--master_port", str(port),
            str(FINETUNE), *script_args]


def launch_env(base: Mapping[str, str], cpu: bool) -> dict[str, str]:
    """No hub; DeepSpeed's CPU accelerator (gloo) with --cpu, else whatever it detects (CUDA)."""
    env = {**base, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    if cpu:
        env["DS_ACCELERATOR"] = "cpu"
    return env


def losses(output: str) -> list[float]:
    """The Trainer's logged losses in order (transformers 5 prints them as strings: {'loss': '3.458', ...})."""
    return [float(v) for v in LOSS_LINE.findall(output)]


def token_problems(tokens: Mapping[str, list[int]], precision: str) -> list[str]:
    """The comparisons that must hold: the merged export equals its in-memory expectation (the adapter of the step it
    names, merged into the base at the training precision, as finetune.py merges); the adapter export on the base,
    unmerged (peft), equals the same adapter merged in memory where the arithmetic is fp32 (in bf16 the rounding of
    merged weights may move a near-tied argmax: the run reports it, the check does not fail on it)."""
    problems = []
    if tokens["merged_export"] != tokens["merged_in_memory"]:
        problems.append(f"merged export's greedy tokens {tokens['merged_export']} != its adapter merged in memory "
                        f"{tokens['merged_in_memory']}")
    if precision == "fp32" and tokens["adapter_on_base"] != tokens["adapter_merged"]:
        problems.append(f"adapter export on the base (peft) {tokens['adapter_on_base']} != the same adapter merged "
                        f"{tokens['adapter_merged']}")
    if len(tokens["merged_export"]) != NEW_TOKENS:
        problems.append(f"{len(tokens['merged_export'])} new tokens, expected {NEW_TOKENS}")
    return problems


def packed_problems(max_diff: Mapping[str, float]) -> list[str]:
    """The fp32 logits of records flattened into one row must equal each record's own (to PACKED_TOLERANCE)."""
    fp32 = max_diff.get("fp32")
    if fp32 is None or fp32 > PACKED_TOLERANCE:
        return [f"flattened records' fp32 logits differ from each record's own by {fp32} (over {PACKED_TOLERANCE}): "
                "records of a padding-free batch attend to each other"]
    return []


def step_problems(adapter_step: int, merged_step: int, steps: int) -> list[str]:
    """Both exports are step N's: the merged run resumed at the last step and exported it without training."""
    return [f"the {what} export names step {step}, expected {steps} (--max-steps)" for what, step in
            (("adapter", adapter_step), ("merged", merged_step)) if step != steps]


def exported_step(model_dir: Path) -> int:
    """The step MODEL_DIR/.complete names (finetune.py's marker)."""
    return int(json.loads((model_dir / ".complete").read_text(encoding="utf-8"))["step"])


def result_line(problems: Sequence[str], **facts: Any) -> str:
    return json.dumps({"gpu_check": "fail" if problems else "pass", **facts, "problems": list(problems)})


def records() -> list[dict[str, str]]:
    """e2e/finetune_common.py's finetune data: 64 prompt/response pairs a tiny model learns within a few dozen steps."""
    return [{"prompt": f"What is {a} plus {b}?", "response": f"{a} plus {b} is {i + j}."}
            for i, a in enumerate(NUMBERS) for j, b in enumerate(NUMBERS)]


# --- the run (torch, transformers, peft, deepspeed) ----------------------------------------------------------------

def _tiny_llm() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check_tiny_llm", TINY_LLM)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _finetune() -> Any:
    """recipes/finetune.py as a module, its own modules beside it on sys.path (as `python finetune.py`)."""
    import importlib.util

    sys.path.insert(0, str(FINETUNE.parent))
    spec = importlib.util.spec_from_file_location("gpu_check_finetune", FINETUNE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def make_model(data: Path, base: Path) -> None:
    """tiny_llm's model and tokenizer; a chat template added where the builder gives none."""
    from transformers import AutoTokenizer

    _tiny_llm().make(data, base)
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    if not tokenizer.chat_template:
        tokenizer.chat_template = CHAT_TEMPLATE
        tokenizer.save_pretrained(str(base))


def run_finetune(args: Sequence[str], cpu: bool, port: int, log: Path, timeout: float) -> tuple[int, str, float]:
    """One launcher run; a run past `timeout` is a failed check (exit status 124), its output kept."""
    start = time.monotonic()
    try:
        result = subprocess.run(launcher_command(sys.executable, port, args), capture_output=True, text=True,
                                env=launch_env(os.environ, cpu), timeout=timeout, check=False, cwd=str(ROOT))
        code, output = result.returncode, result.stdout + result.stderr
    except subprocess.TimeoutExpired as late:
        code = 124
        output = "".join(x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
                         for x in (late.stdout, late.stderr)) + f"\n[gpu-check] timed out after {timeout:.0f} s"
    log.write_text(output, encoding="utf-8")
    return code, output, time.monotonic() - start


def greedy(model: Any, ids: list[int], device: str) -> list[int]:
    """The plain argmax loop (EOS ignored), as e2e/tiny_llm.py's generate: what a server's greedy reply must be."""
    import torch

    out = torch.tensor([ids], device=device)
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(out).logits[:, -1, :]
            out = torch.cat([out, logits.argmax(dim=-1, keepdim=True)], dim=1)
    return out[0, len(ids):].tolist()


def compare_exports(base: Path, adapter: Path, merged: Path, checkpoints: Path, precision: str,
                    device: str) -> dict[str, Any]:
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(merged))
    ids = tokenizer.apply_chat_template(HELD_OUT, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if isinstance(ids, Mapping) else ids)
    train_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[precision]

    def load(path: Path, dtype: Any) -> Any:
        return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)

    def merged_in_memory(lora: Path) -> Any:
        # finetune.py's merge, repeated: the base at the training precision, the adapter merged in on the CPU.
        return PeftModel.from_pretrained(load(base, train_dtype), str(lora)).merge_and_unload().float()

    def tokens_of(model: Any) -> list[int]:
        return greedy(model.to(device).eval(), ids, device)

    # The merged run resumes from the adapter run's checkpoint: its adapter is the checkpoint of the step it names
    # (step N, that the adapter run exported too: step_problems).
    merged_step = exported_step(merged)
    tokens = {"base": tokens_of(load(base, torch.float32)),
              "merged_export": tokens_of(load(merged, torch.float32)),
              "merged_in_memory": tokens_of(merged_in_memory(checkpoints / f"checkpoint-{merged_step}")),
              "adapter_on_base": tokens_of(PeftModel.from_pretrained(load(base, torch.float32), str(adapter))),
              "adapter_merged": tokens_of(merged_in_memory(adapter))}
    lora_b = [t for k, t in load_file(str(adapter / "adapter_model.safetensors")).items() if "lora_B" in k]
    return {"prompt_token_ids": ids, "tokens": tokens, "adapter_step": exported_step(adapter),
            "merged_step": merged_step,
            "lora_b_max": max(float(t.abs().max()) for t in lora_b) if lora_b else 0.0,
            "adapter_bytes": sum(p.stat().st_size for p in adapter.iterdir()),
            "merged_bytes": sum(p.stat().st_size for p in merged.iterdir())}


def packed_logits(base: Path, precision: str, device: str) -> dict[str, Any]:
    """The base model's logits for two held-out records, each alone and both flattened into one row by the collator
    the Trainer uses with --packing on (position ids restarting, no attention mask): the largest difference, in fp32
    and at the training precision."""
    import torch
    import transformers
    from transformers import AutoTokenizer, DataCollatorWithFlattening

    tokenizer = AutoTokenizer.from_pretrained(str(base))
    rows = [tokenizer.apply_chat_template([{"role": "user", "content": f"What is {a} plus {b}?"}],
                                          add_generation_prompt=True, tokenize=True)
            for a, b in (("two", "three"), ("seven", "one"))]
    rows = [list(r["input_ids"] if isinstance(r, Mapping) else r) for r in rows]
    batch = DataCollatorWithFlattening(return_position_ids=True)([{"input_ids": r} for r in rows])
    dtypes = {"fp32": torch.float32, precision: {"bf16": torch.bfloat16, "fp16": torch.float16,
                                                "fp32": torch.float32}[precision]}
    max_diff: dict[str, float] = {}
    attention = ""
    _finetune()  # the recipes package on the path, as finetune.py finds it
    from recipes.finetune_train import training_model

    for name, dtype in dtypes.items():
        # The model as finetune.py loads it to train (its KV cache off: training_model says why).
        model = training_model(str(base), None, transformers.__version__, dtype)[0].to(device).eval()
        attention = str(model.config._attn_implementation)
        with torch.no_grad():
            flat = model(input_ids=batch["input_ids"].to(device),
                         position_ids=batch["position_ids"].to(device)).logits[0].float()
            alone = torch.cat([model(input_ids=torch.tensor([r], device=device)).logits[0].float() for r in rows])
        max_diff[name] = float((flat - alone).abs().max())
    return {"packed_max_diff": max_diff, "attention": attention, "packed_tokens": [len(r) for r in rows]}


def versions() -> dict[str, str]:
    import datasets
    import deepspeed
    import peft
    import torch
    import transformers

    return {"torch": torch.__version__, "deepspeed": deepspeed.__version__, "transformers": transformers.__version__,
            "peft": peft.__version__, "datasets": datasets.__version__}


def run_check(cpu: bool, steps: int, work: Path, wheels: Path, timeout: float, packing: bool = False) -> int:
    import torch

    start = time.monotonic()
    precision = "fp32" if cpu else "bf16"
    device = "cpu" if cpu else "cuda"
    facts: dict[str, Any] = {"precision": precision, "zero_stage": 3, "lora": True, "gradient_checkpointing": True,
                             "steps": steps, "packing": packing, **versions(),
                             "device": "cpu" if cpu else torch.cuda.get_device_name(0)}
    problems: list[str] = []
    if not cpu and not torch.cuda.is_available():
        print(result_line(["no CUDA device (run with --cpu off a device machine)"], **facts), flush=True)
        return 1
    ds_config = wheels / DS_CONFIGS[precision]
    if not ds_config.is_file():
        print(result_line([f"no {ds_config} (make gpu-wheels writes it)"], **facts), flush=True)
        return 1
    data, base = work / "data.jsonl", work / "base"
    data.write_text("".join(json.dumps(r) + "\n" for r in records()), encoding="utf-8")
    make_model(data, base)
    if packing:
        facts.update(packed_logits(base, precision, device))
        problems += packed_problems(facts["packed_max_diff"])
    checkpoints, adapter, merged = work / "checkpoints", work / "adapter", work / "merged"
    phases: dict[str, float] = {}
    trained = True
    for export, out, port in (("adapter", adapter, 29511), ("merged", merged, 29512)):
        args = finetune_args(base, data, ds_config, checkpoints, out, precision, steps, export, packing)
        code, output, seconds = run_finetune(args, cpu, port, work / f"finetune-{export}.log", timeout)
        phases[f"finetune_{export}_s"] = round(seconds, 1)
        if export == "adapter":
            facts["losses"] = losses(output)
        if code != 0 or not (out / ".complete").is_file():
            tail = output.strip().splitlines()[-15:]
            problems.append(f"finetune.py ({export} export) exited {code}: " + " | ".join(tail))
            trained = False
            break
    if trained:
        compared = compare_exports(base, adapter, merged, checkpoints, precision, device)
        facts.update(compared)
        problems += step_problems(compared["adapter_step"], compared["merged_step"], steps)
        problems += token_problems(compared["tokens"], precision)
        if compared["lora_b_max"] == 0.0:
            problems.append("the adapter's lora_B weights are all zero: training did not update it")
        if compared["tokens"]["adapter_on_base"] != compared["tokens"]["adapter_merged"]:
            facts["note"] = "the adapter on the base differs from it merged (rounding of the merged weights)"
    print(result_line(problems, **facts, **phases, total_s=round(time.monotonic() - start, 1)), flush=True)
    return 1 if problems else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="fp32 on CPUs (DS_ACCELERATOR=cpu, gloo)")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--packing", action="store_true", help="padding-free batches, and the flattened logits check")
    parser.add_argument("--timeout", type=float, default=FINETUNE_TIMEOUT, help="seconds per finetune.py run")
    parser.add_argument("--work", type=Path, help="working folder (default: a new temporary one)")
    parser.add_argument("--wheels", type=Path, default=WHEELS, help="make gpu-wheels' folder (its ds_config.json)")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    return run_check(args.cpu, args.steps, work, args.wheels, args.timeout, args.packing)


if __name__ == "__main__":
    sys.exit(main())
