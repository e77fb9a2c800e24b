"""kind serve: a DeepSpeed-MII (FastGen) server Deployment on one GKE GPU pool.

Config: ServeWorkloadConfig (model/workload_types.py; its keys: the common ones and `serving`). Builder: the
ModelServer component (workloads/serving.py). Summary: the model, GPUs per replica, replicas, the in-cluster
endpoint and the port-forward command (`workloads.<name>`, and `servingEndpoints.<name>`).

FastGen serves one replica per node, the model tensor-parallel over that node's GPUs: the planner's inference
estimate on the pool's GPUs per node must fit, and what would fit is searched on one node of each GPU type.
Facts: compute capability in data/gpu_catalog.yaml; what FastGen needs (compute capability 8.0+, 16-bit
weights) and the ports MII takes in data/serving.yaml, each with its source.
"""

from __future__ import annotations

import ipaddress

import pulumi

from model import catalog as gpu_catalog
from model.types import ServeWorkloadConfig, StackConfig
from model.validators import DNS1123_LABEL, at, or_list
from planner.recommend import Option, cheapest_for_gpu, short_name
from planner.requests import workload_request
from planner.sizing import HEADROOM, INFERENCE, estimate
from workloads.kinds.kind import Built, Kind, Platform
from workloads.placement import placement
from workloads.serving import ModelServer, ModelServerArgs, mii_facts, mii_reserved_ports, most_replicas

MIN_COMPUTE_CAPABILITY = mii_facts().min_compute_capability  # data/serving.yaml, with its source
SERVING_PRECISIONS = mii_facts().precisions
SUGGESTIONS = 3
# What `servingEndpoints.<name>` exports of a server's summary: how to reach it.
ENDPOINT_KEYS = ("endpoint", "portForward", "loadBalancerIp")


def _pool_index(m: StackConfig, w: ServeWorkloadConfig) -> int | None:
    pool = m.pool(w.pool or "")
    return m.node_pools.index(pool) if pool is not None else None


def _servable_gpus(m: StackConfig) -> list[str]:
    """GPU types FastGen runs on that the stack's region offers, cheapest GPU-hour first."""
    cat = gpu_catalog.load()
    return sorted((g for g, gpu in cat.gpus.items()
                   if gpu.compute_capability >= MIN_COMPUTE_CAPABILITY and cat.zones(g, m.region)),
                  key=lambda g: cat.gpu_hour(g))


def check_serve_accelerator(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """MII serves on NVIDIA GPUs of a GKE pool (the pool rules themselves: checks/workloads.py)."""
    if w.on_nvidia:
        return []
    return [f"{at('workloads', w.name, 'accelerator', 'kind')}: kind serve runs DeepSpeed-MII on NVIDIA GKE pools "
            f"only, got {w.accelerator.kind}"]


def check_serve_compute_capability(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """FastGen's kernels need compute capability 8.0 or newer (Ampere+): T4, V100 and P100 cannot serve."""
    problems, cat = [], gpu_catalog.load()
    name = w.name
    pool = m.pool(w.pool or "")
    gpu = cat.gpus.get(pool.gpu.type) if pool else None
    if gpu is None or gpu.compute_capability >= MIN_COMPUTE_CAPABILITY:
        return problems
    servable = _servable_gpus(m)
    others = [f"{short_name(cat.gpus[g].display_name)} ({g}, {cat.gpus[g].compute_capability_text})"
              for g in servable[:3]]
    if servable:
        best = cat.gpus[servable[0]]
        shape = min(best.shapes, key=lambda sh: (sh.gpus, sh.price.on_demand))
        hint = (f"Serve from a pool of {short_name(best.display_name)} instead (gpu.type {best.name}, e.g. "
                f"machineType {shape.machine_type}); Ampere+ GPUs in {m.region}, cheapest first: {or_list(others)}")
    else:
        hint = f"No Ampere+ GPU is offered in {m.region} (data/gpu_catalog.yaml); pick another region"
    problems.append(
        f"{at('workloads', name, 'pool')}: pool {pool.name} has {short_name(gpu.display_name)} ({gpu.name}), "
        f"compute capability {gpu.compute_capability_text}; DeepSpeed-MII's FastGen kernels need "
        f"{'{}.{}'.format(*MIN_COMPUTE_CAPABILITY)} or newer (Ampere+). {hint}")
    return problems


def check_serve_model_block(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """The planner sizes every server: a `model` block in inference mode, in a precision FastGen runs."""
    problems = []
    name = w.name
    mb = w.model
    if mb is None:
        problems.append(f"{at('workloads', name, 'model')}: a serve workload needs its model block for the "
                        "planner's memory check, e.g. {name: Qwen2.5-7B, mode: inference, sequenceLength: 4096}")
        return problems
    if mb.mode != "inference":
        problems.append(f"{at('workloads', name, 'model', 'mode')}: a serve workload is sized for inference "
                        f"(weights + KV cache), got {mb.mode}; set mode: inference")
    if mb.precision not in SERVING_PRECISIONS:
        problems.append(f"{at('workloads', name, 'model', 'precision')}: DeepSpeed-MII (FastGen) serves 16-bit "
                        f"weights ({or_list(list(SERVING_PRECISIONS))}), not {mb.precision}; the planner can "
                        f"still size {mb.precision} (`make gpus ... MODE=inference PRECISION={mb.precision}`), "
                        "but this server cannot run it")
    return problems


def check_serve_model_source(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """Exactly one of a Hugging Face id and a folder of the stack's bucket (through GCS FUSE)."""
    problems = []
    name = w.name
    s = w.serving
    key = at("workloads", name, "serving")
    if bool(s.model) == bool(s.model_path):
        problems.append(f"{key}: set exactly one of model (a Hugging Face id) and modelPath (a folder of the "
                        "stack's bucket)" + ("" if s.model else ", e.g. model: Qwen/Qwen2.5-7B-Instruct"))
    if s.model_path and not w.gcs_fuse.enabled:
        problems.append(f"{key}.modelPath: reads the stack's bucket through GCS FUSE; set "
                        f"{at('workloads', name, 'gcsFuse', 'enabled')}: true (and storage.enabled: true)")
    return problems


def _describe(o: Option) -> str:
    return (f"{o.gpus_per_node} x {short_name(o.gpu_name)} ({o.machine_type}, {o.per_gpu_gb:.1f} GB each, "
            f"${o.on_demand:.2f}/h on-demand)")


def _fitting_nodes(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """One node of each servable GPU type that holds the model with HEADROOM, cheapest first."""
    request, cat = workload_request(w), gpu_catalog.load()
    if request is None:
        return []
    found = [o for g in _servable_gpus(m)
             if (o := cheapest_for_gpu(request, INFERENCE, cat, g, cat.zones(g, m.region), max_nodes=1)) is not None]
    return [_describe(o) for o in sorted(found, key=Option.sort_key)[:SUGGESTIONS]]


def check_serve_fits(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """Weights + KV cache (batch x sequence), tensor-parallel over the GPUs of one pod, must fit each GPU."""
    problems, cat = [], gpu_catalog.load()
    name = w.name
    request, where = workload_request(w), placement(m, w)
    gpu = cat.gpus.get(where.accelerator_type) if where else None
    if (request is None or where is None or gpu is None or request.mode != "inference"
            or request.precision not in SERVING_PRECISIONS):
        return problems  # no model or no pool: other rules say why
    est = estimate(request, INFERENCE, where.per_worker, 1)
    if est.per_gpu_gb <= gpu.memory_gb:
        return problems
    fitting = _fitting_nodes(m, w)
    what = (f"{request.model.name} ({request.model.billions:.2f}B parameters) {request.precision} at sequence "
            f"{request.sequence_length} x batch {request.batch_size}")
    hint = (f"Fits on one node with {HEADROOM:.0%} headroom: " + "; ".join(fitting)) if fitting else (
        f"No single node in {m.region} holds it")
    problems.append(
        f"{at('workloads', name, 'model')}: {what} needs {est.per_gpu_gb:.1f} GB per GPU ({est.breakdown()}) "
        f"tensor-parallel over {where.per_worker} x {short_name(gpu.display_name)}; each has "
        f"{gpu.memory_gb:g} GB. {hint}; or lower sequenceLength or batchSize")
    return problems


def check_serve_replicas(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """Each replica takes a node of the pool (its CPU and memory are fitted to a whole node); `workers` is not
    how a server scales."""
    problems = []
    name = w.name
    s = w.serving
    if w.workers != 1:
        problems.append(f"{at('workloads', name, 'workers')}: a serve workload runs one pod per replica; set "
                        f"{at('workloads', name, 'serving', 'replicas')} instead of workers ({w.workers})")
    if s.autoscaling.enabled and s.autoscaling.max_replicas < s.replicas:
        problems.append(f"{at('workloads', name, 'serving', 'autoscaling', 'maxReplicas')}: "
                        f"{s.autoscaling.max_replicas} is fewer than serving.replicas {s.replicas}")
    pool, index = m.pool(w.pool or ""), _pool_index(m, w)
    if pool is not None and most_replicas(w) > pool.max_nodes:
        key = "autoscaling.maxReplicas" if s.autoscaling.enabled else "replicas"
        problems.append(f"{at('workloads', name, 'serving')}.{key}: {most_replicas(w)} replica(s) need as many "
                        f"nodes of pool {pool.name}, but {at('nodePools', index, 'maxNodes')} is "
                        f"{pool.max_nodes}; raise maxNodes or lower {key}")
    return problems


def check_serve_ports(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """The API ports may take neither each other's nor MII's own ports inside the pod."""
    problems = []
    name = w.name
    s, where = w.serving, placement(m, w)
    reserved = mii_reserved_ports(where.per_worker if where else 1)
    ports = [("port", s.port)] + ([("openai.port", s.openai.port)] if s.openai.enabled else [])
    for key, port in ports:
        if port in reserved:
            problems.append(f"{at('workloads', name, 'serving')}.{key}: {port} is taken by {reserved[port]} "
                            "inside the pod; pick another")
    if s.openai.enabled and s.port == s.openai.port:
        problems.append(f"{at('workloads', name, 'serving', 'openai', 'port')}: {s.port} is also "
                        "serving.port; give the two APIs different ports")
    return problems


def _source_problems(key: str, cidr: str | None, namespace: str | None, labels: dict | None) -> list[str]:
    if cidr is not None and (namespace is not None or labels):
        return [f"{key}: give either cidr or namespace/podLabels, not both (they are different NetworkPolicy peers)"]
    if cidr is None and namespace is None and not labels:
        return [f"{key}: give a cidr, a namespace or podLabels (an empty source would admit every pod)"]
    if cidr is not None:
        try:
            net = ipaddress.IPv4Network(cidr, strict=True)
        except ValueError:
            return [f"{key}.cidr: {cidr!r} is not an IPv4 CIDR with its host bits zero (e.g. 10.0.0.0/8)"]
        if net.prefixlen == 0:
            return [f"{key}.cidr: {cidr} would admit every address; name the clients' ranges"]
    if namespace is not None and not DNS1123_LABEL.match(namespace):
        return [f"{key}.namespace: {namespace!r} is not a namespace name (a DNS-1123 label)"]
    return []


def check_serve_allow_from(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """Each NetworkPolicy source names who may connect, and nothing broader than meant."""
    return [p for i, src in enumerate(w.serving.allow_from)
            for p in _source_problems(at("workloads", w.name, "serving", "allowFrom", i), src.cidr, src.namespace,
                                      src.pod_labels)]


def build(name: str, w: ServeWorkloadConfig, platform: Platform, opts: pulumi.ResourceOptions) -> Built:
    server = ModelServer(name, ModelServerArgs(
        workload=w, placement=placement(platform.cfg, w), image_ref=platform.image, hf_token=platform.hf_token,
        bucket=platform.bucket, protect=platform.protect), opts)
    endpoint = server.summary.apply(lambda s: {k: s[k] for k in ENDPOINT_KEYS if k in s})
    return Built(server, server.summary, endpoint=endpoint)


KIND: Kind[ServeWorkloadConfig] = Kind(
    name="serve",
    config=ServeWorkloadConfig,
    rules=(check_serve_accelerator, check_serve_compute_capability, check_serve_model_block,
           check_serve_model_source, check_serve_fits, check_serve_replicas, check_serve_ports,
           check_serve_allow_from),
    build=build,
    sizes_its_model=True,
    checks_its_gpu=True,
)
