"""`serve` workloads: the server's Kubernetes objects under mocks for both engines (vLLM, the default, and
DeepSpeed-MII), the kind's rules, and MII's entry script run against a stub of MII."""

from __future__ import annotations

import http.server
import importlib.util
import json
import re
import shlex
import sys
import threading
import types
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, ClassVar

import kubernetes_validate
import pytest
from conftest import DELETE, PROJECT_DIR, changed, config_model, problems, stack_run

from checks import warnings
from model import catalog
from preview import engine, manifests
from preview.engine import RunResult

K8S_VERSION = "1.33.0"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
SERVICE = "kubernetes:core/v1:Service"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
PDB = "kubernetes:policy/v1:PodDisruptionBudget"
NETPOL = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
HPA = "kubernetes:autoscaling/v2:HorizontalPodAutoscaler"
# Managed Prometheus' collectors on the API port, where vLLM serves /metrics (tests/test_serving_metrics.py).
COLLECTOR_RULE = {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gmp-system"}},
                            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "collector"}}}],
                  "ports": [{"port": 8000, "protocol": "TCP"}]}
SECRET = "kubernetes:core/v1:Secret"
CANARY = "hf_serving_canary_token"
W = "workloads.chat"
# The variant: autoscaling, an internal load balancer, the model from the bucket, a token.
VARIANT = {
    f"{W}.serving.model": DELETE,
    f"{W}.serving.modelPath": "models/Qwen2.5-7B-Instruct",
    f"{W}.gcsFuse.enabled": True,
    "storage.enabled": True,
    f"{W}.serving.autoscaling": {"enabled": True, "maxReplicas": 2, "metric": "running"},
    f"{W}.serving.service": "InternalLoadBalancer",
    f"{W}.serving.allowFrom": [{"cidr": "10.0.0.0/8"}, {"namespace": "apps", "podLabels": {"app": "ui"}}],
}
# DeepSpeed-MII instead, with its OpenAI-compatible server beside the RESTful API.
MII = {f"{W}.serving.engine": "mii", f"{W}.serving.openai": {"enabled": True, "port": 8000}}


@pytest.fixture(scope="module")
def serve() -> RunResult:
    return stack_run("serve")


@pytest.fixture(scope="module")
def variant() -> RunResult:
    values, secret_keys = engine.engine_config_from_yaml(changed("serve", VARIANT))
    values["deepspeed-stack:hfToken"] = CANARY
    return engine.run_program(values, [*secret_keys, "deepspeed-stack:hfToken"], stack="serve")


@pytest.fixture(scope="module")
def mii() -> RunResult:
    return engine.run_program(*engine.engine_config_from_yaml(changed("serve", MII)), stack="serve")


def pod(run: RunResult) -> dict[str, Any]:
    return run.one(DEPLOYMENT).inputs["spec"]["template"]


def container(run: RunResult) -> dict[str, Any]:
    (c,) = pod(run)["spec"]["containers"]
    return c


def server_objects(run: RunResult) -> list[dict[str, Any]]:
    component = run.one("deepspeed-stack:workloads:ModelServer").urn
    docs = [manifests.manifest(r) for r in run.resources if r.parent == component and manifests.is_object(r)]
    for doc in docs:
        if doc["kind"] == "Secret" and doc.get("stringData") == engine.SECRET:  # the mocks record it whole
            doc["stringData"] = {"token": engine.SECRET}
    return docs


# --- the Kubernetes objects -----------------------------------------------------------------------

def test_every_server_object_is_a_valid_kubernetes_object(serve: RunResult, variant: RunResult,
                                                          mii: RunResult) -> None:
    kinds = set()
    for run in (serve, variant, mii):
        for doc in server_objects(run):
            if doc["kind"] != "PodMonitoring":  # a CRD's object: its schema in tests/test_serving_metrics.py
                kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
            kinds.add(doc["kind"])
    assert kinds == {"Namespace", "ConfigMap", "Secret", "ServiceAccount", "Deployment", "Service",
                     "PodDisruptionBudget", "NetworkPolicy", "HorizontalPodAutoscaler", "PodMonitoring"}


def test_vllm_serves_the_model_with_the_planners_values(serve: RunResult) -> None:
    c = container(serve)
    # The stack's image in its Artifact Registry (Pulumi.serve.yaml: gcp:project, gcp:region, registry.name), by
    # digest; the same the stack exports. It ships vLLM (data/versions.yaml).
    assert re.fullmatch(r"us-central1-docker\.pkg\.dev/my-gcp-project/deepspeed/deepspeed@sha256:[0-9a-f]{64}",
                        c["image"]), c["image"]
    assert c["image"] == serve.outputs["imageRef"]
    # The module `make e2e` proves with vLLM's CPU build (whose `vllm serve` CLI fails), on the Service's port, the
    # node's 1 GPU, model.sequenceLength 4096, the planner's budget 0.90 and bf16 as bfloat16.
    assert c["command"] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    assert c["args"] == ["--model", "Qwen/Qwen2.5-7B-Instruct", "--served-model-name", "Qwen/Qwen2.5-7B-Instruct",
                         "--host", "0.0.0.0", "--port", "8000", "--tensor-parallel-size", "1",
                         "--gpu-memory-utilization", "0.90", "--max-model-len", "4096", "--dtype", "bfloat16"]
    assert c["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    # No usage report to stats.vllm.ai from inside the cluster.
    assert {"name": "VLLM_NO_USAGE_STATS", "value": "1"} in c["env"]
    assert {"name": "DO_NOT_TRACK", "value": "1"} in c["env"]
    # vLLM runs from the image: no entry script, no ConfigMap; nothing waits for a model (no init container).
    assert serve.by_type(CONFIG_MAP) == []
    assert "initContainers" not in pod(serve)["spec"]


def test_the_budget_is_the_planners_headroom() -> None:
    from model import serving_engines
    from planner.sizing_types import HEADROOM

    # vLLM takes --gpu-memory-utilization of each GPU; the planner sizes within 1 - HEADROOM of it.
    assert serving_engines.engine("vllm").gpu_memory_utilization == pytest.approx(1 - HEADROOM) == 0.90


def test_deployment_placement_and_resources(serve: RunResult) -> None:
    spec = serve.one(DEPLOYMENT).inputs["spec"]
    assert spec["replicas"] == 1
    # The pool has a second node (maxNodes 2): a rollout surges a new pod before the old one goes.
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    p = spec["template"]["spec"]
    assert p["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4", "deepspeed-stack/pool": "l4"}
    assert p["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    # g2-standard-8: 8 vCPUs, 32 GB; GKE reserves 0.09 CPU and 3.66 GiB, DaemonSets 1 CPU and 1.5 GiB.
    expected = {"nvidia.com/gpu": "1", "cpu": "6", "memory": "26Gi"}
    assert container(serve)["resources"] == {"requests": expected, "limits": expected}
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    # A server whose model already exists is awaited by `pulumi up` (no skipAwait).
    assert "pulumi.com/skipAwait" not in serve.one(DEPLOYMENT).inputs["metadata"]["annotations"]
    assert "annotations" not in serve.one(SERVICE).inputs["metadata"]


@pytest.mark.parametrize("fixture", ["serve", "mii"])
def test_probes_watch_the_served_port(fixture: str, request: pytest.FixtureRequest) -> None:
    run = request.getfixturevalue(fixture)
    c = container(run)
    # vLLM's own /health (503 once its engine is dead; nothing listens before the model is loaded), or MII's entry
    # script's /health (gateway and every model process answering): on the port the Service exposes (issue 19.9).
    health = {"path": "/health", "port": "http", "scheme": "HTTP"}
    assert (c["startupProbe"]["httpGet"], c["readinessProbe"]["httpGet"], c["livenessProbe"]["httpGet"]) == (
        health, health, health)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["http"] == {"serve": 8000, "mii": 51080}[fixture]
    # startupMinutes 45 at one probe every 10 s.
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] == 45 * 60
    # The rollout may take longer than the pod may take to start (a new GPU node comes first).
    assert run.one(DEPLOYMENT).inputs["spec"]["progressDeadlineSeconds"] > 45 * 60


def test_pod_is_hardened(serve: RunResult) -> None:
    p, c = pod(serve)["spec"], container(serve)
    assert p["automountServiceAccountToken"] is False
    assert p["securityContext"]["runAsNonRoot"] is True
    assert p["securityContext"]["runAsUser"] == 1001
    assert p["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = c["securityContext"]
    assert (sc["allowPrivilegeEscalation"], sc["privileged"], sc["readOnlyRootFilesystem"]) == (False, False, True)
    assert sc["capabilities"] == {"drop": ["ALL"]}
    # With a read-only root, every writable path is a volume of its own, each with a size limit.
    volumes = {v["name"]: v for v in p["volumes"]}
    writable = {m["mountPath"]: volumes[m["name"]] for m in c["volumeMounts"] if not m.get("readOnly")}
    assert set(writable) == {"/tmp", "/home/deepspeed", "/dev/shm"}
    assert writable["/home/deepspeed"]["emptyDir"]["sizeLimit"] == "40Gi"  # serving.cacheSize of the stack
    assert all("sizeLimit" in v["emptyDir"] for v in writable.values())


def test_service_pdb_and_network_policy(serve: RunResult) -> None:
    selector = serve.one(DEPLOYMENT).inputs["spec"]["selector"]["matchLabels"]
    svc = serve.one(SERVICE).inputs
    assert (svc["metadata"]["name"], svc["metadata"]["namespace"]) == ("chat", "serving")
    assert svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"]["selector"] == selector
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]
    pdb = serve.one(PDB).inputs["spec"]
    assert pdb == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}
    np = serve.one(NETPOL).inputs["spec"]
    assert np["podSelector"] == {"matchLabels": selector}
    assert np["policyTypes"] == ["Ingress"]
    assert np["ingress"] == [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}}],
                              "ports": [{"port": 8000, "protocol": "TCP"}]}, COLLECTOR_RULE]
    assert serve.by_type(HPA) == []


def test_no_sources_admit_nobody_and_a_protected_cluster_protects_the_server() -> None:
    run = engine.run_program(*engine.engine_config_from_yaml(changed("serve", {
        f"{W}.serving.allowFrom": [], "cluster.deletionProtection": True})), stack="serve")
    # Nobody but Managed Prometheus' collectors, which scrape vLLM's /metrics.
    assert run.one(NETPOL).inputs["spec"].get("ingress", []) == [COLLECTOR_RULE]
    assert run.one(DEPLOYMENT).protect and run.one(SERVICE).protect
    assert not run.one(PDB).protect  # a budget holds nothing


def test_endpoint_in_the_outputs(serve: RunResult) -> None:
    assert serve.outputs["servingEndpoints"] == {"chat": {
        "endpoint": "http://chat.serving.svc.cluster.local:8000/v1",
        "portForward": "kubectl -n serving port-forward svc/chat 8000:8000",
        "prompt": 'python -m recipes.send_prompt --openai --url http://localhost:8000 '
                  '--model Qwen/Qwen2.5-7B-Instruct "What is DeepSpeed?"',
        "servedModel": "Qwen/Qwen2.5-7B-Instruct"}}
    summary = serve.outputs["workloads"]["chat"]
    assert (summary["kind"], summary["engine"], summary["model"]) == ("serve", "vllm", "Qwen/Qwen2.5-7B-Instruct")


def test_server_waits_for_its_pool_and_the_image_grant(serve: RunResult) -> None:
    server = serve.one("deepspeed-stack:workloads:ModelServer")
    pool = serve.one("gcp:container/nodePool:NodePool", "l4")
    grant = serve.one("gcp:artifactregistry/repositoryIamMember:RepositoryIamMember")
    assert set(server.dependencies) == {pool.urn, grant.urn}
    deployment = serve.one(DEPLOYMENT)
    assert pool.urn in deployment.dependencies
    # The Service and the budget need no GPU node.
    assert pool.urn not in serve.one(SERVICE).dependencies


def test_variant_autoscaler_load_balancer_bucket_and_token(variant: RunResult) -> None:
    spec = variant.one(DEPLOYMENT).inputs["spec"]
    assert "replicas" not in spec  # the autoscaler owns the count
    hpa = variant.one(HPA).inputs["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (1, 2)
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "chat"}
    # vLLM's running requests per replica above the serve stack's model.batchSize 8 (the sequences it was sized for).
    assert hpa["metrics"] == [{"type": "Pods", "pods": {
        "metric": {"name": "prometheus.googleapis.com|vllm:num_requests_running|gauge"},
        "target": {"type": "AverageValue", "averageValue": "8"}}}]
    # maxReplicas 2 takes both nodes of the pool: no node to surge onto; the autoscaler may be at 1 replica, which a
    # rollout never takes down first (issue 42 item 5): the surge pod waits for a node.
    assert spec["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    svc = variant.one(SERVICE).inputs
    assert svc["spec"]["type"] == "LoadBalancer"
    assert svc["metadata"]["annotations"] == {"networking.gke.io/load-balancer-type": "Internal"}
    assert svc["spec"]["externalTrafficPolicy"] == "Local"
    assert [p["port"] for p in svc["spec"]["ports"]] == [8000]
    c = container(variant)
    args = c["args"]
    # A folder of the bucket, named in the API by its folder.
    assert args[args.index("--model") + 1] == "/gcs/models/Qwen2.5-7B-Instruct"
    assert args[args.index("--served-model-name") + 1] == "models/Qwen2.5-7B-Instruct"
    p = spec["template"]["spec"]
    gcs = next(v for v in p["volumes"] if "csi" in v)
    assert gcs["csi"]["readOnly"] is True
    assert next(m for m in c["volumeMounts"] if m["name"] == gcs["name"])["readOnly"] is True
    assert p["serviceAccountName"] == "deepspeed-data"
    assert spec["template"]["metadata"]["annotations"]["gke-gcsfuse/volumes"] == "true"
    # The token: a Secret (kept secret), mounted as a file; only its path is in the environment.
    secret = variant.one(SECRET)
    assert "stringData" in secret.secret_paths or any(s.startswith("stringData") for s in secret.secret_paths)
    assert {"name": "HF_TOKEN_PATH", "value": "/etc/huggingface/token"} in c["env"]
    assert CANARY not in repr(variant.one(DEPLOYMENT).inputs)
    ingress = variant.one(NETPOL).inputs["spec"]["ingress"]
    assert ingress[0]["from"] == [{"ipBlock": {"cidr": "10.0.0.0/8"}},
                                  {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}},
                                   "podSelector": {"matchLabels": {"app": "ui"}}}]
    assert ingress[0]["ports"] == [{"port": 8000, "protocol": "TCP"}]


def test_mii_runs_its_entry_script_behind_its_own_port(mii: RunResult) -> None:
    c = container(mii)
    assert c["command"] == ["python"]
    # The Service's port is the entry script's; MII's gateway listens on 127.0.0.1:28080 inside the pod.
    assert c["args"] == ["/app/serve.py", "--model", "Qwen/Qwen2.5-7B-Instruct", "--deployment-name", "chat",
                         "--tensor-parallel", "1", "--port", "51080", "--gateway-port", "28080",
                         "--max-length", "4096", "--openai-port", "8000"]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"http": 51080, "openai": 8000}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod(mii)["spec"]["volumes"]}
    assert volumes[mounts["/app"]]["configMap"]["name"] == "chat-server"
    cm = mii.one(CONFIG_MAP, "chat-server").inputs["data"]
    assert cm["serve.py"] == (PROJECT_DIR / "recipes" / "serve.py").read_text(encoding="utf-8")
    # What it imports beside it: its options (contract_programs.py SERVE) and the package's __init__.
    assert sorted(cm) == ["contract.py", "contract_programs.py", "recipes.py", "serve.py"]
    serve_py = load_script(SERVE_PY)
    args = serve_py.parse_args(c["args"][1:])  # the pod's arguments, read by the entry script's own parser
    assert (args.tensor_parallel, args.port, args.max_length, args.openai_port) == (1, 51080, 4096, 8000)
    assert [p["port"] for p in mii.one(SERVICE).inputs["spec"]["ports"]] == [51080, 8000]
    # The NetworkPolicy admits allowFrom to the two API ports only (never 28080: nothing listens there but on
    # loopback anyway).
    assert mii.one(NETPOL).inputs["spec"]["ingress"][0]["ports"] == [{"port": 51080, "protocol": "TCP"},
                                                                   {"port": 8000, "protocol": "TCP"}]
    assert mii.outputs["servingEndpoints"]["chat"]["endpoint"] == "http://chat.serving.svc.cluster.local:51080/mii/chat"


# --- the facts and the rules ----------------------------------------------------------------------

def test_compute_capabilities_in_the_catalog() -> None:
    # developer.nvidia.com/cuda-gpus: T4 7.5, V100 7.0, P100 6.0, L4 8.9, A100 8.0, H100 9.0, B200 10.0.
    gpus = catalog.load().gpus
    assert {g: gpus[g].compute_capability for g in ("nvidia-tesla-t4", "nvidia-tesla-v100", "nvidia-tesla-p100",
                                                     "nvidia-l4", "nvidia-tesla-a100", "nvidia-h100-80gb",
                                                     "nvidia-b200")} == {
        "nvidia-tesla-t4": (7, 5), "nvidia-tesla-v100": (7, 0), "nvidia-tesla-p100": (6, 0),
        "nvidia-l4": (8, 9), "nvidia-tesla-a100": (8, 0), "nvidia-h100-80gb": (9, 0), "nvidia-b200": (10, 0)}
    assert all(g.compute_capability != (0, 0) for g in gpus.values())


def test_engine_facts_and_their_copies_agree(serve_py: types.ModuleType) -> None:
    # data/serving.yaml (sources there) is the one place for these facts; the image's pin and the entry script,
    # which runs in the pod without data/, must say the same.
    from model.serving_engines import engine, mii_facts, vllm_facts
    from model.yamlio import load_yaml

    raw = load_yaml(PROJECT_DIR / "data" / "serving.yaml")
    facts = mii_facts()
    assert facts.version == "0.3.3"
    dockerfile = (PROJECT_DIR / "workloads" / "images" / "deepspeed" / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^ARG DEEPSPEED_MII_VERSION=(\S+)$", dockerfile, re.M).group(1) == facts.version
    assert serve_py.SERVE.option("load_balancer_port").default == facts.load_balancer_port == 50050
    assert serve_py.SERVE.option("gateway_port").default == facts.gateway_internal_port == 28080
    assert serve_py.FASTGEN_MAX_CONTEXT == raw["mii"]["fastgenMaxContext"] == 8192
    # FastGen: kernels for 8.0, 8.6, 8.9, 9.0 (deepspeed-kernels' cubins); a 1 GB reserve (manager_configs.py).
    m = engine("mii")
    assert (m.kernel_archs, m.precisions, m.reserve_bytes) == (((8, 0), (8, 6), (8, 9), (9, 0)), ("fp16", "bf16"),
                                                               1e9)
    # vLLM: 7.0+ (its installation page), bf16 from 8.0, --dtype per precision (vllm/config/model.py ModelDType).
    v = engine("vllm")
    assert (v.min_compute_capability, v.bf16_min_compute_capability, v.port) == ((7, 0), (8, 0), 8000)
    assert vllm_facts().dtypes == {"fp16": "float16", "bf16": "bfloat16", "int8": "float16", "int4": "float16"}
    assert engine().name == "vllm"  # the default
    # pulumi-kubernetes' annotation (provider/pkg/metadata/annotations.go: AnnotationSkipAwait).
    assert raw["pulumiKubernetes"]["skipAwait"] == "pulumi.com/skipAwait"


def test_serve_stack_is_valid_with_and_without_a_token() -> None:
    assert problems("serve", {}) == []
    assert problems("serve", {"hfToken": {"secure": "v1:planted"}}) == []


@pytest.mark.parametrize(("gpu", "machine", "zone", "why"), [
    # vLLM needs compute capability 7.0 (P100 6.0); the image's torch 2.13 has no 7.0 kernels (V100).
    ("nvidia-tesla-p100", "n1-standard-8", "us-central1-c", "vLLM needs compute capability 7.0 or newer"),
    ("nvidia-tesla-v100", "n1-standard-8", "us-central1-b", "kernels for compute capability 7.5, 8.0"),
])
def test_gpus_vllm_cannot_run_on_are_refused(gpu: str, machine: str, zone: str, why: str) -> None:
    found = problems("serve", {"nodePools[0].gpu.type": gpu, "nodePools[0].machineType": machine,
                               "nodePools[0].zones": [zone], f"{W}.model.precision": "fp16"})
    (refusal,) = found
    assert refusal.startswith(f"{W}.pool: pool l4 has ") and why in refusal
    assert "gpu.type nvidia-tesla-t4" in refusal  # the cheapest GPU vLLM runs on in us-central1, as the alternative


def test_t4_serves_fp16_not_bf16() -> None:
    t4 = {"nodePools[0].gpu.type": "nvidia-tesla-t4", "nodePools[0].machineType": "n1-standard-8",
          "nodePools[0].zones": ["us-central1-b"], f"{W}.model.batchSize": 1, f"{W}.model.sequenceLength": 2048}
    # Qwen2.5-7B: 15.2 GB of bf16 weights do not fit a 16 GB T4 at 0.90; 2 x T4 hold it (28 heads, 4 KV heads).
    t4["nodePools[0].gpu.count"] = 2
    assert problems("serve", {**t4, f"{W}.model.precision": "fp16"}) == []
    (refusal,) = problems("serve", t4)
    assert refusal == (f"{W}.model.precision: T4 (compute capability 7.5) has no bf16, and vLLM refuses it there; "
                       "set precision: fp16 (the same bytes, --dtype float16)")


@pytest.mark.parametrize(("gpu", "machine", "zone", "capability"), [
    ("nvidia-tesla-t4", "n1-standard-8", "us-central1-b", "7.5"),
    ("nvidia-b200", "a4-highgpu-8g", "us-central1-b", "10.0"),
])
def test_mii_is_refused_where_its_kernels_do_not_run(gpu: str, machine: str, zone: str, capability: str) -> None:
    count = 8 if gpu == "nvidia-b200" else 1
    found = problems("serve", {**MII, "nodePools[0].gpu.type": gpu, "nodePools[0].machineType": machine,
                               "nodePools[0].gpu.count": count, "nodePools[0].zones": [zone],
                               f"{W}.model.precision": "fp16"})
    (refusal,) = [p for p in found if p.startswith(f"{W}.serving.engine:")]
    assert f"compute capability {capability}" in refusal
    assert "built for compute capability 8.0, 8.6, 8.9, 9.0 only" in refusal
    assert "Valid: engine vllm (the default) on this pool, or engine mii on a pool of A100, L4, H100 or H200" in refusal


def test_a_model_that_cannot_fit_is_refused_with_numbers_and_what_fits() -> None:
    found = problems("serve", {f"{W}.model.name": "Qwen2.5-72B", f"{W}.serving.model": "Qwen/Qwen2.5-72B-Instruct",
                               f"{W}.model.batchSize": 1})
    (refusal,) = found
    # 72.71B parameters x 2 bytes (bf16) = 145.4 GB of weights on one 24 GB L4, of which vLLM takes 90 %.
    assert refusal.startswith(f"{W}.model: Qwen2.5-72B")
    assert "weights 145.4" in refusal and "vLLM takes 90% of each (21.6 GB)" in refusal
    # 145.4 GB / 8 = 18.2 GB of weights per GPU: eight L4s of one g2-standard-96 hold it (64 heads, 8 KV heads).
    assert "8 x L4 (g2-standard-96" in refusal


def test_mii_sizes_by_its_reserve() -> None:
    from planner.requests import workload_request
    from planner.sizing import estimate
    from planner.sizing_types import INFERENCE

    w = config_model(changed("serve", MII)).workloads["chat"]
    est = estimate(workload_request(w), INFERENCE, 1, 1)
    # FastGen: weights + the KV cache asked for + its 1 GB reserve + the CUDA context, no 10 % on top; its cache
    # then takes the rest of the GPU. Qwen2.5-7B bf16: 7.62e9 x 2; 2 x 28 layers x 4 KV heads x 128 x 4096 x 8 x 2.
    weights, kv = 7.62e9 * 2, 2 * 28 * 4 * 128 * 4096 * 8 * 2
    assert est.parts == {"weights": weights, "KV cache": kv, "reserve": 1e9, "CUDA context": 0.5e9}


def test_int4_with_vllm_is_a_quantised_checkpoint_and_mii_refuses_it() -> None:
    int4 = {f"{W}.model.precision": "int4"}
    assert problems("serve", int4) == []
    found = warnings(config_model(changed("serve", int4)))
    assert f"{W}.model.precision: int4 is sized as int4 weights; vLLM reads the quantisation from " \
           "Qwen/Qwen2.5-7B-Instruct's quantization_config, so it must be a checkpoint quantised that way (AWQ, " \
           "GPTQ); a 16-bit checkpoint would load at 16 bits and not fit" in found
    assert problems("serve", {**MII, **int4}) == [
        f"{W}.model.precision: DeepSpeed-MII (FastGen) serves fp16 or bf16, not int4; the planner can still size int4 "
        "(`make gpus ... MODE=inference PRECISION=int4`), but this server cannot run it; engine vllm (the default) "
        "serves int8/int4 checkpoints"]


def test_the_served_model_is_the_sized_model() -> None:
    # issue 20 item 4: Llama-2-7b-chat (32 KV heads) served under model.name Mistral-7B (8 KV heads).
    token = ("hfToken",)
    found = problems("serve", {f"{W}.serving.model": "meta-llama/Llama-2-7b-chat-hf", f"{W}.model.name": "Mistral-7B",
                               "hfToken": "v1:planted"}, token)
    assert found == [f"{W}.serving.model: meta-llama/Llama-2-7b-chat-hf is Llama-2-7B in data/models.yaml (32 heads, "
                     f"32 KV heads, 32 layers), but {W}.model.name is Mistral-7B (32 heads, 8 KV heads, 32 layers): "
                     f"the planner sized another model. Set {W}.model.name: Llama-2-7B, or leave it out (the shape "
                     f"then comes from {W}.serving.model)"]
    # Without model.name the served id is sized: Qwen2.5-7B's shape from its alias.
    from planner.requests import workload_request

    w = config_model(changed("serve", {f"{W}.model.name": DELETE})).workloads["chat"]
    assert workload_request(w).model.name == "Qwen2.5-7B"
    assert problems("serve", {f"{W}.model.name": DELETE}) == []
    # An id the catalog does not list cannot be sized from itself.
    assert problems("serve", {f"{W}.model.name": DELETE, f"{W}.serving.model": "acme/chat-7b"}) == [
        f"{W}.serving.model: acme/chat-7b is not in data/models.yaml, so the planner cannot size it from its id; set "
        f"{W}.model.name (a listed model of the same shape) or model.parameters"]
    # With model.name it is sized as that, and a warning says the stack could not compare the two.
    assert problems("serve", {f"{W}.serving.model": "acme/chat-7b"}) == []
    assert any(w.startswith(f"{W}.serving.model: acme/chat-7b is not in data/models.yaml")
               for w in warnings(config_model(changed("serve", {f"{W}.serving.model": "acme/chat-7b"}))))


def test_tensor_parallel_must_divide_the_attention_heads() -> None:
    # Qwen2.5-7B has 28 heads and 4 KV heads: 8 L4s (g2-standard-96) do not divide 28 (vLLM refuses to start).
    eight = {"nodePools[0].machineType": "g2-standard-96", "nodePools[0].gpu.count": 8}
    (refusal,) = problems("serve", eight)
    assert refusal == (f"{W}.pool: the server splits Qwen2.5-7B over all 8 GPUs of a node of pool l4 (tensor parallel "
                       "8), and its 28 attention heads do not divide by 8 (vLLM); use a pool with 1, 2 or 4 GPUs per "
                       "node")
    assert problems("serve", {"nodePools[0].machineType": "g2-standard-48", "nodePools[0].gpu.count": 4}) == []


@pytest.mark.parametrize(("change", "message"), [
    ({f"{W}.model": DELETE}, f"{W}.model: a serve workload needs its model block"),
    ({f"{W}.model.mode": "training"}, f"{W}.model.mode: a serve workload is sized"),
    ({f"{W}.serving.modelPath": "models/m"}, f"{W}.serving: set exactly one of model"),
    ({f"{W}.serving.fromWorkload": "tune"}, f"{W}.serving: set exactly one of model"),
    ({f"{W}.workers": 2}, f"{W}.workers: a serve workload runs 2 worker(s) as replicas of the server, not as "
                          f"workers; set {W}.serving.replicas for more servers, or {W}.serving.nodesPerReplica"),
    ({f"{W}.serving.replicas": 3}, f"{W}.serving.replicas: 3 replica(s) need"),
    ({f"{W}.serving.autoscaling": {"enabled": True, "maxReplicas": 5}},
     f"{W}.serving.autoscaling.maxReplicas: 5 replica(s) need"),
    ({f"{W}.serving.openai": {"enabled": True, "port": 9000}}, f"{W}.serving.openai.enabled: vLLM's API on"),
    ({**MII, f"{W}.serving.port": 50050}, f"{W}.serving.port: 50050 is taken by MII's load"),
    ({**MII, f"{W}.serving.port": 28080}, f"{W}.serving.port: 28080 is taken by MII's RESTful gateway"),
    ({**MII, f"{W}.serving.openai": {"enabled": True, "port": 51080}},
     f"{W}.serving.openai.port: 51080 is also serving.port"),
    ({f"{W}.serving.allowFrom": [{"cidr": "0.0.0.0/0"}]},
     f"{W}.serving.allowFrom[0].cidr: 0.0.0.0/0 would admit every address"),
    ({f"{W}.serving.allowFrom": [{}]}, f"{W}.serving.allowFrom[0]: give a cidr"),
    ({f"{W}.serving.allowFrom": [{"cidr": "10.0.0.0/8", "namespace": "apps"}]},
     f"{W}.serving.allowFrom[0]: give either cidr or namespace"),
    ({f"{W}.serving.engine": "tgi"}, f"{W}.serving.engine"),
    ({f"{W}.accelerator.kind": "gaudi"}, f"{W}.accelerator.kind: kind serve runs"),
    ({f"{W}.kind": "helm"}, f"{W}.serving: not a key of kind helm (its keys: accelerator, "
                            "chart, deepspeed, fallbackPool, gcsFuse, image, kind, launch, model, "
                            "namespace, pool, resources, workers); it is a key of kind serve"),
])
def test_serving_rules(change: dict[str, Any], message: str) -> None:
    found = problems("serve", change)
    assert any(p.startswith(message) for p in found), found


def test_model_path_needs_the_bucket_mount() -> None:
    found = problems("serve", {f"{W}.serving.model": DELETE, f"{W}.serving.modelPath": "models/m"})
    assert found == [f"{W}.serving.modelPath: reads the stack's bucket through GCS FUSE; set "
                     f"{W}.gcsFuse.enabled: true (and storage.enabled: true)"]


# --- the MII entry script under a stub of MII -----------------------------------------------------

SERVE_PY = PROJECT_DIR / "recipes" / "serve.py"
# deepspeed-mii 0.3.3's keyword arguments of mii.serve: the fields of mii.config.ModelConfig and MIIConfig (read
# from the wheel's mii/config.py); the real mii.serve raises UnknownArgument for anything else.
MII_MODEL_FIELDS = {"model_name_or_path", "tokenizer", "task", "tensor_parallel", "quantization_mode",
                    "inference_engine_config", "torch_dist_port", "zmq_port_number", "replica_num", "replica_configs",
                    "device_map", "max_length", "sync_debug", "profile_model_time"}
MII_FIELDS = {"deployment_name", "deployment_type", "model_config", "port_number", "enable_restful_api",
              "restful_api_host", "restful_api_port", "restful_processes", "hostfile", "version", "instance_type"}


def load_script(path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(f"script_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def serve_py() -> types.ModuleType:
    return load_script(SERVE_PY)


class FakeClient:
    terminated = False

    def terminate_server(self) -> None:
        self.terminated = True


def fake_mii(calls: list[dict[str, Any]]) -> types.ModuleType:
    mii = types.ModuleType("mii")

    def serve(**kwargs: Any) -> FakeClient:
        unknown = set(kwargs) - MII_MODEL_FIELDS - MII_FIELDS
        if unknown:
            raise TypeError(f"Keyword argument {sorted(unknown)} not recognized")
        calls.append(kwargs)
        return FakeClient()

    mii.serve = serve
    return mii


def fake_torch(gpus: int) -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(device_count=lambda: gpus)
    return torch


def test_entry_script_loads_the_model_the_stack_names(mii: RunResult, serve_py: types.ModuleType,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setitem(sys.modules, "mii", fake_mii(calls))
    monkeypatch.setitem(sys.modules, "torch", fake_torch(1))
    served: list[tuple] = []
    monkeypatch.setattr(serve_py, "api_server", lambda h, host, port, path, gateway: served.append(
        (h, host, port, path, gateway)) or types.SimpleNamespace(shutdown=lambda: None))
    monkeypatch.setattr(serve_py.subprocess, "Popen", lambda cmd: types.SimpleNamespace(poll=lambda: None,
                                                                                        terminate=lambda: None))
    argv = container(mii)["args"][1:]  # what the Deployment passes after the script's path
    stop = threading.Event()
    stop.set()  # SIGTERM as soon as the model is loaded
    assert serve_py.run(serve_py.parse_args(argv), stop) == 0
    (kwargs,) = calls
    # MII's RESTful gateway on loopback only: its GET /terminate must not be reachable (issue 19.9).
    assert kwargs == {
        "model_name_or_path": "Qwen/Qwen2.5-7B-Instruct", "deployment_name": "chat",
        "tensor_parallel": 1, "replica_num": 1, "max_length": 4096,
        "enable_restful_api": True, "restful_api_host": "127.0.0.1", "restful_api_port": 28080,
        "port_number": 50050,
    }
    ((h, host, port, path, gateway),) = served
    assert (host, port, path, gateway) == ("0.0.0.0", 51080, "/mii/chat", 28080)
    assert h.loaded.is_set()


def test_long_sequences_raise_fastgens_context_bound(serve_py: types.ModuleType) -> None:
    # FastGen bounds one sequence by max_context, 8192 by default (deepspeed 0.16.4, DSStateManagerConfig).
    short = serve_py.serve_kwargs(serve_py.parse_args(["--model", "m", "--deployment-name", "d",
                                                       "--max-length", "8192"]))
    assert "inference_engine_config" not in short
    long = serve_py.serve_kwargs(serve_py.parse_args(["--model", "m", "--deployment-name", "d",
                                                      "--max-length", "32768"]))
    assert long["inference_engine_config"] == {"state_manager": {"max_context": 32768}}
    assert long["max_length"] == 32768


def test_entry_script_refuses_too_few_gpus(serve_py: types.ModuleType, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setitem(sys.modules, "mii", fake_mii(calls))
    monkeypatch.setitem(sys.modules, "torch", fake_torch(1))
    args = serve_py.parse_args(["--model", "m", "--deployment-name", "d", "--tensor-parallel", "2"])
    assert serve_py.run(args, threading.Event()) == 2
    assert calls == []
    assert "--tensor-parallel 2 needs 2 GPUs, but this pod sees 1" in capsys.readouterr().out


def test_openai_server_attaches_to_the_running_deployment(serve_py: types.ModuleType) -> None:
    args = serve_py.parse_args(["--model", "org/m", "--deployment-name", "d", "--openai-port", "8000"])
    assert serve_py.openai_command(args)[1:] == [
        "-m", "mii.entrypoints.openai_api_server", "--model", "org/m", "--deployment-name", "d",
        "--load-balancer", "localhost:50050", "--host", "0.0.0.0", "--port", "8000"]


def test_bad_arguments_are_refused(serve_py: types.ModuleType) -> None:
    for argv in (["--deployment-name", "d"], ["--model", "m", "--deployment-name", "d", "--port", "70000"],
                 ["--model", "m", "--deployment-name", "d", "--tensor-parallel", "0"]):
        with pytest.raises(SystemExit):
            serve_py.parse_args(argv)


def _status(url: str, data: bytes | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


class FakeGateway(http.server.BaseHTTPRequestHandler):
    """MII's RESTful gateway as restful_gateway.py serves it: POST /mii/<name>, GET /healthz, GET /terminate."""

    seen: ClassVar[list[tuple[str, str, bytes]]] = []

    def do_GET(self) -> None:
        self.seen.append(("GET", self.path, b""))
        body = b"ok" if self.path == "/healthz" else b"Shutting down RESTful API gateway server"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.seen.append(("POST", self.path, body))
        reply = json.dumps([{"generated_text": "pong"}]).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:
        return


def test_the_served_port_forwards_prompts_answers_health_and_hides_terminate(serve_py: types.ModuleType) -> None:
    gateway = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeGateway)
    threading.Thread(target=gateway.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
    gateway_port = gateway.server_address[1]
    models_up = {"value": True}
    health = serve_py.Health(gateway_port, [50050, 50051], port_check=lambda port: models_up["value"])
    server = serve_py.api_server(health, "127.0.0.1", 0, "/mii/chat", gateway_port)  # port 0: any free port
    base = f"http://127.0.0.1:{server.server_address[1]}"
    FakeGateway.seen = []
    try:
        assert _status(f"{base}/health")[0] == 503  # loading
        health.loaded.set()
        assert _status(f"{base}/health") == (200, b"ok\n")
        models_up["value"] = False  # a model process went away: the probes fail
        assert _status(f"{base}/health") == (503, b"MII's model processes on ports [50050, 50051] do not answer\n")
        models_up["value"] = True
        body = json.dumps({"prompts": ["ping"], "max_new_tokens": 8}).encode()
        assert _status(f"{base}/mii/chat", body) == (200, json.dumps([{"generated_text": "pong"}]).encode())
        # Whoever the NetworkPolicy admits reaches the served port, never MII's /terminate.
        assert _status(f"{base}/terminate")[0] == 404
        assert _status(f"{base}/mii/other", body)[0] == 404
        assert ("GET", "/terminate", b"") not in FakeGateway.seen
        assert ("POST", "/mii/chat", body) in FakeGateway.seen
        gateway.shutdown()
        gateway.server_close()  # the gateway went away
        assert _status(f"{base}/health") == (503, b"MII's RESTful gateway does not answer\n")
    finally:
        server.shutdown()
        server.server_close()


# --- send_prompt.py: the documented way to send one prompt ----------------------------------------

SEND_PROMPT = PROJECT_DIR / "recipes" / "send_prompt.py"


@pytest.fixture(scope="module")
def send_prompt() -> types.ModuleType:
    return load_script(SEND_PROMPT)


def test_send_prompt_builds_mii_rest_requests(send_prompt: types.ModuleType, mii: RunResult) -> None:
    args = send_prompt.parse_args(["--deployment", "chat", "What is DeepSpeed?"])
    request = send_prompt.build_request(args)
    # The port-forward of the stack's output, and MII's RESTful path for the deployment the server was given.
    forwarded = mii.outputs["servingEndpoints"]["chat"]["portForward"].rsplit(":", 1)[1]
    assert request.full_url == f"http://localhost:{forwarded}/mii/chat"
    assert request.get_method() == "POST"
    assert request.get_header("Content-type") == "application/json"
    assert json.loads(request.data) == {"prompts": ["What is DeepSpeed?"], "max_new_tokens": 128}
    args = send_prompt.parse_args(["--url", "http://10.0.0.7:51080/", "--deployment", "d", "--max-new-tokens", "16",
                                   "hi"])
    request = send_prompt.build_request(args)
    assert request.full_url == "http://10.0.0.7:51080/mii/d"
    assert json.loads(request.data)["max_new_tokens"] == 16


def test_send_prompt_builds_openai_requests(send_prompt: types.ModuleType, serve: RunResult) -> None:
    # The stack's own prompt command for its vLLM server, as the preview prints it.
    argv = shlex.split(serve.outputs["servingEndpoints"]["chat"]["prompt"])[3:]  # python -m recipes.send_prompt
    assert argv == ["--openai", "--url", "http://localhost:8000", "--model", "Qwen/Qwen2.5-7B-Instruct",
                    "What is DeepSpeed?"]
    args = send_prompt.parse_args(["--openai", "--url", "http://localhost:8000", "--model",
                                   "Qwen/Qwen2.5-7B-Instruct", "Hello"])
    request = send_prompt.build_request(args)
    assert request.full_url == "http://localhost:8000/v1/completions"
    assert json.loads(request.data) == {"model": "Qwen/Qwen2.5-7B-Instruct", "prompt": "Hello",
                                        "max_tokens": 128}


@pytest.mark.parametrize("argv", [
    ["hi"],  # no deployment
    ["--openai", "hi"],  # no model for the OpenAI server
    ["--deployment", "d", "--max-new-tokens", "0", "hi"],
    ["--deployment", "d"],  # no prompt
])
def test_send_prompt_refuses_incomplete_arguments(send_prompt: types.ModuleType, argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        send_prompt.parse_args(argv)


def test_send_prompt_reads_both_replies(send_prompt: types.ModuleType) -> None:
    # deepspeed-mii 0.3.3: the RESTful gateway answers [Response.to_msg_dict()]; the OpenAI server a completion.
    mii_reply = [{"generated_text": "DeepSpeed is", "prompt_length": 5, "generated_length": 3,
                  "finish_reason": "length"}]
    assert send_prompt.reply_text(False, mii_reply) == "DeepSpeed is"
    assert send_prompt.reply_text(True, {"choices": [{"index": 0, "text": " a library"}]}) == " a library"


def test_send_prompt_round_trip_on_loopback(send_prompt: types.ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[tuple[str, Any]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, body))
            reply = json.dumps([{"generated_text": "pong"}]).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: Any) -> None:
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert send_prompt.main(["--url", url, "--deployment", "chat", "ping"]) == 0
    finally:
        server.shutdown()
        server.server_close()
    assert seen == [("/mii/chat", {"prompts": ["ping"], "max_new_tokens": 128})]
    assert capsys.readouterr().out == "pong\n"


# --- the preview summary --------------------------------------------------------------------------

def test_preview_lists_the_server_with_its_cost_and_the_prompt_command(serve: RunResult) -> None:
    from preview import summary
    from preview.sections import serving

    (w,) = summary.workloads(serve)
    assert (w.name, w.kind, w.namespace, w.runs_on, w.accelerators, w.workers) == (
        "chat", "vLLM server (Deployment)", "serving", "pool l4 (nvidia-l4)", "nvidia.com/gpu x 1", 1)
    ((title, body),) = serving.section(serve)
    assert title == "Serving"
    node = catalog.load().shape("nvidia-l4", "g2-standard-8", 1).price.on_demand  # the pool is on-demand
    assert (f"| chat | Qwen/Qwen2.5-7B-Instruct | none | 1 | 1 | Service "
            f"`http://chat.serving.svc.cluster.local:8000/v1` (in the cluster) | ${node:.2f} (pool l4) | ${node:.2f} | "
            f"${node * 730:,.2f} |") in body
    assert "priced as the pool pays (on demand or spot) from data/gpu_catalog.yaml (" in body
    assert "kubectl -n serving port-forward svc/chat 8000:8000 &" in body
    assert ('python -m recipes.send_prompt --openai --url http://localhost:8000 --model '
            'Qwen/Qwen2.5-7B-Instruct "What is DeepSpeed?"') in body


def test_sequence_length_above_the_models_positions_is_refused() -> None:
    # issue 42 item 5: Llama-3.1-8B has 131,072 positions (config.json max_position_embeddings); vLLM refuses
    # --max-model-len 140000 at start, so the preview refuses it, and recommends no GPUs for a server that won't start.
    llama = {f"{W}.serving.model": "meta-llama/Llama-3.1-8B-Instruct", f"{W}.model.name": "Llama-3.1-8B",
             "hfToken": "v1:planted"}
    token = ("hfToken",)
    assert problems("serve", {**llama, f"{W}.model.sequenceLength": 140000}, token) == [
        f"{W}.model.sequenceLength: 140,000 tokens, but Llama-3.1-8B has 131,072 positions (config.json "
        "max_position_embeddings, data/models.yaml), and vLLM refuses a --max-model-len above it at start; set at "
        "most 131072"]
    # Meta-Llama-3-8B (the same shape, before 3.1) has its own config's 8,192.
    three = {**llama, f"{W}.serving.model": "meta-llama/Meta-Llama-3-8B-Instruct", f"{W}.model.sequenceLength": 8193}
    assert problems("serve", three, token)[0].startswith(
        f"{W}.model.sequenceLength: 8,193 tokens, but meta-llama/Meta-Llama-3-8B-Instruct has 8,192 positions")
    # Qwen2.5-7B-Instruct's config says 32,768 (its base model 131,072): 32768 passes, 32769 does not.
    assert not any("positions" in p for p in problems("serve", {f"{W}.model.sequenceLength": 32768}))
    assert problems("serve", {f"{W}.model.sequenceLength": 32769})[0].startswith(
        f"{W}.model.sequenceLength: 32,769 tokens, but Qwen/Qwen2.5-7B-Instruct has 32,768 positions")
    # A model the catalog does not list is not checked (it is sized as model.name's shape, with no limit known).
    unlisted = {f"{W}.serving.model": "acme/chat-7b", f"{W}.model.name": DELETE, f"{W}.model.parameters": 7,
                f"{W}.model.sequenceLength": 200000, f"{W}.model.batchSize": 1}
    assert not any("positions" in p for p in problems("serve", unlisted))


@pytest.mark.parametrize(("change", "strategy", "warned"), [
    # The example: one replica, maxNodes 2: the surge pod has a node; nothing to warn.
    ({}, {"maxSurge": 1, "maxUnavailable": 0}, None),
    # One replica on a pool of one node: never taken down first; the new pod waits for a node, and the preview
    # says what one g2-standard-8 more costs (data/gpu_catalog.yaml: $0.85/h on demand).
    ({"nodePools[0].maxNodes": 1}, {"maxSurge": 1, "maxUnavailable": 0},
     f"nodePools[0].maxNodes: 1 node(s) of pool l4, all for chat's 1 replica(s): no node for the surge pod a rollout "
     f"starts first; {W}.serving.replicas is 1 and a rollout never takes it down first (maxUnavailable 0): a new "
     "model, image or setting waits, its pod Pending and the old one serving, and `pulumi up` fails waiting for the "
     "Deployment. Raise maxNodes to 2 (one g2-standard-8 node more, $0.85/h on demand, only while a rollout runs: "
     "the autoscaler removes it after)"),
    # Two replicas on two nodes: one at a time, the other serving.
    ({f"{W}.serving.replicas": 2}, {"maxSurge": 0, "maxUnavailable": 1},
     "nodePools[0].maxNodes: 2 node(s) of pool l4, all for chat's 2 replica(s): no node for the surge pod a rollout "
     "starts first; a rollout replaces chat's replicas one at a time, one fewer serving meanwhile. Raise maxNodes "
     "to 3 (one g2-standard-8 node more, $0.85/h on demand, only while a rollout runs: the autoscaler removes it "
     "after)"),
    # The autoscaler may be at its 1 replica when a rollout starts: the same, said so.
    ({f"{W}.serving.autoscaling": {"enabled": True, "maxReplicas": 2}}, {"maxSurge": 1, "maxUnavailable": 0},
     f"nodePools[0].maxNodes: 2 node(s) of pool l4, all for chat's 2 replica(s): no node for the surge pod a rollout "
     f"starts first; {W}.serving.replicas (the autoscaler's fewest) is 1 and a rollout never takes it down first "
     "(maxUnavailable 0): a new model, image or setting waits, its pod Pending and the old one serving, and `pulumi "
     "up` fails waiting for the Deployment. Raise maxNodes to 3 (one g2-standard-8 node more, $0.85/h on demand, "
     "only while a rollout runs: the autoscaler removes it after)"),
])
def test_a_rollout_never_leaves_zero_ready_replicas(change: dict[str, Any], strategy: dict[str, int],
                                                    warned: str | None) -> None:
    # issue 42 item 5: a one-replica server was replaced in place (maxSurge 0, maxUnavailable 1) on a full pool.
    run = engine.run_program(*engine.engine_config_from_yaml(changed("serve", change)), stack="serve")
    spec = run.one(DEPLOYMENT).inputs["spec"]
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": strategy}
    found = [w for w in warnings(config_model(changed("serve", change))) if "surge pod" in w]
    assert found == ([warned] if warned else [])
