"""Trace files: parsing, bad lines, and replay scaled to a target mean rate; request sequences (time, model)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from adaserve.bench.schedules import ScheduleError, SequenceSpec, TraceReplay, TraceSpec, create_schedule
from adaserve.bench.traces import TraceError, load_sequence, load_trace
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


def test_a_request_sequence_keeps_its_order_and_models(tmp_path: Path) -> None:
    path = tmp_path / "s.csv"
    path.write_text("time_s,model\n10.0,a\n10.5, b\n\n10.5,a\n12,c\n")
    sequence = load_sequence(path)
    np.testing.assert_allclose(sequence.offsets_s, [0.0, 0.5, 0.5, 2.0])
    assert sequence.models == ("a", "b", "a", "c") and len(sequence) == 4


def test_a_sequence_of_date_times(tmp_path: Path) -> None:
    path = tmp_path / "s.csv"
    path.write_text("2023-11-16 18:15:46.5,a\n2023-11-16 18:15:48.0,b\n")
    np.testing.assert_allclose(load_sequence(path).offsets_s, [0.0, 1.5])


def test_malformed_sequence_rows_are_an_error_naming_file_line_and_problem(tmp_path: Path) -> None:
    path = tmp_path / "s.csv"
    path.write_text("time_s,model\n0,a\nsoon,b\n1,\n2,c,extra\n-1,d\n3,e\n")
    with pytest.raises(TraceError) as error:
        load_sequence(path)
    message = str(error.value)
    assert message.startswith(f"{path}: 4 malformed row(s) in the request sequence")
    assert "line 3: time 'soon' is not a number of seconds or a date-time" in message
    assert "line 4: empty model name" in message
    assert "line 5: 3 field(s), expected 2: time_s,model" in message
    assert "line 6: time -1 is before the previous row's 0; rows go in time order" in message


@pytest.mark.parametrize(("text", "message"), [("time_s,model\n", "has no rows"), (None, "cannot read request")])
def test_an_empty_or_missing_sequence_is_refused(tmp_path: Path, text: str | None, message: str) -> None:
    path = tmp_path / "s.csv"
    if text is not None:
        path.write_text(text)
    with pytest.raises(TraceError, match=message):
        load_sequence(path)


def test_the_sequence_schedule_compresses_its_times_and_plays_once(tmp_path: Path) -> None:
    path = tmp_path / "s.csv"
    path.write_text("0,a\n10,b\n30,a\n")
    schedule = create_schedule(SequenceSpec(speedup=10), load_sequence(path))
    np.testing.assert_allclose(schedule.arrivals(None, 3), [0.0, 1.0, 3.0])
    np.testing.assert_allclose(schedule.arrivals(2.0, 3), [0.0, 1.0])
    assert schedule.expected(1.5) == 2
    with pytest.raises(ScheduleError, match="sequence file"):
        create_schedule(SequenceSpec())
