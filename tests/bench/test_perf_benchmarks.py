"""The benchmarks made of perf_analyzer runs against real servers, each at its smallest (one repeat, concurrency 1,
short windows), to check that it runs end to end and what it records: a change that breaks one fails here, not
minutes into a recorded run. Their figures are the benchmarks', not these tests': a run whose windows perf_analyzer
could not stabilize on a busy machine is recorded as failed, which is allowed (its requests were answered)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from benchmarks import response_cache, serving_overhead, shared_memory, tls_overhead, trace_overhead
from benchmarks.perf_load import PerfAnalyzer
from tests.bench.factories import positive, recorded, run_benchmark

#: What perf_analyzer prints when its windows did not agree (on a busy machine): the requests were answered.
UNSTABLE = "Failed to obtain stable measurement"


def _smallest(
    module: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, perf: PerfAnalyzer, **fewer: tuple[Any, ...]
) -> dict[str, Any]:
    """`module` run with its constants in `fewer` cut down (cases, concurrencies), windows of 50 requests; its
    result, checked for what every result records."""
    for name, values in fewer.items():
        monkeypatch.setattr(module, name, values)
    output = tmp_path / "result.json"
    venv = str(perf.binary.parent.parent)
    run_benchmark(
        monkeypatch, tmp_path, module, "--quick", "--request-count", "50", "--perf-venv", venv, "--output", str(output)
    )
    return recorded(output, module.__name__)


def _answered(runs: list[dict[str, Any]], key: str, values: set[str]) -> None:
    """Every run of each of `values` (of `key`) reached its server: answered with figures, or refused only because
    perf_analyzer could not stabilize its windows on a busy machine (its requests were answered); some run was."""
    assert runs and all("returncode" in run and run["wall_s"] > 0 for run in runs)
    answered = [run for run in runs if run["returncode"] == 0]
    unstable = [run for run in runs if run not in answered and UNSTABLE in run["stdout_tail"]]
    assert len(answered) + len(unstable) == len(runs), [run["stdout_tail"] for run in runs if run not in answered]
    assert answered and {run[key] for run in runs} == values
    assert all(positive(run["throughput_rps"], run["p50_ms"], run["p99_ms"]) for run in answered)


@pytest.mark.slow
def test_tls_overhead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, perf_analyzer: PerfAnalyzer) -> None:
    report = _smallest(tls_overhead, tmp_path, monkeypatch, perf_analyzer, CONCURRENCIES=(1,))
    assert len(report["runs"]) == 4 and set(report["server_commands"]) == {"plain", "tls"}
    assert "--http-use-ssl" in report["server_commands"]["tls"]
    _answered(report["runs"], "server", {"plain", "tls"})
    assert set(report["cases"]) == {"http_c1", "grpc_c1"}


@pytest.mark.slow
def test_trace_overhead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, perf_analyzer: PerfAnalyzer) -> None:
    report = _smallest(trace_overhead, tmp_path, monkeypatch, perf_analyzer, CONCURRENCIES=(1,), PROTOCOLS=("grpc",))
    cases = set(trace_overhead.CASES) | set(trace_overhead.OTEL_CASES)
    _answered(report["runs"] + report["otel_runs"], "case", cases)
    assert report["otel_exports"] > 0  # the OpenTelemetry server's traces reached the collector
    assert report["spans"], "no traced request was matched to its run"


@pytest.mark.slow
def test_response_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, perf_analyzer: PerfAnalyzer) -> None:
    report = _smallest(response_cache, tmp_path, monkeypatch, perf_analyzer, CONCURRENCIES=(1,), PROTOCOLS=("grpc",))
    assert report["settings"]["distinct_images"]["distinct"] == response_cache.REQUESTS
    assert "--cache-config" in report["server_command"]
    assert len(report["runs"]) == 4
    _answered(report["runs"], "entry", set(response_cache.ENTRIES))


@pytest.mark.slow
def test_shared_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, perf_analyzer: PerfAnalyzer) -> None:
    report = _smallest(shared_memory, tmp_path, monkeypatch, perf_analyzer, SIZES=(64,))
    assert len(report["runs"]) == 4 and "--allow-client-shm" in report["server_command"]
    _answered(report["runs"], "mode", set(shared_memory.MODES))


@pytest.mark.slow
def test_serving_overhead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, perf_analyzer: PerfAnalyzer) -> None:
    report = _smallest(serving_overhead, tmp_path, monkeypatch, perf_analyzer, PROTOCOLS=("http", "grpc"))
    assert len(report["runs"]) == 4 and len(report["floor_runs"]) == 1
    _answered(report["runs"], "protocol", {"http", "grpc"})
    assert positive(report["in_process_limit"]["throughput_rps"], report["in_process_limit"]["p50_ms"])
    assert set(report["cases"]) == {"http_c1", "http_c8", "grpc_c1", "grpc_c8"}
    assert set(report["bars"]) == {"rest_c8_throughput", "rest_c1_p50", "grpc_c1_p50"}
