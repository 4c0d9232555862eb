"""Triton's response cache on adaserve: what a repeated request saves, and what the cache costs when nothing repeats.

One server (`--cache-config local,size=512KiB`: about 950 answers of the example `cnn`) holds the example `cnn`
twice, as `cnn` (no cache) and `cnn_cached` (`response_cache: {enable: true}`), linking one artifact. Triton's C++
perf_analyzer sends batch-1 requests of real Fashion-MNIST test images (`--input-data`, each step one image) to each,
closed loop at concurrency 1 and 8, over HTTP and gRPC. Two workloads, the same requests for both entries:

* `zipf`: 5,000 requests drawn from the 10,000 test images with Zipf popularity (exponent 1.0, seeded; 1,761
  distinct images with seed 0), more than the cache holds, so it evicts and the hit ratio follows what is popular;
* `distinct`: 5,000 different images in turn, each back only after 4,999 others, so every request misses (and,
  once the cache is full, evicts): the cache's own cost, hashing and keeping answers that are never used.

The hit ratio of each run comes from the server's statistics (`cache_hit` and `cache_miss` before and after it).
Every case runs `--repeats` times, interleaved; the cache is warm from the runs before (perf_analyzer's own trials
warm it too): these are steady-state figures.

    benchmarks/perf_analyzer_env.sh                     # once: Triton's perf_analyzer in .venv-perf
    .venv/bin/python -m benchmarks.response_cache       # ~4 minutes; --quick for a smoke run

Writes `benchmarks/results/response_cache.json` and `.png` (with --quick: under `benchmarks/results/tmp/`).
"""

from __future__ import annotations

import argparse
import base64
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.http as httpclient

from adaserve.datasets import load_fashion_mnist
from benchmarks.common import (
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
from tests.server_utils import ServerHandle, link_example, running_server

CACHE_CONFIG = "local,size=512KiB"
ENTRIES = {"cnn": "no cache", "cnn_cached": "response cache"}
WORKLOADS = ("zipf", "distinct")
PROTOCOLS = ("http", "grpc")
CONCURRENCIES = (1, 8)
REQUESTS = 5000
ZIPF_EXPONENT = 1.0


def main() -> int:
    args = _parse_args()
    output: Path = args.output or (
        SCRATCH / "response_cache-quick.json" if args.quick else RESULTS / "response_cache.json"
    )
    perf = PerfAnalyzer.find(args.perf_venv, judge_stability=not args.quick)
    work = SCRATCH / "response_cache"
    shutil.rmtree(work, ignore_errors=True)
    repository = work / "repo"
    link_example(repository, "cnn")
    link_example(repository, "cnn", "cnn_cached", response_cache={"enable": True})
    workloads = _write_workloads(work, seed=args.seed)
    settings = {
        "cache_config": CACHE_CONFIG,
        "requests_per_workload": REQUESTS,
        "zipf_exponent": ZIPF_EXPONENT,
        "seed": args.seed,
        "distinct_images": {name: info["distinct"] for name, info in workloads.items()},
        "repeats": args.repeats,
        "measurement_request_count": args.request_count,
    }
    report = report_head("response_cache", settings)
    with running_server(repository, "--cache-config", CACHE_CONFIG) as server:
        report["server_command"] = process_command(server.pid)
        report["runs"] = [
            _run(perf, server, entry, workload, workloads[workload]["path"], protocol, concurrency, repeat, args)
            for repeat in range(args.repeats)
            for workload in WORKLOADS
            for protocol in PROTOCOLS
            for concurrency in CONCURRENCIES
            for entry in ENTRIES
        ]
    report["load_end"] = load_average()
    report["cases"] = _cases(report["runs"])
    return finish_report(report, output, _plot, _print)


def _parse_args() -> argparse.Namespace:
    parser = perf_parser(__doc__, request_count=2000)
    parser.add_argument("--seed", type=int, default=0, help="seeds the Zipf draw (default 0)")
    args = parser.parse_args()
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.request_count = args.request_count or (500 if args.quick else 2000)
    return args


def _write_workloads(work: Path, *, seed: int) -> dict[str, dict[str, Any]]:
    """perf_analyzer's `--input-data` files: each step one test image (raw FP32, base64), in request order."""
    images, _ = load_fashion_mnist("test")
    rng = np.random.default_rng(seed)
    popularity = 1.0 / np.arange(1, len(images) + 1) ** ZIPF_EXPONENT
    ranked = rng.permutation(len(images))  # which image is the most popular, second, ...: not the file's order
    orders = {
        "zipf": ranked[rng.choice(len(images), size=REQUESTS, p=popularity / popularity.sum())],
        "distinct": rng.permutation(len(images))[:REQUESTS],
    }
    workloads = {}
    for name, order in orders.items():
        steps = [{"image": {"b64": base64.b64encode(images[i].astype(np.float32).tobytes()).decode()}} for i in order]
        path = work / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"data": steps}))
        workloads[name] = {"path": path, "distinct": len(set(order.tolist()))}
    return workloads


def _run(
    perf: PerfAnalyzer,
    server: ServerHandle,
    entry: str,
    workload: str,
    data: Path,
    protocol: str,
    concurrency: int,
    repeat: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    before = _cache_counts(server, entry)
    run = perf_run(
        perf,
        server,
        protocol,
        concurrency,
        repeat,
        args.request_count,
        name=workload,
        model=entry,
        shape="image:1,28,28",
        extra=("--input-data", str(data)),
    )
    hits, misses = (after - start for after, start in zip(_cache_counts(server, entry), before, strict=True))
    run.update(entry=entry, workload=workload, cache_hits=hits, cache_misses=misses)
    run["hit_ratio"] = hits / (hits + misses) if hits + misses else None
    return run


def _cache_counts(server: ServerHandle, model: str) -> tuple[int, int]:
    with httpclient.InferenceServerClient(server.http_url) as client:
        (stats,) = client.get_inference_statistics(model)["model_stats"]
    return stats["inference_stats"]["cache_hit"]["count"], stats["inference_stats"]["cache_miss"]["count"]


def _cases(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per workload, protocol and concurrency: each entry's medians over the repeats, and the cache's ratios."""
    cases: dict[str, Any] = {}
    for workload in WORKLOADS:
        for protocol in PROTOCOLS:
            for concurrency in CONCURRENCIES:
                case: dict[str, Any] = {}
                for entry in ENTRIES:
                    done = [
                        r
                        for r in runs
                        if (r["entry"], r["workload"], r["protocol"], r["concurrency"])
                        == (entry, workload, protocol, concurrency)
                    ]
                    case[entry] = perf_medians(done, ("throughput_rps", "p50_ms", "p99_ms", "server_cores"))
                    case[entry]["hit_ratio_all"] = [r["hit_ratio"] for r in done]
                plain, cached = case["cnn"], case["cnn_cached"]
                if plain["p50_ms"] and cached["p50_ms"]:
                    case["p50_ratio"] = cached["p50_ms"] / plain["p50_ms"]
                    case["throughput_ratio"] = cached["throughput_rps"] / plain["throughput_rps"]
                cases[f"{workload}_{protocol}_c{concurrency}"] = case
    return cases


def _plot(report: dict[str, Any], path: Path) -> None:
    fig = figure(12, 4.5)
    axes = fig.subplots(1, len(WORKLOADS))
    labels = [f"{p.upper()} c{c}" for p in PROTOCOLS for c in CONCURRENCIES]
    x = np.arange(len(labels))
    for ax, workload in zip(axes, WORKLOADS, strict=True):
        names = [f"{workload}_{p}_c{c}" for p in PROTOCOLS for c in CONCURRENCIES]
        for offset, entry, color in ((-0.2, "cnn", "C0"), (0.2, "cnn_cached", "C2")):
            rates = [report["cases"][name][entry]["throughput_rps"] or 0.0 for name in names]
            ax.bar(x + offset, rates, width=0.4, color=color, label=ENTRIES[entry])
            for i, name in enumerate(names):
                points = report["cases"][name][entry]["throughput_rps_all"]
                ax.plot([x[i] + offset] * len(points), points, "k.", markersize=4)
        ratios = [report["cases"][name]["cnn_cached"]["hit_ratio_all"] for name in names]
        hit = [f"hits {np.median([r for r in rs if r is not None]):.0%}" if any(rs) else "hits 0%" for rs in ratios]
        ax.set_xticks(x, [f"{label}\n{h}" for label, h in zip(labels, hit, strict=True)])
        ax.set_ylabel("requests/s (dots: each repeat)")
        ax.set_title(f"{workload}: {report['settings']['distinct_images'][workload]:,} distinct images")
        ax.legend()
    fig.suptitle(f"Response cache ({CACHE_CONFIG}), example cnn, batch 1 — {report['machine']['cpu_model']}")
    fig.savefig(path, dpi=110)


def _print(report: dict[str, Any], output: Path) -> None:
    print("\n| case | hit ratio | no cache: req/s, p50, p99 (ms) | cache: req/s, p50, p99 (ms) | req/s × | p50 × |")
    print("|---|---|---|---|---|---|")
    for name, case in report["cases"].items():
        plain, cached = case["cnn"], case["cnn_cached"]
        if "p50_ratio" not in case:
            print(f"| {name} | failed | | | | |")
            continue
        ratios = [r for r in cached["hit_ratio_all"] if r is not None]
        print(
            f"| {name} | {np.median(ratios) if ratios else 0:.2f} | "
            f"{plain['throughput_rps']:,.0f}, {plain['p50_ms']:.3f}, {plain['p99_ms']:.3f} | "
            f"{cached['throughput_rps']:,.0f}, {cached['p50_ms']:.3f}, {cached['p99_ms']:.3f} | "
            f"{case['throughput_ratio']:.2f}× | {case['p50_ratio']:.2f}× |"
        )
    print(f"\nload average {report['load_start']} → {report['load_end']}; wrote {output}")


if __name__ == "__main__":
    raise SystemExit(main())
