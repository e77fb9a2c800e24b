"""The rules on the fine-tuning recipe's `finetune` keys that do not depend on where the run happens (GKE, Gaudi,
Vertex AI): the model and the data, the formats and fields finetune.py reads, the chat template, the held-out split,
epochs or steps, the LoRA/ZeRO/precision combinations it refuses, and the args lists that would repeat or misspell
its flags. Each platform hands its block as a `RecipeSite` and adds where its paths are read from (`path_problems`);
the argv those keys become is workloads/recipe.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import PurePosixPath

import msgspec

from model import chat_templates
from model.problems import Problem
from model.training_blocks import eval_path
from model.types import DeepSpeedConfig, FinetuneConfig
from model.validators import at
from planner.model_ids import id_problem
from recipes import finetune_config, finetune_data
from workloads import script_flags
from workloads.recipe import SCRIPT, STACK_FLAGS, eval_fraction, stack_keys

# The output folders' flags: the stack sets them from the platform's output root, not from a key.
OUTPUT_FLAGS = ("--checkpoint-dir", "--model-dir")


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
