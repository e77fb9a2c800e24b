"""Write the planner's cheapest plan as a stack that previews: `make gpus MODEL=... MODE=... WRITE=<stack>`.

    python -m preview.write_stack --model Llama-3.1-8B --mode training --stack llama8b [--region R] [--budget 5]

The planner lists every option that holds the model (planner/recommend.py), cheapest first; each is written as a
stack config (planner/stack_writer.py) and loaded through the stack's own checks (the rules `make preview` runs),
and the first they accept, within the budget, is written to Pulumi.<stack>.yaml with its reasons as comments.
Cheaper options the checks refused are listed in the file with the first reason. It sits in the preview layer
because it runs the checks; the plan itself is the planner's.

`--serve 1` (SERVE=1; the default for MODE=finetune, the fine-tune-and-serve journey: a model nobody can query is
half the job) adds the server of the result: each trainer with each of the cheapest servers the inference plan
gives, cheapest pair first, within the budget with both running (the server's node is up, waiting, while it
trains). `--serve 0` writes the trainer alone.

Exit codes: 0 written; 2 a usage error, an unknown model, or no option the checks accept within the budget.
"""

from __future__ import annotations

import argparse
import datetime
import math
import re
import sys
from pathlib import Path

import msgspec

from checks import load
from checks.platform import cluster_name_problem
from model import catalog as gpu_catalog
from model import chat_templates, reservation
from model.config import ConfigError
from model.config_read import secret_ways
from model.gated_models import gated_family
from model.suggest import did_you_mean
from model.training_blocks import hub_ids
from model.types import StackConfig
from planner import cli, run_estimate, spill, stack_writer
from planner.cost import stack_costs
from planner.held import Held, Reservation, held_capacity
from planner.model_catalog import given_shape, hub_id, resolve
from planner.pool_cost import SERVING, TRAINING
from planner.recommend import RANKS, rank_line, speed_key
from planner.requests import mode_request
from planner.sizing import BYTES_PER_PARAM
from planner.sizing_types import Request
from planner.training_notes import record_formats, steps_line
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
    spot_per_hour: float = 0.0  # the training run's $/h with its GPU nodes at the spot price (its other price)
    serving_per_hour: float | None = None  # with a server of the result: the stack's $/h serving alone
    training_per_hour: float | None = None  # with a server: the stack's $/h training alone (what a run costs)
    run: dict | None = None  # the `costs` output's run of its finetune workload, as `make preview` shows it


def _problem_line(problem: str, limit: int = 220) -> str:
    return problem if len(problem) <= limit else problem[:limit - 1] + "…"


def gated_model(candidate: stack_writer.Candidate) -> str | None:
    """The gated Hugging Face id (data/gated_models.yaml) a candidate's workload downloads, if any."""
    for w in (candidate.config.get("deepspeed-stack:workloads") or {}).values():
        model_id = (w.get("serving") or {}).get("model") or (w.get("finetune") or {}).get("model")
        # An MPIJob names the model in its script's arguments (--model ID): downloaded as well.
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


def proposed_save_steps(costs: dict) -> dict[str, int]:
    """Each run whose saves take more than the warning's share (planner/run_hours.py) -> the saveSteps Young/Daly
    proposes (the smaller of the two ends': saves a little more often, never less)."""
    return {name: min(r["saves"]["proposedSaveSteps"]) for name, r in (costs.get("runs") or {}).items()
            if r.get("saves", {}).get("warning")}


def with_save_steps(candidate: stack_writer.Candidate, steps: dict[str, int]) -> stack_writer.Candidate:
    """The candidate with finetune.saveSteps of the named workloads set."""
    config = dict(candidate.config)
    workloads = {name: dict(w) for name, w in (config.get("deepspeed-stack:workloads") or {}).items()}
    for name, every in steps.items():
        workloads[name]["finetune"] = {**workloads[name]["finetune"], "saveSteps": every}
    config["deepspeed-stack:workloads"] = workloads
    return msgspec.structs.replace(candidate, config=config)


def _loaded(candidate: stack_writer.Candidate, gated: str | None) -> StackConfig:
    """The candidate through the stack's own checks (ConfigError with their problems)."""
    config, secret_keys = engine_config_from_yaml(candidate.config)
    if gated:  # checked as it will run: after the user's `pulumi config set --secret hfToken` (header says so)
        config["deepspeed-stack:hfToken"] = SECRET
        secret_keys = [*secret_keys, "deepspeed-stack:hfToken"]
    return load(config, set(secret_keys))


def candidates(request: Request, region: str, stack: str, cat: gpu_catalog.Catalog | None, model_id: str | None,
               writer: str | None, serve: bool, held: Held | None = None, rank: str = "cost",
               res: Reservation | None = None) -> list[stack_writer.Candidate]:
    """The writer's candidates, cheapest first; with `serve`, each trainer with the server of its result, sized by
    the inference plan of the same model (`make gpus MODE=inference` with the same SEQ, BATCH and PRECISION).
    `held`: the capacity the user holds (GPUS=), where the trainer plans; the server has a pool of its own."""
    trainers = stack_writer.candidates(request, region, stack, cat, model_id=model_id, writer=writer, held=held)
    if rank == "speed":  # by time per run, then $ per run (the writer's order is $/h)
        catalog = cat or gpu_catalog.load()
        trainers = sorted(trainers, key=lambda c: speed_key(request, c.strategy, c.option, catalog))
    if res is not None and request.mode != stack_writer.INFERENCE:
        trainers = [stack_writer.with_reservation(c, res) for c in trainers]
    if not serve:
        return trainers
    served = mode_request(stack_writer.INFERENCE, request.model, request.precision, request.sequence_length,
                          request.batch_size)
    servers = stack_writer.candidates(served, region, stack, cat, model_id=model_id, writer=stack_writer.INFERENCE)
    paired = stack_writer.with_servers(trainers, servers)
    if rank != "speed":
        return paired
    # Each trainer's servers stay cheapest first; the trainers keep their speed order.
    order = {id(t.option): i for i, t in enumerate(trainers)}
    return sorted(paired, key=lambda c: order.get(id(c.option), len(order)))


def running_cost(costs: dict, candidate: stack_writer.Candidate, mode: str) -> float:
    """$/h with what the stack runs at once: the trainer and the server of its result (its node up, waiting) when
    it has one, else the workload of the mode."""
    return costs["running"]["all" if candidate.server else ROLE[mode]]["perHour"]


def choose(request: Request, region: str, stack: str, budget: float | None = None,
           cat: gpu_catalog.Catalog | None = None, model_id: str | None = None, writer: str | None = None,
           tokens: run_estimate.GivenTokens | None = None, serve: bool = False, held: Held | None = None,
           rank: str = "cost", res: Reservation | None = None) -> Choice:
    """The cheapest candidate whose config the checks accept and whose $/h with the workload running (with its
    server too, `serve`) is within `budget` (None: any). `tokens`: the run's, written into a finetune workload's
    keys. `held`: the capacity the user holds (GPUS=): the training plans on it only."""
    refused: list[tuple[stack_writer.Candidate, str]] = []
    over_budget: list[float] = []  # $/h of the candidates the checks accept, refused for the budget only
    for candidate in candidates(request, region, stack, cat, model_id, writer, serve, held, rank, res)[:MAX_TRIES]:
        candidate = with_tokens(candidate, tokens)
        gated = gated_model(candidate)
        try:
            model = _loaded(candidate, gated)
            costs = stack_costs(model, cat)
            if steps := proposed_save_steps(costs):  # saves that weigh too much: Young/Daly's interval instead
                candidate = with_save_steps(candidate, steps)
                model = _loaded(candidate, gated)
                costs = stack_costs(model, cat)
        except ConfigError as err:
            refused.append((candidate, _problem_line(err.problems[0])))
            continue
        running = running_cost(costs, candidate, request.mode)
        if budget is not None and running > budget:
            what = (f"training and its server running ({cli.arg('--serve', 0)}: training alone)" if candidate.server
                    else "the workload running")
            refused.append((candidate, f"${running:,.2f}/h with {what}, over the budget ${budget:,.2f}/h"))
            over_budget.append(running)
            continue
        # A run is priced as `make preview` prices it: the training alone (the server is the serving's cost).
        training = costs["running"][ROLE[request.mode]]["perHour"]
        spot = training - candidate.option.on_demand + candidate.option.spot  # the writer's pools are on-demand
        serving = costs["running"][SERVING]["perHour"] if candidate.server else None
        run = next((r for r in (costs.get("runs") or {}).values() if "missing" not in r), None)
        return Choice(candidate, running, costs["floorPerHour"], refused, gated, round(spot, 4), serving,
                      training if candidate.server else None, run)
    reasons = "; ".join(f"{c.label}: {why}" for c, why in refused[:3]) or "the planner found no option"
    on_held = f" on the held {held.describe()} ({cli.arg('--gpus', held.spec)})" if held else ""
    works = (f"; the cheapest the checks accept costs ${min(over_budget):,.2f}/h: {cli.arg('--budget', '')}"
             f"{math.ceil(round(min(over_budget) * 100, 6)) / 100:.2f} or more would write it" if over_budget else "")
    raise NoPlanError(f"no plan for {request.model.name} in {region}{on_held} that the stack's checks accept"
                      f"{' within the budget' if budget is not None else ''} ({reasons}){works}")


def run_line(choice: Choice, request: Request, tokens: run_estimate.GivenTokens | None,
             cat: gpu_catalog.Catalog) -> list[str]:
    """The run in all, as `make preview` of the written stack shows it (the `costs` output's run): its hours with
    the saves and the data step, and $ at the stack's $/h while it trains, every node up meanwhile."""
    r = choice.run
    if tokens is None or request.mode != "training" or r is None:
        return []
    hours, on_demand, spot = r["hours"], r["perRun"]["onDemand"], r["perRun"]["spot"]
    fast, slow = (run_estimate.format_hours(hours[k]) for k in ("fast", "slow"))
    return [f"Estimated run: {tokens.total:,.0f} tokens ({tokens.said}): about {fast}–{slow} h, "
            f"${on_demand['fast']:,.2f}–${on_demand['slow']:,.2f} per run on-demand, ${spot['fast']:,.2f}–"
            f"${spot['slow']:,.2f} spot, with its saves and data step, at an MFU of {r['mfu']['low']:.0%}–"
            f"{r['mfu']['high']:.0%} from measured runs (data/training_speed.yaml: {', '.join(r['evidence'])}; "
            "`make gpus` without WRITE= ranks every option by cost per run).",
            *steps_line(choice.candidate.config, request, tokens.total)]


def _cost_line(choice: Choice, region: str, stack: str, cat: gpu_catalog.Catalog) -> str:
    where = (f"estimates, {cat.prices_of(region)}, from data/gpu_catalog.yaml, {cat.date}; `make preview "
             f"STACK={stack}` shows the breakdown")
    if choice.serving_per_hour is None:
        return (f"Estimated cost: ${choice.running_per_hour:,.2f}/h with the workload running, "
                f"${choice.floor_per_hour:,.2f}/h at rest ({where}).")
    return (f"Estimated cost: ${choice.running_per_hour:,.2f}/h while it trains, with the server's node up and "
            f"waiting; ${choice.serving_per_hour:,.2f}/h serving alone; ${choice.floor_per_hour:,.2f}/h at rest "
            f"({where}).")


def next_steps(choice: Choice, stack: str) -> list[str]:
    """What to do with the written file, in order: every step a newcomer needs, each command as it is typed; the
    data's way into the bucket path the stack reads, and the server's way to a prompt."""
    workloads = choice.candidate.config.get("deepspeed-stack:workloads") or {}
    steps = ["Set gcp:project below (your project id).",
             f"`pulumi stack init {stack}` creates the stack in your Pulumi backend; this file is its config."]
    if choice.gated_model:
        steps.append(f"`pulumi config set --secret hfToken hf_... -s {stack}`: {choice.gated_model} is gated (above).")
    steps += [f"`make preview STACK={stack}` checks it offline and shows what `pulumi up` creates and costs.",
              f"`pulumi up -s {stack}`."]
    for name, w in workloads.items():
        data = (w.get("finetune") or {}).get("datasetPath")
        if data:
            steps.append(f"Your data (JSON lines of {record_formats()}: the first record's fields tell which, "
                         f"or set workloads.{name}.finetune.recordFormat), checked on your machine first with `make "
                         f"check-data DATA=train.jsonl MODEL={w['finetune'].get('model', 'a local folder')}` (a "
                         "local folder or a Hugging Face id in your cache), where the stack reads it "
                         f"(workloads.{name}.finetune.datasetPath, in the bucket `pulumi up` created): "
                         f"`gcloud storage cp train.jsonl gs://$(pulumi stack output bucket -s {stack})/{data}`; "
                         f"the launcher waits for it. Follow the run: `kubectl logs -n {w['namespace']} -f "
                         f"job/{name}-launcher`.")
    for name, w in workloads.items():
        if w.get("kind") == "serve":
            trainer = w["serving"].get("fromWorkload")
            waits = f" once {trainer} has written its model (the server's pod waits in Init until then)" if trainer \
                else ""
            ft = (workloads.get(trainer) or {}).get("finetune") or {} if trainer else {}
            # Asked the way it was trained: through the chat template on the chat endpoint, or raw.
            chat = " --chat" if ft and chat_templates.asked_on_chat(
                ft.get("chatTemplate", chat_templates.AUTO), ft.get("recordFormat", "auto"), ft.get("model")) else ""
            steps.append(f"A prompt{waits}: `kubectl -n {w['namespace']} port-forward svc/{name} 8000:8000 &`, then "
                         f"`python -m recipes.send_prompt --openai{chat} --url http://localhost:8000 --model "
                         f"{trainer or w['serving']['model']} \"What is DeepSpeed?\"`.")
    return ["Next:", *(f"  {i}. {step}" for i, step in enumerate(steps, 1))]


def reservation_line(choice: Choice, request: Request, tokens: run_estimate.GivenTokens | None,
                     res: Reservation | None, cat: gpu_catalog.Catalog) -> list[str]:
    """The reservation's end against the run: whether it ends in time if it starts now, or how many hours go to the
    DWS fallback and what they cost there (at most on-demand)."""
    if res is None:
        return []
    ends = f"Reservation {res.name} ({res.held.describe()}) ends {reservation.show(res.end)}"
    c = choice.candidate
    top = run_estimate.peak(cat, c.option.gpu_type, request.precision)
    if tokens is None or request.mode == stack_writer.INFERENCE or top is None:
        return [f"{ends}: give TOKENS= or DATA= for the hours of the run past it; `make preview` says it once "
                "finetune.datasetTokens is set."]
    e = run_estimate.estimate(tokens.total, request, c.strategy, c.option.gpus, top, gpu_type=c.option.gpu_type)
    s = spill.spill(e.hours_fast, e.hours_slow, reservation.now(), res.end)
    if not s.outlives:
        return [f"{ends}: a run that starts now ends before it, even at its slow end."]
    fast, slow = (run_estimate.format_hours(h) for h in (s.fast, s.slow))
    low, high = s.cost(c.option.on_demand)
    return [f"{ends}, {s.hours_left:,.1f} h after now ({reservation.show(s.start)}): a run that starts now goes "
            f"{fast}–{slow} h past it, on the DWS fallback pool (at most ${low:,.2f}–${high:,.2f} for the GPU nodes at "
            "the on-demand rate), from its newest checkpoint without a redeploy."]


def header(choice: Choice, request: Request, region: str, stack: str, command: str,
           cat: gpu_catalog.Catalog, tokens: run_estimate.GivenTokens | None = None,
           held: Held | None = None, rank: str = "cost", res: Reservation | None = None) -> list[str]:
    c, model = choice.candidate, request.model
    shape = "shape from data/models.yaml" if model.shape_known else "shape unknown: the planner's upper bounds"
    today = datetime.date.today().isoformat()
    lines = [
        f"{stack}: written by `{command}` ({today}).",
        f"{model.name}: {model.billions:.2f}B parameters ({shape}), {request.precision} {request.mode}"
        f"{f' ({request.training_label})' if request.mode == 'training' else ''}, sequence "
        f"{request.sequence_length} x batch {request.batch_size}, {region}.",
        f"Plan: {stack_writer.summary_line(c)}; the {'fastest' if rank == 'speed' else 'cheapest'} option "
        f"{f'on the capacity you hold ({held.describe()}, every node used) ' if held else ''}that holds it with "
        f"{stack_writer.HEADROOM:.0%} of each GPU free and that the stack's checks accept.",
        rank_line(rank),
        _cost_line(choice, region, stack, cat),
        *run_line(choice, request, tokens, cat),
        *reservation_line(choice, request, tokens, res, cat),
    ]
    if choice.refused:
        lines.append("Cheaper options the stack's checks refused (first reason each):")
        lines += [f"  - {rc.label}: {why}" for rc, why in choice.refused[:5]]
        if len(choice.refused) > 5:
            lines.append(f"  - and {len(choice.refused) - 5} more")
    if choice.gated_model:
        lines.append(f"{choice.gated_model} is gated on Hugging Face (data/gated_models.yaml): accept its terms on "
                     f"https://huggingface.co/{choice.gated_model} with your account, then give the stack a read "
                     f"token of it; without one the preview refuses the stack. {secret_ways('hfToken')[0].upper()}"
                     f"{secret_ways('hfToken')[1:]}.")
    return lines + next_steps(choice, stack)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = cli.Parser(prog="python -m preview.write_stack", description=__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", help="a known model (python -m planner --list), a Hugging Face id or its repository "
                                      "name (Qwen2.5-7B-Instruct), or a size (7B)")
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
    parser.add_argument("--serve", choices=["0", "1"], help="1: also the server of the result (the default for "
                                                            "finetune); 0: the trainer alone")
    parser.add_argument("--gpus", metavar="HELD", help="the capacity you hold (16xH100-MEGA, 2xa3-megagpu-8g): plan on "
                                                       "it only")
    parser.add_argument("--reservation", metavar="NAME:SIZE:END",
                        help="a specific reservation you hold (h100-res:2xa3-megagpu-8g:2026-12-04T00:00Z): the pool "
                             "consumes it, knows its end, and falls back to DWS")
    parser.add_argument("--rank", choices=RANKS, default="cost",
                        help="cost (default): the cheapest per hour; speed: the fastest per run, then the cheapest")
    parser.add_argument("--force", action="store_true", help="replace an existing Pulumi.<stack>.yaml")
    parser.add_argument("--dir", type=Path, default=PROJECT_DIR, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _command(args: argparse.Namespace) -> str:
    parts = [f"MODEL={args.model}" if args.model else f"PARAMETERS={args.parameters:g}", f"MODE={args.mode}"]
    parts += [f"{k}={v}" for k, v in (("PRECISION", args.precision if args.precision != "bf16" else None),
                                      ("REGION", args.region if args.region != "us-central1" else None),
                                      ("BUDGET", args.budget), ("TOKENS", args.tokens and f"{args.tokens:.0f}"),
                                      ("DATA", args.data), ("FIELDS", args.fields), ("GPUS", args.gpus),
                                      ("RESERVATION", args.reservation),
                                      ("RANK", args.rank if args.rank != "cost" else None),
                                      ("EPOCHS", f"{args.epochs:g}" if args.epochs != 1 else None)) if v is not None]
    return "make gpus " + " ".join([*parts, f"WRITE={args.stack}"])


def usage_problem(args: argparse.Namespace, cat: gpu_catalog.Catalog) -> str | None:
    """What is wrong with the arguments themselves, before any planning: the mode, the server, the stack's name
    (it names the cluster: the checks' own message), an existing file, the region (the planner's message)."""
    if args.mode not in stack_writer.WORKLOADS:
        return (f"{cli.arg('--mode', args.mode)}: write knows {', '.join(stack_writer.WORKLOADS)}"
                f"{did_you_mean(args.mode, stack_writer.WORKLOADS)}")
    if args.serve == "1" and args.mode == stack_writer.INFERENCE:
        return (f"{cli.arg('--serve', 1)} adds the server of what a training stack writes; "
                f"{cli.arg('--mode', args.mode)} writes a server already")
    if problem := cluster_name_problem(stack_writer.cluster_name(args.stack)):
        name = re.sub(r"[^a-z0-9-]+", "-", args.stack.lower()).strip("-")
        return (f"{cli.arg('--stack', args.stack)}: the stack's cluster is named after it (deepspeed-<stack>), and "
                f"{problem}; e.g. {cli.arg('--stack', name)}")
    path = args.dir / f"Pulumi.{args.stack}.yaml"
    if path.exists() and not args.force:
        return (f"{path.name} exists; choose another {cli.arg('--stack')} name (or "
                f"{cli.arg('--force')} to replace it)")
    return cli.region_error(args.region, cat)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cat = gpu_catalog.load()
    if problem := usage_problem(args, cat):
        print(f"error: {problem}", file=sys.stderr)
        return 2
    path = args.dir / f"Pulumi.{args.stack}.yaml"
    serve = args.serve == "1" if args.serve is not None else args.mode == stack_writer.FINETUNE
    try:
        model = given_shape(resolve(args.model, args.parameters), args.vocab, args.hidden, args.largest_layer)
        request = mode_request(args.mode, model, args.precision, args.seq, args.batch)
        # The Hugging Face id MODEL names (an id, or a repository name such as Qwen2.5-7B-Instruct) is what the pods
        # download; an entry's name or a size takes data/models.yaml's id.
        model_id = hub_id(args.model)
        tokens = run_estimate.given_tokens(args.tokens, args.data, args.fields, args.epochs)
        held, res = held_capacity(args.gpus, args.reservation, cat)
        choice = choose(request, args.region, args.stack, args.budget, cat, model_id, writer=args.mode, tokens=tokens,
                        serve=serve, held=held, rank=args.rank, res=res)
    except (ValueError, NoPlanError) as err:
        print(f"error: {cli.in_user_terms(str(err))}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"error: {cli.arg('--data', args.data)}: {err.strerror or err}", file=sys.stderr)
        return 2
    text = stack_writer.render(choice.candidate, header(choice, request, args.region, args.stack, _command(args), cat,
                                                        tokens, held, args.rank, res))
    path.write_text(text, encoding="utf-8")
    running = "while it trains, with the server's node up" if choice.candidate.server else "with the workload running"
    print(f"wrote {path.name}: {stack_writer.summary_line(choice.candidate)}; ${choice.running_per_hour:,.2f}/h "
          f"{running}. Next steps are at the top of the file: `pulumi stack init {args.stack}`, then "
          f"`make preview STACK={args.stack}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
