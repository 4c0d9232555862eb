"""Recorded arrival traces: CSV files whose first column is a timestamp, such as the Azure LLM inference trace.

A timestamp is either a date-time (`2023-11-16 18:15:46.6805900`) or a number of seconds. A bad line is an error that
names its line number, unless the caller asks to skip bad lines, in which case they are counted and reported.

A request sequence is a trace with a model column, `time_s,model` rows in time order: request i goes to model m_i
at time t_i (a model-cache workload, where which model comes when is the experiment). It is replayed exactly, so
every bad row is an error naming its line.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

#: Bad lines quoted in an error message; the rest are counted.
_QUOTED_BAD_LINES = 5


class TraceError(ValueError):
    """A trace file that cannot be replayed; the message names the file and the bad lines."""


@dataclass(frozen=True)
class Trace:
    """Arrival offsets in seconds from the earliest one, sorted, and the line numbers that were skipped."""

    path: Path
    offsets_s: np.ndarray
    skipped_lines: tuple[int, ...]


def load_trace(path: Path, *, skip_bad_lines: bool = False) -> Trace:
    """Read the first column of `path` as arrival timestamps; a header line is recognised and left out."""
    rows = _read_rows(path, "trace")
    if rows and rows[0][1] and _parse(rows[0][1][0]) is None:
        rows = rows[1:]
    stamps: list[float] = []
    bad: list[tuple[int, str]] = []
    for number, fields in rows:
        if not fields or not "".join(fields).strip():
            continue
        value = _parse(fields[0])
        if value is None:
            bad.append((number, ",".join(fields)))
        else:
            stamps.append(value)
    if bad and not skip_bad_lines:
        raise TraceError(_bad_lines_message(path, bad))
    if len(stamps) < 2:
        raise TraceError(f"{path}: a trace needs at least two timestamps, found {len(stamps)}")
    times = np.sort(np.array(stamps, dtype=np.float64))
    if times[-1] == times[0]:
        raise TraceError(f"{path}: all {len(times)} timestamps are equal; the trace has no rate")
    return Trace(path=path, offsets_s=times - times[0], skipped_lines=tuple(number for number, _ in bad))


@dataclass(frozen=True)
class RequestSequence:
    """Requests in order: offsets in seconds from the first one (non-decreasing) and the model of each."""

    path: Path
    offsets_s: np.ndarray
    models: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.models)


def load_sequence(path: Path) -> RequestSequence:
    """Read `time_s,model` rows (a header line is recognised and left out; blank lines are skipped)."""
    rows = _read_rows(path, "request sequence")
    if rows and rows[0][1] and _parse(rows[0][1][0]) is None:
        rows = rows[1:]
    times: list[float] = []
    models: list[str] = []
    bad: list[tuple[int, str]] = []
    for number, fields in rows:
        if not fields or not "".join(fields).strip():
            continue
        value = _parse(fields[0])
        if len(fields) != 2:
            bad.append((number, f"{len(fields)} field(s), expected 2: time_s,model"))
        elif value is None:
            bad.append((number, f"time {fields[0]!r} is not a number of seconds or a date-time"))
        elif not fields[1].strip():
            bad.append((number, "empty model name"))
        elif times and value < times[-1]:
            bad.append((number, f"time {value:g} is before the previous row's {times[-1]:g}; rows go in time order"))
        else:
            times.append(value)
            models.append(fields[1].strip())
    if bad:
        quoted = "\n".join(f"  line {number}: {problem}" for number, problem in bad[:_QUOTED_BAD_LINES])
        more = f"\n  … and {len(bad) - _QUOTED_BAD_LINES} more" if len(bad) > _QUOTED_BAD_LINES else ""
        raise TraceError(f"{path}: {len(bad)} malformed row(s) in the request sequence:\n{quoted}{more}")
    if not times:
        raise TraceError(f"{path}: the request sequence has no rows")
    offsets = np.array(times, dtype=np.float64)
    return RequestSequence(path=path, offsets_s=offsets - offsets[0], models=tuple(models))


def _read_rows(path: Path, what: str) -> list[tuple[int, list[str]]]:
    """The CSV's rows with their line numbers; an unreadable file is a TraceError."""
    try:
        with path.open(newline="") as stream:
            return list(enumerate(csv.reader(stream), start=1))
    except OSError as exc:
        raise TraceError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise TraceError(f"{path}: not a CSV text file: {exc}") from None


def _parse(field: str) -> float | None:
    """Seconds since an arbitrary origin, or None when the field is not a timestamp."""
    text = field.strip()
    try:
        value = float(text)
    except ValueError:
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            return None
        value = (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()
    return value if math.isfinite(value) else None


def _bad_lines_message(path: Path, bad: list[tuple[int, str]]) -> str:
    quoted = "\n".join(f"  line {number}: {text[:80]!r}" for number, text in bad[:_QUOTED_BAD_LINES])
    more = f"\n  … and {len(bad) - _QUOTED_BAD_LINES} more" if len(bad) > _QUOTED_BAD_LINES else ""
    return (
        f"{path}: {len(bad)} line(s) without a timestamp in the first column:\n{quoted}{more}\n"
        "fix the file, or pass --skip-bad-lines to replay the good lines and count the rest"
    )
