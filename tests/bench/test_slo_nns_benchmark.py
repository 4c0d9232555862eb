"""The SLO-NNs benchmark at its smallest (one epoch of the small MLP on 10,000 rows, a few hundred inputs), to check
that it runs end to end and what it records; its figures are the benchmark's, not this test's."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server_utils import ROOT


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_slo_nns_benchmark_runs_every_step_and_judges_its_bar(tmp_path: Path) -> None:
    output = tmp_path / "slo_nns.json"
    command = [sys.executable, "-m", "benchmarks.slo_nns.run", "--smoke", "--models", "mlp112", "--no-progress"]
    command += ["--seeds", "3,4"]
    command += ["--repository", str(tmp_path / "models"), "--output", str(output)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(output.read_text())
    assert report["machine"]["commit"] and "benchmarks.slo_nns.run --smoke" in report["command"]
    small = report["models"]["mlp112"]
    assert (
        small["activator"]["built"]["options"]["gate"] is True and small["activator"]["built"]["options"]["seed"] == 3
    )
    methods = {row["method"]: row for row in small["aclo"]["rows"]}
    assert {"dense", "torch", "exact", "aclo_0.003"} <= set(methods)
    assert all(math.isfinite(row["mean_ms"]) and row["mean_ms"] > 0 for row in methods.values())
    assert [run["busy_processes"] for run in small["lcao"]["runs"]] == [0, 1]
    served = {row["method"]: row for row in small["server"]["rows"]}
    assert served["aclo_0.003"]["mean_k"] > 0 and served["plain"]["accuracy"] > 0.5
    seeds = report["seeds"]
    assert [seed["seed"] for seed in seeds] == [3, 4]
    assert seeds[0]["activators"]["mlp112"]["folder"] != seeds[1]["activators"]["mlp112"]["folder"]  # fresh builds
    first = seeds[0]["figures"]["aclo_small_never_slower"]
    assert first == {name: methods["dense"]["mean_ms"] / r["mean_ms"] for name, r in methods.items() if name in first}
    bar = report["bars"]["aclo_small_never_slower"]
    assert set(bar["mean_latency_ratio"]) == {name for name in methods if name.startswith("aclo_")}
    for name, ratio in bar["mean_latency_ratio"].items():  # the median of two seeds: halfway between them
        assert ratio == pytest.approx(sum(seed["figures"]["aclo_small_never_slower"][name] for seed in seeds) / 2)
    assert bar["pass"] == (min(bar["mean_latency_ratio"].values()) >= 1.0)
    served_bar = report["bars"]["aclo_small_never_slower_served"]
    assert served_bar["per_seed"] == [seed["figures"]["aclo_small_never_slower_served"] for seed in seeds]
    assert {path.name for path in tmp_path.glob("*.png")} == {
        f"slo_nns.{kind}.png" for kind in ("accuracy", "aclo", "lcao")
    }
