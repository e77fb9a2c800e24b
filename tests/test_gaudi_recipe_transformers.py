"""finetune.py on the Gaudi image's transformers (issue 30 item 1): each optimum-habana release installs the
transformers its setup.py pins, older than the recipe's; finetune.py passes the older keywords there (finetune_hpu.py),
and the stack refuses `finetune` with a release that pins one older than the recipe runs on.

The pins below are written out from optimum-habana's setup.py at each tag (git show TAG:setup.py, read 2026-11-27),
the keyword releases from the transformers wheels (data/gaudi_software.yaml says which); never from the code."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import DELETE, problems

from model import gaudi_software
from model.yamlio import load_yaml
from workloads import finetune

GAUDI_W = "workloads.gaudi-llm-ds-ft"
KEY = f"{GAUDI_W}.training.optimumHabanaVersion"
RECIPE = {f"{GAUDI_W}.training": DELETE, f"{GAUDI_W}.finetune": {"model": "Qwen/Qwen2.5-0.5B-Instruct",
                                                                  "datasetPath": "data/train.jsonl", "maxSteps": 10}}


@pytest.fixture(scope="module")
def hpu() -> Any:
    return finetune.script_module("finetune_hpu")


def pins() -> dict[str, gaudi_software.OptimumHabanaRelease]:
    return {r.release: r for r in gaudi_software.optimum_habana_releases()}


def test_each_release_records_the_transformers_its_setup_py_pins() -> None:
    found = pins()
    assert found["v1.10.0"].transformers == ">=4.34.0,<4.35.0"
    assert found["v1.13.2"].transformers == ">=4.43.0,<4.44.0"
    assert found["v1.14.0"].transformers == ">=4.45.2,<4.46.0"
    assert found["v1.15.0"].transformers == ">=4.45.2,<4.46.0"  # the default, on Gaudi software 1.19
    assert found["v1.17.0"].transformers == ">=4.49.0,<4.50.0"
    assert found["v1.19.1"].transformers == ">=4.51.0,<4.52.0"
    assert found["v1.20.0"].transformers == ">=4.55.0,<4.56.0"
    assert found["v1.21.0"].transformers == ">=4.55.0,<4.56.0"  # its PyPI wheel's Requires-Dist
    assert all(r.transformers for r in found.values())
    assert found["v1.15.0"].transformers_floor == (4, 45, 2)


def test_the_recipe_runs_from_the_measured_transformers_on() -> None:
    # docs/measurements.md: every record format, LoRA merged, held-out records, resume on transformers 4.45.2.
    assert gaudi_software.recipe_min_transformers() == "4.45.2"
    fit = [release for release, r in pins().items() if gaudi_software.runs_the_recipe(r)]
    assert fit[0] == "v1.14.0" and "v1.13.2" not in fit and "v1.15.0" in fit and "v1.21.0" in fit


def test_finetune_hpu_switches_keywords_at_the_recorded_transformers_releases(hpu: Any) -> None:
    since = load_yaml(gaudi_software.DATA_PATH)["recipeOnGaudi"]["keywordsSince"]
    assert since == {"processingClass": "4.46", "dtype": "4.56", "nonPaddingTokens": "4.57", "loggingDirEnv": "5.0",
                     "datasetsList": "4.0"}
    assert (hpu.PROCESSING_CLASS_SINCE, hpu.DTYPE_SINCE, hpu.NON_PADDING_TOKENS_SINCE, hpu.LOGS_ENV_SINCE,
            hpu.DATASETS_LIST_SINCE) == ((4, 46), (4, 56), (4, 57), (5, 0), (4, 0))


@pytest.mark.parametrize(("version", "tokenizer", "dtype", "tokens", "logging_dir"), [
    ("4.45.2", "tokenizer", "torch_dtype", True, {"logging_dir": "/tb"}),  # v1.14.0-v1.16.0 (the default v1.15.0)
    ("4.49.0", "processing_class", "torch_dtype", True, {"logging_dir": "/tb"}),  # v1.17.0, v1.18.0
    ("4.55.4", "processing_class", "torch_dtype", True, {"logging_dir": "/tb"}),  # v1.20.0, v1.21.0
    ("4.57.6", "processing_class", "dtype", "non_padding", {"logging_dir": "/tb"}),
    ("5.19.0", "processing_class", "dtype", "non_padding", {}),  # data/versions.yaml's: the GKE and Vertex image
    ("5.0.0.dev0", "processing_class", "dtype", "non_padding", {}),
])
def test_finetune_py_passes_each_transformers_its_own_keywords(hpu: Any, version: str, tokenizer: str, dtype: str,
                                                               tokens: Any, logging_dir: dict[str, str]) -> None:
    assert hpu.tokenizer_keyword(version) == tokenizer
    assert hpu.dtype_keyword(version) == dtype
    assert hpu.tokens_seen(version) == tokens
    assert hpu.tokens_seen(version, padding_free=True) == ("all" if tokens == "non_padding" else tokens)
    assert hpu.logging_dir_arguments(version, "/tb") == logging_dir
    assert hpu.logging_dir_arguments(version, None) == {}


def test_a_release_whose_transformers_the_recipe_cannot_run_on_is_refused() -> None:
    # Habana's stock image at start (installAtStart) on Gaudi software 1.17, where v1.13.x is the validated release.
    found = problems("gaudi", {**RECIPE, f"{GAUDI_W}.gaudi.installAtStart": True,
                               f"{GAUDI_W}.gaudi.softwareVersion": "1.17.0", KEY: "v1.13.0"})
    assert [p for p in found if p.startswith(KEY)] == [
        f"{KEY}: v1.13.0 installs transformers >=4.43.0,<4.44.0 (its setup.py); finetune.py ({GAUDI_W}.finetune) "
        "runs on transformers 4.45.2 and later; no release validated with Gaudi software 1.17.0 does: v1.14.0 and "
        "later do (Gaudi software 1.18 and later) (data/gaudi_software.yaml)"]


def test_the_default_release_runs_the_recipe_and_training_alone_takes_any() -> None:
    assert [p for p in problems("gaudi", RECIPE) if p.startswith(KEY)] == []
    # Without `finetune` (optimum-habana's own example) the old release is no problem of this rule.
    found = problems("gaudi", {f"{GAUDI_W}.gaudi.installAtStart": True, f"{GAUDI_W}.gaudi.softwareVersion": "1.17.0",
                               KEY: "v1.13.0"})
    assert [p for p in found if p.startswith(KEY)] == []


def test_a_release_refused_for_its_gaudi_software_is_one_problem() -> None:
    found = problems("gaudi", {**RECIPE, KEY: "v1.12.0"})
    assert [p for p in found if p.startswith(KEY)] == [
        f"{KEY}: v1.12.0 is not validated with Gaudi software 1.19.1 ({GAUDI_W}.gaudi.softwareVersion); use v1.15.0 "
        "(optimum-habana's README at each release, data/gaudi_software.yaml)"]


@pytest.mark.parametrize(("version", "kind"), [("2.19.2", "Sequence"), ("3.2.0", "Sequence"), ("4.0.0", "List"),
                                               ("5.2.0", "List")])
def test_token_ids_are_datasets_own_list_feature_of_each_release(hpu: Any, version: str, kind: str) -> None:
    # v1.19.x's examples pin datasets<=2.19.2, which has no List (4.0's); Sequence of a Value is the same list there.
    fake = SimpleNamespace(__version__=version, Value=lambda t: ("Value", t), List=lambda v: ("List", v),
                           Sequence=lambda v: ("Sequence", v))
    assert hpu.token_ids_feature(fake) == (kind, ("Value", "int32"))


# What Python 3.11 added to the standard library that a 3.10 interpreter lacks (module, name): "What's New In Python
# 3.11". A script that uses one parses on 3.10 and fails when the line runs (datetime.UTC: at the first log step).
NEW_IN_3_11 = {("datetime", "UTC"), ("typing", "Self"), ("typing", "LiteralString"), ("typing", "Never"),
               ("typing", "assert_never"), ("typing", "reveal_type"), ("enum", "StrEnum"), ("tomllib", None)}
SCRIPTS = Path(__file__).resolve().parent.parent / "recipes"


def python_3_11_names(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            used = [(node.value.id, node.attr)]
        elif isinstance(node, ast.ImportFrom):
            used = [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            used = [(alias.name, None) for alias in node.names]
        else:
            continue
        found += [f"{module}.{name}" if name else str(module) for module, name in used if (module, name) in NEW_IN_3_11]
    return found


def test_the_recipe_runs_on_the_gaudi_images_python() -> None:
    """finetune.py and its modules run on the Habana base images' Python (3.10 on Ubuntu 22.04, 3.12 on 24.04:
    their rows in data/gaudi_software.yaml): they parse as the oldest, 3.10, and use nothing of 3.11's standard
    library."""
    pythons = {base["python"] for base in load_yaml(gaudi_software.DATA_PATH)["baseImages"]}
    assert pythons == {"3.10", "3.12"}
    major, minor = min(tuple(int(part) for part in python.split(".")) for python in pythons)
    # finetune.py's modules and what it imports beside them (contract.py, shutdown.py, the package's __init__).
    scripts = [*sorted(SCRIPTS.glob("finetune*.py")), SCRIPTS / "contract.py", SCRIPTS / "shutdown.py",
               SCRIPTS / "__init__.py"]
    assert {"finetune.py", "finetune_hpu.py", "finetune_progress.py"} <= {path.name for path in scripts}
    for path in scripts:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path), feature_version=(major, minor))
        assert python_3_11_names(tree) == [], path.name


def test_a_python_3_11_name_is_found() -> None:
    tree = ast.parse("import datetime\nfrom typing import Self\nimport tomllib\nx = datetime.UTC\n")
    assert sorted(python_3_11_names(tree)) == ["datetime.UTC", "tomllib", "typing.Self"]


@pytest.mark.parametrize(("version", "hpu_run", "refused"), [
    ("4.45.2", False, "transformers 4.54 or later"),   # optimum-habana v1.14.0-v1.16.0's pin: records see each other
    ("4.53.3", False, "transformers 4.54 or later"),   # 4.53.0's masking_utils has no find_packed_sequence_indices
    ("4.54.0", False, None),
    ("5.19.0", False, None),                           # data/versions.yaml's
    ("4.55.4", True, "not proven on Gaudi"),           # optimum-habana v1.20.0's pin, on HPU
])
def test_padding_free_batches_only_where_the_masks_keep_records_apart(hpu: Any, version: str, hpu_run: bool,
                                                                      refused: str | None) -> None:
    problem = hpu.padding_free_problem(version, hpu_run)
    assert (problem is None) if refused is None else (refused in problem)
