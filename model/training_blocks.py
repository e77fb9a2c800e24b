"""The blocks of keys of the kinds that train (helm, mpijob, finetune: model/workload_training.py), and the facts about
them that more than one kind or layer reads (a script's Hugging Face ids, the fine-tuning contract's folders).
"""

from __future__ import annotations

import re

import msgspec

from model.workload_base import LoraConfig

# A Hugging Face repo id: OWNER/NAME, each of letters, digits, '-', '_', '.' (huggingface_hub's validate_repo_id);
# a path (/data/..., ./x, ../x) or a URL (gs://...) is none.
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


def hub_ids(tokens: list[str]) -> list[tuple[int, str]]:
    """(index, id) of each script argument that names a Hugging Face repo id, alone or as `--flag=ID`: a training
    script given one downloads it (finetune.py's --model, and the `--model_name_or_path` of most others)."""
    found = []
    for j, token in enumerate(tokens):
        value = token.split("=", 1)[1] if token.startswith("-") and "=" in token else token
        if HUB_ID.fullmatch(value):
            found.append((j, value))
    return found


class GaudiConfig(msgspec.Struct, frozen=True):
    software_version: str
    pytorch_version: str
    os: str
    install_at_start: bool


class ChartConfig(msgspec.Struct, frozen=True):
    version: str
    repository: str
    client_gpu: bool  # the client on the workers' GPU pool (else on the system pool, CPU and memory only)


class LaunchConfig(msgspec.Struct, frozen=True):
    script: str
    args: list[str]
    command: str | None = None


# Not a schema key (the schema refuses a stack file that writes it): the config reader's record of what was written.
WRITTEN_KEY = "x-written"


class FinetuneLoraConfig(LoraConfig, frozen=True):
    """`finetune.lora`: LoRA's settings, and what MODEL_DIR holds at the end."""

    export: str  # ADAPTER_EXPORT (peft's adapter folder) or "merged" (a whole model)


ADAPTER_EXPORT = "adapter"


class TrainingConfig(msgspec.Struct, frozen=True):
    model: str
    dataset: str
    epochs: int
    script: str
    optimum_habana_version: str
    args: list[str]
    lora: LoraConfig
    # The keys of `training` the stack file wrote (the config reader fills it: model/config.py written_training):
    # a key beside `finetune` is refused even at its default value, which the value alone cannot tell from none.
    written: tuple[str, ...] = msgspec.field(default=(), name=WRITTEN_KEY)


class ProxyConfig(msgspec.Struct, frozen=True):
    http: str
    https: str
    no_proxy: str


class DeepSpeedConfig(msgspec.Struct, frozen=True):
    zero_stage: int
    offload_optimizer: str
    offload_params: str
    nvme_path: str
    precision: str
    micro_batch_per_gpu: int
    gradient_accumulation: int
    reduce_bucket_size: int
    allgather_bucket_size: int
    steps_per_print: int
    learning_rate: float
    gradient_clipping: float
    train_batch_size: int | None = None


class FinetuneConfig(msgspec.Struct, frozen=True):
    """`finetune` of a `finetune` workload: what recipes/finetune.py trains on what (the fine-tuning
    contract's arguments, from typed keys)."""

    format: str
    record_format: str  # finetune_data.py's RECORD_FORMATS
    roles: dict[str, str]  # the data's role names -> system | user | assistant
    chat_template: str  # auto | raw | a template of data/chat_templates.yaml
    sequence_length: int
    save_steps: int
    gradient_checkpointing: bool
    lora: FinetuneLoraConfig
    model: str | None = None  # a Hugging Face model id
    model_path: str | None = None  # or a folder of the stack's bucket
    dataset: str | None = None  # a Hugging Face dataset id
    dataset_path: str | None = None  # or a file or folder of the stack's bucket
    text_field: str | None = None  # None: finetune.py's default, `text`
    prompt_field: str | None = None
    response_field: str | None = None
    messages_field: str | None = None  # None: the record format's own (messages, sharegpt conversations)
    role_field: str | None = None
    content_field: str | None = None
    eval_split: float | str | None = None  # a fraction of the records, or a file or folder of the bucket
    epochs: float | None = None  # None with max_steps None: finetune.py's default, one pass
    max_steps: int | None = None
    lr_scheduler: str | None = None  # None: the Trainer's own, linear
    dataset_tokens: int | None = None  # the data's token count, for the run's estimate (planner/run_estimate.py)
    # None: finetune.py's --packing auto (text records packed into blocks, chat and prompt/completion not); true:
    # chat and prompt/completion records in padding-free batches too; false: nothing packed.
    packing: bool | None = None


def eval_path(f: FinetuneConfig) -> str | None:
    """`evalSplit` when it names a file or folder, not a fraction (a number, or text that reads as one: `pulumi config
    set` may store 0.05 as text)."""
    value = f.eval_split
    if not isinstance(value, str):
        return None
    try:
        float(value)
    except ValueError:
        return value
    return None


def run_dirs(root: str, name: str) -> tuple[str, str]:
    """The fine-tuning contract's layout under an output root, on every platform (GKE's bucket or claim, Gaudi's
    claim, Vertex AI's bucket): CHECKPOINT_DIR <root>/checkpoints/<name> and MODEL_DIR <root>/models/<name>."""
    base = root.rstrip("/")
    return f"{base}/checkpoints/{name}", f"{base}/models/{name}"
