"""The `adapters` scenario's inputs (adapters_scenario.py): the task's pairs and records, the two-workload stack,
the exported adapters, and the check of lm-eval's scores."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

from finetune_common import FINETUNE_DS, FINETUNE_KEYS, FINETUNE_LAUNCH_ARGS, NUMBERS
from harness import ROOT, _chown_dirs, fail_unless, write

# --- adapters: two LoRA runs served by one vLLM, the evaluation and its gate -----------------------------------

EVALUATE = ROOT / "recipes" / "evaluate.py"
EVALUATOR = ROOT / "recipes" / "evaluator.py"  # serving.evaluation's container: it runs EVALUATE
LORA_LLM = Path(__file__).resolve().parent / "lora_llm.py"
ADAPTER_LOADER = ROOT / "recipes" / "adapter_loader.py"  # beside vLLM in every replica of a fleet
REPLICA_STAND_IN = Path(__file__).resolve().parent / "replica_stand_in.py"
ADAPTER_INPUTS = "e2e-adapters"  # the base model, both data sets and the held-out task, in the bucket
# Two finetune workloads on the same base, each taught its own one-word answer in OpenAI chat records (through the
# tiny model's chat template); the server serves `no` (its serving.fromWorkload) and `yes` (serving.adapters), and
# `yes` is evaluated and gated on held-out conversations. `no`'s adapter, taught the wrong answer to the same
# questions, then stands in for a later export of `yes` (copied into its MODEL_DIR as a run would write it).
ADAPTER_ANSWERS = {"no": "no", "yes": "yes"}
GATED = "yes"
ADAPTER_STEPS, ADAPTER_SAVE_STEPS = 20, 10
# Rank 2 on every linear layer: the tiny Llama's adapter is then 4.3 % of its weights (a real 7B's rank-16 adapter
# is about 0.5 %: its embeddings dominate); vLLM holds it in --max-lora-rank 8, its smallest rank above 1.
ADAPTER_DS = {**FINETUNE_DS, "learningRate": 0.1}
ADAPTER_MAX_SHARE = 0.05  # an adapter's weights, at most this share of the (merged) model's
TASK_RECORDS = 20
# One token: the tiny model learns its answer's token (`yes` is one in its tokenizer) within a few steps, but not to
# stop after it (its logits stay small: RMSNorm and the output head's small initialisation), so longer replies are
# `yesyes...`; a user's task generates until the end of the turn or --max-tokens (default 32).
EVAL_MAX_TOKENS = 1
GATE = 0.1  # nats per reference token: the trained adapter must beat the base (then the served one) by this
LIKELIHOOD_TOLERANCE = 1e-3  # vLLM's prompt logprobs against transformers', both float32 on CPU
# The bucket's mount (gcsFuse.mountPath) of this scenario's pods: a folder no other scenario mounts, so that a run of
# older harness code beside this one (which removed /gcs at its end, unmounting it in every run) cannot take it away.
ADAPTER_BUCKET_MOUNT = "/gcs-adapters"
# An adapter trained outside the stack's workloads, served from a bucket folder beside the stack's own (serving.adapters
# {name, path, rank, base}): trained on the base with PEFT alone (no Trainer, no DeepSpeed: lora_llm.py plan), as a
# user's notebook makes one, and saved into the folder; FOLDER_STEPS steps on GATED's records, rank 4 on q and v.
FOLDER_ADAPTER = {"name": "e2e-peft", "path": f"{ADAPTER_INPUTS}/peft-adapter", "rank": 4,
                  "base": f"{ADAPTER_INPUTS}/base"}
FOLDER_STEPS = 8


def adapter_pairs() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The 64 prompts' word pairs: 20 held out for the task (every third), the other 44 trained on."""
    pairs = [(a, b) for a in NUMBERS for b in NUMBERS]
    held = pairs[::3][:TASK_RECORDS]
    return [p for p in pairs if p not in held], held


def adapter_prompt(pair: tuple[str, str]) -> str:
    return f"Is {pair[0]} next to {pair[1]}?"


def chat_record(pair: tuple[str, str], answer: str) -> dict[str, Any]:
    """OpenAI's chat format: the question, and the answer as the assistant's (last) turn."""
    return {"messages": [{"role": "user", "content": adapter_prompt(pair)}, {"role": "assistant", "content": answer}]}


def adapter_records() -> list[dict[str, Any]]:
    """Both workloads' training records (the same prompts, each its own answer)."""
    train, _held = adapter_pairs()
    return [chat_record(p, answer) for answer in ADAPTER_ANSWERS.values() for p in train]


def adapter_assets(bucket: Path, base_model: Path) -> None:
    """Each workload's data (the same prompts, its own answer), the task (held-out prompts, GATED's answer) and the
    base (`base_model`: the vertex scenario's merged export; the run's tiny Llama, finetune_common.tiny_base, has a
    tokenizer trained on these records too), in the bucket."""
    base = bucket / ADAPTER_INPUTS
    base.mkdir(parents=True, exist_ok=True)
    train, held = adapter_pairs()
    for name, answer in ADAPTER_ANSWERS.items():
        write(base / f"{name}.jsonl", "".join(json.dumps(chat_record(p, answer)) + "\n" for p in train))
    write(base / "task.jsonl", "".join(json.dumps(chat_record(p, ADAPTER_ANSWERS[GATED])) + "\n" for p in held))
    shutil.copytree(base_model, base / "base", ignore=shutil.ignore_patterns(".complete", "run.json"),
                    dirs_exist_ok=True)
    _chown_dirs(bucket)


def adapters_stack() -> Any:
    """The dev stack with the two finetune workloads and their server, loaded and checked by the stack's own code:
    the server's adapters, LoRA flags and markers are the stack's."""
    import yaml

    from checks import load
    from preview.engine import engine_config_from_yaml, stack_file

    with open(stack_file("dev"), encoding="utf-8") as handle:
        config = copy.deepcopy(yaml.safe_load(handle)["config"])
    config["deepspeed-stack:storage"] = {**config.get("deepspeed-stack:storage", {}), "enabled": True}
    config["deepspeed-stack:mpiOperator"] = {**config.get("deepspeed-stack:mpiOperator", {}), "install": True}
    gcs = {"enabled": True, "mountPath": ADAPTER_BUCKET_MOUNT}
    workloads: dict[str, Any] = {}
    for name in ADAPTER_ANSWERS:
        workloads[name] = {
            "kind": "finetune", "pool": "t4", "workers": 1, "namespace": f"e2e-{name}", "gcsFuse": gcs,
            "storage": {"storageClass": "standard-rwx", "claimName": f"{name}-shared"},
            "deepspeed": dict(ADAPTER_DS), "launch": {"script": "finetune.py", "args": FINETUNE_LAUNCH_ARGS},
            # Chat records through the tiny model's own template (chatTemplate auto): the marker says so, and
            # the evaluation renders the task the same way.
            "finetune": {"modelPath": f"{ADAPTER_INPUTS}/base", "datasetPath": f"{ADAPTER_INPUTS}/{name}.jsonl",
                         "sequenceLength": 32, "maxSteps": ADAPTER_STEPS, "saveSteps": ADAPTER_SAVE_STEPS,
                         "lora": {"rank": 2}},
            "model": FINETUNE_KEYS["model"]}
    names = list(ADAPTER_ANSWERS)
    workloads["serve"] = {
        "kind": "serve", "pool": "t4", "namespace": "e2e-serve", "gcsFuse": gcs,
        "serving": {"fromWorkload": names[0], "adapters": [*names[1:], dict(FOLDER_ADAPTER)]},
        "model": {"parameters": 0.00015, "vocabulary": 512, "hidden": 64, "precision": "fp16", "mode": "inference",
                  "sequenceLength": 256}}
    config["deepspeed-stack:workloads"] = workloads
    engine_config, secret_keys = engine_config_from_yaml(config)
    return load(engine_config, set(secret_keys))


def _exported_adapter(model_dir: Path, base: Path, name: str) -> str:
    """MODEL_DIR holds an adapter (marker, files), its weights under ADAPTER_MAX_SHARE of the merged model's (a
    merged model has the base's tensors: the base's safetensors size)."""
    marker = json.loads((model_dir / ".complete").read_text())
    fail_unless(marker.get("export") == "adapter" and marker.get("step") == ADAPTER_STEPS
                and marker.get("rendering") == "chat" and marker.get("recordFormat") == "messages",
                f"{name}'s marker {marker}: expected an adapter export at step {ADAPTER_STEPS}, chat rendering")
    files = sorted(p.name for p in model_dir.iterdir())
    fail_unless("adapter_config.json" in files and "adapter_model.safetensors" in files
                and not [f for f in files if f.startswith("model")], f"{name}'s MODEL_DIR holds {files}")
    share = (model_dir / "adapter_model.safetensors").stat().st_size / (base / "model.safetensors").stat().st_size
    fail_unless(share < ADAPTER_MAX_SHARE, f"{name}'s adapter is {share:.1%} of the model's bytes")
    return f"{name} {share:.1%}"
