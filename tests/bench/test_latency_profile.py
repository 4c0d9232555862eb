"""The latency profile benchmark at its smallest, to check that it runs and what it records (its figures are the
benchmark's, not this test's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.latency_profile import BAR_RATE, _print, _rates
from benchmarks.perf_load import PerfAnalyzer
from benchmarks.serving_overhead import open_loop_threads
from tests.server_utils import ROOT


def test_the_rates_are_the_shares_of_capacity_and_the_bar_rate_in_order() -> None:
    assert _rates(1000.0, (0.01, 0.5)) == [10.0, BAR_RATE, 500.0]
    assert _rates(None, (0.01,)) == [BAR_RATE]  # no capacity measured: the bar's rate alone


def test_an_open_loop_sends_from_enough_threads_for_ten_ms_of_arrivals() -> None:
    assert open_loop_threads(200) == 4 and open_loop_threads(3000) == 30


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_latency_profile_runs_every_server_and_protocol(tmp_path: Path, perf_analyzer: PerfAnalyzer) -> None:
    output = tmp_path / "latency_profile.json"
    command = [sys.executable, "-m", "benchmarks.latency_profile", "--quick", "--fractions", ""]
    command += ["--request-count", "200", "--window-s", "0.3", "--output", str(output)]
    command += ["--perf-venv", str(perf_analyzer.binary.parent.parent)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(output.read_text())
    assert set(report["profiles"]) == {
        "adaserve http",
        "rest_floor http",
        "adaserve grpc",
        "adaserve_process grpc",
        "grpc_floor grpc",
    }
    for protocol in ("http", "grpc"):
        assert report["rates"][protocol] == [BAR_RATE]  # no shares of capacity: no capacity run either
    assert report["capacity_runs"] == []
    answered = [r for r in report["runs"] if "throughput_rps" in r]
    assert len(answered) >= len(report["runs"]) - 2, [r["stdout_tail"] for r in report["runs"] if r not in answered]
    for profile in report["profiles"].values():  # a run perf_analyzer could not measure has no figure (None)
        c1_p50 = profile["closed_loop"]["c1"]["p50_ms"]
        assert (c1_p50 is None or c1_p50 > 0) and len(profile["open_loop"]) == 1
    assert set(report["bars"]) == {"rest_poisson_p50", "rest_poisson_p99", "grpc_c8_throughput", "grpc_c1_p50"}
    assert set(report["grpc_process_over_inline"]) == {"c8_throughput", "c1_p50"}
    assert output.with_suffix(".png").exists() and "bar rest_poisson_p50" in done.stdout
    assert "gRPC frontend in a process of its own over inline" in done.stdout


def test_a_run_perf_analyzer_could_not_measure_prints_as_a_dash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a busy machine an open-loop run can come back without figures; the table says so instead of failing."""
    unmeasured = {"offered_rps": 200.0, "p50_ms": 1.5, "p99_ms": None, "p50_over_c1_p50": None, "p99_over_c1_p50": None}
    closed = {"c1": {"throughput_rps": None, "p50_ms": None}}
    report = {
        "profiles": {"adaserve http": {"closed_loop": closed, "open_loop": [unmeasured]}},
        "bars": {"rest_poisson_p50": {"measured": None, "target": "<= 1.3x", "pass": False}},
        "floor_at_bar_rate": {
            "rest_floor_p50_over_c1_p50": 5.0,
            "rest_floor_added_p50_ms": None,
            "adaserve_added_p50_ms": None,
        },
        "grpc_process_over_inline": {"c8_throughput": 1.25, "c1_p50": None},
    }
    _print(report, tmp_path / "latency_profile.json")
    printed = capsys.readouterr().out
    assert "| 200 | 1.500 | - | - | - |" in printed and "adaserve adds +- ms" in printed
    assert "c=8 req/s 1.25×, c=1 p50 -" in printed
