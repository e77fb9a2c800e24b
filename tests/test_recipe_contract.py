"""recipes/contract.py, the one declaration of each recipe option (issue 41 item 1): model/schema.yaml's
`$defs.finetuneRun` agrees with it (type, default, bounds, choices: one of each), the stack renders finetune.py's
argv and FINETUNE_STACK_KEYS from it, finetune.py parses and checks its arguments with it, and the package imports
nothing of the stack."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from conftest import yaml_load

from recipes import contract
from recipes.contract import FINETUNE, SWITCH, Option, Program

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_TYPES = {str: "string", int: "integer", float: "number", list: "array", SWITCH: "boolean"}
# finetuneRun keys whose stack form differs from the flag's on purpose, with why; each still has its option.
RESHAPED = {
    "evalSplit": "a fraction or a path of the data root; finetune.py's eval_split checks the fraction's bounds",
    "roles": "a mapping in the stack, NAME=ROLE words on the command line",
    "packing": "true/false in the stack (unset: auto), on/off/auto on the command line",
}
# finetuneRun keys no flag carries as they are: the stack resolves them into others.
STACK_ONLY = {"modelPath": "--model under the data root", "datasetPath": "--dataset under the data root",
              "datasetTokens": "the planner's estimate of the run (planner/run_estimate.py)"}


def _schema() -> dict[str, Any]:
    with (ROOT / "model" / "schema.yaml").open(encoding="utf-8") as stream:
        return yaml_load(stream)["$defs"]["finetuneRun"]


def _property(run: dict[str, Any], key: tuple[str, ...]) -> dict[str, Any] | None:
    node: dict[str, Any] | None = {"properties": {"finetune": run}}
    for part in key:
        node = (node or {}).get("properties", {}).get(part)
    return node


def disagreements(run: dict[str, Any], program: Program) -> list[str]:
    """Where the schema's finetuneRun and the program's declaration say different things."""
    found = []
    for o in program.options:
        if not o.key or o.key[0] != "finetune" or o.key[-1] in RESHAPED:
            continue
        prop, name = _property(run, o.key), ".".join(o.key[1:])
        if prop is None:
            found.append(f"{name}: {o.flags[0]} names a key the schema does not have")
            continue
        if prop.get("type") != SCHEMA_TYPES[o.type]:
            found.append(f"{name}: schema type {prop.get('type')}, {o.flags[0]} takes {SCHEMA_TYPES[o.type]}")
        if o.type != SWITCH:  # a switch's default is the stack's; the program's is off (the flag is absent)
            default = list(o.default) if isinstance(o.default, tuple) else o.default
            if prop.get("default") != default:
                found.append(f"{name}: schema default {prop.get('default')!r}, {o.flags[0]} {default!r}")
        bounds = {"minimum": None if o.exclusive_minimum else o.minimum,
                  "exclusiveMinimum": o.minimum if o.exclusive_minimum else None,
                  "maximum": None if o.exclusive_maximum else o.maximum,
                  "exclusiveMaximum": o.maximum if o.exclusive_maximum else None}
        for bound, value in bounds.items():
            if prop.get(bound) != value:
                found.append(f"{name}: schema {bound} {prop.get(bound)}, {o.flags[0]} {value}")
        if o.choices and tuple(prop.get("enum", ())) != o.choices:
            found.append(f"{name}: schema enum {prop.get('enum')}, {o.flags[0]} {list(o.choices)}")
    return found


def test_the_schema_agrees_with_the_contract() -> None:
    assert disagreements(_schema(), FINETUNE) == []


def test_every_key_of_the_schema_has_its_option() -> None:
    run = _schema()
    keyed = {o.key[1:] for o in FINETUNE.options if o.key and o.key[0] == "finetune"}
    lora = run["properties"]["lora"]["properties"]
    keys = {(k,) for k in run["properties"] if k != "lora"} | {("lora", k) for k in lora}
    assert {".".join(k) for k in keys - keyed} == set(STACK_ONLY)


def test_the_defaults_users_read_are_the_scripts() -> None:
    """The schema said 2048 and 200, the script 1024 and 500: one default each now, the schema's."""
    run = _schema()["properties"]
    args = FINETUNE.parser().parse_args([])
    assert (args.seq_len, run["sequenceLength"]["default"]) == (2048, 2048)
    assert (FINETUNE.option("save_steps").default, run["saveSteps"]["default"]) == (200, 200)


@pytest.mark.parametrize(("change", "expected"), [
    ({"default": 1024}, "sequenceLength: schema default 2048, --seq-len 1024"),
    ({"minimum": 1}, "sequenceLength: schema minimum 8, --seq-len 1"),
    ({"type": float}, "sequenceLength: schema type integer, --seq-len takes number"),
])
def test_a_disagreement_is_named(change: dict[str, Any], expected: str) -> None:
    """The failing input: the contract's --seq-len changed, the schema not."""
    options = tuple(dataclasses.replace(o, **change) if o.name == "seq_len" else o for o in FINETUNE.options)
    assert disagreements(_schema(), dataclasses.replace(FINETUNE, options=options)) == [expected]


def test_bounds_are_checked_with_the_words_people_read() -> None:
    seq = FINETUNE.option("seq_len")
    assert seq.bound_problem(4) == "--seq-len must be 8 or more, got 4"
    assert seq.bound_problem(2_000_000) == "--seq-len must be 1048576 or less, got 2000000"
    assert seq.bound_problem(8) is None
    lr = FINETUNE.option("learning_rate")
    assert lr.bound_problem(0.0) == "--learning-rate must be more than 0, got 0.0"
    dropout = FINETUNE.option("lora_dropout")
    assert dropout.bound_problem(1.0) == "--lora-dropout must be less than 1, got 1.0"


def test_argv_is_rendered_in_declaration_order() -> None:
    argv = FINETUNE.argv({"model_dir": "/m", "seq_len": 512, "lora": True, "lora_alpha": 32.0,
                          "lora_target_modules": ["q_proj", "v_proj"], "gradient_checkpointing": False,
                          "epochs": None, "learning_rate": 0.0003})
    assert argv == ["--seq-len", "512", "--learning-rate", "0.0003", "--lora", "--lora-alpha", "32",
                    "--lora-target-modules", "q_proj", "v_proj", "--model-dir", "/m"]
    with pytest.raises(KeyError, match="no option nope"):
        FINETUNE.argv({"nope": 1})


def test_the_parser_and_the_argv_are_one_declaration() -> None:
    """What the stack renders, finetune.py's parser reads back to the same values."""
    values = {"deepspeed": "/c/ds_config.json", "model": "m", "dataset": "d", "format": "jsonl", "seq_len": 4096,
              "max_steps": 10, "learning_rate": 1e-4, "save_steps": 5, "lora": True, "lora_rank": 8,
              "lora_target_modules": ["q_proj"], "roles": ["bot=assistant"], "checkpoint_dir": "/c", "model_dir": "/m"}
    args = FINETUNE.parser().parse_args(FINETUNE.argv(values))
    assert {name: getattr(args, name) for name in values} == values


def test_stack_flags_come_from_the_contract() -> None:
    from workloads import recipe

    flags = FINETUNE.stack_flags()
    assert flags == recipe.STACK_FLAGS
    assert flags["--deepspeed_config"] == flags["--deepspeed"] == ("deepspeed",)
    assert flags["--save-steps"] == ("finetune", "saveSteps") and "--seed" not in flags


def test_the_package_imports_nothing_of_the_stack() -> None:
    """The import contract's own check is lint-imports (tests/test_layers.py); this one reads every file, the
    user folder aside, so that a lazy import inside a function is caught too."""
    stack = {"model", "policy", "planner", "workloads", "components", "checks", "preview"}
    found = []
    for path in sorted((ROOT / "recipes").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            found += [f"{path.name}: {n}" for n in names if n.split(".")[0] in stack]
    assert found == []


def test_a_program_ships_with_its_own_modules() -> None:
    """smoke_train.py imports its smoke_train_*.py beside it: wherever it ships, they do; a program without own
    modules ships as before, and finetune.py's ship with its kind (workloads/recipe.py LIBRARY_GLOB)."""
    assert contract.own_modules("smoke_train.py") == ("smoke_train_checkpoint.py", "smoke_train_loop.py",
                                                      "smoke_train_ranks.py", "smoke_train_report.py")
    files = contract.program_sources("smoke_train.py")
    assert list(files) == [contract.PACKAGE_FILE, "smoke_train.py", *contract.own_modules("smoke_train.py"),
                           *contract.COMMON]
    assert contract.own_modules("finetune.py") == contract.own_modules("nccl_bench.py") == ()
    assert list(contract.program_sources("nccl_bench.py")) == [contract.PACKAGE_FILE, "nccl_bench.py",
                                                               *contract.COMMON]


def test_the_shipped_package_module_is_the_packages_init() -> None:
    files = contract.sources("kube_api.py")
    assert files[contract.PACKAGE_FILE] == (ROOT / "recipes" / "__init__.py").read_text(encoding="utf-8")
    # In the checkout a link to __init__.py (so `python recipes/X.py` finds the package beside it); a copy that
    # does not keep links (make test-user-stacks' copytree, a downloaded archive) has the same text.
    assert (ROOT / "recipes" / "recipes.py").read_text(encoding="utf-8") == files[contract.PACKAGE_FILE]
    assert Option(("--x",)).name == "x"
