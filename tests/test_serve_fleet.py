"""One truth for adapters across replicas (issue 42 item 1): with `serving.evaluation` and more than one replica (or
an autoscaler), one evaluator decides from a pod of its own (the `chat-evaluator` Deployment) and each replica runs
the adapter loader beside vLLM (recipes/adapter_loader.py: tests/test_adapter_loader.py drives its logic),
Ready only once it serves what was decided. The finetune stack's `chat` server, scaled to two replicas."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from conftest import changed, config_model, load_file, problems
from test_mpijob import K8S_VERSION

from planner import pool_cost
from preview import engine
from preview.engine import RunResult

DEPLOYMENT = "kubernetes:apps/v1:Deployment"
S = "workloads.chat"
EVALUATION = {f"{S}.serving.evaluation": {"task": "data/heldout.jsonl", "minImprovement": 0.05}}
FLEET = {**EVALUATION, f"{S}.serving.replicas": 2, "nodePools[1].maxNodes": 4}
SCRIPTS = Path(__file__).resolve().parent.parent / "recipes"


@pytest.fixture(scope="module")
def fleet() -> RunResult:
    return engine.run_program(*engine.engine_config_from_yaml(changed("finetune", FLEET)), stack="finetune")


def pod(run: RunResult, name: str) -> dict[str, Any]:
    return run.one(DEPLOYMENT, name).inputs["spec"]["template"]


def containers(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in template["spec"]["containers"]}


def test_each_replica_loads_what_was_decided_and_scores_nothing(fleet: RunResult) -> None:
    replica = pod(fleet, "chat-deployment")
    found = containers(replica)
    assert set(found) == {"server", "adapter-loader"}
    loader = found["adapter-loader"]
    assert loader["args"] == ["/app/adapter_loader.py", "--url", "http://127.0.0.1:8000", "--evals", "/evals",
                              "--ready", "/tmp/adapter-loader/ready", "--adapter", "tune"]
    assert loader["readinessProbe"]["exec"]["command"] == ["test", "-f", "/tmp/adapter-loader/ready"]
    assert {"name": "evals", "mountPath": "/evals", "readOnly": True} in loader["volumeMounts"]
    (evals,) = [v for v in replica["spec"]["volumes"] if v["name"] == "evals"]
    assert evals["csi"]["readOnly"] is True  # no replica writes the decision
    server_env = {e["name"]: e["value"] for e in found["server"]["env"]}
    assert server_env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "true"  # loaded at run time, by the loader alone
    assert "--middleware" in found["server"]["args"]  # ... over the pod's loopback only (client_endpoints.py)
    assert "--lora-modules" not in found["server"]["args"]
    assert loader["securityContext"]["allowPrivilegeEscalation"] is False
    assert loader["resources"]["requests"] == loader["resources"]["limits"] == {"cpu": "100m", "memory": "128Mi"}


def test_one_evaluator_pod_decides_for_the_fleet(fleet: RunResult) -> None:
    deployment = fleet.one(DEPLOYMENT, "chat-evaluator").inputs
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}  # never two evaluators at once
    template = pod(fleet, "chat-evaluator")
    assert set(containers(template)) == {"server", "evaluator"}
    labels = template["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "evaluator"
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # No Service selects it: the server's selects component server.
    (service,) = [r for r in fleet.by_type("kubernetes:core/v1:Service") if r.inputs["metadata"]["name"] == "chat"]
    assert service.inputs["spec"]["selector"]["app.kubernetes.io/component"] == "server"
    (policy,) = [r for r in fleet.by_type("kubernetes:networking.k8s.io/v1:NetworkPolicy")
                 if r.inputs["metadata"]["name"] == "chat-evaluator"]
    assert policy.inputs["spec"]["ingress"] == [] and policy.inputs["spec"]["podSelector"]["matchLabels"] == \
        deployment["spec"]["selector"]["matchLabels"]
    summary = fleet.outputs["workloads"]["chat"]["evaluation"]
    assert summary["logs"] == "kubectl logs -n serving -f deploy/chat-evaluator -c evaluator"
    assert summary["decides"].startswith("one evaluator pod (deployment chat-evaluator, a node of its own)")


def test_both_pods_are_valid_and_hardened(fleet: RunResult) -> None:
    for name in ("chat-deployment", "chat-evaluator"):
        template = pod(fleet, name)
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                                      "spec": template["spec"]}, K8S_VERSION, strict=True)
        assert template["spec"]["automountServiceAccountToken"] is False
        assert template["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in template["spec"]["containers"]:
            assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}, (name, c["name"])
            assert c["securityContext"]["runAsNonRoot"] is True, (name, c["name"])


def test_the_config_map_ships_the_loader(fleet: RunResult) -> None:
    (config_map,) = [r for r in fleet.by_type("kubernetes:core/v1:ConfigMap") if r.name == "chat-server"]
    assert config_map.inputs["data"]["adapter_loader.py"] == (SCRIPTS / "adapter_loader.py").read_text()


def test_the_loaders_arguments_are_the_scripts_own(fleet: RunResult) -> None:
    loader = load_file(SCRIPTS / "adapter_loader.py", "adapter_loader_args")
    args = loader.parse_args(containers(pod(fleet, "chat-deployment"))["adapter-loader"]["args"][1:])
    assert args.adapter == ["tune"] and str(args.evals) == "/evals"


def test_the_evaluators_node_is_counted() -> None:
    """Two replicas and the evaluator's pod need three nodes of the pool, and the cost counts them."""
    found = problems("finetune", {**EVALUATION, f"{S}.serving.replicas": 2, "nodePools[1].maxNodes": 2})
    assert (f"{S}.serving.replicas: 2 replica(s) and the evaluator's own pod need 3 nodes of pool l4, but "
            "nodePools[1].maxNodes is 2; raise maxNodes or lower replicas") in found
    m = config_model(changed("finetune", FLEET))
    assert pool_cost.workload_nodes(m.workloads["chat"]) == 3
    assert pool_cost.workload_nodes(config_model(changed("finetune", EVALUATION)).workloads["chat"]) == 1


def test_evaluation_with_replicas_or_an_autoscaler_is_accepted() -> None:
    """Issue 36 refused it (every pod ran its own evaluator); one evaluator now decides for all."""
    assert problems("finetune", FLEET) == []
    assert problems("finetune", {**EVALUATION, f"{S}.serving.autoscaling": {"enabled": True, "maxReplicas": 2},
                                 "nodePools[1].maxNodes": 3}) == []


def test_one_replica_keeps_its_evaluator_beside_it() -> None:
    m = config_model(changed("finetune", EVALUATION))
    assert not m.workloads["chat"].evaluator_apart
    assert m.workloads["chat"].evaluator_nodes == 0


def test_a_pod_with_the_evaluator_waives_only_its_readiness_check(fleet: RunResult) -> None:
    """checkov's CKV_K8S_9 on the evaluator container (it serves nothing): waived where it runs, not on replicas."""
    def checks(name: str) -> set[str]:
        annotations = fleet.one(DEPLOYMENT, name).inputs["metadata"]["annotations"]
        return {v.split("=", 1)[0] for k, v in annotations.items() if k.startswith("checkov.io/skip")}
    assert "CKV_K8S_9" in checks("chat-evaluator")
    assert "CKV_K8S_9" not in checks("chat-deployment")
