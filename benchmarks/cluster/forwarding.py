"""Forwarding cost: a request sent to a node server that does not hold its model, against the same request sent to
the node that does.

Two node servers (`adaserve serve --cluster-node`) run without Ray, this process standing in for their node actors
(`adaserve.distributed.testing`): node B loads the example `mlp` (its example config), node A holds nothing, and
the routing table both get places `mlp` on B, so A forwards every request for it to B, its bytes unchanged. Triton's
C++ perf_analyzer sends batch-1 requests (closed loop, concurrency 1 and 8, REST and gRPC) straight to B ("direct")
and to A ("via A"); every case runs `--repeats` times, the two routes interleaved, and the median is reported beside
each repeat.

Server CPU comes from /proc over each perf_analyzer run (user + system of the process and its descendants), divided
by the requests B answered in it (its statistics): the *served* CPU is B's whole tree (frontend and workers) per
request sent direct, the *forwarding* CPU is A's per request sent via A. The bars: via A adds at most 0.15 ms to
the p50, and forwarding costs at most 30% of a served request's CPU.

Three parties share two cores. By default the run pins them (`--no-pin` lets them float): perf_analyzer and A on
the first core, B (frontend and workers, which plan over the cores they are given) on the others. So a request via
A takes core time from the client's core, never from B's, and B runs alike on both routes; on two cores B then has
one worker and no idle spin, the smallest served CPU, which makes the CPU bar the harder to hold.

    benchmarks/perf_analyzer_env.sh                          # once: Triton's perf_analyzer in .venv-perf
    .venv/bin/python -m benchmarks.cluster.forwarding        # ~6 minutes; --quick for one short repeat

Writes `benchmarks/results/cluster_forwarding.json` and `.png` (with --quick: under `benchmarks/results/tmp/`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from adaserve.distributed.messages import NodeAddress, Routes
from adaserve.distributed.testing import FakeActor, node_server
from benchmarks.common import (
    RESULTS,
    SCRATCH,
    figure,
    finish_report,
    load_average,
    ms_text,
    pinned,
    process_command,
    report_head,
    tree_cpu_s,
)
from benchmarks.foreign import idle_cores
from benchmarks.perf_load import PerfAnalyzer
from benchmarks.serving_overhead import MODEL, perf_medians, perf_parser, perf_run
from tests.server_utils import ServerHandle, link_example, running_server

PROTOCOLS = ("http", "grpc")
CONCURRENCIES = (1, 8)
ROUTES = ("direct", "via_a")
#: The issue's bars: what forwarding may add to the p50, and its CPU as a share of a served request's.
BAR_ADDED_P50_MS = 0.15
BAR_FORWARD_CPU_SHARE = 0.30


def main() -> int:
    parser = perf_parser(__doc__, request_count=3000)
    parser.add_argument("--no-pin", action="store_true", help="let perf_analyzer and both servers use every core")
    args = parser.parse_args()
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.request_count = args.request_count or (500 if args.quick else 3000)
    output: Path = args.output or (
        SCRATCH / "cluster_forwarding-quick.json" if args.quick else RESULTS / "cluster_forwarding.json"
    )
    perf = PerfAnalyzer.find(args.perf_venv, judge_stability=not args.quick)
    work = SCRATCH / "cluster_forwarding"
    shutil.rmtree(work, ignore_errors=True)
    link_example(work / "repo", MODEL)
    layout = None if args.no_pin else pin_layout(sorted(os.sched_getaffinity(0)))
    settings = {
        "model": MODEL,
        "repeats": args.repeats,
        "measurement_request_count": args.request_count,
        "cores": layout or "unpinned: perf_analyzer, A and B share every core",
        "bars": {"added_p50_ms": BAR_ADDED_P50_MS, "forwarding_cpu_share": BAR_FORWARD_CPU_SHARE},
    }
    report = report_head("cluster_forwarding", settings)
    with _nodes(work / "repo", layout) as ((a, a_actor), (b, b_actor)):
        b_actor.load(MODEL)
        table = Routes(1, {"a": _address(a), "b": _address(b)}, {MODEL: ["b"]})
        for actor in (a_actor, b_actor):
            actor.send(table)
        report["server_commands"] = {"a": process_command(a.pid), "b": process_command(b.pid)}
        report["b_model_config"] = _get(b, f"/v2/models/{MODEL}/config")
        report["idle_server_cores"] = {"a": idle_cores(a.pid), "b": idle_cores(b.pid)}
        with pinned(layout["client"] if layout else None):
            report["runs"] = [
                _run(perf, a, b, route, protocol, concurrency, repeat, args.request_count)
                for repeat in range(args.repeats)
                for protocol in PROTOCOLS
                for concurrency in CONCURRENCIES
                for route in ROUTES
            ]
    report["load_end"] = load_average()
    report["cases"] = {
        f"{protocol}_c{concurrency}": _case(
            [r for r in report["runs"] if r["protocol"] == protocol and r["concurrency"] == concurrency]
        )
        for protocol in PROTOCOLS
        for concurrency in CONCURRENCIES
    }
    report["bars"] = _bars(report["cases"])
    return finish_report(report, output, _plot, _print)


def pin_layout(cores: list[int]) -> dict[str, list[int]] | None:
    """Which cores each party gets: the client and A the first, B the rest; None with a single core."""
    if len(cores) < 2:
        return None
    return {"client": cores[:1], "a": cores[:1], "b": cores[1:]}


@contextlib.contextmanager
def _nodes(
    repository: Path, layout: dict[str, list[int]] | None
) -> Iterator[tuple[tuple[ServerHandle, FakeActor], tuple[ServerHandle, FakeActor]]]:
    """Node servers A and B on `repository`, each started on its cores, with this process as their actor."""

    def start(args: tuple[str, ...], fds: tuple[int, ...]) -> contextlib.AbstractContextManager[ServerHandle]:
        return running_server(repository, *args, pass_fds=fds)

    with contextlib.ExitStack() as stack:
        started = []
        for name in ("a", "b"):
            with pinned(layout[name] if layout else None):
                started.append(stack.enter_context(node_server(start, name)))
        yield started[0], started[1]


def _address(server: ServerHandle) -> NodeAddress:
    return NodeAddress(server.http_url, server.grpc_url)


def _get(server: ServerHandle, path: str) -> Any:
    with urllib.request.urlopen(f"http://{server.http_url}{path}", timeout=10) as answer:
        return json.load(answer)


def _answered(b: ServerHandle) -> int:
    """Inference requests B has answered so far."""
    stats = _get(b, f"/v2/models/{MODEL}/stats")["model_stats"][0]
    return int(stats["inference_stats"]["success"]["count"])


def _run(
    perf: PerfAnalyzer,
    a: ServerHandle,
    b: ServerHandle,
    route: str,
    protocol: str,
    concurrency: int,
    repeat: int,
    count: int,
) -> dict[str, Any]:
    """One perf_analyzer run to B (direct) or A (via A), and each server's CPU per request B answered in it.

    The entry server's CPU is perf_run's, over the perf_analyzer run exactly; the other's is read around the whole
    call (it includes the quiet wait before the run, so it reads a little high: a cross-check, not a figure), and
    taken off what perf_run counts as other work on the machine."""
    entry, other = (b, a) if route == "direct" else (a, b)
    answered, other_cpu = _answered(b), tree_cpu_s(other.pid)
    run = perf_run(perf, entry, protocol, concurrency, repeat, count, name=route)
    other_cpu, requests = tree_cpu_s(other.pid) - other_cpu, _answered(b) - answered
    run["requests"] = requests
    # perf_run counts every process outside the entry server's tree as other work: the other node is ours
    run["other_cores"] -= other_cpu / run["wall_s"]
    entry_cpu = run["server_cores"] * run["wall_s"]
    cpu = {"b": entry_cpu, "a": other_cpu} if route == "direct" else {"a": entry_cpu, "b": other_cpu}
    run["cpu_us_per_request"] = {name: value / requests * 1e6 if requests else None for name, value in cpu.items()}
    return run


def _case(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One protocol and concurrency: each route's medians, what via A adds, and forwarding's CPU against serving's."""
    direct = [r for r in runs if r["server"] == "direct" and "throughput_rps" in r]
    via = [r for r in runs if r["server"] == "via_a" and "throughput_rps" in r]
    case: dict[str, Any] = {"direct": perf_medians(direct), "via_a": perf_medians(via)}
    served = [r["cpu_us_per_request"]["b"] for r in direct if r["cpu_us_per_request"]["b"] is not None]
    forwarding = [r["cpu_us_per_request"]["a"] for r in via if r["cpu_us_per_request"]["a"] is not None]
    b_via = [r["cpu_us_per_request"]["b"] for r in via if r["cpu_us_per_request"]["b"] is not None]
    case["served_cpu_us"] = statistics.median(served) if served else None
    case["forwarding_cpu_us"] = statistics.median(forwarding) if forwarding else None
    case["b_cpu_us_via_a"] = statistics.median(b_via) if b_via else None  # read around the call: a cross-check
    case["served_cpu_us_all"], case["forwarding_cpu_us_all"] = served, forwarding
    # what other work on the machine took during the case's runs (cores): the figures' noise
    case["other_cores"] = statistics.median(r["other_cores"] for r in runs) if runs else None
    if direct and via:
        d, v = case["direct"], case["via_a"]
        case["added_p50_ms"] = v["p50_ms"] - d["p50_ms"]
        case["added_p99_ms"] = v["p99_ms"] - d["p99_ms"]
        case["p50_ratio"] = v["p50_ms"] / d["p50_ms"]
        case["throughput_ratio"] = v["throughput_rps"] / d["throughput_rps"]
        # paired by repeat: each repeat's via-A p50 less the direct p50 run just before it
        case["added_p50_ms_all"] = [y - x for x, y in zip(d["p50_ms_all"], v["p50_ms_all"], strict=False)]
    if case["served_cpu_us"] and case["forwarding_cpu_us"] is not None:
        case["forwarding_cpu_share"] = case["forwarding_cpu_us"] / case["served_cpu_us"]
    return case


def _bars(cases: dict[str, Any]) -> dict[str, Any]:
    """Each bar, for each case: measured (median of the repeats), target, whether it holds (None: every run of a
    route failed, so there is no figure)."""
    bars: dict[str, Any] = {}
    for name, case in cases.items():
        added, share = case.get("added_p50_ms"), case.get("forwarding_cpu_share")
        bars[f"{name}_added_p50"] = {
            "measured": added,
            "target": f"<= {BAR_ADDED_P50_MS} ms",
            "pass": None if added is None else added <= BAR_ADDED_P50_MS,  # None: no figure (runs failed)
        }
        bars[f"{name}_forwarding_cpu"] = {
            "measured": share,
            "target": f"<= {BAR_FORWARD_CPU_SHARE:.0%} of a served request's server CPU",
            "pass": None if share is None else share <= BAR_FORWARD_CPU_SHARE,
        }
    return bars


def _label(case: str) -> str:
    protocol, concurrency = case.split("_c")
    return f"{'REST' if protocol == 'http' else 'gRPC'} c={concurrency}"


def _plot(report: dict[str, Any], path: Path) -> None:
    cases = report["cases"]
    names = list(cases)
    x = np.arange(len(names))
    fig = figure(12, 4.5)
    latency, cpu = fig.subplots(1, 2)
    for offset, route, label in ((-0.2, "direct", "direct to B"), (0.2, "via_a", "via A")):
        values = [cases[n][route]["p50_ms"] or 0.0 for n in names]
        latency.bar(x + offset, values, width=0.4, label=label)
        for i, name in enumerate(names):
            points = cases[name][route]["p50_ms_all"]
            latency.plot([x[i] + offset] * len(points), points, "k.", markersize=3)
    for i, name in enumerate(names):
        added = cases[name].get("added_p50_ms")
        if added is not None:
            top = max(cases[name]["direct"]["p50_ms"], cases[name]["via_a"]["p50_ms"])
            latency.annotate(f"{added:+.3f} ms", (x[i], top), ha="center", va="bottom", fontsize=8)
    latency.set_xticks(x, [_label(n) for n in names])
    latency.set_ylabel("p50 latency (ms); dots: each repeat")
    latency.set_title(f"p50: via A adds (bar ≤ {BAR_ADDED_P50_MS} ms)")
    latency.legend(fontsize="small")
    for offset, key, label in (
        (-0.2, "served_cpu_us", "served: B's CPU"),
        (0.2, "forwarding_cpu_us", "forwarding: A's"),
    ):
        values = [cases[n][key] or 0.0 for n in names]
        cpu.bar(x + offset, values, width=0.4, label=label)
        for i, name in enumerate(names):
            points = cases[name][f"{key}_all"]
            cpu.plot([x[i] + offset] * len(points), points, "k.", markersize=3)
    for i, name in enumerate(names):
        served = cases[name]["served_cpu_us"]
        if served:
            cpu.plot([x[i] - 0.4, x[i] + 0.4], [served * BAR_FORWARD_CPU_SHARE] * 2, "r:", linewidth=1)
    cpu.set_xticks(x, [_label(n) for n in names])
    cpu.set_ylabel("server CPU per request (µs); dots: each repeat")
    cpu.set_title(f"CPU per request (red: {BAR_FORWARD_CPU_SHARE:.0%} of served)")
    cpu.legend(fontsize="small")
    machine = report["machine"]
    fig.suptitle(f"Forwarding {report['settings']['model']} from node A to node B — {machine['cpu_model']}, "
                 f"{machine['cores']} cores")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _print(report: dict[str, Any], output: Path) -> None:
    print("| case | direct to B: p50 / p99 ms, req/s | via A: same | added p50 ms | via A req/s × "
          "| served CPU µs/req (B) | forwarding CPU µs/req (A) | forwarding ÷ served |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for name, case in report["cases"].items():
        cells = [
            f"{ms_text(case[route]['p50_ms'])} / {ms_text(case[route]['p99_ms'])}, "
            f"{case[route]['throughput_rps'] or 0:,.0f}"
            for route in ROUTES
        ]
        share = case.get("forwarding_cpu_share")
        ratio = case.get("throughput_ratio")
        print(
            f"| {_label(name)} | {' | '.join(cells)} | {ms_text(case.get('added_p50_ms'))} | "
            f"{'-' if ratio is None else f'{ratio:.2f}×'} | {case['served_cpu_us'] or 0:.0f} | "
            f"{case['forwarding_cpu_us'] or 0:.0f} | {'-' if share is None else f'{share:.0%}'} |"
        )
    cores = report["settings"]["cores"]
    where = (
        cores
        if isinstance(cores, str)
        else f"perf_analyzer on cores {cores['client']}, A on {cores['a']}, B on {cores['b']}"
    )
    others = ", ".join(f"{_label(name)} {case['other_cores']:.2f}" for name, case in report["cases"].items())
    print(f"\n{where}; medians of {report['settings']['repeats']} repeats")
    print(f"cores other work on the machine took during the runs (median): {others}")
    for name, bar in report["bars"].items():
        measured = bar["measured"]
        shown = "-" if measured is None else (f"{measured:.0%}" if "cpu" in name else f"{measured:.3f} ms")
        verdict = "no figure" if bar["pass"] is None else ("PASS" if bar["pass"] else "FAIL")
        print(f"bar {name}: {shown} {bar['target']}: {verdict}")
    idle = report["idle_server_cores"]
    print(f"idle: A {idle['a']:.3f} cores, B {idle['b']:.3f} cores; load average {report['load_start']} → "
          f"{report['load_end']}; wrote {output}")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
