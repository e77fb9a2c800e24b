#!/usr/bin/env python3
"""The evaluator container of a `serve` workload with `serving.evaluation`: it runs beside vLLM in the same pod and
is the only way an adapter gets served there (workloads/serving.py starts vLLM with the base and no --lora-modules).

    evaluator.py --url http://127.0.0.1:8000 --base BASE --task /gcs/TASK.jsonl --evals /evals \\
        --adapter NAME=MODEL_DIR [--adapter ...] [--min-improvement 0.05] [--max-tokens 32]

Every --poll seconds, once vLLM answers /health, for each adapter NAME:
1. The versioned copy EVALS/NAME/served.json names (EVALS/NAME/versions/NAME-STEP-TIME, what evaluate.py
   promoted when an export passed) is loaded under NAME when vLLM does not list it: on the pod's first start and
   after a restart of vLLM, which forgets what was loaded at run time. Before any export has passed, NAME is not
   served (clients get the base under its own name).
2. When MODEL_DIR/.complete says an adapter export that EVALS/NAME/results.json has not scored yet (its
   `candidateMarker` differs) and that is not the one served, evaluate.py copies it to its own versioned folder,
   scores it against the base and the copy served now, writes results.json and, when it passes the gate (or there
   is none), loads its copy in place under NAME, points served.json at it and removes the older copies.
   A failed evaluation (exit 1: the server; 2: the task file) is tried again after --retry seconds, not every poll.
The loop never exits on its own: a container that ended would make the pod not Ready, and the server with it;
--once makes one pass and exits (make e2e's `adapters` scenario). Standard library only; evaluate.py (beside this
file) is run as a child process, so lm-eval's memory is freed after each evaluation.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recipes.contract_programs import EVALUATE as EVALUATE_OPTIONS
from recipes.contract_programs import EVALUATOR
from recipes.evaluate_copies import MARKER, SERVED, read_json

RESULTS = "results.json"
LEGACY_COPY = "adapter"  # EVALS/NAME/adapter: where an older evaluate.py copied the served export
EVALUATE = Path(__file__).resolve().parent / "evaluate.py"
HTTP_TIMEOUT_SECONDS = 10


@dataclass(frozen=True)
class Adapter:
    name: str
    model_dir: Path


@dataclass
class State:
    """What the loop remembers between polls: the failed evaluations (marker, when) and what it said last."""

    failed: dict[str, tuple[dict[str, Any], float]] = field(default_factory=dict)
    said: dict[str, str] = field(default_factory=dict)



def adapter_marker(model_dir: Path) -> dict[str, Any] | None:
    """MODEL_DIR's marker when it says an adapter export (a merged model's, or none yet: None)."""
    marker = read_json(model_dir / MARKER)
    return marker if marker is not None and marker.get("export") == "adapter" else None


def evaluated_markers(folder: Path) -> list[dict[str, Any]]:
    """The markers of the export results.json scored last (served or not) and of the one served."""
    found = [(read_json(folder / RESULTS) or {}).get("candidateMarker"), (read_json(folder / SERVED) or {}).get(
        "marker")]
    return [m for m in found if isinstance(m, dict)]


def needs_evaluation(marker: Mapping[str, Any] | None, evaluated: Sequence[Mapping[str, Any]],
                     failed: tuple[Mapping[str, Any], float] | None, now: float, retry: float) -> bool:
    """A new export that was not scored yet, nor failed within `retry` seconds."""
    if marker is None or marker in evaluated:
        return False
    return failed is None or failed[0] != marker or now - failed[1] >= retry


def served_copy(folder: Path) -> Path | None:
    """The versioned copy served.json names, when it is whole (its marker is copied last); an older evaluator's
    EVALS/NAME/adapter otherwise."""
    path = (read_json(folder / SERVED) or {}).get("path")
    for copy in ([Path(path)] if isinstance(path, str) else []) + [folder / LEGACY_COPY]:
        if (copy / MARKER).is_file():
            return copy
    return None


def needs_loading(name: str, served: Sequence[str], copy: Path | None) -> bool:
    """A copy passed and vLLM does not serve it."""
    return name not in served and copy is not None


def evaluate_command(args: argparse.Namespace, adapter: Adapter) -> list[str]:
    folder = Path(args.evals) / adapter.name
    return [sys.executable, str(EVALUATE), *EVALUATE_OPTIONS.argv({
        "url": args.url, "base": args.base, "adapter": adapter.name, "candidate": str(adapter.model_dir),
        "task": args.task, "results": str(folder / RESULTS), "max_tokens": args.max_tokens,
        "max_length": args.max_length, "min_improvement": args.min_improvement, "metric": args.metric})]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_SECONDS) as response:
        return response.read().decode()


def healthy(url: str) -> bool:
    try:
        _get(f"{url}/health")
    except (urllib.error.URLError, OSError):
        return False
    return True


def served_models(url: str) -> list[str]:
    return [m["id"] for m in json.loads(_get(f"{url}/v1/models"))["data"]]


def load_adapter(url: str, name: str, path: Path) -> None:
    body = json.dumps({"lora_name": name, "lora_path": str(path)}).encode()
    request = urllib.request.Request(f"{url}/v1/load_lora_adapter", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_SECONDS * 30):
        pass


def log(text: str) -> None:
    print(f"[evaluator] {text}", flush=True)


@dataclass(frozen=True)
class Server:
    """What one poll does to the server and the folders (stand-ins in tests)."""

    served: Callable[[], list[str]]
    load: Callable[[str, Path], None]
    run: Callable[[list[str]], int]


def say_once(state: State, name: str, text: str) -> None:
    if state.said.get(name) != text:
        state.said[name] = text
        log(text)


def poll(args: argparse.Namespace, adapters: Sequence[Adapter], server: Server, state: State,
         now: Callable[[], float] = time.monotonic) -> None:
    """One pass over the adapters: serve the copies that passed, evaluate the new exports."""
    served = server.served()
    for adapter in adapters:
        try:
            visit(args, adapter, served, server, state, now)
        except (urllib.error.URLError, OSError, ValueError, KeyError) as error:  # one adapter's: the others go on
            log(f"{adapter.name}: {error}; trying again")


def visit(args: argparse.Namespace, adapter: Adapter, served: Sequence[str], server: Server, state: State,
          now: Callable[[], float]) -> None:
    """One adapter: its copy served, its new export scored."""
    folder = Path(args.evals) / adapter.name
    copy = served_copy(folder)
    if copy is not None and needs_loading(adapter.name, served, copy):
        server.load(adapter.name, copy)
        log(f"{adapter.name}: serving its evaluated copy {copy}")
    marker = adapter_marker(adapter.model_dir)
    if marker is None:
        say_once(state, adapter.name, f"{adapter.name}: waiting for an adapter export's "
                                      f"{adapter.model_dir / MARKER} (written last by the training workload)")
        return
    if not needs_evaluation(marker, evaluated_markers(folder), state.failed.get(adapter.name), now(), args.retry):
        return
    log(f"{adapter.name}: evaluating the export of step {marker.get('step')} on {args.task}")
    code = server.run(evaluate_command(args, adapter))
    if code == 0:
        state.failed.pop(adapter.name, None)
    else:
        state.failed[adapter.name] = (marker, now())
        log(f"{adapter.name}: evaluate.py exited {code} (its log above says why); trying again in "
            f"{args.retry:g} s")


def parse_adapter(text: str) -> Adapter:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=MODEL_DIR")
    return Adapter(name, Path(path))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = EVALUATOR.parser(description=" ".join(__doc__.split("\n\n")[0].split()),
                              types={"adapter": parse_adapter})
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    server = Server(served=lambda: served_models(args.url),
                    load=lambda name, path: load_adapter(args.url, name, path),
                    run=lambda command: subprocess.run(command, check=False).returncode)
    state = State()
    log(f"{len(args.adapter)} adapter(s) on {args.base}, task {args.task}, gate "
        f"{'none' if args.min_improvement is None else args.min_improvement}")
    if args.once:
        if not healthy(args.url):
            log(f"the server at {args.url}/health does not answer")
            return 1
        poll(args, args.adapter, server, state)
        return 0
    while True:
        if healthy(args.url):
            state.said.pop("", None)
            try:
                poll(args, args.adapter, server, state)
            except (urllib.error.URLError, OSError, ValueError, KeyError) as error:  # vLLM restarting, say
                log(f"the server: {error}; trying again")
        else:
            say_once(state, "", f"waiting for the server at {args.url}/health")
        time.sleep(args.poll)


if __name__ == "__main__":
    sys.exit(main())
