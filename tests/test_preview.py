"""The offline preview: the tree, plan.json (against its JSON Schema), manifests, summary.md, the diff
against a base plan, the extra sections, the exit codes, and no secret in any file it writes."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from conftest import reference, set_path, stack_yaml, yaml_load

import preview.__main__ as preview_main
from checks import load
from preview import bench, diff, manifests, plan, summary, tree
from preview.__main__ import main, write_build
from preview.engine import SECRET, Registration, RunResult, engine_config_from_yaml, run_program
from preview.sections import Section, render_sections

K8S_VERSION = "1.33.0"
STACK_URN = "urn:pulumi:dev::deepspeed-stack::pulumi:pulumi:Stack::deepspeed-stack-dev"
PLANTED = "hf_planted_token_0123456789"  # must never reach a file
PLANTED_KUBECONFIG = "apiVersion: v1\nkind: Config\nusers: [{name: u, user: {token: planted-bearer-token-42}}]\n"


@pytest.fixture(scope="module")
def gaudi() -> RunResult:
    # Not the shared cached run: test_gaudi_stack edits a claim of it in place (its k8s_object() copies
    # only the top level), and these tests render every object of the stack.
    return run_program(*engine_config_from_yaml(stack_yaml("gaudi")), stack="gaudi")


def config_of(stack: str) -> dict[str, Any]:
    """A stack file's `deepspeed-stack:` values, for expectations (the config, not the code under test)."""
    return {k.split(":", 1)[1]: v for k, v in stack_yaml(stack).items() if k.startswith("deepspeed-stack:")}


def write_stack(tmp_path: Path, name: str, config: dict[str, Any]) -> Path:
    path = tmp_path / f"Pulumi.{name}.yaml"
    path.write_text(yaml.safe_dump({"config": config}), encoding="utf-8")
    return path


# --- tree ----------------------------------------------------------------------------------------

def test_tree_has_the_stack_root_and_children_under_their_components(dev: RunResult) -> None:
    rows = list(tree.rows(dev))
    assert (rows[0].mark, rows[0].type, rows[0].name, rows[0].depth) == (
        "+", "pulumi:pulumi:Stack", "deepspeed-stack-dev", 0)
    assert len(rows) == len(dev.resources) + 1 and all(r.mark == "+" for r in rows)
    by_name = {(r.type, r.name): i for i, r in enumerate(rows)}
    component = by_name[("deepspeed-stack:gcp:GkeCluster", "cluster")]
    children = [(r.type, r.name) for r in rows[component + 1:component + 4]]
    assert children == [("gcp:container/cluster:Cluster", "cluster"),
                        ("gcp:container/nodePool:NodePool", "cluster-system"),
                        ("pulumi:providers:kubernetes", "cluster-k8s")]
    assert [rows[component + i].depth for i in range(4)] == [1, 2, 2, 2]
    assert rows[component + 3].prefix == "│  └─ "  # last child of a component that is not the last one


def test_tree_text_has_type_and_name_columns(dev: RunResult) -> None:
    lines = tree.render(dev).splitlines()
    assert lines[0].split() == ["Type", "Name"]
    assert lines[1].split() == ["+", "pulumi:pulumi:Stack", "deepspeed-stack-dev"]
    pool = next(line for line in lines if line.rstrip().endswith(" t4"))
    assert pool.startswith(" +   │  └─ gcp:container/nodePool:NodePool")


def test_tree_marks_changes_against_a_base(dev: RunResult) -> None:
    urns = [r.urn for r in dev.resources]
    changes = {u: "same" for u in urns} | {urns[1]: "update", urns[2]: "create"}
    text = tree.render(dev, changes, removed=[("gcp:compute/router:Router", "gone")])
    marks = [line[:5] for line in text.splitlines()[1:]]
    assert marks[:4] == ["     ", "     ", " ~   ", " +   "]
    assert text.splitlines()[-1].split() == ["-", "gcp:compute/router:Router", "gone"]


# --- plan.json -----------------------------------------------------------------------------------

def test_plan_json_matches_its_schema(dev: RunResult, prod: RunResult, gaudi: RunResult, tmp_path: Path) -> None:
    schema = plan.schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    for run in (dev, prod, gaudi):
        written = plan.write(plan.build(run), tmp_path / run.stack / "plan.json")
        doc = json.loads(written.read_text(encoding="utf-8"))
        jsonschema.validate(doc, schema)
        assert (doc["project"], doc["stack"], len(doc["resources"])) == ("deepspeed-stack", run.stack,
                                                                        len(run.resources))


def test_plan_json_content(dev: RunResult) -> None:
    doc = plan.build(dev)
    first = doc["resources"][0]
    assert list(first) == ["urn", "type", "name", "parent", "custom", "provider", "inputs", "dependencies"]
    assert first["parent"] == STACK_URN
    cluster = next(r for r in doc["resources"] if r["type"] == "gcp:container/cluster:Cluster")
    assert cluster["custom"] is True and cluster["provider"] is None
    assert list(cluster["inputs"]) == sorted(cluster["inputs"])  # object keys sorted
    assert cluster["inputs"]["name"] == config_of("dev")["cluster"]["name"]
    assert cluster["dependencies"] == sorted(cluster["dependencies"]) and cluster["dependencies"]
    release = next(r for r in doc["resources"] if r["type"] == "kubernetes:helm.sh/v3:Release")
    assert release["provider"].endswith("::cluster-k8s")
    assert doc["outputs"]["kubeconfig"] == SECRET


def test_plan_is_identical_across_runs(dev: RunResult) -> None:
    """Registrations arrive from several threads; the plan keeps the program's construction order, so a
    base plan and a head plan differ only where the program changed."""
    again = run_program(*engine_config_from_yaml(stack_yaml("dev")), stack="dev")
    assert plan.dumps(plan.build(again)) == plan.dumps(plan.build(dev))


# --- manifests -----------------------------------------------------------------------------------

def docs_by_kind(files: dict[str, str]) -> dict[str, dict[str, Any]]:
    return {(doc := yaml_load(text))["kind"]: doc for name, text in files.items()
            if not name.endswith((".values.yaml", ".chart.yaml"))}


def test_kubernetes_objects_become_valid_manifests(dev: RunResult, gaudi: RunResult) -> None:
    for run in (dev, gaudi):
        files = manifests.render(run)
        objects = [r for r in run.resources if r.custom and r.type.startswith("kubernetes:")
                   and not r.type.startswith(("kubernetes:helm.sh/", "kubernetes:yaml/"))]
        docs = [yaml_load(t) for n, t in files.items() if not n.endswith((".values.yaml", ".chart.yaml"))]
        assert len(docs) == len(objects)
        for doc in docs:
            assert list(doc)[:3] == ["apiVersion", "kind", "metadata"] and doc["metadata"]["name"]
            if "/" not in doc["apiVersion"] or doc["apiVersion"].split("/")[0] in ("apps", "batch"):
                kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    # Files are numbered in registration order, so `kubectl apply -f manifests/` creates the namespace first.
    names = sorted(manifests.render(gaudi))
    assert names[0].startswith("01-namespace-")


def test_mpijob_manifest_matches_the_operator_crd(gaudi: RunResult) -> None:
    text = reference("mpi-operator", "kubeflow.org_mpijobs.v0.8.0.yaml").read_text()
    crd = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # 1 MB: libyaml when there
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v2beta1")
    job = docs_by_kind(manifests.render(gaudi))["MPIJob"]
    spec_schema = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    # The CRD's schema is OpenAPI v3, checked as JSON Schema draft 7 (as tests/test_mpijob.py does). Not checked
    # against a metaschema first (what jsonschema.validate does): its validity is the operator's, and that check
    # of a 9,000-line schema was 0.5 s of the suite.
    assert [e.message for e in jsonschema.Draft7Validator(spec_schema).iter_errors(job["spec"])] == []
    assert job["apiVersion"] == "kubeflow.org/v2beta1"


def test_helm_release_becomes_values_and_chart_files(dev: RunResult) -> None:
    files = manifests.render_helm(dev)
    assert not set(files) & set(manifests.render(dev))  # kept out of manifests/: they are not Kubernetes objects
    (name, workload), = config_of("dev")["workloads"].items()
    values = yaml.safe_load(files[f"{name}.values.yaml"])
    assert values == dev.one("kubernetes:helm.sh/v3:Release").inputs["values"]
    chart = yaml.safe_load(files[f"{name}.chart.yaml"])
    assert (chart["chart"], chart["version"], chart["repository"]) == (
        "deepspeed", workload["chart"]["version"], "oci://registry-1.docker.io/bitnamicharts")
    assert chart["namespace"] == workload["namespace"]
    assert chart["install"].startswith(f"helm install {name} oci://registry-1.docker.io/bitnamicharts/deepspeed "
                                       f"--version {workload['chart']['version']}")


def test_secret_objects_never_carry_values() -> None:
    secret = Registration(
        urn="urn:pulumi:t::deepspeed-stack::kubernetes:core/v1:Secret::hf", type="kubernetes:core/v1:Secret",
        name="hf", parent=None, custom=True, provider=None, dependencies=[], property_dependencies={},
        protect=False, inputs={"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf", "namespace": "w"},
                               "stringData": {"token": "plain-by-mistake"}, "data": {"b": "cGxhaW4="}})
    doc = manifests.manifest(secret)
    assert doc["stringData"] == {"token": SECRET} and doc["data"] == {"b": SECRET}


def test_api_version_from_type_token() -> None:
    assert manifests.api_version_kind("kubernetes:core/v1:ConfigMap") == ("v1", "ConfigMap")
    assert manifests.api_version_kind("kubernetes:rbac.authorization.k8s.io/v1:Role") == (
        "rbac.authorization.k8s.io/v1", "Role")


# --- summary -------------------------------------------------------------------------------------

def test_gpu_inventory(dev: RunResult, prod: RunResult) -> None:
    for run in (dev, prod):
        (pool,) = config_of(run.stack)["nodePools"]
        (found,) = summary.gpu_inventory(run)
        assert (found.pool, found.machine_type, found.gpu_type, found.gpus_per_node) == (
            pool["name"], pool["machineType"], pool["gpu"]["type"], pool["gpu"]["count"])
        assert (found.min_nodes, found.max_nodes, found.spot) == (pool["minNodes"], pool["maxNodes"], pool["spot"])
    assert summary.gpu_inventory(dev)[0].zones == config_of("dev")["nodePools"][0]["zones"]


def test_workloads_and_where_they_run(dev: RunResult, gaudi: RunResult) -> None:
    (name, w), = config_of("dev")["workloads"].items()
    pool = next(p for p in config_of("dev")["nodePools"] if p["name"] == w["pool"])
    (found,) = summary.workloads(dev)
    assert (found.name, found.namespace, found.workers) == (name, w["namespace"], w["workers"])
    assert found.runs_on == f"pool {pool['name']} ({pool['gpu']['type']})"
    assert found.accelerators == f"nvidia.com/gpu x {pool['gpu']['count']}"
    (name, w), = config_of("gaudi")["workloads"].items()
    (found,) = summary.workloads(gaudi)
    assert (found.name, found.kind, found.workers) == (name, "MPIJob v2beta1", w["workers"])
    assert found.accelerators == f"habana.ai/gaudi x {w['accelerator']['count']}"


def test_summary_markdown_sections(dev: RunResult) -> None:
    md = summary.markdown(dev, [], 16)
    for title in ("Resources", "GPU inventory", "Workloads", "Policy"):
        assert f"#### {title}" in md
    assert f"| gcp:container/nodePool:NodePool | {len(dev.by_type('gcp:container/nodePool:NodePool'))} |" in md
    assert "_all policies pass_" in md
    assert md.startswith(f"### Stack `dev`: {len(dev.resources)} resources, ok")


def test_extra_sections_and_files(dev: RunResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def cost(run: RunResult) -> list[Section]:
        return [("Cost", f"{len(run.resources)} resources, $0.00/h")]

    def spec(run: RunResult) -> dict[str, str]:
        return {"vertex-customjob.yaml": f"displayName: {run.stack}\n"}

    extra = render_sections(dev, [cost])
    md = summary.markdown(dev, [], 16, extra=extra)
    assert md.rstrip().endswith(f"#### Cost\n\n{len(dev.resources)} resources, $0.00/h")
    monkeypatch.setattr(preview_main, "FILES", (spec,))
    written = write_build(dev, plan.build(dev), md, tmp_path)
    assert (tmp_path / "dev" / "vertex-customjob.yaml").read_text() == "displayName: dev\n"
    assert tmp_path / "dev" / "vertex-customjob.yaml" in written.files


def test_every_section_module_is_listed() -> None:
    # The list in preview/__main__.py is the only way in (no glob, no registration on import): a module added
    # under preview/sections/ and not listed would silently show nothing.
    folder = Path(preview_main.__file__).parent / "sections"
    modules = sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")
    listed = sorted({fn.__module__.rsplit(".", 1)[-1] for fn in (*preview_main.SECTIONS, *preview_main.FILES)})
    assert listed == modules == ["adopted", "capacity", "cost", "fabric", "pods", "recovery", "serving", "training",
                                 "vertex"]


# --- diff ----------------------------------------------------------------------------------------

def test_diff_by_urn_with_changed_input_paths(dev: RunResult) -> None:
    head = plan.build(dev)
    base = copy.deepcopy(head)
    pool = next(r for r in base["resources"] if r["name"] == "t4")
    pool["inputs"]["autoscaling"]["totalMaxNodeCount"] = 1
    pool["inputs"]["nodeLocations"] = ["us-west1-a", "us-west1-b"]
    gone = {**base["resources"][0], "urn": base["resources"][0]["urn"] + "-old", "name": "old"}
    base["resources"].append(gone)
    added = base["resources"].pop(1)
    base["outputs"]["clusterName"] = "renamed"
    d = diff.diff(base, head)
    assert [r["urn"] for r in d.added] == [added["urn"]]
    assert [r["name"] for r in d.removed] == ["old"]
    (change,) = d.changed
    assert (change.name, change.keys) == ("t4", ["autoscaling.totalMaxNodeCount", "nodeLocations"])
    assert d.outputs == ["clusterName"]
    md = diff.render_markdown(d)
    assert "**1** to add, **1** to change, **1** to delete." in md
    assert "| ~ | `gcp:container/nodePool:NodePool` | `t4` | `autoscaling.totalMaxNodeCount`, " \
           "`nodeLocations` |" in md
    assert diff.diff(head, head).empty


def test_changed_paths() -> None:
    assert diff.changed_paths({"a": {"b": [1, {"c": 2}]}}, {"a": {"b": [1, {"c": 3}]}}) == ["a.b[1].c"]
    assert diff.changed_paths({"a": 1}, {"b": 1}) == ["a", "b"]
    assert diff.changed_paths([1], [1, 2]) == ["(value)"]


# --- the command ---------------------------------------------------------------------------------

def test_config_error_exits_2_with_the_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = stack_yaml("dev")
    set_path(config, "nodePools[0].maxNodes", 0)
    code = main(["--stack", "broken", "--stack-file", str(write_stack(tmp_path, "broken", config)),
                 "--out", str(tmp_path / "build")])
    err = capsys.readouterr().err
    assert code == 2
    assert "invalid stack configuration" in err and "nodePools[0].maxNodes: must be at least 1, got 0" in err
    assert "Traceback" not in err
    assert not (tmp_path / "build").exists()


def test_missing_stack_file_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--stack", "no-such-stack"]) == 2
    assert "no stack file Pulumi.no-such-stack.yaml" in capsys.readouterr().err


def test_policy_violation_exits_1_unless_no_policy(dev: RunResult, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The dev config as a stack named `staging`: public nodes are a mandatory violation there. With a base
    plan (dev's, one value changed) the output also shows the diff."""
    out = tmp_path / "build"
    path = write_stack(tmp_path, "staging", stack_yaml("dev"))
    assert main(["--stack", "staging", "--stack-file", str(path), "--out", str(out)]) == 1
    captured = capsys.readouterr()
    assert "gke-private-nodes" in captured.out and "1 mandatory policy violation(s)" in captured.err
    assert (out / "staging" / "plan.json").exists()  # written anyway, for the PR comment

    base = json.loads((out / "staging" / "plan.json").read_text())
    cluster = next(r for r in base["resources"] if r["type"] == "gcp:container/cluster:Cluster")
    cluster["inputs"]["releaseChannel"]["channel"] = "STABLE"
    (tmp_path / "base.json").write_text(json.dumps(base))
    code = main(["--stack", "staging", "--stack-file", str(path), "--out", str(out), "--no-policy",
                 "--base", str(tmp_path / "base.json")])
    captured = capsys.readouterr()
    assert code == 0
    assert "0 to add, 1 to change, 0 to delete" in captured.out
    assert " ~   │  ├─ gcp:container/cluster:Cluster" in captured.out
    md = (out / "staging" / "summary.md").read_text()
    assert "#### Changes against the base branch" in md and "`releaseChannel.channel`" in md


# --- secrets -------------------------------------------------------------------------------------

def test_no_planted_secret_in_any_written_file_or_output(tmp_path: Path) -> None:
    """Real plain-text values for the secret keys (what `pulumi config set --secret` decrypts to), through
    the whole preview: plan.json, manifests, summary.md and the terminal text."""
    written_text = []
    for stack, extra in (("dev", {"deepspeed-stack:hfToken": PLANTED}),
                         ("gaudi", {"deepspeed-stack:hfToken": PLANTED,
                                    "deepspeed-stack:kubeconfig": PLANTED_KUBECONFIG})):
        config, secret_keys = engine_config_from_yaml(stack_yaml(stack))
        config.update(extra)
        run = run_program(config, [*secret_keys, *extra], stack=stack)
        md = summary.markdown(run, [], 16)
        written = write_build(run, plan.build(run), md, tmp_path)
        written_text += [f.read_text(encoding="utf-8") for f in written.files]
        written_text += [tree.render(run), summary.text(run, [], 16)]
        assert (tmp_path / stack / "plan.json").exists()
    assert len(written_text) > 8
    for text in written_text:
        assert PLANTED not in text and "planted-bearer-token-42" not in text


def test_the_secret_token_is_recorded_as_secret(tmp_path: Path) -> None:
    config, secret_keys = engine_config_from_yaml(stack_yaml("gaudi"))
    config["deepspeed-stack:hfToken"] = PLANTED
    run = run_program(config, [*secret_keys, "deepspeed-stack:hfToken"], stack="gaudi")
    assert any(r.secret_paths for r in run.resources if r.type == "kubernetes:core/v1:Secret")


# --- bench ---------------------------------------------------------------------------------------

def test_bench_generates_a_valid_100_pool_stack() -> None:
    generated = bench.generate(100)
    pools = generated["deepspeed-stack:nodePools"]
    assert len(pools) == 100 and len({p["name"] for p in pools}) == 100
    engine_cfg, secret_keys = engine_config_from_yaml(generated)
    model = load(engine_cfg, set(secret_keys))
    assert len(model.node_pools) == 100
    assert len(model.workloads) == (10 if config_of("dev").get("workloads") else 0)
    assert {w.pool for w in model.workloads.values()} <= {p.name for p in model.node_pools}



def test_bench_declares_each_resource_through_its_sdk_class() -> None:
    # The bare arm must pay what the SDK's classes cost, a provider's own components included: the MPI operator's
    # kubernetes:yaml/v2:ConfigFile (h100 installs it) as a plain ComponentResource skipped pulumi_kubernetes.yaml
    # and requests.
    import pulumi_kubernetes as k8s
    from conftest import stack_run

    assert bench.provider_class("kubernetes:yaml/v2:ConfigFile") is k8s.yaml.v2.ConfigFile
    assert bench.provider_class("kubernetes:core/v1:Namespace") is k8s.core.v1.Namespace
    made = {}

    def record(cls: type, r: dict[str, Any], opts: Any) -> None:
        made[r["name"]] = cls

    wanted = ("kubernetes:yaml/v2:ConfigFile", "kubernetes:core/v1:Namespace")
    resources = [r.to_plan() for r in stack_run("h100").resources if r.type in wanted]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bench, "_typed", record)  # records the class instead of registering
        bench.register_bare(resources)
    config_files = [r["name"] for r in resources if r["type"] == wanted[0]]
    assert config_files and all(made[n] is k8s.yaml.v2.ConfigFile for n in config_files)
    assert made.keys() == {r["name"] for r in resources}


def test_cli_module_runs_as_python_dash_m() -> None:
    assert sys.modules["preview.__main__"].main is main
