"""Summary math and the validity verdict, from hand-made records."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from adaserve.bench.results import RequestRecord, Status, Summary
from adaserve.bench.summary import latency_stats, summarize
from tests.bench.factories import record


def _summary(records: list[RequestRecord], **overrides: Any) -> Summary:
    options: dict[str, Any] = {
        "open_loop": True,
        "asked_requests": 100.0,
        "window_s": 10.0,
        "cpu_s": 0.05,
        "wall_s": 10.0,
        "max_lateness_ms": 10.0,
    }
    options.update(overrides)
    return summarize(records, **options)


def test_latency_percentiles() -> None:
    stats = latency_stats(np.arange(1, 1001, dtype=float))
    assert stats.count == 1000
    assert stats.p50_ms == pytest.approx(500.5)
    assert stats.p99_ms == pytest.approx(990.01)
    assert stats.p999_ms == pytest.approx(999.001)
    assert stats.max_ms == 1000 and stats.mean_ms == pytest.approx(500.5)
    assert latency_stats([]).p50_ms is None


def test_rates_counts_and_errors_by_kind() -> None:
    records = [record(i, i * 0.1, latency_ms=5.0) for i in range(95)]
    records += [record(95 + i, 9.5 + i * 0.1, status=Status.ERROR, kind="http_503") for i in range(4)]
    records.append(record(99, 9.9, status=Status.CANCELLED, kind="cancelled", latency_ms=None))
    summary = _summary(records)
    assert (summary.requests, summary.sent, summary.ok, summary.errors, summary.cancelled) == (100, 100, 95, 4, 1)
    assert summary.errors_by_kind == {"http_503": 4, "cancelled": 1}
    assert summary.asked_rate_rps == pytest.approx(10.0)
    assert summary.scheduled_rate_rps == pytest.approx(10.0)
    assert summary.sent_rate_rps == pytest.approx(10.0)
    assert summary.span_s == pytest.approx(9.9)  # first send to the last event, here the cancelled send
    assert summary.throughput_rps == pytest.approx(95 / 9.9)
    assert summary.generator.cpu_per_request_us == pytest.approx(500.0)
    assert summary.generator.cpu_utilization == pytest.approx(0.005)
    assert summary.valid and summary.problems == []


def test_server_errors_are_measurements_but_broken_connections_invalidate() -> None:
    records = [record(i, i * 0.1) for i in range(10)]
    records.append(record(10, 1.0, status=Status.ERROR, kind="connect_failed"))
    summary = _summary(records)
    assert not summary.valid
    assert summary.problems == ["connections failed (1 connect_failed): the server refused connections or went away"]


def test_late_sends_mean_the_generator_could_not_keep_up() -> None:
    records = [record(i, i * 0.01, late_ms=25.0 if i % 10 == 0 else 0.5) for i in range(100)]
    summary = _summary(records)
    assert summary.generator.lateness_p50_ms == pytest.approx(0.5)
    assert summary.generator.lateness_max_ms == pytest.approx(25.0)
    assert not summary.generator.kept_up and not summary.valid
    assert "p99 lateness 25.0 ms exceeds the 10 ms allowed" in summary.problems[0]


def test_requests_not_sent_are_reported() -> None:
    records = [record(0, 0.0), record(1, 0.1, status=Status.NOT_SENT, kind="generator_behind")]
    summary = _summary(records)
    assert summary.not_sent == 1 and summary.sent == 1
    assert "the generator fell behind: 1 request(s) not sent" in summary.problems[0]


def test_closed_loop_has_no_lateness_or_asked_rate() -> None:
    summary = _summary([record(i, i * 0.1) for i in range(10)], open_loop=False, asked_requests=None)
    assert summary.asked_rate_rps is None and summary.scheduled_rate_rps is None
    assert summary.generator.lateness_p99_ms is None and summary.generator.kept_up


def test_failure_before_sending() -> None:
    summary = _summary([], failure="cannot reach 127.0.0.1:1: connection refused", window_s=0.0, wall_s=0.0)
    assert not summary.valid
    assert summary.problems == ["cannot reach 127.0.0.1:1: connection refused"]
    assert summary.latency.count == 0 and summary.generator.cpu_per_request_us is None


def test_per_model_latency() -> None:
    records = [record(0, 0.0, latency_ms=1.0, model="a"), record(1, 0.1, latency_ms=9.0, model="b")]
    summary = _summary(records)
    assert summary.per_model["a"].p50_ms == 1.0 and summary.per_model["b"].p50_ms == 9.0


def test_latency_per_request_kind_when_the_workload_lists_several() -> None:
    """Two kinds of one model (two priorities, say) are told apart by `RequestRecord.kind`; one kind gives none."""
    records = [record(i, i * 0.1, latency_ms=1.0 + 8 * (i % 2)) for i in range(10)]
    for r in records:
        r.kind = r.id % 2
    summary = _summary(records, kinds=["mlp priority=1", "mlp"])
    assert set(summary.per_kind) == {"0: mlp priority=1", "1: mlp"}
    assert summary.per_kind["0: mlp priority=1"].mean_ms == 1.0 and summary.per_kind["1: mlp"].mean_ms == 9.0
    assert summary.per_kind["1: mlp"].count == 5
    assert summary.failed_per_kind == {"0: mlp priority=1": 0, "1: mlp": 0}
    assert _summary(records, kinds=["mlp"]).per_kind == {}


def test_requests_not_answered_are_counted_per_request_kind() -> None:
    """A refused request (a 503 of a level's queue policy, say) counts against its own kind, not only overall."""
    records = [record(i, i * 0.1, status=Status.ERROR if i in (1, 3, 4) else Status.OK) for i in range(6)]
    for r in records:
        r.kind = r.id % 2
    summary = _summary(records, kinds=["mlp priority=1", "mlp"])
    assert summary.failed_per_kind == {"0: mlp priority=1": 1, "1: mlp": 2}
    assert summary.per_kind["1: mlp"].count == 1 and summary.errors == 3
