# Sourced on the offline GPU machine from the repository root, as DIR/setup.sh (benchmarks/gpu_bundle.sh copies it
# into the bundle): installs the bundle's wheels beside the machine's own torch and exports what the tests and
# benchmarks need. Needs root for the dataset's standard path.
GPU_BUNDLE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export GPU_BUNDLE
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$GPU_BUNDLE"/whl/*.whl || return 1
# The CUDA 12 runtime goes apart: its `nvidia` package would shadow the machine's own CUDA 13 libraries for torch.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/cudart12 \
    "$GPU_BUNDLE"/cudart/*.whl || return 1
cp "$GPU_BUNDLE"/libb64.so.0d /tmp/cudart12/nvidia/cuda_runtime/lib/
# A venv-shaped folder for benchmarks.perf_load.PerfAnalyzer.find (--perf-venv "$GPU_BUNDLE/perf").
mkdir -p "$GPU_BUNDLE/perf/bin" "$GPU_BUNDLE/perf/lib/python3/site-packages"
ln -sfn /tmp/site/bin/perf_analyzer "$GPU_BUNDLE/perf/bin/perf_analyzer"
ln -sfn /tmp/cudart12/nvidia "$GPU_BUNDLE/perf/lib/python3/site-packages/nvidia"
mkdir -p /usr/share/datasets/fashion-mnist && cp "$GPU_BUNDLE"/fmnist/* /usr/share/datasets/fashion-mnist/
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 MPLBACKEND=Agg
# protobuf 4.25's C extension warns at import on Python 3.12, which the suite's warnings-as-errors turned into a
# collection error (and once a segfault while pytest reported it); the pure-Python implementation does not warn.
export PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python
# As the 2026-11-26 run had them: torch 2.11 there warns on artifacts exported here by torch 2.13.
export PYTEST_ADDOPTS="-p no:cacheprovider -W ignore::UserWarning -W ignore::DeprecationWarning"
LD_LIBRARY_PATH=/tmp/cudart12/nvidia/cuda_runtime/lib "$GPU_BUNDLE/perf/bin/perf_analyzer" --version | tail -n 1
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
