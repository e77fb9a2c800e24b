"""The stack's image on its GPUs and fabrics (checks/image.py): a GPU its torch has no kernels for and a fabric whose
plugin cannot work with its NCCL are refused at preview; an unqualified NCCL is a labelled warning.

Facts (sources in data/versions.yaml and data/gpu_fabric.yaml): torch 2.13.0's wheel has kernels for 7.5, 8.0,
8.6, 9.0, 10.0, 12.0 and no PTX; it runs NCCL 2.29.7; TCPXO is qualified with 2.28.7-1; gIB needs 2.25+ [U].
"""

from __future__ import annotations

import msgspec
import pytest
from conftest import model, problems

import checks
from model import catalog, versions


def test_the_catalogs_capabilities_the_rule_relies_on() -> None:
    # developer.nvidia.com/cuda-gpus (data/gpu_catalog.yaml): B200 is 10.0 (sm_100), V100 7.0, P100 6.0, T4 7.5.
    gpus = catalog.load().gpus
    capabilities = {name: gpus[name].compute_capability for name in
                    ("nvidia-b200", "nvidia-tesla-v100", "nvidia-tesla-p100", "nvidia-tesla-t4", "nvidia-l4")}
    assert capabilities == {"nvidia-b200": (10, 0), "nvidia-tesla-v100": (7, 0), "nvidia-tesla-p100": (6, 0),
                            "nvidia-tesla-t4": (7, 5), "nvidia-l4": (8, 9)}


def test_a_v100_pool_is_refused_for_the_stacks_image() -> None:
    found = problems("dev", {"nodePools[0].gpu.type": "nvidia-tesla-v100"})
    arch = [p for p in found if "compute capability" in p]
    assert arch == [
        "workloads.smoke.pool: pool t4's NVIDIA V100 is compute capability 7.0, and the stack's image runs torch "
        "2.13.0 (CUDA 13.0) with kernels for compute capability 7.5, 8.0, 8.6, 9.0, 10.0, 12.0 only "
        "(data/versions.yaml): its first CUDA kernel would fail; use a pool with a GPU it supports, or an image "
        "built for this GPU (the workload's `image`, or image.prebuilt)"]


@pytest.mark.parametrize("key", ["image.prebuilt", "workloads.smoke.image"])
def test_an_image_of_the_users_own_is_not_checked(key: str) -> None:
    found = problems("dev", {"nodePools[0].gpu.type": "nvidia-tesla-v100",
                             key: "us-docker.pkg.dev/p/r/deepspeed@sha256:" + "a" * 64})
    assert not [p for p in found if "compute capability" in p]


def test_vertex_on_a_p100_is_refused() -> None:
    found = problems("vertex", {"vertex.gpu.type": "nvidia-tesla-p100"})
    assert [p for p in found if p.startswith("vertex.gpu.type: the NVIDIA P100 is compute capability 6.0")]


def test_the_example_stacks_gpus_all_run_the_image() -> None:
    for stack in ("dev", "prod", "serve", "dws", "h100", "vertex"):
        assert not [w for w in checks.image.check_gpu_arch(model(stack))], stack


def _with_nccl(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    older = msgspec.structs.replace(versions.load(), python={**versions.load().python, "nvidiaNcclCu13": version})
    monkeypatch.setattr(versions, "load", lambda: older)


def test_an_nccl_older_than_the_tcpxo_plugin_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    _with_nccl(monkeypatch, "2.21.5")  # torch 2.5.1's nvidia-nccl-cu12 (issue 19.4)
    assert problems("h100", {}) == [
        "nodePools[0].machineType: a3-megagpu-8g's GPUDirect-TCPXO plugin needs NCCL 2.28.0 or later, and the "
        "stack's image runs NCCL 2.21.5 (the nvidia-nccl-cu13 wheel torch loads; data/versions.yaml): NCCL would "
        "fail at init or fall back to TCP on eth0. Raise python.nvidiaNcclCu13 there (and torch with it), or set "
        "fabric.enabled: false"]


def test_the_shipped_nccl_passes_every_fabric_and_warns_on_tcpxo() -> None:
    m = model("h100")
    assert checks.image.check_fabric_nccl(m) == []
    assert [w for w in checks.warnings(m) if "qualifies" in w] == [
        "nodePools[0].machineType: Google qualifies the GPUDirect-TCPXO plugin with NCCL 2.28.7; the stack's image "
        "runs NCCL 2.29.7, since torch 2.13.0 cannot load an older one (data/versions.yaml). Run the pool's "
        "ncclTests entry and compare its bus bandwidth with Google's before training"]


def test_no_nccl_warning_off_a_fabric() -> None:
    assert not [w for w in checks.warnings(model("dev")) if "qualifies" in w]
