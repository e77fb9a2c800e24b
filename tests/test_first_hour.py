"""The first hour's rough edges (issue 20.7), each with its failing input: no follow-on errors from the defaults
that stand in for a rejected key; YAML syntax errors at the line of the mistake with its text; "did you mean" for
keys, stacks, models, GPU types and regions; every GPU's regions and zones from the catalog; the README's exit
codes as make returns them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import DELETE, PROJECT_DIR, changed, config_model, config_problems, problems, user_docs, yaml_load

import checks
from planner import model_catalog
from planner.__main__ import main as planner_main
from preview import stackfile
from preview.__main__ import main as preview_main


@pytest.fixture(scope="module")
def raw_catalog() -> dict:
    with open(PROJECT_DIR / "data" / "gpu_catalog.yaml", encoding="utf-8") as fh:
        return yaml_load(fh)


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


# --- (c) "did you mean" for keys, stacks, models, GPU types, regions and zones -----------------------------------

def test_did_you_mean_for_gpu_types_regions_enums_and_zones() -> None:
    found = problems("dev", {"nodePools[0].gpu.type": "nvidia-tesla-t5", "gcp:region": "us-wst1",
                             "workloads.smoke.deepspeed.precision": "fp61", "cluster.systemPool.zones": ["us-west1-z"]})
    assert any(p.startswith("nodePools[0].gpu.type: unknown GPU type 'nvidia-tesla-t5'; known: ")
               and p.endswith("; did you mean `nvidia-tesla-t4`?") for p in found), found
    assert any(p.startswith("gcp:region: us-wst1 ") and p.endswith("; did you mean `us-west1`?") for p in found)
    assert 'workloads.smoke.deepspeed.precision: "fp61" is not one of bf16, fp16, fp32; did you mean `fp16`?' in found
    # The region is unknown, so its zones are too: the zone is left alone until the region is right.
    assert problems("dev", {"cluster.systemPool.zones": ["us-west1-z"]}) == [
        "cluster.systemPool.zones[0]: us-west1-z is not a zone of us-west1; did you mean `us-west1-c`?"]
    # A real zone without the GPU is no typo: no guess, the zones that offer it are listed.
    (zone,) = problems("dev", {"nodePools[0].zones": ["us-west1-c"]})
    assert zone.endswith("(zones of us-west1 that do: us-west1-a, us-west1-b)")


def test_did_you_mean_for_models_by_name_and_hugging_face_id() -> None:
    found = problems("prod", {f"{SMOKE}.model.name": "Lama-3.1-8B", f"{SMOKE}.model.parameters": DELETE})
    assert any(p.startswith(f"{SMOKE}.model.name: unknown model 'Lama-3.1-8B'; known: ")
               and p.endswith("; did you mean `Llama-3.1-8B`?") for p in found), found
    with pytest.raises(model_catalog.UnknownModelError, match=r"did you mean `mistralai/Mistral-7B-Instruct-v0\.3`\?$"):
        model_catalog.resolve("mistralai/Mistral-7B-Instruct-v0.4")
    with pytest.raises(model_catalog.UnknownModelError) as err:
        model_catalog.resolve("t5-base")  # nothing close: no guess
    assert "did you mean" not in str(err.value)


def test_did_you_mean_for_the_stack_and_the_planners_region(capsys: pytest.CaptureFixture[str]) -> None:
    assert preview_main(["--stack", "devv"]) == 2
    assert capsys.readouterr().err.strip().endswith("; did you mean `dev`?")
    assert planner_main(["--model", "Llama-2-7B", "--mode", "inference", "--region", "us-centrl1"]) == 2
    assert capsys.readouterr().err.strip().endswith("; did you mean `us-central1`?")
    assert planner_main(["--model", "Lama-2-7B", "--mode", "inference"]) == 2
    assert capsys.readouterr().err.strip().endswith("; did you mean `Llama-2-7B`?")


# --- (d) every GPU's regions and zones from the catalog, with its source ------------------------------------------

def test_europe_west1_is_known_and_a_stack_there_loads() -> None:
    """The failing input: `gcp:region: europe-west1` said "add its zones there first"."""
    assert problems("dev", {"gcp:region": "europe-west1", "cluster.systemPool.zones": ["europe-west1-b"],
                            "nodePools[0].zones": ["europe-west1-d"]}) == []


def test_every_gpu_zone_belongs_to_a_known_region(raw_catalog: dict) -> None:
    regions = raw_catalog["regions"]
    for name, gpu in raw_catalog["gpus"].items():
        for key in ("zones", "unconfirmedZones"):
            for region, zones in gpu.get(key, {}).items():
                assert region in regions, (name, region)
                assert set(zones) <= set(regions[region]), (name, region, zones)
                assert all(z.rsplit("-", 1)[0] == region for z in zones), (name, zones)
        unconfirmed = {z for zs in gpu.get("unconfirmedZones", {}).values() for z in zs}
        assert not unconfirmed & {z for zs in gpu["zones"].values() for z in zs}, name


def test_zone_facts_from_the_source(raw_catalog: dict) -> None:
    """Pinned from skypilot-org/skypilot-catalog catalogs/v7/gcp/vms.csv @ 017e250 (the Compute API's zones)."""
    gpus = raw_catalog["gpus"]
    assert "skypilot-catalog" in raw_catalog["source"]
    assert gpus["nvidia-tesla-t4"]["zones"]["europe-west1"] == ["europe-west1-b", "europe-west1-c", "europe-west1-d"]
    assert gpus["nvidia-l4"]["zones"]["europe-west1"] == ["europe-west1-b", "europe-west1-c"]  # g2-standard-8 rows
    assert gpus["nvidia-h200-141gb"]["zones"]["us-central1"] == ["us-central1-b"]  # a3-ultragpu-8g rows
    assert raw_catalog["regions"]["europe-west1"] == ["europe-west1-b", "europe-west1-c", "europe-west1-d"]
    # Listed here before, not by the source's B200 rows: kept, marked unconfirmed.
    assert gpus["nvidia-b200"]["unconfirmedZones"] == {"europe-west4": ["europe-west4-b"]}


def test_an_unconfirmed_zone_is_never_a_default_and_only_warns_when_named() -> None:
    from model import catalog

    cat = catalog.load()
    assert cat.zones("nvidia-b200", "europe-west4") == ()  # so a pool there without zones is refused
    assert cat.unconfirmed_zones("nvidia-b200", "europe-west4") == ("europe-west4-b",)
    h100 = {"gcp:region": "asia-east1", "cluster.systemPool.zones": ["asia-east1-a"]}
    (refused,) = problems("h100", {**h100, "nodePools[0].zones": []})
    assert refused == ("nodePools[0].gpu.type: nvidia-h100-mega-80gb is offered in asia-east1 only in zones "
                       "data/gpu_catalog.yaml has unconfirmed (asia-east1-c); name one in nodePools[0].zones to try it")
    named = changed("h100", {**h100, "nodePools[0].zones": ["asia-east1-c"]})
    assert config_problems(named) == []
    assert any(w.startswith("nodePools[0].zones[0]: data/gpu_catalog.yaml has asia-east1-c for "
                            "nvidia-h100-mega-80gb unconfirmed") for w in checks.warnings(config_model(named)))


# --- (e) the README's exit codes as make returns them -------------------------------------------------------------

def test_make_exits_2_whatever_the_recipe_returned_and_the_readme_says_so(tmp_path: Path) -> None:
    """GNU make's own exit status is 2 when a recipe fails, with any nonzero code (make(1), EXIT STATUS)."""
    makefile = tmp_path / "Makefile"
    makefile.write_text("one:\n\t@exit 1\ntwo:\n\t@exit 2\n", encoding="utf-8")
    codes = [subprocess.run(["make", "-s", "-f", str(makefile), target], capture_output=True, check=False).returncode
             for target in ("one", "two")]
    assert codes == [2, 2]
    readme = " ".join(user_docs().split())
    assert "`make preview` itself exits **0** or **2**: GNU make exits 2 whenever a recipe fails" in readme
    assert ("Exit codes of `python -m preview` (what `make preview` runs): **0** ok; **2** configuration error"
            in readme)
