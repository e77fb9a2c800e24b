"""Write the planner's cheapest plan as a stack that previews: `make gpus MODEL=... MODE=... WRITE=<stack>`.

    python -m preview.write_stack --model Llama-3.1-8B --mode training --stack llama8b [--region R] [--budget 5]

The planner lists every option that holds the model (planner/recommend.py), cheapest first; each is written as a
stack config (planner/stack_writer.py) and loaded through the stack's own checks (the rules `make preview` runs),
and the first they accept, within the budget, is written to Pulumi.<stack>.yaml with its reasons as comments.
Cheaper options the checks refused are listed in the file with the first reason. It sits in the preview layer
because it runs the checks; the plan itself is the planner's.

Exit codes: 0 written; 2 a usage error, an unknown model, or no option the checks accept within the budget.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import msgspec

from checks import load
from model import catalog as gpu_catalog
from model.config import ConfigError
from model.gated_models import gated_family
from model.suggest import did_you_mean
from model.workload_types import hub_ids
from planner import run_estimate, stack_writer
from planner.cost import SERVING, TRAINING, stack_costs
from planner.requests import mode_request
from planner.sizing import BYTES_PER_PARAM, Request, given_shape, resolve
from preview.engine import PROJECT_DIR, SECRET, engine_config_from_yaml

MAX_TRIES = 60  # candidates loaded through the checks before giving up (each load is a few tens of ms)
ROLE = {stack_writer.TRAINING: TRAINING, stack_writer.INFERENCE: SERVING}


class NoPlanError(Exception):
    """No candidate that the checks accept (within the budget); the message says why the cheapest were refused."""


class Choice(msgspec.Struct, frozen=True):
    candidate: stack_writer.Candidate
    running_per_hour: float
    floor_per_hour: float
    refused: list[tuple[stack_writer.Candidate, str]]
    gated_model: str | None = None  # a gated Hugging Face id the pods download: the user's token comes first
    spot_per_hour: float = 0.0  # the same stack with its GPU nodes at the spot price (a run's other price)


def _problem_line(problem: str, limit: int = 220) -> str:
    return problem if len(problem) <= limit else problem[:limit - 1] + "…"


def gated_model(candidate: stack_writer.Candidate) -> str | None:
    """The gated Hugging Face id (data/gated_models.yaml) a candidate's workload downloads, if any."""
    for w in (candidate.config.get("deepspeed-stack:workloads") or {}).values():
        model_id = (w.get("serving") or {}).get("model") or (w.get("finetune") or {}).get("model")
        # MODE=training's MPIJob names the model in its script's arguments (--model ID): downloaded as well.
        ids = [model_id, *(found for _, found in hub_ids([str(a) for a in (w.get("launch") or {}).get("args") or []]))]
        gated = [i for i in ids if isinstance(i, str) and gated_family(i) is not None]
        if gated:
            return gated[0]
    return None


def with_tokens(candidate: stack_writer.Candidate, tokens: run_estimate.GivenTokens | None) -> stack_writer.Candidate:
    """A finetune candidate with the run's tokens as its keys (finetune.datasetTokens, epochs), for the preview's
    estimate of the run; others as they are."""
    if tokens is None:
        return candidate
    config = dict(candidate.config)
    workloads = {name: dict(w) for name, w in (config.get("deepspeed-stack:workloads") or {}).items()}
    for w in workloads.values():
        if w.get("kind") == stack_writer.FINETUNE:
            w["finetune"] = {**w["finetune"], "datasetTokens": max(1, round(tokens.per_epoch)),
                             "epochs": tokens.epochs}
    config["deepspeed-stack:workloads"] = workloads
    return msgspec.structs.replace(candidate, config=config)


def choose(request: Request, region: str, stack: str, budget: float | None = None,
           cat: gpu_catalog.Catalog | None = None, model_id: str | None = None, writer: str | None = None,
           tokens: run_estimate.GivenTokens | None = None) -> Choice:
    """The cheapest candidate whose config the checks accept and whose $/h with the workload running is within
    `budget` (None: any). `tokens`: the run's, written into a finetune workload's keys."""
    refused: list[tuple[stack_writer.Candidate, str]] = []
    for candidate in stack_writer.candidates(request, region, stack, cat, model_id=model_id,
                                                        writer=writer)[:MAX_TRIES]:
        candidate = with_tokens(candidate, tokens)
        config, secret_keys = engine_config_from_yaml(candidate.config)
        gated = gated_model(candidate)
        if gated:  # checked as it will run: after the user's `pulumi config set --secret hfToken` (header says so)
            config["deepspeed-stack:hfToken"] = SECRET
            secret_keys = [*secret_keys, "deepspeed-stack:hfToken"]
        try:
            model = load(config, set(secret_keys))
        except ConfigError as err:
            refused.append((candidate, _problem_line(err.problems[0])))
            continue
        costs = stack_costs(model, cat)
        running = costs["running"][ROLE[request.mode]]["perHour"]
        if budget is not None and running > budget:
            refused.append((candidate, f"${running:,.2f}/h with the workload running, over the budget "
                                       f"${budget:,.2f}/h"))
            continue
        spot = running - candidate.option.on_demand + candidate.option.spot  # the writer's pools are on-demand
        return Choice(candidate, running, costs["floorPerHour"], refused, gated, round(spot, 4))
    reasons = "; ".join(f"{c.label}: {why}" for c, why in refused[:3]) or "the planner found no option"
    raise NoPlanError(f"no plan for {request.model.name} in {region} that the stack's checks accept"
                 f"{' within the budget' if budget is not None else ''} ({reasons})")


def run_line(choice: Choice, request: Request, tokens: run_estimate.GivenTokens | None,
             cat: gpu_catalog.Catalog) -> list[str]:
    """The run in all: hours and $ at the stack's $/h while it trains (as `make preview` shows a finetune run)."""
    c = choice.candidate
    top = run_estimate.peak(cat, c.option.gpu_type, request.precision)
    if tokens is None or request.mode != "training" or top is None:
        return []
    e = run_estimate.estimate(tokens.total, request, c.strategy, c.option.gpus, top)
    on_demand, spot = (e.cost(rate) for rate in (choice.running_per_hour, choice.spot_per_hour))
    return [f"Estimated run: {tokens.total:,.0f} tokens ({tokens.said}): about {run_estimate.hours_range(e)}, "
            f"${on_demand[0]:,.2f}–${on_demand[1]:,.2f} per run on-demand, ${spot[0]:,.2f}–${spot[1]:,.2f} spot, at "
            f"an assumed MFU of {run_estimate.mfu_range(e)} (data/training_speed.yaml; `make gpus` without WRITE= "
            "ranks every option by cost per run)."]


def header(choice: Choice, request: Request, region: str, stack: str, command: str,
           cat: gpu_catalog.Catalog, tokens: run_estimate.GivenTokens | None = None) -> list[str]:
    c, model = choice.candidate, request.model
    shape = "shape from data/models.yaml" if model.shape_known else "shape unknown: the planner's upper bounds"
    today = datetime.date.today().isoformat()
    lines = [
        f"{stack}: written by `{command}` ({today}).",
        f"{model.name}: {model.billions:.2f}B parameters ({shape}), {request.precision} {request.mode}"
        f"{f' ({request.training_label})' if request.mode == 'training' else ''}, sequence "
        f"{request.sequence_length} x batch {request.batch_size}, {region}.",
        f"Plan: {stack_writer.summary_line(c)}; the cheapest option that holds it with "
        f"{stack_writer.HEADROOM:.0%} of each GPU free and that the stack's checks accept.",
        f"Estimated cost: ${choice.running_per_hour:,.2f}/h with the workload running, ${choice.floor_per_hour:,.2f}/h "
        f"at rest (estimates, {cat.prices_of(region)}, from data/gpu_catalog.yaml, "
        f"{cat.date}; `make preview STACK={stack}` shows the breakdown).",
        *run_line(choice, request, tokens, cat),
    ]
    if choice.refused:
        lines.append("Cheaper options the stack's checks refused (first reason each):")
        lines += [f"  - {rc.label}: {why}" for rc, why in choice.refused[:5]]
        if len(choice.refused) > 5:
            lines.append(f"  - and {len(choice.refused) - 5} more")
    if choice.gated_model:
        lines.append(f"{choice.gated_model} is gated on Hugging Face (data/gated_models.yaml): accept its terms on "
                     f"https://huggingface.co/{choice.gated_model}, then `pulumi config set --secret hfToken hf_... "
                     f"-s {stack}`; without it the preview refuses the stack.")
    lines.append(f"Next: set gcp:project below, then `make preview STACK={stack}`, then `pulumi up -s {stack}`.")
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m preview.write_stack", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", help="a known model (python -m planner --list), a Hugging Face id, or a size (7B)")
    what.add_argument("--parameters", type=float, metavar="B", help="parameters in billions (unknown shape)")
    parser.add_argument("--mode", required=True, help="training, finetune (LoRA, the finetune kind) or inference")
    parser.add_argument("--stack", required=True, help="the stack to write: Pulumi.<stack>.yaml")
    parser.add_argument("--precision", choices=list(BYTES_PER_PARAM), default="bf16")
    parser.add_argument("--region", default="us-central1")
    parser.add_argument("--seq", type=int, default=2048, help="sequence length (default 2048)")
    parser.add_argument("--batch", type=int, default=1, help="sequences per GPU at once (default 1)")
    parser.add_argument("--budget", type=float, metavar="USD_PER_HOUR",
                        help="most $/h with the workload running (on-demand list prices)")
    parser.add_argument("--vocab", type=int)
    parser.add_argument("--hidden", type=int)
    parser.add_argument("--largest-layer", type=float, metavar="M")
    parser.add_argument("--tokens", type=float, help="the data's tokens: the run's hours and $ in the header (and "
                                                     "finetune.datasetTokens)")
    parser.add_argument("--data", type=Path, help="a local copy of the data, its tokens counted (characters / 4)")
    parser.add_argument("--fields", help="with --data: the records' fields that train, comma-separated")
    parser.add_argument("--epochs", type=float, default=1.0, help="passes over the data (default 1)")
    parser.add_argument("--force", action="store_true", help="replace an existing Pulumi.<stack>.yaml")
    parser.add_argument("--dir", type=Path, default=PROJECT_DIR, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _command(args: argparse.Namespace) -> str:
    parts = [f"MODEL={args.model}" if args.model else f"PARAMETERS={args.parameters:g}", f"MODE={args.mode}"]
    parts += [f"{k}={v}" for k, v in (("PRECISION", args.precision if args.precision != "bf16" else None),
                                      ("REGION", args.region if args.region != "us-central1" else None),
                                      ("BUDGET", args.budget), ("TOKENS", args.tokens and f"{args.tokens:.0f}"),
                                      ("DATA", args.data), ("FIELDS", args.fields),
                                      ("EPOCHS", f"{args.epochs:g}" if args.epochs != 1 else None)) if v is not None]
    return "make gpus " + " ".join([*parts, f"WRITE={args.stack}"])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.mode not in stack_writer.WORKLOADS:
        hint = did_you_mean(args.mode, stack_writer.WORKLOADS)
        print(f"error: MODE={args.mode}: write knows {', '.join(stack_writer.WORKLOADS)}{hint}", file=sys.stderr)
        return 2
    path = args.dir / f"Pulumi.{args.stack}.yaml"
    if path.exists() and not args.force:
        print(f"error: {path.name} exists; choose another WRITE= name (or pass --force to replace it)", file=sys.stderr)
        return 2
    cat = gpu_catalog.load()
    try:
        model = given_shape(resolve(args.model, args.parameters), args.vocab, args.hidden, args.largest_layer)
        request = mode_request(args.mode, model, args.precision, args.seq, args.batch)
        # A Hugging Face id as MODEL is what the pods download; a name or a size takes data/models.yaml's id.
        model_id = args.model if args.model and "/" in args.model else None
        tokens = run_estimate.given_tokens(args.tokens, args.data, args.fields, args.epochs)
        choice = choose(request, args.region, args.stack, args.budget, cat, model_id, writer=args.mode, tokens=tokens)
    except (ValueError, NoPlanError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"error: DATA={args.data}: {err.strerror or err}", file=sys.stderr)
        return 2
    text = stack_writer.render(choice.candidate, header(choice, request, args.region, args.stack, _command(args), cat,
                                                        tokens))
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path.name}: {stack_writer.summary_line(choice.candidate)}; ${choice.running_per_hour:,.2f}/h with "
          f"the workload running. Next: make preview STACK={args.stack}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
