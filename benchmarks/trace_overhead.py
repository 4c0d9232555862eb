"""Tracing's cost, and where a request's time goes: Triton's trace extension on the serving-overhead model.

The example `mlp` (784-256-256-10, FP32) takes batch-1 requests from Triton's C++ perf_analyzer (closed loop,
concurrency 1 and 8, HTTP and gRPC) on one server started with a trace file, with tracing off, with every request's
timestamps traced (TIMESTAMPS, rate 1) and with its tensors too (TIMESTAMPS and TENSORS, rate 1), set through the
trace API before each run; `log_frequency` 1000, so traces go to disk a thousand at a time. Every case runs
`--repeats` times, interleaved; the median is reported beside each repeat.

A second server in OpenTelemetry mode (`--trace-config mode=opentelemetry`) exports to a collector in this process
that only counts what it receives, with tracing off and with every request's timestamps (rate 1), the same way.

The traces themselves then say where the time of a request went inside the server: each traced request is matched
to its run by its first timestamp (perf_analyzer's runs and the server share this machine's CLOCK_MONOTONIC), and
for each protocol at each concurrency (timestamps only) the median of each span is reported: receive, decode (to
REQUEST_START), admission (to QUEUE_START), queue (into the input pool, scheduled, handed to a worker process and
begun there), compute (the worker's), answer (the worker's message back, outputs read, the response built: to
REQUEST_END), encode, send.

    benchmarks/perf_analyzer_env.sh                     # once: Triton's perf_analyzer in .venv-perf
    .venv/bin/python -m benchmarks.trace_overhead       # ~4 minutes; --quick for a smoke run

Writes `benchmarks/results/trace_overhead.json` and `.png` (with --quick: under `benchmarks/results/tmp/`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from adaserve.server.trace_summary import FRONTENDS, SPANS, TracedRequest, read_traces, summarize
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
from benchmarks.serving_overhead import MODEL, perf_medians, perf_parser, perf_run
from tests.server_utils import ServerHandle, link_example, otlp_receiver, running_server

PROTOCOLS = ("http", "grpc")
CONCURRENCIES = (1, 8)
#: Trace settings of each case, as the trace API takes them.
CASES = {
    "off": {"trace_level": ["OFF"]},
    "timestamps": {"trace_level": ["TIMESTAMPS"], "trace_rate": "1"},
    "timestamps_tensors": {"trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": "1"},
}
#: The same on a second server in OpenTelemetry mode, exporting to a collector in this process that counts spans.
OTEL_CASES = {
    "off (OpenTelemetry server)": {"trace_level": ["OFF"]},
    "opentelemetry": {"trace_level": ["TIMESTAMPS"], "trace_rate": "1"},
}
LOG_FREQUENCY = 1000


def main() -> int:
    args = _parse_args()
    output: Path = args.output or (
        SCRATCH / "trace_overhead-quick.json" if args.quick else RESULTS / "trace_overhead.json"
    )
    perf = PerfAnalyzer.find(args.perf_venv, judge_stability=not args.quick)
    work = SCRATCH / "trace_overhead"
    shutil.rmtree(work, ignore_errors=True)
    link_example(work / "repo", MODEL)
    trace_file = work / "trace.json"
    settings = {"model": MODEL, "repeats": args.repeats, "measurement_request_count": args.request_count}
    report = report_head("trace_overhead", settings)
    config = [f"--trace-config=triton,file={trace_file}", f"--trace-config=triton,log-frequency={LOG_FREQUENCY}"]
    with running_server(work / "repo", *config) as server:
        report["server_command"] = process_command(server.pid)
        report["runs"] = _runs(perf, server, CASES, args)
    with otlp_receiver(keep=False) as collector:
        otel = [f"--trace-config={c}" for c in ("mode=opentelemetry", f"opentelemetry,url={collector.url}")]
        with running_server(work / "repo", *otel) as server:
            report["otel_server_command"] = process_command(server.pid)
            report["otel_runs"] = _runs(perf, server, OTEL_CASES, args)
        report["otel_exports"] = collector.exports
    report["load_end"] = load_average()
    report["cases"] = _cases(report["runs"], CASES)
    for name, entry in _cases(report["otel_runs"], OTEL_CASES).items():
        report["cases"][name].update(entry)
    report["spans"] = _spans(report["runs"], read_traces([trace_file, *work.glob("trace.json.*")]))
    return finish_report(report, output, _plot, _print)


def _parse_args() -> argparse.Namespace:
    args = perf_parser(__doc__, request_count=3000).parse_args()
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.request_count = args.request_count or (500 if args.quick else 3000)
    return args


def _runs(
    perf: PerfAnalyzer, server: ServerHandle, cases: dict[str, dict[str, Any]], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Every case (trace settings set through the API) at every protocol and concurrency, the repeats interleaved."""
    return [
        _run(perf, server, case, settings, protocol, concurrency, repeat, args.request_count)
        for repeat in range(args.repeats)
        for case, settings in cases.items()
        for protocol in PROTOCOLS
        for concurrency in CONCURRENCIES
    ]


def _run(
    perf: PerfAnalyzer,
    server: ServerHandle,
    case: str,
    settings: dict[str, Any],
    protocol: str,
    concurrency: int,
    repeat: int,
    count: int,
) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/trace/setting", data=json.dumps(settings).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        in_force = json.loads(answer.read())
    began_ns = time.perf_counter_ns()
    run = perf_run(perf, server, protocol, concurrency, repeat, count)
    return {**run, "case": case, "trace_settings": in_force, "began_ns": began_ns, "ended_ns": time.perf_counter_ns()}


def _cases(runs: list[dict[str, Any]], names: dict[str, Any]) -> dict[str, Any]:
    """Per protocol and concurrency: each case's median over the repeats, and its ratio to tracing off on the same
    server (the first case)."""
    cases: dict[str, Any] = {}
    for protocol in PROTOCOLS:
        for concurrency in CONCURRENCIES:
            entry: dict[str, Any] = {}
            for case in names:
                wanted = (case, protocol, concurrency)
                entry[case] = perf_medians([r for r in runs if (r["case"], r["protocol"], r["concurrency"]) == wanted])
            off = entry[next(iter(names))]
            for case in names:
                if off["p50_ms"] and entry[case]["p50_ms"]:
                    entry[case]["p50_added_us"] = (entry[case]["p50_ms"] - off["p50_ms"]) * 1000
                    entry[case]["throughput_ratio"] = entry[case]["throughput_rps"] / off["throughput_rps"]
            cases[f"{protocol}_c{concurrency}"] = entry
    return cases


def _spans(runs: list[dict[str, Any]], traces: list[TracedRequest]) -> dict[str, Any]:
    """Per protocol and concurrency, over the runs tracing timestamps only (formatting tensors would lengthen the
    spans it happens in): how many requests were traced, and each span's median, 90th percentile and mean in µs
    (`adaserve trace summary`'s figures for those requests)."""
    spans: dict[str, Any] = {}
    for protocol in PROTOCOLS:
        first = FRONTENDS[protocol.upper()][0][0]
        for concurrency in CONCURRENCIES:
            windows = [
                (r["began_ns"], r["ended_ns"])
                for r in runs
                if (r["case"], r["protocol"], r["concurrency"]) == ("timestamps", protocol, concurrency)
            ]
            mine = [t for t in traces if any(a <= t.timestamps.get(first, -1) <= b for a, b in windows)]
            (group,) = summarize(mine).values()
            spans[f"{protocol}_c{concurrency}"] = {"traced_requests": group["traces"], **group["spans"]}
    return spans


def _plot(report: dict[str, Any], path: Path) -> None:
    fig = figure(13, 4.8)
    left, right = fig.subplots(1, 2)
    names = list(report["cases"])
    x = np.arange(len(names))
    every = [*CASES, *OTEL_CASES]
    width = 0.8 / len(every)
    for index, case in enumerate(every):
        offset = (index - (len(every) - 1) / 2) * width
        medians = [report["cases"][n][case]["p50_ms"] or 0.0 for n in names]
        left.bar(x + offset, medians, width=width, label=case.replace("_", " + "))
        for i, name in enumerate(names):
            points = report["cases"][name][case]["p50_ms_all"]
            left.plot([x[i] + offset] * len(points), points, "k.", markersize=3)
    left.set_xticks(x, names)
    left.set_ylabel("p50 latency (ms; dots: each repeat)")
    left.set_title("perf_analyzer p50, tracing off / on at every request")
    left.legend()
    bottom = np.zeros(len(names))
    for span in SPANS:
        values = np.array([(report["spans"][n][span] or {}).get("p50_us", 0.0) for n in names])
        right.bar(x, values, bottom=bottom, label=span)
        bottom += values
    right.set_xticks(x, names)
    right.set_ylabel("µs (median of each span, stacked)")
    right.set_title("Inside the server, from the traces")
    right.legend(fontsize=8)
    fig.suptitle(f"Triton's trace extension on the MLP — {report['machine']['cpu_model']}")
    fig.savefig(path, dpi=110)


def _print(report: dict[str, Any], output: Path) -> None:
    every = [*CASES, *OTEL_CASES]
    print("\n| case | " + " | ".join(f"{c}: p50 ms / req/s" for c in every) + " |")
    print("|---|" + "---|" * len(every))
    for name, entry in report["cases"].items():
        cells = [
            f"{entry[c]['p50_ms']:.3f} / {entry[c]['throughput_rps']:,.0f}" if entry[c]["p50_ms"] else "failed"
            for c in every
        ]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("\n| spans (p50 µs) | traced | " + " | ".join(SPANS) + " |")
    print("|---|---|" + "---|" * len(SPANS))
    for name, entry in report["spans"].items():
        cells = [f"{entry[s]['p50_us']:.0f}" if entry[s] else "–" for s in SPANS]
        print(f"| {name} | {entry['traced_requests']} | " + " | ".join(cells) + " |")
    print(f"\nload average {report['load_start']} → {report['load_end']}; wrote {output}")


if __name__ == "__main__":
    raise SystemExit(main())
