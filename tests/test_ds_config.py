"""The ds_config.json generator and the DeepSpeed config rules (batch arithmetic, offload, precision)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import problems

from model.problems import lines
from model.types import DeepSpeedConfig
from workloads.ds_config import batch_problems, build_ds_config

STAGE3_KEYS = {"stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
               "stage3_gather_16bit_weights_on_model_save"}


def ds(**changes: Any) -> DeepSpeedConfig:
    """The schema's defaults (written out here, not read from the code), with `changes`."""
    base: dict[str, Any] = {
        "zero_stage": 2, "offload_optimizer": "none", "offload_params": "none", "nvme_path": "/local_nvme",
        "precision": "bf16", "micro_batch_per_gpu": 1, "gradient_accumulation": 1,
        "reduce_bucket_size": 500_000_000, "allgather_bucket_size": 500_000_000, "steps_per_print": 10,
        "learning_rate": 0.0003, "gradient_clipping": 1.0,
    }
    return DeepSpeedConfig(**{**base, **changes})




# --- The generator ---------------------------------------------------------------------------------

def test_batch_arithmetic_by_hand() -> None:
    # 4 workers x 8 GPUs x micro batch 2 x 4 accumulation steps = 256 samples per optimizer step.
    out = build_ds_config(ds(micro_batch_per_gpu=2, gradient_accumulation=4), workers=4, per_worker=8)
    assert (out["train_batch_size"], out["train_micro_batch_size_per_gpu"], out["gradient_accumulation_steps"]) == (
        256, 2, 4)
    # 3 workers x 1 GPU x 1 x 1 = 3
    assert build_ds_config(ds(), workers=3, per_worker=1)["train_batch_size"] == 3


def test_common_keys() -> None:
    out = build_ds_config(ds(steps_per_print=25), workers=1, per_worker=1)
    assert out["steps_per_print"] == 25
    assert out["gradient_clipping"] == 1.0
    assert json.loads(json.dumps(out)) == out  # plain JSON, nothing Python-only


def test_gradient_clipping_from_config() -> None:
    assert build_ds_config(ds(gradient_clipping=0.3), workers=1, per_worker=1)["gradient_clipping"] == 0.3
    assert build_ds_config(ds(gradient_clipping=0), workers=1, per_worker=1)["gradient_clipping"] == 0


def test_stage0_has_no_partitioning_options() -> None:
    assert build_ds_config(ds(zero_stage=0), 1, 1)["zero_optimization"] == {"stage": 0}


@pytest.mark.parametrize("stage", [1, 2])
def test_stages_1_and_2(stage: int) -> None:
    zero = build_ds_config(ds(zero_stage=stage, reduce_bucket_size=200_000_000, allgather_bucket_size=300_000_000),
                           2, 1)["zero_optimization"]
    assert zero["stage"] == stage
    assert (zero["reduce_bucket_size"], zero["allgather_bucket_size"]) == (200_000_000, 300_000_000)
    assert (zero["overlap_comm"], zero["contiguous_gradients"]) == (True, True)
    assert "offload_optimizer" not in zero and "offload_param" not in zero
    assert not STAGE3_KEYS & set(zero)


def test_stage2_cpu_optimizer_offload() -> None:
    zero = build_ds_config(ds(offload_optimizer="cpu"), 1, 1)["zero_optimization"]
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": True}


def test_stage3_with_nvme_offload() -> None:
    zero = build_ds_config(ds(zero_stage=3, offload_optimizer="nvme", offload_params="nvme", nvme_path="/mnt/ssd"),
                           2, 4)["zero_optimization"]
    assert zero["stage"] == 3
    assert zero["offload_optimizer"] == {"device": "nvme", "nvme_path": "/mnt/ssd", "pin_memory": True}
    assert zero["offload_param"] == {"device": "nvme", "nvme_path": "/mnt/ssd", "pin_memory": True}
    assert set(zero) >= STAGE3_KEYS
    assert zero["stage3_gather_16bit_weights_on_model_save"] is True
    assert "allgather_bucket_size" not in zero  # a stage 1-2 option


def test_stage3_cpu_param_offload() -> None:
    zero = build_ds_config(ds(zero_stage=3, offload_params="cpu"), 1, 1)["zero_optimization"]
    assert zero["offload_param"] == {"device": "cpu", "pin_memory": True}
    assert "offload_optimizer" not in zero


def test_fp16_has_dynamic_loss_scaling() -> None:
    out = build_ds_config(ds(precision="fp16"), 1, 1)
    assert out["fp16"] == {"enabled": True, "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
                           "hysteresis": 2, "min_loss_scale": 1}
    assert "bf16" not in out


def test_bf16_and_fp32() -> None:
    bf16 = build_ds_config(ds(precision="bf16"), 1, 1)
    assert bf16["bf16"] == {"enabled": True} and "fp16" not in bf16
    fp32 = build_ds_config(ds(precision="fp32"), 1, 1)
    assert "bf16" not in fp32 and "fp16" not in fp32


# --- The batch rule --------------------------------------------------------------------------------

def test_batch_problems_names_keys_and_numbers() -> None:
    (problem,) = lines(batch_problems("workloads.train", ds(micro_batch_per_gpu=8, gradient_accumulation=2,
                                                            train_batch_size=64), workers=2, per_worker=1))
    assert problem.startswith("workloads.train.deepspeed.trainBatchSize: 64 must equal workloads.train.workers (2)")
    assert "workloads.train.deepspeed.microBatchPerGpu (8)" in problem
    assert "workloads.train.deepspeed.gradientAccumulation (2)" in problem
    assert "= 32" in problem
    assert "Micro batch size per gpu: 0" in problem


def test_batch_problems_accepts_the_right_total_or_none() -> None:
    assert batch_problems("workloads.t", ds(micro_batch_per_gpu=8, gradient_accumulation=2, train_batch_size=32),
                          2, 1) == []
    assert batch_problems("workloads.t", ds(), 5, 3) == []


def test_dev_batch_size_mismatch_is_a_config_error() -> None:
    found = problems("dev", {"workloads.smoke.deepspeed.trainBatchSize": 30})
    assert len(found) == 1, found
    assert found[0].startswith("workloads.smoke.deepspeed.trainBatchSize: 30 must equal workloads.smoke.workers (2)")
    assert "= 32" in found[0]  # 2 workers x 1 T4 x 8 x 2


def test_batch_size_follows_more_workers() -> None:
    # 3 workers (+ client = 4 nodes) need maxNodes 4; then 3 x 1 x 8 x 2 = 48, not the file's 32.
    found = problems("dev", {"workloads.smoke.workers": 3, "nodePools[0].maxNodes": 4})
    assert len(found) == 1 and "= 48" in found[0], found


# --- Offload and precision rules -------------------------------------------------------------------

def test_param_offload_needs_stage3() -> None:
    found = problems("dev", {"workloads.smoke.deepspeed.offloadParams": "cpu"})
    assert found == ["workloads.smoke.deepspeed.offloadParams: cpu offload of parameters needs zeroStage 3, "
                     "got zeroStage 2"]


def test_optimizer_offload_needs_zero() -> None:
    found = problems("dev", {"workloads.smoke.deepspeed.offloadOptimizer": "nvme",
                             "workloads.smoke.deepspeed.zeroStage": 0})
    assert found == ["workloads.smoke.deepspeed.offloadOptimizer: nvme offload of optimizer states needs zeroStage "
                     "1 or higher, got zeroStage 0"]


def test_bf16_on_t4_suggests_fp16() -> None:
    found = problems("dev", {"workloads.smoke.deepspeed.precision": "bf16"})
    assert len(found) == 1, found
    assert found[0].startswith("workloads.smoke.deepspeed.precision: ")
    assert "nvidia-tesla-t4" in found[0] and "no bf16" in found[0] and found[0].endswith("use fp16")


def test_bf16_on_l4_is_fine() -> None:
    assert problems("prod", {"workloads.zero3-smoke.deepspeed.precision": "bf16"}) == []


def test_optimizer_offload_makes_deepspeed_build_the_optimizer() -> None:
    # ZeRO-Offload refuses a client optimizer unless it is DeepSpeed's CPU Adam, so the config names one.
    out = build_ds_config(ds(offload_optimizer="cpu", learning_rate=2e-5), 2, 1)
    assert out["optimizer"] == {"type": "AdamW", "params": {"lr": 2e-5, "betas": [0.9, 0.999], "eps": 1e-8,
                                                            "weight_decay": 0.0}}
    assert "optimizer" not in build_ds_config(ds(), 2, 1)  # no offload: the script passes its own


def test_hugging_face_trainer_fills_the_optimizer_itself() -> None:
    out = build_ds_config(ds(offload_optimizer="cpu"), 1, 8, hf_trainer=True)
    assert out["optimizer"] == {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                            "weight_decay": "auto"}}



def test_nvme_offload_needs_local_ssds_on_the_pool() -> None:
    nvme = {"workloads.smoke.deepspeed.zeroStage": 3, "workloads.smoke.deepspeed.offloadParams": "nvme"}
    assert problems("dev", nvme) == []  # the dev T4 pool has a local SSD
    assert problems("dev", {**nvme, "nodePools[0].localSsdCount": 0}) == [
        "workloads.smoke.deepspeed: offloading to nvme needs local SSDs on pool t4; set nodePools[0].localSsdCount "
        "to 1 or more, or offload to cpu"]


def test_stage3_buckets_are_left_to_the_hugging_face_trainer() -> None:
    # The Trainer fills "auto" from the model's hidden size (transformers' HfTrainerDeepSpeedConfig.trainer_config_
    # finalize: 0.9 x hidden^2 and 10 x hidden); the fixed 1e5 threshold would keep a small model's layers whole.
    zero = build_ds_config(ds(zero_stage=3), 2, 1, hf_trainer=True)["zero_optimization"]
    assert zero["stage3_prefetch_bucket_size"] == "auto" and zero["stage3_param_persistence_threshold"] == "auto"
    assert zero["stage3_gather_16bit_weights_on_model_save"] is True
    plain = build_ds_config(ds(zero_stage=3), 2, 1)["zero_optimization"]
    assert plain["stage3_prefetch_bucket_size"] == 50_000_000 and plain["stage3_param_persistence_threshold"] == 100_000


def test_finetune_py_runs_the_hugging_face_trainer() -> None:
    from workloads.ds_config import runs_hf_trainer

    assert runs_hf_trainer("finetune.py") and runs_hf_trainer("/gcs/bucket/code/finetune.py")
    assert not runs_hf_trainer("smoke_train.py") and not runs_hf_trainer(None) and not runs_hf_trainer("")


def test_an_mpijob_and_a_release_running_finetune_py_ship_the_trainers_config() -> None:
    from conftest import model

    from workloads import deepspeed_release, mpijob
    from workloads.placement import placement

    launch = {"script": "finetune.py", "args": ["--model", "/data/base"]}
    block = {"pool": "t4", "workers": 2, "launch": launch, "deepspeed": {"zeroStage": 3, "precision": "fp16"}}
    m = model("dev", {"workloads": {"ft": {"kind": "mpijob", **block, "storage": {"storageClass": "standard-rwx"}}},
                      "mpiOperator.install": True})
    w = m.workloads["ft"]
    shipped = json.loads(mpijob.config_map_data(w, placement(m, w), has_token=False)["ds_config.json"])
    assert shipped["zero_optimization"]["stage3_param_persistence_threshold"] == "auto"
    assert shipped["fp16"]["enabled"] is True and shipped["train_micro_batch_size_per_gpu"] == 1
    m = model("dev", {"workloads": {"rel": {"kind": "helm", **block}}})
    r = m.workloads["rel"]
    files = deepspeed_release.source_files(r, placement(m, r).per_worker)
    assert json.loads(files["ds_config.json"])["zero_optimization"]["stage3_prefetch_bucket_size"] == "auto"
    assert "finetune.py" in files
