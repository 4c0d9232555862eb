"""Priority under load: what Triton's `priority` parameter buys one class of requests, and what the others pay.

One server serves the same ResNet-18-style CNN (3×64×64, seeded random weights, elastic batching, the default
workers) three times: `resnet18_fifo` with priority off, arrival order; `resnet18_priority` with
`batching.priority_levels: 2`; and `resnet18_bounded`, the same with a queue policy for the low level (Triton's
`priority_queue_policy`): a default timeout, after which a low request not yet started is refused. Each load sends
one Poisson schedule through `adaserve bench` (gRPC): a share of the requests carries `priority: 1`, the rest none
(the lowest level). Every entry gets the same schedule, the same mix and the same inputs, one after the other; each
step the order rotates. The loads are fractions of the fifo entry's closed-loop capacity, measured first, the last
above it (a backlog grows, which priority is for). The loads are run `--repeats` times in turn (default 3), and the
comparisons take the median of the repeats: a single run on this VM moved level 1's p99 or the others' mean by
several times between runs.

    .venv/bin/python -m benchmarks.priority             # ~9 minutes
    .venv/bin/python -m benchmarks.priority --quick     # ~1 minute, one repeat, under results/tmp/

Writes `results/priority.json` and `.png`: per load and entry, mean, p50 and p99 latency of each class and the
requests of each refused, every run's and the median over the repeats, and the ratios of each entry's medians to
fifo's.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from adaserve.bench import BenchConfig, BenchResult, parse_workload, run_bench
from benchmarks.common import RESULTS, SCRATCH, command_line, figure, load_window, machine, wait_for_quiet, write_json
from benchmarks.packrat.models import REFERENCES, export_model
from benchmarks.packrat.serving import link_model
from tests.server_utils import running_server

MODEL = "resnet18"
MAX_BATCH = 16
#: The low level's timeout in the bounded entry (microseconds): a low request not started by then is refused.
LOW_TIMEOUT_US = 500_000
ENTRIES: dict[str, dict[str, Any]] = {
    "fifo": {},
    "priority": {"batching": {"priority_levels": 2}},
    "bounded": {
        "batching": {"priority_levels": 2, "priority_queue_policy": {2: {"default_timeout_us": LOW_TIMEOUT_US}}}
    },
}
HIGH, LOW = "0: high", "1: low"


def main() -> None:
    args = _parse_args()
    output = args.output or (SCRATCH / "priority-quick.json" if args.quick else RESULTS / "priority.json")
    scratch = SCRATCH / "priority"
    spec, _ = export_model(scratch / "models", REFERENCES[MODEL], MAX_BATCH)
    repository = scratch / "repo"
    for entry, overrides in ENTRIES.items():
        link_model(spec, repository, f"{MODEL}_{entry}", overrides)
    report: dict[str, Any] = {
        "benchmark": "priority",
        "command": command_line(),
        "machine": machine(),
        "settings": {
            "model": f"{MODEL} ({REFERENCES[MODEL].description}), max_batch_size {MAX_BATCH}, elastic, default workers",
            "entries": {f"{MODEL}_{entry}": overrides for entry, overrides in ENTRIES.items()},
            "high_share": args.high_share,
            "loads": args.loads,
            "phase_s": args.phase_s,
            "repeats": args.repeats,
            "seed": args.seed,
            "protocol": "grpc",
        },
        "runs": [],
    }
    with running_server(repository) as server:
        report["capacity_rps"] = _capacity(server.grpc_url, args.phase_s / 3)
        print(f"capacity of {MODEL}_fifo: {report['capacity_rps']:.1f} req/s", flush=True)
        steps = [(repeat, load) for repeat in range(args.repeats) for load in args.loads]
        for step, (repeat, load) in enumerate(steps):
            rate = round(load * report["capacity_rps"], 1)
            order = list(ENTRIES)[step % len(ENTRIES) :] + list(ENTRIES)[: step % len(ENTRIES)]
            for entry in order:
                run: dict[str, Any] = {"load": load, "rate_rps": rate, "entry": entry, "repeat": repeat}
                run["quiet"] = wait_for_quiet(args.quiet_s)
                with load_window(run):
                    result = run_bench(_config(server.grpc_url, f"{MODEL}_{entry}", rate, args))
                run.update(_measure(result))
                report["runs"].append(run)
                print(_line(run), flush=True)
    report["comparisons"] = _compare(report["runs"])
    write_json(report, output)
    plot(report, output.with_suffix(".png"))
    print(f"wrote {output}")


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="5 s phases and two loads (~1 minute)")
    parser.add_argument("--loads", type=lambda s: [float(x) for x in s.split(",")], help="fractions of capacity")
    parser.add_argument("--phase-s", type=float, help="seconds of each run (default 15; --quick 5)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each entry at each load; the comparisons "
                        "take the median (default 3; --quick 1)")  # fmt: skip
    parser.add_argument("--high-share", type=float, default=0.2, help="share of requests with priority 1")
    parser.add_argument("--seed", type=int, default=1, help="seeds the arrivals, the mix and the inputs")
    parser.add_argument("--quiet-s", type=float, default=5.0, help="wait at most this long for a quiet machine")
    parser.add_argument("--output", type=Path, help="result JSON (the PNG goes beside it)")
    args = parser.parse_args()
    args.loads = args.loads or ([0.9, 1.1] if args.quick else [0.7, 0.9, 1.1])
    args.phase_s = args.phase_s or (5.0 if args.quick else 15.0)
    args.repeats = 1 if args.quick else args.repeats
    return args


def _capacity(url: str, duration_s: float) -> float:
    """Answers per second of the fifo entry under a closed loop of 32 clients (elastic's MaxInf here)."""
    workload = parse_workload(
        {"requests": [{"model": f"{MODEL}_fifo"}], "load": {"kind": "closed", "concurrency": 32}, "duration_s": 3.0}
    )
    run_bench(BenchConfig(url=url, protocol="grpc", workload=workload))  # warm-up: every worker's first batches
    workload = workload.model_copy(update={"duration_s": duration_s})
    return run_bench(BenchConfig(url=url, protocol="grpc", workload=workload)).summary.throughput_rps


def _config(url: str, model: str, rate: float, args: argparse.Namespace) -> BenchConfig:
    """The same schedule, mix and inputs for either entry: only the model name differs."""
    workload = parse_workload(
        {
            "requests": [
                {"model": model, "weight": args.high_share, "parameters": {"priority": 1}},
                {"model": model, "weight": 1 - args.high_share},
            ],
            "load": {"kind": "poisson", "rate": rate, "seed": args.seed},
            "duration_s": args.phase_s,
            "seed": args.seed,
        }
    )
    return BenchConfig(url=url, protocol="grpc", workload=workload, max_lateness_ms=1e9)


def _measure(result: BenchResult) -> dict[str, Any]:
    summary = result.summary
    kinds = list(summary.per_kind.values())
    measured: dict[str, Any] = {
        "requests": summary.requests,
        "ok": summary.ok,
        "errors": summary.errors,
        "errors_by_kind": summary.errors_by_kind,
        "throughput_rps": round(summary.throughput_rps, 1),
        "generator_lateness_p99_ms": summary.generator.lateness_p99_ms,
        "valid": summary.valid,
        "problems": summary.problems,
    }
    refused = list(summary.failed_per_kind.values())
    for index, (name, stats) in enumerate(zip((HIGH, LOW), kinds, strict=True)):
        measured[name] = {
            "count": stats.count,
            "refused": refused[index],
            "mean_ms": stats.mean_ms,
            "p50_ms": stats.p50_ms,
            "p99_ms": stats.p99_ms,
        }
    measured["all"] = {"mean_ms": summary.latency.mean_ms, "p99_ms": summary.latency.p99_ms}
    return measured


def _compare(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per load: each class's mean and p99 under every entry (the median over the repeats, and every repeat's
    value), and each entry's median over fifo's."""
    comparisons = []
    for load in dict.fromkeys(run["load"] for run in runs):
        entries = {entry: [run for run in runs if run["load"] == load and run["entry"] == entry] for entry in ENTRIES}
        row: dict[str, Any] = {"load": load, "rate_rps": entries["fifo"][0]["rate_rps"]}
        for name in (HIGH, LOW, "all"):
            for figure_name in ("mean_ms", "p99_ms"):
                each = {entry: [run[name][figure_name] for run in entries[entry]] for entry in ENTRIES}
                cell: dict[str, Any] = {entry: _median(values) for entry, values in each.items()}
                fifo = cell["fifo"]
                for entry in list(ENTRIES)[1:]:
                    value = cell[entry]
                    cell[f"{entry}_ratio"] = value / fifo if fifo and value is not None else None
                cell["repeats"] = each
                row[f"{name} {figure_name}"] = cell
        for name in (HIGH, LOW):
            row[f"{name} refused"] = {entry: [run[name]["refused"] for run in entries[entry]] for entry in ENTRIES}
        comparisons.append(row)
    return comparisons


def _median(values: list[float | None]) -> float | None:
    """The median of the repeats that measured something (None: none did)."""
    measured = [value for value in values if value is not None]
    return float(np.median(measured)) if measured else None


def _line(run: dict[str, Any]) -> str:
    high, low = run[HIGH], run[LOW]
    return (
        f"{run['load']:.2f}× ({run['rate_rps']:7.1f}/s) {run['entry']:>8}: high mean {high['mean_ms']:8.2f} "
        f"p99 {high['p99_ms']:8.2f} | low mean {low['mean_ms']:8.2f} p99 {low['p99_ms']:8.2f} ms | "
        f"refused {high['refused']} high, {low['refused']} low{'' if run['valid'] else ' NOT VALID'}"
    )


def plot(report: dict[str, Any], output: Path) -> None:
    """Per load, mean and p99 of each class under each entry."""
    loads = [row["load"] for row in report["comparisons"]]
    fig = figure(11, 4)
    labels = {"fifo": "arrival order", "priority": "priority on", "bounded": "priority, low level timed out"}
    hatches = {"fifo": None, "priority": "//", "bounded": ".."}
    for column, figure_name in enumerate(("mean_ms", "p99_ms"), start=1):
        axes = fig.add_subplot(1, 2, column)
        positions = np.arange(len(loads))
        bars = [(name, entry) for name in (HIGH, LOW) for entry in ENTRIES]
        width = 0.8 / len(bars)
        for index, (name, entry) in enumerate(bars):
            values = [row[f"{name} {figure_name}"][entry] or 0.0 for row in report["comparisons"]]
            offset = (index - (len(bars) - 1) / 2) * width
            label = f"{name.split(': ')[1]} class, {labels[entry]}"
            axes.bar(positions + offset, values, width, label=label, hatch=hatches[entry])
        axes.set_xticks(positions, [f"{load:.2f}× capacity" for load in loads])
        axes.set_ylabel(f"{figure_name.removesuffix('_ms')} latency (ms)")
        axes.set_yscale("log")
        axes.legend(fontsize=7)
    fig.suptitle(
        f"{MODEL}, {report['settings']['high_share']:.0%} of requests with priority 1; capacity "
        f"{report['capacity_rps']:.0f} req/s; {report['machine']['cpu_model']}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(output, dpi=110)


if __name__ == "__main__":
    main()
