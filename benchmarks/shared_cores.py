"""Two CPU models under load at once: their schedulers sharing the server's cores against each on its own.

One server, every model with the default elastic batching (on two cores: one busy thread at a time, a worker
polling between batches at low load). Models whose names end in `_a` or `_b` share the server's cores
(`batching.share_cores`, the default); those ending in `_c` or `_d` do not (`share_cores: false`: each model's limit
and polling count only its own workers, as before cores were shared). Two of Triton's C++ perf_analyzers send at
once, each a Poisson schedule. Two parts:

* **pair**: the example `cnn` four times (one artifact), each client at half the total rate: `shared` to `cnn_a`
  and `cnn_b`, `separate` to `cnn_c` and `cnn_d`, `one model` both to `cnn_a` (the same total load on one model,
  for reference); the same two schedules for each;
* **mixed**: a heavy model (`heavy_*`: 6,000 rounds of a 256×256 matmul, about 28 ms a batch) at 15 req/s beside a
  light one (`light_*`, the example MLP) at 300 req/s, `shared` against `separate`: what a light model pays for
  waiting behind a heavy one's batches, which a model sharing the cores does only for batches about to end.

Every entry runs `--repeats` times, the order rotating each time; comparisons take the median of the repeats.
Latency is measured from each request's scheduled time (in the pair part over both clients' requests together);
rows per batch come from the server's statistics.

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
from benchmarks.perf_load import PerfAnalyzer, run_perf_analyzer
from tests.server_utils import ServerHandle, link_example, running_server, write_slow_model

#: Each entry's two clients: the model each sends to.
ENTRIES: dict[str, tuple[str, str]] = {
    "shared": ("cnn_a", "cnn_b"),
    "separate": ("cnn_c", "cnn_d"),
    "one model": ("cnn_a", "cnn_a"),
}
RATES = (480, 1440, 3000)  # total requests per second, both clients together
#: The mixed part: each entry's heavy and light model, and each one's rate (requests per second).
MIXED: dict[str, tuple[str, str]] = {"shared": ("heavy_a", "light_a"), "separate": ("heavy_c", "light_c")}
HEAVY_ROUNDS, HEAVY_RATE, LIGHT_RATE = 6000, 15.0, 300.0


def main() -> int:
    args = _parse_args()
    output: Path = args.output or (SCRATCH / "shared_cores-quick.json" if args.quick else RESULTS / "shared_cores.json")
    perf = PerfAnalyzer.find(args.perf_venv)
    work = SCRATCH / "shared_cores"
    shutil.rmtree(work, ignore_errors=True)
    repository = work / "repo"
    for tag in ("a", "b", "c", "d"):
        batching = {"policy": "elastic", "share_cores": tag in "ab"}
        link_example(repository, "cnn", f"cnn_{tag}", batching=batching)
        if tag in "ac":
            link_example(repository, "mlp", f"light_{tag}", batching=batching)
            write_slow_model(repository, f"heavy_{tag}", rounds=HEAVY_ROUNDS, batching=batching)
    settings = {
        "rates": list(args.rates),
        "duration_s": args.duration,
        "repeats": args.repeats,
        "mixed": {"heavy_rounds": HEAVY_ROUNDS, "heavy_rate": HEAVY_RATE, "light_rate": LIGHT_RATE},
    }
    report = report_head("shared_cores", settings)
    runs, mixed = [], []
    with running_server(repository) as server:
        report["server_command"] = process_command(server.pid)
        for repeat in range(args.repeats):
            for rate in args.rates:
                for entry in _rotated(list(ENTRIES), repeat + args.rates.index(rate)):
                    run = _run(perf, server, ENTRIES[entry], (rate / 2, rate / 2), repeat, args.duration, work)
                    runs.append({"entry": entry, "rate": rate, "repeat": repeat, **run})
                    print(_line(runs[-1]), flush=True)
            for entry in _rotated(list(MIXED), repeat):
                run = _run(perf, server, MIXED[entry], (HEAVY_RATE, LIGHT_RATE), repeat, args.duration, work)
                mixed.append({"entry": entry, "repeat": repeat, **run})
                print(_mixed_line(mixed[-1]), flush=True)
    report["load_end"] = load_average()
    report["runs"] = runs
    report["cases"] = _cases(runs, args.rates)
    report["mixed_runs"] = mixed
    report["mixed"] = _mixed_cases(mixed)
    return finish_report(report, output, _plot, _print)


def _rotated(entries: list[str], turn: int) -> list[str]:
    turn %= len(entries)
    return entries[turn:] + entries[:turn]


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
    perf: PerfAnalyzer,
    server: ServerHandle,
    models: tuple[str, str],
    rates: tuple[float, float],
    repeat: int,
    duration_s: float,
    work: Path,
) -> dict[str, Any]:
    """Two clients at once, client i a Poisson schedule of rates[i] to models[i] (seeded by repeat and client, so
    every entry gets the same schedules): the figures over both clients' requests, and each client's."""
    results: list[BenchResult | None] = [None, None]

    def send(client: int) -> None:
        load = {"kind": "poisson", "rate": rates[client]}
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
    rows, batches = (sum(after[m][i] - before[m][i] for m in set(models)) for i in (0, 1))
    return {
        "models": list(models),
        "client_rates": list(rates),
        "valid": len(done) == 2 and all(result.summary.valid for result in done),
        "problems": [problem for result in done for problem in result.summary.problems],
        "requests": sum(result.summary.requests for result in done),
        "failed": sum(result.summary.requests - result.summary.ok for result in done),
        **_latency(done),
        "clients": [_latency([result]) for result in done],
        "rows_per_batch": rows / batches if batches else None,
    }


def _latency(results: list[BenchResult]) -> dict[str, float | None]:
    """Mean, p50 and p99 (ms) of the answered requests of `results` together."""
    latencies = np.array([r.latency_ms for result in results for r in result.records if r.latency_ms is not None])
    if not latencies.size:
        return {"mean_ms": None, "p50_ms": None, "p99_ms": None}
    return {
        "mean_ms": float(latencies.mean()),
        "p50_ms": float(np.percentile(latencies, 50)),
        "p99_ms": float(np.percentile(latencies, 99)),
    }


def _batches(server: ServerHandle) -> dict[str, tuple[int, int]]:
    """Per model: (rows inferred, batches run) so far."""
    with httpclient.InferenceServerClient(server.http_url) as client:
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


def _mixed_cases(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per entry of the mixed part: the heavy and the light model's medians over the valid repeats; and the light
    model's shared over separate."""
    cases: dict[str, Any] = {}
    for entry in MIXED:
        valid = [r for r in runs if r["entry"] == entry and r["valid"]]
        case: dict[str, Any] = {"valid_runs": len(valid)}
        for client, role in enumerate(("heavy", "light")):
            for key in ("mean_ms", "p99_ms"):
                values = [r["clients"][client][key] for r in valid if r["clients"][client][key] is not None]
                case[f"{role}_{key}"] = statistics.median(values) if values else None
                case[f"{role}_{key}_all"] = [r["clients"][client][key] for r in runs if r["entry"] == entry]
        cases[entry] = case
    shared, separate = cases["shared"], cases["separate"]
    for key in ("light_mean_ms", "light_p99_ms", "heavy_mean_ms"):
        if shared[key] and separate[key]:
            cases[f"shared_over_separate_{key.removesuffix('_ms')}"] = shared[key] / separate[key]
    return cases


def _line(run: dict[str, Any]) -> str:
    valid = "" if run["valid"] else f"  NOT VALID: {'; '.join(run['problems']) or 'failed'}"
    return (
        f"{run['rate']:>5} req/s  {run['entry']:<9}  mean {ms_text(run['mean_ms'])} ms  "
        f"p99 {ms_text(run['p99_ms'])} ms  rows/batch {run['rows_per_batch'] or float('nan'):.2f}{valid}"
    )


def _mixed_line(run: dict[str, Any]) -> str:
    heavy, light = run["clients"]
    valid = "" if run["valid"] else f"  NOT VALID: {'; '.join(run['problems']) or 'failed'}"
    return (
        f"mixed  {run['entry']:<9}  heavy mean {ms_text(heavy['mean_ms'])} ms p99 {ms_text(heavy['p99_ms'])}  "
        f"light mean {ms_text(light['mean_ms'])} ms p99 {ms_text(light['p99_ms'])}{valid}"
    )


def _plot(report: dict[str, Any], path: Path) -> None:
    fig = figure(15, 4.2)
    axes = fig.subplots(1, 3)
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
    _plot_mixed(axes[2], report["mixed"])
    fig.suptitle("Two models under load at once: schedulers sharing the cores vs each on its own")
    fig.tight_layout()
    fig.savefig(path)


def _plot_mixed(ax: Any, mixed: dict[str, Any]) -> None:
    """The mixed part: each model's mean latency, shared and separate."""
    x = np.arange(2)
    for offset, entry, color in ((-0.2, "shared", "C2"), (0.2, "separate", "C3")):
        medians = [mixed[entry][f"{role}_mean_ms"] or 0.0 for role in ("light", "heavy")]
        ax.bar(x + offset, medians, width=0.4, color=color, label=entry)
        for i, role in enumerate(("light", "heavy")):
            points = [p for p in mixed[entry][f"{role}_mean_ms_all"] if p is not None]
            ax.plot([x[i] + offset] * len(points), points, "k.", markersize=4)
    ax.set_xticks(x, ["light: MLP\n300 req/s", "heavy: ~28 ms batches\n15 req/s"])
    ax.set_yscale("log")
    ax.set_ylabel("mean latency (ms), median; dots: each repeat")
    ax.set_title("a light model beside a heavy one")
    ax.legend()


def _print(report: dict[str, Any], output: Path) -> None:
    print(f"\n{output}")
    for rate, case in report["cases"].items():
        cells = "  ".join(f"{entry}: {_cell(case[entry])}" for entry in ENTRIES)
        ratio = case.get("shared_over_separate_mean")
        print(f"{rate:>5} req/s  mean / p99  {cells}  shared/separate mean {ratio or float('nan'):.2f}x")
    mixed = report["mixed"]
    for entry in MIXED:
        case = mixed[entry]
        print(
            f"mixed {entry:<9} light {ms_text(case['light_mean_ms'])} / {ms_text(case['light_p99_ms'])} ms, "
            f"heavy {ms_text(case['heavy_mean_ms'])} / {ms_text(case['heavy_p99_ms'])} ms"
        )


def _cell(entry: dict[str, Any]) -> str:
    """Median mean / p99 of the valid runs; for an entry with none, the range of its runs' means."""
    if entry["mean_ms"] is not None:
        return f"{entry['mean_ms']:.3f} / {entry['p99_ms']:.2f} ms"
    means = [m for m in entry["mean_ms_all"] if m is not None]
    return f"no valid run (means {min(means):.1f}-{max(means):.1f} ms)" if means else "no run"


if __name__ == "__main__":
    raise SystemExit(main())
