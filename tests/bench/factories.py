"""Small builders of records, results and CLI arguments for the bench tests."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from adaserve.bench.cli import register
from adaserve.bench.results import BenchResult, RequestRecord, Status, describe_machine
from adaserve.bench.runner import BenchConfig
from adaserve.bench.summary import summarize
from adaserve.bench.workload import parse_workload

#: Niceness of the server under test in the bench tests and the generator-fidelity benchmark (the senders run at 0):
#: on 2 cores the generator must not queue behind the server it measures.
SERVER_NICENESS = 10
#: Rounds of the slow model's matmul loop: about 15 ms per request on this project's 2-core machine.
SLOW_ROUNDS = 3000
#: The shared data lie beside the project (../shared/data from the project root).
AZURE = Path(__file__).resolve().parents[3] / "shared/data/traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv"
needs_azure = pytest.mark.skipif(not AZURE.is_file(), reason="shared/data traces are not beside the project")


def record(
    index: int,
    scheduled: float,
    *,
    late_ms: float = 0.0,
    latency_ms: float | None = 10.0,
    status: Status = Status.OK,
    model: str = "mlp",
    kind: str | None = None,
) -> RequestRecord:
    """A request scheduled at `scheduled` s, sent `late_ms` later, answered `latency_ms` after it was scheduled."""
    sent = None if status is Status.NOT_SENT else scheduled + late_ms / 1000
    done = None if latency_ms is None or sent is None else scheduled + latency_ms / 1000
    return RequestRecord(
        id=index,
        model=model,
        scheduled_s=scheduled,
        sent_s=sent,
        done_s=done,
        latency_ms=latency_ms if done is not None else None,
        status=status,
        error_kind=kind if status is not Status.OK else None,
        error="boom" if status is not Status.OK else None,
    )


def config(**workload: Any) -> BenchConfig:
    data = {"requests": [{"model": "mlp"}], "load": {"kind": "poisson", "rate": 10}, "duration_s": 1.0, **workload}
    return BenchConfig(url="127.0.0.1:1", workload=parse_workload(data))


def result(records: list[RequestRecord], *, window_s: float = 1.0, cpu_s: float = 0.01, **workload: Any) -> BenchResult:
    """A finished open-loop result whose summary is computed from `records`."""
    cfg = config(**workload)
    summary = summarize(
        records,
        open_loop=True,
        asked_requests=10.0 * window_s,
        window_s=window_s,
        cpu_s=cpu_s,
        wall_s=window_s,
        max_lateness_ms=cfg.max_lateness_ms,
    )
    return BenchResult(
        machine=describe_machine(),
        command=["adaserve", "bench"],
        started_at="2026-01-01T00:00:00+00:00",
        config=cfg.model_dump(mode="json"),
        records=records,
        summary=summary,
    )


def parse_cli(*argv: str) -> argparse.Namespace:
    """`adaserve ...` arguments parsed the way the lead's main does, with bench registered."""
    parser = argparse.ArgumentParser(prog="adaserve")
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(list(argv))
