"""finetune.py's arguments: the parser recipes/contract.py declares, the contract's variables filling what was not
given, every problem at once, and the run resolved once into one frozen value (`resolve`: the data's source, the
held-out records, the named chat template), which data preparation and training read.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from recipes.contract import FINETUNE
from recipes.finetune_config import (
    UsageError,
)
from recipes.finetune_data import (
    DataSource,
    FieldSpec,
    data_source,
    parse_roles,
)
from recipes.finetune_render import (
    CHAT_TEMPLATE_AUTO,
    CHAT_TEMPLATE_RAW,
    template_file,
)

# The contract's environment variables (recipes/contract.py: each option's `env`), each the default of its argument
# (the argument wins).
ENV_DEFAULTS = FINETUNE.env_defaults()


# Vertex AI's own variables (a CustomJob with baseOutputDirectory sets them, as gs:// URIs, on every replica; its
# TensorBoard uploads what lands under AIP_TENSORBOARD_LOG_DIR): the fall-back where neither the argument nor the
# contract's variable is given, so the same argv runs on Vertex AI and the files land where Vertex looks.
VERTEX_DEFAULTS = {"checkpoint_dir": "AIP_CHECKPOINT_DIR", "model_dir": "AIP_MODEL_DIR"}


LOGS_ENV, VERTEX_LOGS_ENV = "TENSORBOARD_LOGGING_DIR", "AIP_TENSORBOARD_LOG_DIR"


GCS_URI, GCS_FUSE_ROOT = "gs://", "/gcs"  # Vertex AI mounts every bucket the job may read at /gcs/<bucket>


REQUIRED = ("model", "dataset", "checkpoint_dir", "model_dir")


# The field flags each record format reads (finetune_data.py); `auto` takes one family of them.
FIELD_FLAGS = ("text_field", "prompt_field", "response_field", "messages_field", "role_field", "content_field",
               "roles")


READS = {"text": {"text_field"},
         "prompt-completion": {"prompt_field", "response_field", "role_field", "content_field", "roles"},
         "messages": {"messages_field", "role_field", "content_field", "roles"},
         "sharegpt": {"messages_field", "role_field", "content_field", "roles"},
         "alpaca": set()}


DEFAULT_SAVE_STEPS = FINETUNE.option("save_steps").default


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def build_parser() -> argparse.ArgumentParser:
    """finetune.py's parser: every option as recipes/contract.py declares it."""
    return FINETUNE.parser()  # its description too: the program's first line


def parse_args(argv: Sequence[str] | None, environ: Mapping[str, str]) -> argparse.Namespace:
    """The arguments, the contract's environment variables filling what was not given; UsageError lists every
    problem at once."""
    args = build_parser().parse_args(argv)
    for name, variable in ENV_DEFAULTS.items():
        if getattr(args, name) is None and environ.get(variable, "").strip():
            value = environ[variable].strip()
            if name == "save_steps":
                if not value.isdigit():
                    raise UsageError(f"{variable}={value!r}: expected a whole number of steps")
                setattr(args, name, int(value))
            else:
                setattr(args, name, value)
    for name, variable in VERTEX_DEFAULTS.items():
        if getattr(args, name) is None and environ.get(variable, "").strip():
            setattr(args, name, fuse_path(environ[variable].strip()))
    if args.save_steps is None:
        args.save_steps = DEFAULT_SAVE_STEPS
    problems = argument_problems(args)
    if problems:
        raise UsageError("; ".join(problems))
    return args


def fuse_path(value: str) -> str:
    """A gs://BUCKET/PATH URI (Vertex AI's AIP_* variables) as the path of Vertex AI's FUSE mount; a path as is."""
    if value.startswith(GCS_URI):
        return f"{GCS_FUSE_ROOT}/{value[len(GCS_URI):]}"
    return value


def tensorboard_dir(environ: Mapping[str, str]) -> str | None:
    """Where TensorBoard's event files go: TENSORBOARD_LOGGING_DIR (the stack's, on GKE), else Vertex AI's
    AIP_TENSORBOARD_LOG_DIR (set when the CustomJob names a TensorBoard); None: no event files."""
    for variable in (LOGS_ENV, VERTEX_LOGS_ENV):
        if environ.get(variable, "").strip():
            return fuse_path(environ[variable].strip())
    return None


def _variables(name: str) -> str:
    return " or ".join(v for v in (ENV_DEFAULTS[name], VERTEX_DEFAULTS.get(name)) if v)


def argument_problems(args: argparse.Namespace) -> list[str]:
    # The data check alone (make check-data on a laptop) needs the data; a model only to render it.
    required = ("dataset",) if args.check_data and not args.prepare_data else REQUIRED
    problems = [f"{_flag(name)} (or {_variables(name)}) is required" for name in required
                if not getattr(args, name)]
    problems += FINETUNE.problems(args)  # each option's bounds (recipes/contract.py)
    if bool(args.prompt_field) != bool(args.response_field):
        problems.append("--prompt-field and --response-field go together (or neither: --text-field)")
    problems += record_flag_problems(args)
    if args.epochs is not None and args.max_steps is not None:
        problems.append("give --epochs or --max-steps, not both")
    problem = eval_split(args.eval_split)[1]
    if problem:
        problems.append(problem)
    if args.lora and any(not t.strip() for t in args.lora_target_modules):
        problems.append("--lora-target-modules needs module names (or all-linear)")
    return problems


def record_flag_problems(args: argparse.Namespace) -> list[str]:
    """The field flags the record format reads (a flag it never reads would be dropped without a word), and --roles
    pairs."""
    given = [name for name in FIELD_FLAGS if getattr(args, name)]
    problems = parse_roles(args.roles)[1]
    if args.records != "auto":
        problems += [f"{_flag(name)} is not read with --records {args.records}" for name in given
                     if name not in READS[args.records]]
        return problems
    families = {"--text-field": args.text_field, "--prompt-field": args.prompt_field,
                "--messages-field": args.messages_field}
    named = [flag for flag, value in families.items() if value]
    if len(named) > 1:
        problems.append(f"{' and '.join(named)} name fields of different record formats: give one (or --records)")
    return problems


def eval_split(value: str | None) -> tuple[float | str | None, str | None]:
    """--eval-split: a fraction of the records in (0, 1), or a path (a file or folder of held-out records); with
    what is wrong with it."""
    if value is None:
        return None, None
    try:
        fraction = float(value)
    except ValueError:
        return value, None
    if not 0 < fraction < 1:
        return None, f"--eval-split {value}: a fraction of the records must be between 0 and 1 (e.g. 0.05)"
    return fraction, None


def field_spec(args: argparse.Namespace) -> FieldSpec:
    return FieldSpec(args.records, args.text_field, args.prompt_field, args.response_field, args.messages_field,
                     args.role_field, args.content_field, parse_roles(args.roles)[0])


def named_template(args: argparse.Namespace) -> str | None:
    """The template --chat-template names by its file; None for auto and raw."""
    if args.chat_template in (CHAT_TEMPLATE_AUTO, CHAT_TEMPLATE_RAW):
        return None
    return template_file(args.chat_template)


@dataclass(frozen=True)
class Run:
    """The run's arguments resolved once: what every step after the parser reads (the data's source, the held-out
    records, the named chat template's text, the record fields), where each was worked out again by each step."""

    args: argparse.Namespace
    source: DataSource  # --dataset: its files (or hub id) and how they are read
    held_out: float | DataSource | None  # --eval-split: a fraction of the records, or its own records' source
    template: str | None  # the named chat template's text; None for auto and raw
    fields: FieldSpec

    @property
    def held_out_source(self) -> DataSource | None:
        return self.held_out if isinstance(self.held_out, DataSource) else None


def resolve(args: argparse.Namespace) -> Run:
    """The run of these arguments; UsageError for a missing data file, a folder of mixed formats, a held-out file
    that cannot be read or a template file that cannot (in that order, as the data check reads them)."""
    source = data_source(args.dataset, args.format)
    fraction = eval_split(args.eval_split)[0]
    held_out = data_source(fraction) if isinstance(fraction, str) else fraction
    return Run(args, source, held_out, named_template(args), field_spec(args))
