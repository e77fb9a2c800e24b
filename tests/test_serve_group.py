"""One replica across nodes (issue 42 item 3): the planner's multi-node layouts, the serve kind's rules for
`serving.nodesPerReplica`, the LeaderWorkerSet it renders (validated against kubernetes-sigs/lws v0.10.0's CRD in
../shared/reference/serving-scale/, skipped where absent) and the group's launch script, run under a stand-in
`python`/`vllm` on PATH (the script execs them) and checked with shellcheck.
"""

from __future__ import annotations

import functools
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import msgspec
import pytest
import yaml
from conftest import config_model, config_problems, reference, stack_run
from test_image import tool
from test_mpijob import K8S_VERSION, unknown_fields
from test_written_stacks import write

from model import catalog
from model.problems import lines
from model.serving_engines import vllm_facts
from planner import __main__ as planner_cli
from planner.held import parse_held
from planner.model_catalog import resolve
from planner.recommend import cheapest_for_gpu
from planner.sizing import estimate
from planner.sizing_types import INFERENCE, Request
from workloads import serving_group
from workloads.kinds import serve, serve_nodes

SCRIPT = Path(__file__).resolve().parent.parent / "recipes" / serving_group.GROUP_SCRIPT
LWS = serving_group.TYPE_TOKEN
H100_MEGA = "nvidia-h100-mega-80gb"


def request_405b(sequence: int = 2048) -> Request:
    return Request(resolve("Llama-3.1-405B"), precision="bf16", mode="inference", sequence_length=sequence)


# --- the planner -------------------------------------------------------------------------------------------------

def test_405b_on_held_h100_mega_is_two_nodes_tensor_8_pipeline_2() -> None:
    """The issue's case: Llama-3.1-405B bf16 fits no 8 x H100 Mega node (811.7 GB of weights over 640 GB), so one
    replica spans two: tensor-parallel 8 within each, pipeline-parallel 2 across."""
    cat = catalog.load()
    held = parse_held("H100-MEGA", cat)
    option = cheapest_for_gpu(request_405b(), INFERENCE, cat, H100_MEGA, ("us-central1-a",), held=held)
    assert option is not None
    assert (option.nodes, option.gpus_per_node, option.machine_type) == (2, 8, "a3-megagpu-8g")
    assert option.multi_node_replica
    # Weights alone: 405.85e9 x 2 bytes over 16 GPUs = 50.7 GB each; on one node's 8 they are 101.5 GB, above 80.
    assert 50.7 < option.per_gpu_gb < 72.0
    assert estimate(request_405b(), INFERENCE, 8, 1).per_gpu_gb > 80


def test_one_node_that_holds_the_model_is_never_split() -> None:
    """Llama-3.1-405B on 8 x H200 (141 GB each) fits one node: no pipeline stages."""
    cat = catalog.load()
    option = cheapest_for_gpu(request_405b(), INFERENCE, cat, "nvidia-h200-141gb", ("us-central1-b",))
    assert option is not None and option.nodes == 1 and not option.multi_node_replica


def test_held_count_bounds_the_nodes_of_a_replica(capsys: pytest.CaptureFixture[str]) -> None:
    """8xH100-MEGA is one node: nothing holds 405B there, and `make gpus` says so (exit 1)."""
    assert planner_cli.main(["--model", "Llama-3.1-405B", "--mode", "inference", "--gpus", "8xH100-MEGA"]) == 1
    assert "nothing holds Llama-3.1-405B (inference) on the held 8 x H100 Mega" in capsys.readouterr().err
    assert planner_cli.main(["--model", "Llama-3.1-405B", "--mode", "inference", "--gpus", "16xH100-MEGA"]) == 0
    out = capsys.readouterr().out
    assert ("(one replica across 2 nodes: tensor-parallel 8 x pipeline-parallel 2, serving.nodesPerReplica: 2)"
            in out)


def test_the_largest_stage_is_sized() -> None:
    """126 layers over 4 stages: the largest holds 32 of them (vLLM gives the remainder to some stages), so each GPU
    holds 32/126 of the weights a 8-GPU tensor split holds, not a quarter."""
    one, four = estimate(request_405b(), INFERENCE, 8, 1), estimate(request_405b(), INFERENCE, 8, 4)
    assert four.parts["weights"] == pytest.approx(one.parts["weights"] * 32 / 126)
    assert four.parts["KV cache"] == pytest.approx(one.parts["KV cache"] * 32 / 126)


# --- the serve kind's rules ----------------------------------------------------------------------------------------

def group_stack(**serving: Any) -> dict[str, Any]:
    return {
        "gcp:project": "my-project-123", "gcp:region": "us-central1",
        "deepspeed-stack:cluster": {"name": "c", "privateNodes": False},
        "deepspeed-stack:nodePools": [{"name": "h100", "machineType": "a3-highgpu-8g", "maxNodes": 4,
                                       "zones": ["us-central1-a"],
                                       "gpu": {"type": "nvidia-h100-80gb", "count": 8}}],
        "deepspeed-stack:hfToken": "hf_x",
        "deepspeed-stack:workloads": {"big": {
            "kind": "serve", "pool": "h100", "namespace": "serving",
            "serving": {"model": "meta-llama/Llama-3.1-405B-Instruct", **serving},
            "model": {"name": "Llama-3.1-405B", "mode": "inference", "sequenceLength": 2048}}},
    }


def problems_of(cfg: dict[str, Any]) -> list[str]:
    return config_problems(cfg, secure=("hfToken",))


def test_a_model_no_node_holds_names_the_nodes_that_do() -> None:
    (problem,) = [p for p in problems_of(group_stack()) if p.startswith("workloads.big.model:")]
    assert ("or one replica across 2 nodes of this pool: workloads.big.serving.nodesPerReplica: 2 (tensor-parallel "
            "8 x pipeline-parallel 2 over 16 x H100 80GB, a LeaderWorkerSet group)") in problem


def test_two_nodes_per_replica_fit() -> None:
    assert problems_of(group_stack(nodesPerReplica=2)) == []


@pytest.mark.parametrize(("serving", "expected"), [
    ({"nodesPerReplica": 2, "engine": "mii"},
     "workloads.big.serving.nodesPerReplica: 2, but DeepSpeed-MII (FastGen) spans no nodes in this stack"),
    ({"nodesPerReplica": 2, "autoscaling": {"enabled": True, "maxReplicas": 2}},
     "workloads.big.serving.autoscaling.enabled: true with workloads.big.serving.nodesPerReplica 2: the stack's "
     "autoscaler scales a Deployment"),
    ({"nodesPerReplica": 2, "replicas": 3},
     "workloads.big.serving.replicas: 3 replica(s) x 2 nodes each need 6 nodes of pool h100, but "
     "nodePools[0].maxNodes is 4"),
])
def test_refused_group_settings(serving: dict[str, Any], expected: str) -> None:
    problems = problems_of(group_stack(**serving))
    assert any(p.startswith(expected) for p in problems), problems


def test_more_stages_than_layers_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """No model of data/models.yaml has fewer layers than the schema's 8 nodes: a 4-layer shape stands in."""
    m = config_model(group_stack(nodesPerReplica=2), secure=("hfToken",))
    w = m.workloads["big"]
    request = serve_nodes.workload_request(w)
    assert request is not None
    small = msgspec.structs.replace(request, model=msgspec.structs.replace(
        request.model, shape=msgspec.structs.replace(request.model.shape, layers=4)))
    monkeypatch.setattr(serve_nodes, "workload_request", lambda _: small)
    w5 = msgspec.structs.replace(w, serving=msgspec.structs.replace(w.serving, nodes_per_replica=5))
    assert lines(serve_nodes.check_serve_nodes_per_replica(m, w5)) == [
        "workloads.big.serving.nodesPerReplica: 5 pipeline stages, but Llama-3.1-405B has 4 layers to split over "
        "them; set at most 4"]


def test_more_nodes_than_needed_is_a_warning() -> None:
    m = config_model(group_stack(nodesPerReplica=4), secure=("hfToken",))
    w = m.workloads["big"]
    (warning,) = [str(x) for rule in serve.KIND.warnings for x in rule(m, w)  # type: ignore[arg-type]
                  if x.path == "workloads.big.serving.nodesPerReplica"]
    assert "4 nodes per replica, but 2 of pool h100 hold Llama-3.1-405B" in warning


# --- the rendered LeaderWorkerSet ----------------------------------------------------------------------------------

@functools.cache
def lws_schema() -> dict[str, Any]:
    path = reference("serving-scale", "leaderworkerset.x-k8s.io_leaderworkersets.v0.10.0.yaml")
    with open(path, encoding="utf-8") as fh:
        crd = yaml.load(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return served["schema"]["openAPIV3Schema"]


def lws_problems(obj: dict[str, Any]) -> list[str]:
    schema = lws_schema()
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
              for e in jsonschema.Draft7Validator(schema).iter_errors(obj)]
    return errors + [f"{f}: not in the CRD (pruned)" for f in unknown_fields(schema, obj)]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`make gpus MODEL=meta-llama/Llama-3.1-405B-Instruct MODE=inference GPUS=H100-MEGA WRITE=...`, previewed."""
    path = write("405b-h100-mega", tmp_path_factory.mktemp("lws"))
    run = stack_run("405b-h100-mega", example=False, path=path)
    (reg,) = run.by_type(LWS)
    return {"run": run, "path": path, "lws": {"apiVersion": reg.inputs["apiVersion"], "kind": reg.inputs["kind"],
                                              "metadata": reg.inputs["metadata"], "spec": reg.inputs["spec"]}}


def test_the_written_stack_asks_for_two_nodes_per_replica(written: dict[str, Any]) -> None:
    cfg = yaml.safe_load(written["path"].read_text(encoding="utf-8"))["config"]
    assert cfg["deepspeed-stack:workloads"]["serve"]["serving"]["nodesPerReplica"] == 2
    assert cfg["deepspeed-stack:nodePools"][0]["maxNodes"] == 2


def test_the_group_validates_against_the_lws_crd(written: dict[str, Any]) -> None:
    lws = written["lws"]
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1" and lws["kind"] == "LeaderWorkerSet"
    assert lws_problems(lws) == []


def test_the_crd_check_refuses_what_lws_refuses(written: dict[str, Any]) -> None:
    bad = yaml.safe_load(yaml.safe_dump(written["lws"]))
    bad["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Always"
    bad["spec"]["startupPolicy"] = "WorkersFirst"
    problems = lws_problems(bad)
    assert any("restartPolicy" in p for p in problems) and any("startupPolicy" in p for p in problems)


def test_one_group_per_replica_recreated_whole(written: dict[str, Any]) -> None:
    spec = written["lws"]["spec"]
    assert spec["replicas"] == 1
    assert spec["leaderWorkerTemplate"]["size"] == 2
    assert spec["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"
    # One replica on a pool of two nodes: never taken down first (its successor waits for nodes).
    assert spec["rolloutStrategy"] == {"type": "RollingUpdate",
                                       "rollingUpdateConfiguration": {"maxSurge": 1, "maxUnavailable": 0}}


def test_leader_and_worker_pods_are_valid_hardened_and_fitted(written: dict[str, Any]) -> None:
    template = written["lws"]["spec"]["leaderWorkerTemplate"]
    for key in ("leaderTemplate", "workerTemplate"):
        spec = template[key]["spec"]
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": spec},
                                     K8S_VERSION, strict=True)
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        server = spec["containers"][0]
        assert server["securityContext"]["allowPrivilegeEscalation"] is False
        assert server["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert server["resources"]["requests"] == server["resources"]["limits"]
        assert server["resources"]["limits"]["nvidia.com/gpu"] == "8"
        assert server["command"] == ["/bin/sh", "/app/serve_group.sh"]
        args = server["args"]
        assert args[args.index("--tensor-parallel-size") + 1] == "8"
        assert args[args.index("--pipeline-parallel-size") + 1] == "2"
        env = {e["name"]: e["value"] for e in server["env"]}
        assert env["GROUP_NODES"] == "2" and env["MASTER_PORT"] == "29501"
        # The a3-megagpu-8g pool's GPUDirect-TCPXO fabric carries the pipeline's traffic across the nodes.
        assert env["NCCL_ENV_SCRIPT"] == "/app/nccl_env.sh"
        assert "networking.gke.io/interfaces" in template[key]["metadata"]["annotations"]
    leader = template["leaderTemplate"]["spec"]["containers"][0]
    worker = template["workerTemplate"]["spec"]["containers"]
    assert "readinessProbe" in leader and leader["ports"][0]["containerPort"] == 8000
    assert len(worker) == 1 and "readinessProbe" not in worker[0] and "ports" not in worker[0]


def test_clients_reach_the_leaders_and_the_group_reaches_itself(written: dict[str, Any]) -> None:
    run = written["run"]
    (service,) = [r for r in run.by_type("kubernetes:core/v1:Service") if r.inputs["metadata"]["name"] == "serve"]
    assert service.inputs["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    (policy,) = run.by_type("kubernetes:networking.k8s.io/v1:NetworkPolicy")
    own = [rule for rule in policy.inputs["spec"]["ingress"]
           if rule.get("from") == [{"podSelector": policy.inputs["spec"]["podSelector"]}]]
    assert own and "ports" not in own[0]  # NCCL and vLLM's queues pick their ports at start


def test_the_controller_is_installed_pinned(written: dict[str, Any]) -> None:
    (config,) = [r for r in written["run"].by_type("kubernetes:yaml/v2:ConfigFile") if "leader-worker-set" in r.name]
    assert config.inputs["file"] == \
        "https://github.com/kubernetes-sigs/lws/releases/download/v0.10.0/manifests.yaml"


# --- the launch script ---------------------------------------------------------------------------------------------

def stand_ins(tmp_path: Path) -> Path:
    """`python` and `vllm` on PATH that print what they were run with (the script execs them)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("python", "vllm"):
        path = bin_dir / name
        path.write_text(f'#!/bin/sh\necho "{name} $*"\n', encoding="utf-8")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def launch(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": f"{stand_ins(tmp_path)}:/usr/bin:/bin", "LWS_LEADER_ADDRESS": "serve-0.serve.serving",
            "LWS_GROUP_SIZE": "2", "GROUP_NODES": "2", "MASTER_PORT": "29501"}
    return subprocess.run(["/bin/sh", str(SCRIPT), "--model", "m", "--pipeline-parallel-size", "2"],
                          env={**base, **env}, capture_output=True, text=True, check=False, timeout=30)


def test_the_leader_runs_the_api_server_as_node_rank_0(tmp_path: Path) -> None:
    done = launch(tmp_path, LWS_WORKER_INDEX="0")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ("python -m vllm.entrypoints.openai.api_server --model m --pipeline-parallel-size 2 "
                                   "--nnodes 2 --node-rank 0 --master-addr serve-0.serve.serving --master-port 29501")
    assert " ".join(vllm_facts().entrypoint) in done.stdout  # the engine's entrypoint, data/serving.yaml


def test_a_worker_runs_headless_with_its_index_through_the_fabric_env(tmp_path: Path) -> None:
    """On a fabric pool the engine starts through the fabric's env script (which execs its arguments)."""
    env_script = tmp_path / "nccl_env.sh"
    env_script.write_text('#!/bin/bash\necho "fabric env"\nexec "$@"\n', encoding="utf-8")
    done = launch(tmp_path, LWS_WORKER_INDEX="1", NCCL_ENV_SCRIPT=str(env_script))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "fabric env", "vllm serve --model m --pipeline-parallel-size 2 --nnodes 2 --node-rank 1 --master-addr "
        "serve-0.serve.serving --master-port 29501 --headless"]
    assert " ".join(vllm_facts().headless_entrypoint) == "vllm serve"


@pytest.mark.parametrize(("env", "says"), [
    ({"LWS_WORKER_INDEX": "1", "LWS_GROUP_SIZE": "3"}, "the group has 3 pods, the stack rendered 2"),
    ({"LWS_WORKER_INDEX": "2"}, "worker index 2 is outside a group of 2"),
    ({"LWS_WORKER_INDEX": "x"}, "expected a whole number, got 'x'"),
    ({}, "LWS_WORKER_INDEX: is not set"),
])
def test_a_group_that_is_not_the_rendered_one_starts_nothing(tmp_path: Path, env: dict[str, str], says: str) -> None:
    done = launch(tmp_path, **env)
    assert done.returncode != 0 and done.stdout == ""
    assert says in done.stderr


def test_the_launch_script_is_shellcheck_clean() -> None:
    done = subprocess.run([tool("shellcheck"), str(SCRIPT)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout
    assert os.access(SCRIPT, os.X_OK)
