"""The one version set (`data/versions.yaml`): what the image ships and `make e2e` proves.

The stack builds the image with these as build arguments (`build_args`), so what is pushed is the data file's
set whatever the Dockerfile's defaults say; a test keeps the defaults equal too. The image block also says which
CUDA compute capabilities the image's torch has kernels for (`supports`), which a config check uses to refuse a
pool the image cannot run on.
"""

from __future__ import annotations

import functools
from pathlib import Path

import msgspec

from model.yamlio import load_yaml

VERSIONS_PATH = Path(__file__).resolve().parent.parent / "data" / "versions.yaml"

# Dockerfile ARG -> key of the `python:` block (workloads/images/deepspeed/Dockerfile).
PYTHON_BUILD_ARGS = {
    "TORCH_VERSION": "torch",
    "NCCL_VERSION": "nvidiaNcclCu13",
    "DEEPSPEED_VERSION": "deepspeed",
    "TRANSFORMERS_VERSION": "transformers",
    "ACCELERATE_VERSION": "accelerate",
    "PEFT_VERSION": "peft",
    "DATASETS_VERSION": "datasets",
    "VLLM_VERSION": "vllm",
    "DEEPSPEED_MII_VERSION": "deepspeedMii",
    "TENSORBOARD_VERSION": "tensorboard",
    "LM_EVAL_VERSION": "lmEval",
}
OP_ARCHS_BUILD_ARG = "TORCH_CUDA_ARCH_LIST"


def _capability(text: str) -> tuple[int, int]:
    major, _, minor = str(text).partition(".")
    return int(major), int(minor or 0)


class VersionSet(msgspec.Struct, frozen=True):
    python: dict[str, str]
    base_image: str
    cuda: str
    min_driver: str  # the oldest NVIDIA driver the image's CUDA runs on (580.65.06 for CUDA 13.0)
    python_version: str  # the image's interpreter (python3.12 on Ubuntu 24.04)
    torch_cuda_archs: tuple[tuple[int, int], ...]  # compute capabilities with kernels in the image's torch
    deepspeed_op_archs: str  # TORCH_CUDA_ARCH_LIST for DeepSpeed's ahead-of-time ops
    # DeepSpeed ops built into the image (installed_ops name -> the DS_BUILD_* variable the Dockerfile sets)
    deepspeed_ops: dict[str, str] = msgspec.field(default_factory=dict)

    @property
    def min_driver_branch(self) -> int:
        """The driver branch (R580 for 580.65.06): GKE names its drivers by branch, and every driver of the
        branch runs the branch's CUDA major (NVIDIA's minor version compatibility)."""
        return int(self.min_driver.split(".")[0])

    @property
    def nccl(self) -> str:
        return self.python["nvidiaNcclCu13"]

    def build_args(self) -> dict[str, str]:
        """The Dockerfile's build arguments for this set."""
        args = {arg: self.python[key] for arg, key in PYTHON_BUILD_ARGS.items()}
        args[OP_ARCHS_BUILD_ARG] = self.deepspeed_op_archs
        return args

    def supports(self, capability: tuple[int, int]) -> bool:
        """Whether torch has a kernel the GPU runs: a cubin of the same major and an equal or lower minor (CUDA
        binary compatibility; the wheel carries no PTX, so nothing is compiled for a newer GPU at run time)."""
        return any(major == capability[0] and minor <= capability[1] for major, minor in self.torch_cuda_archs)

    def has_op(self, op: str) -> bool:
        """Whether the image has this DeepSpeed op built in (`installed_ops`' name, e.g. async_io)."""
        return op in self.deepspeed_ops

    def torch_archs_text(self) -> str:
        return ", ".join(f"{major}.{minor}" for major, minor in self.torch_cuda_archs)


def parse(raw: dict) -> VersionSet:
    image = raw["image"]
    return VersionSet(
        python={k: str(v) for k, v in raw["python"].items()},
        base_image=str(image["base"]),
        cuda=str(image["cuda"]),
        min_driver=str(image["minDriver"]),
        python_version=str(image["python"]),
        torch_cuda_archs=tuple(_capability(a) for a in image["torchCudaArchs"]),
        deepspeed_op_archs=str(image["deepspeedOpArchs"]),
        deepspeed_ops={str(op): str(var) for op, var in (image.get("deepspeedOps") or {}).items()},
    )


@functools.cache
def load(path: Path = VERSIONS_PATH) -> VersionSet:
    return parse(load_yaml(path))
