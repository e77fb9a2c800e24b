#!/usr/bin/env python3
"""The adapter loader of each replica of a `serve` workload whose evaluation decides for a fleet (issue 42 item 1):
every replica serves the adapter versions the one evaluator promoted, and nothing else.

    adapter_loader.py --url http://127.0.0.1:8000 --evals /evals --adapter NAME [--adapter ...] \\
        [--ready /tmp/adapter-loader/ready] [--poll 15] [--once]

With more than one replica (or an autoscaler) the evaluator runs in a pod of its own (the `<workload>-evaluator`
Deployment, one replica: workloads/serving_evaluator.py) and writes EVALS/NAME/served.json when an export passes its
gate; no replica scores or copies anything. This loop runs beside vLLM in every replica, reads EVALS (the bucket's
evals/ folder, mounted read-only) and, every --poll seconds once vLLM answers /health:
- for each NAME whose served.json names a whole copy (its marker `.complete`, copied last, is there), loads that
  copy under NAME when vLLM does not serve NAME (a new replica, or vLLM restarted and forgot what was loaded at run
  time), or replaces it in place (load_inplace) when vLLM serves NAME from another path (the evaluator promoted a
  newer export): vLLM's /v1/models gives each adapter's path (`root`);
- writes --ready once every NAME with a decision is served at the version decided, and removes it while one is not:
  the container's readiness probe reads it, so a new replica takes no traffic before it serves what its peers serve
  (a pod is Ready only when all its containers are). A NAME without served.json yet (nothing passed) is served by
  no replica, and does not hold readiness back.
The adapter endpoints answer only on the pod's loopback (client_endpoints.py): this loop is their only caller.
`sync` is one pass and `Server` what it does to vLLM, so tests (and make e2e, with `--once` against each replica)
drive it with stand-ins. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recipes.contract_programs import ADAPTER_LOADER
from recipes.evaluate_copies import MARKER, SERVED, read_json

HTTP_TIMEOUT_SECONDS = 10
LOAD_TIMEOUT_SECONDS = 300  # a load reads the adapter from the bucket's FUSE mount


@dataclass(frozen=True)
class Server:
    """What a pass does to vLLM: the adapters it serves (name -> path) and a load (name, path, in place)."""

    served: Callable[[], dict[str, str]]
    load: Callable[[str, str, bool], None]


@dataclass
class Result:
    """One pass: what was loaded, what is waited for (name -> why), and whether every decision is served."""

    loaded: list[str] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return not self.waiting



def decided(evals: Path, names: Sequence[str]) -> dict[str, str | None]:
    """The version the evaluator decided for each NAME: the path served.json names when that copy is whole; None
    when served.json names a copy not (yet) whole here (a FUSE mount may show the file before the copy); names
    without a decision are left out."""
    out: dict[str, str | None] = {}
    for name in names:
        path = (read_json(evals / name / SERVED) or {}).get("path")
        if isinstance(path, str) and path:
            out[name] = path if (Path(path) / MARKER).is_file() else None
    return out


def sync(evals: Path, names: Sequence[str], server: Server) -> Result:
    """One pass: every NAME served at the version decided (see the module's docstring)."""
    result, served = Result(), server.served()
    for name, path in decided(evals, names).items():
        if path is None:
            if name not in served:
                result.waiting[name] = "its decided copy is not whole yet"
            continue  # a replica that serves NAME keeps serving it until the new copy is whole
        if served.get(name) == path:
            continue
        try:
            server.load(name, path, name in served)
        except (urllib.error.URLError, OSError, ValueError) as error:
            result.waiting[name] = f"loading {path}: {error}"
            continue
        result.loaded.append(name)
    return result


def mark(ready_file: Path, result: Result) -> None:
    """The readiness probe's file: there while every decision is served, gone while one is not."""
    if result.ready:
        ready_file.parent.mkdir(parents=True, exist_ok=True)
        ready_file.touch()
    else:
        ready_file.unlink(missing_ok=True)


# --- vLLM over the pod's loopback ---------------------------------------------------------------------------------

def _request(url: str, body: Mapping[str, Any] | None = None, timeout: float = HTTP_TIMEOUT_SECONDS) -> str:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read().decode()


def served_adapters(url: str) -> dict[str, str]:
    """vLLM's /v1/models: each LoRA adapter's name and path (`root`; the base model has no `parent`)."""
    return {m["id"]: m.get("root", "") for m in json.loads(_request(f"{url}/v1/models"))["data"] if m.get("parent")}


def load_adapter(url: str, name: str, path: str, inplace: bool) -> None:
    _request(f"{url}/v1/load_lora_adapter", {"lora_name": name, "lora_path": path, "load_inplace": inplace},
             LOAD_TIMEOUT_SECONDS)


def healthy(url: str) -> bool:
    try:
        _request(f"{url}/health")
    except (urllib.error.URLError, OSError):
        return False
    return True


def log(text: str) -> None:
    print(f"[adapter-loader] {text}", flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = ADAPTER_LOADER.parser(description=" ".join(__doc__.split("\n\n")[0].split()))
    return parser.parse_args(argv)


def say(result: Result, said: dict[str, str]) -> None:
    for name in result.loaded:
        log(f"{name}: serving its decided version")
    for name, why in result.waiting.items():
        if said.get(name) != why:
            log(f"{name}: not served yet: {why}")
    said.clear()
    said.update(result.waiting)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    server = Server(served=lambda: served_adapters(args.url),
                    load=lambda name, path, inplace: load_adapter(args.url, name, path, inplace))
    said: dict[str, str] = {}
    log(f"{len(args.adapter)} adapter(s) from {args.evals}: {', '.join(args.adapter)}")
    while True:
        if not healthy(args.url):
            args.ready.unlink(missing_ok=True)  # vLLM restarting forgets what was loaded
            if args.once:
                log(f"the server at {args.url}/health does not answer")
                return 1
        else:
            try:
                result = sync(args.evals, args.adapter, server)
            except (urllib.error.URLError, OSError, ValueError, KeyError) as error:
                result = Result(waiting={"": f"the server: {error}"})
            say(result, said)
            mark(args.ready, result)
            if args.once:
                return 0 if result.ready else 1
        time.sleep(args.poll)


if __name__ == "__main__":
    sys.exit(main())
