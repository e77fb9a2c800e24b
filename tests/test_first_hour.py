"""The first hour's rough edges (issue 20.7), each with its failing input: no follow-on errors from the defaults
that stand in for a rejected key; YAML syntax errors at the line of the mistake with its text; "did you mean" for
keys, stacks, models, GPU types and regions; every GPU's regions and zones from the catalog; the README's exit
codes as make returns them."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import DELETE, problems

from preview import stackfile

# --- (a) no follow-on errors from a rejected key's stand-in default ---------------------------------------------

SMOKE = "workloads.zero3-smoke"


def test_misspelt_zero_stage_reports_only_the_key() -> None:
    """`zeroStag: 3` was rejected and the default zeroStage 2 stood in; the planner sized ZeRO-2 and said
    "at ZeRO-2 needs 30.3 GB", a problem the user never asked about."""
    found = problems("prod", {f"{SMOKE}.deepspeed.zeroStag": 3, f"{SMOKE}.deepspeed.zeroStage": DELETE,
                              f"{SMOKE}.model.name": "Llama-3.1-8B", f"{SMOKE}.model.parameters": DELETE,
                              f"{SMOKE}.model.sequenceLength": 2048})
    assert found == [f"{SMOKE}.deepspeed.zeroStag: unknown key; did you mean `zeroStage`?"]


def test_misspelt_precision_does_not_report_the_defaults_bf16() -> None:
    """dev trains in fp16 on T4; `precison: fp16` let the default bf16 stand in: "T4 has no bf16 support"."""
    found = problems("dev", {"workloads.smoke.deepspeed.precison": "fp16",
                             "workloads.smoke.deepspeed.precision": DELETE})
    assert found == ["workloads.smoke.deepspeed.precison: unknown key; did you mean `precision`?"]


def test_problems_that_do_not_hang_on_the_defaults_are_still_reported() -> None:
    """Every problem at once still holds: a wrong pool in the same workload is reported beside the misspelt key,
    and so is the planner's problem when the user's own values cause it."""
    found = problems("dev", {"workloads.smoke.deepspeed.precison": "fp16", "workloads.smoke.pool": "t5"})
    assert "workloads.smoke.pool: no nodePools entry is named 't5' (known: t4)" in found
    # An 8B model on prod's two L4 workers: its offload does not fit the pods. `stepsPerPrnt` stands in for
    # stepsPerPrint, which no sizing reads, so the offload problem stays beside the misspelt key.
    llama = {f"{SMOKE}.model.name": "Llama-3.1-8B", f"{SMOKE}.model.parameters": DELETE,
             f"{SMOKE}.model.sequenceLength": 2048}
    alone = problems("prod", llama)
    assert alone and alone[0].startswith(f"{SMOKE}.deepspeed.offloadOptimizer: DeepSpeed estimates")
    found = problems("prod", {**llama, f"{SMOKE}.deepspeed.stepsPerPrnt": 5})
    assert found == [f"{SMOKE}.deepspeed.stepsPerPrnt: unknown key; did you mean `stepsPerPrint`?", *alone]


def test_stand_ins_are_the_meant_key_or_every_default() -> None:
    from model.defaults import other_value, stand_ins

    assert stand_ins({"zeroStag"}, ["nvmePath", "stepsPerPrint", "zeroStage"]) == ["zeroStage"]
    # No key is close to `qq`: any default of the object may be what the user meant.
    assert stand_ins({"qq"}, ["nvmePath", "zeroStage"]) == ["nvmePath", "zeroStage"]
    assert other_value({"type": "integer", "minimum": 0, "maximum": 3}, 3) == 2
    assert other_value({"type": "string", "enum": ["bf16", "fp16"]}, "bf16") == "fp16"
    assert other_value({"type": "boolean"}, False) is True
    assert other_value({"type": "string"}, "/nvme") is None  # no easy other value: left as it is


# --- (b) YAML syntax errors at the line of the mistake, with its text ---------------------------------------------

YAML_MISTAKES = [
    # (what is wrong, the stack file, the line of the mistake (1-based), the words that explain it)
    ("a key without its colon", "config:\n  gcp:project: p\n  gcp:region us-central1\n  deepspeed-stack:image:\n"
     "    tag: x\n", 3, "a key without `: ` after it?"),
    ("a quote never closed", 'config:\n  gcp:project: "p\n  gcp:region: r\n', 2, "a quote that is never closed?"),
    ("a list never closed", "config:\n  deepspeed-stack:nodePools:\n    - zones: [us-central1-a\n      name: x\n"
     "  gcp:region: r\n", 3, "a `[` list that is never closed?"),
    ("a value with a colon", "config:\n  gcp:project: a: b\n  gcp:region: r\n", 2, "needs quotes"),
    ("a tab", "config:\n\tgcp:project: p\n", 2, "YAML indents with spaces, not tabs"),
    ("a list item without its dash", "config:\n  deepspeed-stack:nodePools:\n    - name: a\n    machineType: x\n",
     4, "a list item without its `- `"),
]


@pytest.mark.parametrize(("mistake", "text", "line", "hint"), YAML_MISTAKES, ids=[m[0] for m in YAML_MISTAKES])
def test_yaml_errors_name_the_line_of_the_mistake_and_show_it(mistake: str, text: str, line: int, hint: str,
                                                               tmp_path: Path) -> None:
    path = tmp_path / "Pulumi.x.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(stackfile.StackFileError) as err:
        stackfile.read(path)
    first, shown = str(err.value).splitlines()
    assert first.startswith(f"{path}:{line}:") and "not valid YAML" in first and hint in first, first
    assert shown == f"  {line} | {text.splitlines()[line - 1]}"
