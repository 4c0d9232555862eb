"""Generator fidelity: does `adaserve bench` send on schedule, whatever the server does?

Two cases, each sent by `adaserve bench`'s open loop and, on the same schedule, by the baseline it exists to beat: a
generator with coordinated omission, which sends each request at its scheduled time or when the previous answer
came, whichever is later (one connection, one request at a time).

- overload: a model that serves one request at a time in ~15 ms, asked for 2.5 times what it serves (constant rate,
  3 s), over HTTP and gRPC. The open loop's send lateness must stay small while the server's backlog grows.
- trace: the Azure LLM conversation trace scaled to 40 requests/s for 8 s on the example `mlp`, over HTTP. The sent
  inter-arrival gaps must reproduce the trace's (error per gap, and a two-sample KS test of the distributions).

The server runs at niceness 10, as in the bench tests: on 2 cores the generator must not queue behind it. These
figures were timed assertions in `tests/bench/` until the house rule (timing claims live in benchmarks) moved them
here; the tests keep the claims that do not depend on the machine's speed.

    .venv/bin/python -m benchmarks.generator_fidelity              # ~2 minutes
    .venv/bin/python -m benchmarks.generator_fidelity --repeats 1  # ~40 s

Writes `benchmarks/results/generator_fidelity.json` and `.png`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from adaserve.bench import (
    BenchConfig,
    ClosedSpec,
    RequestRecord,
    Status,
    Workload,
    create_schedule,
    parse_workload,
    run_bench,
)
from adaserve.bench.client import Protocol, create_sender
from adaserve.bench.workload import make_variants
from benchmarks.common import (
    RESULTS,
    SCRATCH,
    command_line,
    figure,
    load_window,
    machine,
    wait_for_quiet,
    write_json,
)
from tests.bench.factories import AZURE, SERVER_NICENESS, SLOW_ROUNDS
from tests.server_utils import link_example, renice_tree, running_server, write_slow_model

OVERLOAD = 2.5
#: The claims the bench tests used to time: open-loop send lateness under overload (median, p99) and the p95
#: error of a replayed trace's inter-arrival gaps.
BAR_LATENESS_P50_MS = 2.0
BAR_LATENESS_P99_MS = 50.0
BAR_GAP_ERROR_P95_MS = 5.0
GENERATORS = ("open_loop", "coordinated_omission")


def main() -> int:
    args = _parse_args()
    report: dict[str, Any] = {
        "benchmark": "generator_fidelity",
        "command": command_line(),
        "machine": machine(),
        "settings": {
            "repeats": args.repeats,
            "overload": OVERLOAD,
            "slow_rounds": SLOW_ROUNDS,
            "server_niceness": SERVER_NICENESS,
        },
        "bars": {
            "lateness_p50_ms": BAR_LATENESS_P50_MS,
            "lateness_p99_ms": BAR_LATENESS_P99_MS,
            "gap_error_p95_ms": BAR_GAP_ERROR_P95_MS,
        },
        "runs": [],
    }
    repository = SCRATCH / "generator_fidelity" / "models"
    repository.mkdir(parents=True, exist_ok=True)
    link_example(repository, "mlp", workers=[{"batch": 1}, {"batch": 4}])
    write_slow_model(repository, "slow", rounds=SLOW_ROUNDS, max_queue_size=2048)
    with running_server(repository) as server:
        renice_tree(server.pid, SERVER_NICENESS)
        report["server"] = {"pid": server.pid, "log": str(server.log)}
        capacity = _capacity(server.grpc_url)
        report["settings"]["slow_capacity_rps"] = round(capacity, 1)
        rate = round(OVERLOAD * capacity)
        cases: list[tuple[str, Protocol, str, Workload]] = [
            ("overload", "http", server.http_url, _workload("slow", {"kind": "constant", "rate": rate}, 3.0)),
            ("overload", "grpc", server.grpc_url, _workload("slow", {"kind": "constant", "rate": rate}, 3.0)),
        ]
        if AZURE.is_file():
            trace = {"kind": "trace", "path": str(AZURE), "rate": 40}
            cases.append(("trace", "http", server.http_url, _workload("mlp", trace, 8.0)))
        for repeat in range(args.repeats):
            for case, protocol, url, workload in cases:
                for generator in GENERATORS:
                    run: dict[str, Any] = {"case": case, "protocol": protocol, "generator": generator}
                    run["repeat"], run["quiet"] = repeat, wait_for_quiet(args.quiet_wait_s)
                    config = BenchConfig(url=url, protocol=protocol, workload=workload, max_lateness_ms=1e9)
                    with load_window(run):
                        records = _send(config, generator)
                    run.update(_measure(records))
                    report["runs"].append(run)
                    print(_line(run), flush=True)
    report["summary"] = _summarize(report["runs"])
    write_json(report, args.output)
    _plot(report["runs"], args.output.with_suffix(".png"))
    print(f"wrote {args.output}")
    return 0


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="runs of every case and generator, interleaved")
    parser.add_argument("--quiet-wait-s", type=float, default=15.0, help="wait at most this long for a quiet second")
    parser.add_argument("--output", type=Path, default=RESULTS / "generator_fidelity.json")
    return parser.parse_args()


def _workload(model: str, load: dict[str, Any], duration_s: float) -> Workload:
    return parse_workload({"requests": [{"model": model}], "load": load, "duration_s": duration_s})


def _capacity(url: str) -> float:
    """Requests per second the slow model serves one at a time, measured here so the overload is 2.5× on any host."""
    workload = parse_workload(
        {"requests": [{"model": "slow"}], "load": {"kind": "closed", "concurrency": 1}, "max_requests": 20}
    )
    return run_bench(BenchConfig(url=url, protocol="grpc", workload=workload)).summary.throughput_rps


def _send(config: BenchConfig, generator: str) -> list[RequestRecord]:
    if generator == "open_loop":
        return run_bench(config).records
    return asyncio.run(_coordinated_omission(config))


async def _coordinated_omission(config: BenchConfig) -> list[RequestRecord]:
    """The baseline: each request leaves at its scheduled time or when the previous answer came, whichever is later."""
    workload = config.workload
    assert not isinstance(workload.load, ClosedSpec)
    arrivals = create_schedule(workload.load).arrivals(workload.duration_s, workload.max_requests)
    sender = create_sender(config.protocol, config.url, config.timeout_s)
    spec = workload.requests[0]
    records: list[RequestRecord] = []
    try:
        info = await sender.model_info(spec.model, spec.version)
        tensors = make_variants(spec, info, np.random.default_rng(workload.seed))[0]
        payload = sender.encode(spec.model, spec.version, tensors, [o.name for o in info.outputs], spec.parameters)
        t0 = time.perf_counter()
        for index, due in enumerate(arrivals.tolist()):
            await asyncio.sleep(max(0.0, due - (time.perf_counter() - t0)))
            sent = time.perf_counter() - t0
            outcome = await sender.infer(payload)
            done = time.perf_counter() - t0
            status = Status.OK if outcome.error_kind is None else Status.ERROR
            records.append(
                RequestRecord(
                    id=index,
                    model=spec.model,
                    scheduled_s=due,
                    sent_s=sent,
                    done_s=done,
                    latency_ms=(done - due) * 1000,
                    status=status,
                    error_kind=outcome.error_kind,
                )
            )
    finally:
        await sender.close()
    return records


def _measure(records: list[RequestRecord]) -> dict[str, Any]:
    """Send lateness, inter-arrival fidelity and latency (from the scheduled time) of one run."""
    sent = [r for r in records if r.sent_s is not None]
    sent_s = np.array([r.sent_s for r in sent], dtype=float)
    scheduled_s = np.array([r.scheduled_s for r in sent])
    lateness = (sent_s - scheduled_s) * 1000
    scheduled_gaps, sent_gaps = np.diff(scheduled_s), np.diff(sent_s)
    gap_error = np.abs(sent_gaps - scheduled_gaps) * 1000
    latency = np.array([r.latency_ms for r in records if r.status is Status.OK])
    done = [r.done_s for r in records if r.done_s is not None]
    return {
        "requests": len(records),
        "sent": len(sent),
        "ok": int(sum(r.status is Status.OK for r in records)),
        "lateness_ms": _percentiles(lateness),
        "gap_error_ms": _percentiles(gap_error),
        "gaps_ks_pvalue": float(stats.ks_2samp(sent_gaps, scheduled_gaps).pvalue),
        "latency_ms": _percentiles(latency),
        "throughput_rps": round(len(done) / max(max(done) - sent_s.min(), 1e-9), 1),
        "lateness_cdf_ms": np.sort(lateness).round(3).tolist(),
        "gap_error_cdf_ms": np.sort(gap_error).round(3).tolist(),
    }


def _percentiles(values: np.ndarray) -> dict[str, float]:
    return {f"p{q}": round(float(np.percentile(values, q)), 3) for q in (50, 95, 99)} | {
        "max": round(float(values.max()), 3)
    }


def _line(run: dict[str, Any]) -> str:
    return (
        f"{run['case']:8s} {run['protocol']:4s} {run['generator']:20s} sent {run['sent']:4d} ok {run['ok']:4d}  "
        f"lateness p50 {run['lateness_ms']['p50']:8.2f} p99 {run['lateness_ms']['p99']:8.2f} ms  "
        f"gap error p95 {run['gap_error_ms']['p95']:7.2f} ms  KS p {run['gaps_ks_pvalue']:.3f}  "
        f"(machine busy {run['machine_busy_cores']:.2f} cores)"
    )


def _summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per case: both generators' medians over the repeats, their ratio, and the bars met by the open loop."""
    rows = []
    for case, protocol in dict.fromkeys((r["case"], r["protocol"]) for r in runs):
        side = {
            g: [r for r in runs if (r["case"], r["protocol"], r["generator"]) == (case, protocol, g)]
            for g in GENERATORS
        }

        def median(generator: str, field: str, key: str) -> float:
            return statistics.median(r[field][key] for r in side[generator])  # noqa: B023

        row: dict[str, Any] = {"case": case, "protocol": protocol}
        for generator in GENERATORS:
            row[generator] = {
                "lateness_p50_ms": median(generator, "lateness_ms", "p50"),
                "lateness_p99_ms": median(generator, "lateness_ms", "p99"),
                "gap_error_p95_ms": median(generator, "gap_error_ms", "p95"),
                "gaps_ks_pvalue": statistics.median(r["gaps_ks_pvalue"] for r in side[generator]),
                "latency_p99_ms": median(generator, "latency_ms", "p99"),
            }
        open_loop, baseline = row["open_loop"], row["coordinated_omission"]
        row["lateness_p99_ratio"] = round(baseline["lateness_p99_ms"] / max(open_loop["lateness_p99_ms"], 1e-3), 1)
        if case == "overload":
            row["bars_met"] = {
                "lateness_p50": open_loop["lateness_p50_ms"] <= BAR_LATENESS_P50_MS,
                "lateness_p99": open_loop["lateness_p99_ms"] <= BAR_LATENESS_P99_MS,
            }
        else:
            row["bars_met"] = {
                "gap_error_p95": open_loop["gap_error_p95_ms"] < BAR_GAP_ERROR_P95_MS,
                "gaps_ks": open_loop["gaps_ks_pvalue"] > 0.05,
            }
        rows.append(row)
        print(
            f"{case} {protocol}: open loop lateness p99 {open_loop['lateness_p99_ms']:.2f} ms, coordinated omission "
            f"{baseline['lateness_p99_ms']:.1f} ms ({row['lateness_p99_ratio']}×); bars {row['bars_met']}"
        )
    return rows


def _plot(runs: list[dict[str, Any]], path: Path) -> None:
    """Send lateness under overload and gap error on the trace, both generators, every repeat."""
    fig = figure(11, 4)
    lateness, gaps = fig.subplots(1, 2)
    colors = {"open_loop": "tab:blue", "coordinated_omission": "tab:red"}
    styles = {"http": "-", "grpc": "--"}
    for run in runs:
        axis, values = (
            (lateness, run["lateness_cdf_ms"]) if run["case"] == "overload" else (gaps, run["gap_error_cdf_ms"])
        )
        values = np.maximum(values, 1e-3)
        label = f"{run['generator']} {run['protocol']}" if run["repeat"] == 0 else None
        axis.plot(
            values,
            np.linspace(0, 1, len(values)),
            styles[run["protocol"]],
            color=colors[run["generator"]],
            label=label,
            alpha=0.8,
        )
    lateness.axvline(BAR_LATENESS_P99_MS, color="gray", linestyle=":", label="p99 bar")
    gaps.axvline(BAR_GAP_ERROR_P95_MS, color="gray", linestyle=":", label="p95 bar")
    lateness.set(
        xscale="log",
        xlabel="send lateness (ms)",
        ylabel="fraction of requests",
        title=f"overload ({OVERLOAD}× the model's capacity)",
    )
    gaps.set(xscale="log", xlabel="|sent gap − scheduled gap| (ms)", title="Azure trace at 40 req/s, mlp")
    for axis in (lateness, gaps):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
