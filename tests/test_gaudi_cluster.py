"""Gaudi on an existing Omnia cluster (issue 30 item 4): the cards of a node, optimum-habana matched to the Gaudi
software, HCCL and other environment on every rank, caches the ranks can write, pdsh in the image, and the claim's
access mode judged by its storage class. Each rule with the input that breaks it, named by its key."""

from __future__ import annotations

import copy
import os
import re
import subprocess
from pathlib import Path

from conftest import PROJECT_DIR, config_problems, problems, stack_yaml

from model import gaudi_software

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
