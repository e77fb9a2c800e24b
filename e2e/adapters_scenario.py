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
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import hosts as nshosts
from adapters_common import (
    ADAPTER_ANSWERS,
    ADAPTER_INPUTS,
    ADAPTER_LOADER,
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
from finetune_common import FINETUNE_HELD_OUT, FINETUNE_MAX_TOKENS, SEND_PROMPT, Phases, _venv_popen, outside
from harness import (
    IMAGE_ENV,
    LAUNCH_TIMEOUT,
    MPI_HOSTFILE,
    RANK_ENV,
    VENV,
    WORKERS,
    _chown_dirs,
    fail_unless,
    launch,
    mpijob_hostfile,
    start_mpijob,
    write,
)
from recovery_scenario import wait_process
from serving_common import VLLM_PORT, chat_problems, completion_problems, metrics_problems, vllm_env, wait_for_vllm
from vertex_scenario import vertex_export


def _models(cluster: nshosts.Cluster, host: nshosts.Host) -> list[str]:
    probe = (f"import json, urllib.request as u; print(json.dumps([m['id'] for m in json.load(u.urlopen("
             f"'http://127.0.0.1:{VLLM_PORT}/v1/models', timeout=10))['data']]))")
    result = cluster.run(host, ["/usr/bin/python3", "-c", probe], env=IMAGE_ENV, timeout=30)
    fail_unless(result.returncode == 0, f"/v1/models: {result.stderr.strip()[-500:]}")
    return list(json.loads(result.stdout))


def _status(cluster: nshosts.Cluster, host: nshosts.Host, url: str, body: dict[str, Any] | None) -> int:
    """The HTTP status `host` gets for a GET (no body) or a JSON POST to `url`."""
    probe = ("import json, sys, urllib.error, urllib.request as u\n"
             f"body = {json.dumps(body)!r}\n"
             "data = None if body == 'null' else body.encode()\n"
             f"request = u.Request({url!r}, data=data, headers={{'Content-Type': 'application/json'}})\n"
             "try:\n    print(u.urlopen(request, timeout=30).status)\n"
             "except urllib.error.HTTPError as error:\n    print(error.code)\n")
    result = cluster.run(host, ["/usr/bin/python3", "-c", probe], env=IMAGE_ENV, timeout=60)
    fail_unless(result.returncode == 0, f"{url} from {host.name}: {result.stderr.strip()[-500:]}")
    return int(result.stdout.strip())


def _roots(cluster: nshosts.Cluster, host: nshosts.Host) -> dict[str, str]:
    """Each adapter a server on `host` serves, with the path it was loaded from (/v1/models' `root`)."""
    probe = (f"import json, urllib.request as u; print(json.dumps({{m['id']: m['root'] for m in json.load(u.urlopen("
             f"'http://127.0.0.1:{VLLM_PORT}/v1/models', timeout=10))['data'] if m.get('parent')}}))")
    result = cluster.run(host, ["/usr/bin/python3", "-c", probe], env=IMAGE_ENV, timeout=30)
    fail_unless(result.returncode == 0, f"/v1/models on {host.name}: {result.stderr.strip()[-500:]}")
    return dict(json.loads(result.stdout))


def _load_decided(cluster: nshosts.Cluster, host: nshosts.Host, evals: str, name: str, log: Path) -> None:
    """One pass of the fleet's adapter loader (what each replica runs beside vLLM) against the server on `host`:
    exit 0 once every decision is served."""
    result = cluster.run(host, ["/usr/bin/python3", str(ADAPTER_LOADER), "--url", f"http://127.0.0.1:{VLLM_PORT}",
                                "--evals", evals, "--adapter", name, "--once"], env=IMAGE_ENV, timeout=60)
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"--- {host.name}: exit {result.returncode}\n{result.stdout}{result.stderr}")
    fail_unless(result.returncode == 0, f"adapter_loader.py on {host.name}: exit {result.returncode} (log {log})")


def _unload(cluster: nshosts.Cluster, host: nshosts.Host, name: str) -> None:
    """vLLM's /v1/unload_lora_adapter, from inside the pod (127.0.0.1: the evaluator's side)."""
    probe = (f"import json, urllib.request as u; u.urlopen(u.Request('http://127.0.0.1:{VLLM_PORT}/v1/unload_lora_"
             f"adapter', data=json.dumps({{'lora_name': {name!r}}}).encode(), headers={{'Content-Type': "
             "'application/json'}), timeout=30).read()")
    result = cluster.run(host, ["/usr/bin/python3", "-c", probe], env=IMAGE_ENV, timeout=60)
    fail_unless(result.returncode == 0, f"unload {name}: {result.stderr.strip()[-500:]}")


def _ask(cluster: nshosts.Cluster, host: nshosts.Host, model: str, reference: dict[str, Any], log: Path) -> str:
    """One greedy completion from `model` through the OpenAI API: transformers + peft's tokens."""
    asked = cluster.run(host, ["/usr/bin/python3", str(SEND_PROMPT), "--openai", "--url",
                               f"http://127.0.0.1:{VLLM_PORT}", "--model", model, "--temperature", "0",
                               "--ignore-eos", "--token-ids", "--json", "--max-new-tokens",
                               str(FINETUNE_MAX_TOKENS), adapter_prompt(("two", "three"))], env=IMAGE_ENV,
                        timeout=60)
    fail_unless(asked.returncode == 0, f"send_prompt.py --model {model}: {asked.stderr.strip()[-800:]}; log {log}")
    answer = json.loads(asked.stdout)
    problems = completion_problems(answer, reference, FINETUNE_MAX_TOKENS)
    fail_unless(not problems, f"{model}: " + "; ".join(problems))
    return str(answer["choices"][0].get("text", ""))


def _evaluate(cluster: nshosts.Cluster, host: nshosts.Host, logs: Path, name: str, args: list[str],
              script: Path = EVALUATE, scored: bool = True) -> dict[str, Any]:
    """recipes/evaluate.py (or evaluator.py, which runs it) on the server's host, as the image's user,
    against the running server; `scored`: its base vs tuned line is printed."""
    log = logs / f"adapters-evaluate-{name}.log"
    status, output = launch(cluster, host, " ".join(shlex.quote(a) for a in [str(VENV / "bin" / "python"),
                                                                           str(script), *args]), log,
                            env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}, timeout=LAUNCH_TIMEOUT)
    fail_unless(status == 0, f"{script.name}: exit {status} (log {log})")
    line = [t for t in output.splitlines() if t.startswith("[evaluate] ") and " vs tuned " in t]
    fail_unless(bool(line) == scored, f"{script.name} printed {len(line)} base vs tuned line(s) (log {log})")
    if line:
        print(f"[e2e] adapters: {line[-1]}", flush=True)
    return {"output": output}


def scenario_adapters(cluster: nshosts.Cluster, logs: Path) -> str:
    from workloads import finetune
    from workloads.mpijob import nvidia
    from workloads.mpijob.shape import SSH_CLIENT_KEY
    from workloads.placement import placement
    from workloads.serving_command import CLIENT_ENDPOINTS_MIDDLEWARE, lora_args
    from workloads.serving_source import model_source

    phases = Phases("adapters")
    launcher = cluster.hosts[0]
    m = adapters_stack()
    server_w = m.workloads["serve"]
    trainers = [m.workloads[n] for n in ADAPTER_ANSWERS]
    mount = server_w.gcs_fuse.mount_path
    bucket = cluster.work / "bucket-adapters"
    # The base: the vertex scenario's export (LoRA merged into the tiny Llama: a whole model), uploaded.
    merged = vertex_export(cluster)
    fail_unless((merged / "model.safetensors").is_file(), f"no model at {merged}: the adapters' base is the vertex "
                "scenario's merged export, which runs first on this cluster")
    adapter_assets(bucket, merged)
    for host in cluster.hosts:
        cluster.bind(host, bucket, mount)
    base = bucket / ADAPTER_INPUTS / "base"
    phases.end("vertex's merged export, two data sets and the task")

    # 1. Two LoRA runs at once, the stack's finetune MPIJobs of one worker each (ZeRO-3 on its host: the two cores
    #    train both in the time of one), each exporting its adapter alone. The jobs' ConfigMaps are the same files
    #    (finetune.py, ds_config.json); each launcher has its own hostfile (its worker) and environment (MODEL_DIR).
    rank_env = {"HF_HUB_OFFLINE": "1"}
    wheres = [placement(m, w) for w in trainers]
    jobs = [finetune.launch(w, has_token=False) for w in trainers]
    files = [{k: v for k, v in nvidia.config_map_data(w, where, False, job).items() if k != SSH_CLIENT_KEY}
             for w, where, job in zip(trainers, wheres, jobs, strict=True)]
    fail_unless(all(f == files[0] for f in files), "the two jobs' ConfigMaps differ: they cannot share the hosts")
    start_mpijob(cluster, logs, (trainers[0], wheres[0]), rank_env, jobs[0])
    # Meanwhile one process (lora_llm.py plan): the folder's adapter trained with PEFT alone, then the references.
    references = _start_references(bucket, base, [outside(w.model_dir, mount, bucket) for w in trainers], logs)
    runs = []
    for i, (w, where, job) in enumerate(zip(trainers, wheres, jobs, strict=True)):
        script = nvidia.launcher_script(None, job)
        fail_unless("--lora-export adapter" in script, "the MPIJob does not pass --lora-export adapter")
        hostfile = f"{MPI_HOSTFILE}-{w.name}"
        write(launcher.path(hostfile), mpijob_hostfile(WORKERS, where.per_worker).splitlines()[i] + "\n", owner=0)
        env = {**nvidia.plain_env(w, where, job), "OMPI_MCA_orte_default_hostfile": hostfile}
        log = logs / f"adapters-train-{w.name}.log"
        runs.append((w, cluster.spawn(launcher, ["/bin/bash", "-c", script], log=log,
                                      env={**IMAGE_ENV, **RANK_ENV, **env}), log))
    for w, process, log in runs:
        status, _output = wait_process(cluster, process, log, f"{w.name}'s run")
        fail_unless(status == 0, f"{w.name}: exit {status} (log {log})")
    cluster.stop_services()
    sizes = [_exported_adapter(outside(w.model_dir, mount, bucket), base, w.name) for w in trainers]
    trained = _plan_line(references, "trained")
    fail_unless(trained["losses"][-1] < trained["losses"][0], f"the folder's adapter did not learn: {trained}")
    _chown_dirs(bucket / FOLDER_ADAPTER["path"])  # PEFT wrote it as root, 0600: the pods' user reads it
    phases.end("two LoRA runs at once, adapters exported; the folder's adapter trained with PEFT meanwhile")

    # 2. One vLLM server: the stack's base and LoRA flags (serving.fromWorkload yes, serving.adapters [no]), with
    #    runtime adapter loading for the evaluation; CPU flags as the finetune scenario's. References meanwhile.
    source = model_source(m, server_w)
    # With evaluation's middleware (recipes/client_endpoints.py on PYTHONPATH, as the pod has it): the
    # runtime adapter endpoints answer this host's loopback (the evaluator) and no other host.
    args = ["--model", source.ref, "--served-model-name", source.served_name, *lora_args(source),
            "--dtype", "float32", "--max-model-len", "256", "--enforce-eager", "--distributed-executor-backend", "uni",
            "--host", "0.0.0.0", "--port", str(VLLM_PORT), "--middleware", CLIENT_ENDPOINTS_MIDDLEWARE]
    server_log = logs / "adapters-vllm.log"
    server = cluster.spawn(launcher, [str(VENV / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
                                      *args], log=server_log,
                           env={**IMAGE_ENV, **vllm_env(), "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true",
                                "PYTHONPATH": str(EVALUATE.parent)})
    reference = _plan_line(references, "score")
    refs = reference["generate"]
    gated = m.workloads[GATED]
    expected = {"base": reference["score"]["base"], "candidate": reference["score"][gated.name],
                "wrong": reference["score"][ADAPTER_ANSWERS["no"]]}
    wait_for_vllm(cluster, launcher, server, server_log)
    phases.end("vLLM healthy (transformers + peft references meanwhile)")

    # 3. The base and both adapters listed; each adapter's greedy tokens are transformers + peft's.
    listed = _models(cluster, launcher)
    named = [*(w.name for w in trainers), FOLDER_ADAPTER["name"]]
    wanted = [source.served_name, *named]
    fail_unless(sorted(listed) == sorted(wanted), f"/v1/models lists {listed}, expected {wanted}")
    replies = {name: _ask(cluster, launcher, name, refs[name], server_log) for name in named}
    # A client (another host) is served, but may not unload or load an adapter: 403, and both stay listed.
    client = cluster.hosts[1]
    refused = {path: _status(cluster, client, f"http://{launcher.ip}:{VLLM_PORT}{path}", body)
               for path, body in (("/v1/unload_lora_adapter", {"lora_name": GATED}),
                                  ("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(base)}),
                                  ("/v1/models", None))}
    fail_unless(refused == {"/v1/unload_lora_adapter": 403, "/v1/load_lora_adapter": 403, "/v1/models": 200},
                f"a client's requests answered {refused}, expected 403 for the adapter endpoints")
    fail_unless(sorted(_models(cluster, launcher)) == sorted(wanted), "a client changed what is served")
    chat = _served_chat_and_metrics(cluster, launcher, source.served_name, reference["chat"], server_log)
    phases.end("/v1/models, each adapter's tokens, the base's chat reply and /metrics; a client's load and unload "
               "refused")

    # 4. The evaluation of `yes`'s export by serving.evaluation's evaluator (one pass, --once, a gate), which runs
    #    evaluate.py: the marker says chat, so the 20 held-out conversations are rendered through the template and
    #    the gate reads the likelihood metric; lm-eval's scores are transformers + peft's (log-likelihood per
    #    reference token, exact match), the tuning shows, and the export is served from its own versioned copy.
    #    A second pass scores nothing: results.json names the export it scored (its marker).
    evals = f"{mount}/evals/{gated.name}"
    results = outside(f"{evals}/results.json", mount, bucket)
    task = f"{mount}/{ADAPTER_INPUTS}/task.jsonl"
    url = f"http://127.0.0.1:{VLLM_PORT}"
    one_pass = ["--url", url, "--base", source.served_name, "--task", task, "--evals", f"{mount}/evals",
                "--max-tokens", str(EVAL_MAX_TOKENS), "--max-length", "256", "--min-improvement", str(GATE),
                "--adapter", f"{gated.name}={gated.model_dir}", "--once"]
    # With serving.evaluation the server starts without the adapter (no --lora-modules: the evaluator loads it once
    # it passes); the server here started with it for step 3, so it is unloaded first, as the pod would start.
    _unload(cluster, launcher, gated.name)
    fail_unless(gated.name not in _models(cluster, launcher), f"{gated.name} is still listed after its unload")
    # A second replica (serving.replicas 2: the evaluator then decides for both) on another host: a stand-in of
    # vLLM's adapter endpoints (e2e/replica_stand_in.py; a second vLLM would cost 45 s), with the loader each replica
    # runs beside vLLM. Nothing decided yet: it serves no adapter, and is ready.
    replica, loader_log = cluster.hosts[2], logs / "adapters-loader.log"
    stand_in = cluster.spawn(replica, ["/usr/bin/python3", str(REPLICA_STAND_IN), str(VLLM_PORT),
                                       source.served_name], log=logs / "adapters-replica.log", env=IMAGE_ENV)
    wait_for_vllm(cluster, replica, stand_in, logs / "adapters-replica.log")
    _load_decided(cluster, replica, f"{mount}/evals", gated.name, loader_log)
    fail_unless(_roots(cluster, replica) == {}, f"the second replica serves {_roots(cluster, replica)} before any "
                "decision")
    _evaluate(cluster, launcher, logs, "export", one_pass, script=EVALUATOR)
    again = _evaluate(cluster, launcher, logs, "again", one_pass, script=EVALUATOR, scored=False)
    fail_unless("evaluating" not in again["output"], f"the evaluator scored the same export twice: {again}")
    first = json.loads(results.read_text())
    scores = first["scores"]
    fail_unless(first["records"] == TASK_RECORDS and first["served"] is True and first["metric"] == "loglikelihood"
                and first["rendering"] == "chat", f"results.json {first}: expected {TASK_RECORDS} records, "
                "loglikelihood, chat rendering, served")
    fail_unless(not score_problems(first, expected, "candidate"), "; ".join(score_problems(first, expected,
                                                                                           "candidate")))
    fail_unless(scores["candidate"] > scores["base"] + GATE, f"the tuned adapter does not beat the base: {scores}")
    served_file = outside(f"{evals}/served.json", mount, bucket)
    served = json.loads(served_file.read_text())
    fail_unless(served["path"] == first["candidateCopy"] == first["servedPath"]
                and f"{gated.name}-{ADAPTER_STEPS}-" in served["path"], f"served.json {served}, results {first}")
    fail_unless(_models(cluster, launcher).count(gated.name) == 1, "the served adapter is not listed once")
    # Both replicas' loaders: each serves the version served.json names.
    for host in (launcher, replica):
        _load_decided(cluster, host, f"{mount}/evals", gated.name, loader_log)
    roots = {host.name: _roots(cluster, host).get(gated.name) for host in (launcher, replica)}
    fail_unless(set(roots.values()) == {served["path"]}, f"the replicas serve {roots}, served.json {served['path']}")

    # 5. A next export of `yes` trained on the wrong answers (`no`'s adapter, written into yes's MODEL_DIR with its
    #    own marker, as a later run writes it): scored from its own versioned path with its own scores (the
    #    transformers figures of `no`'s weights, not the first export's), it does not beat the adapter served now
    #    and is kept out; its copy is removed, served.json still names the first, and `yes` answers as before.
    model_dir = outside(gated.model_dir, mount, bucket)
    wrong = outside(m.workloads["no"].model_dir, mount, bucket)
    marker = {**json.loads((wrong / ".complete").read_text()), "finished": "2030-01-01T00:00:00+00:00"}
    (model_dir / ".complete").unlink()
    for item in wrong.iterdir():
        if item.is_file() and item.name != ".complete":
            shutil.copy2(item, model_dir / item.name)
    write(model_dir / ".complete", json.dumps(marker) + "\n")
    gate = _evaluate(cluster, launcher, logs, "gate", one_pass, script=EVALUATOR)
    second = json.loads(results.read_text())
    fail_unless(second["served"] is False and "not served" in second["reason"] and "not served" in gate["output"]
                and second["reference"] == "served", f"the wrong export was served: {second}")
    fail_unless(not score_problems(second, expected, "wrong"), "; ".join(score_problems(second, expected, "wrong")))
    fail_unless(second["candidateCopy"] != first["candidateCopy"] and abs(
        second["scores"]["served"] - scores["candidate"]) < LIKELIHOOD_TOLERANCE,
        f"the second export's copy or the served adapter's score: {second} (first {first})")
    versions = outside(f"{evals}/versions", mount, bucket)
    fail_unless(json.loads(served_file.read_text())["path"] == served["path"]
                and [p.name for p in versions.iterdir()] == [Path(served["path"]).name],
                f"served.json or versions/ changed: {sorted(p.name for p in versions.iterdir())}")
    fail_unless(gated.name in _models(cluster, launcher), f"{gated.name} is no longer served")
    _ask(cluster, launcher, gated.name, refs[gated.name], server_log)
    for host in (launcher, replica):  # the kept-out export changed no decision: both replicas stay as they are
        _load_decided(cluster, host, f"{mount}/evals", gated.name, loader_log)
    roots = {host.name: _roots(cluster, host).get(gated.name) for host in (launcher, replica)}
    fail_unless(set(roots.values()) == {served["path"]}, f"after the kept-out export the replicas serve {roots}")
    phases.end("evaluation and the gate")
    return (f"two LoRA runs exported adapters ({', '.join(sizes)} of the model's bytes) on vertex's merged export; "
            f"one vLLM served {', '.join(wanted)} ({FOLDER_ADAPTER['name']}: trained with PEFT alone, from the "
            f"bucket folder {FOLDER_ADAPTER['path']}); the base's chat reply to a held-out conversation {chat!r}, "
            "transformers' tokens after the same template; /metrics has the autoscaler's gauges; "
            f"{', '.join(f'{k} answered {v!r}' for k, v in replies.items())}, "
            f"transformers + peft's tokens; lm-eval on {TASK_RECORDS} held-out conversations (chat rendering), "
            f"log-likelihood per reference token: base {scores['base']:.3f} vs tuned {scores['candidate']:.3f} "
            f"(transformers' figures), served from {Path(served['path']).name}; a next export trained on the wrong "
            f"answers scored {second['scores']['candidate']:.3f} against the served {second['scores']['served']:.3f} "
            f"and was kept out: {second['reason']}; a second replica's loader serves the same version. Phases: "
            f"{phases.summary()}")


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


def _served_chat_and_metrics(cluster: nshosts.Cluster, host: nshosts.Host, served: str, reference: dict[str, Any],
                             log: Path) -> str:
    """The served base (a merged export) asked a held-out conversation through /v1/chat/completions, greedy, all
    max_tokens generated: vLLM renders it through the served template into the same ids as transformers and answers
    with the same tokens; then /metrics on the API port, what Managed Prometheus scrapes: the queue and batch the
    autoscaler reads. Returns the reply's text."""
    asked = cluster.run(host, ["/usr/bin/python3", str(SEND_PROMPT), "--openai", "--chat", "--url",
                               f"http://127.0.0.1:{VLLM_PORT}", "--model", served, "--temperature", "0",
                               "--ignore-eos", "--token-ids", "--json", "--max-new-tokens",
                               str(FINETUNE_MAX_TOKENS), "--messages", json.dumps(FINETUNE_HELD_OUT)],
                        env=IMAGE_ENV, timeout=60)
    fail_unless(asked.returncode == 0, f"send_prompt.py --chat: {asked.stderr.strip()[-800:]}; vLLM log {log}")
    answer = json.loads(asked.stdout)
    problems = chat_problems(answer, reference, FINETUNE_MAX_TOKENS)
    scrape = ("import urllib.request as u; "
              f"print(u.urlopen('http://127.0.0.1:{VLLM_PORT}/metrics', timeout=5).read().decode())")
    scraped = cluster.run(host, ["/usr/bin/python3", "-c", scrape], env=IMAGE_ENV, timeout=30)
    fail_unless(scraped.returncode == 0, f"GET /metrics: {scraped.stderr.strip()[-800:]}; vLLM log {log}")
    problems += [f"vLLM's /metrics: {p}" for p in metrics_problems(scraped.stdout)]
    fail_unless(not problems, "; ".join(problems))
    return str((answer["choices"][0].get("message") or {}).get("content") or "")


def score_problems(results: dict[str, Any], expected: dict[str, Any], who: str) -> list[str]:
    """lm-eval's figures in results.json against transformers + peft's: the base's and the candidate's (`who`:
    the transformers figures of the weights the candidate has), both metrics."""
    problems = []
    for mine, theirs in (("base", "base"), ("candidate", who)):
        ll, em = results["byMetric"]["loglikelihood"][mine], results["byMetric"]["exact_match"][mine]
        want = expected[theirs]
        if abs(ll - want["loglikelihood"]) > LIKELIHOOD_TOLERANCE or abs(em - want["exact_match"]) > 1e-9:
            problems.append(f"{mine}: lm-eval's loglikelihood {ll}, exact_match {em} != transformers' "
                            f"{want['loglikelihood']}, {want['exact_match']}")
    return problems
