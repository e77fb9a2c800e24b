"""The planner writes the stack: each option it recommends as a whole `Pulumi.<stack>.yaml`, cheapest first.

`candidates()` turns every (strategy, option) of `recommend()` into a stack config: one GKE cluster with a private
system pool, one GPU pool shaped like the option (one zone: NCCL across zones is slow and billed), and the workload
of the mode: `training` and `finetune` the finetune kind (recipes/finetune.py, the Hugging Face Trainer
under the ZeRO stage and offload the planner sized) on the option's nodes, every parameter or LoRA (sized as LoRA:
the request's `lora`), its data, checkpoints and result in the stack's bucket, where the launcher waits for the
data; `inference` a `serve` workload on one node (or, where no node holds the model, one replica across the
option's nodes: `serving.nodesPerReplica`). With `serve`, a trainer's stack also gets the server of its result
(a `serve` workload of `serving.fromWorkload`, on a pool of its own sized by the inference plan).
`render()` writes it with the plan, the ds_config choices and the reasons as YAML comments.

Which candidate is written is decided above this layer (preview/write_stack_choice.py): the cheapest whose config the
stack's own checks accept, so what is written previews.
"""

from __future__ import annotations

import copy
import math
import re
import textwrap
from collections.abc import Callable
from typing import Any

import msgspec
import yaml

from model import catalog as gpu_catalog
from model import machine_disks
from model.suggest import closest
from planner import recovery
from planner.held import Held, Reservation
from planner.model_catalog import known_models
from planner.recommend import MAX_NODES, Option, recommend, short_name
from planner.sizing import BYTES_PER_PARAM
from planner.sizing_types import GB, HEADROOM, Estimate, Request, Strategy
from planner.training_notes import FULL_LEARNING_RATE, batch_reason

TRAINING, INFERENCE = "training", "inference"
PROJECT_PLACEHOLDER = "my-gcp-project"
MODEL_PLACEHOLDER = "your-org/your-model"  # a bare size (`MODEL=34B`) names no Hugging Face model
TRAINER, SERVER = "train", "serve"  # the written workloads' names
COMMENT_WIDTH = 112
LIST_ITEM = re.compile(r"^ *(\d+\.|-) ")  # a numbered or bulleted line of a header: its continuation hangs under it
DEFAULT_BOOT_DISK = "pd-balanced"  # model/schema.yaml nodePools[].diskType's default


class Candidate(msgspec.Struct, frozen=True):
    """One option as a stack: its config (the stack file's `config:` map) and the comments that explain it;
    `server`: the option of the server of the result, when the stack also serves what it trains."""

    mode: str
    strategy: Strategy
    option: Option
    config: dict[str, Any]
    reasons: list[str] = msgspec.field(default_factory=list)
    server: Option | None = None

    @property
    def label(self) -> str:
        how = "" if self.mode == INFERENCE else f"{self.strategy.label} on "
        served = f" + a server on {self.server.describe()}" if self.server else ""
        return f"{how}{self.option.describe()}{served}"


def cluster_name(stack: str) -> str:
    """The cluster a written stack creates: `deepspeed-<stack>`, cut to GKE's 40 characters."""
    return f"deepspeed-{stack}"[:40].rstrip("-")


def hf_id(model_name: str) -> str | None:
    """The model's Hugging Face id from its aliases in data/models.yaml: a transformers checkpoint (Llama 2's `-hf`
    repositories; the bare ones hold Meta's own format), else the id closest to the model's name."""
    ids = [a for a in (known_models().get(model_name.lower()) or {}).get("aliases", []) if "/" in a]
    converted = [a for a in ids if a.endswith("-hf")]
    if converted:
        return converted[0]
    by_repo = {a.split("/", 1)[1]: a for a in ids}
    best = closest(model_name, by_repo, cutoff=0)
    return by_repo[best] if best else None


def _parts(est: Estimate) -> str:
    return ", ".join(f"{k} {v / GB:.1f}" for k, v in est.parts.items() if v >= 0.05 * GB)


def pool_name(gpu_type: str) -> str:
    """`nvidia-tesla-a100` -> `a100`: what the GPU is called in a sentence, as a pool name."""
    return gpu_type.removeprefix("nvidia-").removeprefix("tesla-")


def _gib(size_bytes: float, floor: int) -> str:
    return f"{max(floor, math.ceil(size_bytes / 2**30))}Gi"


def boot_disk(machine_type: str) -> dict[str, str]:
    """`diskType` where the shape does not boot from the schema's default (A3 Ultra and A4 boot only from Hyperdisk
    Balanced: data/gpu_catalog.yaml `machineDisks`); nothing where the default boots."""
    facts = machine_disks.for_machine(machine_type)
    if facts is None or DEFAULT_BOOT_DISK in facts.boot_disks:
        return {}
    return {"diskType": facts.boot_disks[0]}


def _platform(stack: str, region: str, option: Option, nodes: int) -> dict[str, Any]:
    zone = option.zones[0]
    return {
        "gcp:project": PROJECT_PLACEHOLDER,
        "gcp:region": region,
        "deepspeed-stack:cluster": {
            "name": cluster_name(stack),
            "releaseChannel": "REGULAR",
            "privateNodes": True,
            # A private cluster admits only its own new VPC: `pulumi up` reaches it through the fleet's Connect
            # Gateway (checks/reachability.py).
            "fleet": {"enabled": True},
            "deletionProtection": False,
            "systemPool": {"machineType": "e2-standard-4", "minNodes": 1, "maxNodes": 2, "zones": [zone]},
        },
        "deepspeed-stack:nodePools": [{
            "name": pool_name(option.gpu_type),
            "machineType": option.machine_type,
            "gpu": {"type": option.gpu_type, "count": option.gpus_per_node, "driverVersion": "LATEST"},
            "spot": False,
            "minNodes": 0,
            "maxNodes": nodes,
            "zones": [zone],
            "diskSizeGb": 200,
            **boot_disk(option.machine_type),
        }],
        "deepspeed-stack:registry": {"name": "deepspeed", "keepVersions": 10},
        "deepspeed-stack:image": {"name": "deepspeed", "context": "workloads/images/deepspeed", "tag": "0.1.0"},
    }


def _model_block(request: Request, mode: str) -> dict[str, Any]:
    block: dict[str, Any] = {"name": request.model.name, "mode": mode, "precision": request.precision,
                             "sequenceLength": request.sequence_length, "batchSize": request.batch_size}
    if not request.model.shape_known:
        block["parameters"] = round(request.model.billions, 3)
    return block


def _job(request: Request, strategy: Strategy, option: Option) -> tuple[dict[str, Any], list[str]]:
    """What a trainer's MPIJob is made of: a worker per node with all of its GPUs, the ds_config of the plan, the
    claim for the download (HF_HOME); the launcher on the system pool."""
    weights = request.model.parameters * BYTES_PER_PARAM[request.precision]
    workers, gpus = option.nodes, option.gpus_per_node
    offload = "cpu"
    workload = {
        "namespace": TRAINER,
        "pool": pool_name(option.gpu_type),
        "workers": workers,
        "storage": {"claimName": f"{TRAINER}-shared", "storageClass": "standard-rwx", "size": _gib(weights, 100),
                    "accessMode": "ReadWriteMany", "mountPath": "/data"},
        "hfHome": "/data/huggingface",
        "deepspeed": {
            "zeroStage": strategy.zero_stage,
            "offloadOptimizer": offload if strategy.offload_optimizer else "none",
            "offloadParams": offload if strategy.offload_params else "none",
            "precision": request.precision,
            "microBatchPerGpu": request.batch_size,
            "gradientAccumulation": 1,
            "trainBatchSize": workers * gpus * request.batch_size,
        },
        "model": _model_block(request, TRAINING),
    }
    est = option.estimate
    reasons = [
        f"deepspeed: {strategy.label}: {est.per_gpu_gb:.1f} GB of each {option.memory_gb:g} GB GPU "
        f"({_parts(est)}), {HEADROOM:.0%} kept free",
        f"workers: {workers} (one per node, {gpus} GPU(s) each); trainBatchSize {workers} x {gpus} x micro batch "
        f"{request.batch_size} x 1 accumulation step",
    ]
    if est.cpu_gb_per_node:
        reasons.insert(1, f"offload: DeepSpeed's estimate {est.cpu_gb_per_node:.0f} GB of CPU memory per node, of "
                          f"{option.machine_memory_gb:g} GB on a {option.machine_type}")
    return {"deepspeed-stack:mpiOperator": {"install": True, "version": "v0.8.0"}, **workload}, reasons


def _inference(request: Request, strategy: Strategy, option: Option, model_id: str) -> tuple[dict[str, Any], list[str]]:
    """A `serve` workload: one replica on one node, the model tensor-parallel over the node's GPUs; where no node
    holds it, one replica across the option's nodes (pipeline-parallel across them, `serving.nodesPerReplica`)."""
    weights = request.model.parameters * BYTES_PER_PARAM[request.precision]
    cache = _gib(weights * 1.25, 64)  # the download and the engine's compiled kernels on the node's disk
    across = {"nodesPerReplica": option.nodes} if option.multi_node_replica else {}
    workload = {
        "kind": "serve",
        "namespace": "serving",
        "pool": pool_name(option.gpu_type),
        "serving": {"model": model_id, "replicas": 1, **across, "service": "ClusterIP", "cacheSize": cache},
        "model": _model_block(request, INFERENCE),
    }
    est = option.estimate
    engine = request.serving_engine
    budget = (f"within {engine.display_name}'s --gpu-memory-utilization {engine.gpu_memory_utilization:.2f}"
              if engine.gpu_memory_utilization else f"{HEADROOM:.0%} kept free")
    where = (f"the {option.gpus_per_node} GPU(s) of each of {option.nodes} x {option.machine_type}, pipeline-parallel "
             f"across them (no single node of it holds the model)" if option.multi_node_replica else
             f"the {option.gpus} GPU(s) of one {option.machine_type}")
    reasons = [
        f"serving: {engine.display_name} (the default engine), tensor-parallel over {where}, {est.per_gpu_gb:.1f} GB "
        f"of each {option.memory_gb:g} GB ({_parts(est)}), {budget}",
        f"cacheSize: {cache} for the weights ({weights / GB:.0f} GB) and the engine's kernels on the node's disk",
        (f"replicas: 1 (each replica takes {option.nodes} nodes of the pool, a LeaderWorkerSet group restarted "
         "whole; raise maxNodes with it)" if option.multi_node_replica else
         "replicas: 1 (each replica takes a node of the pool; raise maxNodes with it)"),
    ]
    return {"deepspeed-stack:workloads": {"serve": workload}}, reasons


# (request, strategy, option, Hugging Face id) -> the stack config's workload keys and the reasons for them.
WorkloadWriter = Callable[[Request, Strategy, Option, str], tuple[dict[str, Any], list[str]]]
FINETUNE = "finetune"
BUCKET_DATASET = "data/train.jsonl"  # the finetune kind reads its data from the stack's bucket (datasetPath)


def _lora_keys(request: Request) -> dict[str, Any]:
    """`finetune.lora` as the plan was sized: the adapter's rank and targets, or every parameter."""
    if request.lora is None:
        return {"enabled": False}
    return {"enabled": True, "rank": request.lora.rank, "targetModules": list(request.lora.targets)}


def _finetune(request: Request, strategy: Strategy, option: Option, model_id: str) -> tuple[dict[str, Any], list[str]]:
    """The finetune kind on the plan sized for what it trains (LoRA's adapters on the frozen model, as
    `make gpus MODE=finetune` asks; every parameter for a request without LoRA, MODE=training): the pool, workers and
    ds_config of the plan; data, checkpoints and the result in the stack's bucket, the claim only for the download."""
    job, reasons = _job(request, strategy, option)
    operator = job.pop("deepspeed-stack:mpiOperator")
    weights = request.model.parameters * BYTES_PER_PARAM[request.precision]
    workload = {"kind": FINETUNE, **job, "gcsFuse": {"enabled": True, "mountPath": "/gcs"},
                "finetune": {"model": model_id, "datasetPath": BUCKET_DATASET,
                             "sequenceLength": request.sequence_length, "epochs": 1,
                             "gradientCheckpointing": request.gradient_checkpointing, "lora": _lora_keys(request)}}
    checkpoint = recovery.checkpoint_bytes(request.trained_parameters, request.precision, exported=True)
    if request.lora is None:  # every parameter: finetune.lora.enabled's own advice (model/schema.yaml)
        workload["deepspeed"]["learningRate"] = FULL_LEARNING_RATE
    reasons.append(batch_reason(workload["deepspeed"], request))
    if request.lora is not None:
        what = (f"finetune: {request.training_label} on {model_id}, sized as such: only the adapters have "
                "gradients and optimizer states; lora.enabled: false trains every parameter (`make gpus "
                "MODE=training` sizes that)")
    else:
        what = f"finetune: every parameter of {model_id} ({request.training_label})"
    reasons += [
        what,
        f"storage: {_gib(weights, 100)} of Filestore Basic HDD (standard-rwx) for the model download "
        f"({weights / GB:.0f} GB); checkpoints ({checkpoint / GB:.2f} GB each: what trains, its optimizer states "
        f"and the Trainer's copy) go to the bucket's checkpoints/{TRAINER}/",
        f"finetune.datasetPath: upload your JSONL to gs://<the bucket output>/{BUCKET_DATASET} after `pulumi up` "
        f"(the launcher waits for it); the model lands in models/{TRAINER}/ in the bucket"]
    return {"deepspeed-stack:storage": {"enabled": True}, "deepspeed-stack:mpiOperator": operator,
            "deepspeed-stack:workloads": {TRAINER: workload}}, reasons


# The workload each mode writes. `finetune`'s Request is a training one with LoRA (planner/requests.py
# mode_request); both are written as the finetune kind, whose launcher waits for the data in the bucket (an MPIJob
# of finetune.py would start before anyone could put the data on its claim, and fail).
WORKLOADS: dict[str, WorkloadWriter] = {TRAINING: _finetune, INFERENCE: _inference, FINETUNE: _finetune}
SERVER_OPTIONS = 3  # the cheapest server options tried with each trainer (a LoRA adapter adds to the plain plan)


def _model_reasons(model_id: str) -> list[str]:
    if model_id == MODEL_PLACEHOLDER:
        return [f"model: {MODEL_PLACEHOLDER} stands in for the Hugging Face id of your model: name it"]
    return [f"hfToken: if {model_id} is gated on Hugging Face (Llama and Gemma are), `pulumi config set --secret "
            "hfToken hf_...`; the pods read it from a mounted file"]


def candidates(request: Request, region: str, stack: str, cat: gpu_catalog.Catalog | None = None,
               top: int = 50, model_id: str | None = None, writer: str | None = None,
               held: Held | None = None) -> list[Candidate]:
    """Every option the planner recommends, as a stack config, cheapest first (on-demand, then spot $/h).
    Inference stays on one node where one holds the model (else one replica across nodes). `model_id`: the Hugging
    Face id (default: from data/models.yaml). `writer`: the WORKLOADS entry (default: the request's mode). `held`: the
    capacity the user holds (GPUS=): its options only."""
    cat = cat or gpu_catalog.load()
    model_id = model_id or hf_id(request.model.name) or MODEL_PLACEHOLDER
    write = WORKLOADS[writer or request.mode]
    plans = recommend(request, region, cat, max_nodes=MAX_NODES, top=top,
                      held=held)
    ranked = sorted(((p.strategy, o) for p in plans for o in p.options), key=lambda so: so[1].sort_key())
    out = []
    for strategy, option in ranked:
        config = _platform(stack, region, option, option.nodes)
        workload, reasons = write(request, strategy, option, model_id)
        out.append(Candidate(request.mode, strategy, option, {**config, **workload},
                             reasons + _model_reasons(model_id)))
    return out


FALLBACK_RUN_SECONDS = 604800  # flex-start's most (data/capacity.yaml flexStart): the fallback's nodes run 7 days


def with_reservation(candidate: Candidate, res: Reservation) -> Candidate:
    """A trainer's stack on the reservation it holds (RESERVATION=): its GPU pool consumes the reservation and knows
    its end, and a DWS pool of the same machines (flex-start, queued provisioning) is the trainer's fallbackPool,
    queued by Kueue, so that the run goes on there from its newest checkpoint when the reservation's nodes go away
    (docs/capacity.md, Outliving a reservation). Other candidates (a server's pool) as they are."""
    config = {k: (list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v)
              for k, v in candidate.config.items()}
    pools = [dict(p) for p in config["deepspeed-stack:nodePools"]]
    reserved = pools[0]
    fallback = {**copy.deepcopy(reserved), "name": f"{reserved['name']}-dws", "flexStart": True,
                "queuedProvisioning": True, "maxRunDuration": f"{FALLBACK_RUN_SECONDS}s"}
    reserved.update(reservation=res.name, reservationEndTime=res.end_time)
    config["deepspeed-stack:nodePools"] = [reserved, fallback, *pools[1:]]
    # Flex-start needs a GKE that has it (data/capacity.yaml flexStart.minGkeVersion): say so.
    config["deepspeed-stack:cluster"] = {**config["deepspeed-stack:cluster"], "minMasterVersion": "1.33"}
    config["deepspeed-stack:kueue"] = {"install": True}
    workloads = {name: dict(w) for name, w in config["deepspeed-stack:workloads"].items()}
    for w in workloads.values():
        if w.get("pool") == reserved["name"]:
            w["fallbackPool"] = fallback["name"]
    config["deepspeed-stack:workloads"] = workloads
    reasons = [*candidate.reasons,
               f"reservation: pool {reserved['name']} consumes {res.name} ({res.held.describe()}) until "
               f"{res.end_time} (reservationEndTime); it is paid whether its nodes work or not, so the plan uses "
               "all of them",
               f"fallbackPool: {fallback['name']}, the same machines from DWS flex-start with queued provisioning, "
               "in Kueue after the reservation's flavor: at the end the reservation's flavor loses its quota and "
               "the run, requeued when its nodes go away, continues there from its newest checkpoint"]
    return msgspec.structs.replace(candidate, config=config, reasons=reasons)


def with_server(trainer: Candidate, server: Candidate) -> Candidate:
    """The trainer's stack with the server of its result: the server's pool (its own name; on-demand, as every
    written pool), and a `serve` workload of MODEL_DIR (`serving.fromWorkload`) read through the bucket."""
    config = dict(trainer.config)
    (pool,) = server.config["deepspeed-stack:nodePools"]
    pool = {**pool, "name": f"{pool['name']}-{SERVER}"}
    config["deepspeed-stack:nodePools"] = [*config["deepspeed-stack:nodePools"], pool]
    (serve,) = server.config["deepspeed-stack:workloads"].values()
    serving = {k: v for k, v in serve["serving"].items() if k != "model"}
    serve = {**serve, "pool": pool["name"], "serving": {"fromWorkload": TRAINER, **serving},
             "gcsFuse": {"enabled": True, "mountPath": "/gcs"}}
    config["deepspeed-stack:workloads"] = {**config["deepspeed-stack:workloads"], SERVER: serve}
    reasons = [*trainer.reasons,
               f"{SERVER}: the server of the result (serving.fromWorkload: {TRAINER}), on pool {pool['name']}: "
               f"{server.reasons[0].removeprefix('serving: ')}; its pod waits in Init for models/{TRAINER}/.complete "
               "in the bucket, which training writes last, its node up meanwhile (SERVE=0 writes training only)"]
    return msgspec.structs.replace(trainer, config=config, reasons=reasons, server=server.option)


def with_servers(trainers: list[Candidate], servers: list[Candidate]) -> list[Candidate]:
    """Each trainer with each of the cheapest servers, cheapest pair first (on-demand, then spot $/h)."""
    pairs = [with_server(t, s) for t in trainers for s in servers[:SERVER_OPTIONS]]
    return sorted(pairs, key=lambda c: (round(c.option.on_demand + c.server.on_demand, 6),  # type: ignore[union-attr]
                                        round(c.option.spot + c.server.spot, 6)))  # type: ignore[union-attr]


def _block(key: str, value: Any) -> str:
    return yaml.safe_dump({key: value}, sort_keys=False, default_flow_style=False, width=100).rstrip("\n")


def _comment(text: str, indent: str = "") -> list[str]:
    """`text` as comment lines; a continued line hangs under the text of a list item (`  1. `, `  - `)."""
    wrapped = textwrap.wrap(text, COMMENT_WIDTH - len(indent), break_on_hyphens=False, break_long_words=False)
    item = LIST_ITEM.match(text)
    hang = " " * (len(item.group()) if item else 2)
    return [f"# {indent}{wrapped[0]}", *(f"# {indent}{hang}{w}" for w in wrapped[1:])] if wrapped else ["#"]


def render(candidate: Candidate, header: list[str]) -> str:
    """The stack file: `header` comments, the plan's reasons, then `config:` with each block under its key."""
    lines = [line for h in header for line in _comment(h)]
    lines += ["#", "# Why each choice:"] + [line for r in candidate.reasons for line in _comment(r, "  ")]
    lines.append("config:")
    for key, value in candidate.config.items():
        if key == "gcp:project":
            lines.append("  # Your project id (`pulumi config set gcp:project <id>`).")
        body = _block(key, value)
        lines += [f"  {line}" for line in body.splitlines()]
    return "\n".join(lines) + "\n"


def summary_line(candidate: Candidate) -> str:
    o, server = candidate.option, candidate.server
    on_demand, spot = o.on_demand + (server.on_demand if server else 0), o.spot + (server.spot if server else 0)
    return (f"{candidate.label} in {o.zones[0]}, ${on_demand:,.2f}/h on-demand for the GPU nodes "
            f"(${spot:,.2f}/h spot)")


__all__ = ["FINETUNE", "INFERENCE", "SERVER", "TRAINER", "TRAINING", "WORKLOADS", "Candidate", "candidates",
           "cluster_name", "hf_id", "pool_name", "render", "short_name", "summary_line", "with_reservation",
           "with_server", "with_servers"]
