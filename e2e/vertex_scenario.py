"""The `vertex` scenario of `make e2e` (e2e/run.py): the vertex stack's CustomJob: the files `pulumi up` uploads in a
local folder standing in for the bucket at /gcs, vertex_start.sh with each replica's containerSpec and CLUSTER_SPEC
on 2 hosts, the recipe (finetune.py) on the tiny Llama for one epoch, LoRA merged into the exported model (which the
adapters scenario serves as its base).
"""

from __future__ import annotations

import copy
import json
import shlex
from pathlib import Path
from typing import Any

import harness
import hosts as nshosts
from finetune_common import (
    BUCKET_INPUTS,
    EVENT_TAGS,
    EVENT_TAGS_SCRIPT,
    FINETUNE_DS,
    FINETUNE_KEYS,
    NUMBERS,
    Phases,
    _venv_python,
    event_problems,
    finetune_assets,
    outside,
    trainer_losses,
)
from harness import (
    IMAGE_DIR,
    IMAGE_ENV,
    RANK_ENV,
    VENV,
    _chown_dirs,
    fail_unless,
    image_etc,
    image_sshd_drop_in,
    launch,
    write,
)

# --- Vertex AI's path -------------------------------------------------------------------------------------

BUCKET = "e2e-bucket"
# vertex_start.sh counts `nvidia-smi -L` lines for the hostfile's slots: a CPU host stands in for one GPU.
NVIDIA_SMI_STAND_IN = "#!/bin/sh\necho 'GPU 0: CPU stand-in (UUID: GPU-00000000-e2e)'\n"


def vertex_cluster_spec(task: str, index: int, workers: int) -> str:
    return json.dumps({"cluster": {"workerpool0": ["workerpool0-0:2222"],
                                   "workerpool1": [f"workerpool1-{i}:2222" for i in range(workers)]},
                       "task": {"type": task, "index": index, "trial": ""}, "environment": "cloud"})


# The vertex stack's recipe on the tiny Llama: its `finetune` keys but for the data, the model and the run's
# saves; one epoch, LoRA (merged into the exported model). Its data are text records (pre-training style: the
# conversations' words as plain documents), so make e2e shows them packed into full blocks (issue 31 item 2; the
# chat path is the finetune scenario's): 64 documents of ~16 tokens in VERTEX_SEQ_LEN-token blocks, 2 ranks x 4
# blocks a step.
VERTEX_RUN = "e2e-vertex"  # vertex.displayName: the run's folders, checkpoints/<run> and models/<run>
VERTEX_SEQ_LEN = 32
VERTEX_BATCH = 8  # microBatchPerGpu 4 (FINETUNE_DS) x 2 ranks
VERTEX_TEXT = "text.jsonl"
VERTEX_JOB_ENV = {"CLOUD_ML_JOB_ID": "e2e-vertex-1", "VERTEX_SSH_WAIT_SLEEP": "0.1", "VERTEX_SSH_WAIT_RETRIES": "600",
                  "VERTEX_PYTHON": f"{VENV}/bin/python", "HF_HUB_OFFLINE": "1"}


def vertex_text_records() -> list[dict[str, str]]:
    """The finetune scenario's questions and answers as plain documents, one a record."""
    return [{"text": f"What is {a} plus {b}? {a} plus {b} is {i + j}."}
            for i, a in enumerate(NUMBERS) for j, b in enumerate(NUMBERS)]


def vertex_keys() -> dict[str, Any]:
    """The e2e's `vertex` keys (the finetune scenario's DeepSpeed block, defined further down; packing unset: text
    records are packed into blocks by default)."""
    return {"displayName": VERTEX_RUN, "tensorboard": True, "launch": {"args": ["--logging-steps", "2"]},
            "deepspeed": FINETUNE_DS,  # the tiny Llama's shape (a bucket folder names none): the progress inputs
            "model": {k: FINETUNE_KEYS["model"][k] for k in ("parameters", "vocabulary", "hidden")},
            # A whole model out, as the vertex stack's (it trains every weight): LoRA here (two CPU ranks), merged.
            # The adapters scenario then serves this export as its base (a merged export through vLLM).
            "finetune": {"modelPath": f"{BUCKET_INPUTS}/base", "datasetPath": f"{BUCKET_INPUTS}/{VERTEX_TEXT}",
                         "recordFormat": "text", "sequenceLength": VERTEX_SEQ_LEN, "epochs": 1, "saveSteps": 1000,
                         "lora": {"export": "merged"}}}


def vertex_export(cluster: nshosts.Cluster) -> Path:
    """Where the CustomJob's export (models/<run> in the bucket) lies on this machine after the scenario."""
    return cluster.work / "gcs" / BUCKET / "models" / VERTEX_RUN


def packed_steps(tokenized: dict[str, Any]) -> int:
    """One epoch's steps from the tokenized folder's marker, after checking that the documents were packed: as many
    samples as full blocks of their tokens hold (unpacked, each of the 64 documents would be a sample)."""
    blocks = -(-int(tokenized["tokens"]) // VERTEX_SEQ_LEN)
    fail_unless(tokenized.get("packing") == "blocks" and tokenized.get("samples") == blocks,
                f"the text was not packed into {VERTEX_SEQ_LEN}-token blocks: {tokenized}")
    return -(-blocks // VERTEX_BATCH)


def vertex_aip_env(base_output: str) -> dict[str, str]:
    """What Vertex AI sets on every replica from the CustomJob's baseOutputDirectory."""
    return {"AIP_MODEL_DIR": f"{base_output}/model/", "AIP_CHECKPOINT_DIR": f"{base_output}/checkpoints/",
            "AIP_TENSORBOARD_LOG_DIR": f"{base_output}/logs/"}


def scenario_vertex(cluster: nshosts.Cluster, logs: Path) -> str:
    """The vertex stack's CustomJob as Vertex AI runs it, on 2 hosts: its uploaded files in the bucket, each
    replica's containerSpec (command, args, env) under its own CLUSTER_SPEC and the AIP_* variables. The recipe
    trains the tiny Llama for one epoch; the merged model and .complete land in models/<run>, the event files in
    AIP_TENSORBOARD_LOG_DIR. (SIGTERM to vertex_start.sh, passed on to the ranks, is tested with stand-ins in
    tests/test_vertex_entrypoint.py, and finetune.py's save on SIGTERM and resume by the finetune scenario: a second
    run here would cost make e2e's time budget 20 s.)"""
    phases = Phases("vertex")
    hosts = cluster.hosts[:2]
    gcs = cluster.work / "gcs"
    command, env = _uploaded(cluster, hosts, gcs)
    phases.end("tiny Llama, data and the uploaded recipe")

    workers = len(hosts) - 1
    for i, host in enumerate(hosts[1:]):
        cluster.spawn(host, ["/bin/bash", "-c", command], log=logs / f"vertex-{host.name}.log",
                      env={**env, "CLUSTER_SPEC": vertex_cluster_spec("workerpool1", i, workers)})
    status, output = launch(cluster, hosts[0], command, logs / "vertex-primary.log",
                            env={**env, "CLUSTER_SPEC": vertex_cluster_spec("workerpool0", 0, workers)})
    cluster.stop_services()
    fail_unless(status == 0, f"exit {status} (log {logs / 'vertex-primary.log'})")
    packed, steps = _exported(output, len(hosts), gcs)
    losses = trainer_losses(output)
    phases.end("one epoch, exported")
    return (f"the vertex stack's CustomJob on {len(hosts)} hosts (vertex_start.sh, CLUSTER_SPEC, /gcs): the recipe "
            f"(finetune.py from the bucket) on the tiny Llama for one epoch of {len(vertex_text_records())} text "
            f"documents packed into {packed['samples']} blocks of {VERTEX_SEQ_LEN} tokens ({steps} steps, loss "
            f"{' -> '.join(f'{v:.2f}' for v in losses[:1] + losses[-1:])}): LoRA merged, model and .complete in "
            f"models/{VERTEX_RUN}, event files in AIP_TENSORBOARD_LOG_DIR with {', '.join(EVENT_TAGS)}. Phases: "
            f"{phases.summary()}")


def _uploaded(cluster: nshosts.Cluster, hosts: list[nshosts.Host], gcs: Path) -> tuple[str, dict[str, str]]:
    """The bucket as `pulumi up` leaves it (the recipe's files, the data) at /gcs on each host, the image's /app,
    and the replicas' command and environment from the CustomJob's containerSpec."""
    from workloads import vertex_job

    image_etc(cluster, image_sshd_drop_in())
    bucket = gcs / BUCKET
    finetune_assets(bucket, harness.RUN_CACHE / "tiny-llm")
    write(bucket / BUCKET_INPUTS / VERTEX_TEXT, "".join(json.dumps(r) + "\n" for r in vertex_text_records()))
    _chown_dirs(bucket)
    cfg = _vertex_config(vertex_keys(), len(hosts) - 1)
    for name, text in vertex_job.vertex_files(cfg).items():  # what `pulumi up` uploads
        write(bucket / name, text)
    _chown_dirs(gcs)
    # The image's /app (its WORKDIR): DeepSpeed's runner reads ./.deepspeed_env too (vertex_start.sh rewrites ~'s).
    app = cluster.work / "vertex-app"
    app.mkdir(exist_ok=True)
    write(app / ".deepspeed_env", "".join(f"{k}={v}\n" for k, v in {**RANK_ENV, "HF_HUB_OFFLINE": "1"}.items()))
    stand_in = cluster.work / "vertex-bin"
    write(stand_in / "nvidia-smi", NVIDIA_SMI_STAND_IN, 0o755)
    for host in hosts:
        cluster.bind(host, gcs, "/gcs")
        cluster.bind(host, app, "/app")
    spec = vertex_job.customjob_spec(cfg, "image", BUCKET, "e2e@p.iam.gserviceaccount.com")
    container = spec["workerPoolSpecs"][0]["containerSpec"]
    fail_unless(all(p["containerSpec"] == container for p in spec["workerPoolSpecs"]), "the pools run different things")
    fail_unless(container["command"] == [vertex_job.VERTEX_ENTRYPOINT], f"unexpected command {container['command']}")
    entry = str(IMAGE_DIR / "vertex_start.sh")  # the image installs it at containerSpec.command[0]
    command = "cd /app && exec " + " ".join(shlex.quote(a) for a in [entry, *container["args"]])
    env = {**IMAGE_ENV, "PATH": f"{stand_in}:{IMAGE_ENV['PATH']}", **VERTEX_JOB_ENV,
           **vertex_aip_env(spec["baseOutputDirectory"]["outputUriPrefix"]),
           **{e["name"]: e["value"] for e in container["env"]}}
    return command, env


def _exported(output: str, ranks: int, gcs: Path) -> tuple[dict[str, Any], int]:
    """The run's outputs: packed for one epoch, the merged model and its marker in models/<run>, event files with
    tokens/s and MFU in AIP_TENSORBOARD_LOG_DIR. Returns (tokenized.json, the epoch's steps)."""
    run_dir = f"/gcs/{BUCKET}"
    model_dir = outside(f"{run_dir}/models/{VERTEX_RUN}", "/gcs", gcs)
    (tokenized,) = outside(f"{run_dir}/checkpoints/{VERTEX_RUN}/tokenized", "/gcs", gcs).glob("*/tokenized.json")
    packed = json.loads(tokenized.read_text())
    steps = packed_steps(packed)
    fail_unless("packed: the documents end to end" in output, "the log does not say the documents were packed")
    marker = json.loads((model_dir / ".complete").read_text())
    fail_unless(marker.get("step") == steps and marker.get("world_size") == ranks
                and marker.get("export") == "merged", f"marker {marker}: expected one epoch ({steps} steps) "
                f"on {ranks} ranks, LoRA merged")
    missing = [n for n in ("model.safetensors", "config.json", "tokenizer.json") if not (model_dir / n).is_file()]
    fail_unless(not missing, f"models/{VERTEX_RUN} lacks {missing}")
    events_dir = outside(f"{run_dir}/vertex/logs", "/gcs", gcs)
    events = sorted(events_dir.rglob("events.out.tfevents.*"))
    fail_unless(bool(events) and events[-1].stat().st_size > 0, "no TensorBoard event files in AIP_TENSORBOARD_LOG_DIR")
    # The progress inputs the CustomJob gives every replica (peak, FLOPs, price): tokens/s and MFU in the events.
    tags = set(json.loads(_venv_python("-c", EVENT_TAGS_SCRIPT, str(events_dir)).strip().splitlines()[-1]))
    fail_unless(not event_problems(tags), f"{'; '.join(event_problems(tags))} (AIP_TENSORBOARD_LOG_DIR)")
    return packed, steps


def _vertex_config(spec: dict[str, Any], workers: int) -> Any:
    """The vertex stack's Vertex AI block, loaded by the stack's code, with the e2e's keys and workers."""
    import yaml

    from checks import load
    from preview.engine import engine_config_from_yaml, stack_file

    with open(stack_file("vertex"), encoding="utf-8") as handle:
        config = copy.deepcopy(yaml.safe_load(handle)["config"])
    config["deepspeed-stack:vertex"] |= {"workers": workers, **spec}
    engine_config, secret_keys = engine_config_from_yaml(config)
    return load(engine_config, set(secret_keys)).vertex
