"""Latency against offered load: what a request pays at low load, over REST and gRPC, beside the machine's floor.

The example `mlp` (batch-1 requests from Triton's C++ perf_analyzer) is measured closed loop at concurrency 1 and 8
(the 8 is taken as the protocol's capacity), then open loop with Poisson arrivals at `FRACTIONS` of that capacity
and at `BAR_RATE` req/s. Beside it, with the same perf_analyzer settings and the same offered rates, run two servers
that answer with canned bytes and no model: `benchmarks.rest_floor` (HTTP/1.1 on uvloop) and `benchmarks.grpc_floor`
(grpc.aio). A floor's open-loop latency over its own closed-loop c=1 latency is what this machine and client add
at that load before any server code runs (a vCPU woken from idle, caches gone cold, perf_analyzer's own timers);
adaserve's same ratio is read against it. gRPC runs twice over: adaserve with its gRPC frontend inline (on the
engine's event loop) and in a process of its own (`--grpc-frontend process`, a second server beside the first).
Every case runs `--repeats` times, interleaved, and medians are reported.

    benchmarks/perf_analyzer_env.sh                     # once: Triton's perf_analyzer in .venv-perf
    .venv/bin/python -m benchmarks.latency_profile      # ~20 minutes; --quick for a smoke run

Writes `benchmarks/results/latency_profile.json` and `.png` (with --quick: under `benchmarks/results/tmp/`).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import (
    RESULTS,
    SCRATCH,
    figure,
    finish_report,
    load_average,
    ms_text,
    process_command,
    report_head,
)
from benchmarks.perf_load import PerfAnalyzer
from benchmarks.serving_overhead import floor_server, perf_medians, perf_parser, perf_run
from tests.server_utils import ServerHandle, link_example, running_server

MODEL = "mlp"
PROTOCOLS = ("http", "grpc")
#: The servers measured over each protocol, the floor last.
SERVERS = {"http": ("adaserve", "rest_floor"), "grpc": ("adaserve", "adaserve_process", "grpc_floor")}
#: Offered loads, as shares of the protocol's closed-loop concurrency-8 throughput.
FRACTIONS = (0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9)
#: The issue's bars: at this open-loop rate REST p50 ≤ 1.3× and p99 ≤ 3× its closed-loop c=1 p50; gRPC c=8 ≥ 0.8×
#: REST's req/s and gRPC c=1 p50 ≤ 1.3× REST's.
BAR_RATE = 200.0
BAR_P50_RATIO, BAR_P99_RATIO = 1.3, 3.0
BAR_GRPC_THROUGHPUT, BAR_GRPC_P50 = 0.8, 1.3
#: An open-loop window holds this many seconds of arrivals (and at least `MIN_WINDOW_REQUESTS` requests).
WINDOW_S, MIN_WINDOW_REQUESTS = 2.0, 100


def main() -> int:
    args = _parse_args()
    output: Path = args.output or (
        SCRATCH / "latency_profile-quick.json" if args.quick else RESULTS / "latency_profile.json"
    )
    perf = PerfAnalyzer.find(args.perf_venv, judge_stability=not args.quick)
    settings = {
        "model": MODEL,
        "repeats": args.repeats,
        "closed_loop_request_count": args.request_count,
        "window_s": args.window_s,
        "fractions_of_capacity": list(args.fractions),
        "bar_rate_rps": BAR_RATE,
    }
    report = report_head("latency_profile", settings)
    repository = SCRATCH / "latency_profile" / "repo"
    shutil.rmtree(repository, ignore_errors=True)
    link_example(repository, MODEL)
    with (
        running_server(repository, "--grpc-frontend", "inline") as server,
        running_server(repository, "--grpc-frontend", "process") as process,
        floor_server("http") as rest,
        floor_server("grpc") as grpc,
    ):
        servers = {"adaserve": server, "adaserve_process": process, "rest_floor": rest, "grpc_floor": grpc}
        report["commands"] = {name: process_command(handle.pid) for name, handle in servers.items()}
        report["server_config"] = (repository / MODEL / "config.yaml").read_text()
        capacity = {p: perf_run(perf, server, p, 8, -1, args.request_count) for p in PROTOCOLS if args.fractions}
        report["capacity_runs"] = list(capacity.values())
        report["rates"] = {p: _rates(capacity.get(p, {}).get("throughput_rps"), args.fractions) for p in PROTOCOLS}
        report["runs"] = [
            run
            for repeat in range(args.repeats)
            for protocol in PROTOCOLS
            for run in _profile(perf, servers, protocol, report["rates"][protocol], repeat, args)
        ]
    report["load_end"] = load_average()
    _summarize(report)
    return finish_report(report, output, _plot, _print)


def _parse_args() -> Any:
    parser = perf_parser(__doc__, request_count=3000)
    parser.add_argument("--window-s", type=float, help=f"seconds of arrivals per open-loop window (default {WINDOW_S})")
    parser.add_argument(
        "--fractions",
        type=_fractions,
        help="offered loads as shares of capacity, e.g. 0.1,0.5; '' for none, only the bar's rate (default: FRACTIONS)",
    )
    args = parser.parse_args()
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.request_count = args.request_count or (300 if args.quick else 3000)
    args.window_s = args.window_s or (0.5 if args.quick else WINDOW_S)
    if args.fractions is None:
        args.fractions = (0.05, 0.5) if args.quick else FRACTIONS
    return args


def _fractions(text: str) -> tuple[float, ...]:
    """Shares of capacity from "0.1,0.5"; "" for none (the bar's rate alone, and no capacity run)."""
    return tuple(float(share) for share in text.split(",") if share.strip())


def _rates(capacity_rps: float | None, fractions: tuple[float, ...]) -> list[float]:
    """The open-loop rates for a protocol of this capacity: its fractions and the bar's rate, in order."""
    shares = [round(f * capacity_rps) for f in fractions] if capacity_rps else []
    return sorted({float(r) for r in shares if r >= 1} | {BAR_RATE})


def _profile(
    perf: PerfAnalyzer, servers: dict[str, ServerHandle], protocol: str, rates: list[float], repeat: int, args: Any
) -> list[dict[str, Any]]:
    """One repeat of a protocol: its servers (adaserve, and its floor) closed loop at 1 and 8, then open loop at
    each rate, one after the other."""
    names = SERVERS[protocol]
    runs = [
        perf_run(perf, servers[name], protocol, c, repeat, args.request_count, name=name)
        for name in names
        for c in (1, 8)
    ]
    for rate in rates:
        count = max(MIN_WINDOW_REQUESTS, round(rate * args.window_s))
        for name in names:
            runs.append(perf_run(perf, servers[name], protocol, 1, repeat, count, name=name, rate=rate))
    return runs


def _summarize(report: dict[str, Any]) -> None:
    """Per server and protocol: the closed-loop medians, and per offered rate the p50 and p99 medians and their
    ratios to the closed-loop c=1 p50; then the bars."""
    runs = report["runs"]
    profiles: dict[str, Any] = {}
    for protocol in PROTOCOLS:
        for name in SERVERS[protocol]:
            mine = [r for r in runs if r["server"] == name and r["protocol"] == protocol]
            closed = {
                f"c{c}": perf_medians(rs)
                for c in (1, 8)
                if (rs := [r for r in mine if "offered_rps" not in r and r["concurrency"] == c])
            }
            c1 = closed["c1"]["p50_ms"]
            points = []
            for rate in report["rates"][protocol]:
                point = perf_medians([r for r in mine if r.get("offered_rps") == rate])
                p50, p99 = point["p50_ms"], point["p99_ms"]
                points.append(
                    {
                        "offered_rps": rate,
                        **point,
                        "p50_over_c1_p50": p50 / c1 if p50 and c1 else None,
                        "p99_over_c1_p50": p99 / c1 if p99 and c1 else None,
                    }
                )
            profiles[f"{name} {protocol}"] = {"closed_loop": closed, "open_loop": points}
    report["profiles"] = profiles
    rest, grpc = profiles["adaserve http"], profiles["adaserve grpc"]
    at_bar = next(p for p in rest["open_loop"] if p["offered_rps"] == BAR_RATE)
    rest_c8, grpc_c8 = rest["closed_loop"]["c8"]["throughput_rps"], grpc["closed_loop"]["c8"]["throughput_rps"]
    rest_c1, grpc_c1 = rest["closed_loop"]["c1"]["p50_ms"], grpc["closed_loop"]["c1"]["p50_ms"]
    floor_at_bar = next(p for p in profiles["rest_floor http"]["open_loop"] if p["offered_rps"] == BAR_RATE)
    grpc_throughput = grpc_c8 / rest_c8 if grpc_c8 and rest_c8 else None
    grpc_p50 = grpc_c1 / rest_c1 if grpc_c1 and rest_c1 else None
    report["bars"] = {
        "rest_poisson_p50": _bar(
            at_bar["p50_over_c1_p50"], f"<= {BAR_P50_RATIO}x REST c=1 p50", lambda m: m <= BAR_P50_RATIO
        ),
        "rest_poisson_p99": _bar(
            at_bar["p99_over_c1_p50"], f"<= {BAR_P99_RATIO}x REST c=1 p50", lambda m: m <= BAR_P99_RATIO
        ),
        "grpc_c8_throughput": _bar(
            grpc_throughput, f">= {BAR_GRPC_THROUGHPUT}x REST c=8", lambda m: m >= BAR_GRPC_THROUGHPUT
        ),
        "grpc_c1_p50": _bar(grpc_p50, f"<= {BAR_GRPC_P50}x REST", lambda m: m <= BAR_GRPC_P50),
    }
    report["floor_at_bar_rate"] = {
        "rest_floor_p50_over_c1_p50": floor_at_bar["p50_over_c1_p50"],
        "rest_floor_p99_over_c1_p50": floor_at_bar["p99_over_c1_p50"],
        "rest_floor_added_p50_ms": _difference(floor_at_bar["p50_ms"], profiles["rest_floor http"], "c1"),
        "adaserve_added_p50_ms": _difference(at_bar["p50_ms"], rest, "c1"),
    }
    process = profiles["adaserve_process grpc"]["closed_loop"]
    process_c8, process_c1 = process["c8"]["throughput_rps"], process["c1"]["p50_ms"]
    report["grpc_process_over_inline"] = {
        "c8_throughput": process_c8 / grpc_c8 if process_c8 and grpc_c8 else None,
        "c1_p50": process_c1 / grpc_c1 if process_c1 and grpc_c1 else None,
    }


def _difference(p50_ms: float | None, profile: dict[str, Any], closed: str) -> float | None:
    c1 = profile["closed_loop"][closed]["p50_ms"]
    return p50_ms - c1 if p50_ms is not None and c1 is not None else None


def _bar(measured: float | None, target: str, passes: Callable[[float], bool]) -> dict[str, Any]:
    """A bar's entry: `passes` judges the measured figure (none measured: missed)."""
    passed = measured is not None and passes(measured)
    return {"measured": measured, "target": target, "pass": passed, "on": "medians of the repeats"}


def _plot(report: dict[str, Any], path: Path) -> None:
    fig = figure(11, 4.5)
    axes = fig.subplots(1, 2)
    for ax, protocol in zip(axes, PROTOCOLS, strict=True):
        for index, (label, profile) in enumerate(p for p in report["profiles"].items() if p[0].endswith(protocol)):
            points = [p for p in profile["open_loop"] if p["p50_ms"] is not None]
            rates = [p["offered_rps"] for p in points]
            color = f"C{index}"
            ax.plot(rates, [p["p50_ms"] for p in points], "o-", color=color, label=f"{label} p50")
            ax.plot(rates, [p["p99_ms"] for p in points], "^--", color=color, alpha=0.6, label=f"{label} p99")
            c1 = profile["closed_loop"]["c1"]["p50_ms"]
            if c1:
                ax.axhline(c1, color=color, linestyle=":", label=f"{label} closed loop c=1 p50 {c1:.3f} ms")
        ax.axvline(BAR_RATE, color="grey", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("offered load, Poisson (req/s)")
        ax.set_ylabel("latency (ms)")
        ax.set_title("REST" if protocol == "http" else "gRPC")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="x-small")
    fig.suptitle(f"mlp, batch 1, perf_analyzer — {report['machine']['cpu_model']}, {report['machine']['cores']} cores")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _print(report: dict[str, Any], output: Path) -> None:
    for label, profile in report["profiles"].items():
        closed = "  ".join(
            f"c={c[1:]} {v['throughput_rps']:,.0f}/s p50 {v['p50_ms']:.3f} ms"
            for c, v in profile["closed_loop"].items()
            if v["p50_ms"] is not None
        )
        print(f"\n{label}: {closed}")
        print("| offered req/s | p50 ms | p99 ms | p50 / c=1 p50 | p99 / c=1 p50 |")
        print("|---|---|---|---|---|")
        for p in profile["open_loop"]:  # a run perf_analyzer could not measure (a busy machine) prints "-"
            print(
                f"| {p['offered_rps']:,.0f} | {ms_text(p['p50_ms'])} | {ms_text(p['p99_ms'])} | "
                f"{_times(p['p50_over_c1_p50'])} | {_times(p['p99_over_c1_p50'])} |"
            )
    for name, bar in report["bars"].items():
        measured = "n/a" if bar["measured"] is None else f"{bar['measured']:.2f}"
        print(f"bar {name}: {measured} (target {bar['target']}): {'pass' if bar['pass'] else 'MISSED'}")
    floor = report["floor_at_bar_rate"]
    if floor["rest_floor_p50_over_c1_p50"] is not None:
        print(
            f"at {BAR_RATE:.0f} req/s the REST floor's p50 is {floor['rest_floor_p50_over_c1_p50']:.2f}× its c=1 p50 "
            f"(+{ms_text(floor['rest_floor_added_p50_ms'])} ms); adaserve adds "
            f"+{ms_text(floor['adaserve_added_p50_ms'])} ms"
        )
    process = report.get("grpc_process_over_inline")  # reports before --grpc-frontend have none
    if process is not None:
        print(
            f"gRPC frontend in a process of its own over inline: c=8 req/s {_times(process['c8_throughput'])}, "
            f"c=1 p50 {_times(process['c1_p50'])}"
        )
    print(f"wrote {output}")


def _times(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}×"


if __name__ == "__main__":
    raise SystemExit(main())
