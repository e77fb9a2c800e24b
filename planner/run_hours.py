"""Every hour a finetune run pays for besides its training: the saves and the data step, with the save interval that
minimises lost work plus save time.

- Saves: a checkpoint every `saveSteps` steps, each taking the save time of planner/recovery.py (the checkpoint's
  size over the write rate of the storage the run writes to, every node writing its share): count x save time. The
  steps are the run's tokens over a step's (GPUs x micro batch x accumulation x sequence length: every sample full).
- The save interval: Young's approximation of the optimum (Young 1974, "A first order approximation to the optimum
  checkpoint interval"; Daly 2006 refines it for long saves), sqrt(2 x save time x mean time between interruptions),
  the interruptions by the capacity the run's pool uses (data/training_speed.yaml `interruptions`), in steps at the
  estimate's two ends. The preview warns when the saves take more than savesShareWarning of the run's hours.
- The data step: finetune.py --prepare-data tokenizes the run's data once before the ranks start, while the GPU
  workers wait: on GKE on the first worker (the launcher runs it there over ssh: workloads/mpijob/nvidia.py
  on_first_worker), in as many processes as that worker's container has CPUs, at most finetune_tokenized.py's
  MAX_DATA_PROCS (its data_procs, the script's own rule); on Gaudi on the launcher's CPUs. The characters
  (datasetTokens x charsPerToken) over the measured rate per CPU of the records' kind (data/training_speed.yaml
  `tokenization`) times the processes [assumption: the rate scales with the processes; the packing and the save
  after the map run in one process]; the slower kind where the format is found at run time.
"""

from __future__ import annotations

import math

import msgspec

from model import capacity, node_memory, training_speed
from model import catalog as gpu_catalog
from model.training_speed import TrainingSpeed
from model.types import FinetuneWorkloadConfig, MpiJobWorkloadConfig, StackConfig
from planner import pod_fit, recovery
from planner.requests import workload_request
from planner.run_estimate import RunEstimate, WorkloadRun
from recipes import finetune_tokenized

SECONDS_PER_HOUR = 3600
# The record formats whose records go through a chat template (the slower data step: a conversation's assistant
# turns are found by rendering its prefixes); text is rendered as it is.
CHAT_RECORDS = ("messages", "sharegpt", "prompt-completion", "alpaca")


class Saves(msgspec.Struct, frozen=True):
    """The run's saves: how many, each how long, on what, and the interval Young/Daly proposes."""

    save_steps: int
    steps: float  # the run's optimizer steps (an upper bound: every sample full)
    count: int
    seconds: float  # one save, every node writing its share
    storage: str  # gcsfuse | nfs
    capacity: str  # the pool's (model/capacity.py)
    mean_hours_between_interruptions: float
    interval_seconds: float  # Young: sqrt(2 x save time x MTBI)
    proposed_steps: tuple[int, int]  # the interval in steps at the fast and the slow end

    @property
    def hours(self) -> float:
        return self.count * self.seconds / SECONDS_PER_HOUR


class DataStep(msgspec.Struct, frozen=True):
    """finetune.py --prepare-data: hours at the fast and slow kind of records, on how many CPUs of what."""

    hours_fast: float
    hours_slow: float
    cpus: float
    on: str  # in words
    kinds: tuple[str, ...]
    by_kind: dict[str, float] = msgspec.field(default_factory=dict)  # hours per kind of records


def step_tokens(w: FinetuneWorkloadConfig, gpus: int) -> int:
    """Tokens a step trains at most: GPUs x micro batch x accumulation x sequence length."""
    return gpus * w.deepspeed.micro_batch_per_gpu * w.deepspeed.gradient_accumulation * w.finetune.sequence_length


def young_interval(save_seconds: float, mtbi_hours: float) -> float:
    """Seconds between saves that minimise save time plus expected lost work (Young 1974)."""
    return math.sqrt(2 * save_seconds * mtbi_hours * SECONDS_PER_HOUR)


def saves(cfg: StackConfig, run: WorkloadRun, speed: TrainingSpeed | None = None) -> Saves | None:
    """The run's saves; None without an estimate or a sized model."""
    speed = speed or training_speed.load()
    w, e = cfg.workloads.get(run.name), run.estimate
    request = workload_request(w) if isinstance(w, FinetuneWorkloadConfig) else None
    pool = cfg.pool(run.pool)
    if e is None or request is None or pool is None or not isinstance(w, FinetuneWorkloadConfig):
        return None
    kind = capacity.source(pool)
    storage = "gcsfuse" if w.gcs_fuse.enabled else "nfs"
    # With tiered saves (localCheckpoints) training waits only for the local save: that is what each save costs.
    plan = recovery.workload_plan(w, pool)
    assert plan is not None  # a sized finetune run
    per_step = step_tokens(w, run.gpus)
    steps = e.tokens / per_step
    mtbi = speed.mean_hours_between_interruptions.get(kind, speed.mean_hours_between_interruptions[capacity.ON_DEMAND])
    interval = young_interval(plan.stall_seconds, mtbi)
    step_seconds = tuple(h * SECONDS_PER_HOUR / steps for h in (e.hours_fast, e.hours_slow))
    proposed = tuple(max(1, round(interval / s)) for s in step_seconds)
    return Saves(w.finetune.save_steps, steps, int(steps // w.finetune.save_steps), plan.stall_seconds, storage, kind,
                 mtbi, interval, (proposed[0], proposed[1]))


def cpu_count(quantity: str) -> int:
    """Whole CPUs of a Kubernetes CPU quantity ("200", "1.5", "500m"), at least 1."""
    value = float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)
    return max(1, math.floor(value))


class DataCpus(msgspec.Struct, frozen=True):
    """Where the data step runs: its processes (datasets' num_proc), in words."""

    procs: int
    on: str


def on_cpus(cpus: int, where: str, machine: str = "") -> DataCpus:
    """The data step on a container of `cpus` CPUs (`where`, e.g. "the launcher"): finetune.py's data_procs."""
    procs = finetune_tokenized.data_procs(cpus)
    return DataCpus(procs, f"{procs} process{'es' if procs != 1 else ''} on {where}'s {cpus:g} "
                           f"CPU{'s' if cpus != 1 else ''}{f' ({machine})' if machine else ''}")


def first_worker(cfg: StackConfig, w: FinetuneWorkloadConfig) -> DataCpus:
    """The GKE data step's CPUs: the first worker's container (resources.cpu, else what fits a node of every pool it
    may land on, as workloads/placement.py requests it)."""
    pools = [p for p in (cfg.pool(w.pool or ""), cfg.pool(w.fallback_pool or "")) if p is not None]
    fitted = pod_fit.fitted_cpu_memory(pools, w.gcs_fuse.enabled, w.evaluates)
    quantity = w.resources.cpu or (fitted[0] if fitted else None)
    if quantity is None:  # no pool of a known shape (a config check says so): count one CPU
        return on_cpus(1, "the first worker")
    return on_cpus(cpu_count(quantity), "the first worker", pools[0].machine_type if pools else "")


def launcher(resources: dict[str, str]) -> DataCpus:
    """A launcher's data step (Gaudi's) on its CPU request."""
    return on_cpus(cpu_count(resources["cpu"]), "the launcher")


def data_step(w: FinetuneWorkloadConfig | MpiJobWorkloadConfig, cpus: DataCpus,
              speed: TrainingSpeed | None = None) -> DataStep | None:
    """The data step's hours for `datasetTokens` in `cpus.procs` processes; None without datasetTokens (or a
    recipe: a Gaudi MPIJob without `finetune`)."""
    speed = speed or training_speed.load()
    f = w.finetune
    tokens = f.dataset_tokens if f is not None else None
    if f is None or tokens is None:
        return None
    kinds = (("text",) if f.record_format == "text" or f.format == "text" else
             ("chat",) if f.record_format in CHAT_RECORDS else ("text", "chat"))
    return tokenizing(tokens, kinds, cpus, speed)


def tokenizing(tokens: float, kinds: tuple[str, ...], cpus: DataCpus, speed: TrainingSpeed) -> DataStep:
    """`tokens` of records of `kinds` tokenized in `cpus.procs` processes."""
    rates = speed.tokenize_chars_per_second
    hours = {k: tokens * speed.chars_per_token / (rates[k] * cpus.procs) / SECONDS_PER_HOUR for k in kinds}
    return DataStep(min(hours.values()), max(hours.values()), cpus.procs, cpus.on, kinds, hours)


def machine_worker(gpu_type: str, machine_type: str, gpus_per_node: int) -> DataCpus | None:
    """The data step on the first worker of a machine type (`make gpus`' options): the CPUs its container fits
    with the machine's default fabric, as a stack written from the plan gets them; None for an unknown shape."""
    shape = gpu_catalog.load().shape(gpu_type, machine_type, gpus_per_node)
    if shape is None:
        return None
    fit = node_memory.fit_pod(shape.vcpus, shape.memory_gb, node_memory.machine_fabric(machine_type))
    return on_cpus(fit.cpu, "the first worker", machine_type)


def saves_warning(name: str, s: Saves, training_fast: float, training_slow: float,
                  speed: TrainingSpeed | None = None) -> str | None:
    """A warning when the saves take more than savesShareWarning of the run (training + saves), at either end;
    with the saveSteps Young/Daly proposes."""
    speed = speed or training_speed.load()
    shares = [s.hours / (t + s.hours) for t in (training_fast, training_slow) if t + s.hours > 0]
    if not shares or max(shares) <= speed.saves_share_warning:
        return None
    low, high = sorted(s.proposed_steps)
    steps = f"{low:,}" if low == high else f"{low:,}–{high:,}"
    return (f"workloads.{name}.finetune.saveSteps {s.save_steps:,}: {s.count:,} saves of {s.seconds:,.0f} s each "
            f"({s.storage}) take {s.hours:,.1f} h, {min(shares):.0%}–{max(shares):.0%} of the run (over "
            f"{speed.saves_share_warning:.0%}); a save every {s.interval_seconds / 60:,.0f} min minimises save time "
            f"plus the work an interruption loses (Young/Daly: sqrt(2 x save time x "
            f"{s.mean_hours_between_interruptions:g} h between interruptions on {s.capacity} capacity, "
            f"data/training_speed.yaml)): saveSteps {steps}")


def summary(e: RunEstimate, save_hours: float, price_per_hour: float) -> dict[str, object]:
    """The estimate as the ranks carry it (FINETUNE_ESTIMATE; workloads/finetune_progress.py renders the preview's
    run the same way): tokens/s per GPU, MFU, the run's hours (training + saves) and $ at `price_per_hour`."""
    low, high = e.tokens_per_second_per_gpu
    hours = {"fast": e.hours_fast + save_hours, "slow": e.hours_slow + save_hours}
    return {"tokensPerSecondPerGpu": {"low": round(low, 1), "high": round(high, 1)},
            "mfu": {"low": round(e.mfu_low, 4), "high": round(e.mfu_high, 4)},
            "hours": {k: round(v, 6) for k, v in hours.items()},
            "trainingHours": {"fast": round(e.hours_fast, 6), "slow": round(e.hours_slow, 6)},
            "cost": {k: round(v * price_per_hour, 4) for k, v in hours.items()}, "evidence": list(e.evidence)}
