"""The `adapters` scenario's requests to the servers it runs (adapters_scenario.py): /v1/models, an HTTP status, each
adapter's root, the fleet's adapter loader, an unload, a greedy completion and a chat reply with /metrics, one run of
the evaluator, and lm-eval's figures against transformers + peft's."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import hosts as nshosts
from adapters_common import ADAPTER_LOADER, EVALUATE, LIKELIHOOD_TOLERANCE, adapter_prompt
from finetune_common import FINETUNE_HELD_OUT, FINETUNE_MAX_TOKENS, SEND_PROMPT
from harness import IMAGE_ENV, LAUNCH_TIMEOUT, VENV, fail_unless, launch
from serving_common import VLLM_PORT, chat_problems, completion_problems, metrics_problems


def served_models(cluster: nshosts.Cluster, host: nshosts.Host) -> list[str]:
    probe = (f"import json, urllib.request as u; print(json.dumps([m['id'] for m in json.load(u.urlopen("
             f"'http://127.0.0.1:{VLLM_PORT}/v1/models', timeout=10))['data']]))")
    result = cluster.run(host, ["/usr/bin/python3", "-c", probe], env=IMAGE_ENV, timeout=30)
    fail_unless(result.returncode == 0, f"/v1/models: {result.stderr.strip()[-500:]}")
    return list(json.loads(result.stdout))


def status_of(cluster: nshosts.Cluster, host: nshosts.Host, url: str, body: dict[str, Any] | None) -> int:
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


def served_roots(cluster: nshosts.Cluster, host: nshosts.Host) -> dict[str, str]:
    """Each adapter a server on `host` serves, with the path it was loaded from (/v1/models' `root`)."""
    probe = (f"import json, urllib.request as u; print(json.dumps({{m['id']: m['root'] for m in json.load(u.urlopen("
             f"'http://127.0.0.1:{VLLM_PORT}/v1/models', timeout=10))['data'] if m.get('parent')}}))")
    result = cluster.run(host, ["/usr/bin/python3", "-c", probe], env=IMAGE_ENV, timeout=30)
    fail_unless(result.returncode == 0, f"/v1/models on {host.name}: {result.stderr.strip()[-500:]}")
    return dict(json.loads(result.stdout))


def load_decided(cluster: nshosts.Cluster, host: nshosts.Host, evals: str, name: str, log: Path) -> None:
    """One pass of the fleet's adapter loader (what each replica runs beside vLLM) against the server on `host`:
    exit 0 once every decision is served."""
    result = cluster.run(host, ["/usr/bin/python3", str(ADAPTER_LOADER), "--url", f"http://127.0.0.1:{VLLM_PORT}",
                                "--evals", evals, "--adapter", name, "--once"], env=IMAGE_ENV, timeout=60)
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"--- {host.name}: exit {result.returncode}\n{result.stdout}{result.stderr}")
    fail_unless(result.returncode == 0, f"adapter_loader.py on {host.name}: exit {result.returncode} (log {log})")


def unload(cluster: nshosts.Cluster, host: nshosts.Host, name: str) -> None:
    """vLLM's /v1/unload_lora_adapter, from inside the pod (127.0.0.1: the evaluator's side)."""
    probe = (f"import json, urllib.request as u; u.urlopen(u.Request('http://127.0.0.1:{VLLM_PORT}/v1/unload_lora_"
             f"adapter', data=json.dumps({{'lora_name': {name!r}}}).encode(), headers={{'Content-Type': "
             "'application/json'}), timeout=30).read()")
    result = cluster.run(host, ["/usr/bin/python3", "-c", probe], env=IMAGE_ENV, timeout=60)
    fail_unless(result.returncode == 0, f"unload {name}: {result.stderr.strip()[-500:]}")


def ask(cluster: nshosts.Cluster, host: nshosts.Host, model: str, reference: dict[str, Any], log: Path) -> str:
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


def run_evaluation(cluster: nshosts.Cluster, host: nshosts.Host, logs: Path, name: str, args: list[str],
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


def served_chat_and_metrics(cluster: nshosts.Cluster, host: nshosts.Host, served: str, reference: dict[str, Any],
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
