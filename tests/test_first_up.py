"""What a first real `pulumi up` needs beyond the schemas (issue 9): replace-safety of fixed names, the node
account's roles, the temporary default pool's hardening and the ordering of workloads after the system pool."""

from __future__ import annotations

from conftest import stack_run

from preview.engine import Registration, RunResult

CLUSTER = "gcp:container/cluster:Cluster"
NODE_POOL = "gcp:container/nodePool:NodePool"
ACCOUNT = "gcp:serviceaccount/account:Account"
REPOSITORY = "gcp:artifactregistry/repository:Repository"
BUCKET = "gcp:storage/bucket:Bucket"
READER = "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember"
PROVIDER = "pulumi:providers:kubernetes"
RELEASE = "kubernetes:helm.sh/v3:Release"


# --- 3. Fixed names replace delete-first ---------------------------------------------------------

def test_resources_with_fixed_names_replace_delete_first(dev: RunResult) -> None:
    # Pulumi creates the replacement before deleting the old one unless told otherwise; with a fixed name
    # (cluster `name`, `repositoryId`, `accountId`, bucket `name`) the create fails with "already exists".
    vertex = stack_run("vertex")
    fixed = [dev.one(CLUSTER), dev.one(REPOSITORY), *dev.by_type(ACCOUNT), vertex.one(BUCKET),
             *vertex.by_type(ACCOUNT)]
    assert {r.type for r in fixed} == {CLUSTER, REPOSITORY, ACCOUNT, BUCKET}
    assert [r.name for r in fixed if not r.delete_before_replace] == []


def test_auto_named_pools_keep_create_before_delete(dev: RunResult) -> None:
    # GPU pools are auto-named (a new pool beside the old one): no downtime window from delete-first.
    assert [p.delete_before_replace for p in dev.by_type(NODE_POOL) if p.name != "cluster-system"] == [False]


# --- 4. The node service account -----------------------------------------------------------------

def test_node_account_has_the_documented_minimum_and_the_repository_reader(dev: RunResult) -> None:
    members = dev.by_type("gcp:projects/iAMMember:IAMMember")
    # GKE "Configure node service accounts" + CIS GKE Benchmark 2.0 5.2.1: roles/container.defaultNodeServiceAccount
    # is the minimum; GKE "Use Image streaming": roles/serviceusage.serviceUsageConsumer for a custom node account.
    assert sorted(m.inputs["role"] for m in members) == [
        "roles/container.defaultNodeServiceAccount", "roles/serviceusage.serviceUsageConsumer"]
    assert {m.inputs["project"] for m in members} == {"my-gcp-project"}
    assert dev.one(READER).inputs["role"] == "roles/artifactregistry.reader"


# --- 5. The temporary default pool ---------------------------------------------------------------

def test_default_pool_node_config_is_shielded_with_the_gke_metadata_server(prod: RunResult) -> None:
    # An organization policy constraints/compute.requireShieldedVm rejects a cluster whose default pool
    # lacks secure boot; checkov CKV_GCP_68/CKV_GCP_69 read the cluster's nodeConfig.
    node_config = prod.one(CLUSTER).inputs["nodeConfig"]
    assert node_config["shieldedInstanceConfig"] == {"enableSecureBoot": True, "enableIntegrityMonitoring": True}
    assert node_config["workloadMetadataConfig"] == {"mode": "GKE_METADATA"}
    assert node_config["oauthScopes"] == ["https://www.googleapis.com/auth/cloud-platform"]


# --- 7. Ordering ---------------------------------------------------------------------------------

def _depends(run: RunResult, reg: Registration, target: Registration) -> bool:
    return target.urn in reg.dependencies


def test_kubernetes_provider_waits_for_the_system_pool(dev: RunResult, prod: RunResult) -> None:
    # Every workload uses the provider, so each waits for kube-system's nodes, and destroy removes them first.
    for run in (dev, prod):
        assert _depends(run, run.one(PROVIDER), run.one(NODE_POOL, "cluster-system"))


def test_workload_pulling_the_stack_image_waits_for_the_read_grant(dev: RunResult) -> None:
    release = dev.one(RELEASE)
    assert _depends(dev, release, dev.one(READER))


def test_gaudi_workload_does_not_wait_for_a_registry() -> None:
    assert stack_run("gaudi").by_type(READER) == []
