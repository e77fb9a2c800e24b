"""kind finetune (issue 18 item 1, the stack side): an NVIDIA MPIJob whose ranks run recipes/finetune.py with
the `finetune` keys, CHECKPOINT_DIR and MODEL_DIR on the bucket's GCS FUSE mount (checkpointing options) or the
claim, the token as a mounted file, restarts that resume; and the inputs the script cannot run, refused first.

Expected values are written out here from the contract (BRIEF: the fine-tuning contract), the GCS FUSE sample
(data/gcs_fuse.yaml's source) and the Hugging Face Trainer's "auto" keys, never read from the code under test."""

from __future__ import annotations

import functools
import shlex
import subprocess
from typing import Any

import pytest
from conftest import DELETE, PROJECT_DIR, changed, config_problems, problems, run_stack, stack_run
from test_mpijob import crd_problems, pod_problems

from preview.engine import RunResult

MPIJOB = "kubernetes:kubeflow.org/v2beta1:MPIJob"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
TOKEN = {"secure": "v1:planted-ciphertext"}
W = "workloads.tune"

# GoogleCloudPlatform/gcsfuse samples/gke-csi-yaml/gpu/checkpointing-pv.yaml (commit fa119133), its mountOptions in
# its order, as the CSI ephemeral volume takes them (GKE "Optimize Cloud Storage FUSE CSI driver" page: one string,
# comma-separated, no spaces).
CHECKPOINTING_MOUNT_OPTIONS = ",".join([
    "implicit-dirs", "metadata-cache:negative-ttl-secs:0", "metadata-cache:ttl-secs:-1",
    "metadata-cache:stat-cache-max-size-mb:-1", "metadata-cache:type-cache-max-size-mb:-1",
    "file-cache:max-size-mb:-1", "file-cache:cache-file-for-range-read:true",
    "file-cache:enable-parallel-downloads:true", "read_ahead_kb=1024", "write:enable-streaming-writes:true"])


# No bucket: the data is a Hugging Face dataset (alpaca's field names). Without the bucket nothing can serve the
# result from another namespace, so the stack's server goes too, and its TensorBoard server (it reads the bucket).
NO_BUCKET = ((f"{W}.gcsFuse.enabled", False), (f"{W}.finetune.datasetPath", DELETE),
             (f"{W}.finetune.dataset", "tatsu-lab/alpaca"), (f"{W}.finetune.promptField", "instruction"),
             (f"{W}.finetune.responseField", "output"), ("workloads.chat", DELETE), ("workloads.board", DELETE))


@functools.cache
def _run(token: bool = False, changes: tuple[tuple[str, Any], ...] = ()) -> RunResult:
    if not changes:
        return stack_run("finetune", {"hfToken": TOKEN} if token else None)  # shared with test_hf_token
    config = changed("finetune", dict(changes))
    if token:
        config["deepspeed-stack:hfToken"] = TOKEN
    return run_stack("finetune", config)


def _job(run: RunResult) -> dict[str, Any]:
    return run.one(MPIJOB).inputs


def _pod(run: RunResult, role: str) -> dict[str, Any]:
    return _job(run)["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]


def _env(run: RunResult, role: str) -> dict[str, str]:
    return {e["name"]: e["value"] for e in _pod(run, role)["containers"][0]["env"]}


def _launcher_script(run: RunResult) -> str:
    return _pod(run, "Launcher")["containers"][0]["args"][0]


def test_the_launcher_runs_finetune_py_with_the_keys_as_arguments() -> None:
    script = _launcher_script(_run())
    last = script.splitlines()[-1]
    assert last.startswith('run_ranks deepspeed --force_multi --hostfile "$HOSTSFILE" --master_addr "$MASTER_ADDR" ')
    args = shlex.split(last.split('"$MASTER_ADDR" ', 1)[1])
    # Pulumi.finetune.yaml's keys, as the contract spells the script's arguments.
    assert args == [
        "/etc/deepspeed/finetune.py", "--deepspeed", "/etc/deepspeed/ds_config.json",
        "--model", "Qwen/Qwen2.5-7B-Instruct", "--dataset", "/gcs/data/train.jsonl", "--format", "auto",
        "--prompt-field", "prompt", "--response-field", "response", "--seq-len", "2048", "--epochs", "3",
        "--learning-rate", "0.0002", "--save-steps", "200", "--gradient-checkpointing",
        "--lora", "--lora-rank", "16", "--lora-alpha", "32", "--lora-dropout", "0.05", "--lora-export", "adapter",
        "--lora-target-modules", "all-linear",
        # The contract's layout as arguments too (the same folders as CHECKPOINT_DIR and MODEL_DIR).
        "--checkpoint-dir", "/gcs/checkpoints/tune", "--model-dir", "/gcs/models/tune"]
    # The set-up a launcher always has: the master's address, the wait for every worker's sshd, ~/.deepspeed_env.
    assert 'export MASTER_ADDR="$(head -n 1 "$HOSTSFILE"' in script
    assert "until ssh -o ConnectTimeout=5 -o BatchMode=yes" in script
    assert '>> "$HOME/.deepspeed_env"' in script


def test_the_launcher_waits_for_the_data_in_the_bucket() -> None:
    """One `pulumi up` makes the bucket and the job; the data is uploaded after: the launcher waits for it (bounded:
    180 x 10 s, then it fails and restarts), then starts the ranks. The script is valid bash."""
    script = _launcher_script(_run())
    lines = script.splitlines()
    (wait,) = [line for line in lines if line.startswith("for path in ")]
    assert wait.startswith("for path in /gcs/data/train.jsonl; do tries=180; until [ -e \"$path\" ]")
    assert lines.index(wait) == len(lines) - 3  # then the data check, then the DeepSpeed line
    assert subprocess.run(["bash", "-n"], input=script, text=True, check=False).returncode == 0
    assert "for path in" not in _launcher_script(_run(changes=NO_BUCKET))  # a Hub dataset: nothing to wait for


def _remote_command(line: str, path: str, libraries: str) -> list[str]:
    """What the worker's shell parses of the launcher's `check_inputs ssh ...` line: bash runs it with ssh and
    check_inputs stand-ins (ssh joins its arguments after the host with spaces, as OpenSSH sends them)."""
    stubs = 'check_inputs() { "$@"; }\nssh() { shift 3; printf "%s" "$*"; }\n'
    out = subprocess.run(["bash", "-c", stubs + line], capture_output=True, text=True, check=True,
                         env={"PATH": path, "LD_LIBRARY_PATH": libraries, "MASTER_ADDR": "tune-worker-0"})
    return shlex.split(out.stdout)


def test_the_launcher_checks_the_data_before_the_ranks() -> None:
    """After the wait: finetune.py --prepare-data with the ranks' own arguments (their record format, fields,
    template, sequence length, packing), on the launcher, before any rank starts (issue 27: the data is checked before
    the GPUs work; issue 31: and tokenized once, for every rank to memory-map)."""
    lines = _launcher_script(_run()).splitlines()
    check, ranks = lines[-2], lines[-1]
    # On the first worker (issue 37 item 4: the CPUs of a GPU node, not the launcher's one), over the job's ssh.
    assert check.startswith('check_inputs ssh -o BatchMode=yes "$MASTER_ADDR" ')
    remote = _remote_command(check, path="/opt/venv/bin:/usr/bin", libraries="/usr/local/nvidia/lib64")
    assert remote[:7] == ["cd", "/etc/deepspeed", "&&", "exec", "env", "PATH=/opt/venv/bin:/usr/bin",
                          "LD_LIBRARY_PATH=/usr/local/nvidia/lib64"]
    assert remote[7:10] == ["python", "/etc/deepspeed/finetune.py", "--prepare-data"]
    assert remote[10:] == shlex.split(ranks.split('"$MASTER_ADDR" ', 1)[1])[1:]
    assert "check_inputs() {" in lines  # defined with run_ranks, before anything runs
    # A copy of yours (here one of the image) may not have --check-data: no check then.
    assert not [line for line in _launcher_script(_run(changes=((f"{W}.launch.script", "/opt/mine/finetune.py"),)))
                .splitlines() if line.startswith("check_inputs ")]


def test_the_script_accepts_what_the_stack_passes() -> None:
    """The rendered arguments through finetune.py's own parser: nothing it refuses, every value where it belongs."""
    from workloads import finetune

    args = shlex.split(_launcher_script(_run()).splitlines()[-1].split('"$MASTER_ADDR" ', 1)[1])[1:]
    parsed = finetune.script_module("finetune").parse_args(args, {"CHECKPOINT_DIR": "/gcs/checkpoints/tune",
                                                   "MODEL_DIR": "/gcs/models/tune"})
    assert (parsed.model, parsed.dataset, parsed.seq_len, parsed.epochs, parsed.max_steps) == (
        "Qwen/Qwen2.5-7B-Instruct", "/gcs/data/train.jsonl", 2048, 3.0, None)
    assert (parsed.lora, parsed.lora_rank, parsed.lora_alpha, parsed.lora_target_modules) == (
        True, 16, 32.0, ["all-linear"])
    assert (parsed.learning_rate, parsed.save_steps, parsed.gradient_checkpointing) == (0.0002, 200, True)
    assert parsed.checkpoint_dir == "/gcs/checkpoints/tune" and parsed.precision is None  # ds_config.json's bf16


def test_packing_is_passed_only_where_set() -> None:
    """finetune.packing unset: the script's auto (text packed, chat not), nothing passed; true and false: on, off."""
    import msgspec
    from conftest import changed, config_model

    from workloads import finetune

    assert "--packing" not in _launcher_script(_run()).splitlines()[-1]
    assert "--packing on" in _launcher_script(_run(changes=((f"{W}.finetune.packing", True),))).splitlines()[-1]
    w = config_model(changed("finetune")).workloads["tune"]
    off = msgspec.structs.replace(w, finetune=msgspec.structs.replace(w.finetune, packing=False))
    assert finetune.script_args(off)[finetune.script_args(off).index("--packing") + 1] == "off"


def test_max_steps_instead_of_epochs() -> None:
    run = _run(changes=((f"{W}.finetune.maxSteps", 500), (f"{W}.finetune.epochs", DELETE)))
    last = _launcher_script(run).splitlines()[-1]
    assert "--max-steps 500" in last and "--epochs" not in last
    # Neither: finetune.py's own default (one pass over the data), nothing passed.
    last = _launcher_script(_run(changes=((f"{W}.finetune.epochs", DELETE),))).splitlines()[-1]
    assert "--epochs" not in last and "--max-steps" not in last


def test_output_folders_are_on_the_bucket_mount() -> None:
    for role in ("Launcher", "Worker"):
        env = _env(_run(), role)
        assert env["CHECKPOINT_DIR"] == "/gcs/checkpoints/tune"  # the contract: <out>/checkpoints/<workload>
        assert env["MODEL_DIR"] == "/gcs/models/tune"  # <out>/models/<workload>
        assert "HF_TOKEN_PATH" not in env  # no hfToken, no token file
    # Every rank gets them: DeepSpeed's ranks start over ssh, which passes only what the client sends.
    conf = _run().one(CONFIG_MAP).inputs["data"]["ssh_client.conf"]
    assert "CHECKPOINT_DIR" in conf.split("SendEnv ", 1)[1].split() and "MODEL_DIR" in conf


def test_without_a_bucket_the_output_goes_to_the_claim() -> None:
    run = _run(changes=NO_BUCKET)
    env = _env(run, "Worker")
    assert (env["CHECKPOINT_DIR"], env["MODEL_DIR"]) == ("/data/checkpoints/tune", "/data/models/tune")
    assert not [v for v in _pod(run, "Worker")["volumes"] if "csi" in v]
    assert "--dataset tatsu-lab/alpaca" in _launcher_script(run)


def test_the_bucket_is_mounted_with_the_checkpointing_options() -> None:
    for role in ("Launcher", "Worker"):
        (gcs,) = [v for v in _pod(_run(), role)["volumes"] if "csi" in v]
        assert gcs["csi"]["driver"] == "gcsfuse.csi.storage.gke.io"
        assert gcs["csi"]["volumeAttributes"]["mountOptions"] == CHECKPOINTING_MOUNT_OPTIONS


def test_ds_config_leaves_the_trainers_values_auto() -> None:
    import json

    ds = json.loads(_run().one(CONFIG_MAP).inputs["data"]["ds_config.json"])
    zero = ds["zero_optimization"]
    assert zero["stage"] == 3
    # What the HF Trainer sizes from the model (transformers' deepspeed integration: hidden^2 x 0.9, 10 x hidden).
    assert zero["stage3_prefetch_bucket_size"] == "auto" and zero["stage3_param_persistence_threshold"] == "auto"
    assert zero["stage3_gather_16bit_weights_on_model_save"] is True  # the model saved whole at export
    # The planner's concrete values, which finetune.py sets the Trainer to: 2 workers x 4 L4 x 2 x 4 accumulation.
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"], ds["train_batch_size"]) == (
        2, 4, 64)
    assert ds["bf16"] == {"enabled": True}
    offloaded = json.loads(_run(changes=((f"{W}.deepspeed.offloadOptimizer", "cpu"),)).one(CONFIG_MAP)
                           .inputs["data"]["ds_config.json"])
    assert offloaded["optimizer"] == {"type": "AdamW", "params": {
        "lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}}


def test_the_configmap_ships_the_projects_script() -> None:
    data = _run().one(CONFIG_MAP).inputs["data"]
    assert data["finetune.py"] == (PROJECT_DIR / "recipes" / "finetune.py").read_text()


def test_failed_pods_restart_and_the_job_retries() -> None:
    spec = _job(_run())["spec"]
    # A worker whose sshd died restarts in place (same host name); the launcher restarts and the script resumes
    # from the newest checkpoint, up to backoffLimit attempts (workloads/recovery.py: 6).
    assert spec["mpiReplicaSpecs"]["Worker"]["restartPolicy"] == "OnFailure"
    assert spec["mpiReplicaSpecs"]["Launcher"]["restartPolicy"] == "OnFailure"
    assert spec["runPolicy"]["backoffLimit"] == 6
    assert _pod(_run(), "Worker")["terminationGracePeriodSeconds"] == 120  # SIGTERM: save a checkpoint first


def test_the_job_is_valid_for_the_operator_and_kubernetes() -> None:
    for run in (_run(), _run(token=True)):
        job = _job(run)
        doc = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": job["metadata"],
               "spec": job["spec"]}
        assert crd_problems(doc) == []
        assert pod_problems(doc) == []


def test_the_token_is_a_file_on_every_pod_that_runs_a_rank() -> None:
    run = _run(token=True)
    for role in ("Launcher", "Worker"):
        pod = _pod(run, role)
        assert _env(run, role)["HF_TOKEN_PATH"] == "/var/run/secrets/huggingface/token"
        (volume,) = [v for v in pod["volumes"] if "secret" in v]
        assert volume["secret"] == {"secretName": "tune-hf-token", "defaultMode": 0o440}
        assert {"name": volume["name"], "mountPath": "/var/run/secrets/huggingface", "readOnly": True} in \
            pod["containers"][0]["volumeMounts"]
        assert not [e for e in pod["containers"][0]["env"] if e["name"] in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")]
    assert run.one("kubernetes:core/v1:Secret", "tune-hf-token").inputs["metadata"]["name"] == "tune-hf-token"


def test_the_summary_says_where_the_result_goes() -> None:
    tune = _run().outputs["workloads"]["tune"]
    assert (tune["kind"], tune["checkpointDir"], tune["modelDir"]) == (
        "finetune", "/gcs/checkpoints/tune", "/gcs/models/tune")


# --- what the script cannot run, refused before anything is created ---------------------------------------------

def _problems(changes: dict[str, Any], secure: tuple[str, ...] = ()) -> list[str]:
    return problems("finetune", {f"{W}.{k}": v for k, v in changes.items()}, secure)


def _problems_on_llama_base(changes: dict[str, Any]) -> list[str]:
    """On meta-llama/Llama-3.1-8B (a base model without a chat template; gated: with the token), the stack's
    server of the result left out (it is sized for the stack's Qwen)."""
    config = changed("finetune", {**{f"{W}.{k}": v for k, v in changes.items()},
                                  f"{W}.finetune.model": "meta-llama/Llama-3.1-8B", "workloads.chat": DELETE})
    config["deepspeed-stack:hfToken"] = TOKEN
    return config_problems(config)


def test_the_stack_file_has_no_problem() -> None:
    assert _problems({}) == []


@pytest.mark.parametrize(("changes", "expected"), [
    ({"finetune.datasetPath": "data/train.csv"},
     f"{W}.finetune.datasetPath: finetune.py cannot read .csv files (it reads .jsonl, .json, .parquet, .txt, .text: "
     f"JSON lines, Parquet, text); convert the data, or set {W}.finetune.format if the file is one of them under "
     "another name"),
    ({"finetune.format": "parquet"},
     f"{W}.finetune.format: parquet, but data/train.jsonl is jsonl by its name; set format auto or jsonl"),
    ({"finetune.datasetPath": DELETE, "finetune.dataset": "tatsu-lab/alpaca", "finetune.format": "jsonl"},
     f"{W}.finetune.format: jsonl is for files of the bucket ({W}.finetune.datasetPath); a Hugging Face dataset "
     "brings its own: set auto"),
    ({"finetune.datasetPath": "data/train.txt"},
     f"{W}.finetune.promptField: a text file's records have one field, `text` (a line each); use JSON lines or "
     "Parquet for prompt/response pairs"),
    ({"finetune.responseField": DELETE},
     f"{W}.finetune.promptField: goes with {W}.finetune.responseField (or neither: textField)"),
])
def test_data_the_script_cannot_read_is_refused(changes: dict[str, Any], expected: str) -> None:
    assert _problems(changes) == [expected]


def test_lora_with_zero3_parameter_offload_is_refused() -> None:
    # finetune.py's combination_problems: peft wraps modules ZeRO-3 partitioned, and offloaded parameters must be
    # gathered twice to merge the adapter at export.
    assert _problems({"deepspeed.offloadParams": "cpu"}) == [
        f"{W}.finetune.lora.enabled: LoRA with ZeRO-3 parameter offload (offload_param) is not supported: offload "
        "the optimizer only, or train without LoRA (finetune.py would stop at start-up; see "
        f"{W}.deepspeed)"]
    # Every parameter of the 7B model: with parameter offload alone the optimizer states stay on the L4s (25.2 GB
    # each, checks/planner.py); with the optimizer offloaded too it runs.
    assert _problems({"deepspeed.offloadParams": "cpu", "deepspeed.offloadOptimizer": "cpu",
                      "finetune.lora.enabled": False}) == []
    assert _problems({"deepspeed.offloadOptimizer": "cpu"}) == []


def test_a_model_is_a_hub_id_or_a_bucket_folder() -> None:
    (found,) = _problems({"finetune.model": "not a model id"})
    assert found.startswith(f"{W}.finetune.model: ") and "a Hugging Face model id such as Qwen/Qwen2.5-7B-" in found
    assert _problems({"finetune.model": DELETE}) == [
        f"{W}.finetune.model: required: the model to train on, a Hugging Face id (e.g. Qwen/Qwen2.5-7B-Instruct), or "
        f"{W}.finetune.modelPath: a folder of the bucket"]
    assert _problems({"finetune.modelPath": "models/base"}) == [
        f"{W}.finetune.modelPath: give {W}.finetune.model (a Hugging Face id) or modelPath (a folder of the bucket), "
        "not both"]
    # A folder of the bucket names no shape: the planner sizes the model `model.name` (or `parameters`) says it is.
    assert _problems({"finetune.model": DELETE, "finetune.modelPath": "models/base"}) == [
        f"{W}.finetune.modelPath: models/base is a folder of the bucket, whose shape the planner cannot read: give "
        f"{W}.model.name (the model of data/models.yaml it holds, or one of the same shape) or {W}.model.parameters "
        "(billions) for the memory check"]
    assert _problems({"finetune.model": DELETE, "finetune.modelPath": "models/base", "model.name": "Qwen2.5-7B"}) == []


def test_a_gated_model_needs_the_token() -> None:
    # data/gated_models.yaml: Meta's Llama repos ask each account to accept their terms (401 without a token).
    # The stack's server of the result is then sized as Llama too (workloads/kinds/serve.py: the served model is
    # the sized one), 4 sequences at once to fit its L4 (8 KV heads, not Qwen's 4).
    llama = {f"{W}.finetune.model": "meta-llama/Llama-3.1-8B-Instruct", "workloads.chat.model.name": "Llama-3.1-8B",
             "workloads.chat.model.batchSize": 4}
    (found,) = problems("finetune", llama)
    assert found.startswith(f"{W}.finetune.model: meta-llama/Llama-3.1-8B-Instruct is gated on Hugging Face")
    config = changed("finetune", llama)
    config["deepspeed-stack:hfToken"] = TOKEN
    assert config_problems(config) == []
    # A folder of the bucket is no download: nothing to gate.
    folder = {f"{W}.finetune.model": DELETE, f"{W}.finetune.modelPath": "models/meta-llama/Llama-3.1-8B",
              f"{W}.model.name": "Llama-3.1-8B"}
    assert problems("finetune", {**llama, **folder}) == []


def test_data_in_the_bucket_needs_the_bucket() -> None:
    no_readers = {"workloads.chat": DELETE, "workloads.board": DELETE}  # the server and TensorBoard read the bucket
    assert problems("finetune", {f"{W}.gcsFuse.enabled": False, **no_readers}) == [
        f"{W}.finetune.datasetPath: data/train.jsonl is read from the stack's bucket through the pods' GCS FUSE "
        f"mount; set {W}.gcsFuse.enabled: true (and storage.enabled: true)"]
    found = problems("finetune", {"storage.enabled": False, **no_readers})
    assert found == [f"{W}.gcsFuse.enabled: needs the stack's bucket; set storage.enabled: true"]


def test_flags_the_stack_sets_are_not_repeated_in_launch_args() -> None:
    assert _problems({"launch.args": ["--logging-steps", "50", "--model=other/model", "--model-dir", "/x"]}) == [
        f"{W}.launch.args[2]: --model is set by the stack from {W}.finetune.model; change it there instead",
        f"{W}.launch.args[3]: --model-dir is the stack's (CHECKPOINT_DIR and MODEL_DIR under the bucket's mount, "
        "else the claim's: the contract a server of the result reads); remove it"]


def test_every_flag_the_stack_passes_is_guarded() -> None:
    from workloads import finetune

    args = shlex.split(_launcher_script(_run()).splitlines()[-1].split('"$MASTER_ADDR" ', 1)[1])[1:]
    assert {a for a in args if a.startswith("--")} <= set(finetune.STACK_FLAGS)


def test_finetune_runs_on_nvidia_only() -> None:
    found = _problems({"accelerator.kind": "gaudi", "pool": DELETE})
    assert f"{W}.accelerator.kind: a finetune workload runs on NVIDIA GPUs of a GKE pool (finetune.py under " \
           "DeepSpeed's CUDA path); on Gaudi the same `finetune` keys go into a kind mpijob " \
           "(workloads.<name>.finetune: finetune.py on HPU, data on the shared claim)" in found


# --- `training.*` on an NVIDIA mpijob: refused, pointing at this kind (issue 18: never silently ignored) -----------

def test_training_keys_on_an_nvidia_mpijob_are_refused() -> None:
    found = problems("h100", {"workloads.smoke.training.model": "Qwen/Qwen2.5-7B-Instruct",
                              "workloads.smoke.training.epochs": 2, "workloads.smoke.training.lora.rank": 4})
    reason = ("`training` is the Gaudi fine-tuning run's (optimum-habana); an NVIDIA MPIJob runs launch.script and "
              "would ignore it. Fine-tune on NVIDIA with kind finetune (finetune.model, finetune.dataset or "
              "datasetPath, finetune.epochs, finetune.lora), or pass your script its arguments in launch.args")
    assert found == [f"workloads.smoke.training.{key}: {reason}" for key in ("model", "epochs", "lora")]
    assert problems("h100", {}) == []  # the defaults alone: nothing set, nothing refused
    assert problems("gaudi", {"workloads.gaudi-llm-ds-ft.training.epochs": 2}) == []  # Gaudi runs them


def test_every_nvidia_mpijob_gets_the_output_folders() -> None:
    """The contract's layout on a plain mpijob too (smoke_train.py checkpoints to CHECKPOINT_DIR, and finetune.py run
    as an mpijob's launch.script needs both): the h100 stack's claim is mounted at /data."""
    job = stack_run("h100").one(MPIJOB).inputs
    for role in ("Launcher", "Worker"):
        container = job["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in container["env"]}
        assert (env["CHECKPOINT_DIR"], env["MODEL_DIR"]) == ("/data/checkpoints/smoke", "/data/models/smoke")
    conf = stack_run("h100").by_type(CONFIG_MAP)
    (ssh,) = [c.inputs["data"]["ssh_client.conf"] for c in conf if "ssh_client.conf" in c.inputs.get("data", {})]
    assert {"CHECKPOINT_DIR", "MODEL_DIR"} <= set(ssh.split("SendEnv ", 1)[1].splitlines()[0].split())


# --- the formats people bring, and the chat template (issue 27 item 1) -----------------------------------------

CHATS = {"finetune.promptField": DELETE, "finetune.responseField": DELETE, "finetune.datasetPath": "data/chats.jsonl",
         "finetune.recordFormat": "messages"}


def _args(changes: dict[str, Any]) -> list[str]:
    run = _run(changes=tuple((f"{W}.{k}", v) for k, v in changes.items()))
    return shlex.split(_launcher_script(run).splitlines()[-1].split('"$MASTER_ADDR" ', 1)[1])[1:]


def test_the_record_format_its_fields_and_the_template_become_the_scripts_arguments() -> None:
    args = _args({**CHATS, "finetune.recordFormat": "sharegpt", "finetune.messagesField": "dialog",
                  "finetune.roleField": "speaker", "finetune.contentField": "text", "finetune.roles.customer": "user",
                  "finetune.roles.agent": "assistant", "finetune.chatTemplate": "zephyr", "finetune.evalSplit": 0.05})
    start = args.index("--records")
    assert args[start:args.index("--seq-len")] == [
        "--records", "sharegpt", "--messages-field", "dialog", "--role-field", "speaker", "--content-field", "text",
        "--roles", "agent=assistant", "customer=user", "--chat-template", "/etc/deepspeed/chat_template.jinja",
        "--eval-split", "0.05"]
    parsed = finetune_script().parse_args(args, {"CHECKPOINT_DIR": "/c", "MODEL_DIR": "/m"})
    assert (parsed.records, parsed.roles, parsed.eval_split) == ("sharegpt", ["agent=assistant", "customer=user"],
                                                                 "0.05")
    # The defaults pass nothing: finetune.py's own (auto format, the model's own template).
    assert "--records" not in _args({}) and "--chat-template" not in _args({})


def finetune_script() -> Any:
    from workloads import finetune

    return finetune.script_module("finetune")


def test_a_held_out_file_is_read_from_the_bucket_and_waited_for() -> None:
    run = _run(changes=((f"{W}.finetune.evalSplit", "data/eval.jsonl"),))
    lines = _launcher_script(run).splitlines()
    assert "--eval-split /gcs/data/eval.jsonl" in lines[-1]
    (wait,) = [line for line in lines if line.startswith("for path in ")]
    assert wait.startswith("for path in /gcs/data/train.jsonl /gcs/data/eval.jsonl; do")
    # `pulumi config set --path` may keep 0.05 as text: still a fraction.
    assert "--eval-split 0.05" in _launcher_script(_run(changes=((f"{W}.finetune.evalSplit", "0.05"),)))


def test_the_configmap_ships_finetune_pys_modules_and_the_named_template() -> None:
    scripts = PROJECT_DIR / "recipes"
    data = _run().one(CONFIG_MAP).inputs["data"]
    for name in ("finetune_config.py", "finetune_data.py", "finetune_render.py", "finetune_check.py",
                 "finetune_checkpoints.py"):
        assert data[name] == (scripts / name).read_text()
    assert "chat_template.jinja" not in data
    named = _run(changes=((f"{W}.finetune.chatTemplate", "zephyr"),)).one(CONFIG_MAP, "tune-config").inputs["data"]
    from model.yamlio import load_yaml

    assert named["chat_template.jinja"] == load_yaml(PROJECT_DIR / "data" / "chat_templates.yaml")[
        "templates"]["zephyr"]["template"]


def test_every_rank_and_the_launcher_know_the_stacks_keys() -> None:
    """FINETUNE_STACK_KEYS: the script's errors name the key to change (sent over ssh like CHECKPOINT_DIR)."""
    import json

    run = _run()
    for role in ("Launcher", "Worker"):
        keys = json.loads(_env(run, role)["FINETUNE_STACK_KEYS"])
        assert keys["--dataset"] == f"{W}.finetune.datasetPath" and keys["--model"] == f"{W}.finetune.model"
        assert keys["--records"] == f"{W}.finetune.recordFormat" and keys["--roles"] == f"{W}.finetune.roles"
        assert keys["--seq-len"] == f"{W}.finetune.sequenceLength"
        assert keys["--learning-rate"] == f"{W}.deepspeed.learningRate"
    keys = json.loads(_env(_run(changes=NO_BUCKET), "Launcher")["FINETUNE_STACK_KEYS"])
    assert keys["--dataset"] == f"{W}.finetune.dataset"


@pytest.mark.parametrize(("changes", "expected"), [
    ({**CHATS, "finetune.textField": "body"},
     f"{W}.finetune.textField: not read with {W}.finetune.recordFormat messages (it reads contentField, "
     "messagesField, roleField, roles); remove it, or set the format that has this field"),
    ({"finetune.recordFormat": "alpaca", "finetune.responseField": DELETE, "finetune.promptField": DELETE,
      "finetune.textField": "body"},
     f"{W}.finetune.textField: not read with {W}.finetune.recordFormat alpaca (it reads instruction, input, "
     "output); remove it, or set the format that has this field"),
    ({"finetune.messagesField": "chat"},
     f"{W}.finetune.messagesField: messagesField and promptField are fields of different record formats; keep the "
     f"one of your records, or set {W}.finetune.recordFormat"),
    ({**CHATS, "finetune.datasetPath": "data/chats.txt"},
     f"{W}.finetune.recordFormat: messages, but a text file's records are its lines (format text); use JSON lines "
     "or Parquet"),
    ({"finetune.chatTemplate": "chatml"},
     f"{W}.finetune.chatTemplate: 'chatml' is not a template the stack knows: auto (the model's own), raw (none), "
     "or one of data/chat_templates.yaml: zephyr"),
    ({**CHATS, "finetune.chatTemplate": "raw"},
     f"{W}.finetune.chatTemplate: raw renders text and plain prompt/completion records only; messages records are "
     "conversations and go through a chat template: auto (the model's own) or a name (zephyr)"),
    ({"finetune.evalSplit": 1.5}, f"{W}.finetune.evalSplit: must be less than 1, got 1.5"),
    ({"finetune.evalSplit": "1.5"},
     f"{W}.finetune.evalSplit: 1.5: a fraction of the records is between 0 and 1 (e.g. 0.05), or name a file of the "
     "bucket"),
    ({"finetune.evalSplit": "data/eval.csv"},
     f"{W}.finetune.evalSplit: finetune.py cannot read .csv files (it reads .jsonl, .json, .parquet, .txt, .text)"),
    ({"finetune.roles.bot": "robot"},
     f"{W}.finetune.roles.bot: \"robot\" is not one of system, user, assistant"),
])
def test_record_keys_the_run_cannot_use_are_refused(changes: dict[str, Any], expected: str) -> None:
    assert _problems(changes) == [expected]


def test_chat_data_on_a_model_without_a_template_is_refused_unless_one_is_named() -> None:
    assert _problems_on_llama_base(CHATS) == [
        f"{W}.finetune.chatTemplate: meta-llama/Llama-3.1-8B's tokenizer has no chat template "
        "(data/chat_templates.yaml), and messages records are rendered through one: name one the stack ships (zephyr; "
        "it is saved with the tuned model, so the server renders requests the same way), or fine-tune its Instruct "
        "model"]
    assert _problems_on_llama_base({**CHATS, "finetune.chatTemplate": "zephyr"}) == []
    assert _problems_on_llama_base({}) == []  # prompt/response records: raw on a model without a template


def test_chat_data_previews_on_a_model_with_a_template_or_one_named() -> None:
    assert _problems(CHATS) == []  # Qwen2.5-7B-Instruct: its own template
    # A model of the bucket: the launcher's data check loads its tokenizer and says.
    assert _problems({**CHATS, "finetune.model": DELETE, "finetune.modelPath": "models/Qwen2.5-7B",
                      "model.name": "Qwen2.5-7B"}) == []
    assert _problems({"finetune.evalSplit": 0.05}) == [] and _problems({"finetune.evalSplit": "data/eval.jsonl"}) == []


def test_lr_scheduler_reaches_the_script_and_only_when_set() -> None:
    """finetune.lrScheduler (the option docs/layout.md adds as its example): --lr-scheduler in every rank's
    arguments, after the learning rate; unset, no flag (the Trainer's own, linear); a name the Trainer lacks is
    refused at the key."""
    def args_of(run: RunResult) -> list[str]:
        return shlex.split(_launcher_script(run).splitlines()[-1].split('"$MASTER_ADDR" ', 1)[1])

    args = args_of(_run(changes=((f"{W}.finetune.lrScheduler", "cosine"),)))
    assert args[args.index("--learning-rate") + 2:args.index("--learning-rate") + 4] == ["--lr-scheduler", "cosine"]
    assert "--lr-scheduler" not in args_of(_run())
    (found,) = problems("finetune", {f"{W}.finetune.lrScheduler": "exponential"})
    assert found.startswith(f"{W}.finetune.lrScheduler: ") and "cosine" in found
