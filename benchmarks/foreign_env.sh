#!/usr/bin/env bash
# Another project's server in a venv of its own (git-ignored), the baseline of a versus_* benchmark.
#
#   benchmarks/foreign_env.sh ray       # .venv-ray: Ray Serve 2.40 (benchmarks/versus_ray.py)
#   benchmarks/foreign_env.sh kserve    # .venv-kserve: KServe 0.14's Python model server (benchmarks/versus_kserve.py)
#
# Creates or completes the venv and prints its Python. Each project pins its own FastAPI, grpcio, protobuf and
# pydantic; apart from the project's .venv they do not move adaserve's. FastAPI is the release of Ray 2.40's time
# (later ones hold locks that Ray cannot pickle), in both. torch is adaserve's CPU wheel, so all run the same kernels.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3.11}
FASTAPI=0.115.6

case "${1:-}" in
    ray) PACKAGE="ray[serve]==2.40.0"; MODULE=ray.serve ;;
    kserve) PACKAGE="kserve==0.14.1"; MODULE=kserve ;;
    *) echo "usage: $0 ray|kserve" >&2; exit 2 ;;
esac
VENV=$ROOT/.venv-$1

if ! "$VENV/bin/python" -c "import $MODULE, torch, fastapi; assert fastapi.__version__ == '$FASTAPI'" >/dev/null 2>&1; then
    "$PYTHON" -m venv "$VENV" >&2
    "$VENV/bin/pip" install -q "$PACKAGE" "fastapi==$FASTAPI" "torch==2.13.0" numpy >&2
fi
echo "$VENV/bin/python"
