"""The gaudi stack (Pulumi.gaudi.yaml) under mocks: the Omnia reference reproduced on an existing cluster,
core objects valid for Kubernetes, secrets kept secret, and the optional operator and NFS provisioner."""

from __future__ import annotations

import copy
import json
import socket
from typing import Any

import kubernetes_validate
import pytest
from conftest import load_stack_config

from preview.engine import SECRET, RunResult, run_program

MPIJOB = "kubernetes:kubeflow.org/v2beta1:MPIJob"
NAMESPACE = "kubernetes:core/v1:Namespace"
CLAIM = "kubernetes:core/v1:PersistentVolumeClaim"
SECRET_TYPE = "kubernetes:core/v1:Secret"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
TRAINING_JOB = "deepspeed-stack:workloads:TrainingJob"
NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
K8S_VERSION = "1.33.0"
# Plain-text canaries: they must never show up outside a secret.
HF_TOKEN = "hf_canary_token_never_in_plain_text"
KUBECONFIG = "apiVersion: v1\nkind: Config\n# kubeconfig-canary-never-in-plain-text\n"


def refuse(*args: Any, **kwargs: Any) -> None:
    raise AssertionError(f"network access during an offline run: {args}")


class NoNetwork(socket.socket):
    def connect(self, *args: Any, **kwargs: Any) -> None:
        refuse(*args)


@pytest.fixture(scope="module")
def full() -> RunResult:
    """The gaudi stack with the secret token and kubeconfig, the operator and the NFS provisioner installed,
    run with sockets that refuse to connect: the operator's manifest URL is fetched by the provider at
    `pulumi up`, never by the program."""
    config, secret_keys = load_stack_config("gaudi")
    config.update({
        "deepspeed-stack:hfToken": HF_TOKEN,
        "deepspeed-stack:kubeconfig": KUBECONFIG,
        "deepspeed-stack:mpiOperator": json.dumps({"install": True}),
        "deepspeed-stack:nfsProvisioner": json.dumps({"install": True, "server": "10.0.0.5", "path": "/exports"}),
    })
    secrets = [*secret_keys, "deepspeed-stack:hfToken", "deepspeed-stack:kubeconfig"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket, "socket", NoNetwork)
        mp.setattr(socket, "create_connection", refuse)
        return run_program(config, secrets, stack="gaudi")


def k8s_object(reg: Any) -> dict[str, Any]:
    """A deep copy: tests that break the object on purpose must not touch the cached run."""
    return copy.deepcopy({k: v for k, v in reg.inputs.items() if k in (
        "apiVersion", "kind", "metadata", "spec", "data", "stringData", "type")})


# --- the Omnia reference, reproduced --------------------------------------------------------------

def test_no_gcp_resources_and_one_existing_cluster(gaudi: RunResult) -> None:
    """One cluster, two providers for it: one that adopts what exists (the namespace and the claim), one that never
    does (the rest, the MPIJob first: an old job of the same name stops pulumi up instead of being taken over, issue 30
    item 5)."""
    assert [r.type for r in gaudi.resources if r.type.startswith("gcp:")] == []
    providers = {r.name: r for r in gaudi.by_type("pulumi:providers:kubernetes")}
    assert sorted(providers) == ["target-k8s", "target-k8s-create-only"]
    for provider in providers.values():
        assert provider.inputs["context"] == "kubernetes-admin@cluster.local"
        assert "kubeconfig" not in provider.inputs  # none configured: the deploying machine's kubeconfig
        assert gaudi.get(provider.parent).type == "deepspeed-stack:k8s:ExistingCluster"
    k8s = [r for r in gaudi.resources if r.type.startswith("kubernetes:")]
    adopting = {r.type for r in k8s if r.provider == providers["target-k8s"].urn}
    assert adopting == {NAMESPACE, CLAIM}
    assert {r.provider for r in k8s if r.type not in adopting} == {providers["target-k8s-create-only"].urn}


def test_training_job_children(gaudi: RunResult) -> None:
    job = gaudi.one(TRAINING_JOB, "gaudi-llm-ds-ft")
    children = sorted((r.type, r.name) for r in gaudi.resources if r.parent == job.urn)
    assert children == sorted([
        (NAMESPACE, "gaudi-llm-ds-ft-namespace"),
        (CLAIM, "gaudi-llm-ds-ft-claim"),
        (CONFIG_MAP, "gaudi-llm-ds-ft-config"),
        (NETWORK_POLICY, "gaudi-llm-ds-ft-launcher-policy"),
        (NETWORK_POLICY, "gaudi-llm-ds-ft-worker-policy"),
        (MPIJOB, "gaudi-llm-ds-ft-mpijob"),
    ])
    assert job.dependencies == []  # no operator installed by this stack, no GKE pool
    assert gaudi.outputs["workloads"]["gaudi-llm-ds-ft"]["namespace"] == "workloads"


def test_mpijob_matches_the_omnia_reference(gaudi: RunResult, omnia: dict[str, Any]) -> None:
    job = gaudi.one(MPIJOB).inputs
    ref_spec = omnia["spec"]
    assert job["metadata"]["name"] == omnia["metadata"]["name"]
    assert job["metadata"]["namespace"] == omnia["metadata"]["namespace"]
    assert job["spec"]["slotsPerWorker"] == ref_spec["slotsPerWorker"]
    assert job["spec"]["runPolicy"]["cleanPodPolicy"] == ref_spec["runPolicy"]["cleanPodPolicy"]
    for role in ("Launcher", "Worker"):
        ours, theirs = job["spec"]["mpiReplicaSpecs"][role], ref_spec["mpiReplicaSpecs"][role]
        assert ours["replicas"] == theirs["replicas"]
        (c,), (rc,) = ours["template"]["spec"]["containers"], theirs["template"]["spec"]["containers"]
        # Not Habana's `:latest` with installs at every start: the stack's Gaudi image, by digest.
        assert rc["image"].endswith(":latest")
        assert c["image"] == gaudi.outputs["gaudiImageRef"]
        assert c["image"].startswith("registry.example.internal/ml/deepspeed-gaudi@sha256:")
        assert c["name"] == rc["name"]
        mount = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}["shared"]
        assert mount == rc["volumeMounts"][0]["mountPath"]
        claim = {v["name"]: v for v in ours["template"]["spec"]["volumes"]}["shared"]["persistentVolumeClaim"]
        assert claim["claimName"] == theirs["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
    worker = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    ref_worker = ref_spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    limits = worker["containers"][0]["resources"]["limits"]
    assert int(limits["habana.ai/gaudi"]) == ref_worker["containers"][0]["resources"]["limits"]["habana.ai/gaudi"]
    assert worker["hostIPC"] is ref_worker["hostIPC"] is True


def test_launcher_env_matches_the_reference_without_the_plain_token(gaudi: RunResult, omnia: dict[str, Any]) -> None:
    (c,) = gaudi.one(MPIJOB).inputs["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
    ours = {e["name"]: e.get("value") for e in c["env"]}
    (rc,) = omnia["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
    theirs = {e["name"]: e["value"] for e in rc["env"]}
    for name in ("NUM_HPU", "NUM_EPOCHS", "no_proxy"):
        assert ours[name] == theirs[name], name
    # HF_HOME: not Omnia's /storage/huggingface, which its by-hand run made as root and the ranks (uid 10001) cannot
    # write, but a folder of the same claim they make and own.
    assert (theirs["HF_HOME"], ours["HF_HOME"]) == ("/storage/huggingface", "/storage/deepspeed-stack/huggingface")
    # LLM_MODEL: Omnia's gated Llama is replaced by an open model (test_omnia.test_model_epochs_and_cards_are_omnias).
    # The reference carries HUGGING_FACE_HUB_TOKEN as a literal value; without hfToken we set none at all.
    assert "HUGGING_FACE_HUB_TOKEN" in theirs and "HUGGING_FACE_HUB_TOKEN" not in ours


def test_claim_is_read_write_many_on_nfs_client(gaudi: RunResult) -> None:
    claim = gaudi.one(CLAIM).inputs
    assert claim["metadata"] == {"name": "shared-model", "namespace": "workloads",
                                 "labels": {"app.kubernetes.io/managed-by": "pulumi",
                                            "deepspeed-stack/workload": "gaudi-llm-ds-ft"}}
    assert claim["spec"] == {"accessModes": ["ReadWriteMany"], "storageClassName": "nfs-client",
                             "resources": {"requests": {"storage": "100Gi"}}}


def test_config_map_holds_ds_config(gaudi: RunResult) -> None:
    cm = gaudi.one(CONFIG_MAP).inputs
    assert cm["metadata"]["name"] == "gaudi-llm-ds-ft-deepspeed"
    ds = json.loads(cm["data"]["ds_config.json"])
    assert ds["train_batch_size"] == 128  # 1 worker x 8 cards x micro batch 8 x accumulation 2


def test_core_objects_are_valid_kubernetes(gaudi: RunResult, full: RunResult) -> None:
    for kind in (NAMESPACE, CLAIM, CONFIG_MAP):
        kubernetes_validate.validate(k8s_object(gaudi.one(kind)), K8S_VERSION, strict=True)
    secret = k8s_object(full.one(SECRET_TYPE))
    assert secret["stringData"] == SECRET  # redacted as a whole; validate its shape with a stand-in value
    kubernetes_validate.validate({**secret, "stringData": {"token": "stand-in"}}, K8S_VERSION, strict=True)


def test_core_object_validation_rejects_a_wrong_access_mode_field(gaudi: RunResult) -> None:
    claim = k8s_object(gaudi.one(CLAIM))
    claim["spec"]["accessMode"] = "ReadWriteMany"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(claim, K8S_VERSION, strict=True)


# --- secrets --------------------------------------------------------------------------------------

def test_hf_token_is_only_a_secret(full: RunResult) -> None:
    secret = full.one(SECRET_TYPE)
    assert secret.inputs["metadata"]["name"] == "gaudi-llm-ds-ft-hf-token"
    assert secret.inputs["stringData"] == SECRET
    assert "stringData" in secret.secret_paths
    launcher = full.one(MPIJOB).inputs["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    (c,) = launcher["containers"]
    # A mounted file, never an env var of the pod spec.
    assert not [e for e in c["env"] if "valueFrom" in e]
    volumes = {v["name"]: v for v in launcher["volumes"]}
    assert volumes["hf-token"]["secret"]["secretName"] == "gaudi-llm-ds-ft-hf-token"


def test_kubeconfig_is_only_a_secret(full: RunResult) -> None:
    for provider in full.by_type("pulumi:providers:kubernetes"):
        assert provider.inputs["kubeconfig"] == SECRET
        assert provider.inputs["context"] == "kubernetes-admin@cluster.local"


def test_no_secret_in_plain_text_anywhere(full: RunResult) -> None:
    everything = json.dumps([r.inputs for r in full.resources]) + json.dumps(full.outputs)
    assert HF_TOKEN not in everything
    assert "kubeconfig-canary" not in everything


# --- MPI operator and NFS provisioner -------------------------------------------------------------

def test_operator_is_the_pinned_manifest_and_the_job_waits_for_it(full: RunResult) -> None:
    manifest = full.one("kubernetes:yaml/v2:ConfigFile")
    assert manifest.inputs == {
        "file": "https://raw.githubusercontent.com/kubeflow/mpi-operator/v0.8.0/deploy/v2beta1/mpi-operator.yaml"}
    assert manifest.custom is False  # a provider-side component: the provider fetches it at `pulumi up`
    assert full.get(manifest.parent).type == "deepspeed-stack:workloads:MpiOperator"
    # The MPIJob waits for the operator (its CRD and controller); the rest of the job (namespace, claim) need not.
    assert full.one(TRAINING_JOB).dependencies == []
    assert manifest.urn in full.one(MPIJOB).dependencies


def test_nfs_provisioner_release_and_the_claim_waits_for_it(full: RunResult) -> None:
    release = full.one("kubernetes:helm.sh/v3:Release")
    assert release.inputs["chart"] == "nfs-subdir-external-provisioner"
    assert release.inputs["version"] == "4.0.18"
    assert release.inputs["repositoryOpts"] == {
        "repo": "https://kubernetes-sigs.github.io/nfs-subdir-external-provisioner/"}
    assert release.inputs["values"] == {"nfs": {"server": "10.0.0.5", "path": "/exports"},
                                        "storageClass": {"name": "nfs-client"}}
    assert release.urn in full.one(CLAIM).dependencies
    assert release.urn not in full.one(TRAINING_JOB).dependencies
