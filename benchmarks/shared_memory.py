"""System shared memory against tensors in the request body: what Triton's shared-memory extension saves a client
on the same machine, by request size.

A downsample-then-classify model, `pooled_<S>` (average-pool a 3×S×S FP32 image to 3×8×8, then an MLP 192-64-10;
seeded random weights, torch.export), at S = 64, 224 and 512: 48 KiB, 588 KiB and 3 MiB a request, with compute that
stays small beside moving the bytes. Triton's C++ perf_analyzer sends batch-1 requests, closed loop at concurrency 1,
over HTTP (binary tensor data) and gRPC, each with the tensors in the request and with `--shared-memory system`
(perf_analyzer creates POSIX shared memory, registers it, and names it in every request; the server reads the input
from it into the input pool and writes the output into it). Every case runs `--repeats` times, interleaved, on one
server started with `--allow-client-shm`; the median is reported beside each repeat.

    benchmarks/perf_analyzer_env.sh                     # once: Triton's perf_analyzer in .venv-perf
    .venv/bin/python -m benchmarks.shared_memory        # ~3 minutes; --quick for a smoke run

Writes `benchmarks/results/shared_memory.json` and `.png` (with --quick: under `benchmarks/results/tmp/`).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from adaserve.config import ModelConfig
from adaserve.export import write_model
from adaserve.zoo import mlp
from benchmarks.common import (
    DEFAULT_SET_ONLY,
    RESULTS,
    SCRATCH,
    figure,
    finish_report,
    load_average,
    process_command,
    report_head,
)
from benchmarks.perf_load import PerfAnalyzer
from benchmarks.serving_overhead import perf_medians, perf_parser, perf_run
from tests.server_utils import running_server

SIZES = (64, 224, 512)
PROTOCOLS = ("http", "grpc")
MODES = ("request", "shared_memory")
OUTPUT_BYTES = 10 * 4


def main() -> int:
    args = _parse_args()
    output: Path = args.output or (
        SCRATCH / "shared_memory-quick.json" if args.quick else RESULTS / "shared_memory.json"
    )
    perf = PerfAnalyzer.find(args.perf_venv, judge_stability=not args.quick)
    repository = SCRATCH / "shared_memory" / "repo"
    shutil.rmtree(repository, ignore_errors=True)
    for size in SIZES:
        _export(repository, size)
    settings = {"sizes": list(SIZES), "repeats": args.repeats, "concurrency": args.concurrency}
    report = report_head("shared_memory", settings)
    with running_server(repository, "--allow-client-shm") as server:
        report["server_command"] = process_command(server.pid)
        report["runs"] = [
            {**_run(perf, server, size, protocol, mode, repeat, args), "size": size, "mode": mode}
            for repeat in range(args.repeats)
            for size in SIZES
            for protocol in PROTOCOLS
            for mode in MODES
        ]
    report["load_end"] = load_average()
    report["cases"] = _cases(report["runs"])
    return finish_report(report, output, _plot, _print)


def _parse_args() -> argparse.Namespace:
    parser = perf_parser(__doc__, request_count=1000)
    parser.add_argument("--concurrency", type=int, default=1, help="perf_analyzer's concurrency (default 1)")
    args = parser.parse_args()
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.request_count = args.request_count or (200 if args.quick else 1000)
    return args


def _export(repository: Path, size: int) -> None:
    torch.manual_seed(size)
    module = nn.Sequential(nn.AdaptiveAvgPool2d(8), nn.Flatten(), mlp([3 * 8 * 8, 64, 10]))
    config = ModelConfig.model_validate(
        {
            "name": f"pooled_{size}",
            "max_batch_size": 4,
            "inputs": [{"name": "image", "datatype": "FP32", "shape": [-1, 3, size, size]}],
            "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}],
            "packrat": DEFAULT_SET_ONLY,
        }
    )
    write_model(repository, config, module, (torch.rand(2, 3, size, size),))


def _run(perf: PerfAnalyzer, server: Any, size: int, protocol: str, mode: str, repeat: int, args: Any) -> Any:
    extra: tuple[str, ...] = ()
    if mode == "shared_memory":
        extra = ("--shared-memory", "system", "--output-shared-memory-size", str(OUTPUT_BYTES))
    count = max(100, args.request_count * 64 // size)  # fewer of the large requests: each window about as long
    return perf_run(
        perf,
        server,
        protocol,
        args.concurrency,
        repeat,
        count,
        model=f"pooled_{size}",
        shape=f"image:3,{size},{size}",
        extra=extra,
    )


def _cases(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per size and protocol: the median of each mode over the repeats, and shared memory's ratio to the request."""
    cases: dict[str, Any] = {}
    for size in SIZES:
        for protocol in PROTOCOLS:
            case: dict[str, Any] = {"input_bytes": 3 * size * size * 4}
            for mode in MODES:
                done = [r for r in runs if (r["size"], r["protocol"], r["mode"]) == (size, protocol, mode)]
                keys = ("throughput_rps", "p50_ms", "p99_ms", "server_cores", "perf_analyzer_cores")
                case[mode] = perf_medians(done, keys)
            plain, shared = case["request"], case["shared_memory"]
            if plain["p50_ms"] and shared["p50_ms"]:
                case["p50_speedup"] = plain["p50_ms"] / shared["p50_ms"]
                case["throughput_ratio"] = shared["throughput_rps"] / plain["throughput_rps"]
                case["server_cpu_us_per_request"] = {
                    mode: case[mode]["server_cores"] / case[mode]["throughput_rps"] * 1e6 for mode in MODES
                }
            cases[f"{protocol}_{size}"] = case
    return cases


def _plot(report: dict[str, Any], path: Path) -> None:
    fig = figure(11, 4.5)
    axes = fig.subplots(1, len(PROTOCOLS))
    x = np.arange(len(SIZES))
    for ax, protocol in zip(axes, PROTOCOLS, strict=True):
        for offset, mode, color in ((-0.2, "request", "C0"), (0.2, "shared_memory", "C2")):
            medians = [report["cases"][f"{protocol}_{size}"][mode]["p50_ms"] or 0.0 for size in SIZES]
            ax.bar(x + offset, medians, width=0.4, color=color, label=mode.replace("_", " "))
            for i, size in enumerate(SIZES):
                points = report["cases"][f"{protocol}_{size}"][mode]["p50_ms_all"]
                ax.plot([x[i] + offset] * len(points), points, "k.", markersize=4)
        ax.set_xticks(x, [f"3×{s}×{s}\n{3 * s * s * 4 / 1024:,.0f} KiB" for s in SIZES])
        if any(bar.get_height() > 0 for bar in ax.patches):  # on a busy machine every run may be unmeasured
            ax.set_yscale("log")
        ax.set_ylabel("p50 latency (ms, log; dots: each repeat)")
        ax.set_title(f"{protocol.upper()}, concurrency {report['settings']['concurrency']}")
        ax.legend()
    fig.suptitle(f"Tensors in the request vs in system shared memory — {report['machine']['cpu_model']}")
    fig.savefig(path, dpi=110)


def _print(report: dict[str, Any], output: Path) -> None:
    print("\n| case | request p50 (ms) | shared memory p50 (ms) | p50 × | req/s × | server CPU µs/request |")
    print("|---|---|---|---|---|---|")
    for name, case in report["cases"].items():
        plain, shared = case["request"], case["shared_memory"]
        if "p50_speedup" not in case:
            print(f"| {name} | failed | | | | |")
            continue
        cpu = case["server_cpu_us_per_request"]
        print(
            f"| {name} | {plain['p50_ms']:.3f} | {shared['p50_ms']:.3f} | {case['p50_speedup']:.2f}× | "
            f"{case['throughput_ratio']:.2f}× | {cpu['request']:.0f} → {cpu['shared_memory']:.0f} |"
        )
    print(f"\nload average {report['load_start']} → {report['load_end']}; wrote {output}")


if __name__ == "__main__":
    raise SystemExit(main())
