"""The contract between the stack and the programs it runs in containers: per program, its options (flag, stack key,
type, default, bounds, help: one typed declaration each, as TRL's SFTConfig is the one source of each of its
flags), its environment names, its files and its exit codes.

Both sides read it: a program builds its argparse parser and its bound checks from its `Program` (finetune.py:
`FINETUNE.parser()`, `FINETUNE.problems(args)`); the stack renders the program's argv from the same declaration
(`FINETUNE.argv(values)`, workloads/recipe.py), maps each flag to its key (`FINETUNE.stack_flags()`:
FINETUNE_STACK_KEYS, and the args lists that may not repeat a flag), and tests/test_recipe_contract.py holds
model/schema.yaml's `$defs.finetuneRun` to the same defaults and bounds. Adding an option: docs/layout.md. The other
programs the stack passes flags to are declared in contract_programs.py (PROGRAMS, OWN_PARSERS), maintenance_watch.py
here (it ships beside this module alone).

Standard library only, and nothing of the stack (pyproject.toml's import contract): it is shipped with the programs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# --- exit codes: what a program's status means to the launchers (workloads/mpijob/nvidia.py FINAL_EXIT_STATUSES)
EXIT_USAGE = 2  # bad arguments, environment or data: final, a restart would fail the same way
EXIT_PREEMPTED = 143  # 128 + SIGTERM, as a shell reports it: stopped on notice, after saving a checkpoint
FINAL_EXIT_STATUSES = (EXIT_USAGE,)

# --- environment names the stack sets and the programs read
HF_TOKEN_PATH_ENV = "HF_TOKEN_PATH"  # the file holding a gated model's token (never the token itself)
STACK_KEYS_ENV = "FINETUNE_STACK_KEYS"  # JSON {flag: the stack's key}: errors name the key a person changes
CHECKPOINT_DIR_ENV, MODEL_DIR_ENV = "CHECKPOINT_DIR", "MODEL_DIR"

# --- files
# The modules every training program imports beside its own (its options and exit codes; how it stops and ends).
COMMON = ("contract.py", "shutdown.py")
# A program's own modules, by the glob of their names: shipped with it wherever the stack ships it (`program_sources`),
# since it imports them as `recipes.NAME` beside it. finetune.py's finetune_*.py ship with the finetune kind instead
# (workloads/recipe.py LIBRARY_GLOB), beside its named chat template.
OWN_MODULES = {"smoke_train.py": "smoke_train_*.py"}
PACKAGE_FILE = "recipes.py"  # this package's __init__.py, shipped flat beside the programs (recipes/__init__.py)
DS_CONFIG_NAME = "ds_config.json"
TEMPLATE_NAME = "chat_template.jinja"  # a named chat template's file beside ds_config.json
MARKER = ".complete"  # MODEL_DIR's completion marker, written last (and copied last into each evaluated copy)
SERVED = "served.json"  # EVALS/NAME/served.json: the evaluated copy served under NAME (evaluate_copies.write_served)
HERE = Path(__file__).resolve().parent

# --- choices shared by the options and the programs' modules
FORMATS = ("auto", "jsonl", "parquet", "text")  # the files' formats (--format)
RECORD_FORMATS = ("auto", "text", "prompt-completion", "messages", "alpaca", "sharegpt")
PACKING_FLAGS = ("auto", "on", "off")
PRECISIONS = ("bf16", "fp16", "fp32")
LORA_EXPORTS = ("adapter", "merged")
CHAT_TEMPLATE_AUTO, CHAT_TEMPLATE_RAW = "auto", "raw"
CHECK_RECORDS = 200  # how many records the launcher's data check reads
TOKENIZED_FOLDER = "tokenized"  # under CHECKPOINT_DIR, the default --tokenized-dir

SWITCH = "switch"  # an option that is a bare flag (store_true)


@dataclass(frozen=True)
class Option:
    """One option of a program: its flags (the first is the one the stack passes), the stack key it comes from
    (relative to the run's block: the workload, or `vertex`), its type, default and bounds, and its help."""

    flags: tuple[str, ...]
    # str, int, float, list (nargs="+"), SWITCH, or another argparse type (Path, positive_int): its value renders as str
    type: type | str | Callable[[str], Any] = str
    default: Any = None
    help: str = ""
    key: tuple[str, ...] = ()  # () when no stack key sets it
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False  # minimum is excluded: more than it
    exclusive_maximum: bool = False
    choices: tuple[str, ...] = ()
    env: str = ""  # the environment variable that fills it when the flag is not given
    metavar: str | None = None
    dest: str = ""
    only_with: str = ""  # the switch without which the option is not read (nor checked): "lora"
    required: bool = False
    repeat: bool = False  # given once per value (argparse's append): the stack renders FLAG VALUE for each

    @property
    def name(self) -> str:
        return self.dest or self.flags[0].lstrip("-").replace("-", "_")

    def bound_problem(self, value: Any) -> str | None:
        """What is wrong with `value` against the bounds, in the words a person reads; None when it is in them."""
        if value is None:
            return None
        low, high = self.minimum, self.maximum
        if low is not None and (value <= low if self.exclusive_minimum else value < low):
            bound = f"more than {number(low)}" if self.exclusive_minimum else f"{number(low)} or more"
        elif high is not None and (value >= high if self.exclusive_maximum else value > high):
            bound = f"less than {number(high)}" if self.exclusive_maximum else f"{number(high)} or less"
        else:
            return None
        return f"{self.flags[0]} must be {bound}, got {value}"


def number(value: float) -> str:
    """A float argument as argparse reads it back: 1.0 -> 1, 0.0003 -> 0.0003."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


@dataclass(frozen=True)
class Program:
    """A program's options, in the order the stack passes them."""

    name: str
    options: tuple[Option, ...]
    description: str = ""
    hidden: tuple[Option, ...] = field(default_factory=tuple)  # the launcher's own (--local_rank): no help
    abbrev: bool = False  # argparse's allow_abbrev: True for the programs whose parsers always took prefixes

    def option(self, name: str) -> Option:
        return next(o for o in self.options if o.name == name)

    def parser(self, description: str | None = None,
               types: Mapping[str, Callable[[str], Any]] | None = None) -> argparse.ArgumentParser:
        """The program's parser; `types`: option name -> the argparse type the program reads a str option's text
        with into a value of its own (evaluator.py's NAME=MODEL_DIR adapters), which the contract cannot import."""
        parser = argparse.ArgumentParser(description=description or self.description, allow_abbrev=self.abbrev)
        for o in self.options:
            _add(parser, o, convert=(types or {}).get(o.name))
        for o in self.hidden:
            _add(parser, o, hidden=True)
        return parser

    def problems(self, args: argparse.Namespace) -> list[str]:
        """Every option's value against its bounds (the program adds the rules between options)."""
        return [p for o in self.options if (not o.only_with or getattr(args, o.only_with, False))
                and (p := o.bound_problem(getattr(args, o.name, None))) is not None]

    def env_defaults(self) -> dict[str, str]:
        return {o.name: o.env for o in self.options if o.env}

    def argv(self, values: Mapping[str, Any]) -> list[str]:
        """The argv for `values` (option name -> value), in declaration order; None (and a switch's False) is
        left out, so the program's own default applies."""
        unknown = set(values) - {o.name for o in self.options}
        if unknown:
            raise KeyError(f"{self.name} has no option {', '.join(sorted(unknown))}")
        args: list[str] = []
        for o in self.options:
            value = values.get(o.name)
            if value is None or value is False:
                continue
            if o.type == SWITCH:
                args.append(o.flags[0])
            elif o.repeat:
                args += [part for v in value for part in (o.flags[0], str(v))]
            elif o.type is list:
                args += [o.flags[0], *(str(v) for v in value)]
            elif o.type is float:
                args += [o.flags[0], number(value)]
            else:
                args += [o.flags[0], str(value)]
        return args

    def stack_flags(self) -> dict[str, tuple[str, ...]]:
        """Each flag (aliases too) the stack sets from a key -> that key, relative to the run's block."""
        return {flag: o.key for o in self.options if o.key for flag in o.flags}


def _add(parser: argparse.ArgumentParser, o: Option, hidden: bool = False,
         convert: Callable[[str], Any] | None = None) -> None:
    kwargs: dict[str, Any] = {"dest": o.name, "help": argparse.SUPPRESS if hidden else o.help or None}
    if o.required:
        kwargs["required"] = True
    if o.type == SWITCH:
        kwargs["action"] = "store_true"
    else:
        # An option with a variable parses to None when not given: the program fills it from the variable, then
        # from the default (finetune.py parse_args), so the argument wins, then the variable.
        default = None if o.env else o.default
        kwargs["default"] = list(default) if isinstance(default, tuple) else default
        if o.type is list:
            kwargs["nargs"] = "+"
        elif convert is not None or o.type is not str:
            kwargs["type"] = convert or o.type
        if o.repeat:
            kwargs["action"] = "append"
        if o.choices:
            kwargs["choices"] = o.choices
        if o.metavar:
            kwargs["metavar"] = o.metavar
    parser.add_argument(*o.flags, **kwargs)


def sources(*names: str) -> dict[str, str]:
    """The programs' files (name -> text) as the stack ships them, flat: `names` and this package's __init__.py as
    PACKAGE_FILE, through which `recipes.NAME` is the file NAME.py beside it."""
    return {PACKAGE_FILE: (HERE / "__init__.py").read_text(encoding="utf-8"),
            **{name: (HERE / name).read_text(encoding="utf-8") for name in names}}


def own_modules(script: str) -> tuple[str, ...]:
    """The file names of `script`'s own modules (OWN_MODULES), sorted; none for a program without."""
    pattern = OWN_MODULES.get(script)
    return tuple(sorted(p.name for p in HERE.glob(pattern))) if pattern else ()


def program_sources(script: str) -> dict[str, str]:
    """What ships with a program of this package (`sources`): it, its own modules and the modules every program
    imports (COMMON), so that each of its imports is found beside it."""
    return sources(script, *own_modules(script), *COMMON)


def positive_int(text: str) -> int:
    """argparse's type for a count of 1 or more."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def _ft(*key: str) -> tuple[str, ...]:
    return ("finetune", *key)


# --- finetune.py ------------------------------------------------------------------------------------------------

FINETUNE = Program("finetune", description="Fine-tune a causal language model with the Hugging Face Trainer under "
                   "DeepSpeed ZeRO 0-3.", options=(
    Option(("--deepspeed", "--deepspeed_config", "--deepspeed-config"), key=("deepspeed",),
           help="ds_config.json (the launcher passes --deepspeed_config)"),
    Option(("--model",), key=_ft("model"), env="FINETUNE_MODEL",
           help="a Hugging Face model id or a local folder (FINETUNE_MODEL)"),
    Option(("--dataset",), key=_ft("dataset"), env="FINETUNE_DATASET",
           help="a file, a folder of files or a Hugging Face dataset id (FINETUNE_DATASET)"),
    Option(("--format",), key=_ft("format"), default="auto", choices=FORMATS,
           help="the files' format (default: by suffix)"),
    Option(("--records",), key=_ft("recordFormat"), default="auto", choices=RECORD_FORMATS,
           help="the records' format (default auto: by the first record's fields)"),
    Option(("--prompt-field",), key=_ft("promptField"), help="with --response-field: learn the response to the prompt"),
    Option(("--response-field",), key=_ft("responseField"), help="with --prompt-field"),
    Option(("--text-field",), key=_ft("textField"), help="text records: the field learned (default text)"),
    Option(("--messages-field",), key=_ft("messagesField"),
           help="the conversation's field (default messages; sharegpt conversations)"),
    Option(("--role-field",), key=_ft("roleField"), help="a message's role key (default role; sharegpt from)"),
    Option(("--content-field",), key=_ft("contentField"),
           help="a message's text key (default content; sharegpt value)"),
    Option(("--roles",), list, default=(), key=_ft("roles"), metavar="NAME=ROLE",
           help="the data's role names as system, user or assistant (e.g. bot=assistant)"),
    Option(("--chat-template",), key=_ft("chatTemplate"), default=CHAT_TEMPLATE_AUTO,
           help="auto (the model's own), raw (no template: text and prompt/completion only), or a Jinja file, then "
                "saved with the model"),
    Option(("--eval-split",), key=_ft("evalSplit"),
           help="held-out records: a fraction (e.g. 0.05) or a file or folder of them"),
    Option(("--seq-len",), int, default=2048, key=_ft("sequenceLength"), minimum=8, maximum=1048576,
           help="tokens per sample (2048)"),
    Option(("--packing",), key=_ft("packing"), default="auto", choices=PACKING_FLAGS,
           help="auto (default): text records packed into --seq-len blocks, others not; on: also padding-free "
                "batches of chat and prompt/completion records; off: neither"),
    Option(("--max-steps",), int, key=_ft("maxSteps"), minimum=1, maximum=1_000_000_000,
           help="optimizer steps in all (instead of --epochs)"),
    Option(("--epochs",), float, key=_ft("epochs"), minimum=0, exclusive_minimum=True, maximum=100000,
           help="passes over the data (default 1; or --max-steps)"),
    Option(("--learning-rate",), float, default=2e-5, key=("deepspeed", "learningRate"), minimum=0,
           exclusive_minimum=True, help="peak learning rate (2e-05)"),
    Option(("--lr-scheduler",), key=_ft("lrScheduler"), choices=("linear", "cosine", "constant"),
           help="the learning rate over the run: linear (the default) or cosine decay to 0, or constant"),
    Option(("--save-steps",), int, default=200, key=_ft("saveSteps"), minimum=1, maximum=1_000_000_000,
           env="CHECKPOINT_EVERY_STEPS", help="checkpoint every N steps (CHECKPOINT_EVERY_STEPS, default 200)"),
    Option(("--gradient-checkpointing",), SWITCH, key=_ft("gradientCheckpointing"),
           help="recompute activations (less memory)"),
    Option(("--lora",), SWITCH, key=_ft("lora", "enabled"), help="train a LoRA adapter"),
    Option(("--lora-rank",), int, default=16, key=_ft("lora", "rank"), only_with="lora", minimum=1, maximum=65536),
    Option(("--lora-alpha",), float, default=32.0, key=_ft("lora", "alpha"), only_with="lora", minimum=0,
           exclusive_minimum=True, maximum=65536),
    Option(("--lora-dropout",), float, default=0.05, key=_ft("lora", "dropout"), only_with="lora", minimum=0, maximum=1,
           exclusive_maximum=True),
    Option(("--lora-export",), key=_ft("lora", "export"), only_with="lora", default="adapter", choices=LORA_EXPORTS,
           help="MODEL_DIR gets the adapter alone (default) or the model with it merged in"),
    Option(("--lora-target-modules",), list, default=("all-linear",), key=_ft("lora", "targetModules"),
           only_with="lora", help="module names, or all-linear (default)"),
    # The output folders: the stack always sets them (<output>/checkpoints/<run>, <output>/models/<run>).
    Option(("--checkpoint-dir",), key=("gcsFuse", "enabled"), env=CHECKPOINT_DIR_ENV,
           help="the checkpoint-N folders (CHECKPOINT_DIR)"),
    Option(("--model-dir",), key=("gcsFuse", "enabled"), env=MODEL_DIR_ENV,
           help="where the final model goes (MODEL_DIR)"),
    # Not set by the stack: a run by hand, the launcher's steps, or a workload's `launch.args`.
    Option(("--precision",), key=("deepspeed", "precision"), choices=PRECISIONS,
           help="default: ds_config.json's, else fp32"),
    Option(("--check-data",), SWITCH,
           help=f"check and render the first {CHECK_RECORDS} records, then exit (2 on a data error); without --model "
                "the fields and formats only (make check-data runs it on your machine)"),
    Option(("--check-records",), int, default=CHECK_RECORDS, minimum=0, metavar="N",
           help=f"with --check-data: the records read ({CHECK_RECORDS}; 0: all of them, each malformed one named)"),
    Option(("--prepare-data",), SWITCH,
           help="the data check, then every record tokenized (and packed) into --tokenized-dir, or found there; then "
                "exit: the launcher's step before the ranks"),
    Option(("--tokenized-dir",), help=f"where the tokenized data is kept (default CHECKPOINT_DIR/{TOKENIZED_FOLDER}): "
           "made once, reused on every restart and resume"),
    Option(("--save-total-limit",), int, default=2, minimum=1, help="checkpoints kept (default 2, the newest)"),
    Option(("--local-checkpoint-dir",), env="LOCAL_CHECKPOINT_DIR",
           help="tiered saves: the Trainer saves to this node-local folder (a local SSD) and each save is copied to "
                "--checkpoint-dir in the background, a marker last (finetune_tiered.py; LOCAL_CHECKPOINT_DIR)"),
    Option(("--copy-rate-mb",), float, minimum=0, exclusive_minimum=True,
           help="with --local-checkpoint-dir: cap each node's copy at this many MB/s (default: none), to leave the "
                "node's network to the training"),
    Option(("--logging-steps",), int, default=10, minimum=1),
    Option(("--seed",), int, default=42),
), hidden=(
    # The DeepSpeed launcher appends --local_rank=N; LOCAL_RANK says the same.
    Option(("--local_rank", "--local-rank"), int, default=-1, dest="local_rank"),
))


# --- maintenance_watch.py: here rather than in contract_programs.py (the other programs'), since it ships beside
# contract.py alone (workloads/maintenance.py files).

MAINTENANCE_WATCH = Program("maintenance_watch", abbrev=True, options=(
    Option(("--namespace",), required=True),
    Option(("--pods",), required=True, help="comma-separated: the job's worker pods"),
    Option(("--lead-seconds",), float, required=True, help="act this long before the maintenance"),
    Option(("--poll-seconds",), float, default=60.0),
    Option(("--state",), default="", help="a file of the nodes already acted on (survives restarts)"),
    Option(("--once",), SWITCH, help="one round, then exit (tests)"),
))
