"""Small builders of records, results and CLI arguments for the bench tests."""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from adaserve.bench.cli import register
from adaserve.bench.results import BenchResult, RequestRecord, Status, describe_machine
from adaserve.bench.runner import BenchConfig
from adaserve.bench.summary import summarize
from adaserve.bench.workload import parse_workload
from benchmarks import perf_load

#: Niceness of the server under test in the bench tests and the generator-fidelity benchmark (the senders run at 0):
#: on 2 cores the generator must not queue behind the server it measures.
SERVER_NICENESS = 10
#: Rounds of the slow model's matmul loop: about 15 ms per request on this project's 2-core machine.
SLOW_ROUNDS = 3000
#: perf_analyzer's open-loop sending threads in a smoke run: enough for its few hundred requests per second, and each
#: of the benchmarks' 256 costs perf_analyzer ~40 ms to tear down (~10 s a run, for runs of a second).
SMOKE_OPEN_LOOP_THREADS = 16
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


def run_benchmark(monkeypatch: pytest.MonkeyPatch, scratch: Path, module: ModuleType, *argv: str) -> None:
    """Run a benchmark's `main` in this process as `python -m <module> argv` runs it (the command it records too),
    its scratch files under `scratch`, with no wait for a quiet machine and perf_analyzer's open loops on few threads:
    a smoke run checks that a benchmark runs and what it records, in seconds, not its figures. In-process, it spares
    a torch import per benchmark."""
    assert module.__file__ is not None
    monkeypatch.setattr(sys, "argv", [module.__file__, *argv])
    monkeypatch.setattr(perf_load, "OPEN_LOOP_THREADS", SMOKE_OPEN_LOOP_THREADS)
    for name, loaded in list(sys.modules.items()):
        if name.startswith("benchmarks."):
            if hasattr(loaded, "SCRATCH"):
                monkeypatch.setattr(loaded, "SCRATCH", scratch)
            if hasattr(loaded, "wait_for_quiet"):
                monkeypatch.setattr(loaded, "wait_for_quiet", _no_wait)
    assert module.main() in (0, None)


def _no_wait(max_wait_s: float, busy_cores: float = 0.3) -> dict[str, float]:
    return {"waited_s": 0.0, "busy_cores_before": 0.0}


def recorded(output: Path, module: str, *, png: bool = True) -> dict[str, Any]:
    """A smoke run's result file, checked for what every result records: the command that repeats it (naming the
    benchmark's module), the machine and the commit it ran at; with `png`, its plot beside it."""
    report = json.loads(output.read_text())
    assert f"-m {module}" in report["command"], report["command"]
    machine = report["machine"]
    assert machine["cores"] >= 1 and machine["python"] and len(machine["commit"]) == 40
    assert not png or output.with_suffix(".png").stat().st_size > 0
    return report


def positive(*values: Any) -> bool:
    """Whether every value is a finite number above 0 (a figure a run that worked has)."""
    return all(isinstance(v, int | float) and math.isfinite(v) and v > 0 for v in values)


def can_unshare() -> bool:
    """Whether a benchmark can run in a network namespace of its own (`unshare -rn`, and `ip` to bring lo up)."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    return subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode == 0


def gati_seed(gati_ms: float, agreement: float = 0.995) -> dict[str, Any]:
    """One seed of the GATI early-exit benchmark as `bars` reads it: the base model at 1.5 ms a row (its block chain
    at 1.6), GATI at `gati_ms` with `agreement` in both forms; 200 rows, each as fast as the others."""

    def method(latency_ms: float, agreement: float = 1.0) -> dict[str, Any]:
        return {
            "mean_ms": latency_ms,
            "p99_ms": latency_ms,
            "agreement": agreement,
            "latency_us": [latency_ms * 1e3] * 200,
        }

    forms = {name: method(gati_ms, agreement) for name in ("gati", "gati process")}
    return {"methods": {"base": method(1.5), "base chain": method(1.6), **forms}}
