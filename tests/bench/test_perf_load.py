"""perf_analyzer's profile export read back as adaserve.bench records (benchmarks/perf_load.py), without the binary."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from adaserve.bench.results import Status
from benchmarks.perf_load import _exported, _records


def write_export(path: Path, requests: list[tuple[int, list[int]]]) -> None:
    """An export shaped like perf_analyzer 2.48's, with an output field that is not UTF-8 (as its FP32 bytes are)."""
    body = {
        "experiments": [
            {
                "experiment": {"mode": "request_rate", "value": 100.0},
                "requests": [
                    {"timestamp": t, "request_inputs": {"x": None}, "response_timestamps": r, "response_outputs": []}
                    for t, r in requests
                ],
            }
        ]
    }
    text = json.dumps(body).replace('"response_outputs": []', '"response_outputs": [{"y": "@@"}]', 1)
    path.write_bytes(text.encode().replace(b"@@", b"\xea\xcd"))


def test_the_export_is_read_in_send_order_past_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "export.json"
    write_export(path, [(3_000, [5_000]), (1_000, [2_500]), (2_000, [])])
    sent, answered = _exported(path)
    assert sent.tolist() == [1_000, 3_000]  # the unanswered request is left out, the rest sorted by send time
    assert answered.tolist() == [2_500, 5_000]


def test_a_missing_export_reads_as_no_request(tmp_path: Path) -> None:
    sent, answered = _exported(tmp_path / "absent.json")
    assert len(sent) == len(answered) == 0


def test_open_loop_latency_runs_from_the_scheduled_time_and_unanswered_requests_are_errors() -> None:
    arrivals = np.array([0.5, 0.6, 0.7, 0.8])
    # Sends at 0.5 s (on time) and 0.65 s (50 ms late); each answered 1 ms after its send; the rest never answered.
    sent = np.array([10_000_000_000, 10_150_000_000])
    answered = sent + 1_000_000
    records = _records("m", arrivals, sent, answered)
    assert [r.status for r in records] == [Status.OK, Status.OK, Status.ERROR, Status.ERROR]
    assert records[0].sent_s == pytest.approx(0.5)
    assert records[0].latency_ms == pytest.approx(1.0)
    assert records[1].sent_s == pytest.approx(0.65)
    assert records[1].latency_ms == pytest.approx(51.0)  # the 50 ms it was sent late count
    assert records[2].error_kind == "not_answered"
    assert [r.id for r in records] == [0, 1, 2, 3]


def test_a_first_request_sent_late_does_not_move_the_schedule() -> None:
    """perf_analyzer's schedule begins where its earliest send relative to its arrival says, not at its first send:
    a first request 5 ms late is 5 ms late, and the requests after it on time."""
    arrivals = np.array([0.0, 0.1, 0.2])
    sent = np.array([7_005_000_000, 7_100_000_000, 7_200_000_000])
    records = _records("m", arrivals, sent, sent + 1_000_000)
    assert [r.latency_ms for r in records] == [pytest.approx(6.0), pytest.approx(1.0), pytest.approx(1.0)]
    assert [r.sent_s for r in records] == [pytest.approx(0.005), pytest.approx(0.1), pytest.approx(0.2)]


def test_requests_sent_after_the_schedule_ended_are_not_part_of_the_run() -> None:
    arrivals = np.array([0.0, 0.1])
    sent = np.array([0, 100_000_000, 200_000_000])  # perf_analyzer looped the intervals once more
    records = _records("m", arrivals, sent, sent + 2_000_000)
    assert len(records) == 2
    assert all(r.latency_ms == pytest.approx(2.0) for r in records)


def test_a_closed_loop_schedules_each_request_when_it_was_sent() -> None:
    sent = np.array([5_000_000, 7_000_000])
    records = _records("m", None, sent, sent + 3_000_000)
    assert [r.scheduled_s for r in records] == [pytest.approx(0.0), pytest.approx(0.002)]
    assert all(r.latency_ms == pytest.approx(3.0) for r in records)
