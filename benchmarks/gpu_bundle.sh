#!/usr/bin/env bash
# The GPU tests and benchmarks on an offline machine that has its own CUDA torch (a lent GPU machine: Python 3.12,
# torch 2.11 + CUDA 13, no network). Two steps:
#
#   benchmarks/gpu_bundle.sh pack [DIR]     # here, with network: wheels and files into DIR (default .gpu, ~32 MB)
#   source DIR/setup.sh                     # there, from the repository root: installs and exports the environment
#
# then, there, e.g. (the trace and perf_analyzer come from the bundle; on 2026-11-26 these tests took over 200 s, the
# quick elastic run 301 s):
#   python3 -m pytest -q tests/engine/test_streams.py tests/adaptive/gati/test_server.py \
#       tests/server/test_cuda_shared_memory.py
#   python3 -m benchmarks.elastic_batching --quick --device cuda --model resnet50 --trace "$GPU_BUNDLE/conv.csv" \
#       --perf-venv "$GPU_BUNDLE/perf" --noise-cores 2 --quiet-s 0
#   python3 -m benchmarks.packrat.speedup --quick --models resnet50 --skip-end-to-end --profile-max-batch 16 \
#       --batches 1,2,4,8,16,32,64,128,256 --output benchmarks/results/packrat_speedup-t16.json
#       # Packrat at T = every CPU (16 there): ~5 minutes a CNN (ResNet-50 295 s, profile included)
#   python3 -m benchmarks.gati.gpu --packed "$GPU_BUNDLE/gati" --device cpu --output benchmarks/results/gati_cpu16.json
#       # GATI's lookups on a core of their own (p99 bar, issue 6); `--device cuda` for the GPU form
#   bash benchmarks/gpu_checks.sh .gpu "$OUT"    # what the next lent machine runs: the GPU high-load miss (~8 min)
#
# The bundle holds what that machine's image lacks, for its Python: this package's dependencies that are not there
# (tritonclient, whose wheel holds perf_analyzer, msgspec, httptools, pydantic, ..., and py-spy), the CUDA 12 runtime
# and libb64 that perf_analyzer links, Fashion-MNIST's test split (the tests read it) and the Azure trace
# (`../shared` does not travel), and GATI's packed inputs (`benchmarks.gati.gpu --pack`) when the early-exit
# benchmark has built its cache set here. Keep DIR out of git (e.g. `echo /.gpu/ >> .git/info/exclude`).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON_VERSION=${PYTHON_VERSION:-3.12}
# Versions as this repository's .venv resolves them; geventhttpclient 2.0.2 has no cp312 wheel, 2.0.12 is the nearest.
WHEELS=(
    tritonclient==2.48.0 msgspec==0.22.0 httptools==0.9.0 pydantic==2.14.4 pydantic_core==2.50.5
    annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0 python-rapidjson==1.25
    geventhttpclient==2.0.12 gevent==26.9.0 greenlet==3.5.6 zope.event==6.2 zope.interface==8.7 brotli==1.2.1
    protobuf==4.25.9 grpcio-health-checking==1.62.3
    opentelemetry-api==1.26.0 opentelemetry-sdk==1.26.0 opentelemetry-semantic-conventions==0.47b0
    opentelemetry-exporter-otlp-proto-http==1.26.0 opentelemetry-exporter-otlp-proto-common==1.26.0
    opentelemetry-proto==1.26.0 googleapis-common-protos==1.75.0 Deprecated==1.3.1 wrapt==2.5.2
    importlib_metadata==8.0.0 zipp==4.1.2 requests==2.34.2 urllib3==2.8.0 idna==3.20 charset-normalizer==3.5.3
    certifi==2026.10.19.post1
    py-spy==0.4.3
)

pack() {
    local dir=${1:-$ROOT/.gpu}
    mkdir -p "$dir/whl" "$dir/cudart" "$dir/fmnist"
    local platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
    local download=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYTHON_VERSION"
        --implementation cp "${platforms[@]}")
    "${download[@]}" -d "$dir/whl" "${WHEELS[@]}"
    "${download[@]}" -d "$dir/cudart" nvidia-cuda-runtime-cu12
    ldconfig -p | grep -q 'libb64\.so\.0d' || { echo "needs libb64-0d here: apt-get install -y libb64-0d" >&2; exit 1; }
    cp -L "$(ldconfig -p | awk '/libb64\.so\.0d/ {print $NF; exit}')" "$dir/"
    cp /usr/share/datasets/fashion-mnist/t10k-* "$dir/fmnist/"
    cp "$ROOT/../shared/data/traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv" "$dir/conv.csv"
    cp "$ROOT/benchmarks/gpu_setup.sh" "$dir/setup.sh"
    if [ -d "$ROOT/benchmarks/results/tmp/gati/repo/resnet/caches/v1" ]; then
        (cd "$ROOT" && .venv/bin/python -m benchmarks.gati.gpu --pack "$dir/gati")
    else
        echo "no GATI cache set here (run benchmarks.gati.early_exit first): the bundle has no gati/" >&2
    fi
    du -sh "$dir"
}

case "${1:-}" in
    pack) pack "${2:-}" ;;
    *) sed -n '2,25p' "$0" >&2; exit 2 ;;
esac
