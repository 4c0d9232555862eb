"""The summary figures of a run, computed from its records; pure, so the math is tested without a server."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from adaserve.bench.client import TRANSPORT_ERRORS
from adaserve.bench.results import GeneratorStats, LatencyStats, RequestRecord, Status, Summary

PERCENTILES = (50.0, 90.0, 99.0, 99.9)


def latency_stats(latencies_ms: Sequence[float] | np.ndarray) -> LatencyStats:
    """Mean, p50/p90/p99/p99.9 and max; None for every figure when nothing was answered."""
    values = np.asarray(latencies_ms, dtype=np.float64)
    if values.size == 0:
        return LatencyStats(count=0, mean_ms=None, p50_ms=None, p90_ms=None, p99_ms=None, p999_ms=None, max_ms=None)
    p50, p90, p99, p999 = (float(x) for x in np.percentile(values, PERCENTILES))
    return LatencyStats(
        count=int(values.size),
        mean_ms=float(values.mean()),
        p50_ms=p50,
        p90_ms=p90,
        p99_ms=p99,
        p999_ms=p999,
        max_ms=float(values.max()),
    )


def summarize(
    records: Sequence[RequestRecord],
    *,
    open_loop: bool,
    asked_requests: float | None,
    window_s: float,
    cpu_s: float,
    wall_s: float,
    max_lateness_ms: float,
    failure: str | None = None,
    interrupted: bool = False,
    kinds: Sequence[str] = (),
) -> Summary:
    """Figures over `records`; `window_s` is the time the generator was sending, which the rates are taken over;
    `kinds` names the workload's request kinds (`RequestRecord.kind` indexes them): with two or more, latency is
    also given per kind, so the classes of one model's requests (priorities, say) are told apart."""
    ok = [r for r in records if r.status is Status.OK]
    labelled = [(index, f"{index}: {label}") for index, label in enumerate(kinds)] if len(kinds) > 1 else []
    sent = [r for r in records if r.sent_s is not None]
    counts = Counter(r.status for r in records)
    errors_by_kind = Counter(r.error_kind or "unknown" for r in records if r.status is not Status.OK)
    lateness = [(r.sent_s - r.scheduled_s) * 1000 for r in sent if r.sent_s is not None] if open_loop else None
    generator = _generator_stats(lateness, cpu_s, wall_s, len(sent), counts[Status.NOT_SENT], max_lateness_ms)
    first_sent = min((r.sent_s for r in sent if r.sent_s is not None), default=0.0)
    last_event = max((r.done_s or r.sent_s or 0.0 for r in sent), default=0.0)
    span = max(0.0, last_event - first_sent)
    models = sorted({r.model for r in records})
    problems = _problems(failure, len(sent), errors_by_kind, generator, max_lateness_ms)
    if interrupted:
        problems.append("interrupted before its bound: the run is partial")
    return Summary(
        requests=len(records),
        sent=len(sent),
        ok=len(ok),
        errors=counts[Status.ERROR],
        not_sent=counts[Status.NOT_SENT],
        cancelled=counts[Status.CANCELLED],
        errors_by_kind=dict(errors_by_kind.most_common()),
        span_s=span,
        throughput_rps=len(ok) / span if span > 0 else 0.0,
        asked_rate_rps=asked_requests / window_s if asked_requests is not None and window_s > 0 else None,
        scheduled_rate_rps=len(records) / window_s if open_loop and window_s > 0 else None,
        sent_rate_rps=len(sent) / window_s if window_s > 0 else 0.0,
        latency=latency_stats([r.latency_ms for r in ok if r.latency_ms is not None]),
        per_model={
            m: latency_stats([r.latency_ms for r in ok if r.model == m and r.latency_ms is not None]) for m in models
        },
        generator=generator,
        valid=not problems,
        problems=problems,
        per_kind={
            label: latency_stats([r.latency_ms for r in ok if r.kind == index and r.latency_ms is not None])
            for index, label in labelled
        },
        failed_per_kind={
            label: sum(r.kind == index and r.status is not Status.OK for r in records) for index, label in labelled
        },
    )


def _problems(
    failure: str | None, sent: int, errors_by_kind: Counter[str], generator: GeneratorStats, max_lateness_ms: float
) -> list[str]:
    """Why the run does not measure the server as asked; empty for a valid run."""
    problems = [failure] if failure else []
    if not sent and not failure:
        problems.append("no request was sent")
    if errors_by_kind["generator_behind"]:
        problems.append(
            f"the generator fell behind: {errors_by_kind['generator_behind']} request(s) not sent because too many "
            "were outstanding"
        )
    if generator.lateness_p99_ms is not None and generator.lateness_p99_ms > max_lateness_ms:
        problems.append(
            f"the generator could not keep up with the schedule: p99 lateness {generator.lateness_p99_ms:.1f} ms "
            f"exceeds the {max_lateness_ms:g} ms allowed"
        )
    broken = {kind: n for kind, n in errors_by_kind.items() if kind in TRANSPORT_ERRORS}
    if broken:
        listed = ", ".join(f"{n} {kind}" for kind, n in broken.items())
        problems.append(f"connections failed ({listed}): the server refused connections or went away")
    return problems


def _generator_stats(
    lateness_ms: list[float] | None, cpu_s: float, wall_s: float, sent: int, not_sent: int, max_lateness_ms: float
) -> GeneratorStats:
    """CPU cost and punctuality; lateness (send − scheduled time) exists only for an open loop."""
    p50 = p99 = worst = None
    if lateness_ms:
        p50, p99 = (float(x) for x in np.percentile(lateness_ms, (50, 99)))
        worst = max(lateness_ms)
    return GeneratorStats(
        cpu_s=cpu_s,
        cpu_per_request_us=cpu_s / sent * 1e6 if sent else None,
        cpu_utilization=cpu_s / wall_s if wall_s > 0 else 0.0,
        lateness_p50_ms=p50,
        lateness_p99_ms=p99,
        lateness_max_ms=worst,
        kept_up=not_sent == 0 and (p99 is None or p99 <= max_lateness_ms),
    )
