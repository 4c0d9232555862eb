"""Serving overhead: what REST and gRPC cost on top of the model, against the model called in-process.

The example `mlp` (784-256-256-10, FP32) takes batch-1 requests from Triton's C++ perf_analyzer (closed loop,
concurrency 1 and 8, HTTP, gRPC and gRPC streaming); the same artifact called in this process with one thread is the
limit. Every case runs `--repeats` times, interleaved, and the median is reported beside each repeat. The server runs
with the example's own config; nothing is tuned here.

The limit is measured twice: calls back to back (the CPU stays busy and its caches warm), and calls with 1 ms of
sleep between them, the pace at which a worker gets requests at concurrency 1. On this VM a call after an idle gap
costs several times a hot one, and the worker's own compute time at concurrency 1 (perf_analyzer's "Server Compute
Infer", reported per case) is to be read against the paced figure.

Beside adaserve, `benchmarks.grpc_floor` (the same gRPC service on grpc.aio, answering with a canned output, no
model) takes the same gRPC concurrency-1 runs: the part of a gRPC request's latency that is grpcio's own.

    benchmarks/perf_analyzer_env.sh                     # once: Triton's perf_analyzer in .venv-perf
    .venv/bin/python -m benchmarks.serving_overhead     # ~3 minutes; --quick for a ~1 minute smoke run

Writes `benchmarks/results/serving_overhead.json` and `.png` (with --quick: under `benchmarks/results/tmp/`).
"""

from __future__ import annotations

import argparse
import csv
import math
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import (
    RESULTS,
    ROOT,
    SCRATCH,
    figure,
    finish_report,
    load_average,
    load_window,
    process_command,
    report_head,
    tree_cpu_s,
    wait_for_quiet,
)
from benchmarks.perf_load import PerfAnalyzer
from tests.server_utils import (
    EXAMPLES,
    ServerHandle,
    free_port,
    link_example,
    running_server,
    stop_server,
    wait_until_ready,
)

MODEL = "mlp"
PROTOCOLS = ("http", "grpc", "grpc_stream")  # grpc_stream: ModelStreamInfer, perf_analyzer's --streaming
CONCURRENCIES = (1, 8)
#: Sleep between the paced in-process calls: about the gap a worker sees between requests at concurrency 1.
IDLE_GAP_S = 0.001
#: The longest wait for a quiet second before each perf_analyzer run (the wait and the reading are recorded).
QUIET_WAIT_S = 10.0
#: The issue's bars on the 2-core machine.
BAR_REST_C8_RPS = 2000.0
BAR_C1_P50_MS = 0.6


def main() -> int:
    args = _parse_args()
    output: Path = args.output or (
        SCRATCH / "serving_overhead-quick.json" if args.quick else RESULTS / "serving_overhead.json"
    )
    perf = PerfAnalyzer.find(args.perf_venv, judge_stability=not args.quick)
    settings = {
        "model": MODEL,
        "artifact": str((EXAMPLES / MODEL / "1" / "model.pt2").relative_to(ROOT)),
        "repeats": args.repeats,
        "measurement_request_count": args.request_count,
        "in_process_iterations": args.iterations,
    }
    report = report_head("serving_overhead", settings)
    report["in_process"] = [_in_process(args.iterations)]
    report["in_process_idle_gaps"] = _in_process(args.iterations // 5, idle_s=IDLE_GAP_S)
    repository = SCRATCH / "serving_overhead" / "repo"
    shutil.rmtree(repository, ignore_errors=True)
    link_example(repository, MODEL)
    with running_server(repository) as server:
        report["server_command"] = process_command(server.pid)
        report["server_config"] = (repository / MODEL / "config.yaml").read_text()
        report["runs"] = [
            perf_run(perf, server, protocol, concurrency, repeat, args.request_count)
            for repeat in range(args.repeats)
            for protocol in PROTOCOLS
            for concurrency in CONCURRENCIES
        ]
    with floor_server() as floor:
        report["floor_command"] = process_command(floor.pid)
        report["floor_runs"] = [
            perf_run(perf, floor, "grpc", 1, repeat, args.request_count, name="floor") for repeat in range(args.repeats)
        ]
    report["in_process"].append(_in_process(args.iterations))
    report["load_end"] = load_average()
    _summarize(report)
    return finish_report(report, output, _plot, _print)


def perf_parser(description: str | None, request_count: int) -> argparse.ArgumentParser:
    """The options every benchmark made of interleaved perf_analyzer runs takes."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick", action="store_true", help="one repeat, short windows, any spread between them (a smoke run)"
    )
    parser.add_argument("--repeats", type=int, help="runs of each case, interleaved (default 3; --quick 1)")
    parser.add_argument(
        "--request-count", type=int, help=f"perf_analyzer requests per window (default {request_count})"
    )
    parser.add_argument("--perf-venv", type=Path, default=ROOT / ".venv-perf", help="venv holding perf_analyzer")
    parser.add_argument("--output", type=Path, help="result JSON (the PNG goes beside it)")
    return parser


def _parse_args() -> argparse.Namespace:
    parser = perf_parser(__doc__, request_count=3000)
    parser.add_argument("--iterations", type=int, help="in-process calls per measurement (default 20000)")
    args = parser.parse_args()
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.request_count = args.request_count or (1000 if args.quick else 3000)
    args.iterations = args.iterations or (5000 if args.quick else 20000)
    return args


def _in_process(iterations: int, idle_s: float = 0.0) -> dict[str, Any]:
    """The artifact loaded as the server's worker loads it, batch 1, one thread, numpy in and out; with `idle_s`,
    a sleep before each call (not timed)."""
    import torch

    from adaserve.repository import load_artifact

    torch.set_num_threads(1)
    module = load_artifact(EXAMPLES / MODEL / "1" / "model.pt2", max_batch_size=16)
    row = np.random.default_rng(0).standard_normal((1, 784), dtype=np.float32)
    latencies = np.empty(iterations, dtype=np.int64)
    record: dict[str, Any] = {
        "threads": 1,
        "iterations": iterations,
        "idle_between_calls_s": idle_s,
        "quiet": wait_for_quiet(10.0),
    }
    with load_window(record), torch.inference_mode():
        for _ in range(min(1000, iterations)):
            module(torch.from_numpy(row)).numpy()
        began = time.perf_counter_ns()
        for i in range(iterations):
            if idle_s:
                time.sleep(idle_s)
            start = time.perf_counter_ns()
            module(torch.from_numpy(row)).numpy()
            latencies[i] = time.perf_counter_ns() - start
        elapsed_s = (time.perf_counter_ns() - began) / 1e9 - iterations * idle_s
    p50, p90, p99 = (float(x) / 1e6 for x in np.percentile(latencies, (50, 90, 99)))
    record.update(throughput_rps=iterations / elapsed_s, p50_ms=p50, p90_ms=p90, p99_ms=p99)
    return record


@contextmanager
def floor_server(protocol: str = "grpc", ready_timeout_s: float = 60.0, loop: str = "aio") -> Iterator[ServerHandle]:
    """`benchmarks.grpc_floor` on server loop `loop` (or, for "http", `benchmarks.rest_floor`) on a free loopback port
    until it answers; stopped by its PID after."""
    port = free_port()
    log = SCRATCH / "serving_overhead" / f"{protocol}-floor-{port}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "benchmarks.rest_floor", "--port", str(port)]
    if protocol != "http":
        command = [sys.executable, "-m", "benchmarks.grpc_floor", "--port", str(port), "--loop", loop]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    address = f"127.0.0.1:{port}"
    handle = ServerHandle(address, address, process.pid, log)
    try:
        wait_until_ready(handle, process, ready_timeout_s, lambda: _floor_ready(protocol, address))
        yield handle
    finally:
        stop_server(process)


def _floor_ready(protocol: str, address: str) -> bool:
    import urllib.request

    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    if protocol == "http":
        try:
            with urllib.request.urlopen(f"http://{address}/v2/health/ready", timeout=1.0) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False
    with grpc.insecure_channel(address) as channel:
        try:
            live = service_pb2_grpc.GRPCInferenceServiceStub(channel).ServerLive
            return bool(live(service_pb2.ServerLiveRequest(), timeout=1.0).live)
        except grpc.RpcError:
            return False


def perf_run(
    perf: PerfAnalyzer,
    server: ServerHandle,
    protocol: str,
    concurrency: int,
    repeat: int,
    count: int,
    name: str = "adaserve",
    *,
    model: str = MODEL,
    shape: str | None = "image:784",
    extra: tuple[str, ...] = (),
    rate: float | None = None,
    quiet_wait_s: float | None = None,
) -> dict[str, Any]:
    """One perf_analyzer run of batch-1 requests (`shape`: the input's, None to send none; `extra`: more of its
    arguments); its CSV row, its own and the server's CPU over the run, the load average around it. A closed loop
    of `concurrency` requests, or with `rate` an open loop of Poisson arrivals at that many requests per second
    (each of its windows is judged stable, as the arrivals, not the server, set its pace). It first waits for a
    quiet machine, up to `quiet_wait_s` (by default QUIET_WAIT_S, none for a smoke run; 0 for runs started together
    after one wait)."""
    flags = (Path(a).name if "/" in a else a.lstrip("-") for a in extra)  # a file's name, not its path
    load = f"c{concurrency}" if rate is None else f"poisson{rate:g}"
    label = "-".join([name, model, protocol, load, *flags, f"r{repeat}"])
    csv_path = SCRATCH / "serving_overhead" / f"{label}.csv"
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    csv_path.unlink(missing_ok=True)
    url = server.http_url if protocol == "http" else server.grpc_url
    wire = ["-i", "grpc", "--streaming"] if protocol == "grpc_stream" else ["-i", protocol]
    spread = ["--stability-percentage", "25", "--max-trials", "10"] if perf.judge_stability else ["-s", "1000"]
    offered = (
        ["--concurrency-range", str(concurrency), *spread]
        if rate is None
        else ["--request-rate-range", f"{rate:g}", "--request-distribution", "poisson",
              "--max-threads", str(open_loop_threads(rate)), "--stability-percentage", "1000", "--max-trials", "6"]
    )  # fmt: skip
    arguments = [
        "-m", model, "-u", url, *wire, *offered, *(("--shape", shape) if shape else ()), "-b", "1",
        "--measurement-mode", "count_windows", "--measurement-request-count", str(count),
        "--percentile", "50", "-f", str(csv_path), "--verbose-csv", *extra,
    ]  # fmt: skip
    run: dict[str, Any] = {"server": name, "protocol": protocol, "concurrency": concurrency, "repeat": repeat}
    if rate is not None:
        run["offered_rps"] = rate
    run["command"] = perf.shell_text(arguments)
    if quiet_wait_s is None:
        quiet_wait_s = QUIET_WAIT_S if perf.judge_stability else 0.0  # a smoke run does not wait
    run["quiet"] = wait_for_quiet(quiet_wait_s)
    server_cpu = tree_cpu_s(server.pid)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    with load_window(run):
        try:
            command = [str(perf.binary), *arguments]
            done = subprocess.run(command, env=perf.env, capture_output=True, text=True, timeout=300)
            run["returncode"], run["stdout_tail"] = done.returncode, (done.stdout + done.stderr)[-1500:]
        except subprocess.TimeoutExpired:
            run["returncode"], run["stdout_tail"] = None, "timed out after 300 s"
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    run["perf_analyzer_cores"] = (after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime) / run[
        "wall_s"
    ]
    run["server_cores"] = (tree_cpu_s(server.pid) - server_cpu) / run["wall_s"]
    run["other_cores"] = run["machine_busy_cores"] - run["server_cores"] - run["perf_analyzer_cores"]
    row = _csv_row(csv_path) if run["returncode"] == 0 else None
    if row:
        run["csv"] = row
        run.update(
            throughput_rps=row["Inferences/Second"],
            p50_ms=row["p50 latency"] / 1000,
            p90_ms=row["p90 latency"] / 1000,
            p99_ms=row["p99 latency"] / 1000,
            server_compute_ms=row["Server Compute Infer"] / 1000 if "Server Compute Infer" in row else None,
        )
    print(
        f"{label}: "
        + (f"{run['throughput_rps']:.0f}/s p50 {run['p50_ms']:.3f} ms" if row else f"FAILED rc={run['returncode']}")
        + f"  others {run['other_cores']:.2f} cores, load {run['load_before'][0]}→{run['load_after'][0]}",
        flush=True,
    )
    return run


def open_loop_threads(rate: float) -> int:
    """perf_analyzer's sending threads for an open loop at `rate` req/s: each has one request in flight over its own
    connection, so enough for 10 ms of arrivals, and at least its default 4 (more threads at low load spread the
    requests over more connections than a client at that rate would open)."""
    return max(4, math.ceil(rate * 0.010))


def perf_medians(
    runs: list[dict[str, Any]], keys: tuple[str, ...] = ("throughput_rps", "p50_ms", "p99_ms", "server_cores")
) -> dict[str, Any]:
    """One case's figures over its repeats: the median of each of `keys` (None when every run failed), and every
    repeat's p50 and req/s beside them."""
    done = [r for r in runs if "throughput_rps" in r]
    medians: dict[str, Any] = {key: statistics.median([r[key] for r in done]) if done else None for key in keys}
    medians["p50_ms_all"] = [r["p50_ms"] for r in done]
    medians["throughput_rps_all"] = [r["throughput_rps"] for r in done]
    return medians


def paired_case(runs: list[dict[str, Any]], servers: tuple[str, str]) -> dict[str, Any]:
    """One case's runs of two servers side by side: each one's medians, and the second's req/s and p50 over the
    first's."""
    case: dict[str, Any] = {name: perf_medians([r for r in runs if r["server"] == name]) for name in servers}
    first, second = case[servers[0]], case[servers[1]]
    if first["p50_ms"] and second["p50_ms"]:
        case["throughput_ratio"] = second["throughput_rps"] / first["throughput_rps"]
        case["p50_ratio"] = second["p50_ms"] / first["p50_ms"]
    return case


def paired_cases(
    runs: list[dict[str, Any]], servers: tuple[str, str], concurrencies: tuple[int, ...]
) -> dict[str, Any]:
    """`paired_case` for each concurrency of `runs`, keyed "c1", "c8", ..."""
    return {f"c{c}": paired_case([r for r in runs if r["concurrency"] == c], servers) for c in concurrencies}


def paired_plot(
    report: dict[str, Any],
    path: Path,
    servers: tuple[str, str],
    title: str,
    *,
    tick: Callable[[str], str] = str,
    log_p50: bool = False,
) -> None:
    """Two servers' p50 and req/s bars per case of `report["cases"]` (from `paired_case`), each repeat a dot."""
    fig = figure(11, 4.5)
    left, right = fig.subplots(1, 2)
    names = list(report["cases"])
    x = np.arange(len(names))
    for offset, server in zip((-0.2, 0.2), servers, strict=True):
        for ax, key, label in ((left, "p50_ms", "p50 latency (ms)"), (right, "throughput_rps", "req/s")):
            values = [report["cases"][n][server][key] or 0.0 for n in names]
            ax.bar(x + offset, values, width=0.4, label=server)
            for i, name in enumerate(names):
                points = report["cases"][name][server][f"{key}_all"]
                ax.plot([x[i] + offset] * len(points), points, "k.", markersize=3)
            ax.set_xticks(x, [tick(name) for name in names])
            ax.set_ylabel(f"{label}; dots: each repeat")
    if log_p50:
        left.set_yscale("log")
    left.set_title("perf_analyzer p50")
    right.set_title("throughput")
    left.legend()
    fig.suptitle(f"{title} — {report['machine']['cpu_model']}")
    fig.savefig(path, dpi=110)


def paired_table(report: dict[str, Any], servers: tuple[str, str], labels: tuple[str, str]) -> None:
    """Print two servers' p50, p99, req/s and cores per case of `report["cases"]` (from `paired_case`), and the
    second's ratios over the first's."""
    print(f"\n| case | {labels[0]}: p50 / p99 ms, req/s, server cores | {labels[1]}: same | req/s × | p50 × |")
    print("|---|---|---|---|---|")
    for name, case in report["cases"].items():
        cells = [
            f"{case[s]['p50_ms']:.3f} / {case[s]['p99_ms']:.3f}, {case[s]['throughput_rps']:,.0f}, "
            f"{case[s]['server_cores']:.2f}"
            if case[s]["p50_ms"]
            else "failed"
            for s in servers
        ]
        ratios = (
            f"{case['throughput_ratio']:.2f}× | {case['p50_ratio']:.2f}×" if "throughput_ratio" in case else "- | -"
        )
        print(f"| {name} | {' | '.join(cells)} | {ratios} |")


def _csv_row(path: Path) -> dict[str, float] | None:
    if not path.is_file():
        return None
    with path.open(newline="") as stream:
        rows = list(csv.DictReader(stream))
    return {key: float(value) for key, value in rows[0].items() if value not in ("", None)} if rows else None


def _summarize(report: dict[str, Any]) -> None:
    """Median per case over the repeats, the server/in-process ratios, and the bars."""
    limit = min(report["in_process"], key=lambda r: r["p50_ms"])
    cases = {
        f"{protocol}_c{concurrency}": _case(
            [r for r in report["runs"] if r["protocol"] == protocol and r["concurrency"] == concurrency], limit
        )
        for protocol in PROTOCOLS
        for concurrency in CONCURRENCIES
    }
    report["in_process_limit"] = {k: limit[k] for k in ("throughput_rps", "p50_ms", "p90_ms", "p99_ms")}
    report["cases"] = cases
    report["grpc_floor_c1"] = _case(report["floor_runs"], limit)
    rest8, rest1, grpc1 = cases["http_c8"]["throughput_rps"], cases["http_c1"]["p50_ms"], cases["grpc_c1"]["p50_ms"]
    report["bars"] = {
        "rest_c8_throughput": _bar(
            rest8, f">= {BAR_REST_C8_RPS:.0f} req/s", rest8 is not None and rest8 >= BAR_REST_C8_RPS
        ),
        "rest_c1_p50": _bar(rest1, f"<= {BAR_C1_P50_MS} ms", rest1 is not None and rest1 <= BAR_C1_P50_MS),
        "grpc_c1_p50": _bar(grpc1, f"<= {BAR_C1_P50_MS} ms", grpc1 is not None and grpc1 <= BAR_C1_P50_MS),
    }


def _case(runs: list[dict[str, Any]], limit: dict[str, Any]) -> dict[str, Any]:
    """The median of each figure over the runs that produced one, and the ratios to the in-process limit."""
    runs = [r for r in runs if "throughput_rps" in r]
    case: dict[str, Any] = {"repeats_ok": len(runs)}
    for figure_name in (
        "throughput_rps",
        "p50_ms",
        "p90_ms",
        "p99_ms",
        "server_compute_ms",
        "server_cores",
        "perf_analyzer_cores",
        "other_cores",
    ):
        values = [r[figure_name] for r in runs if r.get(figure_name) is not None]  # the floor has no statistics
        case[figure_name] = statistics.median(values) if values else None
        case[f"{figure_name}_all"] = values
    if runs:
        case["server_cpu_us_per_request"] = case["server_cores"] / case["throughput_rps"] * 1e6
        case["throughput_vs_in_process"] = case["throughput_rps"] / limit["throughput_rps"]
        case["p50_vs_in_process"] = case["p50_ms"] / limit["p50_ms"]
        case["p50_overhead_ms"] = case["p50_ms"] - limit["p50_ms"]
    return case


def _bar(measured: float | None, target: str, passed: bool) -> dict[str, Any]:
    return {"measured": measured, "target": target, "pass": passed, "on": "median of the repeats"}


def _plot(report: dict[str, Any], path: Path) -> None:
    cases, limit = report["cases"], report["in_process_limit"]
    names = list(cases)
    fig = figure(11, 4.5)
    left, right = fig.subplots(1, 2)
    x = np.arange(len(names))
    for ax, key, scale, unit in ((left, "throughput_rps", 1.0, "req/s"), (right, "p50_ms", 1.0, "ms")):
        medians = [(cases[n][key] or 0.0) * scale for n in names]
        ax.bar(x, medians, color=["C0" if n.startswith("http") else "C1" for n in names], alpha=0.8)
        for i, name in enumerate(names):
            values = cases[name][f"{key}_all"]
            ax.plot([i] * len(values), values, "k.", markersize=5)
            ax.annotate(f"{medians[i]:.0f}" if key == "throughput_rps" else f"{medians[i]:.2f}", (i, medians[i]),
                        ha="center", va="bottom", fontsize=8)  # fmt: skip
        ax.axhline(limit[key], color="C2", linestyle="--", label=f"in-process limit {limit[key]:.3g} {unit}")
        labels = [n.replace("_c", " c=").replace("_stream", "\nstream").replace("http", "REST") for n in names]
        ax.set_xticks(x, [label.replace("grpc", "gRPC") for label in labels], fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    left.axhline(BAR_REST_C8_RPS, color="C3", linestyle=":", label=f"bar: REST c=8 ≥ {BAR_REST_C8_RPS:.0f}/s")
    right.axhline(BAR_C1_P50_MS, color="C3", linestyle=":", label=f"bar: c=1 p50 ≤ {BAR_C1_P50_MS} ms")
    floor = report["grpc_floor_c1"]["p50_ms"]
    if floor is not None:
        right.axhline(floor, color="C1", linestyle="-.", label=f"grpc.aio alone, canned answer, c=1: {floor:.3f} ms")
    right.set_yscale("log")
    left.set_ylabel("throughput (req/s, median; dots: repeats)")
    right.set_ylabel("p50 latency (ms, log)")
    left.set_title("Throughput, batch 1, mlp")
    right.set_title("p50 latency, batch 1, mlp")
    for ax in (left, right):
        ax.legend(fontsize="small", loc="best")
    fig.suptitle(f"{report['machine']['cpu_model']}, {report['machine']['cores']} cores — perf_analyzer closed loop")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _print(report: dict[str, Any], output: Path) -> None:
    limit = report["in_process_limit"]
    paced = report["in_process_idle_gaps"]
    print(f"in-process limit: {limit['throughput_rps']:.0f}/s, p50 {limit['p50_ms']:.3f} ms")
    print(f"in-process, {IDLE_GAP_S * 1e3:g} ms idle before each call: p50 {paced['p50_ms']:.3f} ms")
    for name, case in report["cases"].items():
        if case["throughput_rps"] is not None:
            print(
                f"{name:8s} {case['throughput_rps']:7.0f}/s  p50 {case['p50_ms']:.3f}  p99 {case['p99_ms']:.3f} ms  "
                f"worker compute (mean) {case['server_compute_ms']:.3f} ms  "
                f"({case['throughput_vs_in_process']:.2f}× in-process throughput, "
                f"server {case['server_cores']:.2f} cores = {case['server_cpu_us_per_request']:.0f} µs CPU/request, "
                f"perf_analyzer {case['perf_analyzer_cores']:.2f} cores)"
            )
    floor = report["grpc_floor_c1"]
    if floor["throughput_rps"] is not None:
        print(
            f"gRPC floor c=1 (grpc.aio, canned answer): {floor['throughput_rps']:.0f}/s  p50 {floor['p50_ms']:.3f} ms  "
            f"server {floor['server_cpu_us_per_request']:.0f} µs CPU/request"
        )
    for name, bar in report["bars"].items():
        print(f"bar {name}: {bar['measured']} {bar['target']}: {'PASS' if bar['pass'] else 'FAIL'}")
    print(f"load average {report['load_start']} → {report['load_end']}; wrote {output}")


if __name__ == "__main__":
    raise SystemExit(main())
