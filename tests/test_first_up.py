"""What a first real `pulumi up` needs beyond the schemas (issue 9): replace-safety of fixed names, the node
account's roles, the temporary default pool's hardening and the ordering of workloads after the system pool."""

from __future__ import annotations

import copy

import msgspec
from conftest import DELETE, run_stack, stack_run, stack_yaml

from model.yamlio import load_yaml
from preview import diff, plan, replacements, summary
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


def test_workload_with_its_own_image_does_not_wait_for_the_read_grant(dev: RunResult) -> None:
    # On a stack that has the grant (dev: its release waits for it, above), a second workload that names its own
    # image has nothing to wait for. (A Gaudi workload never shares a stack with the grant: it runs on an
    # existing cluster, and the grant is the GKE nodes' own; test_kinds.py pins `pulls_stack_image` for it.)
    config = stack_yaml("dev")
    smoke = config["deepspeed-stack:workloads"]["smoke"]
    own = {**copy.deepcopy(smoke), "namespace": "own",
           "image": "registry.example.com/ml/own@sha256:" + "d" * 64}
    pools = copy.deepcopy(config["deepspeed-stack:nodePools"])
    pools[0]["maxNodes"] = 4  # 2 workers each (the charts' clients run on the system pool)
    run = run_stack("dev", {"workloads": {"smoke": smoke, "own": own}, "nodePools": pools})
    reader = run.one(READER)
    assert _depends(run, run.one(RELEASE, "smoke-release"), reader)
    assert not _depends(run, run.one(RELEASE, "own-release"), reader)


# --- 2. Existing clusters: adopt, never delete ---------------------------------------------------

NAMESPACE = "kubernetes:core/v1:Namespace"
CLAIM = "kubernetes:core/v1:PersistentVolumeClaim"


def test_existing_cluster_provider_adopts_objects_created_by_hand() -> None:
    # pulumi-kubernetes 4.34 ProviderArgs.upsert_existing_objects: off by default, "allow Pulumi to create
    # resources that already exist in the cluster by updating them" (the SDK's docstring). Omnia 1.7's DeepSpeed
    # guide (docs/source/OmniaInstallGuide/Ubuntu/InstallAITools/DeepSpeed.rst) creates `workloads` and
    # `shared-model` by hand.
    provider = stack_run("gaudi").one(PROVIDER, "target-k8s").inputs
    assert provider["upsertExistingObjects"] == "true"  # provider inputs travel as strings
    assert provider["enableServerSideApply"] == "true"


def test_existing_cluster_namespace_and_claim_survive_destroy() -> None:
    gaudi = stack_run("gaudi")
    kept = {r.type: r.inputs["metadata"]["name"] for r in gaudi.resources if r.retain_on_delete}
    assert kept == {NAMESPACE: "workloads", CLAIM: "shared-model"}


def test_the_stacks_own_cluster_neither_adopts_nor_retains(dev: RunResult) -> None:
    assert "upsertExistingObjects" not in dev.one(PROVIDER).inputs
    assert [r.name for r in dev.resources if r.retain_on_delete] == []


# --- 3. The preview says when a change replaces a stateful resource ------------------------------

def _base_with(run: RunResult, changes: dict[str, dict[str, object]]) -> dict:
    """The run's plan with some inputs set to other values: the base branch as it was before a PR."""
    base = copy.deepcopy(plan.build(run))
    for res in base["resources"]:
        for path, value in changes.get(res["type"], {}).items():
            node = res["inputs"]
            *parents, last = path.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[last] = value
    return base


def _replaced(run: RunResult, changes: dict[str, dict[str, object]]) -> list[replacements.Replacement]:
    return replacements.replacements(diff.diff(_base_with(run, changes), plan.build(run)), run)


def test_datapath_or_master_cidr_change_replaces_the_protected_prod_cluster(prod: RunResult) -> None:
    # terraform-provider-google resource_container_cluster.go: datapath_provider and
    # private_cluster_config.master_ipv4_cidr_block are ForceNew.
    (found,) = _replaced(prod, {CLUSTER: {"datapathProvider": "LEGACY_DATAPATH",
                                          "privateClusterConfig.masterIpv4CidrBlock": "172.16.0.0/28",
                                          "releaseChannel.channel": "REGULAR"}})
    assert (found.type, found.keys) == (CLUSTER, ["datapathProvider", "privateClusterConfig.masterIpv4CidrBlock"])
    assert (found.protected, found.delete_first) == (True, True)
    text = found.sentence()
    assert "replaces the cluster: every node pool and every workload on it is recreated" in text
    assert "deleted before the new one is created" in text and "protected" in text


def test_in_place_changes_warn_of_nothing(dev: RunResult) -> None:
    # releaseChannel and enableIntranodeVisibility update in place; the cluster's nodeConfig is ignored.
    assert _replaced(dev, {CLUSTER: {"releaseChannel.channel": "STABLE", "enableIntranodeVisibility": False,
                                     "nodeConfig.oauthScopes": []}}) == []


def test_registry_format_and_bucket_location_replace_them() -> None:
    # resource_artifact_registry_repository.go: format ForceNew; resource_storage_bucket.go: location ForceNew.
    vertex = stack_run("vertex")
    found = _replaced(vertex, {REPOSITORY: {"format": "PYTHON"}, BUCKET: {"location": "EU"}})
    assert [(r.type, r.keys, r.what) for r in found] == [
        (REPOSITORY, ["format"], "replaces the image repository"), (BUCKET, ["location"], "replaces the bucket")]
    assert all(r.delete_first for r in found)


def test_summary_says_it_in_words(dev: RunResult) -> None:
    plan_diff = diff.diff(_base_with(dev, {CLUSTER: {"datapathProvider": "LEGACY_DATAPATH"}}), plan.build(dev))
    md = summary.markdown(dev, [], 0, plan_diff)
    assert "**Replaces stateful resources:**" in md
    assert "replaces the cluster: every node pool and every workload on it is recreated" in md
    assert "Replacements of stateful resources:" in summary.text(dev, [], 0, plan_diff)
    unchanged = diff.diff(plan.build(dev), plan.build(dev))
    assert "Replaces stateful" not in summary.markdown(dev, [], 0, unchanged)


def test_replacement_table_names_its_sources() -> None:
    doc = load_yaml(replacements.DATA)
    assert "terraform-provider-google" in doc["source"] and "pulumi-kubernetes" in doc["source"]
    assert {"datapathProvider", "networkingMode", "privateClusterConfig.masterIpv4CidrBlock"} <= set(
        doc["types"][CLUSTER]["inputs"])


# --- 9. The Helm release: only the client reaches the workers' SSH; the token is a file ----------

def test_workers_admit_only_the_release_client_to_ssh(dev: RunResult, prod: RunResult) -> None:
    # bitnami/deepspeed values.yaml: worker.networkPolicy.allowExternal defaults to true ("Deepspeed will accept
    # connections from any source"); false admits "only pods with the correct client label", which the chart's
    # templates/worker/networkpolicy.yaml spells `{{ common.names.fullname }}-client: "true"`. Release "smoke"
    # does not contain the chart name, so fullname is "smoke-deepspeed" (bitnami/common _names.tpl).
    for run, label in ((dev, "smoke-deepspeed-client"), (prod, "zero3-smoke-deepspeed-client")):
        v = run.one(RELEASE).inputs["values"]
        assert v["worker"]["networkPolicy"] == {"enabled": True, "allowExternal": False}
        assert v["client"]["podLabels"] == {label: "true"}


def test_chart_fullname_follows_bitnami_common() -> None:
    from workloads.deepspeed_release import chart_fullname, client_label

    assert chart_fullname("smoke") == "smoke-deepspeed"
    assert chart_fullname("my-deepspeed-run") == "my-deepspeed-run"  # contains the chart name: used as is
    assert chart_fullname("a" * 60) == "a" * 60 + "-de"  # cut to 63
    assert client_label("smoke") == "smoke-deepspeed-client"


def test_values_with_network_policy_and_token_file_match_the_chart_schema(dev: RunResult) -> None:
    import json

    import jsonschema
    from conftest import reference, validate_json

    schema = json.loads(reference("bitnami-deepspeed", "values.schema.json").read_text())
    v = dev.one(RELEASE).inputs["values"]
    validate_json(v, schema)
    bad = {**v, "worker": {**v["worker"], "networkPolicy": {"allowExternal": "false"}}}
    try:
        validate_json(bad, schema)
    except jsonschema.ValidationError as err:
        assert list(err.absolute_path) == ["worker", "networkPolicy", "allowExternal"]
    else:
        raise AssertionError("a string allowExternal must not validate")


def stack_yaml_workload(stack: str, name: str) -> dict:
    return stack_yaml(stack)["deepspeed-stack:workloads"][name]


def test_a_helm_name_too_long_for_the_client_label_is_a_config_error() -> None:
    from conftest import problems

    name = "n" * 47  # 47 + "-deepspeed-client" = 64 > 63
    found = problems("dev", {f"workloads.{name}": stack_yaml_workload("dev", "smoke"), "workloads.smoke": DELETE})
    assert found == [f"workloads.{name}: the chart's client pod label '{name}-deepspeed-client' is 64 characters, "
                     "over Kubernetes' 63 for a label key; use a name of at most 46 characters, or one that "
                     "contains 'deepspeed' (then the chart does not append it)"]
    ok = "n" * 37 + "-deepspeed"  # 47 characters, but it contains the chart's name
    assert problems("dev", {f"workloads.{ok}": stack_yaml_workload("dev", "smoke"), "workloads.smoke": DELETE}) == []


# --- 5/6. prod against checkov's GCP checks: the values they read, and the pack's rules ------------

SUBNET = "gcp:compute/subnetwork:Subnetwork"
FIREWALL = "gcp:compute/firewall:Firewall"


def test_prod_hardening_values(prod: RunResult) -> None:
    """What checkov's GCP checks read, on prod (each failed before issue 9 under checkov 3.3.30, run on prod's
    registrations converted to a Terraform plan; see README, Policy pack)."""
    cluster = prod.one(CLUSTER).inputs
    assert cluster["enableIntranodeVisibility"] is True  # CKV_GCP_61
    assert cluster["nodeConfig"]["shieldedInstanceConfig"]["enableSecureBoot"] is True  # CKV_GCP_68
    assert cluster["nodeConfig"]["workloadMetadataConfig"]["mode"] == "GKE_METADATA"  # CKV_GCP_69
    assert prod.one(SUBNET).inputs["logConfig"] == {  # CKV_GCP_26: sampled, per network.flowLogs
        "aggregationInterval": "INTERVAL_5_SEC", "flowSampling": 0.5, "metadata": "INCLUDE_ALL_METADATA"}
    vpc = prod.one("gcp:compute/network:Network")
    rules = {r.name: r for r in prod.by_type(FIREWALL)}
    # CKV2_GCP_18: explicit rules on the stack's VPC (its id is the rules' `network`).
    assert [r.property_dependencies["network"] for r in rules.values()] == [[vpc.urn]] * 3
    assert {n: (r.inputs["priority"], r.inputs["sourceRanges"], r.inputs.get("allows"), r.inputs.get("denies"))
            for n, r in rules.items()} == {
        # NCCL (any TCP port) and SSH (2222) between nodes and pods: node range + pod range only.
        "network-internal": (1000, ["10.10.0.0/20", "10.20.0.0/14"],
                             [{"protocol": "tcp"}, {"protocol": "udp"}, {"protocol": "icmp"}], None),
        # prod's masterCidr to kubelets (10250), 443 and controller webhooks (9443).
        "network-control-plane": (1000, ["172.16.0.32/28"], [{"protocol": "tcp", "ports": ["443", "10250", "9443"]}],
                                  None),
        "network-deny-ingress": (65534, ["0.0.0.0/0"], None, [{"protocol": "all"}]),
    }


def test_dev_has_no_control_plane_rule_and_no_flow_logs(dev: RunResult) -> None:
    assert sorted(r.name for r in dev.by_type(FIREWALL)) == ["network-deny-ingress", "network-internal"]
    assert "logConfig" not in dev.one(SUBNET).inputs


def test_flow_log_sampling_is_checked() -> None:
    from conftest import problems

    assert problems("prod", {"network.flowLogs.sampling": 0}) == [
        "network.flowLogs.sampling: must be more than 0, got 0"]
    assert problems("prod", {"network.flowLogs.sampling": 1.5}) == [
        "network.flowLogs.sampling: must be at most 1, got 1.5"]


def _with(reg: Registration, path: str, value: object, stack: str | None = None) -> Registration:
    import re

    inputs = copy.deepcopy(reg.inputs)
    *parents, last = path.split(".")
    node = inputs
    for part in parents:
        node = node.setdefault(part, {})
    if value is DELETE:
        node.pop(last, None)
    else:
        node[last] = value
    urn = reg.urn if stack is None else re.sub(r"^urn:pulumi:[^:]+::", f"urn:pulumi:{stack}::", reg.urn)
    return msgspec.structs.replace(reg, inputs=inputs, urn=urn)


def _violations(policy: str, reg: Registration) -> list[str]:
    from policy import rules
    from preview import policy_check

    return policy_check.validate(next(p for p in rules.POLICIES if p.name == policy), reg, None)


def test_policies_catch_what_checkov_caught(prod: RunResult) -> None:
    cluster, subnet = prod.one(CLUSTER), prod.one(SUBNET)
    assert _violations("gke-intranode-visibility", cluster) == []
    assert _violations("gke-intranode-visibility", _with(cluster, "enableIntranodeVisibility", False)) == [
        "enableIntranodeVisibility must be true: same-node pod traffic would bypass flow logs and firewalls"]
    assert _violations("gcp-subnet-flow-logs-on-prod", subnet) == []
    assert _violations("gcp-subnet-flow-logs-on-prod", _with(subnet, "logConfig", DELETE)) == [
        "logConfig is unset on stack 'prod': set network.flowLogs.enabled: true"]
    assert _violations("gcp-subnet-flow-logs-on-prod", _with(subnet, "logConfig", DELETE, stack="dev")) == []
    # The temporary default pool counts, though removeDefaultNodePool deletes it (CKV_GCP_68/69).
    assert _violations("gke-shielded-nodes", cluster) == []
    assert _violations("gke-shielded-nodes", _with(cluster, "nodeConfig.shieldedInstanceConfig", DELETE)) == [
        "nodeConfig.shieldedInstanceConfig.enableSecureBoot must be true",
        "nodeConfig.shieldedInstanceConfig.enableIntegrityMonitoring must be true"]
    (msg,) = _violations("gke-workload-identity", _with(cluster, "nodeConfig.workloadMetadataConfig.mode",
                                                        "GCE_METADATA"))
    assert msg.startswith("nodeConfig.workloadMetadataConfig.mode is GCE_METADATA")


def test_firewall_policy_refuses_an_allow_from_anywhere(prod: RunResult) -> None:
    internal = prod.one(FIREWALL, "network-internal")
    assert [_violations("gcp-firewall-ingress-not-open", r) for r in prod.by_type(FIREWALL)] == [[], [], []]
    assert _violations("gcp-firewall-ingress-not-open", _with(internal, "sourceRanges", ["0.0.0.0/0"])) == [
        "sourceRanges has 0.0.0.0/0 on an allow rule: the internet could reach the nodes; list only the ranges "
        "that need to"]


# --- 8. Machine shapes: local SSD counts and boot disk types -------------------------------------

def _pool_problems(changes: dict[str, object]) -> list[str]:
    from conftest import problems

    return problems("prod", {"nodePools[0].zones": [], **changes})


def test_catalog_disk_facts_and_their_source() -> None:
    # Compute Engine "Local SSD disks": N1 takes 1-8, 16 or 24; A2 Ultra / A3 / A4 attach a fixed count.
    # Hyperdisk "Machine type support": A3 Ultra and A4 boot only from Hyperdisk.
    from model.machine_disks import _raw, for_machine

    assert "local-ssd" in _raw()["source"] and _raw()["date"] == "2026-11-22"
    n1 = for_machine("n1-standard-8")
    assert (n1.local_ssds, n1.bundled) == ((1, 2, 3, 4, 5, 6, 7, 8, 16, 24), False)
    assert [(m, for_machine(m).local_ssds, for_machine(m).bundled) for m in
            ("a2-ultragpu-4g", "a3-highgpu-8g", "a3-megagpu-8g", "a3-ultragpu-8g", "a4-highgpu-8g")] == [
        ("a2-ultragpu-4g", (4,), True), ("a3-highgpu-8g", (16,), True), ("a3-megagpu-8g", (16,), True),
        ("a3-ultragpu-8g", (32,), True), ("a4-highgpu-8g", (32,), True)]
    assert for_machine("a4-highgpu-8g").boot_disks == for_machine("a3-ultragpu-8g").boot_disks == (
        "hyperdisk-balanced",)
    assert "hyperdisk-balanced" not in for_machine("n1-standard-8").boot_disks
    assert for_machine("e2-standard-4") is None  # not a GPU family: nothing to check


def test_wrong_local_ssd_counts_are_config_errors() -> None:
    # prod's pool is a g2-standard-8 (1 local SSD or none).
    assert _pool_problems({"nodePools[0].localSsdCount": 2}) == [
        "nodePools[0].localSsdCount: g2-standard-8 does not take 2 local SSDs; use 0 or 1"]
    n1 = {"nodePools[0].gpu.type": "nvidia-tesla-t4", "nodePools[0].machineType": "n1-standard-8",
          "nodePools[0].localSsdCount": 9, "workloads": {}}
    assert _pool_problems(n1) == [
        "nodePools[0].localSsdCount: n1-standard-8 does not take 9 local SSDs; use 0, 1, 2, 3, 4, 5, 6, 7, 8, 16 or 24"]
    assert _pool_problems({**n1, "nodePools[0].localSsdCount": 24}) == []
    a3 = {"nodePools[0].gpu.type": "nvidia-h100-80gb", "nodePools[0].gpu.count": 8,
          "nodePools[0].machineType": "a3-highgpu-8g", "nodePools[0].localSsdCount": 8,
          "workloads": {}}
    found = [p for p in _pool_problems(a3) if p.startswith("nodePools[0].localSsdCount")]
    assert found == ["nodePools[0].localSsdCount: a3-highgpu-8g does not take 8 local SSDs; use 0 (as the shape "
                     "comes) or 16, the count it always has"]


def test_wrong_boot_disk_types_are_config_errors() -> None:
    assert _pool_problems({"nodePools[0].diskType": "hyperdisk-balanced"}) == [
        "nodePools[0].diskType: g2-standard-8 does not boot from hyperdisk-balanced; use pd-balanced or pd-ssd"]
    b200 = {"nodePools[0].gpu.type": "nvidia-b200", "nodePools[0].gpu.count": 8,
            "nodePools[0].machineType": "a4-highgpu-8g", "workloads": {}}
    found = [p for p in _pool_problems(b200) if p.startswith("nodePools[0].diskType")]
    assert found == ["nodePools[0].diskType: a4-highgpu-8g does not boot from pd-balanced; use hyperdisk-balanced"]
    assert [p for p in _pool_problems({**b200, "nodePools[0].diskType": "hyperdisk-balanced"})
            if p.startswith("nodePools[0].diskType")] == []


def test_tfplan_gives_checkov_what_its_gcp_checks_read(prod: RunResult) -> None:
    """preview/tfplan.py: Terraform attribute names and blocks, and references for checkov's graph checks."""
    from preview import tfplan

    doc = tfplan.plan(prod)
    after = {c["address"]: c["change"]["after"] for c in doc["resource_changes"]}
    cluster = after["google_container_cluster.cluster"]
    assert cluster["enable_intranode_visibility"] is True
    assert cluster["node_config"][0]["shielded_instance_config"] == [
        {"enable_secure_boot": True, "enable_integrity_monitoring": True}]
    assert cluster["node_config"][0]["workload_metadata_config"] == [{"mode": "GKE_METADATA"}]
    assert after["google_compute_subnetwork.network_subnet"]["log_config"][0]["flow_sampling"] == 0.5
    assert after["google_compute_firewall.network_internal"]["allow"][0] == {"protocol": "tcp"}
    refs = {r["address"]: r["expressions"] for r in doc["configuration"]["root_module"]["resources"]}
    assert refs["google_compute_firewall.network_deny_ingress"]["network"] == {
        "references": ["google_compute_network.network_vpc.id"]}
