"""The GCP platform as registered under mocks: values of each component's resources, and their structure."""

from __future__ import annotations

import json

import pytest
from conftest import PROJECT_DIR, reference, run_stack, stack_yaml

from components.gke_cluster import kubeconfig
from preview.engine import RunResult

CLUSTER = "gcp:container/cluster:Cluster"
NODE_POOL = "gcp:container/nodePool:NodePool"


def gpu_pool(run: RunResult, name: str):
    return run.one(NODE_POOL, name)


# --- Network -------------------------------------------------------------------------------------

def test_network_is_custom_mode_with_pod_and_service_ranges(dev: RunResult) -> None:
    assert dev.one("gcp:compute/network:Network").inputs["autoCreateSubnetworks"] is False
    subnet = dev.one("gcp:compute/subnetwork:Subnetwork").inputs
    assert subnet["ipCidrRange"] == "10.10.0.0/20"
    assert subnet["region"] == "us-west1"
    assert subnet["privateIpGoogleAccess"] is True
    assert {r["rangeName"]: r["ipCidrRange"] for r in subnet["secondaryIpRanges"]} == {
        "pods": "10.20.0.0/14", "services": "10.30.0.0/20"}


def test_nat_only_for_private_nodes(dev: RunResult, prod: RunResult) -> None:
    assert dev.by_type("gcp:compute/routerNat:RouterNat") == []
    nat = prod.one("gcp:compute/routerNat:RouterNat").inputs
    assert nat["sourceSubnetworkIpRangesToNat"] == "ALL_SUBNETWORKS_ALL_IP_RANGES"
    assert nat["natIpAllocateOption"] == "AUTO_ONLY"
    assert prod.one("gcp:compute/router:Router").inputs["region"] == "us-central1"


# --- GkeCluster ----------------------------------------------------------------------------------

def test_cluster_hardening(dev: RunResult) -> None:
    c = dev.one(CLUSTER).inputs
    assert c["name"] == "deepspeed-dev"
    assert c["location"] == "us-west1"
    assert c["workloadIdentityConfig"] == {"workloadPool": "my-gcp-project.svc.id.goog"}
    assert c["enableShieldedNodes"] is True
    assert c["releaseChannel"] == {"channel": "REGULAR"}
    assert c["datapathProvider"] == "ADVANCED_DATAPATH"
    assert c["networkingMode"] == "VPC_NATIVE"
    assert c["ipAllocationPolicy"] == {"clusterSecondaryRangeName": "pods", "servicesSecondaryRangeName": "services"}
    assert c["addonsConfig"]["gcsFuseCsiDriverConfig"] == {"enabled": True}
    assert c["addonsConfig"]["gcpFilestoreCsiDriverConfig"] == {"enabled": True}
    assert c["loggingConfig"]["enableComponents"] == ["SYSTEM_COMPONENTS", "WORKLOADS"]
    assert "SYSTEM_COMPONENTS" in c["monitoringConfig"]["enableComponents"]
    assert c["masterAuth"]["clientCertificateConfig"] == {"issueClientCertificate": False}
    assert c["enableLegacyAbac"] is False
    assert c["removeDefaultNodePool"] is True
    assert "privateClusterConfig" not in c


def test_dev_cluster_is_deletable_prod_is_protected(dev: RunResult, prod: RunResult) -> None:
    assert (dev.one(CLUSTER).inputs["deletionProtection"], dev.one(CLUSTER).protect) == (False, False)
    assert (prod.one(CLUSTER).inputs["deletionProtection"], prod.one(CLUSTER).protect) == (True, True)


def test_prod_cluster_is_private_with_authorized_networks(prod: RunResult) -> None:
    c = prod.one(CLUSTER).inputs
    assert c["privateClusterConfig"]["enablePrivateNodes"] is True
    assert c["privateClusterConfig"]["enablePrivateEndpoint"] is False
    assert c["privateClusterConfig"]["masterIpv4CidrBlock"] == "172.16.0.32/28"
    assert c["masterAuthorizedNetworksConfig"]["cidrBlocks"] == [
        {"cidrBlock": "203.0.113.0/24", "displayName": "office"}]
    assert c["releaseChannel"] == {"channel": "STABLE"}


def test_calico_when_dataplane_v2_is_off() -> None:
    run = run_stack("dev", {"deepspeed-stack:cluster": {**stack_yaml("dev")["deepspeed-stack:cluster"],
                                                        "dataplaneV2": False}})
    c = run.one(CLUSTER).inputs
    assert c["datapathProvider"] == "LEGACY_DATAPATH"
    assert c["networkPolicy"] == {"enabled": True, "provider": "CALICO"}
    assert c["addonsConfig"]["networkPolicyConfig"] == {"disabled": False}


def test_node_service_account_has_only_the_node_roles(dev: RunResult) -> None:
    sa = dev.one("gcp:serviceaccount/account:Account").inputs
    assert sa["accountId"] == "deepspeed-dev-nodes"
    email = "deepspeed-dev-nodes@my-gcp-project.iam.gserviceaccount.com"
    roles = sorted(m.inputs["role"] for m in dev.by_type("gcp:projects/iAMMember:IAMMember"))
    # GKE's "Configure node service accounts" page and CIS GKE Benchmark 2.0 (5.2.1): the one minimum role;
    # GKE's "Use Image streaming" page: Service Usage Consumer for a custom node account.
    assert roles == ["roles/container.defaultNodeServiceAccount", "roles/serviceusage.serviceUsageConsumer"]
    assert {m.inputs["member"] for m in dev.by_type("gcp:projects/iAMMember:IAMMember")} == {f"serviceAccount:{email}"}
    reader = dev.one("gcp:artifactregistry/repositoryIamMember:RepositoryIamMember").inputs
    assert (reader["role"], reader["member"], reader["repository"]) == (
        "roles/artifactregistry.reader", f"serviceAccount:{email}", "deepspeed")
    # Every pool runs as it, never as the Compute Engine default account.
    for pool in dev.by_type(NODE_POOL):
        assert pool.inputs["nodeConfig"]["serviceAccount"] == email


def test_system_pool(dev: RunResult) -> None:
    sp = dev.one(NODE_POOL, "cluster-system").inputs
    assert sp["nodeConfig"]["machineType"] == "e2-standard-4"
    assert sp["nodeLocations"] == ["us-west1-a"]
    assert sp["autoscaling"] == {"totalMinNodeCount": 1, "totalMaxNodeCount": 3}
    assert "guestAccelerators" not in sp["nodeConfig"]


def test_kubeconfig_uses_the_auth_plugin_and_holds_no_credential() -> None:
    doc = json.loads(kubeconfig("c1", "34.1.2.3", "Q0E="))
    assert doc["clusters"][0]["cluster"] == {"server": "https://34.1.2.3", "certificate-authority-data": "Q0E="}
    user = doc["users"][0]["user"]
    assert set(user) == {"exec"}
    assert user["exec"]["command"] == "gke-gcloud-auth-plugin"
    assert user["exec"]["apiVersion"] == "client.authentication.k8s.io/v1beta1"


def test_kubeconfig_is_secret_everywhere(dev: RunResult) -> None:
    provider = dev.one("pulumi:providers:kubernetes")
    assert provider.inputs["kubeconfig"] == "[secret]"
    assert "kubeconfig" in provider.secret_paths
    assert dev.outputs["kubeconfig"] == "[secret]"
    assert dev.outputs["clusterEndpoint"].count(".") == 3


# --- GpuNodePool ---------------------------------------------------------------------------------

def test_dev_t4_pool(dev: RunResult) -> None:
    pool = gpu_pool(dev, "t4").inputs
    node = pool["nodeConfig"]
    assert "name" not in pool and "namePrefix" not in pool  # auto-named: replacements never collide
    assert node["machineType"] == "n1-standard-8"
    assert node["guestAccelerators"] == [{"type": "nvidia-tesla-t4", "count": 1,
                                          "gpuDriverInstallationConfig": {"gpuDriverVersion": "LATEST"}}]
    assert node["spot"] is True
    assert pool["autoscaling"] == {"totalMinNodeCount": 0, "totalMaxNodeCount": 3, "locationPolicy": "ANY"}
    assert pool["nodeLocations"] == ["us-west1-b"]
    assert node["ephemeralStorageLocalSsdConfig"] == {"localSsdCount": 1}
    assert node["gcfsConfig"] == {"enabled": True}
    assert node["shieldedInstanceConfig"] == {"enableSecureBoot": True, "enableIntegrityMonitoring": True}
    assert node["workloadMetadataConfig"] == {"mode": "GKE_METADATA"}
    assert node["imageType"] == "COS_CONTAINERD"
    assert pool["management"] == {"autoRepair": True, "autoUpgrade": True}
    assert node["labels"] == {"deepspeed-stack/pool": "t4"}
    assert pool["cluster"] == "deepspeed-dev"


def test_prod_l4_pool_in_one_zone_or_the_catalog_zones(prod: RunResult) -> None:
    from model import catalog

    assert gpu_pool(prod, "l4").inputs["nodeLocations"] == ["us-central1-a"]  # NCCL stays in one zone
    pools = stack_yaml("prod")["deepspeed-stack:nodePools"]
    run = run_stack("prod", {"deepspeed-stack:nodePools": [{**pools[0], "zones": []}]})
    pool = gpu_pool(run, "l4").inputs
    assert pool["nodeConfig"]["machineType"] == "g2-standard-8"
    assert pool["nodeConfig"]["spot"] is False
    assert pool["autoscaling"]["locationPolicy"] == "BALANCED"
    assert pool["nodeLocations"] == list(catalog.load().zones("nvidia-l4", "us-central1"))


# --- ArtifactRegistry and ContainerImage ---------------------------------------------------------

def test_registry(dev: RunResult) -> None:
    repo = dev.one("gcp:artifactregistry/repository:Repository").inputs
    assert (repo["format"], repo["location"], repo["repositoryId"]) == ("DOCKER", "us-west1", "deepspeed")
    policies = {p["id"]: p for p in repo["cleanupPolicies"]}
    assert policies["keep-newest"]["action"] == "KEEP"
    assert policies["keep-newest"]["mostRecentVersions"] == {"keepCount": 10}
    assert policies["delete-old"]["action"] == "DELETE"
    assert repo["cleanupPolicyDryRun"] is False


def test_image_build_pushes_to_the_registry_and_is_pinned_by_digest(dev: RunResult) -> None:
    build = dev.one("docker-build:index:Image")
    ref = "us-west1-docker.pkg.dev/my-gcp-project/deepspeed/deepspeed"
    assert build.inputs["tags"] == [f"{ref}:0.1.0"]
    assert build.inputs["push"] is True
    assert build.inputs["context"] == {"location": "workloads/images/deepspeed"}
    assert build.inputs["platforms"] == ["linux/amd64"]
    assert build.inputs["registries"] == [
        {"address": "us-west1-docker.pkg.dev", "username": "oauth2accesstoken", "password": "[secret]"}]
    assert dev.outputs["imageRef"].startswith(f"{ref}@sha256:")  # pinned by digest, without the tag
    assert build.inputs["buildOnPreview"] is False
    assert build.inputs["cacheFrom"] == [{"registry": {"ref": f"{ref}:buildcache"}}]
    (cache_to,) = build.inputs["cacheTo"]  # (the SDK fills in its own defaults beside ours)
    assert {k: cache_to["registry"][k] for k in ("ref", "mode", "imageManifest", "ociMediaTypes")} == {
        "ref": f"{ref}:buildcache", "mode": "max", "imageManifest": True, "ociMediaTypes": True}


def test_prebuilt_image_builds_nothing() -> None:
    ref = "us-docker.pkg.dev/p/r/deepspeed@sha256:" + "a" * 64
    run = run_stack("dev", {"deepspeed-stack:image": {"prebuilt": ref}})
    assert run.by_type("docker-build:index:Image") == []
    assert run.outputs["imageRef"] == ref


# --- Structure: components, parents, dependencies ------------------------------------------------

COMPONENT_CHILDREN = {
    "deepspeed-stack:gcp:NodeIdentity": {"gcp:serviceaccount/account:Account", "gcp:projects/iAMMember:IAMMember"},
    "deepspeed-stack:gcp:Network": {"gcp:compute/network:Network", "gcp:compute/subnetwork:Subnetwork",
                                    "gcp:compute/firewall:Firewall"},
    "deepspeed-stack:gcp:GkeCluster": {CLUSTER, NODE_POOL, "pulumi:providers:kubernetes"},
    "deepspeed-stack:gcp:GpuNodePool": {NODE_POOL},
    "deepspeed-stack:gcp:ArtifactRegistry": {"gcp:artifactregistry/repository:Repository",
                                             "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember"},
    "deepspeed-stack:gcp:ContainerImage": {"docker-build:index:Image"},
}


@pytest.mark.parametrize("component", sorted(COMPONENT_CHILDREN))
def test_components_register_their_children(dev: RunResult, component: str) -> None:
    (comp,) = dev.by_type(component)
    children = {r.type for r in dev.resources if r.parent == comp.urn}
    assert children == COMPONENT_CHILDREN[component]


def test_every_cloud_resource_belongs_to_a_component(dev: RunResult, prod: RunResult) -> None:
    for run in (dev, prod):
        components = {r.urn for r in run.resources if not r.custom}
        assert all(r.parent in components for r in run.resources if r.custom), [
            r.name for r in run.resources if r.custom and r.parent not in components]
        assert all(r.type.startswith("deepspeed-stack:") and r.type.count(":") == 2
                   for r in run.resources if not r.custom)


def waits_for(run: RunResult, reg) -> set[str]:
    """Every resource `reg` transitively waits on; depending on a component means all of its children."""
    seen: set[str] = set()
    todo = list(reg.dependencies)
    while todo:
        urn = todo.pop()
        if urn in seen:
            continue
        seen.add(urn)
        target = run.get(urn)
        todo += target.dependencies
        todo += [r.urn for r in run.resources if r.parent == urn]
    return seen


def two_pool_prod() -> RunResult:
    pools = stack_yaml("prod")["deepspeed-stack:nodePools"]
    second = {**pools[0], "name": "l4-spot", "spot": True}
    return run_stack("prod", {"deepspeed-stack:nodePools": [*pools, second]})


def test_dependencies_are_only_the_real_ones(dev: RunResult) -> None:
    cluster = dev.one(CLUSTER).urn
    for type_ in ("gcp:artifactregistry/repository:Repository", "docker-build:index:Image"):
        assert cluster not in waits_for(dev, dev.one(type_)), f"{type_} must not wait for the cluster"
    assert cluster in waits_for(dev, dev.one("pulumi:providers:kubernetes"))
    assert cluster in waits_for(dev, gpu_pool(dev, "t4"))


def test_node_pools_do_not_wait_for_each_other() -> None:
    run = two_pool_prod()
    a, b = gpu_pool(run, "l4"), gpu_pool(run, "l4-spot")
    assert a.urn not in waits_for(run, b) and b.urn not in waits_for(run, a)
    assert b.inputs["nodeConfig"]["spot"] is True


def test_pulumi_yaml_matches_the_project_schema() -> None:
    import jsonschema
    import yaml

    schema = json.loads(reference("pulumi", "project.schema.json").read_text())
    project = yaml.safe_load((PROJECT_DIR / "Pulumi.yaml").read_text())
    jsonschema.validate(project, schema)
    assert project["name"] == "deepspeed-stack"
    assert project["runtime"] == {"name": "python", "options": {"toolchain": "pip", "virtualenv": ".venv"}}


def test_pool_auto_name_fits_gke_limit() -> None:
    # Pulumi auto-names `<logical name>-<7 characters>`; GKE allows 40 characters. The logical name is the
    # config's pool name, so the longest pool name the config accepts (32) still fits.
    pools = stack_yaml("prod")["deepspeed-stack:nodePools"]
    longest = "p" * 32
    run = run_stack("prod", {"deepspeed-stack:nodePools": [{**pools[0], "name": longest}],
                             "deepspeed-stack:workloads": {}})
    (pool,) = [r for r in run.by_type(NODE_POOL) if r.name != "cluster-system"]
    assert pool.name == longest
    assert len(f"{pool.name}-abcdefg") == 40


def test_replace_safety_options(dev: RunResult) -> None:
    # GKE reports another pool's config as the cluster's nodeConfig once the default pool is gone.
    assert dev.one(CLUSTER).ignore_changes == ["nodeConfig"]
    system = dev.one(NODE_POOL, "cluster-system")
    assert system.inputs["initialNodeCount"] == 1
    assert system.ignore_changes == ["initialNodeCount"]
