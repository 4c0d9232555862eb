"""Which gRPC server loop costs least per call: the canned gRPC floor (`benchmarks.grpc_floor`) on each of its
server loops, beside the canned REST floor (`benchmarks.rest_floor`), measured alike.

adaserve's gRPC frontend runs on grpc.aio, and a gRPC request costs it about twice what a REST request does
(`benchmarks.latency_profile`). Before a frontend is built on another loop, this measures the floor of each: the
same service, answering `mlp` batch-1 requests with a canned output, no model, no engine, on grpc.aio (`aio`),
grpcio's synchronous server with a pool of threads (`threads`), and that server handing each call to an asyncio loop
and waiting for it (`threads-hop`, what a frontend whose engine lives on an event loop would pay). Triton's C++
perf_analyzer sends batch-1 requests in a closed loop at concurrency 1 and 8, every server and concurrency
interleaved, `--repeats` times; the median is reported. perf_analyzer runs on the first core and the servers on the
others, so a server's threads never compete with the client. Server CPU per call is its process's CPU over the run
(from /proc) over the calls perf_analyzer counted.

    benchmarks/perf_analyzer_env.sh                   # once: Triton's perf_analyzer in .venv-perf
    .venv/bin/python -m benchmarks.grpc_loops         # ~5 minutes; --quick for one short repeat

Writes `benchmarks/results/grpc_loops.json` and `.png` (with --quick: under `benchmarks/results/tmp/`).
"""

from __future__ import annotations

import contextlib
import os
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import RESULTS, SCRATCH, figure, finish_report, load_average, ms_text, pinned, report_head
from benchmarks.grpc_floor import LOOPS
from benchmarks.perf_load import PerfAnalyzer
from benchmarks.serving_overhead import floor_server, perf_medians, perf_parser, perf_run

CONCURRENCIES = (1, 8)
#: What each server's figures are taken over grpc.aio's: req/s, server CPU per call, p50.
RATIOS = ("throughput", "cpu_per_call", "p50")
#: Each server measured: (name, protocol, gRPC server loop); the REST floor is the yardstick.
SERVERS = (("rest", "http", ""), *((f"grpc_{loop}", "grpc", loop) for loop in LOOPS))


def main() -> int:
    parser = perf_parser(__doc__, request_count=3000)
    args = parser.parse_args()
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.request_count = args.request_count or (300 if args.quick else 3000)
    output: Path = args.output or (SCRATCH / "grpc_loops-quick.json" if args.quick else RESULTS / "grpc_loops.json")
    perf = PerfAnalyzer.find(args.perf_venv, judge_stability=not args.quick)
    cores = sorted(os.sched_getaffinity(0))  # perf_analyzer on the first core, the servers on the rest
    layout = {"client": cores[:1], "servers": cores[1:]} if len(cores) > 1 else None
    settings: dict[str, Any] = {"servers": [name for name, _, _ in SERVERS], "repeats": args.repeats}
    settings["cores"] = layout or "unpinned: one core"
    settings["measurement_request_count"] = args.request_count
    report = report_head("grpc_loops", settings)
    with contextlib.ExitStack() as stack:
        with pinned(layout["servers"] if layout else None):
            servers = {
                name: stack.enter_context(floor_server(protocol, loop=loop or "aio"))
                for name, protocol, loop in SERVERS
            }
        with pinned(layout["client"] if layout else None):
            report["runs"] = [
                _run(perf, servers[name], name, protocol, concurrency, repeat, args.request_count)
                for repeat in range(args.repeats)
                for concurrency in CONCURRENCIES
                for name, protocol, _ in SERVERS
            ]
    report["load_end"] = load_average()
    report["cases"] = {
        f"{name}_c{concurrency}": _case(
            [r for r in report["runs"] if r["server"] == name and r["concurrency"] == concurrency]
        )
        for name, _, _ in SERVERS
        for concurrency in CONCURRENCIES
    }
    report["over_aio"] = _over_aio(report["cases"])
    return finish_report(report, output, _plot, _print)


def _run(
    perf: PerfAnalyzer, server: Any, name: str, protocol: str, concurrency: int, repeat: int, count: int
) -> dict[str, Any]:
    """One perf_analyzer run, and the server's CPU per call in it."""
    run = perf_run(perf, server, protocol, concurrency, repeat, count, name=name)
    if run.get("throughput_rps"):
        run["cpu_us_per_call"] = run["server_cores"] / run["throughput_rps"] * 1e6
    return run


def _case(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One server at one concurrency: the medians of its repeats, and of its CPU per call."""
    case = perf_medians(runs)
    cpu = [r["cpu_us_per_call"] for r in runs if "cpu_us_per_call" in r]
    case["cpu_us_per_call"] = statistics.median(cpu) if cpu else None
    case["cpu_us_per_call_all"] = cpu
    return case


def _over_aio(cases: dict[str, Any]) -> dict[str, Any]:
    """Each other server's req/s and CPU per call over grpc.aio's, at each concurrency."""
    ratios: dict[str, Any] = {}
    for name, _, _ in SERVERS:
        for concurrency in CONCURRENCIES:
            mine, aio = cases[f"{name}_c{concurrency}"], cases[f"grpc_aio_c{concurrency}"]
            if name == "grpc_aio" or not (mine["throughput_rps"] and aio["throughput_rps"]):
                continue
            ratios[f"{name}_c{concurrency}"] = {
                "throughput": mine["throughput_rps"] / aio["throughput_rps"],
                "cpu_per_call": mine["cpu_us_per_call"] / aio["cpu_us_per_call"],
                "p50": mine["p50_ms"] / aio["p50_ms"],
            }
    return ratios


def _plot(report: dict[str, Any], path: Path) -> None:
    names = [name for name, _, _ in SERVERS]
    x = np.arange(len(names))
    fig = figure(12, 4.5)
    cpu, rate = fig.subplots(1, 2)
    for offset, concurrency in ((-0.2, 1), (0.2, 8)):
        cases = [report["cases"][f"{name}_c{concurrency}"] for name in names]
        cpu.bar(x + offset, [c["cpu_us_per_call"] or 0.0 for c in cases], width=0.4, label=f"c={concurrency}")
        rate.bar(x + offset, [c["throughput_rps"] or 0.0 for c in cases], width=0.4, label=f"c={concurrency}")
        for i, case in enumerate(cases):
            cpu.plot([x[i] + offset] * len(case["cpu_us_per_call_all"]), case["cpu_us_per_call_all"], "k.", ms=3)
            rate.plot([x[i] + offset] * len(case["throughput_rps_all"]), case["throughput_rps_all"], "k.", ms=3)
    for axes, label in ((cpu, "server CPU per call (µs)"), (rate, "calls per second")):
        axes.set_xticks(x, names)
        axes.set_ylabel(f"{label}; dots: each repeat")
        axes.legend(fontsize="small")
    machine = report["machine"]
    fig.suptitle(f"Canned floors by server loop — {machine['cpu_model']}, {machine['cores']} cores")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _print(report: dict[str, Any], output: Path) -> None:
    print("| server | c | p50 ms | calls/s | server CPU µs/call | over grpc.aio: calls/s, CPU/call, p50 |")
    print("|---|---|---|---|---|---|")
    for name, _, _ in SERVERS:
        for concurrency in CONCURRENCIES:
            key = f"{name}_c{concurrency}"
            case, ratio = report["cases"][key], report["over_aio"].get(key)
            over = "-" if ratio is None else ", ".join(f"{ratio[k]:.2f}×" for k in RATIOS)
            print(
                f"| {name} | {concurrency} | {ms_text(case['p50_ms'])} | {case['throughput_rps'] or 0:,.0f} | "
                f"{case['cpu_us_per_call'] or 0:.0f} | {over} |"
            )
    print(f"\nmedians of {report['settings']['repeats']} repeats; load average {report['load_start']} → "
          f"{report['load_end']}; wrote {output}")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
