"""Pre-deploy checks for the planner (model memory vs accelerator memory): one named function per rule.

A workload with a `model` block is sized (planner/sizing.py) on the accelerators it gets (workloads/placement.py):
needing more than an accelerator holds is a config error that says what would fit; fitting with less than
HEADROOM to spare is a warning (`warnings()`, logged by __main__.py), not an error.
"""

from __future__ import annotations

import msgspec

from checks.common import Check, at
from model import catalog as gpu_catalog
from model.problems import Problem
from model.types import DeepSpeedWorkloadConfig, StackConfig, WorkloadConfig
from planner import cost
from planner.model_catalog import UnknownModelError, resolve
from planner.recommend import cheapest, recommend, short_name
from planner.requests import FINETUNE, vertex_request, vertex_strategy, workload_request, workload_strategy
from planner.sizing import TRAINING_PRECISIONS, estimate
from planner.sizing_types import GB, HEADROOM, Estimate, Request, Strategy
from workloads.kinds import kind_of
from workloads.placement import Placement, offload_memory_bytes, placement

# The suggestions search up to this many workers of the workload's own accelerator.
MAX_WORKERS = 128
SUGGESTIONS = 3
COUNT_HINT = "(or give the parameter count in billions)"  # planner/model_catalog.py's unknown-model message


class Sized(msgspec.Struct, frozen=True):
    """A workload's model sized on the accelerators it is placed on."""

    name: str
    workload: WorkloadConfig
    request: Request
    strategy: Strategy
    where: Placement
    estimate: Estimate
    # What a worker pod may hold in CPU memory (its limit less /dev/shm, workloads/placement.py), in GB;
    # None where the limit is not a plain quantity. ZeRO's offloaded states must fit in it.
    offload_memory_gb: float | None

    @property
    def memory_gb(self) -> float:
        return self.where.memory_gb_per_accelerator

    @property
    def accelerator_name(self) -> str:
        cat = gpu_catalog.load()
        if self.where.on_gaudi:
            return short_name(cat.gaudi.get(self.where.accelerator_type, {}).get("displayName", "Gaudi"))
        gpu = cat.gpus.get(self.where.accelerator_type)
        return short_name(gpu.display_name) if gpu else self.where.accelerator_type

    @property
    def unit(self) -> str:
        return "HPU" if self.where.on_gaudi else "GPU"


def _model_key(name: str, *rest: str) -> str:
    return at("workloads", name, "model", *rest)


def _fit_key(s: Sized) -> str:
    """Where a fit problem is reported: the `model` block, or (a kind sized without one) the key naming the model."""
    w = s.workload
    return _model_key(s.name) if w.model is not None else at("workloads", s.name, *w.sized_model_key)


def size_workload(m: StackConfig, name: str, w: WorkloadConfig) -> Sized | None:
    request = workload_request(w)
    where = placement(m, w) if request is not None else None
    if request is None or where is None or where.memory_gb_per_accelerator <= 0:
        return None  # no model, or no accelerator to compare with (other checks name the cause)
    strategy = workload_strategy(w)
    pod_bytes = offload_memory_bytes(where, w.resources.shm_size)
    est = estimate(request, strategy, where.per_worker, w.workers)
    return Sized(name, w, request, strategy, where, est, None if pod_bytes is None else pod_bytes / GB)


def sized_workloads(m: StackConfig) -> list[Sized]:
    return [s for name, w in m.workloads.items() if (s := size_workload(m, name, w)) is not None]


def _fits(est: Estimate, memory_gb: float, offload_memory_gb: float | None) -> bool:
    cpu_ok = offload_memory_gb is None or est.cpu_gb_per_node <= offload_memory_gb
    return est.fits(memory_gb, HEADROOM) and cpu_ok


def alternatives(s: Sized, request: Request | None = None) -> list[tuple[Strategy, Estimate]]:
    """On the workload's own accelerator: for each strategy, the fewest workers that fit; fewest GPUs first.
    `request`: another way to run it (default: the workload's own)."""
    request = request or s.request
    found = []
    for order, strategy in enumerate(request.strategies()):
        for workers in range(1, MAX_WORKERS + 1):
            est = estimate(request, strategy, s.where.per_worker, workers)
            if _fits(est, s.memory_gb, s.offload_memory_gb):
                found.append((est.gpus, order, strategy, est))
                break
    found.sort(key=lambda f: (f[0], f[1]))
    return [(strategy, est) for _, _, strategy, est in found[:SUGGESTIONS]]


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'s' if count != 1 else ''}"


def _describe(s: Sized, strategy: Strategy, est: Estimate) -> str:
    workers = f"{_plural(est.nodes, 'worker')} x {est.gpus_per_node}"
    return f"{strategy.label} on {est.gpus} x {s.accelerator_name} ({workers}; {est.per_gpu_gb:.1f} GB each)"


def _what(s: Sized) -> str:
    model, r = s.request.model, s.request
    shape = "" if model.shape_known else ", shape unknown: Llama-like fallback"
    how = f" at {s.strategy.label}" if s.strategy.training else ""
    run = (f" ({r.training_label}; micro batch {r.batch_size} x sequence {r.sequence_length})"
           if s.workload.training_run is not None else "")
    return f"{model.name} ({model.billions:.2f}B parameters{shape}) {r.precision} {r.mode}{how}{run}"


def _with_checkpointing(s: Sized) -> str:
    """A run without gradient checkpointing whose key can turn it on: what fits with it (activations of one
    layer at a time instead of all), first of the suggestions."""
    run = s.workload.training_run
    if run is None or s.request.gradient_checkpointing:
        return ""
    recompute = msgspec.structs.replace(s.request, gradient_checkpointing=True)
    key = at("workloads", s.name, *run.checkpointing_key)
    here = estimate(recompute, s.strategy, s.where.per_worker, s.workload.workers)
    if _fits(here, s.memory_gb, s.offload_memory_gb):
        return (f"With gradient checkpointing ({key}: true) it needs {here.per_gpu_gb:.1f} GB per {s.unit} on the "
                f"same {here.gpus}. ")
    alts = [_describe(s, strategy, est) for strategy, est in alternatives(s, recompute)]
    return f"With gradient checkpointing ({key}: true) it fits: {'; '.join(alts)}. " if alts else ""


def _suggestions(m: StackConfig, s: Sized) -> str:
    alts = [_describe(s, strategy, est) for strategy, est in alternatives(s)]
    r = s.request
    text = (f"Fits with {HEADROOM:.0%} headroom: " + "; ".join(alts)) if alts else (
        f"Nothing up to {MAX_WORKERS} workers of {s.where.per_worker} x {s.accelerator_name} holds it at sequence "
        f"{r.sequence_length} x batch {r.batch_size}; shorten the sequence or the "
        + ("micro batch" if r.mode == "training" else "batch, or quantise the weights"))
    if s.where.on_nvidia and m.region in gpu_catalog.load().regions:
        best = cheapest(recommend(s.request, m.region, top=1))
        if best is not None:
            strategy, o = best
            model = r.model
            what = f"MODEL={model.name}" if model.shape_known else f"PARAMETERS={model.billions:g}"
            mode = FINETUNE if r.lora is not None else r.mode
            text += (f". Cheapest in {m.region}: {strategy.label} on {o.describe()}, ${o.on_demand:.2f}/h on-demand, "
                     f"${o.spot:.2f}/h spot (`make gpus {what} MODE={mode} PRECISION={r.precision} "
                     f"REGION={m.region}` lists more)")
    return _with_checkpointing(s) + text


def check_model_known(m: StackConfig) -> list[Problem]:
    """The planner needs a parameter count: a model name from data/models.yaml, or `parameters`. A kind sized
    from its own keys (finetune) is sized without a `model` block too: the model it trains must be known."""
    problems = []
    for name, w in m.workloads.items():
        if w.model is None and (w.training_run is None or not w.sized_model_name):
            continue  # not sized, or the kind's own rules say what names it (a bucket folder: its shape)
        if w.model is not None and w.model.parameters is not None:
            continue
        if w.model is not None and not w.model.name and kind_of(w).sizes_its_model:
            continue  # the kind's own rules say what names it (a server: `serving.model`, or what training trains)
        if not w.sized_model_name:
            problems.append(Problem(_model_key(name), "give `name` (a model in data/models.yaml) or `parameters` "
                            "(billions) for the planner's memory check"))
            continue
        try:
            resolve(w.sized_model_name, None)
        except UnknownModelError as err:
            # Names the parameters key: when a given count was rejected, this is its echo and is left out.
            text = str(err).replace(COUNT_HINT, f"{COUNT_HINT[:-1]} as {_model_key(name, 'parameters')})")
            if w.sized_model_key != ("model", "name"):
                text += f"; or name its shape: {_model_key(name, 'name')} (a listed model of the same shape)"
            problems.append(Problem(at('workloads', name, *w.sized_model_key), f"{text}"))
    return problems


def check_training_precision(m: StackConfig) -> list[Problem]:
    """ZeRO trains in fp32, fp16 or bf16, and in the precision ds_config.json sets."""
    problems = []
    for name, w in m.workloads.items():
        mb = w.model
        if mb is None or mb.mode != "training" or not isinstance(w, DeepSpeedWorkloadConfig):
            continue  # a kind that trains nothing says so itself (a server is sized for inference)
        if mb.precision not in TRAINING_PRECISIONS:
            problems.append(Problem(_model_key(name, 'precision'), f"{mb.precision} is a weight format for inference; "
                            f"ZeRO training runs in {', '.join(TRAINING_PRECISIONS)} (quantised fine-tuning such as "
                            "QLoRA is not modelled)"))
        elif mb.precision != w.deepspeed.precision:
            problems.append(Problem(_model_key(name, 'precision'), f"{mb.precision}, but the workload trains in "
                            f"{at('workloads', name, 'deepspeed', 'precision')} = {w.deepspeed.precision}; "
                            "set both the same"))
    return problems


def check_model_fits(m: StackConfig) -> list[Problem]:
    """Memory per accelerator must not exceed what the accelerator has; the error says what would fit."""
    problems = []
    for s in sized_workloads(m):
        need = s.estimate.per_gpu_gb
        if need <= s.memory_gb or kind_of(s.workload).sizes_its_model:  # e.g. a server: what fits on one node
            continue
        problems.append(
            Problem(_fit_key(s), f"{_what(s)} needs {need:.1f} GB per {s.unit} ({s.estimate.breakdown()}); "
            f"{s.where.accelerator_type} has {s.memory_gb:g} GB ({_plural(s.estimate.nodes, 'worker')} x "
            f"{_plural(s.estimate.gpus_per_node, s.unit)}). {_suggestions(m, s)}"))
    return problems


def warnings(m: StackConfig) -> list[Problem]:
    """What fits, but tightly: under HEADROOM free per accelerator (offloaded states beyond the pod's memory are
    an error: checks/offload.py)."""
    out = []
    for s in sized_workloads(m):
        est, memory = s.estimate, s.memory_gb
        if est.per_gpu_gb <= memory and est.headroom(memory) < HEADROOM:
            out.append(Problem(_fit_key(s), f"{_what(s)} needs {est.per_gpu_gb:.1f} GB per {s.unit} of "
                       f"{s.where.accelerator_type}'s {memory:g} GB, {est.headroom(memory):.1%} headroom (under "
                       f"{HEADROOM:.0%}); a longer sequence or allocator fragmentation can run it out of memory"))
    return out + warn_saves_take_too_long(m)


def warn_saves_take_too_long(m: StackConfig) -> list[Problem]:
    """A finetune run whose saves take more than savesShareWarning of its hours, with the saveSteps Young/Daly
    proposes (planner/run_hours.py; the preview's Estimated cost says the same beside the run)."""
    runs = cost.stack_costs(m).get("runs") or {}
    return [r["saves"]["warning"] for r in runs.values() if r.get("saves", {}).get("warning")]


def check_vertex_model_fits(m: StackConfig) -> list[Problem]:
    """`vertex.finetune` on the Vertex GPUs, as a `finetune` workload on a GKE pool: memory per GPU within the GPU's
    (a 7B full fine-tune on one T4 is refused here as it is there), with the fewest replicas that would fit."""
    v = m.vertex
    request = vertex_request(v) if v.enabled else None
    gpu = gpu_catalog.load().gpus.get(v.gpu.type)
    if request is None or gpu is None:
        return []
    strategy, replicas = vertex_strategy(v), 1 + v.workers
    est = estimate(request, strategy, v.gpu.count, replicas)
    if est.per_gpu_gb <= gpu.memory_gb:
        return []
    fits = next((n for n in range(replicas + 1, MAX_WORKERS + 1)
                 if estimate(request, strategy, v.gpu.count, n).per_gpu_gb <= gpu.memory_gb * (1 - HEADROOM)), None)
    more = (f"{_plural(fits, 'replica')} of {v.gpu.count} x {v.gpu.type} would hold it "
            f"({at('vertex', 'workers')}: {fits - 1})" if fits else "no replica count of this GPU holds it")
    model = request.model
    return [Problem(at('vertex', 'finetune', 'model'), f"{model.name} ({model.billions:.2f}B parameters) "
            f"{request.precision} {request.training_label} at {strategy.label} needs {est.per_gpu_gb:.1f} GB per GPU "
            f"({est.breakdown()}); {v.gpu.type} has {gpu.memory_gb:g} GB ({_plural(replicas, 'replica')} x "
            f"{_plural(v.gpu.count, 'GPU')}): {more}, or a larger GPU (vertex.gpu.type), LoRA "
            f"({at('vertex', 'finetune', 'lora', 'enabled')}) or offload "
            f"({at('vertex', 'deepspeed', 'offloadOptimizer')})")]


CHECKS: list[Check] = [
    check_model_known,
    check_training_precision,
    check_model_fits,
    check_vertex_model_fits,
]
