#!/usr/bin/env bash
# Another project's server in a venv of its own (git-ignored), the baseline of a versus_* benchmark.
#
#   benchmarks/foreign_env.sh ray       # .venv-ray: Ray Serve 2.40 (benchmarks/versus_ray.py)
#   benchmarks/foreign_env.sh ray-cluster  # .venv-ray-cluster: Ray Serve of the Ray adaserve's cluster runs on (2.60;
#                                          # benchmarks/cluster/versus_ray_serve.py)
#   benchmarks/foreign_env.sh kserve    # .venv-kserve: KServe 0.14's Python model server (benchmarks/versus_kserve.py)
#   benchmarks/foreign_env.sh torchserve  # .venv-torchserve: TorchServe 0.12 and its archiver (versus_torchserve.py);
#                                         # its frontend needs Java 17 (apt: openjdk-17-jre-headless)
#   benchmarks/foreign_env.sh kserve-client  # KServe 0.14's Python clients alone, no torch, every package pinned
#                                            # (kserve_client_requirements.txt), for tests/server/test_kserve_client.py;
#                                            # in ~/.cache/adaserve/venv-kserve-client ($XDG_CACHE_HOME), outside the
#                                            # checkout, so a fresh clone (CI's) finds it made
#
# Creates the venv unless it was made from the same packages and Python (their hash, written into the venv once its
# import check passed; a different one makes it again) and prints its Python.
# Each project pins its own FastAPI, grpcio, protobuf and pydantic; apart from the project's .venv they do not move
# adaserve's. FastAPI is the release of Ray 2.40's time (later ones hold locks that Ray cannot pickle), in Ray's and
# KServe's. torch is adaserve's CPU wheel, so all run the same kernels. pip compiles no bytecode (most of a set-up's
# time, for kubernetes' thousands of modules that KServe's client never runs); the import check writes that of what
# it imports, even where PYTHONDONTWRITEBYTECODE is set.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3.11}
FASTAPI=0.115.6
TORCH=("torch==2.13.0" numpy)
VENV=$ROOT/.venv-${1:-}
NO_DEPS=()  # --no-deps where PACKAGES pins every package: nothing to resolve

case "${1:-}" in
    ray) PACKAGES=("ray[serve]==2.40.0" "fastapi==$FASTAPI"); CHECK="import ray.serve, fastapi; assert fastapi.__version__ == '$FASTAPI'" ;;
    ray-cluster) PACKAGES=("ray[serve]==2.60.0"); CHECK="import ray.serve, fastapi" ;;
    kserve) PACKAGES=("kserve==0.14.1" "fastapi==$FASTAPI"); CHECK="import kserve, fastapi; assert fastapi.__version__ == '$FASTAPI'" ;;
    torchserve) PACKAGES=("torchserve==0.12.0" "torch-model-archiver==0.12.0" pyyaml); CHECK="import ts.utils.util, model_archiver" ;;
    kserve-client)
        mapfile -t PACKAGES < <(grep -v '^#' "$ROOT/benchmarks/kserve_client_requirements.txt")
        NO_DEPS=(--no-deps); TORCH=(); CHECK="from kserve import InferenceRESTClient"
        VENV=${XDG_CACHE_HOME:-$HOME/.cache}/adaserve/venv-kserve-client ;;
    *) echo "usage: $0 ray|ray-cluster|kserve|torchserve|kserve-client" >&2; exit 2 ;;
esac
[ ${#TORCH[@]} -eq 0 ] || CHECK="import torch; $CHECK"
VERSION=$("$PYTHON" -VV)
KEY=$(printf '%s\n' "$VERSION" "${NO_DEPS[@]}" "${PACKAGES[@]}" "${TORCH[@]}" | sha256sum)
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"  # one set-up at a time (the suite's parallel workers): the others wait, then find it done
flock 9

if [ "$(cat "$VENV/adaserve-key" 2>/dev/null)" != "$KEY" ]; then
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV" >&2
    "$VENV/bin/pip" install -q --no-compile "${NO_DEPS[@]}" "${PACKAGES[@]}" "${TORCH[@]}" >&2
    env -u PYTHONDONTWRITEBYTECODE "$VENV/bin/python" -c "$CHECK" >&2
    echo "$KEY" >"$VENV/adaserve-key"
fi
echo "$VENV/bin/python"
