"""A run's report: the result JSON, the plots beside it, and the summary table printed for a person."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from adaserve.bench.plots import plot_all
from adaserve.bench.results import BenchResult, LatencyStats, write_result


def write_report(result: BenchResult, path: Path, *, plots: bool = True) -> list[Path]:
    """Write `path` (JSON) and, unless told not to, `<path stem>.{cdf,timeline,throughput}.png`; returns the files."""
    write_result(result, path)
    if not plots or not result.records:
        return [path]
    return [path, *plot_all([(path.stem, result)], path.with_suffix(""))]


def format_summary(result: BenchResult) -> str:
    """The summary as an aligned two-column table, with the verdict last."""
    s = result.summary
    g = s.generator
    rows: list[tuple[str, str]] = [
        ("run", describe_run(result.config)),
        (
            "requests",
            f"{s.requests} ({s.sent} sent, {s.ok} ok, {s.errors} errors, {s.not_sent} not sent, "
            f"{s.cancelled} cancelled)",
        ),
        ("throughput", f"{s.throughput_rps:.1f} answers/s over {s.span_s:.1f} s"),
        (
            "rate",
            f"asked {_rate(s.asked_rate_rps)}, scheduled {_rate(s.scheduled_rate_rps)}, sent {_rate(s.sent_rate_rps)}",
        ),
        ("latency", _latency(s.latency)),
    ]
    if len(s.per_model) > 1:
        rows += [(f"  {model}", _latency(stats)) for model, stats in s.per_model.items()]
    for kind, stats in s.per_kind.items():
        failed = s.failed_per_kind.get(kind, 0)
        rows.append((f"  {kind}", _latency(stats) + (f"; {failed} not answered" if failed else "")))
    if s.errors_by_kind:
        rows.append(("errors", ", ".join(f"{kind} {n}" for kind, n in s.errors_by_kind.items())))
    cpu = f"{g.cpu_per_request_us:.0f} µs CPU/request" if g.cpu_per_request_us is not None else "no request sent"
    rows.append(("generator", f"{cpu}, {g.cpu_utilization:.2f} of a core"))
    if g.lateness_p99_ms is not None:
        rows.append(
            (
                "lateness",
                f"p50 {g.lateness_p50_ms:.2f}, p99 {g.lateness_p99_ms:.2f}, "
                f"max {g.lateness_max_ms:.2f} ms behind schedule",
            )
        )
    rows += [("note", note) for note in result.notes]
    rows.append(("verdict", "valid" if s.valid else "NOT VALID: " + "; ".join(s.problems)))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def describe_run(config: dict[str, Any]) -> str:
    """One line: models, protocol, schedule and bound, from a result's stored config."""
    workload = config["workload"]
    models = ", ".join(dict.fromkeys(r["model"] for r in workload["requests"]))
    load = workload["load"]
    detail = ", ".join(f"{k}={v}" for k, v in load.items() if k != "kind")
    bounds = [
        f"{workload['duration_s']:g} s" if workload.get("duration_s") else "",
        f"{workload['max_requests']} requests" if workload.get("max_requests") else "",
    ]
    protocol = config["protocol"] + (f" ({config['compression']})" if config.get("compression") else "")
    return f"{models} over {protocol} at {config['url']}: {load['kind']} ({detail}), " + " / ".join(
        b for b in bounds if b
    )


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}/s"


def _latency(stats: LatencyStats) -> str:
    if stats.count == 0:
        return "no answers"
    return (
        f"p50 {stats.p50_ms:.2f}  p90 {stats.p90_ms:.2f}  p99 {stats.p99_ms:.2f}  p99.9 {stats.p999_ms:.2f}  "
        f"max {stats.max_ms:.2f}  mean {stats.mean_ms:.2f} ms  (n={stats.count})"
    )
