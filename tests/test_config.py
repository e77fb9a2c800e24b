"""Config validation: every rule has a failing input, and each message names its key path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pulumi
import pytest
from conftest import DELETE, config_problems, model, problems, set_path, stack_yaml, stacks

from checks import ConfigError, load
from model import catalog
from preview.engine import engine_config_from_yaml


def only(found: list[str]) -> str:
    assert len(found) == 1, found
    return found[0]


def stack_is_valid(stack: str, path: Path | None = None) -> None:
    """The schema and every rule accept the stack file (the project's; `path`: that file)."""
    assert config_problems(stack_yaml(stack, example=False, path=path)) == []


@pytest.mark.parametrize("stack", stacks())
def test_repo_stacks_are_valid(stack: str) -> None:
    stack_is_valid(stack)


def test_dev_model_values() -> None:
    engine_cfg, secrets = engine_config_from_yaml(stack_yaml("dev"))
    m = load(engine_cfg, set(secrets))
    pool = m.node_pools[0]
    assert (m.region, m.cluster_location, m.cluster.private_nodes) == ("us-west1", "us-west1", False)
    assert (pool.machine_type, pool.gpu.type, pool.gpu.count, pool.gpu.driver_version) == (
        "n1-standard-8", "nvidia-tesla-t4", 1, "LATEST")
    assert (pool.spot, pool.min_nodes, pool.max_nodes, pool.local_ssd_count) == (True, 0, 3, 1)
    # Defaults come from the schema: the network block is absent from the dev file.
    assert m.network.subnet_cidr == "10.10.0.0/20"


def test_config_error_is_a_run_error_listing_every_problem() -> None:
    found = problems("dev", {
        "nodePools[0].minNodes": 5,
        "nodePools[0].zones[0]": "us-west1-c",
        "cluster.name": "Bad_Name",
    })
    assert len(found) == 3, found
    with pytest.raises(pulumi.RunError, match=r"3 problem\(s\)"):
        config = stack_yaml("dev")
        set_path(config, "cluster.name", "Bad_Name")
        set_path(config, "nodePools[0].minNodes", 5)
        set_path(config, "nodePools[0].zones[0]", "us-west1-c")
        load(*engine_config_from_yaml(config)[:1], set())


def test_unknown_top_level_key_suggests_the_right_one() -> None:
    config = stack_yaml("dev")
    config["deepspeed-stack:nodePool"] = config.pop("deepspeed-stack:nodePools")
    try:
        load(engine_config_from_yaml(config)[0], set())
    except ConfigError as err:
        assert only(err.problems) == "nodePool: unknown key; did you mean `nodePools`?"
    else:
        pytest.fail("no error")


def test_unknown_nested_key_suggests_and_required_is_reported() -> None:
    found = problems("dev", {"nodePools[0].gpu.tpye": "nvidia-l4", "nodePools[0].gpu.type": DELETE})
    assert "nodePools[0].gpu.tpye: unknown key; did you mean `type`?" in found
    assert "nodePools[0].gpu.type: required key is missing" in found


def test_required_machine_type() -> None:
    assert only(problems("dev", {"nodePools[0].machineType": DELETE})) == \
        "nodePools[0].machineType: required key is missing"


def test_type_and_range_errors_name_the_key() -> None:
    found = problems("dev", {"nodePools[0].maxNodes": "three", "nodePools[0].minNodes": -1,
                             "cluster.privateNodes": "yes"})
    assert 'nodePools[0].maxNodes: expected integer, got "three"' in found
    assert "nodePools[0].minNodes: must be at least 0, got -1" in found
    assert 'cluster.privateNodes: expected boolean, got "yes"' in found


def test_enum_error() -> None:
    assert only(problems("dev", {"nodePools[0].gpu.driverVersion": "latest"})).startswith(
        'nodePools[0].gpu.driverVersion: "latest" is not one of LATEST, DEFAULT')


def test_object_value_that_is_not_json() -> None:
    engine_cfg, _ = engine_config_from_yaml(stack_yaml("dev"))
    engine_cfg["deepspeed-stack:cluster"] = "{not json"
    with pytest.raises(ConfigError) as err:
        load(engine_cfg, set())
    assert err.value.problems[0].startswith("cluster: expected a object, got text that is not JSON")


def test_min_more_than_max() -> None:
    assert only(problems("dev", {"nodePools[0].minNodes": 4})) == "nodePools[0].minNodes: 4 is more than maxNodes 3"


def test_unknown_gpu_type() -> None:
    assert only(problems("dev", {"nodePools[0].gpu.type": "nvidia-t4"})).startswith(
        "nodePools[0].gpu.type: unknown GPU type 'nvidia-t4'")


def test_l4_needs_g2() -> None:
    found = problems("prod", {"nodePools[0].machineType": "n1-standard-8"})
    assert only(found).startswith("nodePools[0].machineType: nvidia-l4 needs a g2 machine type, got n1-standard-8")


@pytest.mark.parametrize(("gpu", "machine", "family"), [
    ("nvidia-tesla-t4", "g2-standard-8", "n1"),
    ("nvidia-tesla-a100", "a3-highgpu-1g", "a2"),
    ("nvidia-h100-80gb", "a2-highgpu-1g", "a3"),
])
def test_machine_family_per_gpu(gpu: str, machine: str, family: str) -> None:
    found = problems("prod", {"nodePools[0].gpu.type": gpu, "nodePools[0].machineType": machine,
                              "nodePools[0].zones": []})
    article = "a" if family == "g2" else "an"  # "a g2", "an n1", "an a2"
    expected = f"nodePools[0].machineType: {gpu} needs {article} {family} machine type, got {machine}"
    assert only(found).startswith(expected)


def test_gpu_count_must_fit_the_shape() -> None:
    # (The dev workload's batch arithmetic also reacts to the count; only the pool's problem matters here.)
    assert "nodePools[0].gpu.count: n1-standard-8 takes 1, 2 or 4 nvidia-tesla-t4, got 3" in problems(
        "dev", {"nodePools[0].gpu.count": 3})
    found = only(problems("prod", {"nodePools[0].gpu.count": 2}))
    assert found == "nodePools[0].gpu.count: g2-standard-8 takes 1 nvidia-l4, got 2; for 2 use g2-standard-24"


def test_gpu_zone_must_offer_the_gpu() -> None:
    offered = catalog.load().zones("nvidia-tesla-t4", "us-west1")
    assert "us-west1-c" not in offered  # the catalog's fact this test relies on
    assert only(problems("dev", {"nodePools[0].zones[0]": "us-west1-c"})) == (
        f"nodePools[0].zones[0]: us-west1-c does not offer nvidia-tesla-t4 (zones of us-west1 that do: "
        f"{', '.join(offered)})")


def test_gpu_not_offered_in_region() -> None:
    found = problems("dev", {"nodePools[0].gpu.type": "nvidia-a100-80gb", "nodePools[0].machineType": "a2-ultragpu-1g",
                             "nodePools[0].zones": []})
    assert only(found) == "nodePools[0].gpu.type: nvidia-a100-80gb is not offered in us-west1"


def test_region_must_be_in_catalog() -> None:
    (found,) = problems("dev", {"gcp:region": "mars-north1"})
    assert found.startswith("gcp:region: mars-north1 is not a region of data/gpu_catalog.yaml")


def test_gcp_project_required() -> None:
    assert "gcp:project: required; set it with `pulumi config set gcp:project <project-id>`" in problems(
        "dev", {"gcp:project": DELETE})


def test_gcp_settings_only_required_with_a_cluster() -> None:
    # Pulumi.gaudi.yaml deploys to an existing cluster and has no gcp: keys at all.
    assert "gcp:project" not in stack_yaml("gaudi")
    assert problems("gaudi", {}) == []
    found = problems("gaudi", {"cluster.name": "deepspeed"})
    assert "gcp:project: required; set it with `pulumi config set gcp:project <project-id>`" in found
    assert "gcp:region: required; set it with `pulumi config set gcp:region <region>`" in found


@pytest.mark.parametrize(("path", "value", "message"), [
    ("network.subnetCidr", "10.10.0.1/20", "network.subnetCidr: '10.10.0.1/20' is not an IPv4 CIDR"),
    ("network.podsCidr", "10.10.0.0/16", "network.podsCidr: 10.10.0.0/16 overlaps network.subnetCidr"),
    ("cluster.masterCidr", "172.16.0.32/27", "cluster.masterCidr: a private control plane needs a /28, got /27"),
    ("cluster.authorizedNetworks[0].cidr", "office", "cluster.authorizedNetworks[0].cidr: 'office' is not an IPv4"),
])
def test_cidr_rules(path: str, value: str, message: str) -> None:
    assert only(problems("prod", {path: value})).startswith(message)


def test_private_endpoint_needs_private_nodes() -> None:
    assert only(problems("dev", {"cluster.privateEndpoint": True})) == (
        "cluster.privateEndpoint: a private endpoint needs cluster.privateNodes: true")


@pytest.mark.parametrize("name", ["Deepspeed", "1cluster", "ends-with-", "x" * 41])
def test_cluster_name_rules(name: str) -> None:
    assert only(problems("dev", {"cluster.name": name})).startswith(f"cluster.name: {name!r} is not a GKE cluster name")


def test_cluster_location_must_be_region_or_its_zone() -> None:
    assert problems("dev", {"cluster.location": "us-west1-a"}) == []
    assert only(problems("dev", {"cluster.location": "us-east1-b"})).startswith(
        "cluster.location: us-east1-b is neither gcp:region us-west1 nor one of its zones")


def test_pool_names_valid_and_unique() -> None:
    config = stack_yaml("dev")
    pools = config["deepspeed-stack:nodePools"]
    pools.append(dict(pools[0]))
    pools.append({**pools[0], "name": "x" * 33})
    found = config_problems(config)
    assert "nodePools[1].name: 't4' is used by another pool; pool names must be unique" in found
    assert any(p.startswith("nodePools[2].name: 'xxxxxxxxx") and "at most 32" in p for p in found)




def test_system_pool_rules() -> None:
    found = problems("dev", {"cluster.systemPool.minNodes": 4, "cluster.systemPool.zones[0]": "us-east1-b"})
    assert "cluster.systemPool.minNodes: 4 is more than maxNodes 3" in found
    assert "cluster.systemPool.zones[0]: us-east1-b is not a zone of us-west1; did you mean `us-west1-b`?" in found


def test_pools_need_a_cluster() -> None:
    assert "nodePools: GPU node pools need a GKE cluster; set `cluster` (e.g. cluster.name) or remove nodePools" in \
        problems("dev", {"cluster": DELETE})


def test_registry_and_image_rules() -> None:
    found = problems("dev", {"registry.name": "Deep_Speed", "image.tag": "-bad", "image.context": "workloads/nowhere"})
    assert found[0].startswith("registry.name: 'Deep_Speed' is not an Artifact Registry repository id")
    assert "image.tag: '-bad' is not a valid Docker tag" in found
    assert any(p.startswith("image.context: no Dockerfile at workloads/nowhere/Dockerfile") for p in found)


def test_prebuilt_image_must_be_pinned() -> None:
    assert only(problems("dev", {"image.prebuilt": "us-docker.pkg.dev/p/r/deepspeed"})) == (
        "image.prebuilt: 'us-docker.pkg.dev/p/r/deepspeed' has neither a tag nor a digest; pin it")


def test_hf_token_must_be_a_secret() -> None:
    assert only(problems("dev", {"hfToken": "hf_plain"})).startswith(
        "hfToken: must be a secret, not plain text in the stack file; set it with `pulumi config set --secret "
        "hfToken hf_...`")  # the whole message: tests/test_first_hour_again.py
    assert problems("dev", {"hfToken": {"secure": "v1:abc"}}) == []


def test_readme_configuration_reference_is_generated_from_the_schema() -> None:
    from conftest import PROJECT_DIR

    from model import docs

    readme = (PROJECT_DIR / "docs" / "reference.md").read_text()
    assert docs.render() in readme, "docs/reference.md is stale: run `make docs`"
    # Every schema key appears as a row, so no key can be added without documenting it.
    for key, *_ in docs.rows(docs.schema()):
        assert f"| `{key}` |" in readme


def test_workloads_of_any_kind_cannot_share_a_namespace() -> None:
    # A helm workload and an MPIJob both create (and on removal delete) their namespace.
    smoke = stack_yaml("dev")["deepspeed-stack:workloads"]["smoke"]
    job = {"kind": "mpijob", "pool": "t4", "namespace": smoke["namespace"], "launch": smoke["launch"],
           "deepspeed": {"precision": "fp16"}, "storage": {"storageClass": "standard-rwx"}}
    # (room on the pool and the MPI operator: the rules across workloads would refuse the stack otherwise)
    found = problems("dev", {"workloads.job": job, "nodePools[0].maxNodes": 4, "mpiOperator.install": True})
    assert found == [f"workloads.job.namespace: {smoke['namespace']!r} is also the namespace of smoke; each workload "
                     "creates and deletes its own namespace, so give it one of its own"]


# --- Hardening: what a fuzz of every key found (no traceback, no plain-text secret, no unchecked value) ----

def test_a_secret_on_a_key_that_is_not_kept_secret_is_refused_without_echoing_it() -> None:
    config = stack_yaml("gaudi")
    job = config["deepspeed-stack:workloads"]["gaudi-llm-ds-ft"]
    job["proxy"] = {"https": {"secure": "v1:ciphertext"}}  # `pulumi config set --secret --path ...proxy.https`
    found = config_problems(config)
    assert found == ["workloads: is set as a secret, but the stack would write it in plain text into the resources "
                     "it creates; only hfToken and kubeconfig are kept secret. Set it without --secret (or, for a "
                     "credential such as a proxy password, keep it out of the stack)"]


def test_an_empty_secret_is_refused() -> None:
    config = stack_yaml("dev")
    config["deepspeed-stack:hfToken"] = ""
    assert config_problems(config, secure=("hfToken",)) == [
        "hfToken: is empty; set it, or remove it with `pulumi config rm hfToken`"]


@pytest.mark.parametrize(("stack", "changes", "message"), [
    ("gaudi", {"workloads.gaudi-llm-ds-ft.gaudi.softwareVersion": "1"},
     'workloads.gaudi-llm-ds-ft.gaudi.softwareVersion: "1" is not of the form an exact version such as 2.3.51'),
    ("prod", {"workloads.zero3-smoke.model.parameters": 1e300},
     "workloads.zero3-smoke.model.parameters: must be at most 100000, got 1e+300"),
    ("prod", {"workloads.zero3-smoke.model.batchSize": 10 ** 309},
     "workloads.zero3-smoke.model.batchSize: must be at most 65536"),
    ("dev", {"image.context": "x" * 256}, "image.context: must be at most 255 characters long"),
    ("dev", {"workloads.smoke.launch.script": "x" * 256},
     "workloads.smoke.launch.script: must be at most 255 characters long"),
    ("dev", {"gcp:project": "-1"}, "gcp:project: '-1' is not a project id"),
    ("dev", {"cluster.systemPool.machineType": ""},
     'cluster.systemPool.machineType: "" is not of the form a machine type such as n1-standard-8'),
    ("dev", {"workloads.smoke.resources.shmSize": "lots"},
     'workloads.smoke.resources.shmSize: "lots" is not of the form a positive Kubernetes quantity such as 24Gi'),
    ("dev", {"workloads.smoke.resources.cpu": "-3"},
     'workloads.smoke.resources.cpu: "-3" is not of the form a positive Kubernetes CPU quantity such as 6 or 500m'),
    ("dev", {"workloads.smoke.chart.version": ""},
     'workloads.smoke.chart.version: "" is not of the form an exact version such as 2.3.51'),
    ("dev", {"workloads.smoke.image": "not an image"},
     'workloads.smoke.image: "not an image" is not of the form an image reference'),
    ("dev", {"nodePools[0].labels": {"bad key!": "x"}},
     'nodePools[0].labels["bad key!"]: "bad key!" is not of the form a label key'),
    ("dev", {"nodePools[0].labels": {"deepspeed-stack/pool": "x"}},
     'nodePools[0].labels["deepspeed-stack/pool"]: "deepspeed-stack/pool" is not of the form a label key'),
    ("dev", {"nodePools[0].zones": ["us-west1-b", "us-west1-b"]}, "nodePools[0].zones: lists the same value twice"),
    ("dev", {"workloads.smoke.gcsFuse.mountPath": "relative"},
     'workloads.smoke.gcsFuse.mountPath: "relative" is not of the form an absolute path'),
    ("dev", {"storage.enabled": True, "workloads.smoke.gcsFuse": {"enabled": True, "mountPath": "/app"}},
     "workloads.smoke.gcsFuse.mountPath: /app is already used by the workload's pods"),
    ("vertex", {"vertex.launch.script": ""}, "vertex.launch.script: must be at least 1 characters long"),
    ("prod", {"cluster.fleet.project": ""}, 'cluster.fleet.project: "" is not of the form a project id'),
    ("prod", {"cluster.authorizedNetworks[0].cidr": "0.0.0.0/0"},
     "cluster.authorizedNetworks[0].cidr: 0.0.0.0/0 would open the control plane to the whole internet"),
])
def test_values_that_would_reach_an_api_unchecked(stack: str, changes: dict[str, Any], message: str) -> None:
    found = problems(stack, changes)
    assert any(p.startswith(message) for p in found), found


def test_whole_number_floats_become_integers() -> None:
    # JSON Schema counts 2.0 as an integer; ds_config.json and the MPIJob command line must not say 2.0.
    m = model("gaudi", {"workloads.gaudi-llm-ds-ft.workers": 1.0, "workloads.gaudi-llm-ds-ft.deepspeed.zeroStage": 2.0})
    w = m.workloads["gaudi-llm-ds-ft"]
    assert (w.workers, w.deepspeed.zero_stage) == (1, 2)
    assert type(w.workers) is int and type(w.deepspeed.zero_stage) is int


def test_keys_that_need_quoting_are_spelt_as_pulumi_config_set_path_takes_them() -> None:
    smoke = stack_yaml("dev")["deepspeed-stack:workloads"]["smoke"]
    found = problems("dev", {"workloads": {"a.b": {**smoke, "namespace": "other"}, "smoke": smoke}})
    assert any(p.startswith('workloads["a.b"]: ') for p in found), found
