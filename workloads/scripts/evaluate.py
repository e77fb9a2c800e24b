#!/usr/bin/env python3
"""Score a tuned LoRA adapter against the base model (or the adapter served now) on a held-out task, through a
running vLLM server's OpenAI API, with lm-evaluation-harness; serve it only when it passes the gate.

    evaluate.py --url http://127.0.0.1:8000 --base BASE --adapter NAME --candidate MODEL_DIR --task TASK.jsonl \\
        --results EVALS_DIR/results.json [--served-copy EVALS_DIR/adapter] [--min-improvement 0.05]

- The task: a JSON-lines file of the user's, one record a line, {"prompt": ..., "reference": ...} (other fields are
  ignored). lm-eval (0.4.13, data/versions.yaml) runs it as a local task, no hub: a task YAML written next to a copy
  of the file (datasets' `json` loader), `generate_until`, greedy, until a newline, EOS or --max-tokens, scored by
  lm-eval's `exact_match` on the reply stripped of surrounding whitespace (its `remove_whitespace` filter:
  str.strip), against model type
  `local-completions` pointed at the server's /v1/completions (tokenizer_backend none: the prompt is sent as text).
- The candidate (MODEL_DIR of a finetune workload that exports an adapter, its marker `.complete` there) is loaded
  into the running server under NAME-candidate (vLLM's /v1/load_lora_adapter: the server runs with
  VLLM_ALLOW_RUNTIME_LORA_UPDATING=true). The base, the adapter served now under NAME (when /v1/models lists it) and
  the candidate are scored on the same task.
- The gate: the reference is the adapter served now, else the base. Without --min-improvement the candidate is
  served; with it, only when its score beats the reference's by at least that much (a fraction of the records).
  Served: the candidate's folder is copied to --served-copy (the marker last) and loaded under NAME in place of the
  old one, so a later training run that rewrites MODEL_DIR never changes what is served; not served: the old model
  stays as it is. Either way the candidate's temporary name is unloaded.
- results.json (written last, beside the copy): the scores, the reference, the improvement, the gate, whether the
  candidate is served and why; the log says the same in one line, base vs tuned.

Exit status: 0 when the evaluation ran (served or kept out by the gate: both are outcomes, results.json says which);
2 for a bad task file or arguments; 1 when the server failed (nothing is changed then). Only the standard library
is imported at the top: lm_eval loads inside `score` (tests/test_evaluate.py runs the rest without it).
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EXIT_USAGE = 2
EXIT_SERVER = 1
MARKER = ".complete"  # finetune.py's, written last into MODEL_DIR
TASK_NAME = "deepspeed_stack_heldout"
METRIC = "exact_match"
FILTER = "strip"  # the task's filter name: lm-eval reports the metric as "exact_match,strip"
CANDIDATE_SUFFIX = "-candidate"
DEFAULT_MAX_TOKENS = 32
HTTP_TIMEOUT_SECONDS = 300
PROMPT_FIELD, REFERENCE_FIELD = "prompt", "reference"


class UsageError(ValueError):
    """A bad task file or argument: exit 2."""


class ServerError(RuntimeError):
    """The server refused or failed a request: exit 1."""


# --- the task -----------------------------------------------------------------------------------------------------

def task_problems(lines: Sequence[str]) -> list[str]:
    """What is wrong with the task file's records (every problem, each with its line), [] when it can run."""
    problems, records = [], 0
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            problems.append(f"line {number}: not JSON ({error.msg})")
            continue
        if not isinstance(record, dict):
            problems.append(f"line {number}: a JSON object with {PROMPT_FIELD!r} and {REFERENCE_FIELD!r} expected")
            continue
        records += 1
        for field in (PROMPT_FIELD, REFERENCE_FIELD):
            if not isinstance(record.get(field), str) or not record[field].strip():
                problems.append(f"line {number}: {field!r} must be a non-empty string")
    if records == 0 and not problems:
        problems.append("no records")
    return problems


def task_yaml(data_file: Path, max_tokens: int) -> str:
    """lm-eval's task: the local JSON-lines file through datasets' json loader (no hub), generated greedily until a
    newline, exact match of the stripped reply. JSON is YAML, so the YAML file is written as JSON."""
    task = {
        "task": TASK_NAME,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data_file)}},
        "test_split": "test",
        "output_type": "generate_until",
        "doc_to_text": "{{" + PROMPT_FIELD + "}}",
        "doc_to_target": "{{" + REFERENCE_FIELD + "}}",
        "generation_kwargs": {"until": ["\n"], "do_sample": False, "temperature": 0.0, "max_gen_toks": max_tokens},
        "filter_list": [{"name": FILTER, "filter": [{"function": "remove_whitespace"}, {"function": "take_first"}]}],
        "metric_list": [{"metric": METRIC, "aggregation": "mean", "higher_is_better": True, "ignore_case": False,
                         "ignore_punctuation": False}],
        "metadata": {"version": 1.0},
    }
    return json.dumps(task, indent=2) + "\n"


# --- the gate -----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Decision:
    serve: bool
    reference: str  # "served" (the adapter served now) or "base"
    improvement: float  # candidate - reference
    reason: str


def decide(scores: Mapping[str, float | None], min_improvement: float | None) -> Decision:
    """Serve the candidate when there is no gate, or when it beats the reference (the adapter served now, else the
    base) by at least `min_improvement`."""
    served = scores.get("served")
    reference = "served" if served is not None else "base"
    ref_score = float(served if served is not None else scores["base"] or 0.0)
    candidate = float(scores["candidate"] or 0.0)
    # Rounded: scores are shares of the records, and 0.3 - 0.2 must count as 0.1 (not 0.09999999999999998).
    improvement = round(candidate - ref_score, 9)
    what = "the adapter served now" if reference == "served" else "the base model"
    if min_improvement is None:
        return Decision(True, reference, improvement, f"no gate (minImprovement unset): served; {candidate:.3f} vs "
                                                      f"{what}'s {ref_score:.3f}")
    if improvement >= min_improvement:
        return Decision(True, reference, improvement, f"{candidate:.3f} beats {what}'s {ref_score:.3f} by "
                                                      f"{improvement:+.3f}, at least minImprovement "
                                                      f"{min_improvement:g}: served")
    return Decision(False, reference, improvement, f"{candidate:.3f} against {what}'s {ref_score:.3f} is "
                                                   f"{improvement:+.3f}, less than minImprovement "
                                                   f"{min_improvement:g}: not served; {what} stays")


def results_text(*, adapter: str, task: str, records: int, scores: Mapping[str, float | None],
                 decision: Decision, min_improvement: float | None, candidate: str, served_path: str | None,
                 marker: Mapping[str, Any] | None, evaluated: datetime.datetime, lm_eval_version: str) -> str:
    return json.dumps({
        "workload": adapter, "task": task, "records": records, "metric": METRIC, "scores": dict(scores),
        "reference": decision.reference, "improvement": round(decision.improvement, 6),
        "minImprovement": min_improvement, "served": decision.serve, "reason": decision.reason,
        "candidate": candidate, "servedPath": served_path, "candidateMarker": dict(marker) if marker else None,
        "evaluated": evaluated.isoformat(timespec="seconds"), "lmEval": lm_eval_version,
    }, indent=2, sort_keys=True) + "\n"


def summary_line(adapter: str, scores: Mapping[str, float | None], decision: Decision) -> str:
    served = scores.get("served")
    now = f", served now {served:.3f}" if served is not None else ""
    return (f"{adapter}: base {scores['base']:.3f} vs tuned {scores['candidate']:.3f}{now} ({METRIC}); "
            f"{decision.reason}")


# --- the server ---------------------------------------------------------------------------------------------------

def _request(url: str, body: dict[str, Any] | None = None) -> str:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_SECONDS) as response:
            return response.read().decode()
    except urllib.error.HTTPError as error:
        raise ServerError(f"{url}: HTTP {error.code}: {error.read().decode(errors='replace')[:500]}") from None
    except (urllib.error.URLError, OSError) as error:
        raise ServerError(f"{url}: {error}") from None


def served_models(url: str) -> list[str]:
    return [m["id"] for m in json.loads(_request(f"{url}/v1/models"))["data"]]


def load_adapter(url: str, name: str, path: str, inplace: bool = False) -> None:
    """vLLM's runtime LoRA loading (VLLM_ALLOW_RUNTIME_LORA_UPDATING); load_inplace replaces a loaded name."""
    _request(f"{url}/v1/load_lora_adapter", {"lora_name": name, "lora_path": path, "load_inplace": inplace})


def unload_adapter(url: str, name: str) -> None:
    _request(f"{url}/v1/unload_lora_adapter", {"lora_name": name})


def copy_adapter(candidate: Path, target: Path) -> None:
    """The candidate's files into `target` (a fresh folder), its marker last: a server restarting from the copy
    sees a whole adapter or none."""
    staging = target.with_name(target.name + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(candidate, staging, ignore=shutil.ignore_patterns(MARKER))
    if (candidate / MARKER).is_file():
        shutil.copy2(candidate / MARKER, staging / MARKER)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)


# --- lm-eval ------------------------------------------------------------------------------------------------------

def score(url: str, model: str, task_dir: Path) -> float:
    """lm-eval's exact match of `model` (a name the server serves) on the task in `task_dir`."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    results = simple_evaluate(
        model="local-completions",
        model_args={"model": model, "base_url": f"{url}/v1/completions", "tokenizer_backend": "none",
                    "tokenized_requests": False, "num_concurrent": 1, "max_retries": 2,
                    "timeout": HTTP_TIMEOUT_SECONDS},
        # Only the local task: lm-eval's thousands of built-in task files are not even indexed.
        tasks=[TASK_NAME], task_manager=TaskManager(include_path=str(task_dir), include_defaults=False),
        log_samples=False,
        random_seed=0, numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)
    if results is None:
        raise ServerError(f"lm-eval returned no results for {model}")
    return float(results["results"][TASK_NAME][f"{METRIC},{FILTER}"])


def lm_eval_version() -> str:
    from importlib.metadata import version

    return version("lm_eval")


# --- main ---------------------------------------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--url", required=True, help="the server's root, e.g. http://127.0.0.1:8000")
    parser.add_argument("--base", required=True, help="the base model's name in the server's API")
    parser.add_argument("--adapter", required=True, help="the name the tuned adapter is served under")
    parser.add_argument("--candidate", required=True, help="the adapter's folder (MODEL_DIR of the finetune workload)")
    parser.add_argument("--task", required=True, help="the held-out task: JSON lines of prompt and reference")
    parser.add_argument("--results", required=True, help="where results.json goes")
    parser.add_argument("--served-copy", help="where a served adapter is copied (default: beside results.json)")
    parser.add_argument("--min-improvement", type=float, help="the gate: at least this much better, or not served")
    parser.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, help="tokens generated per prompt")
    args = parser.parse_args(argv)
    problems = []
    if args.min_improvement is not None and not -1.0 <= args.min_improvement <= 1.0:
        problems.append(f"--min-improvement must be between -1 and 1 (a share of the records), got "
                        f"{args.min_improvement}")
    if args.max_tokens < 1:
        problems.append(f"--max-tokens must be 1 or more, got {args.max_tokens}")
    if problems:
        raise UsageError("; ".join(problems))
    return args


def read_task(path: Path) -> list[str]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise UsageError(f"--task {path}: {error.strerror}") from None
    problems = task_problems(lines)
    if problems:
        raise UsageError(f"--task {path}: " + "; ".join(problems))
    return [line for line in lines if line.strip()]


def read_marker(folder: Path) -> dict[str, Any] | None:
    try:
        marker = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return marker if isinstance(marker, dict) else None


def log(text: str) -> None:
    print(f"[evaluate] {text}", flush=True)


def evaluate(args: argparse.Namespace, scorer: Callable[[str, str, Path], float] = score,
             version: Callable[[], str] = lm_eval_version) -> dict[str, Any]:
    """The evaluation and the gate (see the module's docstring); returns what results.json holds."""
    records = read_task(Path(args.task))
    candidate = Path(args.candidate)
    marker = read_marker(candidate)
    if marker is not None and marker.get("export") not in (None, "adapter"):
        raise UsageError(f"--candidate {candidate}: its marker says export {marker.get('export')!r}, not an adapter")
    results = Path(args.results)
    copy = Path(args.served_copy) if args.served_copy else results.parent / "adapter"
    temporary = args.adapter + CANDIDATE_SUFFIX
    served_now = args.adapter in served_models(args.url)
    with tempfile.TemporaryDirectory(prefix="evaluate-") as tmp:
        task_dir = Path(tmp)
        data = task_dir / "task.jsonl"
        data.write_text("\n".join(records) + "\n", encoding="utf-8")
        (task_dir / f"{TASK_NAME}.yaml").write_text(task_yaml(data, args.max_tokens), encoding="utf-8")
        load_adapter(args.url, temporary, str(candidate))
        try:
            scores: dict[str, float | None] = {
                "base": scorer(args.url, args.base, task_dir),
                "served": scorer(args.url, args.adapter, task_dir) if served_now else None,
                "candidate": scorer(args.url, temporary, task_dir)}
        finally:
            unload_adapter(args.url, temporary)
    decision = decide(scores, args.min_improvement)
    served_path = None
    if decision.serve:
        copy_adapter(candidate, copy)
        load_adapter(args.url, args.adapter, str(copy), inplace=served_now)
        served_path = str(copy)
    text = results_text(adapter=args.adapter, task=str(args.task), records=len(records), scores=scores,
                        decision=decision, min_improvement=args.min_improvement, candidate=str(candidate),
                        served_path=served_path, marker=marker,
                        evaluated=datetime.datetime.now(datetime.UTC), lm_eval_version=version())
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(text, encoding="utf-8")
    log(summary_line(args.adapter, scores, decision))
    log(f"results: {results}")
    return json.loads(text)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        evaluate(args)
    except UsageError as error:
        log(f"FAILED: {error}")
        return EXIT_USAGE
    except ServerError as error:
        log(f"FAILED: the server: {error}")
        return EXIT_SERVER
    return 0


if __name__ == "__main__":
    sys.exit(main())
