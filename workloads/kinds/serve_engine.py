"""kind serve's rules on the engine, the GPU and the fit (workloads/kinds/serve.py lists them): the engine runs on the
pool's GPU and serves the precision there, splits the model's attention heads over the node's GPUs, and the planner's
estimate (with the adapters' memory) fits; what would is searched on one node of each GPU type.
"""

from __future__ import annotations

import msgspec

from model import catalog as gpu_catalog
from model import serving_engines, versions
from model.problems import Problem
from model.serving_engines import MII, VLLM, Engine, capability_text
from model.types import ServeWorkloadConfig, StackConfig
from model.validators import at, or_list
from planner.recommend import Option, cheapest_for_gpu, serving_problem, short_name
from planner.requests import workload_request
from planner.sizing import estimate
from planner.sizing_types import INFERENCE, Request
from workloads.kinds.serve_model import check_serve_context_length
from workloads.kinds.serve_nodes import across_nodes_hint, nodes_that_hold
from workloads.placement import placement
from workloads.serving_command import engine_of
from workloads.serving_source import (
    model_source,
)

SUGGESTIONS = 3


def _image_runs(m: StackConfig, w: ServeWorkloadConfig, capability: tuple[int, int]) -> bool:
    """The stack's image has torch kernels for the GPU (a prebuilt image or the workload's own is the user's)."""
    return bool(m.image.prebuilt or w.image) or versions.load().supports(capability)


def _runs(m: StackConfig, w: ServeWorkloadConfig, e: Engine, gpu_type: str) -> bool:
    gpu = gpu_catalog.load().gpus[gpu_type]
    return e.runs_kernels_on(gpu.compute_capability) and _image_runs(m, w, gpu.compute_capability)


def _servable_gpus(m: StackConfig, w: ServeWorkloadConfig, e: Engine) -> list[str]:
    """GPU types the engine runs on that the stack's region offers, cheapest GPU-hour first."""
    cat = gpu_catalog.load()
    return sorted((g for g in cat.gpus if _runs(m, w, e, g) and cat.zones(g, m.region)), key=lambda g: cat.gpu_hour(g))


def _gpu_text(gpu_type: str) -> str:
    gpu = gpu_catalog.load().gpus[gpu_type]
    return f"{short_name(gpu.display_name)} ({gpu_type}, {gpu.compute_capability_text})"


def _alternatives(m: StackConfig, w: ServeWorkloadConfig, e: Engine) -> str:
    servable = _servable_gpus(m, w, e)
    if not servable:
        return f"no GPU {e.display_name} runs on is offered in {m.region} (data/gpu_catalog.yaml); pick another region"
    cat = gpu_catalog.load()
    best = cat.gpus[servable[0]]
    shape = min(best.shapes, key=lambda sh: (sh.gpus, sh.price.on_demand))
    others = [_gpu_text(g) for g in servable[:3]]
    return (f"serve from a pool of {short_name(best.display_name)} instead (gpu.type {best.name}, e.g. machineType "
            f"{shape.machine_type}); GPUs it runs on in {m.region}, cheapest first: {or_list(others)}")


def check_serve_accelerator(m: StackConfig, w: ServeWorkloadConfig) -> list[Problem]:
    """The server runs on NVIDIA GPUs of a GKE pool (the pool rules themselves: checks/workloads.py)."""
    if w.on_nvidia:
        return []
    return [Problem(at('workloads', w.name, 'accelerator', 'kind'),
                    f"kind serve runs vLLM or DeepSpeed-MII on NVIDIA GKE "
                    f"pools only, got {w.accelerator.kind}")]


def check_serve_engine_gpu(m: StackConfig, w: ServeWorkloadConfig) -> list[Problem]:
    """The engine's kernels run on the pool's GPU: MII's deepspeed-kernels only on compute capability 8.0, 8.6, 8.9
    and 9.0 (no T4, no B200); vLLM from 7.0, in the image's torch (no V100 or P100)."""
    pool = m.pool(w.pool or "")
    gpu = gpu_catalog.load().gpus.get(pool.gpu.type) if pool else None
    if pool is None or gpu is None:
        return []
    e, cc = engine_of(w), gpu.compute_capability
    where = (f"pool {pool.name} has {short_name(gpu.display_name)} ({gpu.name}), compute capability "
             f"{capability_text(cc)}")
    if e.name == MII and not e.runs_kernels_on(cc):
        vllm = serving_engines.engine(VLLM)
        on_pool = "engine vllm (the default) on this pool, or " if _runs(m, w, vllm, gpu.name) else ""
        return [Problem(at('workloads', w.name, 'serving', 'engine'),
                        f"mii cannot run on {where}: DeepSpeed-MII's FastGen "
                        f"kernels (deepspeed-kernels) are built for compute capability {e.kernel_archs_text()} only "
                        f"(data/serving.yaml). Valid: {on_pool}engine mii on a pool of A100, L4, H100 or H200; "
                        f"{_alternatives(m, w, e)}")]
    if not e.runs_kernels_on(cc):
        return [Problem(at('workloads', w.name, 'pool'), f"{where}; {e.display_name} needs compute capability "
                f"{capability_text(e.min_compute_capability)} or newer (data/serving.yaml). {_alternatives(m, w, e)}")]
    if not _image_runs(m, w, cc):
        vs = versions.load()
        return [Problem(at('workloads', w.name, 'pool'),
                        f"{where}, and the stack's image runs torch {vs.python['torch']} "
                        f"(CUDA {vs.cuda}) with kernels for compute capability {vs.torch_archs_text()} only "
                f"(data/versions.yaml): {e.display_name} would fail at its first kernel. {_alternatives(m, w, e)}")]
    return []


def check_serve_model_block(m: StackConfig, w: ServeWorkloadConfig) -> list[Problem]:
    """The planner sizes every server: a `model` block in inference mode, in a precision the engine serves there."""
    mb, e = w.model, engine_of(w)
    if mb is None:
        return [Problem(at('workloads', w.name, 'model'), "a serve workload needs its model block for the planner's "
                "memory check, e.g. {name: Qwen2.5-7B, mode: inference, sequenceLength: 4096}")]
    problems = []
    key = at("workloads", w.name, "model", "precision")
    if mb.mode != "inference":
        problems.append(Problem(at('workloads', w.name, 'model', 'mode'), f"a serve workload is sized for inference "
                        f"(weights + KV cache), got {mb.mode}; set mode: inference"))
    if mb.precision not in e.precisions:
        problems.append(Problem(key, f"{e.display_name} serves {or_list(list(e.precisions))}, not {mb.precision}; the "
                        f"planner can still size {mb.precision} (`make gpus ... MODE=inference "
                        f"PRECISION={mb.precision}`), but this server cannot run it"
                        + ("; engine vllm (the default) serves int8/int4 checkpoints" if e.name == MII
                           and mb.precision in serving_engines.engine(VLLM).precisions else "")))
        return problems
    pool = m.pool(w.pool or "")
    gpu = gpu_catalog.load().gpus.get(pool.gpu.type) if pool else None
    if mb.precision == "bf16" and gpu is not None and not (gpu.bf16 and e.serves_bf16_on(gpu.compute_capability)):
        problems.append(Problem(key,
                                f"{short_name(gpu.display_name)} (compute capability {gpu.compute_capability_text}) "
                        f"has no bf16, and {e.display_name} refuses it there; set precision: fp16 (the same bytes, "
                        "--dtype float16)"))
    if mb.precision in e.quantised and (w.serving.from_workload or w.serving.model_path):
        what = "training writes a 16-bit model" if w.serving.from_workload else "the stack quantises nothing"
        problems.append(Problem(key,
                                f"{mb.precision} serves a checkpoint quantised that way, and {what}; size what the "
                                "folder holds (fp16 or bf16)"))
    return problems


def lora_request(m: StackConfig, w: ServeWorkloadConfig, request: Request) -> Request:
    """The sizing request with vLLM's adapter slots: --max-loras x --max-lora-rank (what model_source passes)."""
    source = model_source(m, w)
    if not source.adapters or source.max_lora_rank is None or source.max_loras is None:
        return request
    return msgspec.structs.replace(request, adapter_slots=source.max_loras, adapter_rank=source.max_lora_rank)


def serve_request(m: StackConfig, w: ServeWorkloadConfig) -> Request | None:
    """The server's sizing request: its model block, and its adapters' memory."""
    request = workload_request(w)
    return lora_request(m, w, request) if request is not None else None


def check_serve_tensor_parallel(m: StackConfig, w: ServeWorkloadConfig) -> list[Problem]:
    """The engine splits the model over all of the node's GPUs: its attention heads must allow that split."""
    request, where = workload_request(w), placement(m, w)
    if request is None or where is None or not request.model.shape_known:
        return []
    shape, e, tp = request.model.shape, engine_of(w), where.per_worker
    why = e.tensor_parallel_problem(shape.heads, shape.kv_heads, tp)
    if why is None:
        return []
    valid = [t for t in e.valid_tensor_parallel(shape.heads, shape.kv_heads, 8) if t in (1, 2, 4, 8)]
    return [Problem(at('workloads', w.name, 'pool'),
                    f"the server splits {request.model.name} over all {tp} GPUs of a node "
                    f"of pool {w.pool} (tensor parallel {tp}), and {why} ({e.display_name}); use a pool with "
                    f"{or_list([str(t) for t in valid])} GPUs per node")]


def _describe(o: Option) -> str:
    return (f"{o.gpus_per_node} x {short_name(o.gpu_name)} ({o.machine_type}, {o.per_gpu_gb:.1f} GB each, "
            f"${o.on_demand:.2f}/h on-demand)")


def _fitting_nodes(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """One node of each GPU type the engine serves the request on that holds it, cheapest first."""
    request, cat = serve_request(m, w), gpu_catalog.load()
    if request is None:
        return []
    found = [o for g in _servable_gpus(m, w, engine_of(w)) if serving_problem(cat, g, request) is None
             and (o := cheapest_for_gpu(request, INFERENCE, cat, g, cat.zones(g, m.region), max_nodes=1)) is not None]
    return [_describe(o) for o in sorted(found, key=Option.sort_key)[:SUGGESTIONS]]


def check_serve_fits(m: StackConfig, w: ServeWorkloadConfig) -> list[Problem]:
    """Weights + KV cache (batch x sequence), tensor-parallel over the GPUs of one pod, within what the engine takes
    of each GPU (vLLM: its --gpu-memory-utilization; FastGen: all but its reserve)."""
    cat = gpu_catalog.load()
    request, where = serve_request(m, w), placement(m, w)
    gpu = cat.gpus.get(where.accelerator_type) if where else None
    if (request is None or where is None or gpu is None or request.mode != "inference"
            or request.precision not in engine_of(w).precisions):
        return []  # no model or no pool: other rules say why
    if serving_problem(cat, gpu.name, request) is not None:
        return []  # the engine cannot serve it on this GPU at all: check_serve_engine_gpu or the precision rule says
    if check_serve_context_length(m, w):
        return []  # past the model's positions it would not start on any GPU: no GPUs to recommend
    nodes = w.serving.nodes_per_replica  # pipeline stages: one per node of a replica across nodes
    est = estimate(request, INFERENCE, where.per_worker, nodes)
    budget = gpu.memory_gb * (1 - request.headroom)
    if est.per_gpu_gb <= budget:
        return []
    e = engine_of(w)
    fitting = _fitting_nodes(m, w)
    what = (f"{request.model.name} ({request.model.billions:.2f}B parameters) {request.precision} at sequence "
            f"{request.sequence_length} x batch {request.batch_size}")
    within = (f"{e.display_name} takes {e.gpu_memory_utilization:.0%} of each ({budget:.1f} GB)"
              if e.gpu_memory_utilization else f"each has {gpu.memory_gb:g} GB")
    hint = ("Fits on one node: " + "; ".join(fitting)) if fitting else f"No single node in {m.region} holds it"
    across = across_nodes_hint(request, where, at("workloads", w.name, "serving", "nodesPerReplica"))
    split = f" x pipeline-parallel over {nodes} nodes" if nodes > 1 else ""
    return [Problem(at('workloads', w.name, 'model'),
                    f"{what} needs {est.per_gpu_gb:.1f} GB per GPU ({est.breakdown()}) "
            f"tensor-parallel over {where.per_worker} x {short_name(gpu.display_name)} ({gpu.memory_gb:g} GB){split}; "
            f"{within}. {hint}{across}; or lower sequenceLength or batchSize")]


def warn_quantised_checkpoint(m: StackConfig, w: ServeWorkloadConfig) -> list[Problem]:
    """vLLM serves int8/int4 only from a checkpoint quantised that way; the stack cannot see which the id is."""
    mb, e = w.model, engine_of(w)
    if mb is None or mb.precision not in e.quantised or not w.serving.model:
        return []
    return [Problem(at('workloads', w.name, 'model', 'precision'),
                    f"{mb.precision} is sized as {mb.precision} weights; "
            f"vLLM reads the quantisation from {w.serving.model}'s quantization_config, so it must be a checkpoint "
            "quantised that way (AWQ, GPTQ); a 16-bit checkpoint would load at 16 bits and not fit")]


def warn_unknown_heads(m: StackConfig, w: ServeWorkloadConfig) -> list[Problem]:
    request, where = workload_request(w), placement(m, w)
    if request is None or where is None or request.model.shape_known or where.per_worker <= 1:
        return []
    return [Problem(at('workloads', w.name, 'model'), f"{request.model.name}'s attention heads are unknown (not in "
            f"data/models.yaml); {engine_of(w).display_name} refuses to start unless they divide by the node's "
            f"{where.per_worker} GPUs")]


def warn_more_nodes_than_needed(m: StackConfig, w: ServeWorkloadConfig) -> list[Problem]:
    """Pipeline stages where fewer nodes hold the model: every stage adds a network hop per token, and the loss of
    any node of a group restarts the whole group."""
    nodes, where, request = w.serving.nodes_per_replica, placement(m, w), serve_request(m, w)
    if nodes <= 1 or where is None or request is None or not engine_of(w).multi_node:
        return []
    needed = nodes_that_hold(request, where)
    if needed is None or needed >= nodes:
        return []
    return [Problem(at('workloads', w.name, 'serving', 'nodesPerReplica'),
                    f"{nodes} nodes per replica, but {needed} of "
            f"pool {w.pool} hold {request.model.name} at this sequence length and batch: every pipeline stage more "
            "adds a network hop per token and a node whose loss restarts the whole group; set "
            f"nodesPerReplica: {needed} (more replicas add throughput without the hops)")]
