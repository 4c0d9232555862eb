"""Benchmarks that drive real servers with tritonclient or adaserve's load generator, and the CPU form of the stream
benchmark, each at its smallest, to check that it runs end to end and what it records (their figures are the
benchmarks', not these tests')."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import http_compression, priority, stream_concurrency, stream_profiles
from tests.bench.factories import can_unshare, positive, recorded, run_benchmark
from tests.server_utils import ROOT


@pytest.mark.slow
@pytest.mark.skipif(not can_unshare(), reason="needs a network namespace (unshare -rn) to shape loopback")
def test_http_compression(tmp_path: Path) -> None:
    """A subprocess: the benchmark re-runs itself in a network namespace of its own anyway. Long (~60 s on 2 cores):
    two servers, and every case on three links."""
    output = tmp_path / "http_compression.json"
    command = [sys.executable, "-m", "benchmarks.http_compression", "--quick", "--requests", "3"]
    done = subprocess.run([*command, "--output", str(output)], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    report = recorded(output, "benchmarks.http_compression")
    assert report["settings"]["requests_per_run"] == 3 and report["settings"]["mtu"] == 1500
    links, cases, codings = http_compression.LINKS, http_compression.CASES, http_compression.CODINGS
    assert len(report["runs"]) == len(links) * len(cases) * len(codings)  # one repeat
    for run in report["runs"]:
        assert run["requests"] == 3 and positive(run["p50_ms"], run["p99_ms"], run["wire_bytes_per_request"]), run
    for cell in report["cells"]:
        assert positive(cell["p50_ratio"], cell["wire_ratio"])
    levels = [level for row in report["zlib_levels"] for level in row["levels"].values()]
    assert levels and all(positive(level["ratio"], level["us"]) for level in levels)


@pytest.mark.slow
def test_priority(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    output = tmp_path / "priority.json"
    args = ["--quick", "--loads", "0.5", "--phase-s", "1", "--output", str(output)]
    run_benchmark(monkeypatch, tmp_path, priority, *args)
    report = recorded(output, "benchmarks.priority")
    assert positive(report["capacity_rps"])
    assert [run["entry"] for run in report["runs"]] == list(priority.ENTRIES)
    for run in report["runs"]:
        assert run["requests"] > 0 and run["ok"] > 0 and positive(run["throughput_rps"]), run
        assert positive(run[priority.HIGH]["p50_ms"], run[priority.LOW]["p50_ms"])
    assert [row["load"] for row in report["comparisons"]] == [0.5]


def test_stream_concurrency_on_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU form: threads with no streams, which checks the script, not the GPU premise it measures."""
    output = tmp_path / "stream_concurrency.json"
    args = ["--device", "cpu", "--model", "resnet18", "--rows", "2", "--repeats", "1", "--output", str(output)]
    run_benchmark(monkeypatch, tmp_path, stream_concurrency, *args)
    report = recorded(output, "benchmarks.stream_concurrency", png=False)
    assert report["settings"]["device"] == "cpu"
    assert [(s["workers"], s["rows_each"]) for s in report["splits"]] == [(1, 2), (2, 1)]
    for split in report["splits"]:
        assert positive(split["together_ms"], split["one_alone_ms"], split["vs_one_at_a_time"])
    assert report["splits"][0]["vs_one_batch"] == 1.0


def test_stream_profiles_on_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU form (threads with no streams) of the GPU check's step: a profile and a choice per target."""
    output = tmp_path / "stream_profiles.json"
    run_benchmark(
        monkeypatch, tmp_path, stream_profiles, "--device", "cpu", "--models", "mlp", "--quick", "--output", str(output)
    )
    report = recorded(output, "benchmarks.stream_profiles", png=False)
    (mlp,) = report["models"]
    assert mlp["profile"]["key"]["device"].startswith("cpu: ") and len(mlp["profile"]["cells"]) == 6 * 5
    assert (tmp_path / "stream_profiles" / "mlp" / "stream_profile.json").exists()
    for target, choice in mlp["choices"].items():
        assert choice["max_inflight"] == sum(choice["granularities"]), target
        assert choice["meets_target"] == (choice["expected_latency_ms"] <= float(target)), target
