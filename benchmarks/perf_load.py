"""Triton's C++ perf_analyzer as a benchmark's load generator, its requests read back as adaserve.bench records.

On two cores a Python generator takes CPU from the server it measures and adds its own time to every request, which
narrows every latency ratio and caps every throughput at what the generator can send (the elastic benchmark's
policies once "reached" the same 3,964 req/s). perf_analyzer replays the same schedule instead: adaserve.bench draws
the arrival times from the workload, perf_analyzer keeps their gaps (`--request-intervals`), and its profile export
gives each request's send and answer time. Those become `RequestRecord`s and an adaserve.bench `Summary`, so phases,
plots and `compare` read either generator's runs alike.

Latency is taken from each request's scheduled time, as adaserve.bench takes it: a request perf_analyzer sends late
still counts its wait. A scheduled request missing from the export (perf_analyzer stopped on an error) is an error
record, never dropped.
"""

from __future__ import annotations

import json
import resource
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from adaserve.bench import BenchResult
from adaserve.bench.results import RequestRecord, Status, describe_machine
from adaserve.bench.schedules import create_schedule
from adaserve.bench.summary import summarize
from adaserve.bench.workload import ClosedSpec, Workload

#: A run's requests may be sent this late (p99) and it still measures the server (adaserve.bench's default).
MAX_LATENESS_MS = 10.0
#: perf_analyzer's sending threads for an open loop: each has one request in flight (its sync HTTP client), so this
#: bounds the requests in flight. With 64, a 3,950 req/s schedule whose latency spiked to 40 ms was sent 26 ms late
#: (p99) and the run refused; with 256 the same run was 1.4 ms late.
OPEN_LOOP_THREADS = 256


@dataclass(frozen=True)
class PerfAnalyzer:
    """The perf_analyzer binary of a venv (benchmarks/perf_analyzer_env.sh) and the environment it runs in.
    `judge_stability` False: closed loops accept their first windows whatever their spread, and a run starts without
    waiting for a quiet machine (a smoke run, whose figures are not claimed; on a busy machine perf_analyzer would
    otherwise try ten times and give up, and each run would first wait its 10 s for a quiet second in vain)."""

    binary: Path
    env: dict[str, str]
    judge_stability: bool = True

    @classmethod
    def find(cls, venv: Path, *, judge_stability: bool = True) -> PerfAnalyzer:
        binary = venv / "bin" / "perf_analyzer"
        cuda = sorted(venv.glob("lib/python3*/site-packages/nvidia/cuda_runtime/lib"))
        if not binary.is_file() or not cuda:
            raise SystemExit(f"no perf_analyzer in {venv}: run benchmarks/perf_analyzer_env.sh first")
        return cls(binary, {"LD_LIBRARY_PATH": str(cuda[0]), "PATH": "/usr/bin:/bin"}, judge_stability)

    def shell_text(self, arguments: list[str]) -> str:
        """The command as a shell line, for a result file."""
        return f"LD_LIBRARY_PATH={self.env['LD_LIBRARY_PATH']} {self.binary} " + " ".join(arguments)


def run_perf_analyzer(
    perf: PerfAnalyzer, url: str, workload: Workload, scratch: Path, *, protocol: str = "http"
) -> BenchResult:
    """One bounded run of `workload` (one request kind, batch 1) against the server at `url` (host:port)."""
    if len(workload.requests) != 1:
        raise ValueError("perf_analyzer sends one request kind; the workload has " + str(len(workload.requests)))
    model = workload.requests[0].model
    scratch.mkdir(parents=True, exist_ok=True)
    export = scratch / "perf_analyzer.export.json"
    export.unlink(missing_ok=True)
    arguments = ["-m", model, "-u", url, "-i", protocol, "-b", "1", "--profile-export-file", str(export)]
    # The run is perf_analyzer's measurement, never judged for stability (-s 1000 accepts any spread).
    arguments += ["-s", "1000"]
    if isinstance(workload.load, ClosedSpec):
        if workload.duration_s is None:
            raise ValueError("a closed loop through perf_analyzer needs duration_s")
        schedule, arrivals = None, None
        # A timed closed loop needs three windows (with one perf_analyzer refuses it as unstable): a third each.
        arguments += ["--concurrency-range", str(workload.load.concurrency), "--measurement-mode", "time_windows"]
        arguments += ["--measurement-interval", str(round(workload.duration_s * 1000 / 3)), "-r", "3"]
    else:
        schedule = create_schedule(workload.load)
        arrivals = schedule.arrivals(workload.duration_s, workload.max_requests)
        intervals = scratch / "perf_analyzer.intervals.txt"
        gaps_us = np.maximum(1, np.round(np.diff(arrivals, prepend=0.0) * 1e6)).astype(np.int64)
        intervals.write_text("\n".join(map(str, gaps_us)) + "\n")
        arguments += ["--request-intervals", str(intervals), "--max-threads", str(OPEN_LOOP_THREADS)]
        # One window of exactly the scheduled requests.
        arguments += ["--measurement-mode", "count_windows", "--measurement-request-count", str(len(arrivals))]
        arguments += ["-r", "1"]
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    children, began = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    timeout_s = 120.0 + 3 * (workload.duration_s or 0.0)
    try:
        command = [str(perf.binary), *arguments]
        done = subprocess.run(command, env=perf.env, capture_output=True, text=True, timeout=timeout_s)
        failure = None if done.returncode == 0 else f"perf_analyzer exited {done.returncode}: {_tail(done)}"
    except subprocess.TimeoutExpired:
        failure = f"perf_analyzer ran past {timeout_s:.0f} s"
    wall_s = time.monotonic() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
    sent, answered = _exported(export)
    records = _records(model, arrivals, sent, answered)
    window_s = float(arrivals[-1]) if arrivals is not None and len(arrivals) else (workload.duration_s or 0.0)
    summary = summarize(
        records,
        open_loop=arrivals is not None,
        asked_requests=schedule.expected(window_s) if schedule is not None else None,
        window_s=window_s,
        cpu_s=cpu_s,
        wall_s=wall_s,
        max_lateness_ms=MAX_LATENESS_MS,
        failure=failure,
    )
    return BenchResult(
        machine=describe_machine(),
        command=[perf.shell_text(arguments)],
        started_at=started,
        config={
            "generator": "perf_analyzer",
            "url": url,
            "protocol": protocol,
            "workload": workload.model_dump(mode="json"),
        },
        failure=failure,
        records=records,
        summary=summary,
    )


def _exported(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Send and answer times (ns since the epoch) of every request in the export, in send order. The export also
    holds each answer's output bytes as text, which are not UTF-8: they are read past, never used."""
    if not path.is_file():
        return np.empty(0, np.int64), np.empty(0, np.int64)
    data: dict[str, Any] = json.loads(path.read_bytes().decode("utf-8", "replace"))
    requests = [r for experiment in data["experiments"] for r in experiment["requests"]]
    pairs = sorted((r["timestamp"], r["response_timestamps"][-1]) for r in requests if r["response_timestamps"])
    times = np.array(pairs, np.int64).reshape(-1, 2)
    return times[:, 0], times[:, 1]


def _records(model: str, arrivals: np.ndarray | None, sent: np.ndarray, answered: np.ndarray) -> list[RequestRecord]:
    """One record per scheduled request (open loop) or per exported one (closed loop). The i-th send is the i-th
    arrival's; requests perf_analyzer sent after the schedule ended (it loops the intervals until its window closes)
    are not part of the run.

    The export does not say when perf_analyzer's schedule began. It never sends a request before its time, so the
    schedule began where the earliest send relative to its arrival puts it, and every request's lateness counts from
    there. (Placing the first send at the first arrival, as this did before, took the first request as on time:
    replaying the Azure trace, perf_analyzer sent it 0.4 ms late and every other request on time, and every latency
    of the run was 0.4 ms short; in one run of the elastic benchmark, 3 ms short, which made its mean negative.)"""
    count = len(arrivals) if arrivals is not None else len(sent)
    paired = min(count, len(sent))
    if arrivals is not None and paired:
        origin = int(np.min(sent[:paired] - np.round(arrivals[:paired] * 1e9).astype(np.int64)))
    else:
        origin = int(sent[0]) if len(sent) else 0  # a closed loop: each request is scheduled when it was sent
    send_s = (sent - origin) / 1e9
    done_s = (answered - origin) / 1e9
    records = []
    for i in range(count):
        scheduled = float(arrivals[i]) if arrivals is not None else float(send_s[i])
        if i >= len(sent):
            missing = "missing from perf_analyzer's export"
            records.append(RequestRecord(id=i, model=model, scheduled_s=scheduled, status=Status.ERROR,
                                         error_kind="not_answered", error=missing))  # fmt: skip
            continue
        records.append(
            RequestRecord(
                id=i,
                model=model,
                scheduled_s=scheduled,
                sent_s=float(send_s[i]),
                done_s=float(done_s[i]),
                latency_ms=(float(done_s[i]) - scheduled) * 1e3,
                status=Status.OK,
            )
        )
    return records


def _tail(done: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in (done.stdout + done.stderr).splitlines() if "not supported with JSON" not in line]
    return " | ".join(lines[-6:])
