"""DeepSpeedRelease under mocks: the Helm release, its values (checked against the chart), the source
ConfigMap, the token Secret, the dependencies, and the helm workload config rules."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from conftest import (
    DELETE,
    PROJECT_DIR,
    load_stack_config,
    problems,
    reference,
    run_stack,
    set_path,
    stack_yaml,
    validate_json,
    yaml_load,
)

from checks import ConfigError, load
from preview import engine
from preview.engine import RunResult, engine_config_from_yaml

RELEASE = "kubernetes:helm.sh/v3:Release"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
SECRET = "kubernetes:core/v1:Secret"
NAMESPACE = "kubernetes:core/v1:Namespace"
COMPONENT = "deepspeed-stack:workloads:DeepSpeedRelease"
NODE_POOL = "gcp:container/nodePool:NodePool"
CANARY = "hf_canary_token_do_not_leak_0123456789"
# n1-standard-8 (8 vCPU, 30 GB) minus GKE's reservations and 1 CPU / 1.5 GiB for DaemonSets, by hand:
# CPU 8 - (0.06 + 0.01 + 2 x 0.005 + 4 x 0.0025) - 1 = 6.91 -> 6; memory 30 - (1 + 0.8 + 0.8 + 0.84 + 0.1) - 1.5
# = 24.96 -> 24Gi.
T4_WORKER = {"nvidia.com/gpu": "1", "cpu": "6", "memory": "24Gi"}


def values(run: RunResult) -> dict[str, Any]:
    return run.one(RELEASE).inputs["values"]




@pytest.fixture(scope="module")
def two_pools_with_token() -> RunResult:
    """prod with a second (spot) L4 pool and an HF token that is a plain string marked secret, as the engine
    hands a decrypted `--secret` value to the program."""
    config, secret_keys = load_stack_config("prod")
    pools = stack_yaml("prod")["deepspeed-stack:nodePools"]
    extra, _ = engine_config_from_yaml({"deepspeed-stack:nodePools": [*pools, {**pools[0], "name": "l4-spot",
                                                                                "spot": True}]})
    config.update(extra)
    config["deepspeed-stack:hfToken"] = CANARY
    return engine.run_program(config, [*secret_keys, "deepspeed-stack:hfToken"], stack="prod")


# --- The release ----------------------------------------------------------------------------------

def test_release_is_the_pinned_oci_chart(dev: RunResult) -> None:
    rel = dev.one(RELEASE).inputs
    chart = yaml.safe_load(reference("bitnami-deepspeed", "Chart.yaml").read_text())
    assert rel["chart"] == "oci://registry-1.docker.io/bitnamicharts/deepspeed"
    assert rel["version"] == chart["version"] == "2.3.51"
    assert "repositoryOpts" not in rel  # an OCI chart is addressed by its oci:// reference alone
    assert (rel["name"], rel["namespace"]) == ("smoke", "deepspeed-smoke")
    assert (rel["atomic"], rel["cleanupOnFail"], rel["skipAwait"], rel["waitForJobs"]) == (True, True, False, False)
    assert rel["timeout"] >= 900  # GPU nodes scale from zero


def test_namespace_is_created_by_the_component(dev: RunResult) -> None:
    ns = dev.one(NAMESPACE)
    assert ns.inputs["metadata"]["name"] == "deepspeed-smoke"
    assert ns.parent == dev.one(COMPONENT).urn


def test_image_is_the_stack_image_pinned_by_digest(dev: RunResult) -> None:
    image = values(dev)["image"]
    assert image["registry"] == "us-west1-docker.pkg.dev"
    assert image["repository"] == "my-gcp-project/deepspeed/deepspeed"
    assert image["digest"].startswith("sha256:") and len(image["digest"]) == len("sha256:") + 64
    assert f"{image['registry']}/{image['repository']}@{image['digest']}" == dev.outputs["imageRef"]
    assert "tag" not in image
    assert values(dev)["global"]["security"]["allowInsecureImages"] is True


def test_no_chart_default_image_is_used(dev: RunResult) -> None:
    """Every image values.yaml defaults to docker.io/bitnami is either replaced or never rendered."""
    ref = yaml_load(reference("bitnami-deepspeed", "values.yaml").read_text())

    def images(node: Any, path: str = "") -> list[str]:
        if not isinstance(node, dict):
            return []
        found = [path] if node.get("registry") == "docker.io" else []
        return found + [p for k, v in node.items() for p in images(v, f"{path}.{k}" if path else k)]

    # A chart bump that adds an image fails here until the stack handles it.
    assert sorted(images(ref)) == ["gitImage", "image", "volumePermissions.image"]
    v = values(dev)
    assert v["image"]["registry"] != "docker.io"
    assert v["source"]["type"] == "configmap"  # gitImage only runs for source.type git
    assert v["volumePermissions"]["enabled"] is False  # os-shell only runs for volumePermissions


def test_client_runs_on_the_system_pool_without_a_gpu(dev: RunResult) -> None:
    # issue 19.10: the client only launches the job; on a GPU pool it held a whole GPU node (an A3: 8 idle GPUs).
    client = values(dev)["client"]
    assert client["resources"] == {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}}
    # components/gke_cluster.py labels the system pool's nodes so; GPU pools are tainted nvidia.com/gpu.
    assert client["nodeSelector"] == {"deepspeed-stack/pool": "system"}
    assert client["tolerations"] == [] and "affinity" not in client


def test_client_gpu_keeps_the_client_on_the_workers_pool() -> None:
    run = run_stack("dev", {"deepspeed-stack:workloads": {"smoke": {
        **stack_yaml("dev")["deepspeed-stack:workloads"]["smoke"], "chart": {"version": "2.3.51", "clientGpu": True}}}})
    v = values(run)
    assert v["client"]["resources"] == v["worker"]["resources"] == {"requests": T4_WORKER, "limits": T4_WORKER}
    assert v["client"]["nodeSelector"] == v["worker"]["nodeSelector"]
    assert v["client"]["tolerations"] == v["worker"]["tolerations"]


def test_the_client_needs_a_gpu_node_only_with_client_gpu() -> None:
    from conftest import model

    assert model("dev").workloads["smoke"].nodes_needed() == (2, "2 worker(s)")
    with_gpu = model("dev", {"workloads.smoke.chart.clientGpu": True}).workloads["smoke"]
    assert with_gpu.nodes_needed() == (3, "2 worker(s) + 1 client (chart.clientGpu)")
    assert problems("dev", {"workloads.smoke.chart.clientGpu": "yes"}) != []


def test_workers_get_gpus_placement_and_shm(dev: RunResult) -> None:
    v = values(dev)
    for role in ("worker",):
        pod = v[role]
        assert pod["resources"] == {"requests": T4_WORKER, "limits": T4_WORKER}, role
        assert pod["nodeSelector"]["cloud.google.com/gke-accelerator"] == "nvidia-tesla-t4"
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
        shm = next(vol for vol in pod["extraVolumes"] if vol.get("emptyDir", {}).get("medium") == "Memory")
        assert shm["emptyDir"]["sizeLimit"] == "8Gi"
        assert {"name": shm["name"], "mountPath": "/dev/shm"} in pod["extraVolumeMounts"]
    assert (v["worker"]["replicaCount"], v["worker"]["slotsPerNode"]) == (2, 1)
    assert v["client"]["useJob"] is False


def test_source_configmap_and_launch_command(dev: RunResult) -> None:
    cm = dev.one(CONFIG_MAP)
    source = values(dev)["source"]
    assert source["existingConfigMap"] == cm.inputs["metadata"]["name"] == "smoke-source"
    assert cm.inputs["metadata"]["namespace"] == "deepspeed-smoke"
    assert source["launchCommand"] == ("cd /app && deepspeed --force_multi --hostfile /job/hostfile smoke_train.py "
                                       "--deepspeed_config ds_config.json --expected-gpus-per-node 1")
    data = cm.inputs["data"]
    assert data["smoke_train.py"] == (PROJECT_DIR / "recipes" / "smoke_train.py").read_text()
    # Its modules beside it (it imports them as recipes.smoke_train_*), with the package's __init__ as recipes.py.
    modules = sorted(p.name for p in (PROJECT_DIR / "recipes").glob("smoke_train_*.py"))
    assert modules and all(data[name] == (PROJECT_DIR / "recipes" / name).read_text() for name in modules)
    assert {"recipes.py", "contract.py", "shutdown.py"} <= set(data)
    ds = json.loads(data["ds_config.json"])
    assert ds["train_batch_size"] == 32  # 2 workers x 1 T4 x micro batch 8 x 2 accumulation steps
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (8, 2)
    assert ds["fp16"]["enabled"] is True and "bf16" not in ds
    assert ds["zero_optimization"]["stage"] == 2


def test_launch_command_override() -> None:
    from workloads.deepspeed_release import launch_command

    config = stack_yaml("dev")
    set_path(config, "workloads.smoke.launch.command", "deepspeed --hostfile /job/hostfile my.py")
    set_path(config, "workloads.smoke.launch.args", [])  # the command replaces the line they would be passed on
    set_path(config, "workloads.smoke.launch.script", "absent.py")  # not needed once command is set
    engine_cfg, secret_keys = engine_config_from_yaml(config)
    m = load(engine_cfg, set(secret_keys))
    assert launch_command(m.workloads["smoke"]) == "deepspeed --hostfile /job/hostfile my.py"


def test_no_token_means_no_secret(dev: RunResult) -> None:
    assert dev.by_type(SECRET) == []
    for role in ("client", "worker"):
        assert "extraEnvVarsSecret" not in values(dev)[role]
        assert [vol["name"] for vol in values(dev)[role]["extraVolumes"]] == ["dshm"]
    assert ".deepspeed_env" not in dev.one(CONFIG_MAP).inputs["data"]


def test_prod_zero3_workload(prod: RunResult) -> None:
    ds = json.loads(prod.one(CONFIG_MAP).inputs["data"]["ds_config.json"])
    assert ds["train_batch_size"] == 64  # 2 x 1 L4 x 4 x 8
    assert ds["bf16"] == {"enabled": True}
    assert ds["zero_optimization"]["stage"] == 3
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert values(prod)["worker"]["nodeSelector"]["cloud.google.com/gke-accelerator"] == "nvidia-l4"


# --- Token, provider and dependencies ----------------------------------------------------------------

def test_token_secret_stays_secret(two_pools_with_token: RunResult) -> None:
    run = two_pools_with_token
    secret = run.one(SECRET)
    # The SDK sends the whole map as one secret: neither key nor value is readable in the plan.
    assert secret.inputs["stringData"] == "[secret]" and "stringData" in secret.secret_paths
    assert secret.inputs["type"] == "Opaque"
    name = secret.inputs["metadata"]["name"]
    v = values(run)
    for role in ("client", "worker"):
        # Only a mounted file, never env from the Secret (checkov CKV_K8S_35): no envFrom, no secretKeyRef...
        assert "extraEnvVarsSecret" not in v[role]
        assert v[role]["extraEnvVars"] == [{"name": "HF_TOKEN_PATH", "value": "/etc/huggingface/token"}]
        # ...a read-only file, which huggingface_hub reads through HF_TOKEN_PATH...
        token_volume = next(vol for vol in v[role]["extraVolumes"] if "secret" in vol)
        assert token_volume["secret"]["secretName"] == name
        assert token_volume["secret"]["items"] == [{"key": "HF_TOKEN", "path": "token"}]
        assert {"name": token_volume["name"], "mountPath": "/etc/huggingface", "readOnly": True} in v[role][
            "extraVolumeMounts"]
    # ...which DeepSpeed's runner names to every rank through /app/.deepspeed_env: a path, not the token.
    assert run.one(CONFIG_MAP).inputs["data"][".deepspeed_env"] == "HF_TOKEN_PATH=/etc/huggingface/token\n"
    everything = json.dumps([r.inputs for r in run.resources]) + json.dumps(run.outputs, default=str)
    assert CANARY not in everything


def test_release_uses_the_cluster_provider(dev: RunResult) -> None:
    provider = dev.one("pulumi:providers:kubernetes").urn
    for type_ in (RELEASE, CONFIG_MAP, NAMESPACE):
        assert dev.one(type_).provider == provider, type_


def test_release_waits_for_its_pool_only(two_pools_with_token: RunResult) -> None:
    run = two_pools_with_token
    rel = run.one(RELEASE)
    own = run.one(NODE_POOL, "l4").urn
    other = run.one(NODE_POOL, "l4-spot").urn
    assert own in rel.dependencies
    assert other not in rel.dependencies
    assert all(other not in run.get(urn).dependencies for urn in rel.dependencies)


def test_children_are_parented_and_prefixed(dev: RunResult) -> None:
    component = dev.one(COMPONENT)
    children = [r for r in dev.resources if r.parent == component.urn]
    assert {r.type for r in children} == {RELEASE, CONFIG_MAP, NAMESPACE}
    assert all(r.name.startswith("smoke-") for r in children)


def test_workloads_output(dev: RunResult) -> None:
    assert dev.outputs["workloads"]["smoke"] == {
        "kind": "helm", "release": "smoke", "namespace": "deepspeed-smoke", "status": "deployed",
        "chart": "deepspeed 2.3.51", "pool": "t4", "workers": 2, "gpusPerWorker": 1}


# --- The values against the chart ------------------------------------------------------------------

def _unknown_paths(ours: Any, ref: Any, path: str = "") -> list[str]:
    """Paths we set that values.yaml does not have. Empty maps ({}) and lists in values.yaml are free-form
    (nodeSelector, resources, extraVolumes items...), so we do not look below them; scalar types must agree."""
    if not isinstance(ours, dict):
        return []
    out = []
    for key, value in ours.items():
        where = f"{path}.{key}" if path else key
        if not isinstance(ref, dict) or key not in ref:
            out.append(where)
        elif isinstance(ref[key], dict) and ref[key]:
            out += _unknown_paths(value, ref[key], where)
        elif ref[key] is not None and type(ref[key]) is not type(value) and not (
                isinstance(ref[key], dict) and isinstance(value, dict)):
            out.append(f"{where} (a {type(value).__name__}, values.yaml has a {type(ref[key]).__name__})")
    return out


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_values_keys_exist_in_the_chart(stack: str, dev: RunResult, prod: RunResult) -> None:
    ref = yaml_load(reference("bitnami-deepspeed", "values.yaml").read_text())
    run = {"dev": dev, "prod": prod}[stack]
    assert _unknown_paths(values(run), ref) == []


def test_typo_guard_catches_a_misspelt_key() -> None:
    ref = {"client": {"useJob": False, "nodeSelector": {}}, "worker": {"replicaCount": 3}}
    assert _unknown_paths({"client": {"useJobs": False, "nodeSelector": {"a": "b"}},
                           "worker": {"replicaCount": "2"}}, ref) == [
        "client.useJobs", "worker.replicaCount (a str, values.yaml has a int)"]


def test_values_match_the_chart_schema(dev: RunResult, two_pools_with_token: RunResult) -> None:
    import jsonschema

    schema = json.loads(reference("bitnami-deepspeed", "values.schema.json").read_text())
    # The schema is stale (chart 0.x) and lacks global.security, but it has no additionalProperties: false,
    # so it checks the types of what it knows and lets the rest through, as Helm does.
    for run in (dev, two_pools_with_token):
        validate_json(values(run), schema)
    with pytest.raises(jsonschema.ValidationError):
        validate_json({**values(dev), "worker": {**values(dev)["worker"], "replicaCount": "2"}}, schema)


# --- Config rules for helm workloads ---------------------------------------------------------------

def test_helm_needs_an_existing_pool() -> None:
    found = problems("dev", {"workloads.smoke.pool": "a100"})
    assert found == ["workloads.smoke.pool: no nodePools entry is named 'a100' (known: t4)"]
    found = problems("dev", {"workloads.smoke.pool": DELETE})
    assert found == ["workloads.smoke.pool: required for an NVIDIA workload; name a nodePools entry (t4)"]


def test_helm_needs_a_gke_cluster() -> None:
    found = problems("dev", {"cluster": DELETE, "nodePools": []})
    expected = "workloads.smoke.accelerator.kind: NVIDIA workloads run on a GPU pool of this stack's GKE"
    assert any(p.startswith(expected) for p in found), found


def test_helm_needs_nvidia() -> None:
    found = problems("dev", {"workloads.smoke.accelerator.kind": "gaudi"})
    assert any(p.startswith("workloads.smoke.accelerator.kind: kind helm runs on NVIDIA GKE pools only, got gaudi")
               for p in found), found


def test_helm_gpu_count_must_fit_the_node() -> None:
    found = problems("dev", {"workloads.smoke.accelerator.count": 2})
    assert "workloads.smoke.accelerator.count: 2 GPUs per worker, but nodes of pool t4 have 1" in found


def test_helm_workers_must_fit_the_pool() -> None:
    # With the client on the system pool, 3 workers fit maxNodes 3; a GPU client (chart.clientGpu) needs a 4th node.
    assert problems("dev", {"workloads.smoke.workers": 3, "workloads.smoke.deepspeed.trainBatchSize": DELETE}) == []
    found = problems("dev", {"workloads.smoke.workers": 3, "workloads.smoke.deepspeed.trainBatchSize": DELETE,
                             "workloads.smoke.chart.clientGpu": True})
    assert found == ["workloads.smoke.workers: 3 worker(s) + 1 client (chart.clientGpu) need 4 nodes of pool t4, "
                     "but nodePools[0].maxNodes is 3; raise maxNodes or lower workers"]


def test_launch_script_must_exist_unless_command_is_set() -> None:
    # Not train.py: a user's train.py in recipes must not fail the project's tests.
    found = problems("dev", {"workloads.smoke.launch.script": "absent.py"})
    assert len(found) == 1, found
    assert found[0].startswith("workloads.smoke.launch.script: no file 'absent.py' in recipes")
    assert "smoke_train.py" in found[0]
    assert problems("dev", {"workloads.smoke.launch.script": "absent.py", "workloads.smoke.launch.args": [],
                            "workloads.smoke.launch.command": "deepspeed --hostfile /job/hostfile x.py"}) == []


def test_launch_script_may_not_leave_the_scripts_folder() -> None:
    found = problems("dev", {"workloads.smoke.launch.script": "../images/deepspeed/entrypoint.sh"})
    assert len(found) == 1 and found[0].startswith("workloads.smoke.launch.script: "), found


@pytest.mark.parametrize("name", ["Smoke", "smoke_1", "-smoke", "s" * 54])
def test_workload_names_are_dns_labels(name: str) -> None:
    config = stack_yaml("dev")
    config["deepspeed-stack:workloads"] = {name: config["deepspeed-stack:workloads"]["smoke"]}
    engine_cfg, secret_keys = engine_config_from_yaml(config)
    with pytest.raises(ConfigError) as err:
        load(engine_cfg, set(secret_keys))
    assert len(err.value.problems) == 1, err.value.problems
    assert err.value.problems[0].startswith(f"workloads.{name}: {name!r} is not a valid workload name")


def test_helm_workload_owns_its_namespace() -> None:
    config = stack_yaml("dev")
    smoke = config["deepspeed-stack:workloads"]["smoke"]
    config["deepspeed-stack:workloads"]["other"] = {**smoke, "workers": 1, "deepspeed": {"precision": "fp16"}}
    engine_cfg, secret_keys = engine_config_from_yaml(config)
    with pytest.raises(ConfigError) as err:
        load(engine_cfg, set(secret_keys))
    assert "workloads.other.namespace: 'deepspeed-smoke' is also the namespace of smoke; each workload creates " \
           "and deletes its own namespace, so give it one of its own" in err.value.problems


@pytest.mark.parametrize(("ref", "expected"), [
    ("us-west1-docker.pkg.dev/p/r/deepspeed@sha256:" + "a" * 64,
     {"registry": "us-west1-docker.pkg.dev", "repository": "p/r/deepspeed", "digest": "sha256:" + "a" * 64}),
    ("us-west1-docker.pkg.dev/p/r/deepspeed:0.1.0",
     {"registry": "us-west1-docker.pkg.dev", "repository": "p/r/deepspeed", "tag": "0.1.0"}),
    ("localhost:5000/ds:dev", {"registry": "localhost:5000", "repository": "ds", "tag": "dev"}),
    ("bitnamilegacy/deepspeed:0.17.5", {"registry": "docker.io", "repository": "bitnamilegacy/deepspeed",
                                        "tag": "0.17.5"}),
])
def test_image_values_parse_a_reference(ref: str, expected: dict[str, str]) -> None:
    from workloads.deepspeed_release import image_values

    assert image_values(ref) == expected


def test_helm_namespace_is_a_dns_label() -> None:
    assert problems("dev", {"workloads.smoke.namespace": "DeepSpeed_Smoke"}) == [
        "workloads.smoke.namespace: 'DeepSpeed_Smoke' is not a valid namespace (a DNS-1123 label)"]


def test_nvme_offload_path_is_mounted_in_client_and_workers() -> None:
    run = run_stack("dev", {"deepspeed-stack:workloads": {"smoke": {
        **stack_yaml("dev")["deepspeed-stack:workloads"]["smoke"],
        "deepspeed": {"zeroStage": 3, "offloadParams": "nvme", "nvmePath": "/local_nvme", "precision": "fp16"}}}})
    for role in ("client", "worker"):
        pod = values(run)[role]
        assert {"name": "nvme-offload", "emptyDir": {}} in pod["extraVolumes"]
        assert {"name": "nvme-offload", "mountPath": "/local_nvme"} in pod["extraVolumeMounts"]
