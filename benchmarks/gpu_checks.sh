#!/usr/bin/env bash
# The checks a lent GPU machine runs next, as one call of the device tool (about 13 minutes of its 15; the open
# questions are GATI with CUDA graphs between exits against the graph-replayed base (issue 52), GATI's p99 with
# `lookup: process` on spare cores, benchmarks/README.md §4, and the GPU high-load miss, §2 "Next on a lent
# machine"). Here, first:
#
#   echo /.gpu/ >> .git/info/exclude; bash benchmarks/gpu_bundle.sh pack .gpu
#
# then on the device (carry .gpu), from the repository root: `bash benchmarks/gpu_checks.sh .gpu "$OUT"`. It writes
# under OUT (default benchmarks/results/tmp/gpu):
#   gati_cpu16-process.json               GATI at batch 1 on the CPU: inline against `lookup: process` (~1 min)
#   gati_gpu-graphs.json                  GATI at batch 1 on the GPU, each segment between exits a CUDA graph,
#                                         against the base as one CUDA graph and GATI block by block (~1 min)
#   stream_concurrency.json               Ebird's §VI-B premise on the server's stream workers (~30 s)
#   stream_profiles.json                  the stream profile (batch latency by streams × batch) of the example models
#                                         and ResNet-50, and the set and MaxInf each latency target gets (~1-2 min)
#   elastic_batching-cuda-resnet50.json   the elastic run with the busy-stream entries beside (~7 min, and the
#                                         stream profile its elastic entries share, measured as they load), its
#                                         PNGs and log beside it
#   server-step.txt                       py-spy's samples (raw, collapsed stacks) of the server and its model
#                                         host during the step stage, where the time of a host-bound server goes
# Copy the JSONs and PNGs into benchmarks/results/ (renamed by date or run) and record them in benchmarks/README.md.
set -uo pipefail

BUNDLE=${1:-.gpu}
OUT=${2:-benchmarks/results/tmp/gpu}
mkdir -p "$OUT"
# shellcheck source=/dev/null
source "$BUNDLE/setup.sh" || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

timeout 150 python3 -m benchmarks.gati.gpu --packed "$BUNDLE/gati" --device cpu --output "$OUT/gati_cpu16-process.json" \
    2>&1 | grep -E '^  "(base|gati)|"(mean|p99)_ms"'
timeout 90 python3 -m benchmarks.gati.gpu --packed "$BUNDLE/gati" --rows 2000 --output "$OUT/gati_gpu-graphs.json" \
    2>&1 | grep -E '^  "(base|gati)|"(mean|p99)_ms"|"agreement"'
timeout 120 python3 -m benchmarks.stream_concurrency --output "$OUT/stream_concurrency.json" 2>&1 | tail -n 8
timeout 240 python3 -m benchmarks.stream_profiles --output "$OUT/stream_profiles.json" 2>&1 | grep -E '^\S|target'

log="$OUT/elastic.log"
python3 -m benchmarks.elastic_batching --quick --device cuda --model resnet50 --noise-cores 2 --quiet-s 0 \
    --phase-s 8 --trace-s 8 --sweep-s 2 --entries "elastic 1 busy,elastic 2 busy,elastic 1 busy saturated" \
    --trace "$GPU_BUNDLE/conv.csv" --perf-venv "$GPU_BUNDLE/perf" \
    --output "$OUT/elastic_batching-cuda-resnet50.json" > "$log" 2>&1 &
bench=$!

# The step stage follows the OPT Wait sweep's two runs; sample the server's processes through it (25 Hz, without
# stopping them). Bounded waits: the benchmark may end, or fail, first.
spy=/tmp/site/bin/py-spy
for _ in $(seq 600); do
    [ "$(grep -c '^ *delay-' "$log" 2>/dev/null)" -ge 2 ] && break
    kill -0 "$bench" 2>/dev/null || break
    sleep 0.5
done
server=$(pgrep -f -n "adaserve serve --model-repository .*elastic_batching-cuda-resnet50")
if [ -x "$spy" ] && [ -n "$server" ]; then
    "$spy" record --pid "$server" --subprocesses --nonblocking --rate 25 --duration 110 --format raw \
        --output "$OUT/server-step.txt" > "$OUT/py-spy.log" 2>&1 || echo "py-spy failed: $(tail -n 1 "$OUT/py-spy.log")"
fi
wait "$bench"
echo "elastic_batching exit $?"
tail -n 40 "$log"
