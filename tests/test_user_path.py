"""A new user's first hour with the offline preview (issue 10): warnings that reach the reviewer, stack
files and base plans that are explicit, and a terminal summary without raw Markdown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from conftest import changed, config_model, problems, stack_path, stack_run, stacks, yaml_load

# prod's L4s serving Llama-2-7B in fp16, 24 sequences of 2048 at once: it fits, with under 10 % of the 24 GB free
# (test_planner pins the arithmetic: 22.1 GB). One definition, so the run below is the one test_planner shares.
from test_planner import tight_inference

import checks
from planner import cost_markdown
from preview import plan, stackfile, summary, tree
from preview.__main__ import main
from preview.engine import RunResult

WORKLOAD = "workloads.zero3-smoke"


@pytest.fixture(scope="module")
def tight() -> RunResult:
    return stack_run("prod", {"workloads": tight_inference()["deepspeed-stack:workloads"]})  # shared with test_planner


def write_stack(tmp_path: Path, name: str, doc: Any) -> Path:
    path = tmp_path / f"Pulumi.{name}.yaml"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc), encoding="utf-8")
    return path


# --- 1. warnings reach the terminal, summary.md and plan.json -------------------------------------

def test_the_run_records_the_programs_warnings(tight: RunResult) -> None:
    (warning,) = tight.warnings
    assert warning.startswith(f"{WORKLOAD}.model: Llama-2-7B (6.74B parameters") and "headroom (under 10%)" in warning
    assert tight.warnings == checks.warnings(config_model(tight_inference()))


def test_warnings_top_the_summary_and_are_listed_in_plan_json(tight: RunResult) -> None:
    md = summary.markdown(tight, [], 16)
    title, warnings_section, *_ = md.split("\n\n#### ")
    # The title, then the cost headline (planner/cost_markdown.py), then the warnings before any table.
    assert title == f"### Stack `prod`: {len(tight.resources)} resources, ok, 1 warning\n\n" \
                    f"{cost_markdown.headline(tight.outputs['costs'])}"
    assert warnings_section == f"Warnings\n\n- :warning: {tight.warnings[0]}"
    doc = plan.build(tight)
    assert doc["warnings"] == tight.warnings
    jsonschema.validate(json.loads(plan.dumps(doc)), plan.schema())


def test_a_stack_without_warnings_has_no_warnings_section(prod: RunResult) -> None:
    assert prod.warnings == []
    assert "#### Warnings" not in summary.markdown(prod, [], 16)
    assert plan.build(prod)["warnings"] == []


def test_the_terminal_labels_warnings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_stack(tmp_path, "prod", {"config": tight_inference()})
    assert main(["--stack", "prod", "--stack-file", str(path), "--out", str(tmp_path / "build")]) == 0
    err = capsys.readouterr().err.splitlines()
    (line,) = [e for e in err if "headroom" in e]
    assert line.startswith(f"warning: {WORKLOAD}.model: Llama-2-7B")
    assert "#### Warnings" in (tmp_path / "build" / "prod" / "summary.md").read_text()


# --- 6. stack files and base plans ---------------------------------------------------------------

def run_main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(args)
    return code, capsys.readouterr().err


def test_stack_file_needs_an_explicit_stack(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_stack(tmp_path, "staging", {"config": changed("dev")})
    code, err = run_main(["--stack-file", str(path), "--out", str(tmp_path)], capsys)
    assert code == 2
    assert err.strip() == f"error: --stack-file {path} needs --stack NAME, the stack it runs as (e.g. --stack staging)"


def test_base_plan_of_another_stack_is_refused(dev: RunResult, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    base = plan.write(plan.build(dev), tmp_path / "dev-plan.json")
    code, err = run_main(["--stack", "prod", "--base", str(base), "--out", str(tmp_path)], capsys)
    assert code == 2
    assert err.strip() == (f"error: --base: {base} is a plan of stack 'dev', not of 'prod'; give the base branch's "
                           "build/prod/plan.json")
    assert not (tmp_path / "prod").exists()


@pytest.mark.parametrize(("doc", "expected"), [
    ({"confg": {"gcp:region": "us-west1"}}, "confg: unknown top-level key; did you mean `config`?"),
    ({"config": 5}, "config: expected a mapping of keys to values (e.g. `gcp:region: us-central1`), got int 5"),
    ({"config": {"deepspeedstack:cluster": {}}},
     "config: deepspeedstack:cluster: unknown namespace `deepspeedstack`; did you mean `deepspeed-stack:`?"),
])
def test_stack_file_mistakes_are_errors_that_name_them(doc: dict, expected: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = write_stack(tmp_path, "broken", doc)
    code, err = run_main(["--stack", "broken", "--stack-file", str(path), "--out", str(tmp_path / "b")], capsys)
    assert code == 2
    assert err.splitlines() == [f"error: {path}: not a valid stack file:", f"  - {expected}"]
    assert "Traceback" not in err and not (tmp_path / "b").exists()


def test_yaml_syntax_error_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_stack(tmp_path, "broken", "config:\n  gcp:region: [us-west1\n")
    code, err = run_main(["--stack", "broken", "--stack-file", str(path)], capsys)
    assert code == 2
    # The `[` never closed is on line 2 (YAML notices at the end of the file): the error names line 2, with its text.
    assert err.startswith(f"error: {path}:2:15: not valid YAML: ") and "  2 |   gcp:region: [us-west1" in err


def test_stack_name_from_a_file_name() -> None:
    assert stackfile.stack_name(Path("/x/Pulumi.staging.yaml")) == "staging"
    assert stackfile.stack_name(Path("prod.yaml")) == ""


# --- 10. the terminal summary --------------------------------------------------------------------

def test_hook_markdown_tables_are_aligned_text_in_the_terminal() -> None:
    body = "| pool | $/h |\n| --- | ---: |\n| system | $0.13 |\n| l4 \\| spot | $0.85 |\n\nStack: **$0.98/h** `x`"
    assert summary.markdown_text(body).splitlines() == [
        "  pool       $/h",
        "  system     $0.13",
        "  l4 | spot  $0.85",
        "",
        "  Stack: $0.98/h x",
    ]


def test_wrote_line_names_every_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--stack", "vertex", "--stack-file", str(stack_path("vertex")), "--out", str(tmp_path)]) == 0
    (wrote,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("wrote ")]
    assert wrote.endswith("/vertex/: plan.json, summary.md, vertex-customjob.yaml")


def test_each_problem_is_reported_once() -> None:
    assert problems("dev", {"nodePools[0].zones": "us-west1-b"}) == [
        'nodePools[0].zones: expected array, got "us-west1-b"']


def test_readme_sample_tree_is_in_the_real_order(dev: RunResult) -> None:
    """The README's sample lines (`...` where it leaves lines out) appear in dev's real tree, in that order."""
    readme = (Path(__file__).resolve().parent.parent / "docs" / "preview.md").read_text(encoding="utf-8")
    block = "     Type  " + readme.split("     Type  ", 1)[1].split("\nGPU inventory", 1)[0]
    sample = [line.split() for line in block.splitlines() if line.strip() != "..."]
    real = iter(line.split() for line in tree.render(dev).splitlines())
    assert len(sample) > 10 and all(line in real for line in sample)  # `in` on an iterator: in order


# --- 7. manifests kubectl can apply ---------------------------------------------------------------

K8S_VERSION = "1.33.0"


def test_every_manifest_file_is_a_valid_kubernetes_object(dev: RunResult, tmp_path: Path) -> None:
    """Every file of manifests/, for every stack file and for dev with an hfToken (so its Secret is there): an
    object with apiVersion, kind and a name; standard kinds pass kubernetes-validate (custom resources are
    checked against their CRDs by their own tests). Helm's files go to helm/."""
    from preview.__main__ import write_build
    # Every stack file of the project (a user's own too); the token as test_hf_token sets it: that run is shared.
    runs = [*(stack_run(s, example=False) for s in stacks()),
            stack_run("dev", {"hfToken": {"secure": "v1:planted-ciphertext"}})]
    assert any(r.type == "kubernetes:core/v1:Secret" for r in runs[-1].resources)
    assert sum(valid_manifests(run) for run in runs) > 10
    written = write_build(dev, plan.build(dev), "", tmp_path)
    helm = sorted(f.name for f in written.files if f.parent.name == "helm")
    assert helm == ["smoke.chart.yaml", "smoke.values.yaml"]


def valid_manifests(run: RunResult) -> int:
    """Every manifest of a run is an object with apiVersion, kind and a name, and the standard kinds pass
    kubernetes-validate (asserted); how many it validated."""
    from preview import manifests

    checked = 0
    for name, text in manifests.render(run).items():
        doc = yaml_load(text)
        assert isinstance(doc, dict) and doc.get("apiVersion") and doc.get("kind"), name
        assert doc["metadata"]["name"], name
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
            checked += 1
        except kubernetes_validate.SchemaNotFoundError:
            continue
    return checked


def test_a_secret_held_whole_is_written_as_a_valid_object() -> None:
    from preview import manifests
    from preview.engine import SECRET, Registration

    secret = Registration(
        urn="urn:pulumi:t::deepspeed-stack::kubernetes:core/v1:Secret::hf", type="kubernetes:core/v1:Secret",
        name="hf", parent=None, custom=True, provider=None, dependencies=[], property_dependencies={},
        protect=False, inputs={"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf", "namespace": "w"},
                               "stringData": SECRET, "type": "Opaque"})
    doc = manifests.manifest(secret)
    assert doc["stringData"] == {}
    assert doc["metadata"]["annotations"] == {"deepspeed-stack/redacted": "stringData: secret, not written by the "
                                                                          "preview"}
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


# --- 8. the planner: bare sizes and a fallback that never under-estimates ------------------------

def test_a_bare_size_is_a_parameter_count() -> None:
    from planner import model_catalog

    assert model_catalog.bare_size("7B") == 7.0 and model_catalog.bare_size("350M") == 0.35
    assert model_catalog.bare_size("x7B") is None
    model = model_catalog.resolve("7B")
    assert (model.parameters, model.shape_known) == (7e9, False)


def test_the_fallback_largest_layer_is_an_upper_bound_for_every_known_model() -> None:
    # The real largest layer (data/models.yaml shapes: vocabulary x hidden or hidden x intermediate) never
    # exceeds the fallback's for the same parameter count: a Llama-2 vocabulary was 3-6x short for Llama-3,
    # Qwen and Gemma.
    from planner import model_catalog

    for name in model_catalog.model_names():
        known = model_catalog.resolve(name)
        fallback = model_catalog.fallback_shape(known.parameters)
        assert fallback.largest_layer >= known.shape.largest_layer, name
        assert fallback.largest_layer <= known.parameters, name


def test_the_user_gives_the_shape() -> None:
    # OPT-350M as a bare size with its real shape (vocabulary 50272 x hidden 1024 = 51.5M parameters, its
    # embedding, the largest layer) or that largest layer directly: both replace the fallback's upper bound.
    from planner import model_catalog

    bare = model_catalog.resolve("0.331B")
    by_vocab = model_catalog.given_shape(bare, vocabulary=50272, hidden=1024)
    by_layer = model_catalog.given_shape(bare, largest_layer_m=51.5)
    assert by_vocab.shape.largest_layer == 50272 * 1024
    assert by_layer.shape.largest_layer == 51_500_000
    assert bare.shape.largest_layer > by_vocab.shape.largest_layer  # the fallback is the upper bound
    known = model_catalog.resolve("Llama-2-7B")
    assert model_catalog.given_shape(known, 1, 1) is known  # a known model keeps its own shape


def test_a_workloads_model_block_takes_the_shape() -> None:
    from checks import planner as checks_planner

    m = config_model(changed("prod", {f"{WORKLOAD}.model": {"name": "my-model", "parameters": 1.0, "mode": "training",
                                                            "vocabulary": 32000, "hidden": 2048}}))
    (sized,) = checks_planner.sized_workloads(m)
    assert sized.request.model.shape.largest_layer == 32000 * 2048
