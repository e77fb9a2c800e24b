"""finetune.py on Intel Gaudi (HPU): the Hugging Face Trainer swapped for optimum-habana's GaudiTrainer, the way
Intel ships HF Trainer + DeepSpeed on HPU ("adapting a script using the Trainer ... consists in simply swapping the
Trainer class for the GaudiTrainer one": optimum-habana's quickstart), so every other part of the recipe (the data
formats, the chat templates, LoRA, resume, the SIGTERM checkpoint, the export and its marker) is the one that runs on
NVIDIA GPUs and on Vertex AI.

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
