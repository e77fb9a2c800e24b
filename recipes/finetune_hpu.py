"""finetune.py on Intel Gaudi (HPU): the Hugging Face Trainer swapped for optimum-habana's GaudiTrainer, the way
Intel ships HF Trainer + DeepSpeed on HPU ("adapting a script using the Trainer ... consists in simply swapping the
Trainer class for the GaudiTrainer one": optimum-habana's quickstart), so every other part of the recipe (the data
formats, the chat templates, LoRA, resume, the SIGTERM checkpoint, the export and its marker) is the one that runs on
NVIDIA GPUs and on Vertex AI.

The Gaudi image carries the transformers its optimum-habana release pins (4.45 for v1.14.0-v1.16.0, up to 4.55 for
v1.20.0-v1.21.0: data/gaudi_software.yaml), older than the one the recipe is written against (data/versions.yaml).
Four keywords changed since; the functions at the end pick each by the installed version. The recipe runs from
transformers 4.45 on (docs/measurements.md, "finetune.py on the Gaudi image's older transformers"); the stack refuses
an optimum-habana release that pins an older one (checks/gaudi.py).

The run is on HPU when DS_ACCELERATOR says `hpu` (DeepSpeed's own variable; the stack's Gaudi MPIJob sets it), or,
unset, when Habana's PyTorch bridge is installed. Standard library only at the top: the stack reads this module
without torch.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable, Mapping
from typing import Any

HPU = "hpu"
# transformers releases that renamed or widened a keyword the recipe passes (their release notes; the wheels' code).
PROCESSING_CLASS_SINCE = (4, 46)  # Trainer(processing_class=); before, Trainer(tokenizer=)
NON_PADDING_TOKENS_SINCE = (4, 57)  # include_num_input_tokens_seen="non_padding"; before, a bool (True: all tokens)
DTYPE_SINCE = (4, 56)  # from_pretrained(dtype=); before, torch_dtype= (still read, deprecated, after)
LOGS_ENV_SINCE = (5, 0)  # TensorBoard's writer reads TENSORBOARD_LOGGING_DIR; before, TrainingArguments(logging_dir=)
DATASETS_LIST_SINCE = (4, 0)  # datasets' List feature; before, Sequence (v1.19.x pins datasets<=2.19.2)
# masking_utils.find_packed_sequence_indices (4.54.0's wheel has it, 4.53.0's not): from then on, with no attention
# mask and no KV cache, the masks keep the records of a padding-free row apart by their restarting position ids.
# Before, every record attends to the ones before it in the row (tests/recipe on 4.45.2: logits off by 0.40).
PACKED_MASKS_SINCE = (4, 54)


def hpu_run(environ: Mapping[str, str], bridge_installed: Callable[[], bool] | None = None) -> bool:
    """DS_ACCELERATOR=hpu, or no DS_ACCELERATOR and habana_frameworks importable (Habana's images)."""
    chosen = environ.get("DS_ACCELERATOR", "").strip().lower()
    if chosen:
        return chosen == HPU
    installed = bridge_installed or (lambda: importlib.util.find_spec("habana_frameworks") is not None)
    return installed()


def gaudi_trainer_kwargs() -> dict[str, Any]:
    """GaudiTrainingArguments' own: HPU, lazy mode (Habana's default graph mode for training)."""
    return {"use_habana": True, "use_lazy_mode": True}


def trainer_classes(environ: Mapping[str, str]) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(Trainer, TrainingArguments) for this run: transformers' own, or on HPU optimum-habana's, with the Gaudi
    arguments and config bound (the callers pass the same keywords on every platform)."""
    if not hpu_run(environ):
        from transformers import Trainer, TrainingArguments

        return Trainer, TrainingArguments
    from optimum.habana import GaudiConfig, GaudiTrainer, GaudiTrainingArguments
    from optimum.habana.transformers.modeling_utils import adapt_transformers_to_gaudi

    adapt_transformers_to_gaudi()  # optimum-habana's model patches for HPU, before any model is loaded
    # Fused AdamW and clipping: the settings of optimum-habana's own Gaudi configs for LLM fine-tuning.
    config = GaudiConfig(use_fused_adam=True, use_fused_clip_norm=True)
    return (functools.partial(GaudiTrainer, gaudi_config=config),
            functools.partial(GaudiTrainingArguments, **gaudi_trainer_kwargs()))


def release(version: str) -> tuple[int, int]:
    """A transformers version's (major, minor): "4.45.2" -> (4, 45), "5.0.0.dev0" -> (5, 0)."""
    major, minor, *_ = version.split(".")
    return int(major), int(minor)


def tokenizer_keyword(version: str) -> str:
    """The Trainer's keyword for the tokenizer under this transformers version."""
    return "processing_class" if release(version) >= PROCESSING_CLASS_SINCE else "tokenizer"


def dtype_keyword(version: str) -> str:
    """from_pretrained's keyword for the weights' dtype under this transformers version."""
    return "dtype" if release(version) >= DTYPE_SINCE else "torch_dtype"


def tokens_seen(version: str, *, padding_free: bool = False) -> str | bool:
    """include_num_input_tokens_seen: the tokens that are not padding ("all" for padding-free batches, which have
    none); before 4.57 a bool, True counting every token, so there the tokens/s and MFU in the logs are high by the
    padded share of each batch."""
    if release(version) < NON_PADDING_TOKENS_SINCE:
        return True
    return "all" if padding_free else "non_padding"


def logging_dir_arguments(version: str, logs: str | None) -> dict[str, str]:
    """TrainingArguments' logging_dir where this transformers' TensorBoard writer does not read its folder from
    TENSORBOARD_LOGGING_DIR (before 5.0: else its event files go to the checkpoints' runs/ folder)."""
    return {"logging_dir": logs} if logs is not None and release(version) < LOGS_ENV_SINCE else {}


def token_ids_feature(datasets: Any) -> Any:
    """A column of int32 token ids: datasets' List from 4.0, Sequence before (the same Arrow list type)."""
    if release(datasets.__version__) >= DATASETS_LIST_SINCE:
        return datasets.List(datasets.Value("int32"))
    return datasets.Sequence(datasets.Value("int32"))


def padding_free_problem(version: str, hpu: bool) -> str | None:
    """Why padding-free batches (--packing on with chat or prompt/completion records) would train records that see
    each other here, or None where they are kept apart."""
    if hpu:
        # optimum-habana's adapt_transformers_to_gaudi swaps in its own attention and mask code, which is not
        # known to read record boundaries from position ids [U: not read in its source]: refused, not guessed.
        return ("padding-free batches are not proven on Gaudi (optimum-habana replaces the model's attention); "
                "set it false there (text records are still packed into blocks)")
    if release(version) < PACKED_MASKS_SINCE:
        return (f"padding-free batches need transformers 4.54 or later, whose attention masks keep a row's records "
                f"apart; this is {version}: set it false")
    return None
