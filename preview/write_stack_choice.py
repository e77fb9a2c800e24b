"""Which plan `make gpus ... WRITE=<stack>` writes (preview/write_stack.py): the planner's candidates, cheapest first
(or fastest, RANK=speed), each loaded through the stack's own checks, and the first they accept within the budget.
With a server of the result, each trainer is paired with the cheapest servers of the same model."""

from __future__ import annotations

import math

import msgspec

from checks import load
from model import catalog as gpu_catalog
from model.config import ConfigError
from model.gated_models import gated_family
from model.training_blocks import hub_ids
from model.types import StackConfig
from planner import cli, run_estimate, stack_writer
from planner.cost import stack_costs
from planner.held import Held, Reservation
from planner.pool_cost import SERVING, TRAINING
from planner.recommend import speed_key
from planner.requests import mode_request
from planner.sizing_types import Request
from preview.engine import SECRET, engine_config_from_yaml

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
