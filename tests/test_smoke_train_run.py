"""smoke_train.py's run path without torch: the exit status of a rank that sees no GPU (torch and deepspeed
stubbed in a subprocess), and the launcher-variable and checkpoint helpers the e2e relies on."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest
from conftest import load_file

ROOT = Path(__file__).resolve().parent.parent
SMOKE_TEST = ROOT / "recipes" / "smoke_train.py"

# Stand-ins for torch and deepspeed: a machine without a GPU. Every call that matters is logged to
# $STUB_LOG; deepspeed.init_distributed and any non-gloo process group fail like NCCL does without a GPU.
STUBS = {
    "torch/__init__.py": """
        import json, os
        def log(*event):
            with open(os.environ["STUB_LOG"], "a") as handle:
                handle.write(json.dumps(list(event)) + "\\n")
        class cuda:
            @staticmethod
            def is_available(): return False
            @staticmethod
            def device_count(): return 0
        from torch import distributed
    """,
    "torch/distributed.py": """
        import torch
        class TCPStore:
            def __init__(self, host, port, world_size, is_master, timeout=None):
                torch.log("store", host, port, world_size, is_master)
        class PrefixStore:
            def __init__(self, prefix, store): self.prefix = prefix
        def init_process_group(backend, store=None, rank=None, world_size=None):
            torch.log("init_process_group", backend, store.prefix, rank, world_size)
            if backend != "gloo":
                raise RuntimeError("ProcessGroupNCCL is only supported with GPUs, no GPUs found!")
        def all_gather_object(out, obj, group=None):
            torch.log("all_gather_object")
            out[:] = [obj] * len(out)
        def destroy_process_group():
            torch.log("destroy_process_group")
    """,
    "deepspeed/__init__.py": """
        def init_distributed(*args, **kwargs):
            raise RuntimeError("stub: deepspeed.init_distributed reached before the GPU agreement")
    """,
}


@pytest.fixture(scope="module")
def stub_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stubs")
    for name, text in STUBS.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text), encoding="utf-8")
    return root


def run_smoke(stub_path: Path, tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], list[list]]:
    config = tmp_path / "ds_config.json"
    config.write_text('{"train_micro_batch_size_per_gpu": 1}', encoding="utf-8")
    log = tmp_path / "calls.jsonl"
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "SYSTEMROOT")}
    proc = subprocess.run(
        [sys.executable, str(SMOKE_TEST), "--deepspeed_config", str(config)],
        env={**base, "PYTHONPATH": str(stub_path), "STUB_LOG": str(log), **env},
        capture_output=True, text=True, timeout=60, check=False,
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return proc, calls


def test_a_rank_without_a_gpu_exits_3_with_the_documented_message(stub_path: Path, tmp_path: Path) -> None:
    proc, calls = run_smoke(stub_path, tmp_path, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                            MASTER_ADDR="10.0.0.1", MASTER_PORT="29511", CUDA_VISIBLE_DEVICES="")
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "[smoke] FAILED: rank 0 on " in proc.stderr
    assert "no GPU visible to torch (CUDA_VISIBLE_DEVICES='')" in proc.stderr
    # The agreement ran over gloo on the launcher's rendezvous; nothing else was started.
    assert calls == [["store", "10.0.0.1", 29511, 1, True],
                     ["init_process_group", "gloo", "smoke/gpu-check", 0, 1],
                     ["all_gather_object"],
                     ["destroy_process_group"]]


def test_bad_launcher_variables_exit_2_before_torch(stub_path: Path, tmp_path: Path) -> None:
    proc, calls = run_smoke(stub_path, tmp_path, RANK="1", WORLD_SIZE="2", LOCAL_RANK="0")
    assert proc.returncode == 2
    assert "MASTER_ADDR is not set" in proc.stderr
    assert calls == []


# --- helpers -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smoke() -> ModuleType:
    return load_file(SMOKE_TEST, "deepspeed_smoke_test_run")


# smoke_train.py's modules, as the script imported them: the ranks' variables, and the checkpoints.
@pytest.fixture(scope="module")
def ranks(smoke: ModuleType) -> ModuleType:
    return importlib.import_module("recipes.smoke_train_ranks")


@pytest.fixture(scope="module")
def checkpoint(smoke: ModuleType) -> ModuleType:
    return importlib.import_module("recipes.smoke_train_checkpoint")


def test_rank_env_from_the_deepspeed_launcher(ranks: ModuleType) -> None:
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_SIZE": "2", "MASTER_ADDR": "w-0",
           "MASTER_PORT": "29500"}
    assert ranks.rank_env(env) == env


def test_rank_env_from_open_mpi(ranks: ModuleType) -> None:
    # DeepSpeed's openmpi launcher exports MASTER_ADDR/MASTER_PORT (-x); the ranks are Open MPI's.
    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "29600"}
    assert ranks.rank_env(env) == {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_SIZE": "1",
                                   "MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "29600"}


def test_rank_env_alone_and_refusals(ranks: ModuleType) -> None:
    assert ranks.rank_env({}) == {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_SIZE": "1",
                                  "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    with pytest.raises(ValueError, match="RANK=2 is not below WORLD_SIZE=2"):
        ranks.rank_env({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h"})
    with pytest.raises(ValueError, match="MASTER_PORT='x'"):
        ranks.rank_env({"MASTER_PORT": "x"})
    with pytest.raises(ValueError, match="RANK='-1'"):
        ranks.rank_env({"RANK": "-1"})


def test_cpu_run_needs_the_explicit_request(ranks: ModuleType) -> None:
    assert ranks.cpu_run_requested({"DS_ACCELERATOR": "cpu"})
    assert not ranks.cpu_run_requested({})
    assert not ranks.cpu_run_requested({"DS_ACCELERATOR": "cuda"})


def test_checkpoint_dir_precedence(checkpoint: ModuleType) -> None:
    env = {"AIP_CHECKPOINT_DIR": "/gcs/b/ckpt", "CHECKPOINT_DIR": "/mnt/ckpt"}
    assert checkpoint.checkpoint_dir("/x", env) == "/x"
    assert checkpoint.checkpoint_dir(None, env) == "/gcs/b/ckpt"
    assert checkpoint.checkpoint_dir(None, {"CHECKPOINT_DIR": "/mnt/ckpt"}) == "/mnt/ckpt"
    assert checkpoint.checkpoint_dir(None, {}) is None


def test_checkpoint_schedule(checkpoint: ModuleType) -> None:
    assert [n for n in range(1, 13) if checkpoint.due_for_checkpoint(n, 5)] == [5, 10]
    assert not any(checkpoint.due_for_checkpoint(n, 0) for n in range(10))


def test_resume_state_round_trip(checkpoint: ModuleType, tmp_path: Path) -> None:
    assert checkpoint.read_resume_state(str(tmp_path)) is None
    assert checkpoint.read_resume_state(None) is None
    checkpoint.write_resume_state(str(tmp_path), {"step": 6, "world_size": 2, "tag": "global_step6", "loss": 0.5})
    assert checkpoint.read_resume_state(str(tmp_path)) == {"step": 6, "world_size": 2, "tag": "global_step6",
                                                           "loss": 0.5}
    assert [p.name for p in tmp_path.iterdir()] == ["smoke_state.json"]
    (tmp_path / "smoke_state.json").write_text('{"step": 1}', encoding="utf-8")
    with pytest.raises(ValueError, match="not a smoke-test checkpoint state"):
        checkpoint.read_resume_state(str(tmp_path))
    assert checkpoint.universal_tag("global_step6") == "global_step6_universal"


def test_stop_request_records_the_signal(smoke: ModuleType) -> None:
    stop = smoke.StopRequest()
    assert stop.signal is None
    stop(15, None)
    assert stop.signal == 15
