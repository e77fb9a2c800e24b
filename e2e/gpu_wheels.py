"""`make gpu-wheels`: fill build/gpu-wheels/ with what `make gpu-check` installs on a lent device machine, where
nothing can be fetched (data/gpu_check.yaml says what it lacks), and the stack's ds_config.json for the check.

    python e2e/gpu_wheels.py [FOLDER]     # default build/gpu-wheels

deepspeed travels as PyPI's sdist (it publishes no wheel) and is built on the device against its own torch;
datasets and the needs of both that the device lacks travel as wheels for CPython 3.12 on x86-64 Linux. The
folder must stay under the device tool's 64 MiB (what travels with the working tree, carried paths included).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from e2e.gpu_bench import DS_CONFIGS as BENCH_DS_CONFIGS  # noqa: E402
from e2e.gpu_check import DS_CONFIGS, MIB, wheel_problems  # noqa: E402

DEFAULT_FOLDER = ROOT / "build" / "gpu-wheels"
# pip matches a manylinux tag exactly: the tags a CPython 3.12 x86-64 wheel may carry (device/README.md).
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")


def pins() -> dict[str, str]:
    """deepspeed and datasets at data/versions.yaml's pins, and the extra wheels of data/gpu_check.yaml."""
    versions = yaml.safe_load((ROOT / "data" / "versions.yaml").read_text(encoding="utf-8"))["python"]
    extra = yaml.safe_load((ROOT / "data" / "gpu_check.yaml").read_text(encoding="utf-8"))["extraWheels"]
    return {"deepspeed": str(versions["deepspeed"]), "datasets": str(versions["datasets"]),
            **{name: str(version) for name, version in extra.items()}}


def download(folder: Path, requirement: str, binary: bool) -> None:
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
               "-d", str(folder), requirement]
    if binary:
        command += ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp"]
        for platform in PLATFORMS:
            command += ["--platform", platform]
    else:
        command += ["--no-binary=:all:"]
    subprocess.run(command, check=True)


def stack_ds_config(precision: str, zero_stage: int = 3) -> dict[str, Any]:
    """The ds_config.json the stack writes for a finetune.py workload (hf_trainer) on one GPU, ZeRO-3 (or 2: make
    gpu-bench's other stage)."""
    from model.training_blocks import DeepSpeedConfig
    from workloads.ds_config import build_ds_config

    ds = DeepSpeedConfig(zero_stage=zero_stage, offload_optimizer="none", offload_params="none", nvme_path="/nvme",
                         precision=precision, micro_batch_per_gpu=4, gradient_accumulation=1,
                         reduce_bucket_size=50_000_000, allgather_bucket_size=50_000_000, steps_per_print=1000,
                         learning_rate=0.01, gradient_clipping=1.0)
    return build_ds_config(ds, workers=1, per_worker=1, hf_trainer=True)


def main(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    wanted = pins()
    for name, version in wanted.items():
        download(folder, f"{name}=={version}", binary=name != "deepspeed")
    for precision, file in DS_CONFIGS.items():
        (folder / file).write_text(json.dumps(stack_ds_config(precision), indent=2) + "\n", encoding="utf-8")
    for (stage, precision), file in BENCH_DS_CONFIGS.items():  # make gpu-bench's: ZeRO-2 and ZeRO-3
        (folder / file).write_text(json.dumps(stack_ds_config(precision, stage), indent=2) + "\n", encoding="utf-8")
    files = sorted(p.name for p in folder.iterdir())
    problems = wheel_problems(files, wanted)
    size = sum(p.stat().st_size for p in folder.iterdir())
    if size > 64 * MIB:
        problems.append(f"{folder} holds {size / MIB:.1f} MiB, over the device tool's 64 MiB")
    if problems:
        sys.exit("gpu-wheels: " + "; ".join(problems))
    print(f"gpu-wheels: {len(files)} files, {size / MIB:.1f} MiB in {folder}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_FOLDER)
