"""What a run measured, as typed records that round-trip through the result JSON file.

Every request gets a record, including those never sent (the generator fell behind) and those cancelled at the end,
so a report can always say what fraction of the asked load it covers.
"""

from __future__ import annotations

import os
import platform
from enum import StrEnum
from pathlib import Path
from typing import Any

import msgspec

#: Bumped when a field changes meaning, so `compare` can refuse files it would misread.
FORMAT_VERSION = 1


class Status(StrEnum):
    """How a request ended."""

    OK = "ok"
    ERROR = "error"
    NOT_SENT = "not_sent"
    CANCELLED = "cancelled"


class RequestRecord(msgspec.Struct, kw_only=True):
    """One request. Times are seconds from the start of the run; latency is measured from the scheduled time,
    so a generator that sends late cannot hide the wait (no coordinated omission)."""

    id: int
    model: str
    scheduled_s: float
    sent_s: float | None = None
    done_s: float | None = None
    latency_ms: float | None = None
    status: Status
    error_kind: str | None = None
    error: str | None = None
    parameters: dict[str, Any] = {}
    kind: int | None = None  # the workload's request kind (its index in `requests`); None in a sequence's order


class LatencyStats(msgspec.Struct, kw_only=True):
    """Latency of the answered requests, in milliseconds (numpy's linear-interpolation percentiles)."""

    count: int
    mean_ms: float | None
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    p999_ms: float | None
    max_ms: float | None


class GeneratorStats(msgspec.Struct, kw_only=True):
    """The load generator's own cost and punctuality, so a result can show that it measured the server."""

    cpu_s: float
    cpu_per_request_us: float | None
    cpu_utilization: float
    lateness_p50_ms: float | None
    lateness_p99_ms: float | None
    lateness_max_ms: float | None
    kept_up: bool


class Summary(msgspec.Struct, kw_only=True):
    """The figures a run is judged by. Throughput is answers per second over the span (first send to last answer);
    the asked (the schedule's nominal mean), scheduled (arrivals drawn) and sent rates are per second of the sending
    window, so Poisson noise shows as asked ≠ scheduled and a generator that falls behind as scheduled ≠ sent."""

    requests: int
    sent: int
    ok: int
    errors: int
    not_sent: int
    cancelled: int
    errors_by_kind: dict[str, int]
    span_s: float
    throughput_rps: float
    asked_rate_rps: float | None
    scheduled_rate_rps: float | None
    sent_rate_rps: float
    latency: LatencyStats
    per_model: dict[str, LatencyStats]
    generator: GeneratorStats
    valid: bool
    problems: list[str]
    per_kind: dict[str, LatencyStats] = {}  # by the workload's request kinds, when it lists more than one
    failed_per_kind: dict[str, int] = {}  # the same kinds' requests not answered (errors, not sent, cancelled)


class Machine(msgspec.Struct, kw_only=True):
    """Where the generator ran."""

    cpu_model: str
    cores: int
    platform: str
    python: str


class BenchResult(msgspec.Struct, kw_only=True):
    """One run: how it was asked for, where it ran, every request, and the summary."""

    format_version: int = FORMAT_VERSION
    machine: Machine
    command: list[str]
    started_at: str
    config: dict[str, Any]
    failure: str | None = None
    notes: list[str] = []
    records: list[RequestRecord]
    summary: Summary

    @property
    def valid(self) -> bool:
        return self.summary.valid


class ResultError(ValueError):
    """A result file that cannot be read; the message names the file."""


def describe_machine() -> Machine:
    """CPU model and core count from the OS."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return Machine(
        cpu_model=model, cores=os.cpu_count() or 1, platform=platform.platform(), python=platform.python_version()
    )


def write_result(result: BenchResult, path: Path) -> None:
    """Compact JSON: a long run has hundreds of thousands of records."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgspec.json.encode(result))


def read_result(path: Path) -> BenchResult:
    """A result file written by `write_result`, checked against the current format."""
    try:
        result = msgspec.json.decode(path.read_bytes(), type=BenchResult)
    except OSError as exc:
        raise ResultError(f"{path}: cannot read result: {exc.strerror or exc}") from None
    except msgspec.DecodeError as exc:
        raise ResultError(f"{path}: not an adaserve bench result: {exc}") from None
    if result.format_version != FORMAT_VERSION:
        raise ResultError(f"{path}: result format {result.format_version}, this version reads {FORMAT_VERSION}")
    return result
