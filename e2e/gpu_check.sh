#!/usr/bin/env bash
# `make gpu-check`: on a lent device machine (nothing fetchable there), install what make gpu-wheels put in
# build/gpu-wheels/ into a folder of its own, then run e2e/gpu_check.py (its arguments pass through: --cpu, --steps).
# GPU_CHECK_INSTALL=0 skips the install. PYTHON: the python holding torch (the device's python3; here, /opt/ds-e2e-venv/bin/python for --cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
WHEELS="${GPU_WHEELS:-build/gpu-wheels}"
SITE="${GPU_CHECK_SITE:-/tmp/gpu-check-site}"
ls "$WHEELS"/deepspeed-*.tar.gz >/dev/null || { echo "gpu-check: no $WHEELS (run make gpu-wheels first)" >&2; exit 2; }
start=$(date +%s)
# GPU_CHECK_INSTALL=0: the python already holds these (the e2e venv, for --cpu here).
if [ "${GPU_CHECK_INSTALL:-1}" != 0 ]; then
"$PYTHON" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target "$SITE" "$WHEELS"/*.whl
# deepspeed's sdist, built against this machine's torch; DS_BUILD_OPS=0 compiles nothing (ops load just in time).
DS_BUILD_OPS=0 "$PYTHON" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-build-isolation \
    --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/deepspeed-*.tar.gz
echo "gpu-check: installed $WHEELS into $SITE in $(( $(date +%s) - start )) s" >&2
fi
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
# GPU_CHECK_SCRIPT: make gpu-bench runs e2e/gpu_bench.py the same way (the same wheels, its own arguments).
exec "$PYTHON" "${GPU_CHECK_SCRIPT:-e2e/gpu_check.py}" --wheels "$WHEELS" "$@"
