"""Which path runs a Gaudi job's training for each Gaudi software release, now that optimum-habana is out of support
(issue 39 item 1). The facts are data/gaudi_software.yaml's, read from the releases' PyPI wheels: here they are
written out by hand, as the wheels say them."""

from __future__ import annotations

import pytest
from conftest import model, problems

import checks
from model import gaudi_software

JOB = "gaudi-llm-ds-ft"
KEY = f"workloads.{JOB}"
END = ("optimum-habana is out of support since 2026-10-31: its final release v1.21.2 (Gaudi software 1.24) says no "
       "fixes are guaranteed and security issues may not be investigated, and names no replacement. The newest frozen "
       "path is Gaudi software 1.24 with v1.21.2; transformers 4.50.0+ and accelerate 1.5.0+ run on HPU themselves "
       "(with Habana's DeepSpeed), a path the stack records but does not build yet (data/gaudi_software.yaml `paths`)")


def versions(software: str, pytorch: str, release: str, os: str = "ubuntu22.04") -> dict[str, str]:
    return {f"{KEY}.gaudi.softwareVersion": software, f"{KEY}.gaudi.pytorchVersion": pytorch,
            f"{KEY}.gaudi.os": os, f"{KEY}.training.optimumHabanaVersion": release}


def support_warning(changes: dict[str, str]) -> str:
    (said,) = [w for w in checks.warnings(model("gaudi", changes)) if "out of support" in w]
    return said


def test_the_final_release_and_its_pins_as_its_wheel_says() -> None:
    """v1.21.2's README: "END OF SUPPORT. As of 2026-10-31 ... The final release is `v1.21.2` (Intel Gaudi Software
    1.24, Transformers 4.55.x)"; its METADATA: transformers<4.56.0,>=4.55.0, accelerate<=1.10.1,>=1.7.0."""
    end = gaudi_software.end_of_support()
    assert (end.date, end.final_release, end.final_gaudi) == ("2026-10-31", "v1.21.2", "1.24")
    final = gaudi_software.release_named("v1.21.2")
    assert final is not None and final.transformers == ">=4.55.0,<4.56.0" and final.gaudi == "1.24"
    assert gaudi_software.optimum_habana_for("1.24.0") == ("v1.21.0", "v1.21.1", "v1.21.2")
    assert gaudi_software.optimum_habana_releases()[-1].release == "v1.21.2"  # nothing after the final one


def test_the_native_path_is_recorded_from_the_wheels() -> None:
    """transformers 4.50.0's training_args.py picks `hpu:0` (4.49.0's has no HPU), accelerate 1.5.0 has
    is_hpu_available (1.4.0 not)."""
    native = gaudi_software.native_hpu()
    assert (native["transformers"], native["accelerate"]) == ("4.50.0", "1.5.0")


def test_software_1_19_runs_the_validated_release_and_hears_the_end_of_support() -> None:
    assert problems("gaudi", {}) == []
    assert support_warning({}) == (
        f"{KEY}.gaudi.softwareVersion: Gaudi software 1.19.1 runs run_lora_clm.py on optimum-habana v1.15.0, the "
        f"release validated with it. {END}")


def test_software_1_19_0_is_pinned() -> None:
    """Omnia 1.7's SynapseAI 1.19.0: its own image (tag 1.19.0-561), not refused."""
    changes = versions("1.19.0", "2.5.1", "v1.15.0")
    assert problems("gaudi", changes) == []
    base = gaudi_software.base_image(model("gaudi", changes).workloads[JOB].gaudi)
    assert base is not None and base.ref == (
        "vault.habana.ai/gaudi-docker/1.19.0/ubuntu22.04/habanalabs/pytorch-installer-2.5.1:1.19.0-561")
    assert support_warning(changes).startswith(f"{KEY}.gaudi.softwareVersion: Gaudi software 1.19.0 runs "
                                               "run_lora_clm.py on optimum-habana v1.15.0, the release validated")


@pytest.mark.parametrize(("software", "pytorch", "release", "os"), [
    ("1.22.2", "2.7.1", "v1.19.1", "ubuntu22.04"),
    ("1.22.2", "2.7.1", "v1.19.0", "ubuntu24.04"),
    ("1.24.0", "2.10.0", "v1.21.2", "ubuntu22.04"),
    ("1.24.0", "2.10.0", "v1.21.0", "ubuntu24.04"),
])
def test_software_1_22_to_1_24_runs_the_frozen_releases(software: str, pytorch: str, release: str, os: str) -> None:
    changes = versions(software, pytorch, release, os)
    assert problems("gaudi", changes) == []
    assert support_warning(changes) == (
        f"{KEY}.gaudi.softwareVersion: Gaudi software {software} runs run_lora_clm.py on optimum-habana {release}, "
        f"frozen: its last releases, none after v1.21.2 (Gaudi software 1.22-1.24). {END}")


def test_the_recipe_is_named_as_what_runs() -> None:
    changes = {f"{KEY}.training": {"optimumHabanaVersion": "v1.21.2"}, **versions("1.24.0", "2.10.0", "v1.21.2"),
               f"{KEY}.finetune": {"model": "Qwen/Qwen2.5-7B-Instruct", "datasetPath": "data/train.jsonl"}}
    assert support_warning(changes).startswith(f"{KEY}.gaudi.softwareVersion: Gaudi software 1.24.0 runs "
                                               "finetune.py through its GaudiTrainer on optimum-habana v1.21.2, frozen")


def test_software_1_24_with_an_older_release_is_refused_naming_the_final_one() -> None:
    (found,) = problems("gaudi", versions("1.24.0", "2.10.0", "v1.15.0"))
    assert found == (f"{KEY}.training.optimumHabanaVersion: v1.15.0 is not validated with Gaudi software 1.24.0 "
                     f"({KEY}.gaudi.softwareVersion); use v1.21.0 or v1.21.1 or v1.21.2 (optimum-habana's README at "
                     "each release, data/gaudi_software.yaml)")


def test_a_pinned_release_with_another_pytorch_names_the_keys_to_set() -> None:
    (found,) = problems("gaudi", {f"{KEY}.gaudi.softwareVersion": "1.24.0"})
    assert ("; Gaudi software 1.24.0 is pinned with os ubuntu22.04 with pytorchVersion 2.10.0 or os ubuntu24.04 with "
            f"pytorchVersion 2.10.0: set {KEY}.gaudi.os and {KEY}.gaudi.pytorchVersion, or record it there") in found


@pytest.mark.parametrize("software", ["1.23.0", "1.20.0", "1.25.0"])
def test_software_without_a_pinned_image_is_refused_naming_the_pinned_ones(software: str) -> None:
    (found,) = problems("gaudi", {f"{KEY}.gaudi.softwareVersion": software})
    assert found.startswith(f"{KEY}.gaudi.softwareVersion: no pinned Habana base image for {software}/")
    assert ("use a pinned release (1.19.0, 1.19.1, 1.22.2, 1.24.0: the one your nodes' Habana driver runs, with its "
            "os and pytorchVersion)") in found


def test_each_band_names_its_path() -> None:
    assert gaudi_software.path_for("1.19.1").path == "optimum-habana"
    assert gaudi_software.path_for("1.21.0").path == "optimum-habana"
    assert gaudi_software.path_for("1.22.2").path == "optimum-habana-frozen"
    assert gaudi_software.path_for("1.24.0").path == "optimum-habana-frozen"
    assert gaudi_software.path_for("1.25.0") is None
