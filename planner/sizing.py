"""Memory one accelerator needs for a model: inference (weights + KV cache) or training (ZeRO model states).

Sizes are bytes inside, reported in GB of 10^9 bytes (the unit GPU memory is quoted in; a GiB-based
reading would only add headroom). Every constant below says where it comes from; all of it is an estimate.

Inference, per accelerator, with the weights tensor-parallel over all G accelerators of one node, as the serving
engine (model/serving_engines.py, data/serving.yaml) takes memory:
    vLLM (the default): (weights / G + KV cache per GPU) x (1 + INFERENCE_OVERHEAD) + CUDA_CONTEXT, within
               `--gpu-memory-utilization` (0.90) of the GPU: it fits with 1 - 0.90 = HEADROOM free
    FastGen (MII): weights / G + KV cache per GPU + its 1 GB reserve + CUDA_CONTEXT, within the whole GPU (its KV
               cache then takes every other free byte, so nothing more is kept free)
    weights  = parameters x bytes per parameter (fp32 4, fp16/bf16 2, int8 1, int4 0.5)
    KV cache = 2 (K and V) x layers x KV heads x head dim x sequence x batch x 2 bytes (4 for fp32; weight-only
               quantisation keeps a 16-bit cache); per GPU the KV heads divide over G, and a GPU holds at least one
               (vLLM and FastGen replicate KV heads when G exceeds them)
    LoRA     = vLLM's adapter slots with `--enable-lora`: max_loras x max_lora_rank x (inputs + outputs) of every
               LoRA-capable linear layer (a Llama layer's qkv, o, gate_up and down projections) x 2 bytes (4 for
               fp32), not divided over G (an upper bound: one side of each pair is sharded)
    Across nodes (a replica no single node holds, vLLM's multi-node layout): tensor-parallel over G = one node's
               GPUs, pipeline-parallel over P nodes; each GPU holds the largest stage's share of the layers,
               ceil(layers / P) / layers, of the weights, the KV cache and the LoRA slots (`stage_share`; the
               embeddings are counted as spread like the layers: within a stage's rounding)

Training: mixed-precision Adam partitioned by ZeRO over the N data-parallel GPUs, counted the way DeepSpeed's
own estimators count it (`estimate_zero2_model_states_mem_needs`, `estimate_zero3_model_states_mem_needs`), which
is the ZeRO paper's 16 bytes per parameter (2 fp16 weights + 2 fp16 gradients + 12 fp32 weights, momentum and
variance; Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", sec.
3.1) plus the fp32 gradient partition (4 bytes) DeepSpeed's optimizer steps on; see `model_states`.
Then activations, DeepSpeed's communication buckets and the CUDA context are added.

LoRA (a `Request` with `lora`, the finetune kind's default): the base model is frozen and only the adapters train
(`lora_parts`):
    frozen weights = parameters x 2 bytes (4 in fp32), the training precision the model is loaded and kept in
               (finetune.py loads it with that dtype; DeepSpeed 0.19.8 casts every parameter to it,
               deepspeed/runtime/engine.py _configure_distributed_model); ZeRO-3 partitions them over the N ranks
               (zero.Init, which the Trainer enables when ds_config.json says stage 3), stages 0-2 replicate them.
               No gradients and no optimizer states: they do not require grad.
    adapters = rank x (in + out) per targeted linear layer of every decoder layer (data/models.yaml
               `architectures`, with its sources), trained as any parameter is: mixed-precision Adam partitioned
               by the ZeRO stage (`model_states`). peft upcasts the adapters to fp32 when it adds them
               (cast_adapter_dtype), and DeepSpeed then casts them to the training precision with an fp32 master
               copy in the optimizer, so they cost what a trained parameter costs.
    ZeRO-3 gathers one frozen layer's weights at a time (the largest: the embedding), without a gradient.
Activations are the same as for full fine-tuning: the backward pass still runs through every frozen layer (the
adapters of the earlier layers need it), and each targeted layer's input is kept for its adapter's gradient.

Activations of one layer without recomputation, per micro batch of b sequences of s tokens, hidden h and a
attention heads: s x b x h x (34 + 5 a s / h) bytes in 16-bit (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", sec. 4.1 eq. 1; GPT's 4h MLP, which Llama's 8h/3 SwiGLU is taken to
match: an assumption). The 5as/h term is the attention scores, softmax and its dropout mask, which PyTorch's
scaled_dot_product_attention (flash and memory-efficient kernels, transformers' default attention) never stores:
left out (an assumption where a model or GPU falls back to eager attention). With gradient checkpointing (every
layer recomputed, as the Hugging Face Trainer does it) only each layer's 16-bit input stays (2 x s x b x h), plus
one layer's full activations while it is recomputed. See `activation_bytes`.

What is sized lives beside this module: the model, its shape and LoRA's adapter parameters in planner/model_catalog.py
(data/models.yaml), the `Request`, `Strategy` and `Estimate` in planner/sizing_types.py; here, the arithmetic.
"""

from __future__ import annotations

import math

from model import serving_engines
from planner.model_catalog import ModelShape
from planner.sizing_types import GB, Estimate, Request, Strategy

BYTES_PER_PARAM = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "int8": 1.0, "int4": 0.5}
TRAINING_PRECISIONS = ("fp32", "fp16", "bf16")
# Inference: forward-pass activations, sampling buffers and allocator fragmentation on top of weights + KV cache.
INFERENCE_OVERHEAD = 0.10
# What the CUDA context (driver, cuBLAS/NCCL workspaces) takes in every process before the first tensor.
CUDA_CONTEXT_BYTES = 0.5 * GB
# DeepSpeed's estimators multiply their CPU memory estimate by this buffer factor (their default).
DEEPSPEED_CPU_BUFFER_FACTOR = 1.5
# Activations of one transformer layer: 34 x s x b x h bytes in 16-bit (Korthikanti et al. 2022, "Reducing
# Activation Recomputation in Large Transformer Models", eq. 1, without the 5as/h attention-score term that
# flash attention never stores).
LAYER_ACTIVATION_FACTOR = 34
# fp32 logits and their gradient, per token and vocabulary entry (Hugging Face causal LMs upcast the logits).
LOGITS_BYTES = 8


# --- inference -----------------------------------------------------------------------------------------------------

def weights_bytes(parameters: float, precision: str) -> float:
    return parameters * BYTES_PER_PARAM[precision]


def kv_cache_bytes(shape: ModelShape, sequence_length: int, batch_size: int, precision: str) -> float:
    per_value = 4 if precision == "fp32" else 2
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * sequence_length * batch_size * per_value


def kv_cache_per_gpu(shape: ModelShape, sequence_length: int, batch_size: int, precision: str, gpus: int) -> float:
    """The KV cache one of `gpus` tensor-parallel GPUs holds: its share of the KV heads, at least one head (both
    engines replicate KV heads when there are more GPUs than KV heads)."""
    heads_per_gpu = max(shape.kv_heads / gpus, 1.0)
    return kv_cache_bytes(shape, sequence_length, batch_size, precision) * heads_per_gpu / shape.kv_heads


def lora_bytes(shape: ModelShape, slots: int, rank: int, precision: str) -> float:
    """vLLM's preallocated LoRA stacks (data/serving.yaml vllm LoRA): for each layer's qkv, o, gate_up and down
    projection, A (rank x inputs) and B (outputs x rank) per slot, in the model's dtype."""
    attention = shape.heads * shape.head_dim
    qkv = shape.hidden + (shape.heads + 2 * shape.kv_heads) * shape.head_dim
    sides = qkv + (attention + shape.hidden) + (shape.hidden + 2 * shape.intermediate) + (shape.intermediate
                                                                                          + shape.hidden)
    per_value = 4 if precision == "fp32" else 2
    return float(slots * rank * shape.layers * sides * per_value)


def stage_share(layers: int, stages: int) -> float:
    """The share of the model's layers the largest of `stages` pipeline stages holds (vLLM's get_pp_indices gives
    each stage layers // stages, the remainder to some of them): ceil(layers / stages) / layers."""
    return 1.0 if stages <= 1 else math.ceil(layers / stages) / layers


def inference_parts(request: Request, gpus: int, stages: int = 1) -> dict[str, float]:
    """One GPU of a replica tensor-parallel over `gpus` (a node's) and, across nodes, pipeline-parallel over `stages`
    (one per node): its share of the weights, KV cache and LoRA stacks of the largest stage's layers."""
    share = stage_share(request.model.shape.layers, stages)
    weights = weights_bytes(request.model.parameters, request.precision) / gpus * share
    kv = share * kv_cache_per_gpu(request.model.shape, request.sequence_length, request.batch_size,
                                  request.precision, gpus)
    engine = request.serving_engine
    if engine.memory == serving_engines.RESERVE:
        # FastGen: the weights, the KV cache of the sequences asked for, and the reserve it leaves after the cache
        # (which covers activations); then its cache grows into the rest.
        return {"weights": weights, "KV cache": kv, "reserve": engine.reserve_bytes, "CUDA context": CUDA_CONTEXT_BYTES}
    lora = share * lora_bytes(request.model.shape, request.adapter_slots, request.adapter_rank, request.precision)
    return {"weights": weights, "KV cache": kv, **({"LoRA adapters": lora} if lora else {}),
            "overhead": INFERENCE_OVERHEAD * (weights + kv + lora), "CUDA context": CUDA_CONTEXT_BYTES}


# --- training: ZeRO ------------------------------------------------------------------------------------------------

def zero_paper_bytes(parameters: float, stage: int, gpus: int, k: int = 12) -> float:
    """Model states per GPU as the ZeRO paper (Rajbhandari et al. 2020, fig. 1) gives them for mixed-precision
    Adam: 2P fp16 weights + 2P fp16 gradients + K x P optimizer states (K = 12), partitioned by stage over N."""
    p, n = parameters, gpus
    return {0: (4 + k) * p, 1: 4 * p + k * p / n, 2: 2 * p + (2 + k) * p / n, 3: (4 + k) * p / n}[stage]


def model_states(parameters: float, strategy: Strategy, gpus: int, precision: str = "bf16",
                 largest_layer: float = 0.0) -> dict[str, float]:
    """Model states per GPU, in bytes, as DeepSpeed allocates (and estimates) them.

    Mixed precision (fp16/bf16), bytes per parameter, N data-parallel GPUs:
      stage 0: 2 weights + 2 gradients + 4 fp32 gradients + 12 optimizer            = 20
      stage 1: 2 weights + 2 gradients + (4 + 12) / N                                = 4 + 16/N
      stage 2: 2 weights + (2 + 4 + 12) / N                                          = 2 + 18/N  (DeepSpeed: 2 + 18/N)
      stage 3: (2 weights + 4 fp32 gradients + 12) / N + 4 x largest layer          = 18/N + 4L (DeepSpeed: same)
               (stage 3 reduces fp16 gradients through buckets straight into the fp32 partition; the largest
               layer's fp16 weights and gradients are gathered whole while it runs)
      optimizer offload moves the fp32 gradients, the optimizer states and (stage 2) the fp16 gradient partition
      to the CPU: stage 2 -> 2 (DeepSpeed: 2), stage 3 -> 2/N + 4L (DeepSpeed: same); parameter offload (stage 3)
      also moves the fp16 weights: -> 4L (DeepSpeed: same).
    fp32 (no mixed precision): 4 weights + 4 gradients + 8 optimizer (momentum, variance), partitioned alike, and
    the gathered largest layer is 8 x L.
    """
    mixed = precision != "fp32"
    n, stage = gpus, strategy.zero_stage
    if stage is None:
        raise ValueError("model states are a training quantity; inference has no ZeRO stage")
    w = 2.0 if mixed else 4.0  # training weights (and their gradients)
    g32 = 4.0 if mixed else 0.0  # the fp32 gradient partition DeepSpeed's mixed-precision optimizer steps on
    opt = 12.0 if mixed else 8.0  # (fp32 master weights +) momentum + variance
    weights = w / n if stage == 3 else w
    # Mixed-precision stage 3 keeps no 16-bit gradient partition: buckets reduce straight into the fp32 one.
    grads = 0.0 if stage == 3 and mixed else (w / n if stage >= 2 else w)
    fp32_grads = g32 / n if stage >= 1 else g32
    optimizer = opt / n if stage >= 1 else opt
    if strategy.offload_optimizer and stage >= 1:
        fp32_grads = optimizer = 0.0
        if stage >= 2:
            grads = 0.0
    if strategy.offload_params and stage == 3:
        weights = 0.0
    live_layer = 2 * w * largest_layer if stage == 3 else 0.0
    p = parameters
    return {"weights": weights * p, "gradients": grads * p, "fp32 gradients": fp32_grads * p,
            "optimizer states": optimizer * p, "gathered layer": live_layer}


def deepspeed_cpu_bytes(parameters: float, strategy: Strategy, gpus_per_node: int, nodes: int) -> float:
    """CPU memory per node for offloaded states, as DeepSpeed's estimators give it (buffer factor 1.5, ZeRO-3
    with zero.Init). Without offload DeepSpeed's figure only covers loading the model on the CPU, which depends
    on the training script, so it is left out (0)."""
    p, total = parameters, gpus_per_node * nodes
    if not strategy.offload_optimizer or strategy.zero_stage is None:
        return 0.0
    if strategy.zero_stage in (1, 2):
        return p * max(4 * total, 16) * DEEPSPEED_CPU_BUFFER_FACTOR
    per_param = 18 if strategy.offload_params else 16
    return p * per_param / nodes * DEEPSPEED_CPU_BUFFER_FACTOR


def activation_bytes(request: Request) -> float:
    """Activations per GPU for one micro batch (b sequences of s tokens, hidden h, L layers), doubled for fp32
    training, plus the fp32 logits and their gradient:
      with gradient checkpointing at every layer (DeepSpeed's and Hugging Face's recipe for large models): each
        layer's 16-bit input (2 x s x b x h x L) plus one layer's full activations while it is recomputed
        (LAYER_ACTIVATION_FACTOR x s x b x h);
      without: every layer's full activations, LAYER_ACTIVATION_FACTOR x s x b x h x L (Korthikanti et al.)."""
    shape, tokens = request.model.shape, request.sequence_length * request.batch_size
    scale = 2.0 if request.precision == "fp32" else 1.0
    layer = LAYER_ACTIVATION_FACTOR * tokens * shape.hidden * scale
    if request.gradient_checkpointing:
        layers = 2 * tokens * shape.hidden * shape.layers * scale + layer
    else:
        layers = layer * shape.layers
    return layers + LOGITS_BYTES * tokens * shape.vocab


def bucket_bytes(request: Request, stage: int) -> float:
    """DeepSpeed's gradient reduce bucket (and, at stages 1-2, the allgather bucket), in the training precision;
    never larger than what trains (the whole model, or LoRA's adapters)."""
    element = 4 if request.precision == "fp32" else 2
    p = request.trained_parameters
    buckets = min(request.reduce_bucket, p)
    if stage in (1, 2):
        buckets += min(request.allgather_bucket, p)
    return buckets * element


def frozen_weight_bytes(parameters: float, strategy: Strategy, gpus: int, precision: str) -> float:
    """Frozen weights per GPU in the training precision: partitioned over the N ranks at ZeRO-3 (on the CPU with
    parameter offload), a whole copy on each at stages 0-2."""
    w = 4.0 if precision == "fp32" else 2.0
    if strategy.zero_stage == 3:
        return 0.0 if strategy.offload_params else w * parameters / gpus
    return w * parameters


def lora_parts(request: Request, strategy: Strategy, gpus: int) -> dict[str, float]:
    """LoRA's model states per GPU: the frozen base (and, at ZeRO-3, its largest layer gathered: weights only, no
    gradient), then the adapters as trained parameters (`model_states`)."""
    w = 4.0 if request.precision == "fp32" else 2.0
    frozen = frozen_weight_bytes(request.model.parameters, strategy, gpus, request.precision)
    gathered = w * request.model.shape.largest_layer if strategy.zero_stage == 3 else 0.0
    adapter = model_states(request.adapter_parameters, strategy, gpus, request.precision)
    return {"frozen weights": frozen, "gathered layer": gathered,
            **{f"adapter {part}": value for part, value in adapter.items() if part != "gathered layer"}}


def training_parts(request: Request, strategy: Strategy, gpus: int) -> dict[str, float]:
    if request.precision not in TRAINING_PRECISIONS:
        raise ValueError(f"{request.precision} is a weight format for inference; ZeRO training runs in "
                         f"{', '.join(TRAINING_PRECISIONS)}")
    if request.lora is not None:
        states = lora_parts(request, strategy, gpus)
    else:
        states = model_states(request.model.parameters, strategy, gpus, request.precision,
                              request.model.shape.largest_layer)
    return {**states, "activations": activation_bytes(request),
            "buckets": bucket_bytes(request, strategy.zero_stage or 0), "CUDA context": CUDA_CONTEXT_BYTES}


def training_cpu_bytes(request: Request, strategy: Strategy, gpus_per_node: int, nodes: int) -> float:
    """CPU memory per node for what is offloaded: DeepSpeed's estimate for what trains (the adapters with LoRA),
    and with LoRA's frozen base offloaded at ZeRO-3 its partition of each node's ranks, with the same buffer."""
    cpu = deepspeed_cpu_bytes(request.trained_parameters, strategy, gpus_per_node, nodes)
    if request.lora is not None and strategy.offload_params and strategy.zero_stage == 3:
        frozen = frozen_weight_bytes(request.model.parameters, Strategy(3), gpus_per_node * nodes, request.precision)
        cpu += frozen * gpus_per_node * DEEPSPEED_CPU_BUFFER_FACTOR
    return cpu


def estimate(request: Request, strategy: Strategy, gpus_per_node: int = 1, nodes: int = 1) -> Estimate:
    """Memory per accelerator of `request` run with `strategy` on `nodes` x `gpus_per_node` accelerators."""
    gpus = gpus_per_node * nodes
    if strategy.training != (request.mode == "training"):
        raise ValueError(f"strategy {strategy.label} does not fit a {request.mode} request")
    if strategy.training:
        parts = training_parts(request, strategy, gpus)
        cpu = training_cpu_bytes(request, strategy, gpus_per_node, nodes)
    else:
        # A replica: tensor-parallel over one node's GPUs, pipeline-parallel across its nodes (vLLM's multi-node
        # layout, data/serving.yaml multiNode).
        parts, cpu = inference_parts(request, gpus_per_node, nodes), 0.0
    return Estimate(request, strategy, gpus_per_node, nodes, parts, cpu)
