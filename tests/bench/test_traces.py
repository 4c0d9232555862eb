"""Trace files: parsing, bad lines, and replay scaled to a target mean rate."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from adaserve.bench.schedules import TraceReplay, TraceSpec, create_schedule
from adaserve.bench.traces import TraceError, load_trace
from tests.bench.factories import AZURE, needs_azure


@needs_azure
def test_azure_trace_loads_every_line() -> None:
    trace = load_trace(AZURE)
    assert len(trace.offsets_s) == 19366
    assert trace.offsets_s[0] == 0.0
    assert trace.offsets_s[-1] == pytest.approx(58 * 60 + 21.7, abs=1.0)
    assert trace.skipped_lines == ()


@needs_azure
def test_scaling_keeps_the_inter_arrival_shape_and_sets_the_mean_rate() -> None:
    trace = load_trace(AZURE)
    replay = create_schedule(TraceSpec(path=AZURE, rate=50))
    assert isinstance(replay, TraceReplay)
    scaled_gaps, recorded_gaps = np.diff(replay.scaled), np.diff(trace.offsets_s)
    assert scaled_gaps.mean() == pytest.approx(1 / 50)
    np.testing.assert_allclose(scaled_gaps / scaled_gaps.mean(), recorded_gaps / recorded_gaps.mean(), atol=1e-9)
    # A bursty trace stays bursty: the coefficient of variation of the gaps is unchanged by scaling.
    assert scaled_gaps.std() / scaled_gaps.mean() == pytest.approx(recorded_gaps.std() / recorded_gaps.mean())


def test_numeric_timestamps_without_header(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("10.0\n10.5\n11.0\n13.0\n")
    replay = create_schedule(TraceSpec(path=path, rate=2))
    np.testing.assert_allclose(replay.arrivals(None, 4), [0.0, 0.25, 0.5, 1.5])


def test_replay_loops_after_one_mean_gap(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("time\n0\n1\n3\n")
    replay = create_schedule(TraceSpec(path=path, rate=1))  # recorded at 2/3 per s: gaps shrink to 2/3 and 4/3
    np.testing.assert_allclose(replay.arrivals(None, 7), [0, 2 / 3, 2, 3, 3 + 2 / 3, 5, 6])
    np.testing.assert_allclose(replay.arrivals(6.0, None), [0, 2 / 3, 2, 3, 3 + 2 / 3, 5])
    assert replay.expected(6.0) == 6


def test_bad_lines_are_an_error_naming_their_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,1\nnot a time,2\n2023-11-16 18:15:47.1,3\n,4\n")
    with pytest.raises(TraceError) as error:
        load_trace(path)
    message = str(error.value)
    assert "2 line(s) without a timestamp" in message
    assert "line 3: 'not a time,2'" in message and "line 5" in message
    assert "--skip-bad-lines" in message


def test_skipping_bad_lines_counts_them(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP\n2023-11-16 18:15:46.5000000\nnan\n2023-11-16 18:15:47.5\n2023-11-16 18:15:48.0\n")
    replay = create_schedule(TraceSpec(path=path, rate=1, skip_bad_lines=True))
    assert replay.notes == [f"{path}: skipped 1 bad line(s): 3"]
    np.testing.assert_allclose(replay.arrivals(None, 3), [0.0, 4 / 3, 2.0])


@pytest.mark.parametrize(
    ("text", "message"),
    [("TIMESTAMP\n", "at least two timestamps, found 0"), ("1.0\n1.0\n", "all 2 timestamps are equal")],
)
def test_a_trace_without_a_rate_is_refused(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(TraceError, match=message):
        load_trace(path)


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read trace"):
        load_trace(tmp_path / "absent.csv")


def test_expected_arrivals_are_plain_floats_the_report_can_write(tmp_path: Path) -> None:
    """A trace's expected count went into the JSON report as numpy.float64, which the encoder refused."""
    path = tmp_path / "t.csv"
    path.write_text("10.0\n10.5\n11.0\n13.0\n")
    replay = create_schedule(TraceSpec(path=path, rate=2))
    for t in (0.0, 0.3, 2.0, 7.5):
        assert type(replay.expected(t)) is float
    assert json.loads(json.dumps({"expected": replay.expected(7.5)}))["expected"] == replay.expected(7.5)
