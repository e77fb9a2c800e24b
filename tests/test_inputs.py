"""Inputs that can never work, refused at preview (issue 32 item 6): paths that leave the stack's bucket.

Expected messages are written out here; the bucket-relative keys are found in model/schema.yaml, not in the code
under test."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import DELETE, load_file, problems

from model.config_schema import kind_branches, schema
from recipes import contract

TUNE = "workloads.tune"
CHAT = "workloads.chat"
MOUNT_NOTE = "(the pods see the bucket at /gcs, and nothing outside it is uploaded)"
CLIMBS = "has a '..' part, which climbs out of the bucket; write the path from the bucket's root"


# --- paths that leave the bucket ---------------------------------------------------------------------------------

def _bucket_keys() -> set[tuple[str, str]]:
    """(kind, key) of every workload key whose value is a path in the stack's bucket, by the schema's own words."""
    branches = kind_branches(schema()["properties"]["workloads"]["additionalProperties"])
    found = set()

    def walk(kind: str, node: dict[str, Any], path: str) -> None:
        for key, sub in (node.get("properties") or {}).items():
            where = f"{path}.{key}" if path else key
            text = f"{sub.get('x-form', '')} {sub.get('description', '')}"
            types = sub.get("type") if isinstance(sub.get("type"), list) else [sub.get("type")]
            if "string" in types and ("of the bucket" in text or "of the stack's bucket" in text
                                                or "in the bucket" in text):
                found.add((kind, where))
            walk(kind, sub, where)

    for kind, branch in branches.items():
        walk(kind, branch, "")
    return found


# Each bucket-relative key: a stack, its workload, what else it needs, and a value that climbs out of the bucket
# (with the path in the bucket the message names).
BUCKET_KEYS = {
    ("finetune", "finetune.datasetPath"): ("finetune", TUNE, {}, "../x.jsonl", "../x.jsonl"),
    ("finetune", "finetune.modelPath"): ("finetune", TUNE, {f"{TUNE}.finetune.model": DELETE}, "../m", "../m"),
    ("finetune", "finetune.evalSplit"): ("finetune", TUNE, {}, "../eval.jsonl", "../eval.jsonl"),
    ("finetune", "launch.script"): ("finetune", TUNE, {"storage.bucketName": "my-data"}, "gs://my-data/../x.py",
                                    "../x.py"),
    ("mpijob", "launch.script"): ("h100", "workloads.smoke", {}, "/gcs/../x.py", "../x.py"),
    ("serve", "serving.modelPath"): ("finetune", CHAT, {f"{CHAT}.serving.fromWorkload": DELETE}, "../m", "../m"),
    ("serve", "serving.evaluation.task"): ("finetune", CHAT, {}, "../x.jsonl", "../x.jsonl"),
}


# helm's `launch` is the mpijob's (one YAML anchor, one description), but its client runs only a file of
# recipes (workloads/kinds/shared.py refuses any path).
SHARED_DESCRIPTION = {("helm", "launch.script")}


# The recipe's keys are one definition (model/schema.yaml $defs.finetuneRun): on a Gaudi mpijob their paths are of
# the shared claim, held there by its own rule (tests/test_recipe.py).
ON_THE_CLAIM = {("mpijob", "finetune.modelPath"), ("mpijob", "finetune.datasetPath"), ("mpijob", "finetune.evalSplit")}


def test_every_bucket_path_key_of_the_schema_is_covered() -> None:
    assert _bucket_keys() == set(BUCKET_KEYS) | SHARED_DESCRIPTION | ON_THE_CLAIM


@pytest.mark.parametrize(("kind", "key"), sorted(BUCKET_KEYS))
def test_each_bucket_path_key_is_held_in_the_bucket(kind: str, key: str) -> None:
    stack, workload, changes, value, path = BUCKET_KEYS[(kind, key)]
    found = problems(stack, {**changes, f"{workload}.{key}": value})
    assert f"{workload}.{key}: the bucket path {path!r} {CLIMBS} {MOUNT_NOTE}" in found


def test_helm_takes_no_script_path() -> None:
    (found,) = problems("dev", {"workloads.smoke.launch.script": "gs://b/../x.py"})
    assert found.startswith("workloads.smoke.launch.script: no file 'gs://b/../x.py' in recipes")


@pytest.mark.parametrize(("key", "value", "expected"), [
    (f"{TUNE}.finetune.datasetPath", "../x.jsonl", f"'../x.jsonl' {CLIMBS}"),
    (f"{TUNE}.finetune.datasetPath", "data/../../etc/x.jsonl", f"'data/../../etc/x.jsonl' {CLIMBS}"),
    (f"{TUNE}.finetune.datasetPath", "./train.jsonl",
     "'./train.jsonl' has a '.' part, which names no object of the bucket; write the path from the bucket's root"),
])
def test_a_dataset_path_that_leaves_the_bucket_is_refused(key: str, value: str, expected: str) -> None:
    assert problems("finetune", {key: value}) == [f"{key}: the bucket path {expected} {MOUNT_NOTE}"]


def test_a_model_path_that_leaves_the_bucket_is_refused() -> None:
    key = f"{TUNE}.finetune.modelPath"
    # model.name: a bucket folder names no shape for the planner (checked on its own).
    assert problems("finetune", {f"{TUNE}.finetune.model": DELETE, key: "models/../../base",
                                 f"{TUNE}.model.name": "Qwen2.5-7B"}) == [
        f"{key}: the bucket path 'models/../../base' {CLIMBS} {MOUNT_NOTE}"]


def test_a_served_model_path_that_leaves_the_bucket_is_refused() -> None:
    key = f"{CHAT}.serving.modelPath"
    found = problems("finetune", {f"{CHAT}.serving.fromWorkload": DELETE, key: "../models/tune"})
    assert f"{key}: the bucket path '../models/tune' {CLIMBS} {MOUNT_NOTE}" in found


def test_a_script_in_the_bucket_that_leaves_it_is_refused() -> None:
    key = f"{TUNE}.launch.script"
    assert problems("finetune", {"storage.bucketName": "my-data", key: "gs://my-data/../other/train.py"}) == [
        f"{key}: the bucket path '../other/train.py' {CLIMBS} {MOUNT_NOTE}"]
    assert problems("finetune", {key: "/gcs/code/../../etc/train.py"}) == [
        f"{key}: the bucket path 'code/../../etc/train.py' {CLIMBS} {MOUNT_NOTE}"]
    assert problems("finetune", {key: "/gcs/code//train.py"}) == [
        f"{key}: the bucket path 'code//train.py' has an empty part (//), which no object of the bucket has "
        f"{MOUNT_NOTE}"]


@pytest.mark.parametrize("value", ["data/train.jsonl", "data/v1.2/train..jsonl", "data/.hidden/x.jsonl", "a"])
def test_paths_inside_the_bucket_pass(value: str) -> None:
    assert problems("finetune", {f"{TUNE}.finetune.datasetPath": value}) == []


def test_an_absolute_or_empty_part_path_is_the_schemas() -> None:
    """The schema's pattern already refuses these (its x-form says what is valid); the bucket rule adds nothing."""
    for value in ("/etc/passwd", "data//train.jsonl"):
        (found,) = problems("finetune", {f"{TUNE}.finetune.datasetPath": value})
        assert found.startswith(f"{TUNE}.finetune.datasetPath: ") and "a file or folder of the bucket" in found


# --- a shared claim is not re-owned at every pod start -------------------------------------------------------------

def _pod_specs(node: Any) -> list[dict[str, Any]]:
    """Every pod spec in a resource's inputs (a dict with containers), however deep (MPIJob, Deployment, ...)."""
    if isinstance(node, list):
        return [spec for item in node for spec in _pod_specs(item)]
    if not isinstance(node, dict):
        return []
    own = [node] if "containers" in node else []
    return own + [spec for value in node.values() for spec in _pod_specs(value)]


@pytest.mark.parametrize("stack", ["h100", "finetune", "gaudi", "dws"])
def test_pods_mounting_a_claim_skip_the_recursive_chown(stack: str) -> None:
    """Kubernetes' default with fsGroup (Always) re-owns every file of the claim at each mount; OnRootMismatch only
    when its root lacks the group (kubernetes.io, "Configure volume permission and ownership change policy for
    Pods")."""
    from conftest import stack_run

    specs = [spec for r in stack_run(stack).resources for spec in _pod_specs(r.inputs)
             if any("persistentVolumeClaim" in v for v in spec.get("volumes", []))]
    assert specs, f"{stack}: no pod mounts a claim"
    for spec in specs:
        context = spec["securityContext"]
        assert "fsGroup" in context
        assert context["fsGroupChangePolicy"] == "OnRootMismatch"


# --- NVMe offload needs the image's async_io op ------------------------------------------------------------------

NVME = {"workloads.smoke.deepspeed.zeroStage": 3, "workloads.smoke.deepspeed.offloadParams": "nvme"}


def test_nvme_offload_previews_on_the_image_that_builds_async_io() -> None:
    assert problems("dev", NVME) == []  # data/versions.yaml: the image builds async_io (and libaio is in it)


def test_nvme_offload_is_refused_on_an_image_without_async_io(monkeypatch: pytest.MonkeyPatch) -> None:
    import msgspec

    from model import versions

    shipped = versions.load()
    without = msgspec.structs.replace(shipped, deepspeed_ops={"fused_adam": "DS_BUILD_FUSED_ADAM"})
    monkeypatch.setattr(versions, "load", lambda *_: without)
    assert problems("dev", NVME) == [
        "workloads.smoke.deepspeed.offloadParams: nvme offload runs DeepSpeed's async_io op, which the stack's image "
        "does not build (data/versions.yaml image.deepspeedOps; it needs libaio-dev in "
        "workloads/images/deepspeed/Dockerfile and DS_BUILD_AIO=1); offload to cpu, or run an image with it (the "
        "workload's `image`, or image.prebuilt)"]
    assert problems("dev", {**NVME, "workloads.smoke.deepspeed.offloadParams": "cpu"}) == []
    # An image of the user's may have it: nothing here can see inside.
    assert problems("dev", {**NVME, "image.prebuilt": "registry.example.com/ml/deepspeed:1"}) == []


# --- launch.args: flags the script's own parser has ------------------------------------------------------------------

SCRIPTS = Path(__file__).resolve().parent.parent / "recipes"
UNRECOGNIZED = "(every rank would stop with \"unrecognized arguments\"); its flags, closest first: "


def _script_module(name: str) -> Any:
    """A project script as a module (above `main` it imports the standard library only); finetune.py with its
    modules beside it."""
    if name == "finetune":
        from workloads.finetune import script_module

        return script_module(name)
    return load_file(SCRIPTS / f"{name}.py", f"deepspeed_stack_test_{name}")


def _accepts(parse: Callable[[list[str]], Any], argv: list[str]) -> bool:
    try:
        parse(argv)
    except SystemExit as stop:
        return stop.code == 0
    return True


@pytest.mark.parametrize("script", ["finetune", "smoke_train"])
def test_the_flags_read_from_the_source_are_the_parsers(script: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The reader never runs the script; its answer must be what the script's argparse does with each flag."""
    from workloads import script_flags

    module = _script_module(script)
    base = ["--deepspeed_config", "ds.json"]
    parse = contract.FINETUNE.parser().parse_args if script == "finetune" else module.parse_args
    flags = script_flags.read(SCRIPTS / f"{script}.py")
    assert flags is not None
    values = {"--format": "auto", "--precision": "bf16", "--lora-target-modules": "q_proj", "--lora-export": "merged",
              "--records": "auto", "--roles": "bot=assistant", "--eval-split": "0.1", "--packing": "on",
              "--lr-scheduler": "cosine"}
    for flag in flags.flags:
        if flag in ("-h", "--help"):
            continue
        switches = ("--lora", "--gradient-checkpointing", "--check-data", "--prepare-data")
        value = [] if flag in switches else [values.get(flag, "1")]
        assert _accepts(parse, [*base, flag, *value]), flag
    assert not _accepts(parse, [*base, "--no-such-flag", "1"])
    prefix = "--logging-step" if script == "finetune" else "--hidd"  # a unique prefix of one flag
    assert flags.abbrev == _accepts(parse, [*base, prefix, "1"]) == (script == "smoke_train")
    capsys.readouterr()


def test_an_unknown_flag_of_the_smoke_test_is_refused() -> None:
    key = "workloads.smoke.launch.args[2]"
    (found,) = problems("h100", {"workloads.smoke.launch.args": ["--expected-gpus-per-node", "8", "--stepz", "50"]})
    assert found.startswith(f"{key}: smoke_train.py has no flag --stepz {UNRECOGNIZED}--steps, ")
    # Its flags only, without help and what the stack passes (--deepspeed_config; on this fabric pool DeepSpeed is
    # told --no_local_rank, so --local_rank is the user's to give).
    listed = set(found.split("closest first: ")[1].split(", "))
    assert listed == {"--steps", "--warmup-steps", "--hidden-size", "--layers", "--expected-gpus-per-node", "--seed",
                      "--lr", "--checkpoint-dir", "--checkpoint-every", "--deepspeed-config", "--local_rank",
                      "--local-rank"}


def test_an_unknown_flag_of_finetune_py_is_refused() -> None:
    (found,) = problems("finetune", {f"{TUNE}.launch.args": ["--logging-step", "50"]})
    assert found.startswith(f"{TUNE}.launch.args[0]: finetune.py has no flag --logging-step {UNRECOGNIZED}"
                            "--logging-steps, ")  # finetune.py takes no abbreviation (allow_abbrev=False)
    assert problems("finetune", {f"{TUNE}.launch.args": ["--logging-steps", "50", "--save-total-limit=3"]}) == []


def test_abbreviations_as_argparse_takes_them() -> None:
    """smoke_train.py's parser allows abbreviations: a unique prefix is its flag, a shared one is an error."""
    args = "workloads.smoke.launch.args"
    assert problems("h100", {args: ["--hidden", "64"]}) == []
    assert problems("h100", {args: ["--check", "5"]}) == [
        f"{args}[0]: --check is ambiguous for smoke_train.py's parser, which would stop every rank with \"ambiguous "
        "option: --check could match --checkpoint-dir, --checkpoint-every\"; write the whole flag"]


def test_a_flag_the_stack_passes_is_not_repeated() -> None:
    found = problems("dev", {"workloads.smoke.launch.args": ["--deepspeed-config", "mine.json", "--local_rank=0"]})
    assert found == [
        "workloads.smoke.launch.args[0]: --deepspeed-config (smoke_train.py's --deepspeed_config) is passed to every "
        "rank already, by the stack (the generated ds_config.json, from workloads.smoke.deepspeed); change it there "
        "instead",
        "workloads.smoke.launch.args[2]: --local_rank is passed to every rank already, by DeepSpeed's launcher "
        "(--local_rank=N); remove it"]


def test_with_launch_command_the_args_are_not_judged_by_the_script() -> None:
    # Not passed at all: the one problem is that (test_launch_args_beside_launch_command_are_refused).
    found = problems("h100", {"workloads.smoke.launch.args": ["--stepz", "5"],
                              "workloads.smoke.launch.command": "bash -c true"})
    assert [p.split(":")[0] for p in found] == ["workloads.smoke.launch.args"] and "--stepz" not in found[0]


USER_SCRIPT = '''import argparse

import torch  # never imported by the stack: the file is read, not run


def build_parser():
    parser = argparse.ArgumentParser()
    parser.add_argument("--deepspeed_config")
    parser.add_argument("--local_rank", type=int)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--data-dir")
    return parser
'''


def _user_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    from workloads.mpijob import script_source

    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "train.py").write_text(text)
    monkeypatch.setattr(script_source, "SCRIPTS_DIR", tmp_path)


def test_a_user_scripts_flags_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _user_script(tmp_path, monkeypatch, USER_SCRIPT)
    user = {"workloads.smoke.launch.script": "user/train.py"}
    assert problems("h100", {**user, "workloads.smoke.launch.args": ["--epochs", "2", "--data-dir", "/data"]}) == []
    assert problems("h100", {**user, "workloads.smoke.launch.args": ["--epoch", "2"]}) == []  # a unique prefix
    (found,) = problems("h100", {**user, "workloads.smoke.launch.args": ["--epoks", "2"]})
    assert found.startswith(f"workloads.smoke.launch.args[0]: user/train.py has no flag --epoks {UNRECOGNIZED}"
                            "--epochs, ")
    assert set(found.split("closest first: ")[1].split(", ")) == {"--epochs", "--data-dir", "--local_rank"}


def test_a_user_parser_without_what_the_stack_passes_is_refused(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _user_script(tmp_path, monkeypatch, USER_SCRIPT.replace('    parser.add_argument("--deepspeed_config")\n', ""))
    assert problems("h100", {"workloads.smoke.launch.script": "user/train.py", "workloads.smoke.launch.args": []}) == [
        "workloads.smoke.launch.script: user/train.py's parser has no --deepspeed_config, which the stack (the "
        "generated ds_config.json, from workloads.smoke.deepspeed) passes to every rank: every rank would stop with "
        "\"unrecognized arguments: --deepspeed_config\"; add it to the parser"]


def test_local_rank_is_needed_only_where_deepspeed_passes_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DeepSpeed's launch.py appends --local_rank=N unless given --no_local_rank, which the stack passes on a GPU
    fabric (the ranks start through the fabric's NCCL env script)."""
    _user_script(tmp_path, monkeypatch, USER_SCRIPT.replace('    parser.add_argument("--local_rank", type=int)\n', ""))
    user = {"workloads.smoke.launch.script": "user/train.py", "workloads.smoke.launch.args": []}
    assert problems("h100", user) == []  # the A3 Mega pool's TCPXO fabric: --no_local_rank
    found = problems("h100", {**user, "nodePools[0].fabric.enabled": False})
    assert "workloads.smoke.launch.script: user/train.py's parser has no --local_rank, which DeepSpeed's launcher " \
           "(--local_rank=N) passes to every rank: every rank would stop with \"unrecognized arguments: " \
           "--local_rank\"; add it to the parser" in found


@pytest.mark.parametrize("change", [
    ("return parser", "deepspeed.add_config_arguments(parser)\n    return parser"),  # flags added out of sight
    ("return parser", "parser.parse_known_args()\n    return parser"),  # unknown flags tolerated
    ('parser.add_argument("--epochs"', 'parser.add_argument(FLAG'),  # computed option strings
    ("argparse.ArgumentParser()", "argparse.ArgumentParser(parents=[base])"),
    ("def build_parser", "OTHER = argparse.ArgumentParser()\n\n\ndef build_parser"),  # two parsers
])
def test_a_parser_that_cannot_be_read_is_not_judged(change: tuple[str, str], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    _user_script(tmp_path, monkeypatch, USER_SCRIPT.replace(*change))
    assert problems("h100", {"workloads.smoke.launch.script": "user/train.py",
                             "workloads.smoke.launch.args": ["--anything", "1"]}) == []


# --- keys the chosen mode ignores, and pairs of keys that must agree -------------------------------------------------

def _warnings(stack: str, changes: dict[str, Any]) -> list[str]:
    from conftest import model

    import checks

    return checks.warnings(model(stack, changes))


def test_epochs_with_max_steps_is_refused() -> None:
    """finetune.py refuses both ("give --epochs or --max-steps, not both"); the stack used to drop epochs."""
    assert problems("finetune", {f"{TUNE}.finetune.maxSteps": 500}) == [
        f"{TUNE}.finetune.epochs: 3 epochs and {TUNE}.finetune.maxSteps 500: the run stops at one or the other, not "
        "both (finetune.py: \"give --epochs or --max-steps, not both\"); remove one"]
    assert problems("finetune", {f"{TUNE}.finetune.maxSteps": 500, f"{TUNE}.finetune.epochs": DELETE}) == []


def test_a_text_field_beside_prompt_fields_is_refused() -> None:
    assert problems("finetune", {f"{TUNE}.finetune.textField": "body"}) == [
        f"{TUNE}.finetune.textField: 'body' is not used with {TUNE}.finetune.promptField: the records' prompt and "
        "response are what the run learns; remove textField, or the prompt and response fields"]
    # Without the prompt fields it is what the run learns, passed as --text-field.
    no_prompt = {f"{TUNE}.finetune.promptField": DELETE, f"{TUNE}.finetune.responseField": DELETE}
    assert problems("finetune", {**no_prompt, f"{TUNE}.finetune.textField": "body"}) == []


def test_a_model_block_at_another_sequence_length_is_refused() -> None:
    block = {"name": "Qwen2.5-7B", "mode": "training", "precision": "bf16"}
    key = f"{TUNE}.model.sequenceLength"

    def on_key(found: list[str]) -> list[str]:  # the memory fit of the block is the planner's own rule
        return [p for p in found if p.startswith(f"{key}:")]

    assert on_key(problems("finetune", {f"{TUNE}.model": {**block, "sequenceLength": 4096}})) == [
        f"{key}: 4096, but the run trains at {TUNE}.finetune.sequenceLength 2048 tokens (--seq-len); set both the "
        "same"]
    assert on_key(problems("finetune", {f"{TUNE}.model": {**block, "sequenceLength": 2048}})) == []
    assert on_key(problems("finetune", {f"{TUNE}.model": block, f"{TUNE}.finetune.sequenceLength": 4096})) == []


def test_launch_args_beside_launch_command_are_refused() -> None:
    assert problems("h100", {"workloads.smoke.launch.command": "deepspeed --hostfile $HOSTSFILE x.py"}) == [
        "workloads.smoke.launch.args: not used: workloads.smoke.launch.command replaces the command line they are "
        "passed on; put them in the command"]
    assert problems("h100", {"workloads.smoke.launch.command": "x", "workloads.smoke.launch.args": []}) == []


def test_launch_keys_of_a_gaudi_job_are_refused() -> None:
    job = "workloads.gaudi-llm-ds-ft"
    assert problems("gaudi", {f"{job}.launch.args": ["--steps", "5"], f"{job}.launch.script": "train.py"}) == [
        f"{job}.launch.args: not used: a Gaudi MPIJob runs training.script (run_lora_clm.py) with {job}.training.args; "
        "put them there, or run your own command with launch.command",
        f"{job}.launch.script: not used: a Gaudi MPIJob runs optimum-habana's {job}.training.script "
        "(run_lora_clm.py); set that, or run your script with launch.command"]


def test_lora_settings_with_lora_off_warn() -> None:
    # Every parameter of the recipe's 7B model fits its L4s with the optimizer offloaded (tests/test_lora_sizing.py).
    off = {f"{TUNE}.finetune.lora.enabled": False, f"{TUNE}.deepspeed.offloadOptimizer": "cpu"}
    assert _warnings("finetune", off) == []  # Pulumi.finetune.yaml's LoRA values are the defaults: nothing set
    found = _warnings("finetune", {**off, f"{TUNE}.finetune.lora.rank": 8, f"{TUNE}.finetune.lora.dropout": 0.1})
    assert found == [f"{TUNE}.finetune.lora.{key}: not used: {TUNE}.finetune.lora.enabled is false, so every "
                     "parameter trains and no adapter is made" for key in ("rank", "dropout")]
    assert _warnings("finetune", {f"{TUNE}.finetune.lora.rank": 8}) == []  # LoRA on: used


def test_launch_command_of_a_finetune_run_warns() -> None:
    assert _warnings("finetune", {f"{TUNE}.launch.command": "deepspeed --hostfile $HOSTSFILE mine.py"}) == [
        f"{TUNE}.launch.command: replaces the DeepSpeed command line that passes the `finetune` keys (model, data, "
        "fields, sequenceLength, epochs or maxSteps, saveSteps, LoRA) to finetune.py: your command must pass them "
        "itself; CHECKPOINT_DIR, MODEL_DIR, the token file and the wait for the bucket's inputs stay"]


def test_gaudi_keys_on_an_nvidia_job_warn() -> None:
    found = _warnings("h100", {"workloads.smoke.gaudi.softwareVersion": "1.20.0"})
    assert [w for w in found if w.startswith("workloads.")] == [
        "workloads.smoke.gaudi.softwareVersion: not used: `gaudi` picks a Gaudi job's software, and this MPIJob runs "
        "on NVIDIA GPUs with the stack's image"]


def test_training_keys_under_a_gaudi_command_warn() -> None:
    job = "workloads.gaudi-llm-ds-ft"
    found = _warnings("gaudi", {f"{job}.launch.command": "python3 mine.py", f"{job}.training.epochs": 2})
    assert f"{job}.training.epochs: not used: launch.command replaces optimum-habana's run that `training` " \
           "configures; pass it in your command" in found


def test_a_learning_rate_no_optimizer_reads_warns() -> None:
    """smoke_train.py builds its own optimizer (--lr) unless the optimizer is offloaded: then ds_config.json names
    DeepSpeed's AdamW with deepspeed.learningRate (workloads/ds_config.py)."""
    lr = {"workloads.smoke.deepspeed.learningRate": 0.001}
    assert _warnings("dev", lr) == [
        "workloads.smoke.deepspeed.learningRate: 0.001 is not used: ds_config.json names an optimizer only with "
        "deepspeed.offloadOptimizer, and without one the script builds its own (smoke_train.py: --lr); pass the rate "
        "in launch.args"]
    assert _warnings("dev", {**lr, "workloads.smoke.deepspeed.offloadOptimizer": "cpu"}) == []
    assert [w for w in _warnings("h100", lr) if "learningRate" in w]  # the mpijob kind too


def test_autoscaling_bounds_without_autoscaling_warn() -> None:
    assert _warnings("serve", {"workloads.chat.serving.autoscaling.maxReplicas": 4}) == [
        "workloads.chat.serving.autoscaling.maxReplicas: not used: workloads.chat.serving.autoscaling.enabled is "
        "false, so no HorizontalPodAutoscaler is made and serving.replicas (1) pods run"]


def test_an_openai_port_without_the_openai_server_warns() -> None:
    assert _warnings("serve", {"workloads.chat.serving.openai.port": 9000}) == [
        "workloads.chat.serving.openai.port: not used: workloads.chat.serving.openai.enabled is false (engine mii's "
        "OpenAI-compatible server; vLLM's own API is OpenAI-compatible on serving.port)"]


@pytest.mark.parametrize(("changes", "expected"), [
    ({"workloads.smoke.deepspeed.nvmePath": "/ssd"},
     "workloads.smoke.deepspeed.nvmePath: not used: neither offloadOptimizer nor offloadParams is nvme"),
    ({"workloads.smoke.deepspeed.zeroStage": 3, "workloads.smoke.deepspeed.allgatherBucketSize": 100},
     "workloads.smoke.deepspeed.allgatherBucketSize: not used at zeroStage 3 (stages 1-2 only; stage 3 gathers by "
     "stage3_prefetch_bucket_size)"),
    ({"workloads.smoke.deepspeed.zeroStage": 0, "workloads.smoke.deepspeed.reduceBucketSize": 100},
     "workloads.smoke.deepspeed.reduceBucketSize: not used at zeroStage 0"),
    ({"workloads.smoke.gcsFuse.mountPath": "/bucket"},
     "workloads.smoke.gcsFuse.mountPath: not used: workloads.smoke.gcsFuse.enabled is false (the pods mount no "
     "bucket)"),
    ({"workloads.smoke.accelerator.type": "gaudi3"},
     "workloads.smoke.accelerator.type: not used: gaudi3 is a Gaudi generation, and an NVIDIA workload's GPU is its "
     "pool's (nodePools[].gpu.type)"),
])
def test_a_key_the_workload_never_reads_warns(changes: dict[str, Any], expected: str) -> None:
    assert _warnings("dev", changes) == [expected]


def test_every_example_stack_previews_without_these_warnings() -> None:
    """The stack files set nothing their mode ignores (the planner's, image's and Gaudi's own warnings aside)."""
    for stack in ("dev", "h100", "prod", "finetune", "gaudi", "serve", "dws", "vertex"):
        assert [w for w in _warnings(stack, {}) if "not used" in w] == [], stack


def test_the_warnings_reach_the_pr_summary() -> None:
    from conftest import changed, run_stack

    from preview import summary

    run = run_stack("dev", changed("dev", {"workloads.smoke.deepspeed.nvmePath": "/ssd"}))
    expected = "workloads.smoke.deepspeed.nvmePath: not used: neither offloadOptimizer nor offloadParams is nvme"
    assert expected in run.warnings
    assert f"- :warning: {expected}" in summary.markdown(run, [], 0)


# --- final errors (bad arguments or data) are not retried -------------------------------------------------------------

MPIJOB = "kubernetes:kubeflow.org/v2beta1:MPIJob"


def test_the_scripts_exit_2_on_bad_arguments_or_data() -> None:
    """The status the launcher treats as final: both scripts' EXIT_USAGE, and argparse's own on a bad flag."""
    assert _script_module("finetune").EXIT_USAGE == 2 and _script_module("smoke_train").EXIT_USAGE == 2


def test_the_mpijob_crd_has_no_pod_failure_policy() -> None:
    """Why the launcher remembers a final status itself: MPIJob v2beta1 has no podFailurePolicy (a Job's way to fail
    at once on an exit code), and its runPolicy has only these (mpi-operator v0.8.0's CRD)."""
    from conftest import reference, yaml_load

    crd = yaml_load(reference("mpi-operator", "kubeflow.org_mpijobs.v0.8.0.yaml").read_text())  # 9,000 lines: libyaml
    (v2,) = [v for v in crd["spec"]["versions"] if v["name"] == "v2beta1"]
    spec = v2["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert "podFailurePolicy" not in spec and "podFailurePolicy" not in spec["runPolicy"]["properties"]
    assert set(spec["runPolicy"]["properties"]) == {"activeDeadlineSeconds", "backoffLimit", "cleanPodPolicy",
                                                    "managedBy", "schedulingPolicy", "suspend",
                                                    "ttlSecondsAfterFinished"}


@pytest.mark.parametrize("stack", ["finetune", "h100"])
def test_the_launcher_keeps_its_state_in_an_empty_dir(stack: str) -> None:
    """An emptyDir outlives a container's restart in place (restartPolicy OnFailure), not the pod."""
    from conftest import stack_run

    spec = stack_run(stack).one(MPIJOB).inputs["spec"]
    launcher = spec["mpiReplicaSpecs"]["Launcher"]
    assert launcher["restartPolicy"] == "OnFailure" and spec["runPolicy"]["backoffLimit"] == 6
    pod = launcher["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "launcher-state"]
    assert volume == {"name": "launcher-state", "emptyDir": {"sizeLimit": "1Mi"}}
    assert {"name": "launcher-state", "mountPath": "/run/deepspeed-stack"} in pod["containers"][0]["volumeMounts"]
    script = pod["containers"][0]["args"][0]
    assert script.splitlines()[1].startswith("if [ -f /run/deepspeed-stack/final-status ]; then ")  # first, before
    assert script.splitlines()[-1].startswith("run_ranks deepspeed --force_multi ")  # waiting for the workers


def _launcher_run(tmp_path: Path, stub: str) -> tuple[str, Path, Path]:
    """The launcher's script as rendered, its DeepSpeed line run against a stand-in `deepspeed` (`stub`, bash), the
    state folder at tmp_path; returns (the script, the state file, the stand-in's call log)."""
    from conftest import stack_run

    pod = stack_run("h100").one(MPIJOB).inputs["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    script = pod["containers"][0]["args"][0]
    lines = script.splitlines()
    state, calls = tmp_path / "state", tmp_path / "calls"
    state.mkdir(exist_ok=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "deepspeed").write_text(f"#!/bin/bash\necho called >> {calls}\n{stub}\n")
    (bin_dir / "deepspeed").chmod(0o755)
    # The set-up between the functions and the DeepSpeed line needs a cluster (the hostfile, ssh): left out.
    function_end = len(lines) - 1 - lines[::-1].index("}")
    kept = [*lines[:function_end + 1], lines[-1]]
    return "\n".join(kept).replace("/run/deepspeed-stack", str(state)), state / "final-status", calls


def _bash(script: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "HOSTSFILE": "/dev/null", "MASTER_ADDR": "w0"}
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=30, check=False)


def test_a_final_error_is_remembered_and_not_run_again(tmp_path: Path) -> None:
    script, final, calls = _launcher_run(tmp_path, "exit 2")
    first = _bash(script, tmp_path)
    assert first.returncode == 2 and final.read_text().strip() == "2"
    assert "exit status 2 (bad arguments or data): final" in first.stderr
    again = _bash(script, tmp_path)  # the container restarted in place: the emptyDir is still there
    assert again.returncode == 2 and calls.read_text().splitlines() == ["called"]  # the ranks did not run again
    assert "not running the ranks again" in again.stderr


def test_another_failure_is_retried(tmp_path: Path) -> None:
    script, final, calls = _launcher_run(tmp_path, "exit 1")
    assert _bash(script, tmp_path).returncode == 1 and not final.exists()
    assert _bash(script, tmp_path).returncode == 1 and calls.read_text().splitlines() == ["called", "called"]
    script, final, _ = _launcher_run(tmp_path, "exit 0")
    assert _bash(script, tmp_path).returncode == 0 and not final.exists()


def test_sigterm_asks_the_workers_and_leaves_deepspeeds_runner_alone(tmp_path: Path) -> None:
    """The launcher's shell is the container's main process: the kubelet's SIGTERM goes to it (alone, or with the
    workers' on a whole-job stop). It must not reach DeepSpeed's runner, whose PDSH handler pkills the per-node
    launchers (they SIGKILL the ranks 30 s later): the launcher asks every worker of the hostfile to stop its ranks
    (their preStop hook's stop_ranks.py, over ssh, waiting the grace period less the margin), then waits for the
    runner to end by itself and exits with its status (the ranks' 143: preempted, retried)."""
    ready, stopped = tmp_path / "ready", tmp_path / "stopped"
    # The runner notes a TERM it gets (it must get none) and ends 143 once the stop request reached the workers.
    stub = (f"trap 'echo term >> {tmp_path / 'calls'}' TERM\ntouch {ready}\n"
            # Ends by itself within 30 s whatever happens (a `read` loop spins at full CPU once stdin closes).
            f"until [ -f {stopped} ] || ((SECONDS >= 30)); do sleep 0.05; done\nexit 143")
    script, final, calls = _launcher_run(tmp_path, stub)
    (tmp_path / "bin" / "ssh").write_text(f'#!/bin/bash\necho "ssh $*" >> {tmp_path / "ssh-calls"}\ntouch {stopped}\n')
    (tmp_path / "bin" / "ssh").chmod(0o755)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("w-0.job.ns.svc slots=8\nw-1.job.ns.svc slots=8\n")
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "HOSTSFILE": str(hostfile), "MASTER_ADDR": "w0"}
    proc = subprocess.Popen(["bash", "-c", script], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while not ready.exists() and time.monotonic() < deadline and proc.poll() is None:
            os.sched_yield()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:  # the stand-in too, whatever happened: the session holds both
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == 143 and calls.read_text().splitlines() == ["called"]  # no TERM reached the runner
    hook = "python3 /etc/deepspeed/stop_ranks.py --timeout 115"  # the h100 stack's smoke MLP: 120 s less 5
    assert sorted((tmp_path / "ssh-calls").read_text().splitlines()) == [
        f"ssh -o ConnectTimeout=5 -o BatchMode=yes w-{i}.job.ns.svc {hook}" for i in (0, 1)]
    assert "asking every worker's ranks to save and stop" in err
    assert not final.exists()  # preempted: retried, and the run resumes from its checkpoint


def _checked_launcher_run(tmp_path: Path, check: str) -> tuple[str, Path, Path]:
    """The finetune stack's launcher script with its data check (a stand-in `python` running `check`) and its
    DeepSpeed line (a stand-in `deepspeed` that succeeds); returns (the script, the state file, the call log)."""
    from conftest import stack_run

    pod = stack_run("finetune").one(MPIJOB).inputs["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    lines = pod["containers"][0]["args"][0].splitlines()
    state, calls, bin_dir = tmp_path / "state", tmp_path / "calls", tmp_path / "bin"
    for folder in (state, bin_dir):
        folder.mkdir(exist_ok=True)
    # ssh as OpenSSH runs a command on the first worker: its arguments after the host joined by spaces, through the
    # worker's shell (here in this folder: the ConfigMap's is not here), its status passed back.
    ssh = (f'[ "$1 $2" = "-o BatchMode=yes" ] || exit 255\necho "ssh $3" >> {calls}\nshift 3\n'
           'exec bash -c "$(printf "%s" "$*" | sed "s#^cd /etc/deepspeed \\&\\& ##")"')
    for name, body in (("python", f"echo check >> {calls}\n{check}"), ("deepspeed", f"echo ranks >> {calls}"),
                       ("ssh", ssh)):
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    # The functions, then the check and the DeepSpeed line (the set-up between needs a cluster).
    functions_end = len(lines) - 1 - lines[::-1].index("}")
    kept = [*lines[:functions_end + 1], *lines[-2:]]
    return "\n".join(kept).replace("/run/deepspeed-stack", str(state)), state / "final-status", calls


def test_a_data_error_found_by_the_launchers_check_is_final(tmp_path: Path) -> None:
    """finetune.py --check-data exits 2 on bad data: remembered like the ranks' status, the ranks never run."""
    script, final, calls = _checked_launcher_run(tmp_path, "exit 2")
    first = _bash(script, tmp_path)
    assert first.returncode == 2 and final.read_text().strip() == "2"
    assert "the input check stopped with exit status 2" in first.stderr
    again = _bash(script, tmp_path)
    assert again.returncode == 2 and calls.read_text().splitlines() == ["ssh w0", "check"]  # on the first worker
    assert "not running the ranks again" in again.stderr


def test_a_passed_check_starts_the_ranks_and_another_failure_is_retried(tmp_path: Path) -> None:
    script, final, calls = _checked_launcher_run(tmp_path, "exit 0")
    assert _bash(script, tmp_path).returncode == 0 and calls.read_text().splitlines() == ["ssh w0", "check", "ranks"]
    calls.unlink()
    script, final, calls = _checked_launcher_run(tmp_path, "exit 1")  # e.g. the bucket's mount not ready
    assert _bash(script, tmp_path).returncode == 1 and not final.exists()
    assert _bash(script, tmp_path).returncode == 1 and calls.read_text().splitlines() == ["ssh w0", "check"] * 2
