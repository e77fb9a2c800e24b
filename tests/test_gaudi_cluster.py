"""Gaudi on an existing Omnia cluster (issue 30 item 4): the cards of a node, optimum-habana matched to the Gaudi
software, HCCL and other environment on every rank, caches the ranks can write, pdsh in the image, and the claim's
access mode judged by its storage class. Each rule with the input that breaks it, named by its key."""

from __future__ import annotations

import copy
import os
import re
import subprocess
from pathlib import Path
from typing import Any

from conftest import PROJECT_DIR, config_problems, problems, stack_yaml

from model import gaudi_software, storage_classes
from preview.engine import RunResult, engine_config_from_yaml, run_program

JOB = "gaudi-llm-ds-ft"
KEY = f"workloads.{JOB}"
DOCKERFILE = PROJECT_DIR / "workloads" / "images" / "gaudi" / "Dockerfile"


def test_a_gaudi_node_has_eight_cards() -> None:
    found = problems("gaudi", {f"{KEY}.accelerator.count": 9})
    assert len(found) == 1 and found[0].startswith(f"{KEY}.accelerator.count: 9 cards per worker")
    assert "has 8" in found[0] and "at most 8" in found[0]
    assert problems("gaudi", {f"{KEY}.accelerator.count": 8}) == []
    assert problems("gaudi", {f"{KEY}.accelerator.count": 16, f"{KEY}.accelerator.type": "gaudi3"})[0].startswith(
        f"{KEY}.accelerator.count: 16 cards per worker")


def test_optimum_habana_releases_as_their_readmes_say() -> None:
    # Read in optimum-habana's README at each tag ("validated for SynapseAI 1.16" at v1.12.0, "validated with
    # Intel Gaudi v1.20 stack" at v1.18.0, "... for SynapseAI 1.19" at v1.15.0).
    assert gaudi_software.optimum_habana_for("1.19.1") == ("v1.15.0",)
    assert "v1.12.0" in gaudi_software.optimum_habana_for("1.16.0")
    assert "v1.18.0" in gaudi_software.optimum_habana_for("1.20.0")
    assert gaudi_software.optimum_habana_for("1.22.0") == ("v1.19.0", "v1.19.1")


def test_optimum_habana_must_match_the_gaudi_software() -> None:
    key = f"{KEY}.training.optimumHabanaVersion"
    for release in ("v1.12.0", "v1.18.0"):
        found = problems("gaudi", {key: release})
        assert found == [f"{key}: {release} is not validated with Gaudi software 1.19.1 ({KEY}.gaudi.softwareVersion); "
                         "use v1.15.0 (optimum-habana's README at each release, data/gaudi_software.yaml)"]
    assert problems("gaudi", {key: "v1.15.0"}) == []


def test_optimum_habana_is_checked_on_the_install_at_start_path_too() -> None:
    key = f"{KEY}.training.optimumHabanaVersion"
    found = problems("gaudi", {key: "v1.18.0", f"{KEY}.gaudi.installAtStart": True})
    assert [p for p in found if p.startswith(key)] != []


def test_a_refused_optimum_habana_release_is_one_problem() -> None:
    # A second workload with another (refused) release: no follow-on "one Gaudi image per stack" problem.
    config = stack_yaml("gaudi")
    jobs = config["deepspeed-stack:workloads"]
    jobs["other"] = copy.deepcopy(jobs[JOB]) | {"namespace": "other"}
    jobs["other"]["training"]["optimumHabanaVersion"] = "v1.14.0"
    assert config_problems(config) == [
        "workloads.other.training.optimumHabanaVersion: v1.14.0 is not validated with Gaudi software 1.19.1 "
        "(workloads.other.gaudi.softwareVersion); use v1.15.0 (optimum-habana's README at each release, "
        "data/gaudi_software.yaml)"]


def test_unknown_gaudi_software_is_the_base_image_problem_only() -> None:
    found = problems("gaudi", {f"{KEY}.gaudi.softwareVersion": "1.18.0", f"{KEY}.training.optimumHabanaVersion":
                               "v1.12.0"})
    assert [p.split(":")[0] for p in found] == [f"{KEY}.gaudi.softwareVersion"]


def pdsh_step() -> str:
    """The Gaudi Dockerfile's RUN step that checks pdsh, as the build's shell runs it (continuations joined)."""
    text = DOCKERFILE.read_text(encoding="utf-8").replace("\\\n", " ")
    (step,) = [m for m in re.findall(r"^RUN (.*)$", text, re.MULTILINE) if "pdsh" in m]
    return step


def build_step(command: str, path: Path) -> int:
    return subprocess.run(["/bin/bash", "-o", "pipefail", "-c", command], env={**os.environ, "PATH": str(path)},
                          capture_output=True, check=False).returncode


def test_the_image_build_fails_without_pdsh(tmp_path: Path) -> None:
    # The same RUN step in a PATH without pdsh, and then with one: the build fails, then passes.
    step = pdsh_step()
    assert "command -v pdsh" in step
    assert build_step(step, tmp_path) != 0
    pdsh = tmp_path / "pdsh"
    pdsh.write_text("#!/bin/sh\n", encoding="utf-8")
    pdsh.chmod(0o755)
    assert build_step(step, tmp_path) == 0


MPIJOB = "kubernetes:kubeflow.org/v2beta1:MPIJob"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
HCCL = {"HCCL_SOCKET_IFNAME": "ens1f0", "HCCL_OVER_OFI": "0", "PT_HPU_LAZY_MODE": "1", "LOG_LEVEL_ALL": "it's 3"}


def run_gaudi(workload: dict[str, Any]) -> RunResult:
    """The gaudi example stack with these keys of its workload changed, run under mocks."""
    config = stack_yaml("gaudi")
    config["deepspeed-stack:workloads"][JOB].update(copy.deepcopy(workload))
    engine_cfg, secrets = engine_config_from_yaml(config)
    return run_program(engine_cfg, secrets, stack="gaudi")


def pods(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {role: spec["template"]["spec"] for role, spec in job["spec"]["mpiReplicaSpecs"].items()}


def test_env_reaches_every_rank_through_deepspeeds_env_file() -> None:
    run = run_gaudi({"env": HCCL})
    data = run.one(CONFIG_MAP).inputs["data"]
    # DeepSpeed's runner splits each line at the first "=" and quotes the value itself (runner.py, PDSHRunner).
    assert data["deepspeed_env"] == ("HCCL_SOCKET_IFNAME=ens1f0\nHCCL_OVER_OFI=0\nPT_HPU_LAZY_MODE=1\n"
                                     "LOG_LEVEL_ALL=it's 3\n")
    for role, spec in pods(run.one(MPIJOB).inputs).items():
        (c,) = spec["containers"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["DS_ENV_FILE"] == "/etc/deepspeed/deepspeed_env", role
        assert {k: env[k] for k in HCCL} == HCCL, role
        assert {"name": "deepspeed-config", "mountPath": "/etc/deepspeed", "readOnly": True} in c["volumeMounts"]


def test_without_env_no_env_file() -> None:
    run = run_gaudi({})
    assert "deepspeed_env" not in run.one(CONFIG_MAP).inputs["data"]
    (c,) = pods(run.one(MPIJOB).inputs)["Launcher"]["containers"]
    assert "DS_ENV_FILE" not in {e["name"] for e in c["env"]}


def test_env_names_are_environment_variable_names() -> None:
    found = problems("gaudi", {f"{KEY}.env": {"HCCL-IF": "x", "9LIVES": "x", "OK": "two\nlines"}})
    assert sorted(found) == sorted([
        f'{KEY}.env.HCCL-IF: "HCCL-IF" is not of the form an environment variable name such as HCCL_SOCKET_IFNAME',
        f'{KEY}.env.9LIVES: "9LIVES" is not of the form an environment variable name such as HCCL_SOCKET_IFNAME',
        f'{KEY}.env.OK: "two\\nlines" is not of the form one line of text'])


def test_env_may_not_set_what_the_stack_sets() -> None:
    found = problems("gaudi", {f"{KEY}.env": {"HF_HOME": "/x", "OMPI_MCA_plm": "x", "DS_ENV_FILE": "/y",
                                               "https_proxy": "http://p:3128", "HCCL_OVER_OFI": "0"}})
    assert found == [
        f"{KEY}.env.HF_HOME: set by hfHome; the stack sets HF_HOME itself, choose another name or change it there",
        f"{KEY}.env.OMPI_MCA_plm: set by the MPI operator; the stack sets OMPI_MCA_plm itself, choose another name "
        "or change it there",
        f"{KEY}.env.DS_ENV_FILE: set by env itself (the file of these variables); the stack sets DS_ENV_FILE itself, "
        "choose another name or change it there",
        f"{KEY}.env.https_proxy: set by proxy.https; the stack sets https_proxy itself, choose another name or change "
        "it there"]


def test_env_on_an_nvidia_mpijob_is_refused() -> None:
    # The h100 example's MPIJob `smoke` runs on NVIDIA: its ranks would never see `env`.
    found = problems("h100", {"workloads.smoke.env": {"NCCL_DEBUG": "INFO"}})
    assert found == ["workloads.smoke.env: `env` is the Gaudi MPIJob's (every rank's environment through "
                     "DeepSpeed's DS_ENV_FILE); an NVIDIA MPIJob would ignore it. Remove it"]


ACCESS = f"{KEY}.storage.accessMode"
CLASS = f"{KEY}.storage.storageClass"


def test_read_write_once_on_an_nfs_class_is_accepted() -> None:
    # Omnia's guide creates shared-model ReadWriteOnce on nfs-client: NFS volumes are not attached, no Multi-Attach.
    assert storage_classes.storage_classes()["nfs-client"].storage == "file"
    assert problems("gaudi", {ACCESS: "ReadWriteOnce"}) == []
    assert problems("gaudi", {ACCESS: "ReadWriteOnce", CLASS: "standard-rwx"}) == []


def test_read_write_once_on_block_or_unknown_storage_is_refused() -> None:
    (found,) = problems("gaudi", {ACCESS: "ReadWriteOnce", CLASS: "standard-rwo"})
    assert found.startswith(f"{ACCESS}: ReadWriteOnce cannot be mounted by the launcher and 1 worker(s) on different "
                            "nodes at once (standard-rwo is block storage (pd.csi.storage.gke.io)")
    (found,) = problems("gaudi", {ACCESS: "ReadWriteOnce", CLASS: "ceph-rbd"})
    assert "(ceph-rbd is not recorded as file storage in data/storage_classes.yaml, so it is taken for block storage" \
        in found and found.startswith(f"{ACCESS}: ")
    (found,) = problems("gaudi", {ACCESS: "ReadWriteOnce", CLASS: "local-path"})
    assert "local-path is local storage (rancher.io/local-path)" in found


def test_read_write_once_on_the_stacks_own_nfs_provisioner_class_is_accepted() -> None:
    changes = {ACCESS: "ReadWriteOnce", CLASS: "team-nfs", "nfsProvisioner.install": True,
               "nfsProvisioner.server": "10.0.0.5", "nfsProvisioner.storageClass": "team-nfs"}
    assert problems("gaudi", changes) == []
    assert problems("gaudi", {**changes, "nfsProvisioner.install": False})[0].startswith(f"{ACCESS}: ")


def launcher_script(run: RunResult) -> str:
    (c,) = pods(run.one(MPIJOB).inputs)["Launcher"]["containers"]
    return c["args"][0]


def claim_check(tmp_path: Path, hf_home: Path) -> subprocess.CompletedProcess[str]:
    """The launcher's first lines (before the hostfile) on a claim mounted at tmp_path, with this hfHome."""
    run = run_gaudi({"storage": {**stack_yaml("gaudi")["deepspeed-stack:workloads"][JOB]["storage"],
                                 "mountPath": str(tmp_path)}, "hfHome": str(hf_home)})
    head = launcher_script(run).split('HOSTSFILE="$OMPI_MCA_orte_default_hostfile"')[0]
    return subprocess.run(["/bin/bash", "-c", head], capture_output=True, text=True, check=False)


def test_the_launcher_makes_the_ranks_folders_and_checks_they_are_writable(tmp_path: Path) -> None:
    done = claim_check(tmp_path, tmp_path / "huggingface")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "huggingface").is_dir() and (tmp_path / "output" / JOB).is_dir()
    assert list((tmp_path / "huggingface").iterdir()) == []  # the probe is removed


def test_a_cache_folder_the_ranks_cannot_write_stops_the_job_saying_why(tmp_path: Path) -> None:
    # A folder the ranks cannot write (here: a file in the way, since the tests may run as root; on the cluster:
    # Omnia's root-owned /storage/huggingface and the ranks' uid 10001).
    (tmp_path / "taken").write_text("", encoding="utf-8")
    done = claim_check(tmp_path, tmp_path / "taken" / "huggingface")
    assert done.returncode == 1
    assert f"{tmp_path}/taken/huggingface is not writable by uid" in done.stderr
    assert "chown -R" in done.stderr and "hfHome" in done.stderr
