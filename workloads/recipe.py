"""The fine-tuning recipe on every platform: the `finetune` keys (model/schema.yaml `$defs.finetuneRun`, one
definition) -> recipes/finetune.py's arguments, rendered by the recipe's contract (recipes/contract.py FINETUNE:
each flag's key, type, default and bounds, declared once), and the rules on those keys that do not depend on where
the run happens.

Three platforms run the same recipe with the same keys:
- GKE NVIDIA pools (kind finetune, workloads/kinds/finetune.py): data under the bucket's GCS FUSE mount;
- a Gaudi MPIJob (kind mpijob with `finetune`, workloads/mpijob/gaudi.py): data on the shared claim;
- a Vertex AI CustomJob (`vertex.finetune`, workloads/vertex_job.py): data under /gcs/<bucket>, Vertex's mount.

What differs is only the roots (`RecipeRoots`): where relative data paths are read, where checkpoints and the model
go (<output>/checkpoints/<run>, <output>/models/<run>: the contract's layout everywhere), and where ds_config.json and
a named chat template lie. The recipe is the one source of what it reads: its pure parts (formats, file endings, the
LoRA/ZeRO/precision combinations it cannot run) are imported from the recipes package, not copied here.
"""

from __future__ import annotations

import functools
import importlib
import json
from collections.abc import Callable
from pathlib import PurePosixPath
from types import ModuleType
from typing import Any

import msgspec

from model import chat_templates
from model.problems import Problem
from model.training_blocks import eval_path, run_dirs
from model.types import DeepSpeedConfig, FinetuneConfig, snake
from model.validators import at
from planner.model_ids import id_problem
from recipes import contract, finetune_config, finetune_data
from recipes.contract import DS_CONFIG_NAME, FINETUNE, TEMPLATE_NAME, number
from workloads import script_flags

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
OUTPUT_FLAGS = ("--checkpoint-dir", "--model-dir")


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


# --- the rules on the keys, wherever they run ----------------------------------------------------------------

class RecipeSite(msgspec.Struct, frozen=True):
    """One `finetune` block where it is configured: the keys, the block's place in the stack (`prefix`: the workload,
    or `vertex`), its `deepspeed` block, and how its relative paths are described (`data_where`)."""

    run: FinetuneConfig
    prefix: tuple[str | int, ...]
    deepspeed: DeepSpeedConfig
    data_where: str  # "the bucket", "the claim": where modelPath and datasetPath are

    def key(self, *path: str | int) -> str:
        return at(*self.prefix, "finetune", *path)

    def block_key(self, *path: str | int) -> str:
        return at(*self.prefix, *path)


def check_model_and_data(site: RecipeSite) -> list[Problem]:
    """A Hugging Face id or a path of the data root for each of the model and the data, not both; the model's id
    as the hub takes it (OWNER/NAME, not a typo of a listed one: planner/model_ids.py)."""
    problem = id_problem(site.run.model, site.key("modelPath")) if site.run.model else None
    return [*_one_of(site, "model", "a folder", "model", "Qwen/Qwen2.5-7B-Instruct"),
            *([Problem(site.key('model'), f"{problem}")] if problem else []),
            *_one_of(site, "dataset", "a file or folder", "data", "tatsu-lab/alpaca")]


def _one_of(site: RecipeSite, hub_key: str, path_key: str, what: str, example: str) -> list[Problem]:
    f = site.run
    hub, path = getattr(f, hub_key), getattr(f, f"{hub_key}_path")
    camel = f"{hub_key}Path"
    if hub and path:
        return [Problem(site.key(camel), f"give {site.key(hub_key)} (a Hugging Face id) or {camel} (a folder of "
                f"{site.data_where}), not both")]
    if not hub and not path:
        return [Problem(site.key(hub_key), f"required: the {what} to train on, a Hugging Face id (e.g. {example}), or "
                f"{site.key(camel)}: {path_key} of {site.data_where}")]
    return []


def data_format(f: FinetuneConfig) -> str | None:
    """The format the script reads the data in: `format`, else by the file's ending (None: a folder or a Hugging Face
    dataset, decided by what is there)."""
    if f.format != "auto":
        return f.format
    suffix = PurePosixPath(f.dataset_path or "").suffix.lower()
    return finetune_data.SUFFIXES.get(suffix)


def check_data_format(site: RecipeSite) -> list[Problem]:
    """What finetune.py can read (its SUFFIXES and FORMATS) and which fields its records have."""
    f, ft = site.run, finetune_data
    problems = []
    suffix = PurePosixPath(f.dataset_path or "").suffix.lower()
    readable = ", ".join(ft.SUFFIXES)
    if f.dataset_path and suffix and suffix not in ft.SUFFIXES and f.format == "auto":
        problems.append(Problem(site.key('datasetPath'), f"finetune.py cannot read {suffix} files (it reads "
                        f"{readable}: JSON lines, Parquet, text); convert the data, or set "
                        f"{site.key('format')} if the file is one of them under another name"))
    elif f.dataset_path and suffix in ft.SUFFIXES and f.format not in ("auto", ft.SUFFIXES[suffix]):
        problems.append(Problem(site.key('format'), f"{f.format}, but {f.dataset_path} is "
                        f"{ft.SUFFIXES[suffix]} by its name; set format auto or {ft.SUFFIXES[suffix]}"))
    if f.dataset and f.format != "auto":
        problems.append(Problem(site.key('format'), f"{f.format} is for files of {site.data_where} "
                        f"({site.key('datasetPath')}); a Hugging Face dataset brings its own: set auto"))
    if bool(f.prompt_field) != bool(f.response_field):
        given = "promptField" if f.prompt_field else "responseField"
        missing = "responseField" if f.prompt_field else "promptField"
        problems.append(Problem(site.key(given), f"goes with {site.key(missing)} (or neither: textField)"))
    if data_format(f) == "text":
        if f.prompt_field:
            problems.append(Problem(site.key('promptField'), "a text file's records have one field, `text` "
                            "(a line each); use JSON lines or Parquet for prompt/response pairs"))
        elif f.text_field not in (None, "text"):
            problems.append(Problem(site.key('textField'), f"a text file's records have one field, `text`, "
                            f"not {f.text_field!r}"))
    return problems


# The field keys each record format reads (finetune.py's READS, by key).
RECORD_FIELD_KEYS = {
    "text": {"textField"},
    "prompt-completion": {"promptField", "responseField", "roleField", "contentField", "roles"},
    "messages": {"messagesField", "roleField", "contentField", "roles"},
    "sharegpt": {"messagesField", "roleField", "contentField", "roles"},
    "alpaca": set(),
}
FIELD_KEYS = {"textField": "text_field", "promptField": "prompt_field", "responseField": "response_field",
              "messagesField": "messages_field", "roleField": "role_field", "contentField": "content_field",
              "roles": "roles"}
CHAT_FORMATS = chat_templates.CHAT_FORMATS  # records that are conversations whatever the model


def check_record_fields(site: RecipeSite) -> list[Problem]:
    """The field keys the record format reads: one it never reads would be dropped without a word (finetune.py
    refuses it too); with `auto`, the field keys of one format only, since the first one given decides."""
    f = site.run
    if data_format(f) == "text" and f.record_format not in ("auto", "text"):
        return [Problem(site.key('recordFormat'), f"{f.record_format}, but a text file's records are its lines "
                "(format text); use JSON lines or Parquet")]
    given = [key for key, attr in FIELD_KEYS.items() if getattr(f, attr)]
    if f.record_format != "auto":
        return [Problem(site.key(key), f"not read with {site.key('recordFormat')} {f.record_format} "
                f"(it reads {', '.join(sorted(RECORD_FIELD_KEYS[f.record_format])) or 'instruction, input, output'}); "
                "remove it, or set the format that has this field") for key in given
                if key not in RECORD_FIELD_KEYS[f.record_format]]
    # textField beside promptField: check_text_field_or_prompt's.
    others = [key for key in ("textField", "promptField") if key in given]
    if "messagesField" in given and others:
        return [Problem(site.key('messagesField'), f"messagesField and {' and '.join(others)} are fields of "
                f"different record formats; keep the one of your records, or set {site.key('recordFormat')}")]
    return []


def check_chat_template(site: RecipeSite) -> list[Problem]:
    """`chatTemplate` is auto, raw or a template the stack ships; conversations need a template: `raw` renders none,
    and a model known to ship none (data/chat_templates.yaml) needs one named. Other models, and a modelPath, are
    found out by the data check (it loads the tokenizer)."""
    f = site.run
    key, names = site.key("chatTemplate"), chat_templates.names()
    if f.chat_template not in (chat_templates.AUTO, chat_templates.RAW, *names):
        return [Problem(key,
                        f"{f.chat_template!r} is not a template the stack knows: auto (the model's own), raw (none), "
                        f"or one of data/chat_templates.yaml: {', '.join(names)}")]
    chat = f.record_format in CHAT_FORMATS
    if chat and f.chat_template == chat_templates.RAW:
        return [Problem(key,
                        f"raw renders text and plain prompt/completion records only; {f.record_format} records are "
                        "conversations and go through a chat template: auto (the model's own) or a name "
                        f"({', '.join(names)})")]
    if chat and f.chat_template == chat_templates.AUTO and f.model and chat_templates.ships_template(f.model) is False:
        return [Problem(key,
                        f"{f.model}'s tokenizer has no chat template (data/chat_templates.yaml), and {f.record_format} "
                f"records are rendered through one: name one the stack ships ({', '.join(names)}; it is saved with "
                "the tuned model, so the server renders requests the same way), or fine-tune its Instruct model")]
    return []


def check_eval_split(site: RecipeSite) -> list[Problem]:
    """`evalSplit`: a fraction between 0 and 1, or a file or folder finetune.py can read."""
    f, key = site.run, site.key("evalSplit")
    if f.eval_split is None:
        return []
    fraction = eval_fraction(f)
    if fraction is not None:
        return [] if 0 < fraction < 1 else [Problem(key,
                                                    Problem(f.eval_split,
                                                            f"a fraction of the records is between 0 and 1 "
                                                            f"(e.g. 0.05), or name a file of {site.data_where}"))]
    suffix = PurePosixPath(str(f.eval_split)).suffix.lower()
    suffixes = finetune_data.SUFFIXES
    if suffix and suffix not in suffixes:
        return [Problem(key, f"finetune.py cannot read {suffix} files (it reads {', '.join(suffixes)})")]
    return []


def check_epochs_or_max_steps(site: RecipeSite) -> list[Problem]:
    """finetune.py trains for --epochs or --max-steps and refuses both ("give --epochs or --max-steps, not both")."""
    f = site.run
    if f.epochs is None or f.max_steps is None:
        return []
    return [Problem(site.key('epochs'),
                    f"{f.epochs:g} epochs and {site.key('maxSteps')} {f.max_steps}: the run stops at "
                    "one or the other, not both (finetune.py: \"give --epochs or --max-steps, not both\"); remove one")]


def check_text_field_or_prompt(site: RecipeSite) -> list[Problem]:
    """`textField` names what is learned, unless `promptField`/`responseField` do (the prompt masked, the response
    learned): with both, only the prompt fields are passed and the text field would be silently ignored."""
    f = site.run
    if f.text_field is None or not (f.prompt_field or f.response_field):
        return []
    pair = site.key("promptField" if f.prompt_field else "responseField")
    return [Problem(site.key('textField'), f"{f.text_field!r} is not used with {pair}: the records' prompt and "
            "response are what the run learns; remove textField, or the prompt and response fields")]


def check_lora_combination(site: RecipeSite) -> list[Problem]:
    """The LoRA/ZeRO/precision combinations finetune.py refuses at start-up (its own combination_problems)."""
    ds = site.deepspeed
    found = finetune_config.combination_problems(
        site.run.lora.enabled, ds.zero_stage, ds.precision, False, ds.offload_params != "none")
    return [Problem(site.key('lora', 'enabled'), f"{problem} (finetune.py would stop at start-up; see "
            f"{site.block_key('deepspeed')})") for problem in found]


def check_args(site: RecipeSite, args_key: tuple[str | int, ...], args: list[str]) -> list[Problem]:
    """An args list (`launch.args`, `vertex.launch.args`) repeats no flag the stack sets from a key: argparse takes
    the last one and the key would silently lose."""
    problems, keys = [], stack_keys(site.run, site.prefix)
    for i, arg in enumerate(args):
        flag, key = arg.split("=", 1)[0], at(*args_key, i)
        source = STACK_FLAGS.get(flag)
        if source is None:
            continue
        if flag in OUTPUT_FLAGS:
            problems.append(Problem(key, f"{flag} is set by the stack (checkpoints/<run> and models/<run> under the "
                            "platform's output root: the layout a server of the result reads); remove it"))
        else:
            problems.append(Problem(key, f"{flag} is set by the stack from {keys.get(flag, site.block_key(*source))}; "
                            "change it there instead"))
    return problems


def check_args_known(args_key: tuple[str | int, ...], args: list[str]) -> list[Problem]:
    """Every flag of an args list is one finetune.py's parser has (read from the script, never run): an unknown one
    stops every rank at start-up with "unrecognized arguments"."""
    flags = script_flags.read(SCRIPT)
    if flags is None:
        return []
    problems = []
    for j, token in script_flags.option_tokens(args):
        name = token.split("=", 1)[0]
        action = flags.action_of(token)
        if isinstance(action, str):
            problems.append(Problem(at(*args_key, j), f"{name} is ambiguous for finetune.py's parser (it could be "
                            f"{action}); write the whole flag"))
        elif action is None:
            closest = flags.closest(token, frozenset(STACK_FLAGS))[:12]
            problems.append(Problem(at(*args_key, j), f"finetune.py has no flag {name} (every rank would stop with "
                            f"\"unrecognized arguments\"); its flags, closest first: {', '.join(closest) or 'none'}"))
    return problems


# The rules on the keys alone, the same on every platform (each platform adds where its paths are read from).
RULES = (check_model_and_data, check_data_format, check_record_fields, check_chat_template, check_eval_split,
         check_epochs_or_max_steps, check_text_field_or_prompt, check_lora_combination)


def problems(site: RecipeSite) -> list[str]:
    return [problem for rule in RULES for problem in rule(site)]


def path_problems(site: RecipeSite, run: FinetuneConfig, problem_of: Callable[[str], str | None],
                  say: Callable[[str, str, str], str]) -> list[str]:
    """The recipe's paths (modelPath, datasetPath, an evalSplit file) by a platform's rule for where they may lie
    (`problem_of`: why a path cannot be read there, or None), each problem worded by `say(key, path, why)`."""
    out = []
    for camel, path in (("modelPath", run.model_path), ("datasetPath", run.dataset_path),
                        ("evalSplit", eval_path(run))):
        why = problem_of(path) if path is not None else None
        if why is not None:
            out.append(say(site.key(camel), path, why))
    return out
