"""Which GPUs hold a model, cheapest first: `python -m planner --model Llama-2-7B --mode inference`.

Also `make gpus MODEL=Llama-2-70B MODE=training [PRECISION=bf16] [REGION=us-central1]`.
"""

from __future__ import annotations

import argparse
import sys

from model import catalog as gpu_catalog
from model.suggest import did_you_mean
from planner.recommend import MAX_NODES, Plan, recommend, short_name
from planner.requests import mode_request
from planner.sizing import BYTES_PER_PARAM, HEADROOM, Request, given_shape, model_names, resolve

DEFAULT_REGION = "us-central1"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m planner", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", help="a known model (see --list) or a Hugging Face id listed in data/models.yaml")
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
    parser.add_argument("--max-nodes", type=int, default=MAX_NODES, help=f"nodes per option (default {MAX_NODES})")
    args = parser.parse_args(argv)
    if not args.list and args.mode is None:
        parser.error("--mode inference|training|finetune is required")
    if args.seq < 1 or args.batch < 1 or args.top < 1 or args.max_nodes < 1:
        parser.error("--seq, --batch, --top and --max-nodes must be at least 1")
    return args


def _serving_note(request: Request) -> list[str]:
    """How inference options are chosen: what the `serve` kind's engine can run (planner/recommend.py)."""
    if request.mode != "inference":
        return []
    e = request.serving_engine
    budget = f", within --gpu-memory-utilization {e.gpu_memory_utilization:.2f}" if e.gpu_memory_utilization else ""
    return [f"Served by {e.display_name} (the serve kind's default engine{budget}): one node per replica, the "
            "model tensor-parallel over all of its GPUs (a split the attention heads allow), on GPUs and in a "
            "precision the engine serves there; the engine spans no nodes in this stack."]


def render(request: Request, region: str, plans: list[Plan], cat: gpu_catalog.Catalog) -> str:
    model = request.model
    shape = "shape from data/models.yaml" if model.shape_known else "shape unknown: Llama-like fallback"
    how = f" ({request.training_label})" if request.mode == "training" else ""
    lines = [f"{model.name}: {model.billions:.2f}B parameters ({shape}), {request.precision} {request.mode}{how}, "
             f"sequence {request.sequence_length} x batch {request.batch_size}, region {region}",
             f"Options keep {HEADROOM:.0%} of each GPU's memory free. Prices are estimates in {cat.currency} "
             f"(data/gpu_catalog.yaml, {cat.date}).", *_serving_note(request), ""]
    for plan in plans:
        lines.append(f"## {plan.strategy.label}")
        if not plan.options:
            lines += ["  nothing in the catalog holds it in this region", ""]
            continue
        lines.append(f"  {'GPUs':<18} {'machines':<22} {'GB per GPU':>11} {'on-demand $/h':>14} {'spot $/h':>9}  "
                     "zones")
        for o in plan.options:
            gpus, machines = f"{o.gpus} x {short_name(o.gpu_name)}", f"{o.nodes} x {o.machine_type}"
            memory = f"{o.per_gpu_gb:.1f} of {o.memory_gb:g}"
            cpu = o.estimate.cpu_gb_per_node
            offload = (f" (offload: {cpu:.0f} of the {o.pod_memory_gb:.1f} GB a worker pod may use on the "
                       f"{o.machine_memory_gb:g} GiB machine)") if cpu else ""
            lines.append(f"  {gpus:<18} {machines:<22} {memory:>11} {o.on_demand:>14.2f} {o.spot:>9.2f}  "
                         f"{', '.join(o.zones)}{offload}")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        print("\n".join(model_names()))
        return 0
    cat = gpu_catalog.load()
    if args.region not in cat.regions:
        print(f"error: region {args.region} is not a region of data/gpu_catalog.yaml, which lists every region "
              f"that offers one of its GPUs (known: {', '.join(cat.regions)}){did_you_mean(args.region, cat.regions)}",
              file=sys.stderr)
        return 2
    try:
        model = given_shape(resolve(args.model, args.parameters), args.vocab, args.hidden, args.largest_layer)
        request = mode_request(args.mode, model, args.precision, args.seq, args.batch)
        plans = recommend(request, args.region, cat, max_nodes=args.max_nodes, top=args.top)
    except ValueError as err:  # an unknown model (UnknownModelError) or int8/int4 training
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(render(request, args.region, plans, cat))
    return 0


if __name__ == "__main__":
    sys.exit(main())
