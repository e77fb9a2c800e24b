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
    assert [s.split()[0:3] for s in steps] == [["pulumi", "up", "-s"], ["gcloud", "storage", "cp"],
                                               ["kubectl", "logs", "-n"], ["gcloud", "storage", "ls"]]
    assert steps[1] == "gcloud storage cp train.jsonl gs://$(pulumi stack output bucket -s finetune)/data/train.jsonl"
    assert steps[2] == "kubectl logs -n finetune -f job/tune-launcher"
    assert steps[3] == "gcloud storage ls gs://$(pulumi stack output bucket -s finetune)/models/tune/"
    assert "# TensorBoard: not in this stack yet" in body  # no TensorBoard server in the stack (yet)
    assert "| tune | Qwen/Qwen2.5-7B-Instruct | 2 worker(s) x 4 (pool l4x4) | `data/train.jsonl` (bucket) | about " \
           "1.8–3.9 h, $6.56–$14.37 (spot) | `models/tune/` (bucket) |" in body


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


def test_tensorboard_step_only_where_the_stack_deploys_one() -> None:
    board = {"kind": "tensorboard", "job": "board", "portForward": "kubectl -n ft port-forward svc/board 6006:6006",
             "url": "http://localhost:6006"}
    summaries = {"tune": {**TUNE, "datasetHub": "d", "modelInBucket": "models/tune"}, "board": board}
    [(_, text)] = training.section(_fake(summaries))
    assert "kubectl -n ft port-forward svc/board 6006:6006 &\n# then open http://localhost:6006" in text
    assert "not in this stack yet" not in text


def test_no_finetune_workload_no_section() -> None:
    assert training.section(_fake({"chat": {"kind": "serve"}})) == []


def test_a_run_without_a_token_count_says_so_in_the_table() -> None:
    costs = {"runs": {"tune": {"missing": "set workloads.tune.finetune.datasetTokens"}}}
    [(_, text)] = training.section(_fake({"tune": {**TUNE, "datasetHub": "d"}}, copy.deepcopy(costs)))
    assert "| unknown: see Estimated cost |" in text
    assert stack_yaml("finetune")["deepspeed-stack:workloads"]["tune"]["finetune"]["datasetTokens"] == 10_000_000
