#!/usr/bin/env python3
"""Score a tuned LoRA adapter against the base model (or the adapter served now) on a held-out task, through a
running vLLM server's OpenAI API, with lm-evaluation-harness; serve it only when it passes the gate.

    evaluate.py --url http://127.0.0.1:8000 --base BASE --adapter NAME --candidate MODEL_DIR --task TASK.jsonl \\
        --results EVALS_DIR/results.json [--metric loglikelihood|exact_match] [--min-improvement 0.05]

- The task: a JSON-lines file of the user's in any format training takes (conversations with the last assistant
  turn as the reference, prompt/completion, alpaca) or {"prompt": ..., "reference": ...}; evaluate_task.py reads
  it with finetune.py's own recognition (finetune_data.py) and renders it as the export's marker says it was
  trained (`rendering`: chat, through the chat template saved with the export, the served chat endpoint's tokens;
  raw, the prompt as text): no flag to get wrong. Exports from before the marker said so are scored raw.
- Two metrics, both computed on every run (lm-eval 0.4.13, `local-completions` with the export's tokenizer, token
  ids sent): `loglikelihood`, the mean log-likelihood per reference token given the prompt (vLLM's prompt
  logprobs: it separates better models on paragraph-long answers), and `exact_match` of the greedy reply (short
  answers). --metric names the one the gate reads; default loglikelihood for chat-trained exports, exact_match for
  raw ones.
- The candidate (MODEL_DIR, its marker `.complete` there) is first copied to its own versioned folder,
  EVALS_DIR/versions/NAME-STEP-TIME (the marker's step and time), and loaded from there under NAME-candidate: vLLM
  keys its LoRA prefix cache on (name, path), so no export is ever scored or served from another's cached blocks,
  and a training run rewriting MODEL_DIR meanwhile changes nothing. The base, the adapter served now (when
  /v1/models lists NAME) and the candidate are scored on the same records, rendering and metric.
- The gate (`passes`): the reference is the adapter served now, else the base. Without --min-improvement the
  candidate is served; with it, only when its score beats the reference's by at least that much (exact_match: a
  share of the records; loglikelihood: nats per token). Served: its versioned copy is loaded under NAME in place
  of the old one, EVALS_DIR/served.json names it (what evaluator.py loads after a restart), and the older copies
  are removed; not served: its copy is removed and the old model stays as it is. Either way the candidate's
  temporary name is unloaded.
- results.json (written last): the metric, the rendering, the records, both metrics' scores, the reference, the
  improvement, the gate, whether the candidate is served and why; the log says the same in one line.

Exit status: 0 when the evaluation ran (served or kept out by the gate: both are outcomes, results.json says which);
2 for a bad task file or arguments; 1 when the server failed (nothing is changed then). Only the standard library
(and the modules beside this file) is imported at the top: lm_eval and transformers load inside functions
(tests/test_evaluate.py runs the rest without them).
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

from recipes.contract import EXIT_USAGE
from recipes.contract_programs import EVALUATE
from recipes.evaluate_copies import (
    SERVED,
    copy_adapter,
    read_json,
    read_marker,
    remove_other_versions,
    version_name,
    write_served,
)
from recipes.evaluate_task import (
    CHAT,
    EXACT_MATCH,
    FILTER,
    GENERATE_TASK,
    LIKELIHOOD_TASK,
    LOGLIKELIHOOD,
    METRICS,
    RAW,
    RENDERINGS,
    RecordError,
    raw_problems,
    read_records,
    rendered,
    write_tasks,
)

EXIT_SERVER = 1
VERSIONS = "versions"  # EVALS_DIR/versions/NAME-STEP-TIME: each candidate's own copy
CANDIDATE_SUFFIX = "-candidate"
HTTP_TIMEOUT_SECONDS = 300
# Every metric's direction: +1 when higher is better (both are: a log-likelihood closer to 0, more exact matches).
DIRECTION = {LOGLIKELIHOOD: 1, EXACT_MATCH: 1}
UNITS = {LOGLIKELIHOOD: "nats per reference token", EXACT_MATCH: "a share of the records"}


class UsageError(ValueError):
    """A bad task file or argument: exit 2."""


class ServerError(RuntimeError):
    """The server refused or failed a request: exit 1."""


# --- the gate -----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Decision:
    serve: bool
    reference: str  # "served" (the adapter served now) or "base"
    improvement: float  # candidate - reference, in the metric's direction
    reason: str


# The gate's bounds, as its option declares them (recipes/contract_programs.py EVALUATE: serving.evaluation's 0..1).
MIN_IMPROVEMENT_RANGE = (EVALUATE.option("min_improvement").minimum, EVALUATE.option("min_improvement").maximum)


def passes(improvement: float, min_improvement: float | None) -> bool:
    """The gate's rule, the one place it is written (the preview's summary says it from here too): no gate, or an
    improvement (in the metric's direction) of at least `min_improvement`."""
    return min_improvement is None or improvement >= min_improvement


def gate_text(metric: str, min_improvement: float | None) -> str:
    """The rule in words, for the preview and the docs."""
    if min_improvement is None:
        return f"every scored export is served ({metric} is still written)"
    return (f"served when its {metric} beats the adapter served now (else the base) by at least {min_improvement:g} "
            f"({UNITS[metric]}, higher is better)")


def decide(scores: Mapping[str, float | None], min_improvement: float | None,
           metric: str = EXACT_MATCH) -> Decision:
    """Serve the candidate when there is no gate, or when it beats the reference (the adapter served now, else the
    base) by at least `min_improvement`."""
    served = scores.get("served")
    reference = "served" if served is not None else "base"
    ref_score = float(served if served is not None else scores["base"] or 0.0)
    candidate = float(scores["candidate"] or 0.0)
    # Rounded: scores are shares of the records, and 0.3 - 0.2 must count as 0.1 (not 0.09999999999999998).
    improvement = round(DIRECTION[metric] * (candidate - ref_score), 9)
    what = "the adapter served now" if reference == "served" else "the base model"
    if min_improvement is None:
        return Decision(True, reference, improvement, f"no gate (minImprovement unset): served; {candidate:.3f} vs "
                                                      f"{what}'s {ref_score:.3f}")
    if passes(improvement, min_improvement):
        return Decision(True, reference, improvement, f"{candidate:.3f} beats {what}'s {ref_score:.3f} by "
                                                      f"{improvement:+.3f}, at least minImprovement "
                                                      f"{min_improvement:g}: served")
    return Decision(False, reference, improvement, f"{candidate:.3f} against {what}'s {ref_score:.3f} is "
                                                   f"{improvement:+.3f}, less than minImprovement "
                                                   f"{min_improvement:g}: not served; {what} stays")


def summary_line(adapter: str, scores: Mapping[str, float | None], decision: Decision, metric: str) -> str:
    served = scores.get("served")
    now = f", served now {served:.3f}" if served is not None else ""
    return (f"{adapter}: base {scores['base']:.3f} vs tuned {scores['candidate']:.3f}{now} ({metric}); "
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


# --- lm-eval ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Scoring:
    """What every model is scored with: the task folder, the export's tokenizer, how the prompts were rendered."""

    task_dir: Path
    tokenizer: str
    rendering: str
    max_length: int


def score(url: str, model: str, how: Scoring) -> dict[str, float]:
    """Both metrics of `model` (a name the server serves) on the two local tasks.

    lm-eval's `evaluate()` with its registry's `local-completions` model, as `simple_evaluate` builds them: that
    wrapper also records the environment for every model scored (torch's collect_env: `pip list` and more
    subprocesses, a second or two of a serving pod's CPU each) and a git hash, neither of which results.json keeps;
    its other settings are the task files' own (`num_fewshot: 0`; greedy, nothing sampled: nothing to seed)."""
    from lm_eval.api.registry import get_model
    from lm_eval.evaluator import evaluate as run_tasks

    lm = get_model("local-completions").create_from_arg_obj(
        # Token ids from the export's tokenizer: the rendered chat text without special tokens (vLLM's chat
        # endpoint's tokens), a raw prompt with BOS (what /v1/completions makes of text). One prompt a request, one
        # request at a time (lm-eval's defaults): vLLM 0.32's CPU LoRA kernels fail the engine when a prompt-logprobs
        # request shares a batch with another (docs/serving.md).
        {"model": model, "base_url": f"{url}/v1/completions", "tokenizer_backend": "huggingface",
         "tokenizer": how.tokenizer, "tokenized_requests": True, "add_bos_token": how.rendering == RAW,
         "max_length": how.max_length, "num_concurrent": 1, "batch_size": 1, "max_retries": 2,
         "timeout": HTTP_TIMEOUT_SECONDS})
    results = run_tasks(lm=lm, task_dict=_tasks(how.task_dir), bootstrap_iters=0, log_samples=False)
    if results is None:
        raise ServerError(f"lm-eval returned no results for {model}")
    found = results["results"]
    return {EXACT_MATCH: float(found[GENERATE_TASK][f"{EXACT_MATCH},{FILTER}"]),
            LOGLIKELIHOOD: float(found[LIKELIHOOD_TASK][f"{LOGLIKELIHOOD},none"])}


def _tasks(task_dir: Path) -> Any:
    """The two local tasks, loaded once a run and scored for every model (lm-eval builds a run's requests anew from
    a task's documents); only they are indexed, not lm-eval's thousands of built-in task files."""
    if task_dir not in _LOADED:
        from lm_eval.tasks import TaskManager

        _LOADED[task_dir] = TaskManager(include_path=str(task_dir), include_defaults=False).load(
            [GENERATE_TASK, LIKELIHOOD_TASK])
    return _LOADED[task_dir]


_LOADED: dict[Path, Any] = {}


def load_tokenizer(folder: Path) -> Any:
    """The export's tokenizer, with the chat template it was trained with (finetune.py saves it with the adapter)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def lm_eval_version() -> str:
    from importlib.metadata import version

    return version("lm_eval")


# --- main ---------------------------------------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = EVALUATE.parser(description=" ".join(__doc__.split("\n\n")[0].split()))
    args = parser.parse_args(argv)
    problems = []
    low, high = MIN_IMPROVEMENT_RANGE
    if args.min_improvement is not None and not low <= args.min_improvement <= high:  # one range, in one sentence
        problems.append(f"--min-improvement must be between {low:g} and {high:g}, got {args.min_improvement}")
    if (problem := EVALUATE.option("max_tokens").bound_problem(args.max_tokens)) is not None:
        problems.append(problem)
    if args.max_length <= args.max_tokens:
        problems.append(f"--max-length must be more than --max-tokens, got {args.max_length}")
    if problems:
        raise UsageError("; ".join(problems))
    return args


def rendering_of(marker: Mapping[str, Any] | None) -> str:
    """How the export was trained, as its marker says (exports from before it said so were scored raw)."""
    value = (marker or {}).get("rendering")
    return value if value in RENDERINGS else RAW


def read_task(path: Path, rendering: str) -> list[Any]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise UsageError(f"--task {path}: {error.strerror}") from None
    records, problems = read_records(lines)
    if not problems and rendering == RAW:
        problems = raw_problems(records)
    if problems:
        raise UsageError(f"--task {path}: " + "; ".join(problems))
    return records


def log(text: str) -> None:
    print(f"[evaluate] {text}", flush=True)


@dataclass(frozen=True)
class Tools:
    """What evaluate() calls outside itself (stand-ins in tests)."""

    scorer: Callable[[str, str, Scoring], Mapping[str, float]] = score
    version: Callable[[], str] = lm_eval_version
    tokenizer: Callable[[Path], Any] = load_tokenizer
    now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC)
def scores_of(url: str, names: Mapping[str, str | None], how: Scoring,
              scorer: Callable[[str, str, Scoring], Mapping[str, float]]) -> dict[str, dict[str, float | None]]:
    """Every metric's scores of base, served (None when nothing is served) and candidate: {metric: {who: score}}."""
    found = {who: (scorer(url, name, how) if name is not None else None) for who, name in names.items()}
    return {metric: {who: (None if got is None else float(got[metric])) for who, got in found.items()}
            for metric in METRICS}


def results_text(args: argparse.Namespace, *, records: int, metric: str, rendering: str,
                 by_metric: Mapping[str, Mapping[str, float | None]], decision: Decision, copy: Path,
                 served_path: str | None, marker: Mapping[str, Any] | None, tools: Tools) -> str:
    return json.dumps({
        "workload": args.adapter, "task": str(args.task), "records": records, "metric": metric,
        "rendering": rendering, "higherIsBetter": DIRECTION[metric] > 0, "scores": dict(by_metric[metric]),
        "byMetric": {k: dict(v) for k, v in by_metric.items()}, "reference": decision.reference,
        "improvement": round(decision.improvement, 6), "minImprovement": args.min_improvement,
        "served": decision.serve, "reason": decision.reason, "candidate": str(args.candidate),
        "candidateCopy": str(copy), "servedPath": served_path, "candidateMarker": dict(marker) if marker else None,
        "evaluated": tools.now().isoformat(timespec="seconds"), "lmEval": tools.version(),
    }, indent=2, sort_keys=True) + "\n"


def evaluate(args: argparse.Namespace, tools: Tools | None = None) -> dict[str, Any]:
    """The evaluation and the gate (see the module's docstring); returns what results.json holds."""
    tools = tools or Tools()
    candidate = Path(args.candidate)
    marker = read_marker(candidate)
    if marker is not None and marker.get("export") not in (None, "adapter"):
        raise UsageError(f"--candidate {candidate}: its marker says export {marker.get('export')!r}, not an adapter")
    rendering = rendering_of(marker)
    records = read_task(Path(args.task), rendering)
    metric = args.metric or (LOGLIKELIHOOD if rendering == CHAT else EXACT_MATCH)
    results = Path(args.results)
    versions = results.parent / VERSIONS
    copy = versions / version_name(args.adapter, marker, tools.now())
    if (read_json(results.parent / SERVED) or {}).get("path") == str(copy):
        raise UsageError(f"--candidate {candidate}: this export ({copy.name}) is the one served now")
    copy_adapter(candidate, copy)  # scored and served from its own path: never another export's cached blocks
    try:
        docs = rendered(records, rendering, tools.tokenizer(copy))
    except RecordError as error:
        shutil.rmtree(copy, ignore_errors=True)
        raise UsageError(f"--task {args.task}: {error.text}") from None
    temporary = args.adapter + CANDIDATE_SUFFIX
    served_now = args.adapter in served_models(args.url)
    with tempfile.TemporaryDirectory(prefix="evaluate-") as tmp:
        how = Scoring(Path(tmp), str(copy), rendering, args.max_length)
        write_tasks(how.task_dir, docs, rendering, args.max_tokens)
        load_adapter(args.url, temporary, str(copy))
        try:
            by_metric = scores_of(args.url, {"base": args.base, "served": args.adapter if served_now else None,
                                             "candidate": temporary}, how, tools.scorer)
        finally:
            unload_adapter(args.url, temporary)
    decision = decide(by_metric[metric], args.min_improvement, metric)
    served_path = None
    if decision.serve:
        load_adapter(args.url, args.adapter, str(copy), inplace=served_now)
        write_served(results.parent / SERVED, args.adapter, copy, marker)
        served_path = str(copy)
        gone = remove_other_versions(versions, copy)
        if gone:
            log(f"removed the copies no longer served: {', '.join(gone)}")
    else:
        shutil.rmtree(copy, ignore_errors=True)
    text = results_text(args, records=len(records), metric=metric, rendering=rendering, by_metric=by_metric,
                        decision=decision, copy=copy, served_path=served_path, marker=marker, tools=tools)
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(text, encoding="utf-8")
    log(summary_line(args.adapter, by_metric[metric], decision, metric) + f"; {rendering} rendering, "
        f"{len(records)} records")
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
