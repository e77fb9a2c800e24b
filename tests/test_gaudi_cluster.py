"""Gaudi on an existing Omnia cluster (issue 30 item 4): the cards of a node, optimum-habana matched to the Gaudi
software, HCCL and other environment on every rank, caches the ranks can write, pdsh in the image, and the claim's
access mode judged by its storage class. Each rule with the input that breaks it, named by its key."""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from conftest import PROJECT_DIR, config_problems, model, problems, stack_yaml
from test_image import tool

import checks
from model import gaudi_software, storage_classes
from preview.engine import RunResult, engine_config_from_yaml, run_program
from workloads.mpijob import gaudi_folders, gaudi_launcher

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


def launcher_env(run: RunResult) -> dict[str, str]:
    (c,) = pods(run.one(MPIJOB).inputs)["Launcher"]["containers"]
    return {e["name"]: e.get("value") for e in c["env"]}


OWN = "/storage/deepspeed-stack"  # the folder of the claim the ranks make and own


def test_the_ranks_caches_and_output_are_in_a_folder_of_their_own(gaudi: RunResult) -> None:
    # Omnia's by-hand run (root) made /storage/huggingface; the stack's ranks are uid 10001 (the image's USER).
    assert "USER 10001" in DOCKERFILE.read_text(encoding="utf-8")
    assert launcher_env(gaudi)["HF_HOME"] == f"{OWN}/huggingface"  # HF_HUB_CACHE, HF_DATASETS_CACHE: under it
    assert f" --output_dir {OWN}/output/{JOB} " in launcher_script(gaudi)
    assert "hfHome" not in stack_yaml("gaudi")["deepspeed-stack:workloads"][JOB]  # the example leaves it unset


def test_an_hfhome_of_ones_own_is_kept() -> None:
    w = model("gaudi", {f"{KEY}.hfHome": "/storage/cache/hf"}).workloads[JOB]
    assert (w.cache_home, gaudi_folders.output_dir(w)) == ("/storage/cache/hf", f"{OWN}/output/{JOB}")


def test_install_at_start_runs_as_root_and_keeps_omnias_layout() -> None:
    w = model("gaudi", {f"{KEY}.gaudi.installAtStart": True}).workloads[JOB]
    assert (w.cache_home, gaudi_folders.output_dir(w)) == ("/storage/huggingface", f"/storage/output/{JOB}")


def test_the_launcher_checks_the_ranks_folders_before_anything_else(gaudi: RunResult) -> None:
    w = model("gaudi").workloads[JOB]
    # Only the final-status guard and the launcher's functions come before it (tests/test_gaudi_launcher.py).
    guard = "\n".join(gaudi_launcher.final_errors(w))
    assert launcher_script(gaudi).startswith(
        f"set -eo pipefail\n{guard}\n{gaudi_folders.writable_folders_check(w)}\nHOSTSFILE=")


def stubs(tmp_path: Path, deny: Path) -> dict[str, str]:
    """PATH with the ranks' view of a claim: uid 10001, and `deny` owned by root (0:0, mode 755): nothing can be made
    or written under it. The tests may run as root, which permissions would not stop."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("mkdir", "touch"):
        real = shutil.which(name)
        (bin_dir / name).write_text(f'#!/bin/bash\nfor a in "$@"; do case "$a" in "$DENY"/*) exit 1;; esac; done\n'
                                    f'exec {real} "$@"\n', encoding="utf-8")
    (bin_dir / "id").write_text("#!/bin/bash\necho 10001\n", encoding="utf-8")
    (bin_dir / "stat").write_text("#!/bin/bash\necho 0:0\n", encoding="utf-8")
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "DENY": str(deny)}


def claim_check(tmp_path: Path, deny: Path, changes: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    """The launcher's folder check for the gaudi example on a claim mounted at tmp_path/claim, as the ranks."""
    claim = tmp_path / "claim"
    claim.mkdir(exist_ok=True)
    w = model("gaudi", {f"{KEY}.storage.mountPath": str(claim), **(changes or {})}).workloads[JOB]
    return subprocess.run(["/bin/bash", "-c", gaudi_folders.writable_folders_check(w)], capture_output=True, text=True,
                          check=False, env=stubs(tmp_path, deny))


def test_a_root_made_cache_on_the_claim_does_not_stop_the_ranks(tmp_path: Path) -> None:
    claim = tmp_path / "claim"
    (claim / "huggingface").mkdir(parents=True)  # what Omnia's root run left: the ranks cannot write in it
    done = claim_check(tmp_path, claim / "huggingface")
    assert done.returncode == 0, done.stderr
    own = claim / "deepspeed-stack"
    assert (own / "huggingface").is_dir() and (own / "output" / JOB).is_dir()
    assert list((own / "huggingface").iterdir()) == []  # the probe is removed


def test_a_claim_root_the_ranks_cannot_write_stops_the_job_with_the_admins_command(tmp_path: Path) -> None:
    done = claim_check(tmp_path, tmp_path / "claim")
    assert done.returncode == 1
    claim = tmp_path / "claim"
    assert done.stderr.startswith(f"{claim}/deepspeed-stack/huggingface: uid 10001 cannot write {claim} (owner 0:0)")
    assert ('run once `mkdir -p "$CLAIM/deepspeed-stack" && chown -R 10001:10001 "$CLAIM/deepspeed-stack"`, CLAIM '
            "being the claim's folder there (`kubectl get pv \"$(kubectl get pvc -n workloads shared-model -o "
            'jsonpath={.spec.volumeName})" -o jsonpath={.spec.nfs.path}`)') in done.stderr
    assert "NFS volumes take no fsGroup, and root_squash stops a root pod's chown" in done.stderr


def test_an_hfhome_another_run_made_stops_the_job_naming_it(tmp_path: Path) -> None:
    claim = tmp_path / "claim"
    done = claim_check(tmp_path, claim / "huggingface", {f"{KEY}.hfHome": str(claim / "huggingface")})
    assert done.returncode == 1
    assert done.stderr.startswith(f"{claim}/huggingface: uid 10001 cannot write {claim}/huggingface (owner 0:0)")
    assert 'mkdir -p "$CLAIM/huggingface" && chown -R 10001:10001 "$CLAIM/huggingface"' in done.stderr


def test_the_folder_check_is_shellcheck_clean(tmp_path: Path) -> None:
    script = tmp_path / "check.sh"
    script.write_text("#!/bin/bash\n" + gaudi_folders.writable_folders_check(model("gaudi").workloads[JOB]) + "\n",
                      encoding="utf-8")
    done = subprocess.run([tool("shellcheck"), str(script)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout


def test_the_preview_says_where_the_ranks_write_and_the_admins_command() -> None:
    (said,) = [w for w in checks.warnings(model("gaudi")) if w.startswith(f"{KEY}.storage: ")]
    assert (f"the ranks (uid 10001) keep the caches (HF_HOME {OWN}/huggingface) and the output ({OWN}/output/{JOB}) "
            "on claim shared-model") in said
    assert 'run once `mkdir -p "$CLAIM/deepspeed-stack" && chown -R 10001:10001 "$CLAIM/deepspeed-stack"`' in said
    assert "the launcher stops at once" in said
