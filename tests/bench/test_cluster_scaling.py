"""`benchmarks/cluster/scaling.py` at its smallest: one and (on two CPUs or more) two node servers sharing the ports,
short perf_analyzer windows, to check that it runs and what it records (its figures are the benchmark's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.perf_load import PerfAnalyzer
from tests.server_utils import ROOT


@pytest.mark.slow
def test_the_scaling_benchmark_runs_each_server_count_on_its_own_cores(
    tmp_path: Path, perf_analyzer: PerfAnalyzer
) -> None:
    counts = [1, 2] if len(os.sched_getaffinity(0)) >= 2 else [1]
    output = tmp_path / "scaling.json"
    command = [sys.executable, "-m", "benchmarks.cluster.scaling", "--quick", "--request-count", "200"]
    command += ["--groups", str(max(counts)), "--perf-venv", str(perf_analyzer.binary.parent.parent)]
    done = subprocess.run([*command, "--output", str(output)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(output.read_text())
    assert report["settings"]["servers"] == counts and len(report["settings"]["groups"]) == max(counts)
    assert [(r["servers"], r["case"]) for r in report["runs"]] == [
        (k, c) for k in counts for c in ("cnn_rest", "mlp_grpc")
    ]
    for k, commands in report["server_commands"].items():
        assert len(commands) == int(k) and all("--reuse-port" in c for c in commands)
        assert [c.split("--cpus ")[1].split()[0] for c in commands] == report["settings"]["groups"][: int(k)]
    for run in report["runs"]:
        assert run["throughput_rps"] > 0 and len(run["server_cores_each"]) == run["servers"]
        assert all(cores > 0.05 for cores in run["server_cores_each"]), run["server_cores_each"]  # each took load
    for entries in report["cases"].values():
        assert entries["1"]["ratio"] == 1.0 and all(entries[str(k)]["ratio"] > 0 for k in counts)
    assert report["bar"]["pass"] is None and "not measured" in report["bar"]["note"]  # no 4 groups of 4 here
    assert output.with_suffix(".png").exists() and "| cnn_rest | 1 |" in done.stdout
