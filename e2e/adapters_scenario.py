"""The `adapters` scenario of `make e2e` (e2e/run.py): two LoRA runs of the `finetune` kind at once (two workloads of
the dev stack on one base, each its own answer in chat records, one worker each) export adapter-only folders (each
under 5 % of the model's bytes, markers saying chat rendering); one vLLM CPU server, with the stack's base and LoRA
flags and the evaluation's client middleware, lists the base, both adapters and a bucket folder's adapter trained
outside the stack's workloads (the vertex scenario's export, which runs before this one on the same cluster); each
adapter's greedy tokens are transformers + peft's, and another host's load and unload get 403. serving.evaluation's
evaluator (one pass of recipes/evaluator.py, which runs evaluate.py: lm-eval on 20 held-out conversations, chat
rendering) scores base vs tuned by log-likelihood per reference token and exact match, equal to transformers +
peft's, and serves the export from its versioned copy through the gate; a second pass scores nothing; a next export
trained on the wrong answers gets its own scores, is kept out, and the first stays served.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hosts as nshosts
from adapters_common import (
    ADAPTER_ANSWERS,
    ADAPTER_INPUTS,
    ADAPTER_STEPS,
    EVAL_MAX_TOKENS,
    EVALUATE,
    EVALUATOR,
    FOLDER_ADAPTER,
    FOLDER_STEPS,
    GATE,
    GATED,
    LIKELIHOOD_TOLERANCE,
    LORA_LLM,
    REPLICA_STAND_IN,
    TASK_RECORDS,
    _exported_adapter,
    adapter_assets,
    adapter_prompt,
    adapters_stack,
)
from adapters_probes import (
    ask,
    load_decided,
    run_evaluation,
    score_problems,
    served_chat_and_metrics,
    served_models,
    served_roots,
    status_of,
    unload,
)
from finetune_common import FINETUNE_HELD_OUT, FINETUNE_MAX_TOKENS, Phases, _venv_popen, outside
from harness import (
    IMAGE_ENV,
    LAUNCH_TIMEOUT,
    MPI_HOSTFILE,
    RANK_ENV,
    VENV,
    WORKERS,
    _chown_dirs,
    fail_unless,
    mpijob_hostfile,
    start_mpijob,
    write,
)
from recovery_scenario import wait_process
from serving_common import VLLM_PORT, vllm_env, wait_for_vllm
from vertex_scenario import vertex_export


@dataclass
class Run:
    """What the scenario's steps share: the hosts, the two-workload stack, the bucket, the server and its figures."""

    cluster: nshosts.Cluster
    logs: Path
    m: Any
    bucket: Path
    base: Path
    phases: Phases = field(default_factory=lambda: Phases("adapters"))
    found: dict[str, Any] = field(default_factory=dict)  # what a step found that the summary and later steps read

    @property
    def launcher(self) -> nshosts.Host:
        return self.cluster.hosts[0]

    @property
    def trainers(self) -> list[Any]:
        return [self.m.workloads[n] for n in ADAPTER_ANSWERS]

    @property
    def mount(self) -> str:
        return str(self.m.workloads["serve"].gcs_fuse.mount_path)

    def outside(self, path: str) -> Path:
        return outside(path, self.mount, self.bucket)


def scenario_adapters(cluster: nshosts.Cluster, logs: Path) -> str:
    run = _inputs(cluster, logs)
    references = _train(run)
    _serve(run, references)
    _served_checks(run)
    _first_evaluation(run)
    _wrong_export(run)
    f = run.found
    scores, second, served = f["first"]["scores"], f["second"], f["served"]
    return (f"two LoRA runs exported adapters ({', '.join(f['sizes'])} of the model's bytes) on vertex's merged "
            f"export; one vLLM served {', '.join(f['wanted'])} ({FOLDER_ADAPTER['name']}: trained with PEFT alone, "
            f"from the bucket folder {FOLDER_ADAPTER['path']}); the base's chat reply to a held-out conversation "
            f"{f['chat']!r}, transformers' tokens after the same template; /metrics has the autoscaler's gauges; "
            f"{', '.join(f'{k} answered {v!r}' for k, v in f['replies'].items())}, "
            f"transformers + peft's tokens; lm-eval on {TASK_RECORDS} held-out conversations (chat rendering), "
            f"log-likelihood per reference token: base {scores['base']:.3f} vs tuned {scores['candidate']:.3f} "
            f"(transformers' figures), served from {Path(served['path']).name}; a next export trained on the wrong "
            f"answers scored {second['scores']['candidate']:.3f} against the served {second['scores']['served']:.3f} "
            f"and was kept out: {second['reason']}; a second replica's loader serves the same version. Phases: "
            f"{run.phases.summary()}")


def _inputs(cluster: nshosts.Cluster, logs: Path) -> Run:
    """The base: the vertex scenario's export (LoRA merged into the tiny Llama: a whole model), uploaded with the
    two data sets and the task to the bucket every host mounts."""
    phases = Phases("adapters")
    m = adapters_stack()
    bucket = cluster.work / "bucket-adapters"
    merged = vertex_export(cluster)
    fail_unless((merged / "model.safetensors").is_file(), f"no model at {merged}: the adapters' base is the vertex "
                "scenario's merged export, which runs first on this cluster")
    adapter_assets(bucket, merged)
    run = Run(cluster, logs, m, bucket, bucket / ADAPTER_INPUTS / "base", phases=phases)
    for host in cluster.hosts:
        cluster.bind(host, bucket, run.mount)
    run.phases.end("vertex's merged export, two data sets and the task")
    return run


def _train(run: Run) -> subprocess.Popen[bytes]:
    """1. Two LoRA runs at once, the stack's finetune MPIJobs of one worker each (ZeRO-3 on its host: the two cores
    train both in the time of one), each exporting its adapter alone. The jobs' ConfigMaps are the same files
    (finetune.py, ds_config.json); each launcher has its own hostfile (its worker) and environment (MODEL_DIR).
    Meanwhile one process (lora_llm.py plan, returned): the folder's adapter trained with PEFT alone, then the
    references."""
    from workloads import finetune
    from workloads.mpijob import nvidia
    from workloads.mpijob.shape import SSH_CLIENT_KEY
    from workloads.placement import placement

    cluster, logs, trainers = run.cluster, run.logs, run.trainers
    wheres = [placement(run.m, w) for w in trainers]
    jobs = [finetune.launch(w, has_token=False) for w in trainers]
    files = [{k: v for k, v in nvidia.config_map_data(w, where, False, job).items() if k != SSH_CLIENT_KEY}
             for w, where, job in zip(trainers, wheres, jobs, strict=True)]
    fail_unless(all(f == files[0] for f in files), "the two jobs' ConfigMaps differ: they cannot share the hosts")
    start_mpijob(cluster, logs, (trainers[0], wheres[0]), {"HF_HUB_OFFLINE": "1"}, jobs[0])
    references = _start_references(run.bucket, run.base, [run.outside(w.model_dir) for w in trainers], logs)
    runs = []
    for i, (w, where, job) in enumerate(zip(trainers, wheres, jobs, strict=True)):
        script = nvidia.launcher_script(None, job)
        fail_unless("--lora-export adapter" in script, "the MPIJob does not pass --lora-export adapter")
        hostfile = f"{MPI_HOSTFILE}-{w.name}"
        write(run.launcher.path(hostfile), mpijob_hostfile(WORKERS, where.per_worker).splitlines()[i] + "\n",
              owner=0)
        env = {**nvidia.plain_env(w, where, job), "OMPI_MCA_orte_default_hostfile": hostfile}
        log = logs / f"adapters-train-{w.name}.log"
        runs.append((w, cluster.spawn(run.launcher, ["/bin/bash", "-c", script], log=log,
                                      env={**IMAGE_ENV, **RANK_ENV, **env}), log))
    for w, process, log in runs:
        status, _output = wait_process(cluster, process, log, f"{w.name}'s run")
        fail_unless(status == 0, f"{w.name}: exit {status} (log {log})")
    cluster.stop_services()
    run.found["sizes"] = [_exported_adapter(run.outside(w.model_dir), run.base, w.name) for w in trainers]
    trained = _plan_line(references, "trained")
    fail_unless(trained["losses"][-1] < trained["losses"][0], f"the folder's adapter did not learn: {trained}")
    _chown_dirs(run.bucket / FOLDER_ADAPTER["path"])  # PEFT wrote it as root, 0600: the pods' user reads it
    run.phases.end("two LoRA runs at once, adapters exported; the folder's adapter trained with PEFT meanwhile")
    return references


def _serve(run: Run, references: subprocess.Popen[bytes]) -> None:
    """2. One vLLM server: the stack's base and LoRA flags (serving.fromWorkload yes, serving.adapters [no]), with
    runtime adapter loading for the evaluation; CPU flags as the finetune scenario's. References meanwhile."""
    from workloads.serving_command import CLIENT_ENDPOINTS_MIDDLEWARE, lora_args
    from workloads.serving_source import model_source

    source = model_source(run.m, run.m.workloads["serve"])
    # With evaluation's middleware (recipes/client_endpoints.py on PYTHONPATH, as the pod has it): the
    # runtime adapter endpoints answer this host's loopback (the evaluator) and no other host.
    args = ["--model", source.ref, "--served-model-name", source.served_name, *lora_args(source),
            "--dtype", "float32", "--max-model-len", "256", "--enforce-eager", "--distributed-executor-backend", "uni",
            "--host", "0.0.0.0", "--port", str(VLLM_PORT), "--middleware", CLIENT_ENDPOINTS_MIDDLEWARE]
    server_log = run.logs / "adapters-vllm.log"
    server = run.cluster.spawn(run.launcher, [str(VENV / "bin" / "python"), "-m",
                                              "vllm.entrypoints.openai.api_server", *args], log=server_log,
                               env={**IMAGE_ENV, **vllm_env(), "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true",
                                    "PYTHONPATH": str(EVALUATE.parent)})
    reference = _plan_line(references, "score")
    gated = run.m.workloads[GATED]
    run.found.update(source=source, server_log=server_log, refs=reference["generate"], chat_ref=reference["chat"],
                     expected={"base": reference["score"]["base"], "candidate": reference["score"][gated.name],
                               "wrong": reference["score"][ADAPTER_ANSWERS["no"]]})
    wait_for_vllm(run.cluster, run.launcher, server, server_log)
    run.phases.end("vLLM healthy (transformers + peft references meanwhile)")


def _served_checks(run: Run) -> None:
    """3. The base and both adapters listed; each adapter's greedy tokens are transformers + peft's; another host
    may not load or unload an adapter; the base's chat reply and /metrics."""
    cluster, launcher, f = run.cluster, run.launcher, run.found
    source, server_log = f["source"], f["server_log"]
    listed = served_models(cluster, launcher)
    named = [*(w.name for w in run.trainers), FOLDER_ADAPTER["name"]]
    wanted = [source.served_name, *named]
    fail_unless(sorted(listed) == sorted(wanted), f"/v1/models lists {listed}, expected {wanted}")
    f["replies"] = {name: ask(cluster, launcher, name, f["refs"][name], server_log) for name in named}
    # A client (another host) is served, but may not unload or load an adapter: 403, and both stay listed.
    client = cluster.hosts[1]
    refused = {path: status_of(cluster, client, f"http://{launcher.ip}:{VLLM_PORT}{path}", body)
               for path, body in (("/v1/unload_lora_adapter", {"lora_name": GATED}),
                                  ("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(run.base)}),
                                  ("/v1/models", None))}
    fail_unless(refused == {"/v1/unload_lora_adapter": 403, "/v1/load_lora_adapter": 403, "/v1/models": 200},
                f"a client's requests answered {refused}, expected 403 for the adapter endpoints")
    fail_unless(sorted(served_models(cluster, launcher)) == sorted(wanted), "a client changed what is served")
    f["chat"] = served_chat_and_metrics(cluster, launcher, source.served_name, f["chat_ref"], server_log)
    f["wanted"] = wanted
    run.phases.end("/v1/models, each adapter's tokens, the base's chat reply and /metrics; a client's load and "
                   "unload refused")


def _first_evaluation(run: Run) -> None:
    """4. The evaluation of `yes`'s export by serving.evaluation's evaluator (one pass, --once, a gate), which runs
    evaluate.py: the marker says chat, so the 20 held-out conversations are rendered through the template and the
    gate reads the likelihood metric; lm-eval's scores are transformers + peft's (log-likelihood per reference
    token, exact match), the tuning shows, and the export is served from its own versioned copy. A second pass
    scores nothing: results.json names the export it scored (its marker)."""
    cluster, launcher, logs, f, mount = run.cluster, run.launcher, run.logs, run.found, run.mount
    gated = run.m.workloads[GATED]
    f["evals"] = evals = f"{mount}/evals/{gated.name}"
    f["results"] = results = run.outside(f"{evals}/results.json")
    f["one_pass"] = one_pass = [
        "--url", f"http://127.0.0.1:{VLLM_PORT}", "--base", f["source"].served_name,
        "--task", f"{mount}/{ADAPTER_INPUTS}/task.jsonl", "--evals", f"{mount}/evals",
        "--max-tokens", str(EVAL_MAX_TOKENS), "--max-length", "256", "--min-improvement", str(GATE),
        "--adapter", f"{gated.name}={gated.model_dir}", "--once"]
    # With serving.evaluation the server starts without the adapter (no --lora-modules: the evaluator loads it once
    # it passes); the server here started with it for step 3, so it is unloaded first, as the pod would start.
    unload(cluster, launcher, gated.name)
    fail_unless(gated.name not in served_models(cluster, launcher), f"{gated.name} is still listed after its unload")
    # A second replica (serving.replicas 2: the evaluator then decides for both) on another host: a stand-in of
    # vLLM's adapter endpoints (e2e/replica_stand_in.py; a second vLLM would cost 45 s), with the loader each replica
    # runs beside vLLM. Nothing decided yet: it serves no adapter, and is ready.
    f["replica"], f["loader_log"] = replica, loader_log = cluster.hosts[2], logs / "adapters-loader.log"
    stand_in = cluster.spawn(replica, ["/usr/bin/python3", str(REPLICA_STAND_IN), str(VLLM_PORT),
                                       f["source"].served_name], log=logs / "adapters-replica.log", env=IMAGE_ENV)
    wait_for_vllm(cluster, replica, stand_in, logs / "adapters-replica.log")
    load_decided(cluster, replica, f"{mount}/evals", gated.name, loader_log)
    fail_unless(served_roots(cluster, replica) == {}, f"the second replica serves {served_roots(cluster, replica)} "
                "before any decision")
    run_evaluation(cluster, launcher, logs, "export", one_pass, script=EVALUATOR)
    again = run_evaluation(cluster, launcher, logs, "again", one_pass, script=EVALUATOR, scored=False)
    fail_unless("evaluating" not in again["output"], f"the evaluator scored the same export twice: {again}")
    f["first"] = first = json.loads(results.read_text())
    scores = first["scores"]
    fail_unless(first["records"] == TASK_RECORDS and first["served"] is True and first["metric"] == "loglikelihood"
                and first["rendering"] == "chat", f"results.json {first}: expected {TASK_RECORDS} records, "
                "loglikelihood, chat rendering, served")
    problems = score_problems(first, f["expected"], "candidate")
    fail_unless(not problems, "; ".join(problems))
    fail_unless(scores["candidate"] > scores["base"] + GATE, f"the tuned adapter does not beat the base: {scores}")
    f["served"] = served = json.loads(run.outside(f"{evals}/served.json").read_text())
    fail_unless(served["path"] == first["candidateCopy"] == first["servedPath"]
                and f"{gated.name}-{ADAPTER_STEPS}-" in served["path"], f"served.json {served}, results {first}")
    fail_unless(served_models(cluster, launcher).count(gated.name) == 1, "the served adapter is not listed once")
    _replicas_serve(run, "the replicas serve")  # both replicas' loaders: each serves the version served.json names


def _replicas_serve(run: Run, what: str) -> None:
    """One pass of the loader on both replicas; then both serve the version served.json named at step 4."""
    gated, f = run.m.workloads[GATED], run.found
    hosts = (run.launcher, f["replica"])
    for host in hosts:
        load_decided(run.cluster, host, f"{run.mount}/evals", gated.name, f["loader_log"])
    roots = {host.name: served_roots(run.cluster, host).get(gated.name) for host in hosts}
    fail_unless(set(roots.values()) == {f["served"]["path"]}, f"{what} {roots}, served.json {f['served']['path']}")


def _wrong_export(run: Run) -> None:
    """5. A next export of `yes` trained on the wrong answers (`no`'s adapter, written into yes's MODEL_DIR with its
    own marker, as a later run writes it): scored from its own versioned path with its own scores (the
    transformers figures of `no`'s weights, not the first export's), it does not beat the adapter served now and
    is kept out; its copy is removed, served.json still names the first, and `yes` answers as before."""
    cluster, launcher, f = run.cluster, run.launcher, run.found
    gated, first, served = run.m.workloads[GATED], f["first"], f["served"]
    model_dir = run.outside(gated.model_dir)
    wrong = run.outside(run.m.workloads["no"].model_dir)
    marker = {**json.loads((wrong / ".complete").read_text()), "finished": "2030-01-01T00:00:00+00:00"}
    (model_dir / ".complete").unlink()
    for item in wrong.iterdir():
        if item.is_file() and item.name != ".complete":
            shutil.copy2(item, model_dir / item.name)
    write(model_dir / ".complete", json.dumps(marker) + "\n")
    gate = run_evaluation(cluster, launcher, run.logs, "gate", f["one_pass"], script=EVALUATOR)
    f["second"] = second = json.loads(f["results"].read_text())
    fail_unless(second["served"] is False and "not served" in second["reason"] and "not served" in gate["output"]
                and second["reference"] == "served", f"the wrong export was served: {second}")
    problems = score_problems(second, f["expected"], "wrong")
    fail_unless(not problems, "; ".join(problems))
    fail_unless(second["candidateCopy"] != first["candidateCopy"] and abs(
        second["scores"]["served"] - first["scores"]["candidate"]) < LIKELIHOOD_TOLERANCE,
        f"the second export's copy or the served adapter's score: {second} (first {first})")
    versions = run.outside(f"{f['evals']}/versions")
    fail_unless(json.loads(run.outside(f"{f['evals']}/served.json").read_text())["path"] == served["path"]
                and [p.name for p in versions.iterdir()] == [Path(served["path"]).name],
                f"served.json or versions/ changed: {sorted(p.name for p in versions.iterdir())}")
    fail_unless(gated.name in served_models(cluster, launcher), f"{gated.name} is no longer served")
    ask(cluster, launcher, gated.name, f["refs"][gated.name], f["server_log"])
    # The kept-out export changed no decision: both replicas stay as they are.
    _replicas_serve(run, "after the kept-out export the replicas serve")
    run.phases.end("evaluation and the gate")


def _start_references(bucket: Path, base: Path, exports: list[Path], logs: Path) -> subprocess.Popen[bytes]:
    """lora_llm.py plan in the background (its lines in a log): the bucket folder's adapter, then every reference."""
    spec = {"base": str(base), "chat": {"messages": FINETUNE_HELD_OUT, "tokens": FINETUNE_MAX_TOKENS},
            "folder": {"name": FOLDER_ADAPTER["name"], "out": str(bucket / FOLDER_ADAPTER["path"]),
                       "data": str(bucket / ADAPTER_INPUTS / f"{GATED}.jsonl"), "steps": FOLDER_STEPS,
                       "rank": FOLDER_ADAPTER["rank"]},
            "prompt": adapter_prompt(("two", "three")), "tokens": FINETUNE_MAX_TOKENS,
            "task": str(bucket / ADAPTER_INPUTS / "task.jsonl"), "task_tokens": EVAL_MAX_TOKENS,
            "adapters": {path.name: str(path) for path in exports}}
    write(logs / "adapters-references.json", json.dumps(spec))
    return _venv_popen([str(LORA_LLM), "plan", str(logs / "adapters-references.json")],
                       logs / "adapters-references.log")


def _plan_line(process: subprocess.Popen[bytes], key: str) -> dict[str, Any]:
    """The first JSON line of lora_llm.py plan's log holding `key`, waiting for it while the process runs."""
    log = Path(str(process.args[-1])).with_suffix(".log")
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    while True:
        for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
            if line.startswith("{") and f'"{key}"' in line:
                return dict(json.loads(line))
        fail_unless(process.poll() is None, f"lora_llm.py plan exited {process.returncode} (log {log})")
        fail_unless(time.monotonic() < deadline, f"lora_llm.py plan: no {key} within {LAUNCH_TIMEOUT:.0f} s")
        time.sleep(0.2)
