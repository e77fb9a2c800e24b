"""The policy pack (policy/rules.py and the rules_*.py beside it), offline: every policy with a compliant and a
violating resource.

Resources come from the preview's records (camelCase inputs, as the analyzer passes props); a violating
one is a recorded resource with one value changed. `validate()` calls the policy the way the analyzer does.
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from typing import Any

import msgspec
import pytest
import yaml
from conftest import PROJECT_DIR, stack_run, stacks, user_docs
from pulumi_policy import EnforcementLevel

from policy import rules, rules_support
from preview import policy_check
from preview.engine import Registration, RunResult

CLUSTER = "gcp:container/cluster:Cluster"
NODE_POOL = "gcp:container/nodePool:NodePool"
RELEASE = "kubernetes:helm.sh/v3:Release"
MPIJOB = "kubernetes:kubeflow.org/v2beta1:MPIJob"
POLICIES = {p.name: p for p in rules.POLICIES}
HABANA = "vault.habana.ai/gaudi-docker/1.19.1/ubuntu22.04/habanalabs/pytorch-installer-2.5.1:latest"


def check(name: str, reg: Registration, **config: Any) -> list[str]:
    return policy_check.validate(POLICIES[name], reg, config or None)


def changed(reg: Registration, path: str, value: Any, stack: str | None = None) -> Registration:
    """A copy of `reg` with one input set (dotted path, [i] for list items); `stack` moves it to another stack."""
    inputs = copy.deepcopy(reg.inputs)
    parts = [int(p) if p.isdigit() else p for p in re.findall(r"[^.\[\]]+", path)]
    node: Any = inputs
    for part in parts[:-1]:
        node = node[part] if isinstance(node, list) else node.setdefault(part, {})
    if value is DELETE:
        del node[parts[-1]]
    else:
        node[parts[-1]] = value
    urn = reg.urn if stack is None else re.sub(r"^urn:pulumi:[^:]+::", f"urn:pulumi:{stack}::", reg.urn)
    return msgspec.structs.replace(reg, inputs=inputs, urn=urn)


DELETE = object()


def gpu_pool(run: RunResult) -> Registration:
    return next(r for r in run.by_type(NODE_POOL) if r.inputs["nodeConfig"].get("guestAccelerators"))


# --- the pack as a whole ---------------------------------------------------------------------------

@pytest.mark.parametrize("stack", stacks())
def test_repo_stacks_have_no_mandatory_violation(stack: str) -> None:
    no_mandatory_violation(stack_run(stack, example=False))


def no_mandatory_violation(run: RunResult) -> None:
    assert [(v.policy, v.message) for v in policy_check.evaluate(run) if v.mandatory] == []


def test_policy_names_are_unique_and_documented() -> None:
    names = [p.name for p in rules.POLICIES]
    assert len(names) == len(set(names)) == 19
    readme = user_docs()
    assert [n for n in names if f"`{n}`" not in readme] == []


def test_pack_files() -> None:
    pack = yaml.safe_load((PROJECT_DIR / "policy" / "PulumiPolicy.yaml").read_text(encoding="utf-8"))
    assert pack["runtime"]["name"] == "python"
    assert pack["runtime"]["options"]["virtualenv"] == "venv"
    main = (PROJECT_DIR / "policy" / "__main__.py").read_text(encoding="utf-8")
    assert "from policy.rules import POLICIES" in main and "PolicyPack(" in main
    # The pack's own virtualenv pins what the project pins.
    pins = {line.split("==")[0]: line for line in (PROJECT_DIR / "requirements.txt").read_text().split("\n")
            if "==" in line}
    for line in (PROJECT_DIR / "policy" / "requirements.txt").read_text().split("\n"):
        if "==" in line:
            assert pins[line.split("==")[0]] == line


# Pulumi's runner for a Python pack (`python -m pulumi.policy`) runs the pack's folder with runpy.run_path:
# __main__.py with policy/ itself on sys.path. Isolated (-I), so the project root is not on it either.
PACK_AS_PULUMI_RUNS_IT = """
import importlib.util, runpy, sys
import pulumi_policy
assert importlib.util.find_spec("policy") is None
pulumi_policy.PolicyPack = lambda **pack: print("\\n".join(p.name for p in pack["policies"]))
runpy.run_path(sys.argv[1], run_name="__main__")
"""


def test_the_pack_loads_as_pulumi_runs_it() -> None:
    """There the pack's folder itself is on sys.path and no package `policy` is installed: `import policy` finds
    policy/policy.py, which makes itself the package, and the pack gets every policy the project's `policy.rules`
    has."""
    result = subprocess.run([sys.executable, "-I", "-c", PACK_AS_PULUMI_RUNS_IT, str(PROJECT_DIR / "policy")],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [p.name for p in rules.POLICIES]


def test_only_habana_digest_is_advisory() -> None:
    advisory = [p.name for p in rules.POLICIES if p.enforcement_level == EnforcementLevel.ADVISORY]
    assert advisory == ["habana-images-by-digest"]


def test_policy_config_overrides_the_enforcement_level(dev: RunResult) -> None:
    bad = changed(dev.one(CLUSTER), "enableLegacyAbac", True)
    run = RunResult("dev", [bad], {})
    (default,) = policy_check.evaluate(run)
    assert (default.policy, default.level) == ("gke-no-legacy-abac", "mandatory")
    (relaxed,) = policy_check.evaluate(run, {"gke-no-legacy-abac": "advisory"})
    assert relaxed.level == "advisory" and not relaxed.mandatory
    assert policy_check.evaluate(run, {"gke-no-legacy-abac": {"enforcementLevel": "disabled"}}) == []


# --- which stack ---------------------------------------------------------------------------------

def test_stack_comes_from_config_then_env_then_urn(dev: RunResult, monkeypatch: pytest.MonkeyPatch) -> None:
    args = policy_check.validation_args(dev.one(CLUSTER))
    assert rules_support.stack_name(args) == "dev"
    monkeypatch.setenv(rules_support.STACK_ENV, "staging")
    assert rules_support.stack_name(args) == "staging"
    assert rules_support.stack_name(policy_check.validation_args(dev.one(CLUSTER), {"stack": "qa"})) == "qa"


# --- GKE -----------------------------------------------------------------------------------------

def test_private_nodes(dev: RunResult, prod: RunResult, monkeypatch: pytest.MonkeyPatch) -> None:
    assert check("gke-private-nodes", prod.one(CLUSTER)) == []
    assert check("gke-private-nodes", dev.one(CLUSTER)) == []  # dev may be public
    (msg,) = check("gke-private-nodes", changed(prod.one(CLUSTER), "privateClusterConfig", DELETE))
    assert "privateClusterConfig.enablePrivateNodes must be true on stack 'prod'" in msg
    # The dev cluster's inputs on any other stack, named by config or by the environment.
    assert check("gke-private-nodes", dev.one(CLUSTER), stack="staging") != []
    assert check("gke-private-nodes", dev.one(CLUSTER), devStacks=["sandbox"]) != []
    monkeypatch.setenv(rules_support.STACK_ENV, "staging")
    assert check("gke-private-nodes", dev.one(CLUSTER)) != []


@pytest.mark.parametrize("cidr", ["0.0.0.0/0", "::/0"])
def test_authorized_networks_not_open(prod: RunResult, cidr: str) -> None:
    assert check("gke-authorized-networks-not-open", prod.one(CLUSTER)) == []
    bad = changed(prod.one(CLUSTER), "masterAuthorizedNetworksConfig.cidrBlocks[0].cidrBlock", cidr)
    (msg,) = check("gke-authorized-networks-not-open", bad)
    assert msg.startswith(f"masterAuthorizedNetworksConfig.cidrBlocks[0].cidrBlock is {cidr}")


def test_workload_identity(dev: RunResult) -> None:
    assert check("gke-workload-identity", dev.one(CLUSTER)) == []
    assert check("gke-workload-identity", gpu_pool(dev)) == []
    (msg,) = check("gke-workload-identity", changed(dev.one(CLUSTER), "workloadIdentityConfig", DELETE))
    assert "workloadIdentityConfig.workloadPool must be PROJECT.svc.id.goog, got None" in msg
    (msg,) = check("gke-workload-identity",
                   changed(gpu_pool(dev), "nodeConfig.workloadMetadataConfig.mode", "GCE_METADATA"))
    assert msg.startswith("nodeConfig.workloadMetadataConfig.mode is GCE_METADATA")


def test_shielded_nodes(dev: RunResult) -> None:
    assert check("gke-shielded-nodes", gpu_pool(dev)) == []
    assert check("gke-shielded-nodes", dev.one(NODE_POOL, "cluster-system")) == []
    assert check("gke-shielded-nodes", dev.one(CLUSTER)) == []
    bad = changed(gpu_pool(dev), "nodeConfig.shieldedInstanceConfig.enableSecureBoot", False)
    assert check("gke-shielded-nodes", bad) == ["nodeConfig.shieldedInstanceConfig.enableSecureBoot must be true"]
    bad = changed(gpu_pool(dev), "nodeConfig.shieldedInstanceConfig", DELETE)
    assert len(check("gke-shielded-nodes", bad)) == 2
    assert check("gke-shielded-nodes", changed(dev.one(CLUSTER), "enableShieldedNodes", False)) == [
        "enableShieldedNodes is false"]


@pytest.mark.parametrize("account", ["123456789-compute@developer.gserviceaccount.com", "default", DELETE])
def test_node_service_account(dev: RunResult, account: Any) -> None:
    assert check("gke-node-service-account", gpu_pool(dev)) == []
    assert check("gke-node-service-account", dev.one(CLUSTER)) == []  # the removed default pool's account too
    (msg,) = check("gke-node-service-account", changed(gpu_pool(dev), "nodeConfig.serviceAccount", account))
    assert msg.startswith("nodeConfig.serviceAccount is ") and "dedicated least-privilege" in msg
    (msg,) = check("gke-node-service-account", changed(dev.one(CLUSTER), "nodeConfig.serviceAccount", account))
    assert msg.startswith("nodeConfig.serviceAccount is ")


def test_release_channel(dev: RunResult) -> None:
    assert check("gke-release-channel", dev.one(CLUSTER)) == []
    (msg,) = check("gke-release-channel", changed(dev.one(CLUSTER), "releaseChannel.channel", "UNSPECIFIED"))
    assert msg.startswith("releaseChannel.channel is UNSPECIFIED")
    assert check("gke-release-channel", changed(dev.one(CLUSTER), "releaseChannel", DELETE)) != []


@pytest.mark.parametrize("key", ["autoRepair", "autoUpgrade"])
def test_node_auto_repair_upgrade(dev: RunResult, key: str) -> None:
    assert check("gke-node-auto-repair-upgrade", gpu_pool(dev)) == []
    assert check("gke-node-auto-repair-upgrade", changed(gpu_pool(dev), f"management.{key}", False)) == [
        f"management.{key} must be true"]


def test_cos_containerd(dev: RunResult) -> None:
    assert check("gke-cos-containerd", gpu_pool(dev)) == []
    (msg,) = check("gke-cos-containerd", changed(gpu_pool(dev), "nodeConfig.imageType", "UBUNTU_CONTAINERD"))
    assert msg == "nodeConfig.imageType is UBUNTU_CONTAINERD; use COS_CONTAINERD"


def test_no_legacy_abac(dev: RunResult) -> None:
    assert check("gke-no-legacy-abac", dev.one(CLUSTER)) == []
    assert check("gke-no-legacy-abac", changed(dev.one(CLUSTER), "enableLegacyAbac", True)) != []


def test_no_client_certificate(dev: RunResult) -> None:
    assert check("gke-no-client-certificate", dev.one(CLUSTER)) == []
    bad = changed(dev.one(CLUSTER), "masterAuth.clientCertificateConfig.issueClientCertificate", True)
    (msg,) = check("gke-no-client-certificate", bad)
    assert msg.startswith("masterAuth.clientCertificateConfig.issueClientCertificate is true")


def test_deletion_protection_on_prod(dev: RunResult, prod: RunResult) -> None:
    assert check("gke-deletion-protection-on-prod", prod.one(CLUSTER)) == []
    assert check("gke-deletion-protection-on-prod", dev.one(CLUSTER)) == []  # dev's is off on purpose
    (msg,) = check("gke-deletion-protection-on-prod", changed(prod.one(CLUSTER), "deletionProtection", False))
    assert msg.startswith("deletionProtection is false on stack 'prod'")
    assert check("gke-deletion-protection-on-prod", dev.one(CLUSTER), prodStacks=["dev"]) != []


# --- workloads -----------------------------------------------------------------------------------

LAUNCHER = "spec.mpiReplicaSpecs.Launcher.template.spec.containers[0]"
WORKER = "spec.mpiReplicaSpecs.Worker.template.spec.containers[0]"


def test_no_plaintext_secret_env_in_pod_specs(gaudi: RunResult) -> None:
    job = gaudi.one(MPIJOB)
    assert check("no-plaintext-secret-env", job) == []
    env = [*job.inputs["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["env"],
           {"name": "HUGGING_FACE_HUB_TOKEN", "value": "hf_plain"}]
    (msg,) = check("no-plaintext-secret-env", changed(job, f"{LAUNCHER}.env", env))
    assert msg.startswith(f"{LAUNCHER}.env[{len(env) - 1}] sets HUGGING_FACE_HUB_TOKEN to a literal value")
    # From a Secret, or an empty slot, is fine.
    ok = [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
          {"name": "HUGGING_FACE_HUB_TOKEN", "value": ""}]
    assert check("no-plaintext-secret-env", changed(job, f"{LAUNCHER}.env", ok)) == []


def test_no_plaintext_secret_env_in_helm_values(dev: RunResult) -> None:
    release = dev.one(RELEASE)
    assert check("no-plaintext-secret-env", release) == []
    bad = changed(release, "values.worker.extraEnvVars", [{"name": "WANDB_API_KEY", "value": "k"}])
    (msg,) = check("no-plaintext-secret-env", bad)
    assert msg.startswith("values.worker.extraEnvVars[0] sets WANDB_API_KEY")


def test_accelerator_pods_set_resources(dev: RunResult, gaudi: RunResult) -> None:
    release = dev.one(RELEASE)
    assert check("accelerator-pods-set-resources", release) == []
    (msg,) = check("accelerator-pods-set-resources", changed(release, "values.worker.resources.limits.cpu", DELETE))
    assert msg == "values.worker.resources requests accelerators but has no limits.cpu"
    # A Gaudi worker: cards, CPU and memory, requests = limits.
    job = gaudi.one(MPIJOB)
    full = {"habana.ai/gaudi": "8", "cpu": "64", "memory": "250Gi"}
    compliant = changed(job, f"{WORKER}.resources", {"requests": dict(full), "limits": dict(full)})
    assert check("accelerator-pods-set-resources", compliant) == []
    no_memory = {k: v for k, v in full.items() if k != "memory"}
    (msg,) = check("accelerator-pods-set-resources",
                   changed(job, f"{WORKER}.resources", {"requests": no_memory, "limits": no_memory}))
    assert msg == f"{WORKER}.resources requests accelerators but has no requests.memory, limits.memory"


@pytest.mark.parametrize("image", [
    {"registry": "docker.io", "repository": "bitnami/deepspeed", "tag": "latest"},
    {"registry": "docker.io", "repository": "bitnami/deepspeed"},
])
def test_helm_images_pinned_outside_dev(prod: RunResult, image: dict[str, str]) -> None:
    release = prod.one(RELEASE)
    assert check("images-pinned", release) == []  # the stack's image, by digest
    (msg,) = check("images-pinned", changed(release, "values.image", image))
    assert msg.startswith("values.image is 'docker.io/bitnami/deepspeed")
    assert check("images-pinned", changed(release, "values.image", image, stack="dev")) == []


def test_release_without_image_relies_on_the_chart_default(prod: RunResult) -> None:
    (msg,) = check("images-pinned", changed(prod.one(RELEASE), "values.image", DELETE))
    assert msg.startswith("values.image is not set") and "bitnamilegacy" in msg


@pytest.mark.parametrize("image", ["nginx", "nginx:latest", "registry.example/app:latest"])
def test_pod_images_pinned(gaudi: RunResult, image: str) -> None:
    job = gaudi.one(MPIJOB)
    (msg,) = check("images-pinned", changed(job, f"{WORKER}.image", image))
    assert msg == f"{WORKER}.image is {image!r}: pin a digest (@sha256:...) or a fixed tag, never `latest` or no tag"
    assert check("images-pinned", changed(job, f"{WORKER}.image", "nginx:1.27.3")) == []
    assert check("images-pinned", changed(job, f"{WORKER}.image", "nginx@sha256:" + "a" * 64)) == []


def test_habana_latest_is_advisory_not_mandatory(gaudi: RunResult) -> None:
    job = changed(changed(gaudi.one(MPIJOB), f"{LAUNCHER}.image", HABANA), f"{WORKER}.image", HABANA)
    assert check("images-pinned", job) == []
    assert check("habana-images-by-digest", job) == [
        f"{where}.image is '{HABANA}': versioned by path only; pin it as ...@sha256:<digest> "
        "(docker buildx imagetools inspect shows the digest)" for where in (LAUNCHER, WORKER)]
    pinned = HABANA.replace(":latest", "@sha256:" + "b" * 64)
    job = changed(changed(job, f"{LAUNCHER}.image", pinned), f"{WORKER}.image", pinned)
    assert check("habana-images-by-digest", job) == []


@pytest.mark.parametrize("version", ["^2.3.0", "2.x", "latest", "", DELETE])
def test_helm_chart_version_pinned(dev: RunResult, version: Any) -> None:
    release = dev.one(RELEASE)
    assert check("helm-chart-version-pinned", release) == []
    (msg,) = check("helm-chart-version-pinned", changed(release, "version", version))
    assert "pin an exact chart version" in msg


# --- real runs: props are proxies with unknowns ----------------------------------------------------

def test_unknown_values_during_preview_do_not_stop_a_policy(prod: RunResult) -> None:
    """In `pulumi preview` the image digest of a build not done yet is unknown: the analyzer's proxy raises
    on access. The policies read through `plain()`, so the rest of the resource is still checked."""
    from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, unknown_checking_proxy

    release = prod.one(RELEASE)
    inputs = copy.deepcopy(release.inputs)
    inputs["values"]["image"]["digest"] = UNKNOWN_STRING_VALUE
    args = policy_check.validation_args(release)
    args.props = unknown_checking_proxy(inputs)
    found: list[str] = []
    POLICIES["images-pinned"].validate(args, lambda m, urn=None: found.append(m))
    assert found == []
    inputs["version"] = "^2"
    args.props = unknown_checking_proxy(inputs)
    POLICIES["helm-chart-version-pinned"].validate(args, lambda m, urn=None: found.append(m))
    assert len(found) == 1


def test_the_pack_through_pulumis_analyzer(prod: RunResult) -> None:
    """The gRPC analyzer Pulumi talks to (`pulumi preview --policy-pack policy`), fed the recorded inputs:
    nothing on the prod stack, one mandatory diagnostic once a cluster turns legacy ABAC on."""
    from google.protobuf import struct_pb2
    from pulumi.runtime import proto
    from pulumi_policy.policy import _PolicyAnalyzerServicer

    analyzer = _PolicyAnalyzerServicer("deepspeed-stack", "0.1.0", rules.POLICIES, EnforcementLevel.MANDATORY)

    def analyze(reg: Registration) -> list[Any]:
        props = struct_pb2.Struct()
        props.update(reg.inputs)
        request = proto.AnalyzeRequest(type=reg.type, properties=props, urn=reg.urn, name=reg.name)
        return list(analyzer.Analyze(request, None).diagnostics)

    assert [d for reg in prod.resources for d in analyze(reg)] == []
    (diagnostic,) = analyze(changed(prod.one(CLUSTER), "enableLegacyAbac", True))
    assert (diagnostic.policyName, diagnostic.enforcementLevel) == ("gke-no-legacy-abac", proto.MANDATORY)
    assert diagnostic.message.endswith("enableLegacyAbac is true; authorize with RBAC only")


def test_dws_pools_must_have_auto_repair_off(dev: RunResult) -> None:
    # GKE refuses auto-repair on flex-start / queued-provisioning pools (data/capacity.yaml, GKE DWS docs).
    flex = changed(gpu_pool(dev), "nodeConfig.flexStart", True)
    assert check("gke-node-auto-repair-upgrade", flex) == [
        "management.autoRepair must be false on a flex-start or queued-provisioning pool (GKE refuses it)"]
    assert check("gke-node-auto-repair-upgrade", changed(flex, "management.autoRepair", False)) == []
    queued = changed(changed(gpu_pool(dev), "queuedProvisioning", {"enabled": True}), "management.autoRepair", False)
    assert check("gke-node-auto-repair-upgrade", queued) == []
    assert check("gke-node-auto-repair-upgrade", changed(queued, "management.autoUpgrade", False)) == [
        "management.autoUpgrade must be true"]
