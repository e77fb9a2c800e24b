"""Which GPUs hold a model, cheapest first: `python -m planner --model Llama-2-7B --mode inference`.

Also `make gpus MODEL=Llama-2-70B MODE=training [PRECISION=bf16] [REGION=us-central1]`. A training or finetune plan
given the run's tokens (`--tokens`, or `--data FILE` to count a local copy of the data; `--epochs`) also says how long
each option takes and what it costs per run (planner/run_estimate.py), and ranks them by that.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import msgspec

from model import catalog as gpu_catalog
from model import reservation, training_speed
from planner import cli, past_runs, run_estimate, run_hours, spill
from planner.held import Held, Reservation, held_capacity
from planner.model_catalog import given_shape, model_names, resolve
from planner.recommend import MAX_NODES, RANKS, Option, Plan, rank_line, ranked, recommend, short_name
from planner.requests import mode_request
from planner.sizing import BYTES_PER_PARAM
from planner.sizing_types import HEADROOM, Request

DEFAULT_REGION = "us-central1"
MAX_OPTIONS = 1000  # more than the catalog's GPU types: every option of a plan


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = cli.Parser(prog="python -m planner", description=__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", help="a known model (see --list), its Hugging Face id or repository name "
                                       "(Qwen2.5-7B-Instruct), case ignored")
    what.add_argument("--parameters", type=float, metavar="B", help="parameters in billions (unknown shape)")
    what.add_argument("--list", action="store_true", help="list the known models and exit")
    parser.add_argument("--mode", choices=["inference", "training", "finetune"],
                        help="required with --model/--parameters (finetune: the finetune kind as it comes, LoRA "
                             "rank 16 on all-linear with gradient checkpointing; training: every parameter)")
    parser.add_argument("--vocab", type=int, help="vocabulary size (with --hidden) of a model not in data/models.yaml")
    parser.add_argument("--hidden", type=int, help="hidden size (with --vocab) of a model not in data/models.yaml")
    parser.add_argument("--largest-layer", type=float, metavar="M",
                        help="parameters of the largest layer in millions, for a model not in data/models.yaml")
    parser.add_argument("--precision", choices=list(BYTES_PER_PARAM), default="bf16")
    parser.add_argument("--region", default=DEFAULT_REGION, help=f"GCP region (default {DEFAULT_REGION})")
    parser.add_argument("--seq", type=int, default=2048, help="sequence length (default 2048)")
    parser.add_argument("--batch", type=int, default=1, help="sequences at once (default 1)")
    parser.add_argument("--top", type=int, default=5, help="options per plan (default 5)")
    parser.add_argument("--gpus", metavar="HELD",
                        help="the capacity you hold, e.g. 16xH100-MEGA or 2xa3-megagpu-8g: plan on it only (every "
                             "held node used: a reservation is paid whether they work or not)")
    parser.add_argument("--reservation", metavar="NAME:SIZE:END",
                        help="a specific reservation you hold, e.g. h100-res:2xa3-megagpu-8g:2026-12-04T00:00Z: plan "
                             "on its nodes (as --gpus), and say what of the run goes past its end and what that costs "
                             "on DWS flex-start or spot")
    parser.add_argument("--rank", choices=RANKS, default="cost",
                        help="cost (default): options by $/h; speed: by time per run, then $ per run")
    parser.add_argument("--max-nodes", type=int, default=MAX_NODES, help=f"nodes per option (default {MAX_NODES})")
    tokens = parser.add_mutually_exclusive_group()
    tokens.add_argument("--tokens", type=float, metavar="N",
                        help="tokens of the data (training, finetune): hours and $ per run of each option")
    tokens.add_argument("--data", type=Path, metavar="FILE",
                        help="a local .jsonl/.json/.txt copy of the data: its tokens counted as characters / 4")
    parser.add_argument("--fields", help="with --data: the records' fields that train, comma-separated (default: "
                                         "every string field)")
    parser.add_argument("--epochs", type=float, default=1.0, help="passes over the data (default 1)")
    parser.add_argument("--runs", type=Path, metavar="FOLDER",
                        help="a folder of earlier runs' run.json (copied from the bucket, as the preview's Training "
                             "section says): those of the same model, LoRA or full, and how far their estimates were "
                             "off")
    args = parser.parse_args(argv)
    if not args.list and args.mode is None:
        parser.error(f"{cli.arg('--mode', 'inference|training|finetune')} is required")
    if args.seq < 1 or args.batch < 1 or args.top < 1 or args.max_nodes < 1:
        parser.error("--seq, --batch, --top and --max-nodes must be at least 1")
    if (args.tokens is not None or args.data is not None) and args.mode == "inference":
        parser.error(f"{cli.arg('--tokens')}/{cli.arg('--data')} estimate a training run: give "
                     f"{cli.arg('--mode', 'training')} or finetune")
    if (args.tokens is not None and args.tokens <= 0) or args.epochs <= 0:
        parser.error("--tokens and --epochs must be more than 0")
    if args.fields and args.data is None:
        parser.error("--fields names the fields of --data")
    return args


def _serving_note(request: Request) -> list[str]:
    """How inference options are chosen: what the `serve` kind's engine can run (planner/recommend.py)."""
    if request.mode != "inference":
        return []
    e = request.serving_engine
    budget = f", within --gpu-memory-utilization {e.gpu_memory_utilization:.2f}" if e.gpu_memory_utilization else ""
    across = (f"; where no single node of a GPU holds the model, one replica spans the fewest nodes of it that do "
              f"(at most {e.max_nodes_per_replica}: tensor-parallel within each node, pipeline-parallel across them, "
              "a LeaderWorkerSet)" if e.multi_node else "; the engine spans no nodes in this stack")
    return [f"Served by {e.display_name} (the serve kind's default engine{budget}): one node per replica, the "
            "model tensor-parallel over all of its GPUs (a split the attention heads allow), on GPUs and in a "
            f"precision the engine serves there{across}."]


class Priced(msgspec.Struct, frozen=True):
    """An option with its run's estimate: hours fast and slow, and $ per run at on-demand and spot prices."""

    plan: str
    option: Option
    run: run_estimate.RunEstimate

    @property
    def on_demand(self) -> tuple[float, float]:
        return self.run.cost(self.option.on_demand)

    @property
    def spot(self) -> tuple[float, float]:
        return self.run.cost(self.option.spot)


def priced(request: Request, plans: list[Plan], tokens: float, cat: gpu_catalog.Catalog) -> list[Priced]:
    """Every option whose GPU has a peak in the request's precision, with its run's estimate."""
    out = []
    for plan in plans:
        for o in plan.options:
            top = run_estimate.peak(cat, o.gpu_type, request.precision)
            if top is not None:
                out.append(Priced(plan.strategy.label, o,
                                  run_estimate.estimate(tokens, request, plan.strategy, o.gpus, top,
                                                        gpu_type=o.gpu_type)))
    return out


def _dollars(pair: tuple[float, float]) -> str:
    return f"{pair[0]:,.2f}–{pair[1]:,.2f}"


def _money(pair: tuple[float, float]) -> str:
    return f"${pair[0]:,.2f}–${pair[1]:,.2f}"


def _run_cells(p: Priced | None) -> str:
    if p is None:
        return f"  {'—':>12} {'—':>20}"
    return f"  {run_estimate.hours_range(p.run):>12} {_dollars(p.on_demand):>20}"


def _notes(found: list[Priced]) -> str:
    notes = found[0].run.notes if found else ()
    return f"; {'; '.join(notes)}" if notes else ""


def _per_run_lines(request: Request, found: list[Priced], tokens: float, said: str, top: int,
                   rank: str = "cost") -> list[str]:
    """The options by $ per run (on-demand), or by time then $ per run (rank speed), and whether the cheapest per
    hour is the cheapest per run."""
    speed = training_speed.load()
    title = "By time per run, then cost per run" if rank == "speed" else "By cost per run"
    lines = [f"## {title}: {tokens:,.0f} tokens ({said})",
             f"  Hours and $ are ranges over the MFU measured runs reach (data/training_speed.yaml throughput, "
             f"{speed.date}: {', '.join(found[0].run.evidence) if found else '-'}{_notes(found)}) on each GPU's "
             f"peak dense {request.precision} TFLOPS (data/gpu_catalog.yaml); the training only: the nodes, without "
             "the saves, the data step, the cluster's own $/h, restarts after preemption or the download (`make "
             "preview` of the written stack counts the saves and the nodes that wait).",
             f"  {'GPUs':<18} {'how':<34} {'hours per run':>14} {'on-demand $ per run':>20} {'spot $ per run':>18} "
             f"{'$/h':>8}  MFU"]
    by_run = sorted(found, key=lambda p: (round(p.on_demand[0], 6), p.option.sort_key()))
    shown = sorted(found, key=lambda p: (round(p.run.hours_fast, 6), round(p.on_demand[0], 6))) \
        if rank == "speed" else by_run
    for p, plans in _alike(shown)[:top]:
        gpus = f"{p.option.gpus} x {short_name(p.option.gpu_name)}"
        lines.append(f"  {gpus:<18} {plans:<34} {run_estimate.hours_range(p.run):>14} {_dollars(p.on_demand):>20} "
                     f"{_dollars(p.spot):>18} {p.option.on_demand:>8.2f}  {run_estimate.mfu_range(p.run)}")
    per_hour = min(found, key=lambda p: p.option.sort_key())
    best = by_run[0]
    if best is not per_hour and best.on_demand[0] < per_hour.on_demand[0]:
        lines.append(f"  The cheapest per hour is not the cheapest per run: {_describe(per_hour)} costs "
                     f"${per_hour.option.on_demand:,.2f}/h but {_money(per_hour.on_demand)} per run "
                     f"({run_estimate.hours_range(per_hour.run)}); {_describe(best)} costs "
                     f"${best.option.on_demand:,.2f}/h and {_money(best.on_demand)} per run "
                     f"({run_estimate.hours_range(best.run)}).")
    else:
        lines.append(f"  The cheapest per hour is also the cheapest per run: {_describe(best)}.")
    return [*lines, *_data_step_line(best, tokens), ""]


def _data_step_line(best: Priced, tokens: float) -> list[str]:
    """How long the data step takes on the cheapest per run's first worker (text .. chat records)."""
    o = best.option
    cpus = run_hours.machine_worker(o.gpu_type, o.machine_type, o.gpus_per_node)
    if cpus is None:
        return []
    step = run_hours.tokenizing(tokens, ("text", "chat"), cpus, training_speed.load())
    took = " to ".join(f"{run_estimate.format_hours(h)} h ({kind})" for kind, h in step.by_kind.items())
    return [f"  The data step (every record tokenized once, before the ranks; not in the hours above): {took} in "
            f"{cpus.on} (data/training_speed.yaml tokenization rates)."]


def _alike(by_run: list[Priced]) -> list[tuple[Priced, str]]:
    """One row per machine set and run: strategies that cost the same on the same machines share it (LoRA's ZeRO-0
    to ZeRO-2 on one GPU)."""
    rows: dict[tuple, tuple[Priced, list[str]]] = {}
    for p in by_run:
        key = (p.option.gpu_type, p.option.machine_type, p.option.nodes, round(p.on_demand[0], 2))
        rows.setdefault(key, (p, []))[1].append(p.plan)
    return [(p, plans[0] + (f" (+{len(plans) - 1} alike)" if len(plans) > 1 else "")) for p, plans in rows.values()]


def _describe(p: Priced) -> str:
    return f"{p.plan} on {p.option.describe()}"


def _held_note(held: Held | None, request: Request) -> list[str]:
    if held is None:
        return []
    if request.mode == "inference":
        nodes = ("one node per replica, or as few of them as hold one replica where a node does not (within the "
                 "count held)")
    else:
        nodes = ("all of them in every option (a reservation is paid whether its nodes work or not)"
                 if held.count is not None else "any number of them")
    return [f"On the capacity you hold only (GPUS={held.spec}): {held.describe()}, {nodes}."]


def _reservation_lines(res: Reservation | None, found: list[Priced], rank: str, top: int,
                       tokens_given: bool = False) -> list[str]:
    """What the reservation costs until its end, used or not, and for each option what of the run goes past the
    end if it starts now, and what those hours cost on DWS flex-start (at most on-demand) or spot."""
    if res is None:
        return []
    now = reservation.now()
    left = max(0.0, reservation.hours_until(res.end, now))
    rate = found[0].option.on_demand if found else None
    paid = f", about ${left * rate:,.2f} at the on-demand ${rate:,.2f}/h" if rate is not None else ""
    lines = [f"## The reservation {res.name}: {res.held.describe()} until {reservation.show(res.end)}",
             f"  {left:,.1f} h from now ({reservation.show(now)}); paid whether its nodes work or not{paid}. A run "
             "that starts now uses it to its end; what is left then runs on the same machines from DWS flex-start "
             "(at most the on-demand rate: the catalog has no DWS discount, data/capacity.yaml) or spot "
             "(reclaimable), paid on top, from the newest checkpoint."]
    if not found:
        why = ("nothing above fits the reservation, so no run to set against its end" if tokens_given else
               "Give TOKENS= or DATA= for each option's hours past the end.")
        return [*lines, f"  {why}", ""]
    lines.append(f"  {'GPUs':<18} {'how':<34} {'hours per run':>14} {'past the end':>13} {'DWS $ then':>20} "
                 f"{'spot $ then':>18}")
    order = (lambda p: (round(p.run.hours_fast, 6), round(p.on_demand[0], 6))) if rank == "speed" else \
        (lambda p: p.option.sort_key())
    for p in sorted(found, key=order)[:top]:
        s = spill.spill(p.run.hours_fast, p.run.hours_slow, now, res.end)
        past = (f"{run_estimate.format_hours(s.fast)}–{run_estimate.format_hours(s.slow)} h" if s.outlives
                else "none")
        dws = _dollars(s.cost(p.option.on_demand)) if s.outlives else "—"
        spot = _dollars(s.cost(p.option.spot)) if s.outlives else "—"
        gpus = f"{p.option.gpus} x {short_name(p.option.gpu_name)}"
        lines.append(f"  {gpus:<18} {p.plan:<34} {run_estimate.hours_range(p.run):>14} {past:>13} {dws:>20} "
                     f"{spot:>18}")
    return [*lines, ""]


def render(request: Request, region: str, plans: list[Plan], cat: gpu_catalog.Catalog,
           tokens: run_estimate.GivenTokens | None = None, top: int = 5, held: Held | None = None,
           rank: str = "cost", res: Reservation | None = None, every: list[Plan] | None = None) -> str:
    """The plans' tables, cheapest per hour first; given the run's tokens (and how they were counted), each option's
    hours and $ per run, and the options by $ per run: over `every` option (the tables show `plans`, the top of
    them), so that the cheapest per run is never left out of the summary."""
    model = request.model
    shape = "shape from data/models.yaml" if model.shape_known else "shape unknown: Llama-like fallback"
    how = f" ({request.training_label})" if request.mode == "training" else ""
    lines = [f"{model.name}: {model.billions:.2f}B parameters ({shape}), {request.precision} {request.mode}{how}, "
             f"sequence {request.sequence_length} x batch {request.batch_size}, region {region}",
             f"Options keep {HEADROOM:.0%} of each GPU's memory free. Prices are estimates in {cat.currency}, "
             f"{cat.prices_of(region)} (data/gpu_catalog.yaml, {cat.date}).", *_serving_note(request),
             *_held_note(held, request), rank_line(rank), ""]
    plans, folded = one_gpu_tables(plans)
    lines += folded
    every = one_gpu_tables(every)[0] if every else None  # the per-run summary leaves out what the tables do
    found = priced(request, every or plans, tokens.total, cat) if tokens else []
    runs = {(p.plan, id(p.option)): p for p in found}
    for plan in plans:
        lines.append(f"## {plan.strategy.label}")
        if not plan.options:
            lines += [f"  the held {held.describe()} cannot hold it this way" if held else
                      "  nothing in the catalog holds it in this region", ""]
            continue
        per_run = f"  {'hours per run':>12} {'on-demand $ per run':>20}" if tokens else ""
        lines.append(f"  {'GPUs':<18} {'machines':<22} {'GB per GPU':>11} {'on-demand $/h':>14} {'spot $/h':>9}"
                     f"{per_run}  zones")
        for o in plan.options:
            gpus, machines = f"{o.gpus} x {short_name(o.gpu_name)}", f"{o.nodes} x {o.machine_type}"
            memory = f"{o.per_gpu_gb:.1f} of {o.memory_gb:g}"
            cpu = o.estimate.cpu_gb_per_node
            offload = (f" (offload: {cpu:.0f} of the {o.pod_memory_gb:.1f} GB a worker pod may use on the "
                       f"{o.machine_memory_gb:g} GiB machine)") if cpu else ""
            if o.multi_node_replica:  # no node of this GPU holds it: one replica across nodes
                offload += (f" (one replica across {o.nodes} nodes: tensor-parallel {o.gpus_per_node} x "
                            f"pipeline-parallel {o.nodes}, serving.nodesPerReplica: {o.nodes})")
            cells = _run_cells(runs.get((plan.strategy.label, id(o)))) if tokens else ""
            lines.append(f"  {gpus:<18} {machines:<22} {memory:>11} {o.on_demand:>14.2f} {o.spot:>9.2f}{cells}  "
                         f"{', '.join(o.zones)}{offload}")
        lines.append("")
    if tokens and found:
        lines += _per_run_lines(request, found, tokens.total, tokens.said, top, rank)
    lines += _reservation_lines(res, found, rank, top, tokens is not None)
    return "\n".join(lines)


def one_gpu_tables(plans: list[Plan]) -> tuple[list[Plan], list[str]]:
    """Where every option is one GPU, ZeRO's stages shard over a single rank and save nothing: one table per
    offload choice (its lowest stage), and a line saying which were left out (issue 40: six near-identical tables)."""
    training = [p for p in plans if p.strategy.training and p.options]
    if len(training) < 2 or any(o.gpus != 1 for p in training for o in p.options):
        return plans, []
    kept: dict[tuple[bool, bool], Plan] = {}
    for p in sorted(training, key=lambda p: p.strategy.zero_stage or 0):
        kept.setdefault((p.strategy.offload_optimizer, p.strategy.offload_params), p)
    left_out = [p.strategy.label for p in training if p not in kept.values()]
    if not left_out:
        return plans, []
    shown = [p for p in plans if p in kept.values() or not p.strategy.training or not p.options]
    return shown, [f"On one GPU ZeRO partitions over a single rank and saves no memory: {', '.join(left_out)} left "
                   f"out (within {_spread(training):.1f} GB per GPU of the table of the same offload shown).", ""]


def _spread(plans: list[Plan]) -> float:
    """The widest difference in GB per GPU between plans of the same offload choice, for the note above."""
    groups: dict[tuple[bool, bool], list[float]] = {}
    for p in plans:
        groups.setdefault((p.strategy.offload_optimizer, p.strategy.offload_params), []).append(p.options[0].per_gpu_gb)
    return max(max(g) - min(g) for g in groups.values())


def past_run_lines(request: Request, plans: list[Plan], folder: Path) -> list[str]:
    """`RUNS=`: the earlier runs of this model (LoRA or full) and how far their estimates were off, each said
    against the options of its GPU type, count and ZeRO stage."""
    runs, skipped = past_runs.read_runs(folder)
    alike = past_runs.same_shape(runs, request.model.name, request.lora is not None)
    options = {(o.gpu_type, o.gpus, p.strategy.zero_stage) for p in plans for o in p.options}
    lines = [f"## Earlier runs of {request.model.name} ({'LoRA' if request.lora else 'full'}) in {folder}: "
             f"{len(alike)} of {len(runs)} run record(s); x: measured over estimated"]
    for run in alike:
        s = run.shape
        mark = ("same GPU, count and ZeRO stage as an option above" if (s.gpu, s.gpus, s.zero_stage) in options
                else "no option above has its GPU, count and ZeRO stage")
        lines.append(f"  {past_runs.off_by(run)} [{mark}]")
    if not alike:
        lines.append("  none of the same model and LoRA/full")
    lines += [f"  skipped {line}" for line in skipped]
    return [*lines, ""]


def run_tokens(args: argparse.Namespace) -> run_estimate.GivenTokens | None:
    return run_estimate.given_tokens(args.tokens, args.data, args.fields, args.epochs)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        print("\n".join(model_names()))
        return 0
    cat = gpu_catalog.load()
    if problem := cli.region_error(args.region, cat):
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        model = given_shape(resolve(args.model, args.parameters), args.vocab, args.hidden, args.largest_layer)
        request = mode_request(args.mode, model, args.precision, args.seq, args.batch)
        held, res = held_capacity(args.gpus, args.reservation, cat)
        # Speed re-sorts what recommend sorted by $/h: every option first, then the top of them.
        every = recommend(request, args.region, cat, max_nodes=args.max_nodes,
                          top=args.top if args.rank == "cost" else MAX_OPTIONS, held=held)
        plans = ranked(request, every, cat, args.rank, args.top)
        tokens = run_tokens(args)
    except ValueError as err:  # an unknown model (UnknownModelError), int8/int4 training, unreadable DATA
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"error: {cli.arg('--data', args.data)}: {err.strerror or err}", file=sys.stderr)
        return 2
    try:
        past = past_run_lines(request, every, args.runs) if args.runs else []
    except OSError as err:
        print(f"error: {cli.arg('--runs', args.runs)}: {err.strerror or err}", file=sys.stderr)
        return 2
    print(render(request, args.region, plans, cat, tokens, args.top, held, args.rank, res, every))
    if past:
        print("\n".join(past))
    if held is not None and not any(p.options for p in plans):
        print(f"error: nothing holds {request.model.name} ({request.mode}) on the held {held.describe()} "
              f"({cli.arg('--reservation' if res else '--gpus', res.spec if res else held.spec)}): every ZeRO stage "
              "and offload variant needs more GPU memory (or node memory) than it has, as each table says; hold "
              "more nodes, or plan without it to see what would", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
