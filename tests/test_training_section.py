"""Where people look (issue 29 item 3): the preview's "Training" section gives a finetune run's next steps as the
"Serving" section gives a server's: `pulumi up`, the data uploaded to the bucket path the run reads, the launcher's
log followed, TensorBoard where the stack has one, and where the model lands."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import stack_run, stack_yaml

from preview import summary
from preview.__main__ import SECTIONS
from preview.sections import render_sections, training

MPIJOB = "kubernetes:kubeflow.org/v2beta1:MPIJob"


@pytest.fixture(scope="module")
def body() -> str:
    [(title, text)] = training.section(stack_run("finetune"))
    assert title == "Training"
    return text


def _job(run: Any, name: str) -> dict[str, Any]:
    return next(r.inputs for r in run.by_type(MPIJOB) if r.inputs["metadata"]["name"] == name)


def test_the_recipes_steps_in_order(body: str) -> None:
    steps = [line for line in body.split("```sh\n", 1)[1].split("```")[0].splitlines() if line and line[0] != "#"]
    bucket = "gs://$(pulumi stack output bucket -s finetune)"
    assert steps == [
        "pulumi up -s finetune   # the cluster, the bucket and the job; the GPU nodes come up when the job's pods ask "
        "for them",
        f"gcloud storage cp train.jsonl {bucket}/data/train.jsonl",
        "kubectl logs -n finetune -f job/tune-launcher",
        # CHECKPOINT_DIR=/gcs/checkpoints/tune, TENSORBOARD_LOGGING_DIR=/gcs/logs/tune, MODEL_DIR=/gcs/models/tune
        f"gcloud storage cat {bucket}/checkpoints/tune/progress.json",
        # the example's TensorBoard server `board` (kind tensorboard, namespace tensorboard) shows tune
        "kubectl port-forward svc/board 6006:6006 -n tensorboard &",
        f"gcloud storage ls {bucket}/models/tune/",
        f"gcloud storage cat {bucket}/models/tune/run.json",
        # every run record of the stack, one folder each, for `make gpus ... RUNS=runs` (tests/test_past_runs.py)
        f"for f in $(gcloud storage ls '{bucket}/models/*/run.json'); do "
        'd="runs/$(basename "$(dirname "$f")")"; mkdir -p "$d" && gcloud storage cp "$f" "$d/"; done']
    assert "# then open http://localhost:6006" in body
    assert "tensorboard --logdir" not in body  # the alternative only where no server shows the run
    assert "| tune | Qwen/Qwen2.5-7B-Instruct | 2 worker(s) x 4 (pool l4x4) | `data/train.jsonl` (bucket) | about " \
           "0.97–1.2 h, $4.43–$5.27 (spot) | `models/tune/` (bucket) |" in body


def test_the_commands_name_what_the_stack_creates() -> None:
    """The upload lands where the ranks read (the MPIJob's --dataset under the bucket's mount); the log is the
    launcher Job's, which the MPI operator names <MPIJob>-launcher in the MPIJob's namespace; the result is
    MODEL_DIR under the mount."""
    run = stack_run("finetune")
    job = _job(run, "tune")
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    text = str(launcher) + str(job["spec"]["mpiReplicaSpecs"]["Worker"])
    assert job["metadata"]["namespace"] == "finetune"
    assert "/gcs/data/train.jsonl" in text  # the bucket at /gcs: data/train.jsonl in the bucket
    assert "/gcs/models/tune" in text
    assert run.outputs["workloads"]["tune"]["launcherJob"] == f"{job['metadata']['name']}-launcher"
    # The progress file and the event files where the ranks are told to write them (the bucket at /gcs).
    env = {e["name"]: e.get("value") for e in launcher["containers"][0]["env"]}
    assert (env["CHECKPOINT_DIR"], env["TENSORBOARD_LOGGING_DIR"]) == ("/gcs/checkpoints/tune", "/gcs/logs/tune")
    assert {k: run.outputs["workloads"]["tune"][k] for k in ("progressInBucket", "logsInBucket",
                                                             "runRecordInBucket")} == {
        "progressInBucket": "checkpoints/tune/progress.json", "logsInBucket": "logs/tune",
        "runRecordInBucket": "models/tune/run.json"}


def test_the_summary_puts_training_before_serving() -> None:
    run = stack_run("finetune")
    md = summary.markdown(run, [], 0, extra=render_sections(run, SECTIONS))
    assert md.index("#### Training") < md.index("#### Serving")


def _fake(summaries: dict[str, Any], costs: dict[str, Any] | None = None) -> Any:
    return SimpleNamespace(stack="s", outputs={"workloads": summaries, **({"costs": costs} if costs else {})})


TUNE = {"kind": "finetune", "namespace": "ft", "workers": 1, "acceleratorsPerWorker": 1, "pool": "l4",
        "model": "m", "launcherJob": "tune-launcher", "claim": "shared"}


@pytest.mark.parametrize(("keys", "wanted", "unwanted"), [
    # a folder of the bucket: copied into its parent folder
    ({"datasetInBucket": "data/shards", "modelInBucket": "models/tune"},
     "gcloud storage cp --recursive shards gs://$(pulumi stack output bucket -s s)/data/", "ranks download"),
    ({"datasetInBucket": "train.parquet", "modelInBucket": "models/tune"},
     "gcloud storage cp train.parquet gs://$(pulumi stack output bucket -s s)/train.parquet", "--recursive"),
    # a Hugging Face dataset: nothing to upload; no bucket: the model stays on the claim
    ({"datasetHub": "tatsu-lab/alpaca", "modelOnClaim": "/data/models/tune"},
     "# the data: the ranks download tatsu-lab/alpaca from Hugging Face", "gcloud storage"),
])
def test_data_and_result_where_the_run_has_them(keys: dict[str, str], wanted: str, unwanted: str) -> None:
    [(_, text)] = training.section(_fake({"tune": {**TUNE, **keys}}))
    assert wanted in text and unwanted not in text
    if "modelOnClaim" in keys:
        assert "# the result: /data/models/tune on the claim shared" in text


def test_without_a_bucket_the_progress_and_event_files_are_named_on_the_claim() -> None:
    keys = {"datasetHub": "d", "modelOnClaim": "/data/models/tune",
            "progressFile": "/data/checkpoints/tune/progress.json", "logsDir": "/data/logs/tune"}
    [(_, text)] = training.section(_fake({"tune": {**TUNE, **keys}}))
    assert "# progress: /data/checkpoints/tune/progress.json on the claim, written by rank 0" in text
    assert "# TensorBoard: no server of this stack shows it (kind tensorboard reads the bucket only); the run's " \
           "event files are in /data/logs/tune on the claim" in text
    assert "gcloud storage" not in text


BOARD = {"kind": "tensorboard", "deployment": "board", "workloads": ["tune"],
         "portForward": "kubectl port-forward svc/board 6006:6006 -n tb", "url": "http://localhost:6006"}


def test_tensorboard_step_only_where_the_stack_deploys_one() -> None:
    summaries = {"tune": {**TUNE, "datasetHub": "d", "modelInBucket": "models/tune", "logsInBucket": "logs/tune"},
                 "board": BOARD}
    [(_, text)] = training.section(_fake(summaries))
    assert "kubectl port-forward svc/board 6006:6006 -n tb &\n# then open http://localhost:6006" in text
    assert "no server of this stack" not in text and "tensorboard --logdir" not in text


def test_a_server_that_shows_other_runs_is_not_this_runs() -> None:
    """A TensorBoard server lists the finetune workloads it shows: a run it does not show gets the alternative
    (the bucket's event files viewed on your machine), not another run's port-forward."""
    summaries = {"tune": {**TUNE, "datasetHub": "d", "logsInBucket": "logs/tune"},
                 "board": {**BOARD, "workloads": ["other"]}}
    [(_, text)] = training.section(_fake(summaries))
    assert "svc/board" not in text
    assert "gcloud storage cp --recursive gs://$(pulumi stack output bucket -s s)/logs/tune . && tensorboard " \
           "--logdir tune" in text


def test_no_finetune_workload_no_section() -> None:
    assert training.section(_fake({"chat": {"kind": "serve"}})) == []


def test_a_run_without_a_token_count_says_so_in_the_table() -> None:
    costs = {"runs": {"tune": {"missing": "set workloads.tune.finetune.datasetTokens"}}}
    [(_, text)] = training.section(_fake({"tune": {**TUNE, "datasetHub": "d"}}, copy.deepcopy(costs)))
    assert "| unknown: see Estimated cost |" in text
    assert stack_yaml("finetune")["deepspeed-stack:workloads"]["tune"]["finetune"]["datasetTokens"] == 10_000_000


# --- the data step (issue 31 item 2) ----------------------------------------------------------------------------

def test_the_measured_tokenization_rates() -> None:
    """data/training_speed.yaml's rates per CPU, measured with finetune.py --prepare-data (docs/measurements.md)."""
    from model import training_speed

    speed = training_speed.load()
    assert speed.tokenize_chars_per_second == {"text": 1_690_000, "chat": 770_000}
    assert speed.chars_per_token == 4


def test_the_preview_says_how_long_the_data_step_takes(body: str) -> None:
    """Pulumi.finetune.yaml's 10,000,000 datasetTokens x 4 characters on the first worker of its l4x4 pool
    (g2-standard-48: 46 CPUs fit its container, 46 processes): 0.5 s of text or 1.1 s of chat (its record format is
    found at run time: both)."""
    assert ("- `tune`: about 1 s (text records) to 1 s (chat records) for 10,000,000 tokens, once, before the ranks "
            "start: finetune.py --prepare-data in 46 processes on the first worker's 46 CPUs (g2-standard-48), into "
            "/gcs/checkpoints/tune/tokenized/, reused on every restart and resume") in body


@pytest.mark.parametrize(("changes", "said"), [
    # 2B tokens of text: 8e9 characters / (1.69e6 a CPU-second x 46 processes) = 103 s.
    ({"recordFormat": "text", "datasetTokens": 2_000_000_000}, "about 2 min (text records) for 2,000,000,000 tokens"),
    # Conversations: 8e9 / (770,000 x 46) = 226 s.
    ({"recordFormat": "messages", "datasetTokens": 2_000_000_000}, "about 4 min (chat records) for 2,000,000,000"),
    # A worker of 1 CPU (resources.cpu): 1 process, 8e9 / 1.69e6 = 4,734 s.
    ({"recordFormat": "text", "datasetTokens": 2_000_000_000, "cpu": "1"},
     "about 79 min (text records) for 2,000,000,000 tokens, once, before the ranks start: finetune.py --prepare-data "
     "in 1 process on the first worker's 1 CPU (g2-standard-48)"),
    # 200 CPUs: at most finetune_tokenized.MAX_DATA_PROCS = 64 processes, 8e9 / (770,000 x 64) = 162 s.
    ({"recordFormat": "messages", "datasetTokens": 2_000_000_000, "cpu": "200"},
     "about 3 min (chat records) for 2,000,000,000 tokens, once, before the ranks start: finetune.py --prepare-data "
     "in 64 processes on the first worker's 200 CPUs"),
    ({"datasetTokens": None}, "while the GPU nodes wait (counted in the run's hours); set "
                              "workloads.tune.finetune.datasetTokens for how long it takes"),
])
def test_the_data_steps_time_follows_the_data(changes: dict[str, Any], said: str) -> None:
    import msgspec
    from conftest import config_model

    from planner import run_hours
    from workloads import finetune

    cfg = config_model(stack_yaml("finetune"))
    w = cfg.workloads["tune"]
    fields = {"record_format" if k == "recordFormat" else "dataset_tokens": v for k, v in changes.items() if k != "cpu"}
    w = msgspec.structs.replace(w, finetune=msgspec.structs.replace(w.finetune, **fields))
    if "cpu" in changes:
        w = msgspec.structs.replace(w, resources=msgspec.structs.replace(w.resources, cpu=changes["cpu"]))
    assert said in finetune.data_step(w, run_hours.first_worker(cfg, w))
