"""The shared-cores benchmark at its smallest (one rate, one-second runs, a lighter heavy model), in a file of its own:
the longest of the perf_analyzer smoke tests, it would hold one pytest-xdist worker (which takes a file at a time)
for as long as the other four together. Its figures are the benchmark's, not this test's."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import shared_cores
from benchmarks.perf_load import PerfAnalyzer
from tests.bench.factories import positive, recorded, run_benchmark


@pytest.mark.slow
def test_shared_cores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, perf_analyzer: PerfAnalyzer) -> None:
    monkeypatch.setattr(shared_cores, "HEAVY_ROUNDS", 300)  # a heavy batch of ~1.5 ms, not 28: the mixed part's cost
    output = tmp_path / "shared_cores.json"
    perf = str(perf_analyzer.binary.parent.parent)
    args = ["--quick", "--rates", "60", "--duration", "1", "--perf-venv", perf, "--output", str(output)]
    run_benchmark(monkeypatch, tmp_path, shared_cores, *args)
    report = recorded(output, "benchmarks.shared_cores")
    assert report["settings"]["mixed"]["heavy_rounds"] == 300
    assert [run["entry"] for run in report["runs"]] == list(shared_cores.ENTRIES)
    assert [run["entry"] for run in report["mixed_runs"]] == list(shared_cores.MIXED)
    for run in report["runs"] + report["mixed_runs"]:
        assert run["failed"] < run["requests"] and len(run["clients"]) == 2, run
        assert positive(run["mean_ms"], run["p50_ms"], run["p99_ms"], run["rows_per_batch"])
    assert set(report["cases"]["60"]) >= set(shared_cores.ENTRIES)  # and the ratios between them
