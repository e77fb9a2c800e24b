"""Every pod of the stack's NVIDIA image hardened (issue 32, item 8): the launcher and workers of every NVIDIA MPIJob of
every example stack (kind mpijob and kind finetune), the NCCL test's pods, the Helm chart's client and workers, and
the written waivers of what cannot pass, each resting on its source."""

from __future__ import annotations

import re
from typing import Any

import pytest
from conftest import PROJECT_DIR, examples, reference, stack_path, stack_run, stacks, yaml_load

from preview.engine import RunResult

MPIJOB = "kubernetes:kubeflow.org/v2beta1:MPIJob"
JOB = "kubernetes:batch/v1:Job"
RELEASE = "kubernetes:helm.sh/v3:Release"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"

# What the hardening is, written out (the Gaudi pods' rules, with the NVIDIA image's user 1001).
POD_SECURITY = {"runAsUser": 1001, "runAsGroup": 1001, "fsGroup": 1001, "fsGroupChangePolicy": "OnRootMismatch",
                "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY = {"runAsUser": 1001, "runAsGroup": 1001, "runAsNonRoot": True, "allowPrivilegeEscalation": False,
                      "privileged": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]},
                      "seccompProfile": {"type": "RuntimeDefault"}}
HOME = "/home/deepspeed"
# The NVIDIA MPIJobs of the example stacks: none may be left out of the checks below unnoticed.
NVIDIA_JOBS = {("dws", "pretrain"), ("finetune", "tune"), ("h100", "smoke")}
UID_CHECK = "CKV_K8S_40"
DAEMON_CHECKS = {"CKV_K8S_10", "CKV_K8S_11", "CKV_K8S_12", "CKV_K8S_13", "CKV_K8S_22", "CKV_K8S_25", "CKV_K8S_28",
                 "CKV_K8S_37", "CKV_K8S_40", "CKV_K8S_43"}


def nvidia_jobs(example: bool = False) -> list[tuple[str, str, dict[str, Any]]]:
    """(stack, job, MPIJob spec) of every stack's MPIJob whose workers take NVIDIA GPUs: the project's stack files
    (a user's own too), or the examples."""
    return [job for stack in (examples() if example else stacks()) for job in jobs_of(stack, stack_run(stack,
                                                                                                      example=example))]


def jobs_of(stack: str, run: RunResult) -> list[tuple[str, str, dict[str, Any]]]:
    """(stack, job, MPIJob spec) of a run's MPIJobs whose workers take NVIDIA GPUs."""
    out = []
    for reg in run.by_type(MPIJOB):
        worker = reg.inputs["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
        if "nvidia.com/gpu" in worker["resources"]["limits"]:
            out.append((stack, reg.inputs["metadata"]["name"], reg.inputs["spec"]))
    return out


@pytest.fixture(scope="module")
def jobs() -> list[tuple[str, str, dict[str, Any]]]:
    return nvidia_jobs()


def pods(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {role: rs["template"] for role, rs in spec["mpiReplicaSpecs"].items()}


def skips(annotations: dict[str, str]) -> dict[str, str]:
    """checkov's skip annotations: check id -> reason (its format: `CHECK=reason`, one "=")."""
    found = {}
    for key, value in annotations.items():
        if key.startswith("checkov.io/skip"):
            assert value.count("=") == 1, value
            check, why = value.split("=")
            found[check] = why
    return found


def writable_paths(spec: dict[str, Any], container: dict[str, Any]) -> set[str]:
    """Where the container may write with a read-only root filesystem: its emptyDir and claim mounts."""
    kinds = {v["name"]: v for v in spec["volumes"]}
    return {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")
            and {"emptyDir", "persistentVolumeClaim"} & set(kinds[m["name"]])}


def test_every_example_nvidia_mpijob_is_checked() -> None:
    jobs = nvidia_jobs(example=True)
    assert {(stack, name) for stack, name, _ in jobs} == NVIDIA_JOBS
    # The examples' workers with a fabric daemon (an init container), whose waivers are checked below.
    assert {stack for stack, _, spec in jobs if pods(spec)["Worker"]["spec"].get("initContainers")} == {"dws", "h100"}
    # tune is kind finetune, smoke and pretrain kind mpijob: both kinds' pods are below.
    assert stack_path("finetune").read_text(encoding="utf-8").count("kind: finetune") == 1


def test_launchers_and_workers_are_hardened(jobs: list[tuple[str, str, dict[str, Any]]]) -> None:
    launchers_and_workers_are_hardened(jobs)


def launchers_and_workers_are_hardened(jobs: list[tuple[str, str, dict[str, Any]]]) -> None:
    for stack, name, spec in jobs:
        for role, template in pods(spec).items():
            pod, where = template["spec"], f"{stack}/{name} {role}"
            assert pod["automountServiceAccountToken"] is False, where
            assert pod["securityContext"] == POD_SECURITY, where
            (container,) = pod["containers"]
            assert container["securityContext"] == CONTAINER_SECURITY, where
            assert {"name": "tmp", "emptyDir": {"sizeLimit": "16Gi"}} in pod["volumes"], where
            assert {"name": "home", "emptyDir": {"sizeLimit": "16Gi"}} in pod["volumes"], where
            assert {"/tmp", HOME} <= writable_paths(pod, container), where
            assert not {"hostNetwork", "hostPID", "hostIPC"} & set(pod), where
            assert container["resources"]["limits"] == container["resources"]["requests"], where
        launcher = pods(spec)["Launcher"]["spec"]["containers"][0]
        assert launcher["resources"]["limits"] == {"cpu": "1", "memory": "2Gi"}, (stack, name)
        worker = pods(spec)["Worker"]["spec"]["containers"][0]
        assert worker["livenessProbe"] == {"tcpSocket": {"port": 2222}, "initialDelaySeconds": 30,
                                           "periodSeconds": 30, "failureThreshold": 4}, (stack, name)
        # The operator's key pair lands inside the writable home (nested mount), where the user's ssh reads it.
        assert spec["sshAuthMountPath"] == f"{HOME}/.ssh"


def test_what_the_scripts_write_is_writable(jobs: list[tuple[str, str, dict[str, Any]]]) -> None:
    """The worker's host key and sshd's pid file (the image's drop-in) in /tmp, the launcher's ~/.deepspeed_env in
    the home: all on the emptyDirs."""
    dockerfile = (PROJECT_DIR / "workloads" / "images" / "deepspeed" / "Dockerfile").read_text(encoding="utf-8")
    assert "'PidFile /tmp/sshd.pid'" in dockerfile
    assert "--home-dir /home/deepspeed" in dockerfile
    what_the_scripts_write_is_writable(jobs)


def what_the_scripts_write_is_writable(jobs: list[tuple[str, str, dict[str, Any]]]) -> None:
    for stack, name, spec in jobs:
        worker = pods(spec)["Worker"]["spec"]["containers"][0]
        key = re.search(r"ssh-keygen .* -f (\S+)", worker["args"][0])
        assert key is not None and key.group(1).startswith("/tmp/"), (stack, name)
        launcher = pods(spec)["Launcher"]["spec"]["containers"][0]
        assert '>> "$HOME/.deepspeed_env"' in launcher["args"][0], (stack, name)


def test_waivers_are_the_image_user_the_launcher_probes_and_the_fabric_daemon(
        jobs: list[tuple[str, str, dict[str, Any]]]) -> None:
    waivers_are_the_image_user_the_launcher_probes_and_the_fabric_daemon(jobs)


def waivers_are_the_image_user_the_launcher_probes_and_the_fabric_daemon(
        jobs: list[tuple[str, str, dict[str, Any]]]) -> None:
    for stack, name, spec in jobs:
        launcher, worker = pods(spec)["Launcher"], pods(spec)["Worker"]
        assert set(skips(launcher["metadata"]["annotations"])) == {"CKV_K8S_8", "CKV_K8S_9", UID_CHECK}
        has_daemon = bool(worker["spec"].get("initContainers"))
        assert set(skips(worker["metadata"]["annotations"])) == ({UID_CHECK} | (DAEMON_CHECKS if has_daemon
                                                                                 else set())), (stack, name)
        assert "bitnami/deepspeed values.yaml" in skips(worker["metadata"]["annotations"])[UID_CHECK]


def test_the_image_uid_waiver_rests_on_the_chart() -> None:
    """CKV_K8S_40's reason: the Bitnami chart runs its containers as 1001, and the image has that one user."""
    values = yaml_load(reference("bitnami-deepspeed", "values.yaml").read_text(encoding="utf-8"))
    for role in ("client", "worker"):
        assert values[role]["containerSecurityContext"]["runAsUser"] == 1001
    dockerfile = (PROJECT_DIR / "workloads" / "images" / "deepspeed" / "Dockerfile").read_text(encoding="utf-8")
    assert re.findall(r"useradd --uid (\d+)", dockerfile) == ["1001"]
    assert "\nUSER 1001\n" in dockerfile


@pytest.mark.parametrize("fabric", ["tcpx", "tcpxo"])
def test_each_daemon_waiver_is_what_the_pinned_manifest_does(fabric: str) -> None:
    """The RxDM daemon stays as Google's pod runs it: the waived checks are what that pod's daemon does too."""
    from model.fabric import load
    from workloads import fabric as pod_fabric

    f = load().fabrics[fabric]
    assert f.daemon is not None
    with open(reference("gke-gpu-fabric", "container-engine-accelerators", f.daemon.manifest), encoding="utf-8") as fh:
        pod = next(d for d in (yaml_load(doc) for doc in fh.read().split("\n---")) if d and d.get("kind") == "Pod")
    ref = next(c for c in pod["spec"]["containers"] if c["name"] == f.daemon.name)
    assert "resources" not in ref  # CKV_K8S_10-13
    assert "readOnlyRootFilesystem" not in ref["securityContext"]  # CKV_K8S_22
    assert ref["securityContext"]["capabilities"]["add"]  # CKV_K8S_25
    assert "drop" not in ref["securityContext"]["capabilities"]  # CKV_K8S_28, CKV_K8S_37
    assert "runAsUser" not in ref["securityContext"] and "runAsUser" not in pod["spec"].get("securityContext", {})
    assert "@sha256:" not in ref["image"]  # CKV_K8S_43
    ours = pod_fabric.daemon_sidecar(f)
    assert ours is not None
    assert ours["image"] == ref["image"]
    assert ours["imagePullPolicy"] == ref["imagePullPolicy"] == "Always"
    assert ours["securityContext"] == {"runAsUser": 0, "runAsNonRoot": False, "allowPrivilegeEscalation": False,
                                       "capabilities": {"add": ref["securityContext"]["capabilities"]["add"]}}
    assert set(pod_fabric.daemon_waivers(f)) == DAEMON_CHECKS
    assert all(f.daemon.manifest in why for why in pod_fabric.daemon_waivers(f).values())


def test_nccl_test_pods_are_hardened() -> None:
    job = stack_run("h100").one(JOB).inputs
    pod = job["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"] == {"runAsUser": 1001, "runAsGroup": 1001, "runAsNonRoot": True,
                                      "seccompProfile": {"type": "RuntimeDefault"}}
    (container,) = pod["containers"]
    assert container["securityContext"] == CONTAINER_SECURITY
    assert "/tmp" in writable_paths(pod, container)  # torchrun's and torch's temporary files
    # The waivers on the Job, where a scan of the manifests reads them, and on its pods.
    for meta in (job["metadata"], job["spec"]["template"]["metadata"]):
        assert set(skips(meta["annotations"])) == DAEMON_CHECKS | {UID_CHECK}


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_helm_release_pins_the_charts_hardening(stack: str) -> None:
    """The chart's client and workers: its own hardened defaults, set explicitly so a chart upgrade cannot loosen
    them (each value as strict as bitnami/deepspeed values.yaml's)."""
    chart = yaml_load(reference("bitnami-deepspeed", "values.yaml").read_text(encoding="utf-8"))
    values = stack_run(stack).one(RELEASE).inputs["values"]
    for role in ("client", "worker"):
        assert values[role]["automountServiceAccountToken"] is False
        ours = values[role]["containerSecurityContext"]
        assert ours == {"enabled": True, **CONTAINER_SECURITY}
        theirs = {k: v for k, v in chart[role]["containerSecurityContext"].items() if k != "seLinuxOptions"}
        assert theirs == ours


def test_model_server_carries_the_image_uid_waiver() -> None:
    deployment = stack_run("serve").one(DEPLOYMENT).inputs
    assert set(skips(deployment["metadata"]["annotations"])) == {UID_CHECK}

