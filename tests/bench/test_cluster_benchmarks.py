"""The cluster benchmarks at their smallest, to check that they run and what they record (their figures are the
benchmarks', not these tests'): forwarding between two node servers without Ray, and adaserve's cluster against
Ray Serve's (skipped where `benchmarks/foreign_env.sh ray-cluster` has not made Ray Serve's venv)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.cluster.forwarding import pin_layout
from benchmarks.perf_load import PerfAnalyzer
from tests.bench.factories import can_unshare
from tests.server_utils import ROOT


def _perf_venv(perf: PerfAnalyzer) -> str:
    return str(perf.binary.parent.parent)


def test_the_pin_layout_gives_the_client_and_the_forwarding_node_one_core_and_the_holder_the_rest() -> None:
    assert pin_layout([0]) is None
    assert pin_layout([0, 1]) == {"client": [0], "a": [0], "b": [1]}
    assert pin_layout([2, 3, 5]) == {"client": [2], "a": [2], "b": [3, 5]}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_forwarding_benchmark_runs_and_records_both_routes(tmp_path: Path, perf_analyzer: PerfAnalyzer) -> None:
    output = tmp_path / "forwarding.json"
    command = [sys.executable, "-m", "benchmarks.cluster.forwarding", "--quick", "--request-count", "200"]
    command += ["--perf-venv", _perf_venv(perf_analyzer), "--output", str(output)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(output.read_text())
    assert len(report["runs"]) == 8 and {r["server"] for r in report["runs"]} == {"direct", "via_a"}
    answered = [r for r in report["runs"] if "throughput_rps" in r]
    assert len(answered) >= 6, [r["stdout_tail"] for r in report["runs"] if "throughput_rps" not in r]
    for run in answered:
        assert run["requests"] >= 200 and run["cpu_us_per_request"]["a" if run["server"] == "via_a" else "b"] > 0
    assert set(report["cases"]) == {"http_c1", "http_c8", "grpc_c1", "grpc_c8"}
    assert len(report["bars"]) == 8 and all(bar["pass"] in (True, False, None) for bar in report["bars"].values())
    assert output.with_suffix(".png").exists() and "| REST c=1 |" in done.stdout


def _ray_serve_venv() -> Path | None:
    python = ROOT / ".venv-ray-cluster" / "bin" / "python"
    if not python.is_file():
        return None
    probe = subprocess.run([str(python), "-c", "import ray.serve"], capture_output=True)
    return python if probe.returncode == 0 else None


@pytest.mark.slow
@pytest.mark.skipif(_ray_serve_venv() is None, reason="no Ray Serve: run benchmarks/foreign_env.sh ray-cluster")
@pytest.mark.skipif(not can_unshare(), reason="needs a network namespace (unshare -rn) to keep Ray on loopback")
@pytest.mark.timeout(900)
def test_the_ray_serve_comparison_runs_both_clusters(tmp_path: Path, perf_analyzer: PerfAnalyzer) -> None:
    pytest.importorskip("ray", reason="adaserve's cluster needs the 'cluster' extra (Ray)")
    output = tmp_path / "versus_ray_serve.json"
    command = [sys.executable, "-m", "benchmarks.cluster.versus_ray_serve", "--quick", "--models", "mlp,cnn"]
    command += ["--request-count", "200", "--perf-venv", _perf_venv(perf_analyzer), "--output", str(output)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=840)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads(output.read_text())
    assert {r["server"] for r in report["runs"]} == {"ray", "adaserve"}
    assert report["rounds"][0]["same_answers"] == {"mlp": True, "cnn": True}
    assert sum(len(models) for models in report["rounds"][0]["adaserve"]["resident"]) >= 2
    assert report["cases"]["mlp"]["ray"]["throughput_rps"] and report["cases"]["mlp"]["adaserve"]["throughput_rps"]
    # the mixed load: both models at once, concurrency 8 shared 4 + 4, for each system
    assert [
        (mix["server"], {m: run["concurrency"] for m, run in mix["models"].items()}) for mix in report["mixed_runs"]
    ] == [
        ("adaserve", {"mlp": 4, "cnn": 4}),
        ("ray", {"mlp": 4, "cnn": 4}),
    ]
    for case in ("mixed:mlp", "mixed:cnn", "mixed:all"):
        assert report["cases"][case]["ray"]["throughput_rps"] and report["cases"][case]["adaserve"]["throughput_rps"]
    whole = report["cases"]["mixed:all"]["adaserve"]["throughput_rps"]
    parts = [report["cases"][f"mixed:{m}"]["adaserve"]["throughput_rps"] for m in ("mlp", "cnn")]
    assert whole == pytest.approx(sum(parts))
    assert output.with_suffix(".png").exists() and "| mlp |" in done.stdout and "| mixed:all |" in done.stdout
