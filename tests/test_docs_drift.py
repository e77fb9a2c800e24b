"""What the docs, the written stack and the messages say, held to what is rendered and what the recipe reads (issue
40 item 5): each drift the issue found, with a test that fails if it comes back. (The GKE datasetPath error's
example: tests/test_recipe.py test_a_local_path_in_the_bucket_gets_a_bucket_example.)"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import PROJECT_DIR, changed, problems, user_docs, yaml_load

from planner import training_notes
from planner.__main__ import main as planner_main
from preview import engine
from preview import write_stack as ws
from workloads.finetune import script_module

S = "workloads.chat"


def test_the_docs_say_the_evaluator_is_rendered_as_it_is() -> None:
    """docs/finetune.md said the evaluator sidecar was something "the stack does not render yet"; it renders it
    (serving.evaluation): the container's name and its mounts as docs/finetune.md states them."""
    run = engine.run_program(*engine.engine_config_from_yaml(
        changed("finetune", {f"{S}.serving.evaluation": {"task": "data/heldout.jsonl"}})), stack="finetune")
    pod = run.one("kubernetes:apps/v1:Deployment", "chat-deployment").inputs["spec"]["template"]["spec"]
    writable = {c["name"]: sorted(m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly"))
                for c in pod["containers"]}
    assert "/evals" in writable["evaluator"] and "/evals" not in writable["server"]
    text = (PROJECT_DIR / "docs" / "finetune.md").read_text(encoding="utf-8")
    assert "serve pod's `evaluator` container, which the\n  stack renders with `serving.evaluation`" in text
    assert "it alone mounts\n  `evals/` read-write (vLLM's container reads the bucket read-only)" in text
    assert not re.search(r"does not render\s+yet|not rendered\s+yet", user_docs())


def test_the_written_header_names_every_record_format_and_the_data_check(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The header's data step named only `text` records (and promptField/responseField); the recipe reads five
    formats (finetune_data.py's RECORD_FORMATS, not the schema the writer reads them from)."""
    assert ws.main(["--model", "Qwen/Qwen2.5-7B-Instruct", "--mode", "finetune", "--serve", "0", "--stack", "mine",
                    "--dir", str(tmp_path)]) == 0
    header = " ".join(line.lstrip("# ").strip() for line in (tmp_path / "Pulumi.mine.yaml").read_text(
        encoding="utf-8").split("\nconfig:")[0].splitlines())
    formats = [f for f in script_module("finetune_data").RECORD_FORMATS if f != "auto"]
    step = header.split("Your data (JSON lines of ", 1)[1]
    assert all(f"`{f}`" in step.split(": the first record's fields tell which")[0] for f in formats), step
    assert "`make check-data DATA=train.jsonl MODEL=Qwen/Qwen2.5-7B-Instruct`" in step
    assert "each record's `text` learned" not in header


def test_a_mistyped_from_workload_is_said_once_at_its_key() -> None:
    """With serving.evaluation, a typo in fromWorkload also read "serving.fromWorkload tunee serves a whole
    model": a wrong second reason."""
    found = problems("finetune", {f"{S}.serving.fromWorkload": "tunee",
                                  f"{S}.serving.evaluation": {"task": "data/heldout.jsonl"}})
    assert found == [f"{S}.serving.fromWorkload: no workload named 'tunee' in this stack; valid: the stack's "
                     "workloads that train a model: tune; did you mean `tune`?"]


SCRIPTS = [*sorted((PROJECT_DIR / "recipes").glob("*.py")), *sorted((PROJECT_DIR / "e2e").glob("*.py")),
           PROJECT_DIR / "tests" / "user_stacks.py", *sorted((PROJECT_DIR / "preview").glob("*.py"))]


def _descriptions() -> dict[str, str]:
    """Each script's argparse description taken from its docstring, as `--help` prints it (the expression
    evaluated on the docstring)."""
    found = {}
    for path in SCRIPTS:
        text = path.read_text(encoding="utf-8")
        if "description=__doc__" not in text and 'join(__doc__' not in text:
            continue
        tree = ast.parse(text)
        doc = ast.get_docstring(tree, clean=False) or ""
        for node in ast.walk(tree):
            expression = ast.unparse(node.value) if isinstance(node, ast.keyword) else ""
            # A slice of the docstring (its first line, its first paragraph); the whole of it cuts nothing.
            if expression != "__doc__" and "__doc__" in expression and getattr(node, "arg", "") == "description":
                found[path.name] = eval(ast.unparse(node.value), {"__doc__": doc})
    return found


def test_every_scripts_help_says_a_whole_sentence() -> None:
    """`evaluate.py --help` stopped at "through a": the docstring's first line, cut mid-sentence."""
    from recipes.contract_programs import PROGRAMS

    # Declared parsers too; one whose program passes its docstring's words is read above.
    found = {**_descriptions(), **{name: p.description for name, p in PROGRAMS.items() if p.description}}
    assert {"evaluate.py", "finetune.py", "user_stacks.py"} <= set(found)
    cut = {name: text[-40:] for name, text in found.items() if not text.rstrip().endswith((".", ")", ":"))}
    assert cut == {}


def _tables(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[list[str], str]:
    assert planner_main(argv) == 0
    out = capsys.readouterr().out
    return re.findall(r"^## (.+)$", out, re.MULTILINE), out


def test_a_one_gpu_plan_prints_one_table_per_offload(capsys: pytest.CaptureFixture[str]) -> None:
    """On one GPU ZeRO-1/2/3 partition over a single rank: the same as ZeRO-0 to within a GB (six near-identical
    tables before). On more GPUs every stage is its own table still."""
    heads, out = _tables(["--model", "Qwen2.5-7B-Instruct", "--mode", "finetune", "--gpus", "1xL4"], capsys)
    assert heads == ["ZeRO-0", "ZeRO-2 + optimizer offload"]
    assert ("On one GPU ZeRO partitions over a single rank and saves no memory: ZeRO-1, ZeRO-2, ZeRO-3, ZeRO-3 + "
            "optimizer offload left out (within 1.0 GB per GPU of the table of the same offload shown).") in out
    heads, _ = _tables(["--model", "Qwen2.5-7B-Instruct", "--mode", "finetune", "--gpus", "8xL4"], capsys)
    assert heads[:4] == ["ZeRO-0", "ZeRO-1", "ZeRO-2", "ZeRO-3"]


def _written(tmp_path: Path, mode: str) -> tuple[str, dict[str, Any]]:
    assert ws.main(["--model", "Qwen/Qwen2.5-7B-Instruct" if mode == "finetune" else "Qwen2.5-7B", "--mode", mode,
                    "--tokens", "164e6", "--serve", "0", "--stack", mode, "--dir", str(tmp_path)]) == 0
    text = (tmp_path / f"Pulumi.{mode}.yaml").read_text(encoding="utf-8")
    header = " ".join(line.lstrip("# ").strip() for line in text.split("\nconfig:")[0].splitlines())
    return header, yaml_load(text)["config"]["deepspeed-stack:workloads"]["train"]["deepspeed"]


def test_a_written_stack_says_its_batch_its_learning_rate_and_its_steps(tmp_path: Path) -> None:
    """A 1-GPU LoRA plan trains 1 sequence a step at 3e-4: 164M tokens / (1 x 2048) = 80,078 steps (by hand), now
    said in the header, with the key that changes it."""
    header, ds = _written(tmp_path, "finetune")
    assert ds["trainBatchSize"] == 1 and "learningRate" not in ds
    assert "Steps: about 80,078 optimizer steps of 1 sequence(s) of 2048 tokens" in header
    assert ("batch: 1 sequence(s) of 2048 tokens per optimizer step (trainBatchSize: the smallest the plan holds) at "
            "learning rate 0.0003 (deepspeed.learningRate's default, for adapters); to average more sequences a step "
            "without more GPU memory, raise deepspeed.gradientAccumulation") in header


def test_every_parameter_trains_at_the_rate_the_schema_advises(tmp_path: Path) -> None:
    """MODE=training (lora.enabled: false) wrote the adapters' 3e-4; finetune.lora.enabled's description says to
    lower it (e.g. 0.00002). Both numbers read from the schema."""
    from model.config_schema import schema

    run = schema()["$defs"]["finetuneRun"]["properties"]
    lowered = re.search(r"lower `deepspeed\.learningRate` then, e\.g\. ([0-9.]+)",
                        run["lora"]["properties"]["enabled"]["description"])
    assert lowered is not None and float(lowered.group(1)) == training_notes.FULL_LEARNING_RATE
    deepspeed = schema()["properties"]["workloads"]["additionalProperties"]
    assert _default_of(deepspeed, "learningRate") == training_notes.LORA_LEARNING_RATE
    header, ds = _written(tmp_path, "training")
    assert ds["learningRate"] == float(lowered.group(1))
    assert "for every parameter, as finetune.lora.enabled advises" in header


def _default_of(node: Any, key: str) -> Any:
    """The first `default` of a property named `key` anywhere under a schema node."""
    if isinstance(node, dict):
        if isinstance(node.get("properties"), dict) and isinstance(node["properties"].get(key), dict):
            return node["properties"][key].get("default")
        for value in node.values():
            found = _default_of(value, key)
            if found is not None:
                return found
    elif isinstance(node, list):
        for value in node:
            found = _default_of(value, key)
            if found is not None:
                return found
    return None

