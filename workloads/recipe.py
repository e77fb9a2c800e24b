"""The fine-tuning recipe on every platform: the `finetune` keys (model/schema.yaml `$defs.finetuneRun`, one
definition) -> recipes/finetune.py's arguments, rendered by the recipe's contract (recipes/contract.py FINETUNE:
each flag's key, type, default and bounds, declared once). The rules on those keys that do not depend on where the
run happens are workloads/recipe_rules.py's.

Three platforms run the same recipe with the same keys:
- GKE NVIDIA pools (kind finetune, workloads/kinds/finetune.py): data under the bucket's GCS FUSE mount;
- a Gaudi MPIJob (kind mpijob with `finetune`, workloads/mpijob/gaudi.py): data on the shared claim;
- a Vertex AI CustomJob (`vertex.finetune`, workloads/vertex_job.py): data under /gcs/<bucket>, Vertex's mount.

What differs is only the roots (`RecipeRoots`): where relative data paths are read, where checkpoints and the model
go (<output>/checkpoints/<run>, <output>/models/<run>: the contract's layout everywhere), and where ds_config.json and
a named chat template lie. The recipe is the one source of what it reads: its pure parts (formats, file endings, the
LoRA/ZeRO/precision combinations it cannot run) are imported from the recipes package (recipe_rules.py's
rules too), not copied here.
"""

from __future__ import annotations

import functools
import importlib
import json
from types import ModuleType
from typing import Any

import msgspec

from model import chat_templates
from model.training_blocks import eval_path, run_dirs
from model.types import FinetuneConfig, snake
from model.validators import at
from recipes import contract
from recipes.contract import DS_CONFIG_NAME, FINETUNE, TEMPLATE_NAME, number

SCRIPTS = contract.HERE  # recipes/: every program the stack runs in a container
SCRIPT = SCRIPTS / "finetune.py"
LIBRARY_GLOB = "finetune_*.py"  # finetune.py's modules, shipped beside it
__all__ = ["DS_CONFIG_NAME", "TEMPLATE_NAME", "number"]


@functools.cache
def script_module(name: str) -> ModuleType:
    """A module of the recipes package by its name (`finetune_tiered`): for e2e/run.py, which names them so."""
    return importlib.import_module(f"recipes.{name}")


class RecipeRoots(msgspec.Struct, frozen=True):
    """Where one platform's run reads and writes: all that differs between GKE, Gaudi and Vertex AI."""

    data: str  # relative modelPath, datasetPath and an evalSplit file are read under it
    output: str  # CHECKPOINT_DIR = <output>/checkpoints/<name>, MODEL_DIR = <output>/models/<name>
    config: str  # the folder of ds_config.json and a named chat template
    name: str  # the run's name: the workload's, or vertex.displayName

    def under(self, path: str) -> str:
        return f"{self.data.rstrip('/')}/{path}"

    @property
    def checkpoint_dir(self) -> str:
        return run_dirs(self.output, self.name)[0]

    @property
    def model_dir(self) -> str:
        return run_dirs(self.output, self.name)[1]


def eval_fraction(f: FinetuneConfig) -> float | None:
    """`evalSplit` as a fraction of the records (`pulumi config set` may store 0.05 as text); None for a file."""
    if f.eval_split is None or eval_path(f) is not None:
        return None
    return float(f.eval_split)


def model_arg(f: FinetuneConfig, roots: RecipeRoots) -> str:
    return f.model if f.model else roots.under(f.model_path or "")


def dataset_arg(f: FinetuneConfig, roots: RecipeRoots) -> str:
    return f.dataset if f.dataset else roots.under(f.dataset_path or "")


def data_paths(f: FinetuneConfig) -> list[str]:
    """The relative paths the run reads under the data root (the launcher waits for them on GKE)."""
    return [path for path in (f.model_path, f.dataset_path, eval_path(f)) if path]


def recipe_values(f: FinetuneConfig, learning_rate: float, roots: RecipeRoots) -> dict[str, Any]:
    """finetune.py's option values (recipes/contract.py FINETUNE) from the `finetune` keys, on every platform; None:
    the flag is left out and the script's own default applies. The precision, batch sizes and clipping are
    ds_config.json's (the script sets the Trainer to match); the output folders are given as arguments too (they
    equal CHECKPOINT_DIR and MODEL_DIR where the platform also sets those), so the layout never depends on which
    environment variables reach a rank over ssh."""
    named = f.chat_template not in (chat_templates.AUTO, chat_templates.RAW)
    fraction, path = eval_fraction(f), eval_path(f)
    shaped = {
        "deepspeed": f"{roots.config}/{DS_CONFIG_NAME}", "model": model_arg(f, roots),
        "dataset": dataset_arg(f, roots), "format": f.format,
        "records": None if f.record_format == "auto" else f.record_format,
        "prompt_field": f.prompt_field or None, "response_field": (f.response_field or "") if f.prompt_field else None,
        "text_field": None if f.prompt_field else f.text_field, "messages_field": f.messages_field,
        "role_field": f.role_field, "content_field": f.content_field,
        "roles": [f"{name}={role}" for name, role in sorted(f.roles.items())] or None,
        "chat_template": None if f.chat_template == chat_templates.AUTO else (
            f"{roots.config}/{TEMPLATE_NAME}" if named else f.chat_template),
        "eval_split": roots.under(path) if path is not None else fraction,
        "seq_len": f.sequence_length,
        # unset: the script's auto (text packed into blocks, chat and prompt/completion not)
        "packing": None if f.packing is None else "on" if f.packing else "off",
        # One or the other (the rules refuse both); neither: the script's own default, one pass over the data.
        "max_steps": f.max_steps, "epochs": f.epochs if f.max_steps is None else None,
        "learning_rate": learning_rate, "save_steps": f.save_steps,
        "gradient_checkpointing": f.gradient_checkpointing, "lora": f.lora.enabled,
        **({"lora_rank": f.lora.rank, "lora_alpha": f.lora.alpha, "lora_dropout": f.lora.dropout,
            "lora_export": f.lora.export, "lora_target_modules": f.lora.target_modules} if f.lora.enabled else {}),
        "checkpoint_dir": roots.checkpoint_dir, "model_dir": roots.model_dir,
    }
    # Every other option of a `finetune` key takes the key's value as it is: declaring it in the contract (and its
    # key in the schema and the typed model) is all the stack needs (docs/layout.md, adding a recipe option).
    plain = {o.name: getattr(f, snake(o.key[1])) for o in FINETUNE.options
             if len(o.key) == 2 and o.key[0] == "finetune" and o.name not in shaped}
    return {**shaped, **plain}


def recipe_args(f: FinetuneConfig, learning_rate: float, roots: RecipeRoots) -> list[str]:
    """finetune.py's arguments from the `finetune` keys, on every platform: the contract renders them."""
    return FINETUNE.argv(recipe_values(f, learning_rate, roots))


def recipe_files(f: FinetuneConfig, ds_config_text: str) -> dict[str, str]:
    """What lies in the config folder beside the script: finetune.py, its modules (with the package's __init__ as
    recipes.py: recipes/contract.py `sources`), ds_config.json and a named chat template (file name -> text)."""
    library = sorted(p.name for p in SCRIPTS.glob(LIBRARY_GLOB))
    template = chat_templates.template(f.chat_template)
    return {**contract.sources(SCRIPT.name, *library, *contract.COMMON), DS_CONFIG_NAME: ds_config_text,
            **({TEMPLATE_NAME: template} if template is not None else {})}


# The script's flags the stack sets, with the keys they come from, relative to the run's block (the workload, or
# `vertex`): an args list may not repeat them (argparse would take the last one and the key would silently lose).
STACK_FLAGS: dict[str, tuple[str, ...]] = FINETUNE.stack_flags()


def stack_keys(f: FinetuneConfig, prefix: tuple[str | int, ...]) -> dict[str, str]:
    """Each flag the stack sets from a key -> that key, as `pulumi config set --path` spells it (FINETUNE_STACK_KEYS:
    the script's errors name the key to change)."""
    keys = {flag: at(*prefix, *path) for flag, path in STACK_FLAGS.items()
            if path[0] in ("finetune", "deepspeed") and len(path) > 1}
    keys["--model"] = at(*prefix, "finetune", "model" if f.model else "modelPath")
    keys["--dataset"] = at(*prefix, "finetune", "dataset" if f.dataset else "datasetPath")
    return keys


class RecipeLaunch(msgspec.Struct, frozen=True):
    """What one platform's ranks run, from the same keys on GKE, Gaudi and Vertex AI: the recipe's program, its
    arguments (the keys', then the block's `launch.args`) and its environment (FINETUNE_STACK_KEYS); the platform adds
    how it starts the ranks, its folders' variables and the files it ships (`recipe_files`)."""

    script: str  # the program, in the config folder
    args: list[str]
    env: dict[str, str]


def launch(f: FinetuneConfig, learning_rate: float, roots: RecipeRoots, prefix: tuple[str | int, ...],
           extra_args: list[str]) -> RecipeLaunch:
    """The recipe's launch on any platform: `prefix` is the block's place in the stack (the workload, or `vertex`),
    `extra_args` its `launch.args`."""
    keys = json.dumps(stack_keys(f, prefix), sort_keys=True, separators=(",", ":"))
    return RecipeLaunch(script=f"{roots.config}/{SCRIPT.name}",
                        args=[*recipe_args(f, learning_rate, roots), *extra_args],
                        env={contract.STACK_KEYS_ENV: keys})
