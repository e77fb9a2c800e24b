"""ZeRO offload must fit in what a worker pod may use (issue 10, item 2): an error with numbers and what fits."""

from __future__ import annotations

import pytest
from conftest import changed, config_problems

from workloads.placement import offload_memory_bytes, placement, quantity_bytes

WORKLOAD = "workloads.zero3-smoke"
GIB = 2**30


def llama8b(**extra: object) -> dict:
    return changed("prod", {f"{WORKLOAD}.model": {"name": "Llama-3.1-8B", "mode": "training", "precision": "bf16"},
                            f"{WORKLOAD}.deepspeed.microBatchPerGpu": 1, f"{WORKLOAD}.deepspeed.trainBatchSize": 16,
                            **extra})


def test_quantities() -> None:
    assert quantity_bytes("26Gi") == 26 * GIB
    assert quantity_bytes("500M") == 500e6
    assert quantity_bytes("1024") == 1024
    assert quantity_bytes("1.5Ki") == 1536
    assert quantity_bytes("lots") is None


def test_llama_8b_at_zero3_offload_on_g2_standard_8_is_refused_with_numbers() -> None:
    # DeepSpeed's estimate_zero3_model_states_mem_needs (offload_optimizer, zero.Init): 16 bytes per parameter
    # over the nodes x 1.5: 8.03e9 x 16 / 2 x 1.5 = 96.4 GB per node. The pod: g2-standard-8 (32 GiB) less the
    # kernel's reserve (32/64 GiB + 16 MiB + 64 MiB swiotlb + min(0.00175 x 32 GiB, 248 MiB) = 0.63 GiB; autoscaler
    # gce_reserved.go), GKE's kube-reserved memory (25 % of 4 + 20 % of 4 + 10 % of 8 + 6 % of 16 = 3.56 GiB), the
    # 100 MiB eviction threshold and 1.5 GiB for DaemonSets: 26 GiB (floored); less 8 GiB of /dev/shm: 18 GiB.
    need = 8.03e9 * 16 / 2 * 1.5 / 1e9
    room = 18 * GIB / 1e9
    (problem,) = config_problems(llama8b())
    assert problem.startswith(
        f"{WORKLOAD}.deepspeed.offloadOptimizer: DeepSpeed estimates {need:.1f} GB of CPU memory per node for "
        f"Llama-3.1-8B's offloaded states at ZeRO-3 + optimizer offload on 2 worker(s) (its 1.5 buffer factor "
        f"included), but a worker pod may use {room:.1f} GB: its memory limit 26Gi (g2-standard-8's 32 GiB less "
        f"the kernel's and GKE's reservations and the node's DaemonSets) less {WORKLOAD}.resources.shmSize 8Gi "
        "for /dev/shm. What fits: ")
    # g2-standard-32 (128 GiB): 128 - kernel (2 GiB + 80 MiB + 0.00175 x 128 GiB = 2.30) - kube-reserved
    # (1 + 0.8 + 0.8 + 6.72 = 9.32) - 0.1 - 1.5 -> 114 GiB, less 8 = 106 GiB.
    assert problem.endswith(f"nodePools[0].machineType one of (memory for the offload): "
                            f"g2-standard-32 ({106 * GIB / 1e9:.1f} GB)")
    # More workers: 8.03e9 x 16 / n x 1.5 <= 19.3e9 from n = 10 on.
    assert "ZeRO-3 + optimizer offload on 10 x L4 (10 workers x 1; " in problem


def test_the_suggested_machine_fits() -> None:
    assert config_problems(llama8b(**{"nodePools[0].machineType": "g2-standard-32"})) == []


def test_shm_counts_against_the_pod() -> None:
    # The dev stack's smoke model, sized so the offload needs 18.9 GB: fits 18 GiB (19.3 GB) beside 8Gi of
    # /dev/shm, not beside 9Gi.
    params = 18.9e9 / (16 / 2 * 1.5) / 1e9
    base = {f"{WORKLOAD}.model.name": "m", f"{WORKLOAD}.model.parameters": params,
            f"{WORKLOAD}.model.sequenceLength": 1}
    assert config_problems(changed("prod", base)) == []
    (problem,) = config_problems(changed("prod", {**base, f"{WORKLOAD}.resources.shmSize": "9Gi"}))
    assert f"but a worker pod may use {17 * GIB / 1e9:.1f} GB" in problem


def test_offload_memory_of_a_placement() -> None:
    from conftest import model

    m = model("prod")
    where = placement(m, m.workloads["zero3-smoke"])
    assert where.memory == "26Gi"
    assert offload_memory_bytes(where, "8Gi") == pytest.approx(18 * GIB)
