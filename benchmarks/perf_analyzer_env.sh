#!/usr/bin/env bash
# Triton's C++ perf_analyzer in its own venv (.venv-perf, git-ignored), apart from the project's .venv.
#
#   benchmarks/perf_analyzer_env.sh            # create .venv-perf if needed; prints the LD_LIBRARY_PATH to use
#   export LD_LIBRARY_PATH=$(benchmarks/perf_analyzer_env.sh | tail -n 1)
#   PERF_VENV=DIR benchmarks/perf_analyzer_env.sh   # the venv in DIR instead (the test suite's is in ~/.cache/adaserve)
#
# The venv is made again when its Python or package list changed (their hash, written into it once it was made).
# The tritonclient wheel ships the perf_analyzer binary; it links the CUDA runtime even on a CPU-only machine
# (nvidia-cuda-runtime-cu12 provides libcudart) and libb64 (the Debian package libb64-0d).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${PERF_VENV:-$ROOT/.venv-perf}
PYTHON=${PYTHON:-python3.11}
PACKAGES=("tritonclient[all]==2.48.0" nvidia-cuda-runtime-cu12)
KEY=$(printf '%s\n' "$("$PYTHON" -VV)" "${PACKAGES[@]}" | sha256sum)

# One set-up at a time (the suite's parallel workers may all ask at once): the others wait, then find it done.
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9

if [ ! -x "$VENV/bin/perf_analyzer" ] || [ "$(cat "$VENV/adaserve-key" 2>/dev/null)" != "$KEY" ]; then
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV" >&2
    "$VENV/bin/pip" install -q "${PACKAGES[@]}" >&2
    echo "$KEY" >"$VENV/adaserve-key"
fi

if ! ldconfig -p | grep -q 'libb64\.so\.0d'; then
    if [ "$(id -u)" -eq 0 ]; then
        apt-get install -y -qq libb64-0d >&2 || { apt-get update -qq >&2 && apt-get install -y -qq libb64-0d >&2; }
    else
        echo "perf_analyzer needs libb64-0d: run 'sudo apt-get install -y libb64-0d'" >&2
        exit 1
    fi
fi

LIB=$("$VENV/bin/python" -c 'import nvidia.cuda_runtime as m; print(m.__path__[0])')/lib
LD_LIBRARY_PATH=$LIB "$VENV/bin/perf_analyzer" --version >/dev/null 2>&1 || {
    echo "perf_analyzer in $VENV does not start; try: LD_LIBRARY_PATH=$LIB $VENV/bin/perf_analyzer --version" >&2
    exit 1
}
echo "$LIB"
