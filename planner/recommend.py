"""The cheapest GPU setups in a region that hold a model: a pure function over the GPU catalog.

For each way of running the model (inference, or each ZeRO stage and offload variant for training) and each GPU
type offered in the region, the cheapest (machine shape x node count) whose GPUs keep HEADROOM free, and
whose worker pod holds what DeepSpeed offloads (GKE's allocatable less DaemonSets and /dev/shm,
model/node_memory.py). Options are sorted by the on-demand $/h, then spot $/h.

Inference plans are what the `serve` kind can run (issue 20 item 3): one node per replica, the model
tensor-parallel over all of the node's GPUs, which the engine must be able to split its attention heads over; a GPU
the engine's kernels (and the image's torch) run on; a precision the engine serves on it (no bf16 below compute
capability 8.0: T4 serves fp16). Where no single node of a GPU type holds the model and the engine spans nodes
(vLLM: data/serving.yaml multiNode), a replica of several nodes of that type (issue 42 item 3): tensor-parallel
within each node, pipeline-parallel across them, the fewest nodes that hold it (the serve kind renders it as a
LeaderWorkerSet, `serving.nodesPerReplica`).
"""

from __future__ import annotations

import msgspec

from model import catalog as gpu_catalog
from model import versions
from model.node_memory import planned_process_memory_gb
from planner import run_estimate
from planner.held import Held
from planner.sizing import estimate
from planner.sizing_types import HEADROOM, Estimate, Request, Strategy

MAX_NODES = 32


class Option(msgspec.Struct, frozen=True):
    gpu_type: str
    gpu_name: str
    machine_type: str
    nodes: int
    gpus_per_node: int
    zones: tuple[str, ...]
    memory_gb: float  # per GPU
    machine_memory_gb: float  # the machine's memory (GiB, as Compute Engine lists it)
    pod_memory_gb: float  # what a worker's processes may hold on one node (model/node_memory.py), GB
    estimate: Estimate
    on_demand: float  # $/h for all nodes
    spot: float

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def per_gpu_gb(self) -> float:
        return self.estimate.per_gpu_gb

    def sort_key(self) -> tuple:
        return (round(self.on_demand, 6), round(self.spot, 6), self.gpus, self.gpu_type, self.machine_type, self.nodes)

    @property
    def multi_node_replica(self) -> bool:
        """An inference replica of several nodes: tensor-parallel within each, pipeline-parallel across them."""
        return self.nodes > 1 and self.estimate.request.mode == "inference"

    def describe(self) -> str:
        machines = f"{self.nodes} x {self.machine_type}" if self.nodes > 1 else self.machine_type
        if self.multi_node_replica:
            machines += (f" per replica: tensor-parallel {self.gpus_per_node} x pipeline-parallel {self.nodes}")
        return f"{self.gpus} x {short_name(self.gpu_name)} ({machines}, {self.per_gpu_gb:.1f} GB each)"


class Plan(msgspec.Struct, frozen=True):
    strategy: Strategy
    options: list[Option]


def short_name(display_name: str) -> str:
    """`NVIDIA L4` -> `L4`: how people say it in a sentence."""
    return display_name.removeprefix("NVIDIA ").removeprefix("Intel ")


def fits(est: Estimate, memory_gb: float, pod_memory_gb: float, headroom: float = HEADROOM) -> bool:
    """GPU memory with headroom, and what DeepSpeed offloads to the CPU within what a worker pod's processes may
    hold: the same number the preview's offload check compares with (model/node_memory.py), not the machine's."""
    return est.fits(memory_gb, headroom) and est.cpu_gb_per_node <= pod_memory_gb


def serving_problem(cat: gpu_catalog.Catalog, gpu_type: str, request: Request) -> str | None:
    """Why the request's serving engine cannot serve it on this GPU type, or None: its kernels (and, for vLLM, the
    image's torch) must run there, and it must serve the precision there (bf16 only from compute capability 8.0)."""
    gpu, engine = cat.gpus[gpu_type], request.serving_engine
    cc = gpu.compute_capability
    if not engine.runs_kernels_on(cc):
        archs = engine.kernel_archs_text() or f"{engine.min_compute_capability[0]}.{engine.min_compute_capability[1]}+"
        return f"{engine.display_name}'s kernels are built for compute capability {archs}"
    if engine.kernel_archs is None and not versions.load().supports(cc):
        return f"the image's torch has no kernels for compute capability {gpu.compute_capability_text}"
    if request.precision not in engine.precisions:
        return f"{engine.display_name} does not serve {request.precision}"
    if request.precision == "bf16" and not (gpu.bf16 and engine.serves_bf16_on(cc)):
        return "no bf16 below compute capability 8.0 (serve fp16)"
    return None


def usable(cat: gpu_catalog.Catalog, gpu_type: str, request: Request) -> bool:
    """bf16 training needs bf16 hardware (Ampere and later); inference needs a GPU and a precision its engine
    serves (`serving_problem`)."""
    if request.mode == "inference":
        return serving_problem(cat, gpu_type, request) is None
    return not (request.precision == "bf16" and not cat.gpus[gpu_type].bf16)


def splits(request: Request, gpus_per_node: int) -> bool:
    """Inference: the engine can split the model's attention over all of the node's GPUs. An unknown model's shape
    is a guess, so it is not held against a split (the preview warns instead)."""
    shape = request.model.shape
    if request.mode != "inference" or not request.model.shape_known:
        return True
    return request.serving_engine.tensor_parallel_problem(shape.heads, shape.kv_heads, gpus_per_node) is None


def cheapest_for_gpu(request: Request, strategy: Strategy, cat: gpu_catalog.Catalog, gpu_type: str,
                     zones: tuple[str, ...], max_nodes: int = MAX_NODES,
                     headroom: float | None = None, held: Held | None = None) -> Option | None:
    """The cheapest shape x nodes of this GPU type that holds the model; more nodes of a shape only cost more,
    so each shape stops at the fewest nodes that fit. Inference: one node whose GPUs the model splits over, else
    (no node holds it) the fewest nodes of one replica, pipeline-parallel across them (`max_nodes=1`: one node only).
    `headroom`: the share of each GPU kept free (default: the request's, HEADROOM or the engine's). `held`: the
    capacity the user holds: only its shapes, and (training) all of its nodes, which are paid for either way."""
    headroom = request.headroom if headroom is None else headroom
    if request.mode == "inference":
        single = _cheapest(request, strategy, cat, gpu_type, zones, 1, headroom, held)
        if single is not None or max_nodes <= 1:
            return single  # one node holds it: a replica is one node
        # No node of this GPU holds it: a replica of several (pipeline stages across nodes), where the engine can.
        max_nodes = min(max_nodes, _replica_nodes(request, held, cat.gpus[gpu_type]))
    return _cheapest(request, strategy, cat, gpu_type, zones, max_nodes, headroom, held)


def _replica_nodes(request: Request, held: Held | None, gpu: gpu_catalog.Gpu) -> int:
    """The most nodes one inference replica may span: the engine's bound (1 where it spans none), no more pipeline
    stages than the model has layers, and within the nodes held (GPUS= with a count)."""
    most = min(request.serving_engine.max_nodes_per_replica if request.serving_engine.multi_node else 1,
               request.model.shape.layers)
    if held is not None and held.count is not None:
        most = min(most, max((held.nodes(s.gpus) or 0) for s in gpu.shapes))
    return most


def _cheapest(request: Request, strategy: Strategy, cat: gpu_catalog.Catalog, gpu_type: str,
              zones: tuple[str, ...], max_nodes: int, headroom: float, held: Held | None) -> Option | None:
    gpu, best = cat.gpus[gpu_type], None
    for shape in gpu.shapes:
        if not splits(request, shape.gpus) or (held is not None and not held.takes(shape.machine_type, shape.gpus)):
            continue
        pod_gb = planned_process_memory_gb(shape.machine_type, shape.vcpus, shape.memory_gb)
        held_nodes = held.nodes(shape.gpus) if held is not None and request.mode != "inference" else None
        for nodes in [held_nodes] if held_nodes else range(1, max_nodes + 1):
            est = estimate(request, strategy, shape.gpus, nodes)
            if fits(est, gpu.memory_gb, pod_gb, headroom):
                option = Option(gpu_type, gpu.display_name, shape.machine_type, nodes, shape.gpus, zones,
                                gpu.memory_gb, shape.memory_gb, pod_gb, est,
                                nodes * shape.price.on_demand, nodes * shape.price.spot)
                if best is None or _order(option) < _order(best):
                    best = option
                break
    return best


def _order(option: Option) -> tuple:
    """Cheapest first; but of one replica across nodes the fewest nodes first (every pipeline stage adds a network
    hop per token and a node whose loss restarts the group), then the cheapest."""
    return (option.nodes if option.multi_node_replica else 0, *option.sort_key())


def recommend(request: Request, region: str, cat: gpu_catalog.Catalog | None = None, max_nodes: int = MAX_NODES,
              top: int = 10, headroom: float | None = None, held: Held | None = None) -> list[Plan]:
    """One plan per strategy (inference, or each ZeRO variant), each with up to `top` options, cheapest first;
    with `held`, on the capacity the user holds only (planner/held.py)."""
    cat = cat or gpu_catalog.load()
    plans = []
    for strategy in request.strategies():
        options = []
        for gpu_type in cat.gpus:
            zones = cat.zones(gpu_type, region)
            if not zones or not usable(cat, gpu_type, request) or (held is not None and gpu_type != held.gpu_type):
                continue
            option = cheapest_for_gpu(request, strategy, cat, gpu_type, zones, max_nodes, headroom, held)
            if option is not None:
                options.append(option)
        plans.append(Plan(strategy, sorted(options, key=Option.sort_key)[:top]))
    return plans


def cheapest(plans: list[Plan]) -> tuple[Strategy, Option] | None:
    """The cheapest option of all plans."""
    found = [(plan.strategy, plan.options[0]) for plan in plans if plan.options]
    return min(found, key=lambda so: so[1].sort_key()) if found else None


# --- ranking: by $/h (the default), or by time per run, then $ per run (RANK=speed) -----------------------------

RANKS = ("cost", "speed")
SPEED_TOKENS = 1e9  # any count ranks alike: a run's hours are proportional to its tokens


def speed_key(request: Request, strategy: Strategy, option: Option, cat: gpu_catalog.Catalog) -> tuple:
    """Hours of a run (at the fast end of the assumed MFU; the slow end ranks alike), then $/h (so $ per run, for
    the same hours), then the $/h order; a GPU without a peak in the precision (Gaudi) last."""
    top = run_estimate.peak(cat, option.gpu_type, request.precision)
    hours = (run_estimate.estimate(SPEED_TOKENS, request, strategy, option.gpus, top,
                                   gpu_type=option.gpu_type).hours_fast
             if top is not None else float("inf"))
    return (round(hours, 9), *option.sort_key())


def ranked(request: Request, plans: list[Plan], cat: gpu_catalog.Catalog, rank: str, top: int) -> list[Plan]:
    """Each plan's options in the rank's order, `top` of them: `recommend` sorts by $/h; speed re-sorts."""
    if rank != "speed":
        return [Plan(p.strategy, p.options[:top]) for p in plans]
    return [Plan(p.strategy, sorted(p.options, key=lambda o, s=p.strategy: speed_key(request, s, o, cat))[:top])
            for p in plans]


def rank_line(rank: str) -> str:
    """Which order the options are in (`make gpus RANK=`), as the plan and the written stack say it."""
    if rank == "speed":
        return ("Ranked by time per run, then $ per run (RANK=speed): the fastest option that holds the model "
                "first.")
    return "Ranked by $/h, cheapest first (RANK=speed ranks by time per run, then $ per run)."
