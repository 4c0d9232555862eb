"""Two CPU models under load at once: their schedulers sharing the server's cores against each on its own.

One server holds the example `cnn` four times, linking one artifact, all with the default elastic batching (on
two cores: one busy thread at a time, a worker polling between batches at low load): `cnn_a` and `cnn_b` share the
server's cores (`batching.share_cores`, the default), `cnn_c` and `cnn_d` do not (`share_cores: false`, each model's
limit and polling count only its own workers, as before cores were shared). Two of Triton's C++ perf_analyzers
send at once, each a Poisson schedule of half the total rate:

* `shared`: one to `cnn_a`, one to `cnn_b`;
* `separate`: one to `cnn_c`, one to `cnn_d`, the same two schedules;
* `one model`: both to `cnn_a`, the same two schedules (the same total load on one model, for reference).

Every total rate runs `--repeats` times, the entries' order rotating each time; the comparison takes the median of
the repeats. Latency is measured from each request's scheduled time over both clients' requests together; rows per
batch come from the server's statistics.

    benchmarks/perf_analyzer_env.sh                    # once: Triton's perf_analyzer in .venv-perf
    .venv/bin/python -m benchmarks.shared_cores        # ~4 minutes; --quick for a smoke run

Writes `benchmarks/results/shared_cores.json` and `.png` (with --quick: under `benchmarks/results/tmp/`).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import threading
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.http as httpclient

from adaserve.bench import BenchResult, parse_workload
from benchmarks.common import RESULTS, SCRATCH, figure, finish_report, load_average, process_command, report_head
from benchmarks.perf_load import PerfAnalyzer, run_perf_analyzer
from tests.server_utils import ServerHandle, link_example, running_server

#: Each entry's two clients: the model each sends to.
ENTRIES: dict[str, tuple[str, str]] = {
    "shared": ("cnn_a", "cnn_b"),
    "separate": ("cnn_c", "cnn_d"),
    "one model": ("cnn_a", "cnn_a"),
}
SHARING = {"cnn_a": True, "cnn_b": True, "cnn_c": False, "cnn_d": False}
RATES = (480, 1440, 3000)  # total requests per second, both clients together


def main() -> int:
    args = _parse_args()
    output: Path = args.output or (SCRATCH / "shared_cores-quick.json" if args.quick else RESULTS / "shared_cores.json")
    perf = PerfAnalyzer.find(args.perf_venv)
    work = SCRATCH / "shared_cores"
    shutil.rmtree(work, ignore_errors=True)
    for name, share in SHARING.items():
        link_example(work / "repo", "cnn", name, batching={"policy": "elastic", "share_cores": share})
    settings = {"rates": list(args.rates), "duration_s": args.duration, "repeats": args.repeats, "sharing": SHARING}
    report = report_head("shared_cores", settings)
    runs = []
    with running_server(work / "repo") as server:
        report["server_command"] = process_command(server.pid)
        for repeat in range(args.repeats):
            for rate in args.rates:
                order = list(ENTRIES)
                turn = (repeat + args.rates.index(rate)) % len(order)
                for entry in order[turn:] + order[:turn]:
                    runs.append(_run(perf, server, entry, rate, repeat, args.duration, work))
                    print(_line(runs[-1]), flush=True)
    report["load_end"] = load_average()
    report["runs"] = runs
    report["cases"] = _cases(runs, args.rates)
    return finish_report(report, output, _plot, _print)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", type=lambda s: [int(r) for r in s.split(",")], default=list(RATES))
    parser.add_argument("--duration", type=float, default=None, help="seconds per run (default 6; quick 3)")
    parser.add_argument("--repeats", type=int, default=None, help="runs of every rate (default 3; quick 1)")
    parser.add_argument("--perf-venv", type=Path, default=Path(".venv-perf"))
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--quick", action="store_true", help="one repeat of 3 s runs, under results/tmp/")
    args = parser.parse_args()
    args.duration = args.duration or (3.0 if args.quick else 6.0)
    args.repeats = args.repeats or (1 if args.quick else 3)
    return args


def _run(
    perf: PerfAnalyzer, server: ServerHandle, entry: str, rate: int, repeat: int, duration_s: float, work: Path
) -> dict[str, Any]:
    """Both clients of `entry` at once, each a Poisson schedule of rate / 2 (seeded by repeat and client, so every
    entry gets the same two schedules)."""
    models = ENTRIES[entry]
    results: list[BenchResult | None] = [None, None]

    def send(client: int) -> None:
        load = {"kind": "poisson", "rate": rate / 2}
        seed = 1000 * repeat + client
        workload = parse_workload(
            {"requests": [{"model": models[client]}], "load": load, "duration_s": duration_s, "seed": seed}
        )
        results[client] = run_perf_analyzer(perf, server.http_url, workload, work / f"client{client}")

    before = _batches(server)
    clients = [threading.Thread(target=send, args=(client,)) for client in (0, 1)]
    for client in clients:
        client.start()
    for client in clients:
        client.join()
    after = _batches(server)
    done = [result for result in results if result is not None]
    latencies = np.array([r.latency_ms for result in done for r in result.records if r.latency_ms is not None])
    rows, batches = (sum(after[m][i] - before[m][i] for m in set(models)) for i in (0, 1))
    return {
        "entry": entry,
        "rate": rate,
        "repeat": repeat,
        "valid": len(done) == 2 and all(result.summary.valid for result in done),
        "problems": [problem for result in done for problem in result.summary.problems],
        "requests": sum(result.summary.requests for result in done),
        "failed": sum(result.summary.requests - result.summary.ok for result in done),
        "mean_ms": float(latencies.mean()) if latencies.size else None,
        "p50_ms": float(np.percentile(latencies, 50)) if latencies.size else None,
        "p99_ms": float(np.percentile(latencies, 99)) if latencies.size else None,
        "rows_per_batch": rows / batches if batches else None,
    }


def _batches(server: ServerHandle) -> dict[str, tuple[int, int]]:
    """Per model: (rows inferred, batches run) so far."""
    client = httpclient.InferenceServerClient(server.http_url)
    stats = client.get_inference_statistics()["model_stats"]
    return {s["name"]: (int(s["inference_count"]), int(s["execution_count"])) for s in stats}


def _cases(runs: list[dict[str, Any]], rates: list[int]) -> dict[str, Any]:
    """Per rate: each entry's medians over its valid repeats, and shared over separate."""
    cases: dict[str, Any] = {}
    for rate in rates:
        case: dict[str, Any] = {}
        for entry in ENTRIES:
            done = [r for r in runs if (r["entry"], r["rate"]) == (entry, rate)]
            valid = [r for r in done if r["valid"]]
            case[entry] = {"valid_runs": len(valid), "runs": len(done)}
            for key in ("mean_ms", "p50_ms", "p99_ms", "rows_per_batch"):
                values = [r[key] for r in valid if r[key] is not None]
                case[entry][key] = statistics.median(values) if values else None
                case[entry][key + "_all"] = [r[key] for r in done]
        shared, separate = case["shared"], case["separate"]
        for key in ("mean_ms", "p99_ms"):
            if shared[key] and separate[key]:
                case[f"shared_over_separate_{key.removesuffix('_ms')}"] = shared[key] / separate[key]
        cases[str(rate)] = case
    return cases


def _line(run: dict[str, Any]) -> str:
    valid = "" if run["valid"] else f"  NOT VALID: {'; '.join(run['problems']) or 'failed'}"
    return (
        f"{run['rate']:>5} req/s  {run['entry']:<9}  mean {run['mean_ms']:.3f} ms  p99 {run['p99_ms']:.2f} ms  "
        f"rows/batch {run['rows_per_batch']:.2f}{valid}"
    )


def _plot(report: dict[str, Any], path: Path) -> None:
    fig = figure(11, 4.2)
    axes = fig.subplots(1, 2)
    rates = report["settings"]["rates"]
    x = np.arange(len(rates))
    for ax, key, label in ((axes[0], "mean_ms", "mean latency (ms)"), (axes[1], "p99_ms", "p99 latency (ms)")):
        for offset, entry, color in zip((-0.27, 0.0, 0.27), ENTRIES, ("C2", "C3", "C7"), strict=True):
            medians = [report["cases"][str(rate)][entry][key] or 0.0 for rate in rates]
            ax.bar(x + offset, medians, width=0.26, color=color, label=entry)
            for i, rate in enumerate(rates):
                points = [p for p in report["cases"][str(rate)][entry][key + "_all"] if p is not None]
                ax.plot([x[i] + offset] * len(points), points, "k.", markersize=4)
                if medians[i] == 0.0 and points:  # every run of it invalid: the clients fell behind
                    ax.text(x[i] + offset, min(points), "no valid run", rotation=90, ha="center", va="top", fontsize=8)
        ax.set_xticks(x, [f"{rate:,} req/s" for rate in rates])
        ax.set_yscale("log")
        ax.set_ylabel(label + ", median; dots: each repeat")
    axes[0].legend()
    fig.suptitle("Two example CNNs at half the rate each: schedulers sharing the cores vs each on its own")
    fig.tight_layout()
    fig.savefig(path)


def _print(report: dict[str, Any], output: Path) -> None:
    print(f"\n{output}")
    for rate, case in report["cases"].items():
        cells = "  ".join(f"{entry}: {_cell(case[entry])}" for entry in ENTRIES)
        ratio = case.get("shared_over_separate_mean")
        print(f"{rate:>5} req/s  mean / p99  {cells}  shared/separate mean {ratio or float('nan'):.2f}x")


def _cell(entry: dict[str, Any]) -> str:
    """Median mean / p99 of the valid runs; for an entry with none, the range of its runs' means."""
    if entry["mean_ms"] is not None:
        return f"{entry['mean_ms']:.3f} / {entry['p99_ms']:.2f} ms"
    means = [m for m in entry["mean_ms_all"] if m is not None]
    return f"no valid run (means {min(means):.1f}-{max(means):.1f} ms)" if means else "no run"


if __name__ == "__main__":
    raise SystemExit(main())
