"""The serving-overhead and elastic-batching results' own tables: per case, per batching policy, and their bars."""

from __future__ import annotations

from typing import Any

from benchmarks.common import ms_text


def serving_overhead(report: dict[str, Any]) -> str:
    limit = report["in_process_limit"]
    lines = [
        "| case | throughput (req/s) | p50 (ms) | p90 (ms) | p99 (ms) | worker compute, mean (ms) "
        "| vs in-process throughput | server CPU/request | perf_analyzer cores | others' cores |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, case in report["cases"].items():
        if case["throughput_rps"] is None:
            lines.append(f"| {name} | failed | | | | | | | | |")
            continue
        lines.append(
            f"| {_case(name)} | {case['throughput_rps']:.0f} ({_span(case['throughput_rps_all'], '.0f')}) "
            f"| {case['p50_ms']:.3f} ({_span(case['p50_ms_all'], '.3f')}) "
            f"| {case['p90_ms']:.3f} | {case['p99_ms']:.3f} | {ms_text(case.get('server_compute_ms'))} "
            f"| {case['throughput_vs_in_process']:.3f}× | {case['server_cpu_us_per_request']:.0f} µs "
            f"| {case['perf_analyzer_cores']:.2f} | {case['other_cores']:.2f} |"
        )
    lines.append(
        f"| in-process, 1 thread | {limit['throughput_rps']:.0f} | {limit['p50_ms']:.3f} | {limit['p90_ms']:.3f} "
        f"| {limit['p99_ms']:.3f} | | 1× | | | |"
    )
    paced = report.get("in_process_idle_gaps")  # absent from results written before it was measured
    if paced is not None:
        lines.append(
            f"| in-process, {paced['idle_between_calls_s'] * 1e3:g} ms idle before each call | | {paced['p50_ms']:.3f} "
            f"| {paced['p90_ms']:.3f} | {paced['p99_ms']:.3f} | | | | | |"
        )
    return "\n".join(lines) + "\n\n" + bars_table(report["bars"])


def elastic_batching(report: dict[str, Any]) -> str:
    rates, against = report["rates"], report["bars"]["against"]
    if isinstance(against, dict):  # each bar's own OPT Wait (results before the per-load sweep name one)
        against = "; ".join(f"{phase}: {text}" for phase, text in against.items())
    lines = [
        f"Rates: low {rates['low_rps']:g}/s, high {rates['high_rps']:g}/s (closed-loop capacity: "
        + ", ".join(f"{label} {rps:.0f}/s" for label, rps in rates["capacity_rps"].items())
        + f"). OPT Wait: {against}. QoS: {next(iter(report['qos'].values()))['qos']}.",
        "",
        "| policy | step low: mean / p50 / p99 (ms) | step high: mean / p50 / p99 (ms) | trace: mean / p50 / p99 (ms) "
        "| errors "
        "(step, trace) | max rate within QoS (req/s) | throughput there (answers/s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for label in report["step"]:
        step, trace, qos = report["step"][label], report["trace"][label]["overall"], report["qos"][label]
        best = "none met QoS" if qos["max_rate_rps"] is None else f"{qos['max_rate_rps']:g}"
        throughput = "-" if qos["max_throughput_rps"] is None else f"{qos['max_throughput_rps']:.0f}"
        lines.append(
            f"| {label} | {_pair(step['low'])} | {_pair(step['high'])} | {_pair(trace)} "
            f"| {step['overall']['errors']}, {trace['errors']} | {best} | {throughput} |"
        )
    lines += [
        "",
        "| elastic vs | step low: mean reduction | step high: mean reduction | trace: mean reduction "
        "| max throughput within QoS, elastic/other |",
        "|---|---|---|---|---|",
    ]
    for name, versus in report["comparisons"].items():
        phases = versus["phases"]
        ratio = phases["max_throughput_in_qos"]["ratio"]
        lines.append(
            f"| {name.removeprefix('elastic_vs_')} | {_pct(phases['step_low']['mean_reduction'])} "
            f"| {_pct(phases['step_high']['mean_reduction'])} | {_pct(phases['trace']['mean_reduction'])} "
            f"| {'-' if ratio is None else f'{ratio:.2f}×'} |"
        )
    if "opt_wait_sweep" in report:
        lines += ["", _opt_wait_sweep(report["opt_wait_sweep"])]
    return "\n".join(lines) + "\n\n" + bars_table(report["bars"])


def _opt_wait_sweep(sweep: list[dict[str, Any]]) -> str:
    """The fixed-timeout settings tried, with both rates' figures side by side and the entries each became."""
    cells: dict[tuple[int, int, int], dict[str, dict[str, Any]]] = {}
    for cell in sweep:
        cells.setdefault((cell["instances"], cell["threads"], cell["delay_us"]), {})[cell["rate"]] = cell
    lines = [
        "| OPT Wait sweep: instances × threads | max_queue_delay_us | low rate: mean / p50 / p99 (ms) "
        "| high rate: mean / p50 / p99 (ms) | chosen for |",
        "|---|---|---|---|---|",
    ]
    for (instances, threads, delay), rates in cells.items():
        chosen = [entry for cell in rates.values() for entry in cell.get("chosen_for", [])]
        low, high = (_pair(rates[rate]) if rate in rates else "-" for rate in ("low", "high"))
        lines.append(f"| {instances} × {threads} | {delay} | {low} | {high} | {', '.join(chosen)} |")
    return "\n".join(lines)


def bars_table(bars: dict[str, Any]) -> str:
    lines = ["| bar | target | measured | result |", "|---|---|---|---|"]
    for name, bar in bars.items():
        if isinstance(bar, dict) and "pass" in bar:
            measured = bar["measured"]
            if isinstance(measured, dict):
                text = ", ".join(f"{k} {v:.0f}" if v is not None else f"{k} -" for k, v in measured.items())
            elif "reduction" in name:
                text = _pct(measured)
            else:
                text = "-" if measured is None else f"{measured:.4g}"
            lines.append(f"| {name} | {bar['target']} | {text} | {'pass' if bar['pass'] else '**FAIL**'} |")
    return "\n".join(lines)


def _case(name: str) -> str:
    return name.replace("http_c", "REST c=").replace("grpc_c", "gRPC c=")


def _span(values: list[float], fmt: str) -> str:
    return f"{min(values):{fmt}}–{max(values):{fmt}}" if len(values) > 1 else "1 run"


def _pair(phase: dict[str, Any]) -> str:
    mean, p50, p99 = phase["mean_ms"], phase["p50_ms"], phase["p99_ms"]
    return "-" if mean is None else f"{mean:.2f} / {p50:.2f} / {p99:.1f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"
