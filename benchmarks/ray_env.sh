#!/usr/bin/env bash
# Ray Serve in its own venv (.venv-ray, git-ignored), the baseline of benchmarks/versus_ray.py.
#
#   benchmarks/ray_env.sh            # create or complete .venv-ray; prints its Python
#
# FastAPI as of Ray 2.40 (later releases hold locks that Ray cannot pickle). Ray pins its own grpcio, protobuf and
# pydantic; apart from the project's .venv they do not move adaserve's. torch is the same CPU wheel as adaserve's, so both servers run the same kernels.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${RAY_VENV:-$ROOT/.venv-ray}
PYTHON=${PYTHON:-python3.11}

if ! "$VENV/bin/python" -c 'import ray.serve, torch, fastapi; assert fastapi.__version__ == "0.115.6"' >/dev/null 2>&1; then
    "$PYTHON" -m venv "$VENV" >&2
    "$VENV/bin/pip" install -q "ray[serve]==2.40.0" "fastapi==0.115.6" "torch==2.13.0" numpy >&2
fi
echo "$VENV/bin/python"
