"""The header of the stack `make gpus ... WRITE=<stack>` writes (preview/write_stack.py), as comments above its
config: the model and the plan, what it costs (per hour, and a training run in all), how a reservation's end meets
the run, the cheaper options the checks refused, a gated model's token, and the next steps, each command as typed."""

from __future__ import annotations

import datetime

from model import catalog as gpu_catalog
from model import chat_templates, reservation
from model.config_read import secret_ways
from planner import run_estimate, spill, stack_writer
from planner.held import Held, Reservation
from planner.recommend import rank_line
from planner.sizing_types import Request
from planner.training_notes import record_formats, steps_line
from preview.write_stack_choice import Choice


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
