"""vLLM's CPU build as the `adapters` scenario of `make e2e` serves with it (e2e/run.py): its environment, its
readiness, and the checks of its answers against transformers' and of its /metrics."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import hosts as nshosts
from harness import CACHE_LOCK, IMAGE_ENV, VENV, _chown_dirs, fail_unless

VLLM_PORT = 8000
VLLM_START_TIMEOUT = float(os.environ.get("E2E_VLLM_TIMEOUT", "300"))
# vLLM's CPU build as FACTS.md measured it fastest to start (a 1 GiB KV cache, eager mode, the `uni` executor),
# with the model run inside the engine-core process (no third process importing everything again), no hub; one
# OpenMP thread from the start (vLLM serves with one here anyway: "Reducing Torch threads from 2 to 1"); and no
# torch.compile (TORCH_COMPILE_DISABLE, torch._dynamo.config.disable): the sampler's one compiled helper,
# batched_count_greater_than (vllm/v1/sample/ops/logprobs.py, a logprob's rank: an integer count, compiled only to
# spare a GPU's memory a copy), cost the evaluation's first log-likelihood request 13-14 s of dynamo and inductor
# even from inductor's cache; run eagerly it gives the same counts.
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1", "TORCH_COMPILE_DISABLE": "1"}


def vllm_env() -> dict[str, str]:
    """VLLM_ENV, and the cache the run's servers keep in the e2e venv beside DeepSpeed's prebuilt op (install.sh):
    what a pod pays at its first start, make e2e pays at its first run only. vLLM inspects a model's class in a
    subprocess (a third import of torch and vLLM) unless its modelinfos cache has it."""
    folder = VENV / "e2e_cache" / "vllm"
    with CACHE_LOCK:
        folder.mkdir(parents=True, exist_ok=True)
        _chown_dirs(folder.parent)
    return {**VLLM_ENV, "VLLM_CACHE_ROOT": str(folder)}

def chat_problems(answer: dict[str, Any], reference: dict[str, Any], max_tokens: int) -> list[str]:
    """What differs between vLLM's greedy /v1/chat/completions answer (send_prompt.py --chat --json) and
    transformers' greedy tokens after apply_chat_template(add_generation_prompt=True): vLLM's chat API gives the
    rendered prompt's ids beside the choices, not in them."""
    return _greedy_problems(answer, answer.get("prompt_token_ids"), reference, max_tokens,
                            "vLLM rendered the conversation as {got}, transformers' template as {want}")


def _greedy_problems(answer: dict[str, Any], prompt_ids: Any, reference: dict[str, Any], max_tokens: int,
                     prompt_message: str) -> list[str]:
    choice, usage = (answer.get("choices") or [{}])[0], answer.get("usage") or {}
    problems = []
    if usage.get("completion_tokens") != max_tokens:
        problems.append(f"completion_tokens {usage.get('completion_tokens')}, expected {max_tokens}")
    if prompt_ids != reference["prompt_token_ids"]:
        problems.append(prompt_message.format(got=prompt_ids, want=reference["prompt_token_ids"]))
    if choice.get("token_ids") != reference["token_ids"]:
        problems.append(f"vLLM's tokens {choice.get('token_ids')} != transformers' greedy {reference['token_ids']}")
    return problems

def completion_problems(answer: dict[str, Any], reference: dict[str, Any], max_tokens: int) -> list[str]:
    """What differs between vLLM's greedy completion (send_prompt.py --json) and transformers' greedy tokens."""
    choice = (answer.get("choices") or [{}])[0]
    return _greedy_problems(answer, choice.get("prompt_token_ids"), reference, max_tokens,
                            "prompt tokens {got} != transformers' {want}")


def metrics_problems(text: str) -> list[str]:
    """What vLLM's /metrics (Prometheus' text format) lacks of the gauges the autoscaler reads, each typed gauge
    with a sample (data/serving_metrics.yaml)."""
    from model import serving_metrics

    problems = []
    for name in serving_metrics.load().metrics.values():
        quoted = re.escape(name)
        if not re.search(rf"^# TYPE {quoted} gauge$", text, re.MULTILINE):
            problems.append(f"no gauge {name}")
        elif not re.search(rf"^{quoted}(\{{[^}}]*\}})? \S+$", text, re.MULTILINE):
            problems.append(f"{name} has no sample")
    return problems

def wait_for_vllm(cluster: nshosts.Cluster, host: nshosts.Host, server: subprocess.Popen[bytes], log: Path) -> None:
    """Until /health answers 200 (what a readiness probe asks), or the server dies, or the time is up."""
    probe = (f"import urllib.request as u; u.urlopen('http://127.0.0.1:{VLLM_PORT}/health', timeout=2).read()")
    deadline = time.monotonic() + VLLM_START_TIMEOUT
    while True:
        fail_unless(server.poll() is None, f"vLLM exited with {server.returncode}: "
                    f"{log.read_text(errors='replace').strip()[-1500:]}")
        fail_unless(time.monotonic() < deadline, f"vLLM not healthy within {VLLM_START_TIMEOUT:.0f} s (log {log})")
        if cluster.run(host, ["/usr/bin/python3", "-c", probe], env=IMAGE_ENV, timeout=10).returncode == 0:
            return
        time.sleep(1)
