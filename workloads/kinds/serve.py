"""kind serve: a model server Deployment (vLLM, or DeepSpeed-MII) on one GKE GPU pool.

Config: ServeWorkloadConfig (model/workload_serving.py; its keys: the common ones and `serving`). Builder: the
ModelServer component (workloads/serving.py). Summary: the model, GPUs per replica, replicas, the in-cluster
endpoint, the port-forward and prompt commands (`workloads.<name>`, and `servingEndpoints.<name>`).

One replica per node, the model tensor-parallel over that node's GPUs: the engine (`serving.engine`, facts in
data/serving.yaml through model/serving_engines.py) must run on the pool's GPU, serve the precision there and split
the model's attention heads over those GPUs; the planner's estimate for that engine must fit; what would is
searched on one node of each GPU type. The served model is the sized one (`serving.model` through
data/models.yaml), and a server of what training writes (`serving.fromWorkload`) names a workload that trains.
LoRA adapters (`serving.adapters`, or fromWorkload's when it exports one) come from finetune workloads that export
one, trained on the base the server serves, with a rank vLLM's --max-lora-rank holds; vLLM serves them (MII
cannot), and their memory is sized with the model. `serving.evaluation` scores them before they are served (an
evaluator container, workloads/serving_evaluator.py): only with adapters, read from the bucket.

The kind lives here (its builder and its `Kind`, with the rules on replicas, ports, sources and scaling); its other
rules, by what they check: serve_engine.py (engine, GPU, fit), serve_model.py (which model), serve_adapters.py.
"""

from __future__ import annotations

import ipaddress

import pulumi

from model.config_schema import workload_default
from model.problems import Problem
from model.serving_engines import MII, VLLM
from model.types import ServeWorkloadConfig, StackConfig
from model.validators import DNS1123_LABEL, at
from planner.pool_cost import pool_costs
from workloads.kinds.kind import Built, Kind, Platform
from workloads.kinds.serve_adapters import (
    check_serve_adapter_as_model,
    check_serve_adapter_engine,
    check_serve_adapter_folders,
    check_serve_adapters,
    check_serve_chat_templates,
    check_serve_evaluation,
    check_serve_lora_rank,
    warn_adapter_base_unrecorded,
    warn_lora_keys_unused,
)
from workloads.kinds.serve_engine import (
    check_serve_accelerator,
    check_serve_engine_gpu,
    check_serve_fits,
    check_serve_model_block,
    check_serve_tensor_parallel,
    warn_more_nodes_than_needed,
    warn_quantised_checkpoint,
    warn_unknown_heads,
)
from workloads.kinds.serve_gateway import check_serve_gateway, check_serve_gateway_canary, warn_serve_gateway_external
from workloads.kinds.serve_model import (
    check_serve_context_length,
    check_serve_from_workload,
    check_serve_model_identity,
    check_serve_model_source,
    warn_unlisted_model,
)
from workloads.kinds.serve_nodes import check_serve_nodes_per_replica, nodes_per_replica
from workloads.kinds.shared import changed_keys
from workloads.placement import placement
from workloads.serving import ModelServer, ModelServerArgs, most_replicas, surge_node_spare
from workloads.serving_command import mii_reserved_ports, served_port
from workloads.serving_source import (
    model_source,
)

# What `servingEndpoints.<name>` exports of a server's summary: how to reach it.
ENDPOINT_KEYS = ("endpoint", "portForward", "prompt", "servedModel", "loadBalancerIp")


def _pool_index(m: StackConfig, w: ServeWorkloadConfig) -> int | None:
    pool = m.pool(w.pool or "")
    return m.node_pools.index(pool) if pool is not None else None


def check_serve_replicas(m: StackConfig, w: ServeWorkloadConfig) -> list[Problem]:
    """Each replica takes a node of the pool (its CPU and memory are fitted to a whole node); `workers` is not
    how a server scales: neither engine spans nodes in this stack (data/serving.yaml)."""
    problems = []
    s = w.serving
    if w.workers != 1:
        problems.append(Problem(at('workloads', w.name, 'workers'), f"a serve workload runs {w.workers} worker(s) as "
                        f"replicas of the server, not as workers; set {at('workloads', w.name, 'serving', 'replicas')} "
                        f"for more servers, or {at('workloads', w.name, 'serving', 'nodesPerReplica')} for one server "
                        "across nodes (a model no node holds), and workers: 1"))
    if s.autoscaling.enabled and s.autoscaling.max_replicas < s.replicas:
        problems.append(Problem(at('workloads', w.name, 'serving', 'autoscaling', 'maxReplicas'), f""
                        f"{s.autoscaling.max_replicas} is fewer than serving.replicas {s.replicas}"))
    pool, index, nodes = m.pool(w.pool or ""), _pool_index(m, w), nodes_per_replica(w)
    needed = most_replicas(w) * nodes + w.evaluator_nodes
    if pool is not None and needed > pool.max_nodes:
        key = "autoscaling.maxReplicas" if s.autoscaling.enabled else "replicas"
        each = f" x {nodes} nodes each" if nodes > 1 else ""
        evaluator = " and the evaluator's own pod" if w.evaluator_nodes else ""
        problems.append(Problem(f"{at('workloads', w.name, 'serving')}.{key}",
                                f"{most_replicas(w)} replica(s){each}{evaluator} "
                                f"need {needed} nodes of pool {pool.name}, but "
                        f"{at('nodePools', index, 'maxNodes')} is {pool.max_nodes}; raise maxNodes or lower {key}"))
    return problems


def check_serve_ports(m: StackConfig, w: ServeWorkloadConfig) -> list[Problem]:
    """The API ports may take neither each other's nor the engine's own ports inside the pod; MII's OpenAI server
    is MII's (vLLM's API is OpenAI-compatible itself)."""
    problems = []
    s, where = w.serving, placement(m, w)
    key = at("workloads", w.name, "serving")
    if s.engine == VLLM:
        if s.openai.enabled:
            problems.append(Problem(f"{key}.openai.enabled",
                                    f"vLLM's API on serving.port ({served_port(w)}) is OpenAI-compatible "
                                    "itself; serving.openai is engine mii's second server, leave it disabled"))
        return problems
    reserved = mii_reserved_ports(where.per_worker if where else 1)
    ports = [("port", served_port(w))] + ([("openai.port", s.openai.port)] if s.openai.enabled else [])
    for name, port in ports:
        if port in reserved:
            problems.append(Problem(f"{key}.{name}",
                                    f"{port} is taken by {reserved[port]} inside the pod; pick another"))
    if s.openai.enabled and served_port(w) == s.openai.port:
        problems.append(Problem(f"{key}.openai.port",
                                f"{s.openai.port} is also serving.port; give the two APIs different ports"))
    return problems


def _source_problems(key: str, cidr: str | None, namespace: str | None, labels: dict | None) -> list[Problem]:
    if cidr is not None and (namespace is not None or labels):
        return [Problem(key,
                        "give either cidr or namespace/podLabels, not both (they are different NetworkPolicy peers)")]
    if cidr is None and namespace is None and not labels:
        return [Problem(key, "give a cidr, a namespace or podLabels (an empty source would admit every pod)")]
    if cidr is not None:
        try:
            net = ipaddress.IPv4Network(cidr, strict=True)
        except ValueError:
            return [Problem(f"{key}.cidr", f"{cidr!r} is not an IPv4 CIDR with its host bits zero (e.g. 10.0.0.0/8)")]
        if net.prefixlen == 0:
            return [Problem(f"{key}.cidr", f"{cidr} would admit every address; name the clients' ranges")]
    if namespace is not None and not DNS1123_LABEL.match(namespace):
        return [Problem(f"{key}.namespace", f"{namespace!r} is not a namespace name (a DNS-1123 label)")]
    return []


def check_serve_allow_from(m: StackConfig, w: ServeWorkloadConfig) -> list[Problem]:
    """Each NetworkPolicy source names who may connect, and nothing broader than meant."""
    return [p for i, src in enumerate(w.serving.allow_from)
            for p in _source_problems(at("workloads", w.name, "serving", "allowFrom", i), src.cidr, src.namespace,
                                      src.pod_labels)]


def check_serve_autoscaling(m: StackConfig, w: ServeWorkloadConfig) -> list[Problem]:
    """The autoscaler reads vLLM's own load (data/serving_metrics.yaml): no CPU autoscaler on a GPU server, and
    none for MII, which reports no load."""
    a, key = w.serving.autoscaling, ("workloads", w.name, "serving", "autoscaling")
    problems = []
    if a.cpu_utilization is not None:
        problems.append(
            Problem(at(*key, 'cpuUtilization'),
                    f"refused: the server runs the model on its GPUs, so its CPU use does not "
            "follow its load (and the pod requests nearly all of the node's CPUs), and a CPU autoscaler on it scales "
            "late or never (GKE's best practices for LLM inference on GPUs: not CPU alone). Leave cpuUtilization out; "
            f"the autoscaler scales on vLLM's own queue: {at(*key, 'metric')} waiting (the default) or running, "
            f"{at(*key, 'target')} per replica"))
    if a.enabled and w.serving.engine == MII:
        problems.append(
            Problem(at(*key, 'enabled'),
                    f"DeepSpeed-MII reports no load (no /metrics), and CPU use says nothing of a GPU "
            f"server's, so nothing could scale it; set {at('workloads', w.name, 'serving', 'engine')}: vllm (it "
            f"scales on its waiting or running requests), or a fixed {at('workloads', w.name, 'serving', 'replicas')}"))
    return problems


def warn_no_surge_node(m: StackConfig, w: ServeWorkloadConfig) -> list[Problem]:
    """A rollout's surge pod needs a node the pool may not have (workloads/serving.py rollout): one replica then
    waits for it, several are replaced one at a time; either way, what one node more costs per hour."""
    where, index = placement(m, w), _pool_index(m, w)
    if where is None or where.pool is None or index is None or surge_node_spare(w, where):
        return []
    pool, s, nodes = where.pool, w.serving, nodes_per_replica(w)
    if most_replicas(w) * nodes + w.evaluator_nodes > pool.max_nodes:
        return []  # refused at serving.replicas (check_serve_replicas)
    price = next((p for p in pool_costs(m) if p.name == pool.name and p.known), None)
    # A surge replica's nodes the pool lacks (beside the replicas' and the fleet evaluator's).
    more = (most_replicas(w) + 1) * nodes + w.evaluator_nodes - pool.max_nodes
    cost = (f"${price.pays(more):,.2f}/h {'spot' if price.spot else 'on demand'}" if price else
            "price unknown: not in data/gpu_catalog.yaml")
    fewest = " (the autoscaler's fewest)" if s.autoscaling.enabled else ""
    # A Deployment is awaited by `pulumi up`; a LeaderWorkerSet (a custom resource) is not.
    waits = ("`pulumi up` fails waiting for the Deployment" if nodes <= 1 else
             "the new group waits until maxNodes is raised")
    what = (f"{at('workloads', w.name, 'serving', 'replicas')}{fewest} is 1 and a rollout never takes it down first "
            f"(maxUnavailable 0): a new model, image or setting waits, its pod Pending and the old one serving, and "
            f"{waits}" if s.replicas <= 1 else
            f"a rollout replaces {w.name}'s replicas one at a time, one fewer serving meanwhile")
    surge = "the surge pod" if nodes <= 1 else f"the surge group ({nodes} nodes)"
    return [Problem(at('nodePools', index, 'maxNodes'), f"{pool.max_nodes} node(s) of pool {pool.name}, all for "
            f"{w.name}'s {most_replicas(w)} replica(s): no node for {surge} a rollout starts first; {what}. "
            f"Raise maxNodes to {pool.max_nodes + more} ({_nodes_more(more, pool.machine_type)}, {cost}, only while a "
            f"rollout runs: the autoscaler removes {'it' if more == 1 else 'them'} after)")]


def _nodes_more(count: int, machine_type: str) -> str:
    return f"one {machine_type} node more" if count == 1 else f"{count} {machine_type} nodes more"


def warn_autoscaling_unused(m: StackConfig, w: ServeWorkloadConfig) -> list[Problem]:
    """The autoscaler's bounds when there is no autoscaler: `replicas` pods, always."""
    scaling = w.serving.autoscaling
    if scaling.enabled:
        return []
    defaults = workload_default(w.kind, "serving", "autoscaling")
    return [Problem(at('workloads', w.name, 'serving', 'autoscaling', key), f"not used: "
            f"{at('workloads', w.name, 'serving', 'autoscaling', 'enabled')} is false, so no HorizontalPodAutoscaler "
            f"is made and serving.replicas ({w.serving.replicas}) pods run") for key in
            changed_keys(scaling, defaults, ("enabled", "cpuUtilization"))]  # cpuUtilization: refused


def warn_openai_port_unused(m: StackConfig, w: ServeWorkloadConfig) -> list[Problem]:
    """MII's second (OpenAI-compatible) server's port when that server is off."""
    openai = w.serving.openai
    if openai.enabled or openai.port == workload_default(w.kind, "serving", "openai", "port"):
        return []
    return [Problem(at('workloads', w.name, 'serving', 'openai', 'port'), f"not used: "
            f"{at('workloads', w.name, 'serving', 'openai', 'enabled')} is false (engine mii's OpenAI-compatible "
            "server; vLLM's own API is OpenAI-compatible on serving.port)")]


def canary_backends(m: StackConfig, w: ServeWorkloadConfig) -> list[tuple[str, str, int]] | None:
    """The HTTPRoute's pools, their namespaces and weights with a canary (`serving.gateway.canary`): its share, the
    server the rest."""
    canary = w.serving.gateway.canary
    target = m.workloads.get(canary.workload) if canary else None
    if canary is None or target is None:
        return None
    return [(w.name, w.namespace, 100 - canary.percent), (canary.workload, target.namespace, canary.percent)]


def canary_of(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """The namespaces of the servers whose gateways send this one a canary share (its ReferenceGrant admits them)."""
    return [o.namespace for o in m.workloads.values() if isinstance(o, ServeWorkloadConfig)
            and o.serving.gateway.canary is not None and o.serving.gateway.canary.workload == w.name]


def build(name: str, w: ServeWorkloadConfig, platform: Platform, opts: pulumi.ResourceOptions) -> Built:
    server = ModelServer(name, ModelServerArgs(
        workload=w, placement=placement(platform.cfg, w), image_ref=platform.image,
        source=model_source(platform.cfg, w), hf_token=platform.hf_token, bucket=platform.bucket,
        protect=platform.protect, proxy_cidr=platform.cfg.network.proxy_only_cidr if platform.own_cluster else None,
        group_controller=platform.leader_worker_set if w.multi_node else None,
        gateway_backends=canary_backends(platform.cfg, w),
        gateway_grants_from=canary_of(platform.cfg, w)),
        opts)
    endpoint = server.summary.apply(lambda s: {k: s[k] for k in ENDPOINT_KEYS if k in s})
    return Built(server, server.summary, endpoint=endpoint)


KIND: Kind[ServeWorkloadConfig] = Kind(
    name="serve",
    config=ServeWorkloadConfig,
    rules=(check_serve_accelerator, check_serve_engine_gpu, check_serve_model_block, check_serve_model_source,
           check_serve_from_workload, check_serve_adapter_as_model, check_serve_adapters,
           check_serve_adapter_folders, check_serve_chat_templates,
           check_serve_adapter_engine,
           check_serve_lora_rank,
           check_serve_model_identity, check_serve_context_length, check_serve_tensor_parallel, check_serve_fits,
           check_serve_replicas, check_serve_nodes_per_replica,
           check_serve_autoscaling, check_serve_ports, check_serve_allow_from, check_serve_evaluation,
           check_serve_gateway, check_serve_gateway_canary),
    build=build,
    warnings=(warn_quantised_checkpoint, warn_unlisted_model, warn_unknown_heads, warn_no_surge_node,
              warn_more_nodes_than_needed,
              warn_autoscaling_unused,
              warn_lora_keys_unused, warn_openai_port_unused, warn_serve_gateway_external,
              warn_adapter_base_unrecorded),
    sizes_its_model=True,
    checks_its_gpu=True,
)
