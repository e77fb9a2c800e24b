"""Evaluation and a gate in a deployed stack (issue 27 item 4): `serving.evaluation` on a server of adapters runs an
evaluator container beside vLLM (recipes/evaluator.py, which runs evaluate.py against 127.0.0.1), and vLLM
serves an adapter only once the evaluator has scored it and loaded its copy from evals/<adapter>/adapter.

The finetune stack's server `chat` serves tune's adapter (serving.fromWorkload) with a task of the bucket and a
gate; each rule is refused at its key."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import kubernetes_validate
import pytest
from conftest import changed, config_model, load_file, problems, stack_run

from checks import warnings
from preview import engine
from preview.engine import RunResult

DEPLOYMENT = "kubernetes:apps/v1:Deployment"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
S = "workloads.chat"
BASE = "Qwen/Qwen2.5-7B-Instruct"  # tune's finetune.model in Pulumi.finetune.yaml
TASK = "data/heldout.jsonl"
EVALUATION = {f"{S}.serving.evaluation": {"task": TASK, "minImprovement": 0.05}}
SCRIPTS = Path(__file__).resolve().parent.parent / "recipes"


@pytest.fixture(scope="module")
def gated() -> RunResult:
    return engine.run_program(*engine.engine_config_from_yaml(changed("finetune", EVALUATION)), stack="finetune")


@pytest.fixture(scope="module")
def plain() -> RunResult:
    return stack_run("finetune")


def _pod(run: RunResult) -> dict[str, Any]:
    return run.one(DEPLOYMENT, "chat-deployment").inputs["spec"]["template"]["spec"]


def _containers(run: RunResult) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in _pod(run)["containers"]}


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"]}


def test_vllm_starts_with_the_base_alone_and_runtime_loading(gated: RunResult, plain: RunResult) -> None:
    server = _containers(gated)["server"]
    args = server["args"]
    assert args[:4] == ["--model", BASE, "--served-model-name", BASE]
    # The LoRA room, but no --lora-modules: tune is served only once scored, by the evaluator.
    assert args[args.index("--enable-lora"):] == ["--enable-lora", "--max-lora-rank", "16", "--max-loras", "1",
                                                  "--middleware", "client_endpoints.ClientEndpoints"]
    assert _env(server)["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "true"
    # Only the pod itself may load or unload (issue 36 item 8): vLLM imports the middleware from the ConfigMap.
    assert _env(server)["PYTHONPATH"] == "/app"
    assert {"name": "vllm-files", "mountPath": "/app", "readOnly": True} in server["volumeMounts"]
    # Only its middleware: the evaluator's scripts stay out of vLLM's import path.
    (files,) = [v for v in _pod(gated)["volumes"] if v["name"] == "vllm-files"]
    assert files["configMap"]["items"] == [{"key": "client_endpoints.py", "path": "client_endpoints.py"}]
    assert "client_endpoints.py" in gated.one(CONFIG_MAP, "chat-server").inputs["data"]
    assert "initContainers" not in _pod(gated)  # nothing to wait for before the base is served
    # Without evaluation: the adapter from MODEL_DIR at start, after the init container's wait, no runtime loading.
    before = _containers(plain)["server"]
    assert before["args"][-2:] == ["--lora-modules", "tune=/gcs/models/tune"]
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in _env(before)
    assert [c["name"] for c in _pod(plain)["containers"]] == ["server"]


def test_the_evaluator_runs_evaluate_py_beside_vllm(gated: RunResult) -> None:
    evaluator = _containers(gated)["evaluator"]
    assert evaluator["command"] == ["python"]
    assert evaluator["args"] == [
        "/app/evaluator.py", "--url", "http://127.0.0.1:8000", "--base", BASE, "--task", f"/gcs/{TASK}",
        "--evals", "/evals", "--max-tokens", "32", "--max-length", "4096", "--min-improvement", "0.05",
        "--adapter", "tune=/gcs/models/tune"]
    assert _env(evaluator) == {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    assert evaluator["workingDir"] == "/tmp"  # the root filesystem is read-only
    # data/node_memory.yaml podSidecars.evaluator: 1 CPU and 2 GiB, requests = limits.
    assert evaluator["resources"] == {"requests": {"cpu": "1", "memory": "2048Mi"},
                                      "limits": {"cpu": "1", "memory": "2048Mi"}}
    assert evaluator["securityContext"] == {"allowPrivilegeEscalation": False, "privileged": False,
                                            "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                                            "capabilities": {"drop": ["ALL"]}}
    assert evaluator["livenessProbe"]["exec"]["command"] == ["test", "-d", "/evals"]
    files = gated.one(CONFIG_MAP, "chat-server").inputs["data"]
    # evaluate.py and every module beside it that it imports (its task, finetune.py's record reading), as they are.
    assert set(files) == {"evaluator.py", "evaluate.py", "evaluate_task.py", "evaluate_metrics.py",
                          "evaluate_copies.py", "finetune_data.py", "finetune_config.py", "client_endpoints.py",
                          "contract.py", "contract_programs.py", "recipes.py"}  # recipes.py: the package's __init__
    assert all(text == (SCRIPTS / name).read_text(encoding="utf-8") for name, text in files.items())
    import ast

    for name, text in files.items():
        # The package's own modules: `from recipes.NAME import ...` and `from recipes import NAME`.
        imported = {m for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ImportFrom) and n.module
                    for m in ([a.name for a in n.names] if n.module == "recipes"
                              else [n.module.removeprefix("recipes.")])}
        assert {f"{m}.py" for m in imported if (SCRIPTS / f"{m}.py").is_file()} <= set(files), name


def test_only_the_evaluator_writes_and_only_evals(gated: RunResult) -> None:
    pod = _pod(gated)
    volumes = {v["name"]: v for v in pod["volumes"]}
    bucket, evals = volumes["gcs"]["csi"], volumes["evals"]["csi"]
    assert bucket["readOnly"] is True
    # Its own FUSE volume: the bucket's evals/ prefix alone, writable, folder renames allowed (data/gcs_fuse.yaml).
    assert "readOnly" not in evals
    assert evals["volumeAttributes"]["mountOptions"] == "implicit-dirs,only-dir=evals,rename-dir-limit=100"
    assert evals["volumeAttributes"]["bucketName"] == bucket["volumeAttributes"]["bucketName"]
    mounts = {c["name"]: {m["mountPath"]: m.get("readOnly", False) for m in c["volumeMounts"]}
              for c in pod["containers"]}
    # vLLM reads the copies at the path the evaluator writes them (one mount: no stale cache between the two).
    assert mounts["server"]["/gcs"] is True and mounts["server"]["/evals"] is True
    assert mounts["evaluator"] == {"/app": True, "/gcs": True, "/evals": False, "/tmp": False,
                                   "/home/deepspeed": False}
    doc = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "chat"}, "spec": pod}
    kubernetes_validate.validate(doc, "1.33.0", strict=True)


def test_the_server_is_fitted_less_the_evaluator(gated: RunResult, plain: RunResult) -> None:
    with_it, without = _containers(gated)["server"]["resources"]["limits"], \
        _containers(plain)["server"]["resources"]["limits"]
    assert int(with_it["cpu"]) == int(without["cpu"]) - 1
    assert int(with_it["memory"].removesuffix("Gi")) == int(without["memory"].removesuffix("Gi")) - 2


def test_the_summary_says_where_results_land_and_the_preview_says_how_the_gate_decides(gated: RunResult) -> None:
    from preview.sections import serving

    ev = gated.outputs["workloads"]["chat"]["evaluation"]
    assert ev["results"] == {"tune": "evals/tune/results.json"} and ev["served"] == {"tune": "evals/tune/served.json"}
    assert (ev["task"], ev["minImprovement"]) == (TASK, 0.05)
    # tune's records go through Qwen's chat template: its gate reads the likelihood metric, in evaluate.py's words.
    assert ev["metric"] == {"tune": "loglikelihood"}
    assert ev["gate"] == {"tune": "served when its loglikelihood beats the adapter served now (else the base) by at "
                                  "least 0.05 (nats per reference token, higher is better)"}
    assert "waitsFor" not in gated.outputs["workloads"]["chat"]
    ((_, body),) = serving.section(gated)
    assert "gcloud storage cat gs://$(pulumi stack output bucket -s finetune)/evals/tune/results.json" in body
    assert "# tune: served when its loglikelihood beats" in body and "only the base is served" in body
    assert "kubectl logs -n serving -f deploy/chat -c evaluator" in body
    # issue 42 item 6: the version an evaluated adapter serves is the gate's last pass, not training's latest export.
    assert "| tune: the export evals/tune/served.json names (the gate's last pass) |" in body



def test_a_server_memory_that_leaves_no_room_for_the_evaluator_is_refused() -> None:
    """g2-standard-8: 27.7 GiB allocatable, 1.5 for the DaemonSets, 0.125 the FUSE sidecar, 2 the evaluator."""
    found = problems("finetune", {**EVALUATION, f"{S}.resources.memory": "25Gi"})
    assert found == [
        f"{S}.resources.memory: 25Gi is more than what one g2-standard-8 node of pool l4 (32 GiB) gives pods: 27.7 GiB "
        "allocatable (less the kernel's 0.6, kube-reserved 3.6 and the eviction threshold's 0.1 GiB), less 1.5 GiB for "
        "its DaemonSets, 2.12 GiB for the GCS FUSE sidecar and the evaluator: at most 24Gi; the pod would stay "
        "Pending. Leave it unset (the stack fits 24Gi), or choose a machine type with more memory"]
    assert problems("finetune", {f"{S}.resources.memory": "25Gi"}) == []


# --- the rules: each refused at its key --------------------------------------------------------------------------

def test_evaluation_needs_adapters() -> None:
    assert problems("serve", {S + ".serving.evaluation": {"task": TASK}, f"{S}.gcsFuse": {"enabled": True},
                              "storage": {"enabled": True}}) == [
        f"{S}.serving.evaluation: scores LoRA adapters against the base model, and the server serves no adapter; "
        "list finetune workloads that export an adapter (finetune.lora.export: adapter) in serving.adapters or "
        "serving.fromWorkload, or remove serving.evaluation"]
    assert problems("finetune", {**EVALUATION, "workloads.tune.finetune.lora.export": "merged"}) == [
        f"{S}.serving.evaluation: scores LoRA adapters against the base model, and serving.fromWorkload tune serves a "
        "whole model; list finetune workloads that export an adapter (finetune.lora.export: adapter) in "
        "serving.adapters or serving.fromWorkload, or remove serving.evaluation"]


@pytest.mark.parametrize("gate, found", [
    (1.5, f"{S}.serving.evaluation.minImprovement: must be at most 1, got 1.5"),
    (-0.1, f"{S}.serving.evaluation.minImprovement: must be at least 0, got -0.1")])
def test_the_gate_is_a_share_of_the_records(gate: float, found: str) -> None:
    assert problems("finetune", {f"{S}.serving.evaluation": {"task": TASK, "minImprovement": gate}}) == [found]


def test_the_task_is_a_json_lines_file_of_the_bucket() -> None:
    assert problems("finetune", {f"{S}.serving.evaluation": {"task": "../heldout.jsonl"}}) == [
        f"{S}.serving.evaluation.task: the bucket path '../heldout.jsonl' has a '..' part, which climbs out of the "
        "bucket; write the path from the bucket's root (the pods see the bucket at /gcs, and nothing outside it is "
        "uploaded)"]
    assert problems("finetune", {f"{S}.serving.evaluation": {"task": "data/heldout.csv"}}) == [
        f"{S}.serving.evaluation.task: \"data/heldout.csv\" is not of the form a JSON-lines file of the bucket such as "
        "data/heldout.jsonl"]
    assert problems("finetune", {f"{S}.serving.evaluation": {"minImprovement": 0.1}}) == [
        f"{S}.serving.evaluation.task: required key is missing"]


def test_every_problem_at_once() -> None:
    found = problems("finetune", {f"{S}.serving.evaluation": {"task": TASK, "maxTokens": 4096},
                                  f"{S}.gcsFuse.mountPath": "/evals"})
    assert found == [
        f"{S}.serving.evaluation.maxTokens: 4096 tokens per reply, but the server's max length "
        f"({S}.model.sequenceLength) is 4096, prompt included; set fewer (default 32)",
        f"{S}.gcsFuse.mountPath: /evals is already used by the workload's pods; pick another path such as /gcs"]


def test_the_metric_key_reaches_the_evaluator() -> None:
    run = engine.run_program(*engine.engine_config_from_yaml(changed("finetune", {
        f"{S}.serving.evaluation": {"task": TASK, "metric": "exact_match"}})), stack="finetune")
    args = _containers(run)["evaluator"]["args"]
    assert args[args.index("--metric") + 1] == "exact_match"
    assert run.outputs["workloads"]["chat"]["evaluation"]["metric"] == {"tune": "exact_match"}
    assert problems("finetune", {f"{S}.serving.evaluation": {"task": TASK, "metric": "rouge"}}) == [
        f'{S}.serving.evaluation.metric: "rouge" is not one of loglikelihood, exact_match']


def test_the_runtime_endpoints_are_no_longer_a_warning() -> None:
    """They answer the pod itself only (client_endpoints.py), so there is nothing left to warn of."""
    assert not [w for w in warnings(config_model(changed("finetune", EVALUATION))) if "VLLM_ALLOW_RUNTIME" in w]


def test_only_a_server_with_evaluation_has_an_evaluator() -> None:
    assert config_model(changed("finetune")).workloads["chat"].evaluates is False
    assert config_model(changed("finetune", EVALUATION)).workloads["chat"].evaluates is True


# --- evaluator.py: one pass over the adapters, with stand-ins for the server --------------------------------------

@pytest.fixture(scope="module")
def evaluator() -> ModuleType:
    return load_file(SCRIPTS / "evaluator.py", "evaluator_script")


class Stand:
    """vLLM's /v1/models and /v1/load_lora_adapter, and evaluate.py's run (it writes results.json and, when
    `passes`, the copy, as evaluate.py does)."""

    def __init__(self, evals: Path, passes: bool = True, code: int = 0) -> None:
        self.evals, self.passes, self.code = evals, passes, code
        self.models = ["base"]
        self.loaded: list[tuple[str, str]] = []
        self.runs: list[list[str]] = []

    def run(self, command: list[str]) -> int:
        self.runs.append(command)
        if self.code:
            return self.code
        candidate = Path(command[command.index("--candidate") + 1])
        folder = Path(command[command.index("--results") + 1]).parent
        folder.mkdir(parents=True, exist_ok=True)
        marker = json.loads((candidate / ".complete").read_text())
        (folder / "results.json").write_text(json.dumps({"candidateMarker": marker, "served": self.passes}))
        if self.passes:  # its versioned copy, named by served.json
            copy = folder / "versions" / f"tune-{marker['step']}"
            copy.mkdir(parents=True, exist_ok=True)
            (copy / ".complete").write_text(json.dumps(marker))
            (folder / "served.json").write_text(json.dumps({"path": str(copy), "marker": marker}))
            self.models.append("tune")
        return 0

    def server(self, ev: ModuleType) -> Any:
        return ev.Server(served=lambda: list(self.models), load=self.load, run=self.run)

    def load(self, name: str, path: Path) -> None:
        self.loaded.append((name, str(path)))
        self.models.append(name)


def _setup(evaluator: ModuleType, tmp_path: Path) -> tuple[SimpleNamespace, list[Any], Path]:
    model_dir = tmp_path / "models" / "tune"
    model_dir.mkdir(parents=True)
    args = evaluator.parse_args(["--url", "http://127.0.0.1:8000", "--base", "base", "--task", "/gcs/task.jsonl",
                                 "--evals", str(tmp_path / "evals"), "--adapter", f"tune={model_dir}",
                                 "--min-improvement", "0.05"])
    return args, args.adapter, model_dir


def test_an_export_is_scored_once_and_its_copy_served_again_after_a_restart(evaluator: ModuleType,
                                                                            tmp_path: Path) -> None:
    args, adapters, model_dir = _setup(evaluator, tmp_path)
    stand, state = Stand(tmp_path / "evals"), evaluator.State()
    evaluator.poll(args, adapters, stand.server(evaluator), state)
    assert stand.runs == []  # no marker yet: nothing to score, nothing served
    (model_dir / ".complete").write_text('{"export": "adapter", "step": 40}')
    evaluator.poll(args, adapters, stand.server(evaluator), state)
    (command,) = stand.runs
    assert command[2:] == ["--url", "http://127.0.0.1:8000", "--base", "base", "--adapter", "tune", "--candidate",
                           str(model_dir), "--task", "/gcs/task.jsonl", "--results",
                           str(tmp_path / "evals" / "tune" / "results.json"), "--max-tokens", "32",
                           "--max-length", "2048", "--min-improvement", "0.05"]
    assert command[1].endswith("evaluate.py")
    evaluator.poll(args, adapters, stand.server(evaluator), state)
    assert len(stand.runs) == 1 and stand.loaded == []  # scored already; evaluate.py loaded it
    stand.models = ["base"]  # vLLM restarted: what was loaded at run time is gone
    evaluator.poll(args, adapters, stand.server(evaluator), state)
    assert stand.loaded == [("tune", str(tmp_path / "evals" / "tune" / "versions" / "tune-40"))]
    assert len(stand.runs) == 1
    (tmp_path / "evals" / "tune" / "results.json").write_text("{}")  # lost: the served export is still not rescored
    evaluator.poll(args, adapters, stand.server(evaluator), state)
    assert len(stand.runs) == 1
    (model_dir / ".complete").write_text('{"export": "adapter", "step": 80}')  # a new export: scored again
    evaluator.poll(args, adapters, stand.server(evaluator), state)
    assert len(stand.runs) == 2


def test_a_refused_export_is_not_scored_again_and_nothing_is_served(evaluator: ModuleType, tmp_path: Path) -> None:
    args, adapters, model_dir = _setup(evaluator, tmp_path)
    (model_dir / ".complete").write_text('{"export": "adapter", "step": 40}')
    stand, state = Stand(tmp_path / "evals", passes=False), evaluator.State()
    for _ in range(2):
        evaluator.poll(args, adapters, stand.server(evaluator), state)
    assert len(stand.runs) == 1 and stand.loaded == [] and stand.models == ["base"]


def test_a_failed_evaluation_waits_before_it_is_tried_again(evaluator: ModuleType, tmp_path: Path) -> None:
    args, adapters, model_dir = _setup(evaluator, tmp_path)
    (model_dir / ".complete").write_text('{"export": "adapter", "step": 40}')
    stand, state = Stand(tmp_path / "evals", code=2), evaluator.State()
    for now in (0.0, 30.0, 599.0):
        evaluator.poll(args, adapters, stand.server(evaluator), state, now=lambda t=now: t)
    assert len(stand.runs) == 1
    evaluator.poll(args, adapters, stand.server(evaluator), state, now=lambda: 600.0)
    assert len(stand.runs) == 2


def test_a_merged_models_marker_is_not_an_adapter_export(evaluator: ModuleType, tmp_path: Path) -> None:
    (tmp_path / ".complete").write_text('{"export": "merged", "step": 40}')
    assert evaluator.adapter_marker(tmp_path) is None
    (tmp_path / ".complete").write_text('{"export": "adapter", "step": 40}')
    assert evaluator.adapter_marker(tmp_path) == {"export": "adapter", "step": 40}


def test_the_pods_arguments_are_the_scripts_own(gated: RunResult, evaluator: ModuleType, tmp_path: Path) -> None:
    """What the pod passes evaluator.py, and what evaluator.py passes evaluate.py, each parsed by the script's own
    parser (a renamed flag fails here, not in the pod)."""
    evaluate = load_file(SCRIPTS / "evaluate.py", "evaluate_for_evaluator")
    args = evaluator.parse_args(_containers(gated)["evaluator"]["args"][1:])
    assert (args.url, args.base, args.task, args.evals, args.min_improvement, args.max_tokens) == (
        "http://127.0.0.1:8000", BASE, f"/gcs/{TASK}", "/evals", 0.05, 32)
    assert args.adapter == [evaluator.Adapter("tune", Path("/gcs/models/tune"))]
    parsed = evaluate.parse_args(evaluator.evaluate_command(args, args.adapter[0])[2:])
    assert (parsed.candidate, parsed.results, parsed.min_improvement, parsed.metric, parsed.max_length) == (
        "/gcs/models/tune", "/evals/tune/results.json", 0.05, args.metric, args.max_length)


def test_one_adapters_server_error_does_not_stop_the_others(evaluator: ModuleType, tmp_path: Path) -> None:
    import urllib.error

    args, _, model_dir = _setup(evaluator, tmp_path)
    other = tmp_path / "models" / "tune2"
    other.mkdir()
    (other / ".complete").write_text('{"export": "adapter", "step": 40}')
    (tmp_path / "evals" / "tune" / "adapter").mkdir(parents=True)
    (tmp_path / "evals" / "tune" / "adapter" / ".complete").write_text("{}")  # a copy vLLM refuses to load
    stand = Stand(tmp_path / "evals")

    def refuse(name: str, path: Path) -> None:
        raise urllib.error.HTTPError(f"{name}", 400, "bad adapter", {}, None)  # type: ignore[arg-type]

    server = evaluator.Server(served=lambda: ["base"], load=refuse, run=stand.run)
    evaluator.poll(args, [evaluator.Adapter("tune", model_dir), evaluator.Adapter("tune2", other)], server,
                   evaluator.State())
    assert [c[c.index("--adapter") + 1] for c in stand.runs] == ["tune2"]
