#!/usr/bin/env bash
# One-time installs for `make e2e` (idempotent; a second run takes about a second):
#   - Debian: openssh-server, openssh-client, pdsh (the Bitnami chart's launch path) and openmpi-bin (mpirun);
#   - a venv at $E2E_VENV (default /opt/ds-e2e-venv) built from the Debian python, NOT under /root: the
#     training ranks run as UID 1001 (the image's user), and a venv whose python lives under /root is
#     unreadable to that user;
#   - the CPU torch wheel and DeepSpeed (pinned below), mpi4py for the OpenMPI path;
#   - DeepSpeed's CPU shared-memory communication op, built once here: the first init_distributed on CPU
#     otherwise JIT-builds it inside a timed launch (~35 s).
set -euo pipefail
E2E_VENV="${E2E_VENV:-/opt/ds-e2e-venv}"
TORCH_VERSION=2.13.0
DEEPSPEED_VERSION="${DEEPSPEED_VERSION:-0.19.8}"
MPI4PY_VERSION=4.1.2
# A change to this script (versions, steps) reinstalls; otherwise a second run returns at once.
STAMP="$E2E_VENV/.e2e-installed-$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-16)"
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
