"""`serve` workloads: the DeepSpeed-MII server's Kubernetes objects under mocks, its rules, and its entry script
run against a stub of MII."""

from __future__ import annotations

import http.server
import importlib.util
import json
import re
import sys
import threading
import types
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from conftest import DELETE, PROJECT_DIR, changed, problems, stack_run

from model import catalog
from preview import engine, manifests
from preview.engine import RunResult

K8S_VERSION = "1.33.0"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
SERVICE = "kubernetes:core/v1:Service"
PDB = "kubernetes:policy/v1:PodDisruptionBudget"
NETPOL = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
HPA = "kubernetes:autoscaling/v2:HorizontalPodAutoscaler"
SECRET = "kubernetes:core/v1:Secret"
CANARY = "hf_serving_canary_token"
# The variant: autoscaling, an internal load balancer, the OpenAI server, the model from the bucket, a token.
VARIANT = {
    "workloads.chat.serving.model": DELETE,
    "workloads.chat.serving.modelPath": "models/Qwen2.5-7B-Instruct",
    "workloads.chat.gcsFuse.enabled": True,
    "storage.enabled": True,
    "workloads.chat.serving.autoscaling": {"enabled": True, "maxReplicas": 2, "cpuUtilization": 70},
    "workloads.chat.serving.service": "InternalLoadBalancer",
    "workloads.chat.serving.openai": {"enabled": True, "port": 8000},
    "workloads.chat.serving.allowFrom": [{"cidr": "10.0.0.0/8"}, {"namespace": "apps", "podLabels": {"app": "ui"}}],
}


@pytest.fixture(scope="module")
def serve() -> RunResult:
    return stack_run("serve")


@pytest.fixture(scope="module")
def variant() -> RunResult:
    values, secret_keys = engine.engine_config_from_yaml(changed("serve", VARIANT))
    values["deepspeed-stack:hfToken"] = CANARY
    return engine.run_program(values, [*secret_keys, "deepspeed-stack:hfToken"], stack="serve")


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

def test_every_server_object_is_a_valid_kubernetes_object(serve: RunResult, variant: RunResult) -> None:
    kinds = set()
    for run in (serve, variant):
        for doc in server_objects(run):
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
            kinds.add(doc["kind"])
    assert kinds == {"Namespace", "ConfigMap", "Secret", "ServiceAccount", "Deployment", "Service",
                     "PodDisruptionBudget", "NetworkPolicy", "HorizontalPodAutoscaler"}


def test_deployment_runs_the_entry_script_with_the_stack_values(serve: RunResult) -> None:
    c = container(serve)
    # The stack's image in its Artifact Registry (Pulumi.serve.yaml: gcp:project, gcp:region, registry.name), by
    # digest; the same the stack exports.
    assert re.fullmatch(r"us-central1-docker\.pkg\.dev/my-gcp-project/deepspeed/deepspeed@sha256:[0-9a-f]{64}",
                        c["image"]), c["image"]
    assert c["image"] == serve.outputs["imageRef"]
    assert c["command"] == ["python"]
    assert c["args"] == ["/app/serve.py", "--model", "Qwen/Qwen2.5-7B-Instruct", "--deployment-name",
                         "chat", "--tensor-parallel", "1", "--port", "51080", "--health-port", "8081",
                         "--max-length", "4096"]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod(serve)["spec"]["volumes"]}
    assert volumes[mounts["/app"]]["configMap"]["name"] == "chat-server"
    cm = serve.one("kubernetes:core/v1:ConfigMap", "chat-server").inputs["data"]
    assert cm["serve.py"] == (PROJECT_DIR / "workloads" / "scripts" / "serve.py").read_text(encoding="utf-8")


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


def test_probes_wait_for_the_model(serve: RunResult) -> None:
    c = container(serve)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": 51080, "health": 8081}
    assert c["startupProbe"]["httpGet"] == {"path": "/ready", "port": "health", "scheme": "HTTP"}
    # startupMinutes 45 at one probe every 10 s.
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] == 45 * 60
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/live"
    # The rollout may take longer than the pod may take to start (a new GPU node comes first).
    assert serve.one(DEPLOYMENT).inputs["spec"]["progressDeadlineSeconds"] > 45 * 60


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
    assert svc["spec"]["ports"] == [{"name": "http", "port": 51080, "targetPort": "http", "protocol": "TCP"}]
    pdb = serve.one(PDB).inputs["spec"]
    assert pdb == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}
    np = serve.one(NETPOL).inputs["spec"]
    assert np["podSelector"] == {"matchLabels": selector}
    assert np["policyTypes"] == ["Ingress"]
    assert np["ingress"] == [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}}],
                              "ports": [{"port": 51080, "protocol": "TCP"}]}]
    assert serve.by_type(HPA) == []


def test_no_sources_admit_nobody_and_a_protected_cluster_protects_the_server() -> None:
    run = engine.run_program(*engine.engine_config_from_yaml(changed("serve", {
        "workloads.chat.serving.allowFrom": [], "cluster.deletionProtection": True})), stack="serve")
    assert run.one(NETPOL).inputs["spec"].get("ingress", []) == []
    assert run.one(DEPLOYMENT).protect and run.one(SERVICE).protect
    assert not run.one(PDB).protect  # a budget holds nothing


def test_endpoint_in_the_outputs(serve: RunResult) -> None:
    assert serve.outputs["servingEndpoints"] == {"chat": {
        "endpoint": "http://chat.serving.svc.cluster.local:51080/mii/chat",
        "portForward": "kubectl -n serving port-forward svc/chat 51080:51080"}}
    assert serve.outputs["workloads"]["chat"]["kind"] == "serve"


def test_server_waits_for_its_pool_and_the_image_grant(serve: RunResult) -> None:
    server = serve.one("deepspeed-stack:workloads:ModelServer")
    pool = serve.one("gcp:container/nodePool:NodePool", "l4")
    grant = serve.one("gcp:artifactregistry/repositoryIamMember:RepositoryIamMember")
    assert set(server.dependencies) == {pool.urn, grant.urn}
    deployment = serve.one(DEPLOYMENT)
    assert pool.urn in deployment.dependencies
    # The Service and the budget need no GPU node.
    assert pool.urn not in serve.one(SERVICE).dependencies


def test_variant_autoscaler_load_balancer_openai_bucket_and_token(variant: RunResult) -> None:
    spec = variant.one(DEPLOYMENT).inputs["spec"]
    assert "replicas" not in spec  # the autoscaler owns the count
    hpa = variant.one(HPA).inputs["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (1, 2)
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "chat"}
    assert hpa["metrics"][0]["resource"]["target"] == {"type": "Utilization", "averageUtilization": 70}
    # maxReplicas 2 takes both nodes of the pool: no node to surge onto.
    assert spec["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    svc = variant.one(SERVICE).inputs
    assert svc["spec"]["type"] == "LoadBalancer"
    assert svc["metadata"]["annotations"] == {"networking.gke.io/load-balancer-type": "Internal"}
    assert svc["spec"]["externalTrafficPolicy"] == "Local"
    assert [p["port"] for p in svc["spec"]["ports"]] == [51080, 8000]
    c = container(variant)
    args = c["args"]
    assert args[args.index("--model") + 1] == "/gcs/models/Qwen2.5-7B-Instruct"
    assert args[args.index("--openai-port") + 1] == "8000"
    p = spec["template"]["spec"]
    gcs = next(v for v in p["volumes"] if "csi" in v)
    assert gcs["csi"]["readOnly"] is True
    assert next(m for m in c["volumeMounts"] if m["name"] == gcs["name"])["readOnly"] is True
    assert p["serviceAccountName"] == "deepspeed-data"
    assert spec["template"]["metadata"]["annotations"]["gke-gcsfuse/volumes"] == "true"
    # The token: a Secret (kept secret), mounted as a file; only its path is in the environment.
    secret = variant.one(SECRET)
    assert "stringData" in secret.secret_paths or any(s.startswith("stringData") for s in secret.secret_paths)
    assert c["env"] == [{"name": "HF_TOKEN_PATH", "value": "/etc/huggingface/token"}]
    assert CANARY not in repr(variant.one(DEPLOYMENT).inputs)
    ingress = variant.one(NETPOL).inputs["spec"]["ingress"]
    assert ingress[0]["from"] == [{"ipBlock": {"cidr": "10.0.0.0/8"}},
                                  {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}},
                                   "podSelector": {"matchLabels": {"app": "ui"}}}]
    assert ingress[0]["ports"] == [{"port": 51080, "protocol": "TCP"}, {"port": 8000, "protocol": "TCP"}]


# --- the catalog fact and the rules ---------------------------------------------------------------

def test_compute_capabilities_in_the_catalog() -> None:
    # developer.nvidia.com/cuda-gpus: T4 7.5, V100 7.0, P100 6.0, L4 8.9, A100 8.0, H100 9.0.
    gpus = catalog.load().gpus
    assert {g: gpus[g].compute_capability for g in ("nvidia-tesla-t4", "nvidia-tesla-v100", "nvidia-tesla-p100",
                                                     "nvidia-l4", "nvidia-tesla-a100", "nvidia-h100-80gb")} == {
        "nvidia-tesla-t4": (7, 5), "nvidia-tesla-v100": (7, 0), "nvidia-tesla-p100": (6, 0),
        "nvidia-l4": (8, 9), "nvidia-tesla-a100": (8, 0), "nvidia-h100-80gb": (9, 0)}
    assert all(g.compute_capability != (0, 0) for g in gpus.values())


def test_mii_facts_and_their_copies_agree(serve_py: types.ModuleType) -> None:
    # data/serving.yaml (deepspeed-mii 0.3.3 and deepspeed 0.16.4, sources there) is the one place for these facts;
    # the image's pin and the entry script, which runs in the pod without data/, must say the same.
    import re

    from model.yamlio import load_yaml
    from workloads.serving import mii_facts

    raw = load_yaml(PROJECT_DIR / "data" / "serving.yaml")
    facts = mii_facts()
    assert (facts.version, facts.min_compute_capability, facts.precisions) == ("0.3.3", (8, 0), ("fp16", "bf16"))
    dockerfile = (PROJECT_DIR / "workloads" / "images" / "deepspeed" / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^ARG DEEPSPEED_MII_VERSION=(\S+)$", dockerfile, re.M).group(1) == facts.version
    assert serve_py.MII_LOAD_BALANCER_PORT == facts.load_balancer_port == 50050
    assert serve_py.FASTGEN_MAX_CONTEXT == raw["fastgenMaxContext"] == 8192


def test_serve_stack_is_valid() -> None:
    assert problems("serve", {}) == []


@pytest.mark.parametrize(("gpu", "machine", "zone", "capability"), [
    ("nvidia-tesla-t4", "n1-standard-8", "us-central1-b", "7.5"),
    ("nvidia-tesla-v100", "n1-standard-8", "us-central1-b", "7.0"),
    ("nvidia-tesla-p100", "n1-standard-8", "us-central1-c", "6.0"),
])
def test_pre_ampere_gpus_are_refused(gpu: str, machine: str, zone: str, capability: str) -> None:
    found = problems("serve", {"nodePools[0].gpu.type": gpu, "nodePools[0].machineType": machine,
                               "nodePools[0].zones": [zone]})
    (refusal,) = [p for p in found if p.startswith("workloads.chat.pool:")]
    assert f"compute capability {capability}" in refusal and "8.0 or newer" in refusal
    assert "gpu.type nvidia-l4" in refusal  # the cheapest Ampere+ GPU of us-central1, as the alternative


def test_a_model_that_cannot_fit_is_refused_with_numbers_and_what_fits() -> None:
    found = problems("serve", {"workloads.chat.model.name": "Llama-3.1-70B"})
    (refusal,) = found
    # 70.55B parameters x 2 bytes (bf16) = 141.1 GB of weights on one 24 GB L4.
    assert refusal.startswith("workloads.chat.model: Llama-3.1-70B")
    assert "weights 141.1" in refusal and "24 GB" in refusal
    # 141.1 GB / 8 = 17.6 GB of weights per GPU: eight L4s of one g2-standard-96 hold it.
    assert "8 x L4 (g2-standard-96" in refusal


def test_int4_is_refused_for_serving_but_sized_by_the_planner() -> None:
    found = problems("serve", {"workloads.chat.model.precision": "int4"})
    assert found == ["workloads.chat.model.precision: DeepSpeed-MII (FastGen) serves 16-bit weights (fp16 or "
                     "bf16), not int4; the planner can still size int4 (`make gpus ... MODE=inference "
                     "PRECISION=int4`), but this server cannot run it"]


@pytest.mark.parametrize(("change", "message"), [
    ({"workloads.chat.model": DELETE}, "workloads.chat.model: a serve workload needs its model block"),
    ({"workloads.chat.model.mode": "training"}, "workloads.chat.model.mode: a serve workload is sized"),
    ({"workloads.chat.serving.modelPath": "models/m"}, "workloads.chat.serving: set exactly one of model"),
    ({"workloads.chat.workers": 2}, "workloads.chat.workers: a serve workload runs one pod per replica"),
    ({"workloads.chat.serving.replicas": 3}, "workloads.chat.serving.replicas: 3 replica(s) need"),
    ({"workloads.chat.serving.autoscaling": {"enabled": True, "maxReplicas": 5}},
     "workloads.chat.serving.autoscaling.maxReplicas: 5 replica(s) need"),
    ({"workloads.chat.serving.port": 50050}, "workloads.chat.serving.port: 50050 is taken by MII's load"),
    ({"workloads.chat.serving.openai": {"enabled": True, "port": 51080}},
     "workloads.chat.serving.openai.port: 51080 is also serving.port"),
    ({"workloads.chat.serving.allowFrom": [{"cidr": "0.0.0.0/0"}]},
     "workloads.chat.serving.allowFrom[0].cidr: 0.0.0.0/0 would admit every address"),
    ({"workloads.chat.serving.allowFrom": [{}]}, "workloads.chat.serving.allowFrom[0]: give a cidr"),
    ({"workloads.chat.serving.allowFrom": [{"cidr": "10.0.0.0/8", "namespace": "apps"}]},
     "workloads.chat.serving.allowFrom[0]: give either cidr or namespace"),
    ({"workloads.chat.accelerator.kind": "gaudi"}, "workloads.chat.accelerator.kind: kind serve runs"),
    ({"workloads.chat.kind": "helm"}, "workloads.chat.serving: not a key of kind helm (its keys: accelerator, "
                                         "chart, deepspeed, fallbackPool, gcsFuse, image, kind, launch, model, "
                                         "namespace, pool, resources, workers); it is a key of kind serve"),
])
def test_serving_rules(change: dict[str, Any], message: str) -> None:
    found = problems("serve", change)
    assert any(p.startswith(message) for p in found), found


def test_model_path_needs_the_bucket_mount() -> None:
    found = problems("serve", {"workloads.chat.serving.model": DELETE,
                               "workloads.chat.serving.modelPath": "models/m"})
    assert found == ["workloads.chat.serving.modelPath: reads the stack's bucket through GCS FUSE; set "
                     "workloads.chat.gcsFuse.enabled: true (and storage.enabled: true)"]


# --- the entry script under a stub of MII ---------------------------------------------------------

SERVE_PY = PROJECT_DIR / "workloads" / "scripts" / "serve.py"
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


def test_entry_script_loads_the_model_the_stack_names(serve: RunResult, serve_py: types.ModuleType,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setitem(sys.modules, "mii", fake_mii(calls))
    monkeypatch.setitem(sys.modules, "torch", fake_torch(1))
    health: list[tuple] = []
    monkeypatch.setattr(serve_py, "health_server", lambda h, host, port: health.append((h, host, port)) or
                        types.SimpleNamespace(shutdown=lambda: None))
    argv = container(serve)["args"][1:]  # what the Deployment passes after the script's path
    stop = threading.Event()
    stop.set()  # SIGTERM as soon as the model is loaded
    assert serve_py.run(serve_py.parse_args(argv), stop) == 0
    (kwargs,) = calls
    assert kwargs == {
        "model_name_or_path": "Qwen/Qwen2.5-7B-Instruct", "deployment_name": "chat",
        "tensor_parallel": 1, "replica_num": 1, "max_length": 4096,
        "enable_restful_api": True, "restful_api_host": "0.0.0.0", "restful_api_port": 51080,
        "port_number": 50050,
    }
    ((h, host, port),) = health
    assert (host, port) == ("0.0.0.0", 8081)
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


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def test_health_endpoints(serve_py: types.ModuleType) -> None:
    balancer_up = {"value": True}
    health = serve_py.Health(50050, port_check=lambda port: balancer_up["value"])
    server = serve_py.health_server(health, "127.0.0.1", 0)  # port 0: any free port, never a fixed one
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert (_status(f"{base}/ready"), _status(f"{base}/live")) == (503, 200)  # loading
        health.loaded.set()
        assert (_status(f"{base}/ready"), _status(f"{base}/live")) == (200, 200)
        balancer_up["value"] = False  # MII went away
        assert (_status(f"{base}/ready"), _status(f"{base}/live")) == (503, 503)
        assert _status(f"{base}/other") == 404
    finally:
        server.shutdown()
        server.server_close()


# --- send_prompt.py: the documented way to send one prompt ----------------------------------------

SEND_PROMPT = PROJECT_DIR / "workloads" / "scripts" / "send_prompt.py"


@pytest.fixture(scope="module")
def send_prompt() -> types.ModuleType:
    return load_script(SEND_PROMPT)


def test_send_prompt_builds_mii_rest_requests(send_prompt: types.ModuleType, serve: RunResult) -> None:
    args = send_prompt.parse_args(["--deployment", "chat", "What is DeepSpeed?"])
    request = send_prompt.build_request(args)
    # The port-forward of the stack's output, and MII's RESTful path for the deployment the server was given.
    forwarded = serve.outputs["servingEndpoints"]["chat"]["portForward"].rsplit(":", 1)[1]
    assert request.full_url == f"http://localhost:{forwarded}/mii/chat"
    assert request.get_method() == "POST"
    assert request.get_header("Content-type") == "application/json"
    assert json.loads(request.data) == {"prompts": ["What is DeepSpeed?"], "max_new_tokens": 128}
    args = send_prompt.parse_args(["--url", "http://10.0.0.7:51080/", "--deployment", "d", "--max-new-tokens", "16",
                                   "hi"])
    request = send_prompt.build_request(args)
    assert request.full_url == "http://10.0.0.7:51080/mii/d"
    assert json.loads(request.data)["max_new_tokens"] == 16


def test_send_prompt_builds_openai_requests(send_prompt: types.ModuleType) -> None:
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
    assert (w.name, w.namespace, w.runs_on, w.accelerators, w.workers) == (
        "chat", "serving", "pool l4 (nvidia-l4)", "nvidia.com/gpu x 1", 1)
    ((title, body),) = serving.section(serve)
    assert title == "Serving"
    node = catalog.load().shape("nvidia-l4", "g2-standard-8", 1).price.on_demand  # the pool is on-demand
    assert f"| chat | Qwen/Qwen2.5-7B-Instruct | 1 | 1 | ${node:.2f} (pool l4) |" in body
    assert "kubectl -n serving port-forward svc/chat 51080:51080 &" in body
    assert 'python workloads/scripts/send_prompt.py --deployment chat "What is DeepSpeed?"' in body
