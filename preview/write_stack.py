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
import re
import sys
from pathlib import Path

from checks.platform import cluster_name_problem
from model import catalog as gpu_catalog
from model.suggest import did_you_mean
from planner import cli, run_estimate, stack_writer
from planner.held import held_capacity
from planner.model_catalog import given_shape, hub_id, resolve
from planner.recommend import RANKS
from planner.requests import mode_request
from planner.sizing import BYTES_PER_PARAM
from preview.engine import PROJECT_DIR
from preview.write_stack_choice import NoPlanError, choose
from preview.write_stack_header import header

# This module is the command line; the plan is chosen in write_stack_choice.py and its header written in
# write_stack_header.py. (The docstring above is --help's text.)


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
