"""One recipe, three platforms (issue 30 items 1 and 2): the same `finetune` keys give finetune.py the same
arguments on GKE (kind finetune), on a Gaudi MPIJob (kind mpijob with `finetune`) and on Vertex AI
(`vertex.finetune`), the paths differing only by each platform's root; and what cannot take effect is refused.

Expected arguments are written out by hand here, never taken from workloads/recipe.py."""

from __future__ import annotations

import copy
import json
import shlex
from typing import Any

import pytest
from conftest import DELETE, model, problems

from model.problems import lines
from workloads import finetune, vertex_job
from workloads.mpijob import gaudi, gaudi_env, gaudi_folders, gaudi_launcher
from workloads.placement import placement

GKE_W = "workloads.tune"
GAUDI_W = "workloads.gaudi-llm-ds-ft"
BUCKET = "my-gcp-project-deepspeed-data"  # Pulumi.vertex.yaml's storage.bucketName

# Your chat records on each platform's data root, a named template, a held-out file, steps, LoRA merged.
KEYS: dict[str, Any] = {
    "model": "Qwen/Qwen2.5-7B-Instruct", "datasetPath": "data/chat.jsonl", "recordFormat": "messages",
    "chatTemplate": "zephyr", "evalSplit": "data/eval.jsonl", "sequenceLength": 1024, "maxSteps": 50,
    "saveSteps": 25,
    "lora": {"rank": 8, "alpha": 16, "targetModules": ["q_proj", "v_proj"], "export": "merged"},
}
LEARNING_RATE = 0.0001


def expected(data: str, config: str, out: str, run: str) -> list[str]:
    """finetune.py's arguments for KEYS, by hand: `data` the platform's data root, `config` where ds_config.json and
    the template lie, `out` its output root, `run` the run's name."""
    return ["--deepspeed", f"{config}/ds_config.json", "--model", "Qwen/Qwen2.5-7B-Instruct",
            "--dataset", f"{data}/data/chat.jsonl", "--format", "auto", "--records", "messages",
            "--chat-template", f"{config}/chat_template.jinja", "--eval-split", f"{data}/data/eval.jsonl",
            "--seq-len", "1024", "--max-steps", "50", "--learning-rate", "0.0001", "--save-steps", "25",
            "--gradient-checkpointing", "--lora", "--lora-rank", "8", "--lora-alpha", "16", "--lora-dropout", "0.05",
            "--lora-export", "merged",
            "--lora-target-modules", "q_proj", "v_proj",
            "--checkpoint-dir", f"{out}/checkpoints/{run}", "--model-dir", f"{out}/models/{run}"]


def _keys(**more: Any) -> dict[str, Any]:
    """A fresh copy of KEYS (a test's change to one key must not reach the others: set_path writes into it)."""
    return {**copy.deepcopy(KEYS), **more}


GKE_CHANGES = {f"{GKE_W}.finetune": _keys(), f"{GKE_W}.deepspeed.learningRate": LEARNING_RATE}
GAUDI_CHANGES = {f"{GAUDI_W}.training": DELETE, f"{GAUDI_W}.finetune": _keys(),
                 f"{GAUDI_W}.deepspeed.learningRate": LEARNING_RATE}
# The vertex example's T4s cannot hold the 7B the keys name (the fit check: 17.4 GB per GPU with LoRA, 16 GB there):
# the same keys on an A100 (40 GB) there.
VERTEX_CHANGES = {"vertex.launch": {}, "vertex.finetune": _keys(), "vertex.displayName": "deepspeed-training",
                  "vertex.machineType": "a2-highgpu-1g", "vertex.gpu": {"type": "nvidia-tesla-a100", "count": 1},
                  "vertex.deepspeed": {"learningRate": LEARNING_RATE, "precision": "fp16", "zeroStage": 2}}



def fresh(base: dict[str, Any]) -> dict[str, Any]:
    """A copy of one of the *_CHANGES to add keys to (set_path writes into the values it is given)."""
    return {key: value if value is DELETE else copy.deepcopy(value) for key, value in base.items()}


@pytest.fixture(scope="module")
def gke() -> Any:
    return model("finetune", GKE_CHANGES)


@pytest.fixture(scope="module")
def on_gaudi() -> Any:
    return model("gaudi", GAUDI_CHANGES)


@pytest.fixture(scope="module")
def vertex() -> Any:
    return model("vertex", VERTEX_CHANGES)


def test_the_three_examples_take_the_keys() -> None:
    assert problems("finetune", GKE_CHANGES) == []
    # The Gaudi run needs no token: `training`'s gated default model is not what it downloads.
    assert problems("gaudi", GAUDI_CHANGES) == []
    assert problems("vertex", VERTEX_CHANGES) == []


def test_gke_runs_the_recipe_on_the_bucket_mount(gke: Any) -> None:
    assert finetune.script_args(gke.workloads["tune"]) == expected("/gcs", "/etc/deepspeed", "/gcs", "tune")


def test_gaudi_renders_the_launcher_command_from_the_same_keys(on_gaudi: Any) -> None:
    """The Gaudi MPIJob's launcher runs finetune.py on every card through optimum-habana's gaudi_spawn.py, with the
    keys' arguments over the shared claim."""
    w = on_gaudi.workloads["gaudi-llm-ds-ft"]
    script = gaudi_launcher.launcher_script(w, placement(on_gaudi, w), has_token=False)
    last = shlex.split(script.splitlines()[-1])
    assert last[:8] == ["run_ranks", "python", "../gaudi_spawn.py", "--hostfile=$HOSTSFILE", "--use_deepspeed",
                        "--world_size", "8", "/etc/deepspeed/finetune.py"]
    # The outputs in the ranks' own folder of the claim (<mountPath>/deepspeed-stack: whatever made the claim's
    # other folders first), your data where you put it on the claim.
    assert last[8:] == expected("/storage", "/etc/deepspeed", "/storage/deepspeed-stack", "gaudi-llm-ds-ft")
    assert "cd /opt/optimum-habana/examples/language-modeling" in script.splitlines()


def test_vertex_runs_the_recipe_from_the_bucket(vertex: Any) -> None:
    spec = vertex_job.customjob_spec(vertex.vertex, "img", BUCKET, "sa@p.iam.gserviceaccount.com")
    root = f"/gcs/{BUCKET}"
    scripts = f"{root}/deepspeed-stack/scripts"
    for pool in spec["workerPoolSpecs"]:
        container = pool["containerSpec"]
        assert container["command"] == ["/opt/deepspeed/vertex/vertex_start.sh"]
        assert container["args"] == [f"{scripts}/finetune.py",
                                     *expected(root, scripts, root, "deepspeed-training")]
        keys = json.loads(next(e["value"] for e in container["env"] if e["name"] == "FINETUNE_STACK_KEYS"))
        assert keys["--dataset"] == "vertex.finetune.datasetPath"
        assert keys["--learning-rate"] == "vertex.deepspeed.learningRate"


def test_the_same_keys_differ_only_by_the_platform_root(gke: Any, on_gaudi: Any, vertex: Any) -> None:
    w = on_gaudi.workloads["gaudi-llm-ds-ft"]
    platforms = {
        "gke": (finetune.script_args(gke.workloads["tune"]), "/gcs", "/etc/deepspeed", "/gcs", "tune"),
        "gaudi": (gaudi_launcher.recipe_args(w), "/storage", "/etc/deepspeed", "/storage/deepspeed-stack",
                  "gaudi-llm-ds-ft"),
        "vertex": (vertex_job.recipe_argv(vertex.vertex, BUCKET)[1:], f"/gcs/{BUCKET}",
                   f"/gcs/{BUCKET}/deepspeed-stack/scripts", f"/gcs/{BUCKET}", "deepspeed-training"),
    }

    def neutral(args: list[str], data: str, config: str, out: str, run: str) -> list[str]:
        swap = {f"{config}/ds_config.json": "CONFIG/ds_config.json",
                f"{config}/chat_template.jinja": "CONFIG/chat_template.jinja",
                f"{data}/data/chat.jsonl": "DATA/data/chat.jsonl", f"{data}/data/eval.jsonl": "DATA/data/eval.jsonl",
                f"{out}/checkpoints/{run}": "OUT/checkpoints/RUN", f"{out}/models/{run}": "OUT/models/RUN"}
        return [swap.get(a, a) for a in args]

    seen = {name: neutral(*values) for name, values in platforms.items()}
    assert seen["gke"] == seen["gaudi"] == seen["vertex"]


def test_the_layout_is_the_same_everywhere(gke: Any, on_gaudi: Any) -> None:
    """CHECKPOINT_DIR and MODEL_DIR as the environment has them equal the arguments (GKE and Gaudi)."""
    w = on_gaudi.workloads["gaudi-llm-ds-ft"]
    env = gaudi_env.plain_env(w, placement(on_gaudi, w))
    assert (env["CHECKPOINT_DIR"], env["MODEL_DIR"]) == ("/storage/deepspeed-stack/checkpoints/gaudi-llm-ds-ft",
                                                         "/storage/deepspeed-stack/models/gaudi-llm-ds-ft")
    assert {"CHECKPOINT_DIR", "MODEL_DIR", "FINETUNE_STACK_KEYS"} <= set(
        gaudi_env.forwarded_env(w, placement(on_gaudi, w), has_token=False))
    assert "LLM_MODEL" not in env  # Omnia's variables are `training`'s run's


def test_the_gaudi_warning_names_the_recipes_folders() -> None:
    from checks import gaudi as gaudi_checks

    (said,) = [w for w in lines(gaudi_checks.warnings(model("gaudi", fresh(GAUDI_CHANGES)))) if "keep the caches" in w]
    assert ("and the output (/storage/deepspeed-stack/checkpoints/gaudi-llm-ds-ft, "
            "/storage/deepspeed-stack/models/gaudi-llm-ds-ft) on claim shared-model") in said


def test_gaudi_ships_the_recipe_in_the_jobs_config_map(on_gaudi: Any) -> None:
    w = on_gaudi.workloads["gaudi-llm-ds-ft"]
    data = gaudi.config_map_data(w, placement(on_gaudi, w), has_token=False)
    assert {"finetune.py", "finetune_data.py", "finetune_hpu.py", "ds_config.json", "chat_template.jinja"} <= set(data)
    # The ranks write only where the writable check looked.
    check = gaudi_folders.writable_folders_check(w)
    assert "ranks_folder /storage/deepspeed-stack/checkpoints/gaudi-llm-ds-ft deepspeed-stack" in check
    assert "ranks_folder /storage/deepspeed-stack/models/gaudi-llm-ds-ft deepspeed-stack" in check


def test_vertex_uploads_the_recipe_and_its_ds_config(vertex: Any) -> None:
    files = vertex_job.recipe_files(vertex.vertex)
    assert {"deepspeed-stack/scripts/finetune.py", "deepspeed-stack/scripts/finetune_hpu.py",
            "deepspeed-stack/scripts/ds_config.json", "deepspeed-stack/scripts/chat_template.jinja"} <= set(files)
    ds = json.loads(files["deepspeed-stack/scripts/ds_config.json"])
    # Pulumi.vertex.yaml: a primary and 1 worker, 1 T4 each; micro batch 1, accumulation 1.
    assert ds["train_batch_size"] == 2 and ds["fp16"]["enabled"] is True
    assert ds["zero_optimization"]["stage"] == 2


# --- what cannot take effect is refused (item 2) ------------------------------------------------------------------

OWN_DATA = (f"{GAUDI_W}.training.args[0]: --train_file is overridden: the launcher always passes --dataset_name "
            "(training.dataset), which run_lora_clm.py loads instead, so the job would train on that dataset without "
            f"a word. To train on your own data, use the recipe: {GAUDI_W}.finetune.datasetPath (a .jsonl/.json, "
            ".parquet or .txt file or folder on the claim, relative to storage.mountPath; finetune.py on HPU), with "
            f"{GAUDI_W}.finetune.model and the other finetune keys in place of training")


def test_a_train_file_in_the_gaudi_args_is_refused_not_lost() -> None:
    assert problems("gaudi", {f"{GAUDI_W}.training.args": ["--train_file", "/storage/data/train.jsonl"]}) == [OWN_DATA]
    found = problems("gaudi", {f"{GAUDI_W}.training.args": ["--validation_file=/storage/v.jsonl"]})
    assert found == [OWN_DATA.replace("args[0]: --train_file", "args[0]: --validation_file")]


@pytest.mark.parametrize(("flag", "says"), [
    ("--output_dir", "is passed by the launcher (output/<workload> in the ranks' folder of the claim); remove it. For "
                     "the recipe's layout (checkpoints/<workload>, models/<workload>, .complete last) use "
                     f"{GAUDI_W}.finetune"),
    ("--do_train", "is passed by the launcher already; remove it"),
    ("--use_lazy_mode", "is passed by the launcher already; remove it"),
    ("--dataset_config_name", "names a configuration of --dataset_name, which the stack passes from training.dataset; "
                              "a dataset with configurations is not supported there: use "
                              f"{GAUDI_W}.finetune.dataset or {GAUDI_W}.finetune.datasetPath"),
])
def test_a_flag_the_gaudi_launcher_passes_is_refused(flag: str, says: str) -> None:
    found = problems("gaudi", {f"{GAUDI_W}.training.args": [flag, "x"]})
    assert found == [f"{GAUDI_W}.training.args[0]: {flag} {says}"]


def test_a_local_or_file_dataset_on_gaudi_is_sent_to_the_claim() -> None:
    found = problems("gaudi", {f"{GAUDI_W}.training.dataset": "/storage/data/train.jsonl"})
    assert found == [
        f"{GAUDI_W}.training.dataset: \"/storage/data/train.jsonl\" is a local path; training.dataset is a Hugging "
        "Face dataset id (run_lora_clm.py's --dataset_name). Gaudi reads your own data from the shared claim with the "
        "stack's recipe: put it on the claim and set finetune.datasetPath to its path under storage.mountPath (e.g. "
        "data/train.jsonl), with finetune.model in place of training (docs/platforms.md) (the key takes a Hugging Face "
        "dataset id such as tatsu-lab/alpaca)"]
    found = problems("gaudi", {f"{GAUDI_W}.training.dataset": "data/train.jsonl"})
    assert found == [
        f"{GAUDI_W}.training.dataset: 'data/train.jsonl' names a file, but training.dataset is a Hugging Face dataset "
        "id (run_lora_clm.py's --dataset_name, looked up on the Hub). Put the file on the claim and set "
        f"{GAUDI_W}.finetune.datasetPath to its path under storage.mountPath, with finetune.model in place of "
        "training (the recipe, finetune.py on HPU)"]
    found = problems("gaudi", {**fresh(GAUDI_CHANGES), f"{GAUDI_W}.finetune.datasetPath": "/storage/data/train.jsonl"})
    assert found == [
        f"{GAUDI_W}.finetune.datasetPath: \"/storage/data/train.jsonl\" is a local path; write it relative to the "
        "claim's root (`storage.mountPath`), e.g. data/train.jsonl for /storage/data/train.jsonl on a claim mounted at "
        "/storage (the key takes a file or folder of the claim such as data/train.jsonl)"]


@pytest.mark.parametrize(("stack", "key"), [("finetune", "workloads.tune.finetune"), ("vertex", "vertex.finetune")])
def test_a_local_path_in_the_bucket_gets_a_bucket_example(stack: str, key: str) -> None:
    """Issue 40: GKE's error showed the Gaudi claim's /storage example. On GKE and Vertex AI the root is the
    bucket; each key's example is its own."""
    found = problems(stack, {f"{key}.datasetPath": "/home/me/train.jsonl"})
    assert found == [
        f"{key}.datasetPath: \"/home/me/train.jsonl\" is a local path; write it relative to the stack's bucket (its "
        "GCS FUSE mount on GKE), e.g. data/train.jsonl for gs://<the bucket>/data/train.jsonl (`gcloud storage cp` it "
        "there) (the key takes a file or folder of the bucket such as data/train.jsonl)"]
    found += problems(stack, {f"{key}.modelPath": "/home/me/base"})
    assert (f"{key}.modelPath: \"/home/me/base\" is a local path; write it relative to the stack's bucket (its GCS "
            "FUSE mount on GKE), e.g. models/base/Qwen2.5-7B for gs://<the bucket>/models/base/Qwen2.5-7B (the key "
            "takes a folder of the bucket such as models/base/Qwen2.5-7B)") in found
    assert not any("/storage" in p or "claim" in p for p in found)


def test_gaudi_data_off_the_claim_is_refused() -> None:
    found = problems("gaudi", {**fresh(GAUDI_CHANGES), f"{GAUDI_W}.finetune.datasetPath": "../elsewhere/train.jsonl"})
    assert found == [f"{GAUDI_W}.finetune.datasetPath: '../elsewhere/train.jsonl' has a '..' part, which climbs out "
                     "of the claim; write the path from the claim's root (the pods see the claim at /storage; copy "
                     "your data onto it)"]
    found = problems("gaudi", {**fresh(GAUDI_CHANGES), f"{GAUDI_W}.finetune.evalSplit": "data/../../eval.jsonl"})
    assert found == [f"{GAUDI_W}.finetune.evalSplit: 'data/../../eval.jsonl' has a '..' part, which climbs out "
                     "of the claim; write the path from the claim's root (the pods see the claim at /storage; copy "
                     "your data onto it)"]


def test_training_keys_beside_the_recipe_are_refused_with_their_new_place() -> None:
    found = problems("gaudi", {**fresh(GAUDI_CHANGES), f"{GAUDI_W}.training.dataset": "tatsu-lab/alpaca-cleaned",
                               f"{GAUDI_W}.training.epochs": 2})
    assert found == [
        f"{GAUDI_W}.training.dataset: not used with {GAUDI_W}.finetune: the recipe (finetune.py on HPU) replaces "
        f"training's optimum-habana example; use {GAUDI_W}.finetune.dataset (or finetune.datasetPath, your file or "
        "folder on the claim), and remove training.dataset",
        f"{GAUDI_W}.training.epochs: not used with {GAUDI_W}.finetune: the recipe (finetune.py on HPU) replaces "
        f"training's optimum-habana example; use {GAUDI_W}.finetune.epochs (or finetune.maxSteps), and remove "
        "training.epochs"]


def test_training_keys_at_their_defaults_beside_the_recipe_are_refused_too() -> None:
    """Pulumi.gaudi.yaml's `training.epochs: 3` (the default) next to `finetune` was a silent 1-epoch run (issue 39
    item 3): a written key is refused whatever its value; optimumHabanaVersion (the image's) stays."""
    found = problems("gaudi", {**fresh(GAUDI_CHANGES), f"{GAUDI_W}.training": {
        "epochs": 3, "model": "meta-llama/Llama-2-7b-hf", "dataset": "tatsu-lab/alpaca", "script": "run_lora_clm.py",
        "lora": {"rank": 8}, "args": [], "optimumHabanaVersion": "v1.15.0"}})
    assert found == [
        f"{GAUDI_W}.training.model: not used with {GAUDI_W}.finetune: the recipe (finetune.py on HPU) replaces "
        f"training's optimum-habana example; use {GAUDI_W}.finetune.model (or finetune.modelPath, a folder on the "
        "claim), and remove training.model",
        f"{GAUDI_W}.training.dataset: not used with {GAUDI_W}.finetune: the recipe (finetune.py on HPU) replaces "
        f"training's optimum-habana example; use {GAUDI_W}.finetune.dataset (or finetune.datasetPath, your file or "
        "folder on the claim), and remove training.dataset",
        f"{GAUDI_W}.training.epochs: not used with {GAUDI_W}.finetune: the recipe (finetune.py on HPU) replaces "
        f"training's optimum-habana example; use {GAUDI_W}.finetune.epochs (or finetune.maxSteps), and remove "
        "training.epochs",
        f"{GAUDI_W}.training.script: not used with {GAUDI_W}.finetune: the recipe (finetune.py on HPU) replaces "
        "training's optimum-habana example; the ranks run finetune.py; remove training.script",
        f"{GAUDI_W}.training.lora: not used with {GAUDI_W}.finetune: the recipe (finetune.py on HPU) replaces "
        f"training's optimum-habana example; use {GAUDI_W}.finetune.lora (rank, alpha, dropout, targetModules, "
        "export), and remove training.lora",
        f"{GAUDI_W}.training.args: not used with {GAUDI_W}.finetune: the recipe (finetune.py on HPU) replaces "
        f"training's optimum-habana example; use {GAUDI_W}.launch.args (more finetune.py flags), and remove "
        "training.args"]


def test_gaudi_recipe_args_are_finetune_py_flags_the_stack_does_not_set() -> None:
    args = ["--dataset", "x", "--logging-steps", "5", "--train_file", "y"]
    found = problems("gaudi", {**fresh(GAUDI_CHANGES), f"{GAUDI_W}.launch.args": args})
    assert found[0] == (f"{GAUDI_W}.launch.args[0]: --dataset is set by the stack from "
                        f"{GAUDI_W}.finetune.datasetPath; change it there instead")
    assert found[1].startswith(f"{GAUDI_W}.launch.args[4]: finetune.py has no flag --train_file (every rank would "
                               "stop with \"unrecognized arguments\")")
    assert len(found) == 2


def test_gaudi_recipe_refuses_a_command_and_a_script_it_would_not_run() -> None:
    assert problems("gaudi", {**fresh(GAUDI_CHANGES), f"{GAUDI_W}.launch.script": "train.py"}) == [
        f"{GAUDI_W}.launch.script: not used: with finetune the ranks run the stack's finetune.py; remove launch.script"]
    assert problems("gaudi", {**fresh(GAUDI_CHANGES), f"{GAUDI_W}.launch.command": "python x.py"}) == [
        f"{GAUDI_W}.launch.command: replaces the recipe's run that `finetune` configures (finetune.py with its keys' "
        "arguments); remove launch.command or finetune"]


def test_the_recipe_on_an_nvidia_mpijob_points_at_kind_finetune() -> None:
    found = problems("h100", {"workloads.smoke.finetune": _keys()})
    assert ("workloads.smoke.finetune: the recipe on NVIDIA GPUs is kind finetune (same `finetune` keys, data in the "
            "bucket); set kind: finetune, or remove finetune") in found


def test_a_shared_rule_names_each_platforms_key() -> None:
    both = {"epochs": 1, "maxSteps": 10}
    says = ("epochs: 1 epochs and {p}.finetune.maxSteps 10: the run stops at one or the other, not both "
            "(finetune.py: \"give --epochs or --max-steps, not both\"); remove one")
    assert problems("vertex", {**fresh(VERTEX_CHANGES), "vertex.finetune": _keys(**both)}) == [
        "vertex.finetune." + says.format(p="vertex")]
    assert problems("gaudi", {**fresh(GAUDI_CHANGES), f"{GAUDI_W}.finetune": _keys(**both)}) == [
        f"{GAUDI_W}.finetune." + says.format(p=GAUDI_W)]


def test_vertex_args_the_stack_sets_or_the_script_lacks_are_refused() -> None:
    args = ["--model", "x", "--checkpoint-dir", "/y", "--output_dir", "z"]
    found = problems("vertex", {**fresh(VERTEX_CHANGES), "vertex.launch": {"args": args}})
    assert found[:2] == [
        "vertex.launch.args[0]: --model is set by the stack from vertex.finetune.model; change it there instead",
        "vertex.launch.args[2]: --checkpoint-dir is set by the stack (checkpoints/<run> and models/<run> under the "
        "platform's output root: the layout a server of the result reads); remove it"]
    assert found[2].startswith("vertex.launch.args[4]: finetune.py has no flag --output_dir")
    assert len(found) == 3


# The vertex stack with your own script instead of the recipe (the keys before vertex.finetune).
YOUR_SCRIPT = {"vertex.finetune": DELETE, "vertex.deepspeed": DELETE,
               "vertex.launch": {"script": f"/gcs/{BUCKET}/code/train.py", "args": ["--zero_stage", "3"]}}


def test_vertex_script_and_ds_config_that_would_go_unread_are_refused() -> None:
    assert problems("vertex", {**fresh(VERTEX_CHANGES), "vertex.launch": {"script": "/gcs/b/code/train.py"}}) == [
        "vertex.launch.script: not used: with vertex.finetune every replica runs the stack's finetune.py (uploaded "
        "to gs://<bucket>/deepspeed-stack/scripts/); remove vertex.launch.script, or remove vertex.finetune to run "
        "your own script"]
    assert problems("vertex", {**YOUR_SCRIPT, "vertex.deepspeed": {"zeroStage": 3}}) == [
        "vertex.deepspeed.zeroStage: not used: vertex.deepspeed is the ds_config.json of vertex.finetune's run; your "
        "script (/gcs/my-gcp-project-deepspeed-data/code/train.py) takes its settings in vertex.launch.args. Remove "
        "it, or set vertex.finetune to run the stack's recipe"]


def test_vertex_paths_stay_in_the_bucket_and_the_run_name_is_a_folder() -> None:
    found = problems("vertex", {**fresh(VERTEX_CHANGES), "vertex.finetune": _keys(datasetPath="../x.jsonl"),
                                "vertex.displayName": "My run"})
    assert found == [
        "vertex.finetune.datasetPath: the bucket path '../x.jsonl' has a '..' part, which climbs out of the bucket; "
        "write the path from the bucket's root (Vertex AI shows the bucket at /gcs/<bucket>)",
        "vertex.displayName: 'My run' names the run's folders with vertex.finetune (checkpoints/My run, models/My "
        "run in the bucket): use lowercase letters, digits and hyphens, e.g. deepspeed-training"]


def test_the_old_vertex_keys_still_run_your_script() -> None:
    m = model("vertex", YOUR_SCRIPT)
    assert m.vertex.finetune is None
    spec = vertex_job.customjob_spec(m.vertex, "img", BUCKET, "sa@p.iam.gserviceaccount.com")
    assert spec["workerPoolSpecs"][0]["containerSpec"]["args"] == [
        "/gcs/my-gcp-project-deepspeed-data/code/train.py", "--zero_stage", "3"]


def test_finetune_py_picks_the_gaudi_trainer_on_hpu_only() -> None:
    hpu = finetune.script_module("finetune_hpu")
    assert hpu.hpu_run({"DS_ACCELERATOR": "hpu"}, lambda: False) is True
    assert hpu.hpu_run({"DS_ACCELERATOR": "cuda"}, lambda: True) is False
    # Unset: Habana's PyTorch bridge (installed in Habana's images) decides.
    assert hpu.hpu_run({}, lambda: True) is True
    assert hpu.hpu_run({}, lambda: False) is False
    assert hpu.gaudi_trainer_kwargs() == {"use_habana": True, "use_lazy_mode": True}


def test_vertex_args_meant_for_the_deepspeed_launcher_are_refused() -> None:
    """vertex_start.sh runs `deepspeed [--hostfile=H] SCRIPT ARGS`: ARGS are the script's, and the launcher puts
    --local_rank=N before them (data/deepspeed_launcher.yaml), with your script or the recipe."""
    local_rank = ("vertex.launch.args[{i}]: --local_rank is passed to every rank by DeepSpeed's launcher "
                  "(--local_rank=N, before these arguments: this one would win and every rank on a host would take the "
                  "same GPU); remove it")
    hostfile = ("vertex.launch.args[{i}]: --num_gpus is an option of the deepspeed launcher, which vertex_start.sh "
                "runs itself (the hostfile from Vertex's CLUSTER_SPEC, a rank per GPU): after the script's name it "
                "reaches the script, not the launcher; remove it")
    found = problems("vertex", {**fresh(YOUR_SCRIPT),
                                "vertex.launch.args": ["--zero_stage", "3", "--local_rank=0", "--num_gpus", "1"]})
    assert found == [local_rank.format(i=2), hostfile.format(i=3)]
    # With the recipe too, and once each (not also as a flag finetune.py's parser lacks).
    found = problems("vertex", {**fresh(VERTEX_CHANGES), "vertex.launch": {"args": ["--local_rank=0", "--num_gpus",
                                                                                       "1"]}})
    assert found == [local_rank.format(i=0), hostfile.format(i=1)]


def test_the_launcher_facts_match_deepspeed_where_it_is_installed() -> None:
    """data/deepspeed_launcher.yaml against the e2e venv's DeepSpeed (skipped without it)."""
    from pathlib import Path

    found = sorted(Path("/opt/ds-e2e-venv/lib").glob("python3*/site-packages/deepspeed/launcher"))
    if not found:
        pytest.skip("no DeepSpeed in /opt/ds-e2e-venv (make e2e installs it)")
    runner, launch = (found[0] / "runner.py").read_text(), (found[0] / "launch.py").read_text()
    for flag in vertex_job.deepspeed_launcher()["launcherFlags"]:
        assert f'"{flag}"' in runner, flag
    # The rank's command: the script, --local_rank=N, then the script's arguments.
    assert 'cmd.append(f"--local_rank={local_rank}")\n        cmd += args.training_script_args' in launch


@pytest.mark.parametrize(("packing", "warned"), [(True, True), (False, False), (None, False)])
def test_packing_on_gaudi_is_warned_for_chat_records(packing: bool | None, warned: bool) -> None:
    """finetune.py refuses padding-free batches on HPU at its data step; with recordFormat auto the stack cannot see
    the records' format, so it warns."""
    from checks import gaudi as gaudi_checks

    changes = {**fresh(GAUDI_CHANGES), f"{GAUDI_W}.finetune": _keys(recordFormat="auto", **(
        {} if packing is None else {"packing": packing}))}
    said = [w for w in lines(gaudi_checks.warnings(model("gaudi", changes))) if ".finetune.packing: " in w]
    assert len(said) == int(warned)
    if warned:
        assert said[0].startswith(f"workloads.{GAUDI_W.removeprefix('workloads.')}.finetune.packing: on Gaudi only "
                                  "text records are packed")


@pytest.mark.parametrize("records", ["messages", "sharegpt", "prompt-completion", "alpaca"])
def test_packing_with_declared_chat_records_on_gaudi_is_refused_at_the_key(records: str) -> None:
    """Issue 39 item 5: with the format declared the run would stop at its data step: refused before anything is
    created, in the script's own words (finetune_hpu.padding_free_problem); text records pack into blocks."""
    from checks import gaudi as gaudi_checks

    changes = {**fresh(GAUDI_CHANGES), f"{GAUDI_W}.finetune": _keys(recordFormat=records, packing=True)}
    assert problems("gaudi", changes) == [
        f"{GAUDI_W}.finetune.packing: true packs {records} records into padding-free batches, which finetune.py "
        "refuses at its data step on Gaudi: padding-free batches are not proven on Gaudi (optimum-habana replaces the "
        "model's attention); set it false there (text records are still packed into blocks)"]
    text = {**fresh(GAUDI_CHANGES), f"{GAUDI_W}.finetune": _keys(recordFormat="text", packing=True)}
    assert problems("gaudi", text) == []
    assert not [w for w in lines(gaudi_checks.warnings(model("gaudi", text))) if ".finetune.packing: " in w]


def test_training_written_on_an_nvidia_mpijob_is_refused_at_its_default_too() -> None:
    found = problems("h100", {"workloads.smoke.training": {"epochs": 3}})
    assert found == [
        "workloads.smoke.training.epochs: `training` is the Gaudi fine-tuning run's (optimum-habana); an NVIDIA MPIJob "
        "runs launch.script and would ignore it. Fine-tune on NVIDIA with kind finetune (finetune.model, "
        "finetune.dataset or datasetPath, finetune.epochs, finetune.lora), or pass your script its arguments in "
        "launch.args"]
