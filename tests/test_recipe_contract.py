"""recipes/contract.py, the one declaration of each recipe option (issue 41 item 1): model/schema.yaml's
`$defs.finetuneRun` agrees with it (type, default, bounds, choices: one of each), the stack renders finetune.py's
argv and FINETUNE_STACK_KEYS from it, finetune.py parses and checks its arguments with it, and the package imports
nothing of the stack. The other programs the stack passes flags to (recipes/contract_programs.py): each one's parser
is its declaration, reads what the stack renders for it (every example stack's, tests/golden), and refuses a value
out of a declared bound."""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import importlib
import itertools
import shlex
from pathlib import Path
from typing import Any

import pytest
from conftest import yaml_load

from recipes import contract
from recipes.contract import FINETUNE, SWITCH, Option, Program
from recipes.contract_programs import CONTRACT_FILES, EVALUATE, OWN_PARSERS, PROGRAMS, SERVE, STOP_RANKS

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


# --- the other programs the stack passes flags to (recipes/contract_programs.py) -------------------------------------

GOLDEN = ROOT / "tests" / "golden"
SHELL_OPERATORS = {"&", "&&", "||", ";", "|"}
# Where each declared program's parser is: its module's parse_args, or (stop_ranks.py) its main, stopped once parsed.
ENTRIES = {"maintenance_watch.py": "parse_args", "evaluate.py": "parse_args", "evaluator.py": "parse_args",
           "adapter_loader.py": "parse_args", "serve.py": "parse_args", "send_prompt.py": "parse_args",
           "stop_ranks.py": "main", "reservation_end.py": "parse_args", "nccl_bench.py": "parse_args"}
DECLARED = {**{n: p for n, p in PROGRAMS.items() if n != "finetune.py"}, **OWN_PARSERS}
# What the stack passes the programs no example stack runs (their stack runs: tests/test_serve_evaluation.py,
# test_serve_fleet.py, test_serving.py), shaped as workloads/serving_*.py passes it.
SAMPLES = {
    "evaluator.py": {"url": "http://127.0.0.1:8000", "base": "Qwen/Qwen2.5-7B-Instruct", "task": "/gcs/task.jsonl",
                     "evals": "/evals", "max_tokens": 32, "max_length": 4096, "min_improvement": 0.05,
                     "metric": "exact_match", "adapter": ["tune=/gcs/models/tune", "b=/gcs/models/b"]},
    "evaluate.py": {"url": "http://127.0.0.1:8000", "base": "base", "adapter": "tune", "candidate": "/gcs/models/tune",
                    "task": "/gcs/task.jsonl", "results": "/evals/tune/results.json", "max_tokens": 32,
                    "max_length": 2048, "min_improvement": 1.0, "metric": "loglikelihood"},
    "adapter_loader.py": {"url": "http://127.0.0.1:8000", "evals": "/evals", "ready": "/tmp/adapter-loader/ready",
                          "adapter": ["tune", "b"]},
    "serve.py": {"model": "Qwen/Qwen2.5-7B-Instruct", "deployment_name": "chat", "tensor_parallel": 2, "port": 51080,
                 "gateway_port": 28080, "max_length": 4096, "openai_port": 8000},
}


class _Parsed(Exception):  # noqa: N818 (not an error: the parser and what it read, out of the program)
    def __init__(self, parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        super().__init__()
        self.parser, self.namespace = parser, args  # not `args`: an exception's own


def own_parse(script: str, argv: list[str],
              monkeypatch: pytest.MonkeyPatch) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The program's own parser, and what it reads from `argv`, before anything the program does next (stop_ranks.py
    would signal this machine's ranks)."""
    real = argparse.ArgumentParser.parse_args

    def parse(self: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> argparse.Namespace:
        raise _Parsed(self, real(self, args, namespace))

    module = importlib.import_module(f"recipes.{script.removesuffix('.py')}")
    with monkeypatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", parse)
        with pytest.raises(_Parsed) as parsed:
            getattr(module, ENTRIES[script])(argv)
    return parsed.value.parser, parsed.value.namespace


def _words(words: list[str], script: str, found: list[list[str]]) -> None:
    for i, word in enumerate(words):
        if word.endswith(f"/{script}") or word == f"recipes.{script.removesuffix('.py')}":
            found.append(list(itertools.takewhile(lambda w: w not in SHELL_OPERATORS, words[i + 1:])))
            return
        if " " in word and script in word:  # a command quoted in a line: ssh HOST 'python3 .../stop_ranks.py ...'
            _rendered_in(word, script, found)


def _rendered_in(node: Any, script: str, found: list[list[str]]) -> None:
    """Every argv after `script` in a rendered value: a list of words (a container's command or args), or a shell
    line (a run script's, an output's command)."""
    if isinstance(node, dict):
        for value in node.values():
            _rendered_in(value, script, found)
    elif isinstance(node, list) and all(isinstance(word, str) for word in node):
        _words(node, script, found)
    elif isinstance(node, list):
        for value in node:
            _rendered_in(value, script, found)
    elif isinstance(node, str):
        for line in node.splitlines():
            with contextlib.suppress(ValueError):  # not a shell line
                _words(shlex.split(line), script, found)


def rendered(script: str) -> list[list[str]]:
    """What the example stacks render for `script` (tests/golden, which tests/test_golden.py holds to the stack)."""
    found: list[list[str]] = []
    for path in sorted(GOLDEN.glob("*.resources.yaml")):
        with path.open(encoding="utf-8") as stream:
            _rendered_in(yaml_load(stream), script, found)
    return [argv for argv in found if argv]  # an environment value naming the file is no command


def expected_values(parser: argparse.ArgumentParser, argv: list[str]) -> dict[str, Any]:
    """What each option in `argv` reads as, by the parser's own types: dest -> value."""
    actions = {flag: action for action in parser._actions for flag in action.option_strings}
    values: dict[str, Any] = {}
    words = iter(argv)
    for word in words:
        action = actions.get(word)
        if action is None:
            continue  # a positional (send_prompt.py's prompt)
        if action.nargs == 0:
            values[action.dest] = action.const
            continue
        text = next(words)
        value = action.type(text) if callable(action.type) else text
        if isinstance(action, argparse._AppendAction):
            values.setdefault(action.dest, []).append(value)
        else:
            values[action.dest] = value
    return values


@pytest.mark.parametrize("script", sorted(DECLARED))
def test_each_program_reads_what_the_stack_renders_for_it(script: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The argv the stack renders, parsed by the program's own parser (a renamed flag fails here, not in a pod)."""
    program = DECLARED[script]
    argvs = [program.argv(SAMPLES[script])] if script in SAMPLES else rendered(script)
    assert argvs, f"no example stack renders {script}: give it a sample"
    for argv in argvs:
        parser, args = own_parse(script, argv, monkeypatch)
        values = expected_values(parser, argv)
        assert set(values) <= {o.name for o in program.options}, argv
        assert {name: getattr(args, name) for name in values} == values, argv
        if ENTRIES[script] == "parse_args":  # and the program's own checks after parsing pass it too
            importlib.import_module(f"recipes.{script.removesuffix('.py')}").parse_args(argv)


@pytest.mark.parametrize("script", sorted(DECLARED))
def test_each_programs_parser_is_its_declaration(script: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Built from it (PROGRAMS), or held to it here (OWN_PARSERS: shipped without contract.py): the same flags,
    types, defaults, required options, choices and help."""
    program = DECLARED[script]
    parser, _ = own_parse(script, program.argv(SAMPLES[script]) if script in SAMPLES else rendered(script)[0],
                          monkeypatch)
    actions = {a.option_strings[0]: a for a in parser._actions if a.option_strings and a.dest != "help"}
    options = [*((o, False) for o in program.options), *((o, True) for o in program.hidden)]
    assert sorted(actions) == sorted(o.flags[0] for o, _ in options)
    for o, hidden in options:
        action = actions[o.flags[0]]
        convert = action.type if callable(action.type) else None
        default = False if o.type == SWITCH else convert(o.default) if convert and isinstance(o.default, str) \
            else o.default
        assert (tuple(action.option_strings), action.dest, action.default, action.required) == (
            o.flags, o.name, default, o.required), o.flags
        assert action.help == (argparse.SUPPRESS if hidden else o.help or None), o.flags
        assert tuple(action.choices or ()) == o.choices and (action.nargs == 0) == (o.type == SWITCH), o.flags
        assert o.type in (str, SWITCH) or convert is o.type, o.flags
    assert parser.allow_abbrev == program.abbrev


@pytest.mark.parametrize(("script", "argv", "message"), [
    ("evaluate.py", ["--max-tokens", "0"], "--max-tokens must be 1 or more, got 0"),
    ("evaluate.py", ["--min-improvement", "1.5"], "--min-improvement must be between 0 and 1, got 1.5"),
    ("evaluate.py", ["--min-improvement", "-0.1"], "--min-improvement must be between 0 and 1, got -0.1"),
    ("send_prompt.py", ["--temperature", "-1"], "--temperature must be 0 or more, got -1.0"),
    ("send_prompt.py", ["--max-new-tokens", "0"], "argument --max-new-tokens: must be 1 or more, got 0"),
    ("send_prompt.py", ["--timeout", "0"], "argument --timeout: must be 1 or more, got 0"),
    ("serve.py", ["--tensor-parallel", "0"], "argument --tensor-parallel: must be 1 or more, got 0"),
    ("serve.py", ["--max-length", "0"], "argument --max-length: must be 1 or more, got 0"),
    ("serve.py", ["--port", "70000"], "argument --port: 70000 is not a TCP port"),
    ("serve.py", ["--openai-port", "-1"], "argument --openai-port: -1 is not a TCP port"),
])
def test_a_value_out_of_its_declared_bounds_is_refused(script: str, argv: list[str], message: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 2, as before the declaration: argparse's own for a type's bound, the program's words for the others
    (evaluate.py: its log line and EXIT_USAGE)."""
    good = {"evaluate.py": EVALUATE.argv(SAMPLES["evaluate.py"]), "serve.py": SERVE.argv(SAMPLES["serve.py"]),
            "send_prompt.py": ["--openai", "--model", "m", "hi"]}[script]
    module = importlib.import_module(f"recipes.{script.removesuffix('.py')}")
    if script == "evaluate.py":
        assert module.main([*good, *argv]) == contract.EXIT_USAGE
        assert message in capsys.readouterr().out
        return
    with pytest.raises(SystemExit) as stopped:
        module.parse_args([*good, *argv])
    assert stopped.value.code == contract.EXIT_USAGE and message in capsys.readouterr().err


def test_the_image_stops_the_ranks_with_the_declared_flag() -> None:
    """vertex_start.sh, a shell script in the image, runs stop_ranks.py on Vertex AI's SIGTERM with the same flag."""
    script = (ROOT / "workloads" / "images" / "deepspeed" / "vertex_start.sh").read_text(encoding="utf-8")
    assert f'"$STOP_RANKS_PY" {STOP_RANKS.option("timeout").flags[0]} "$RANKS_WAIT"' in script


def test_a_program_that_imports_the_declarations_ships_with_them() -> None:
    """Each program of PROGRAMS imports contract.py (and, but for finetune.py and maintenance_watch.py,
    contract_programs.py); the stack ships those beside it (the evaluator's and MII's ConfigMaps, the watch's)."""
    from workloads import maintenance, serving_evaluator

    assert set(CONTRACT_FILES) <= set(serving_evaluator.EVALUATOR_FILES)
    assert "contract.py" in maintenance.files()
    own = [name for name, program in OWN_PARSERS.items()
           if "recipes.contract" in (ROOT / "recipes" / name).read_text(encoding="utf-8")]
    assert own == []  # shipped alone: a program of OWN_PARSERS imports no declaration


def test_the_other_programs_keys_are_workload_keys() -> None:
    """An option's `key` (where the stack takes its value: serving.evaluation.maxTokens, ...) names a key a workload
    of the schema has."""
    with (ROOT / "model" / "schema.yaml").open(encoding="utf-8") as stream:
        workload = yaml_load(stream)["properties"]["workloads"]["additionalProperties"]
    blocks = [workload, *(rule["then"] for rule in workload.get("allOf", []) if "then" in rule)]
    # _property walks from a `finetune` block: each workload block stands in for it.
    missing = [f"{p.name} {o.flags[0]}: {'.'.join(o.key)}" for p in DECLARED.values() for o in p.options
               if o.key and all(_property(block, ("finetune", *o.key)) is None for block in blocks)]
    assert missing == [] and any(o.key for p in DECLARED.values() for o in p.options)
