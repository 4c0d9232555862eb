"""The Packrat benchmarks at their smallest, on the small MLP every step runs in seconds (`mlp` in
`benchmarks/packrat/models.py`, or the example's): the speedup benchmark at B = 2 (profile, plan, in-process and end
to end), the reconfiguration timeline with phases of a second or two, and the default-on benchmark with two
hand-written sets and windows of seconds (its background profiles need not settle in them). They check that each runs
end to end and what it records; the figures are the benchmarks', not these tests' (on a shared machine anything may be
slower)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from adaserve.engine.worker_sets import DEFAULT_SET
from benchmarks.packrat import default, reconfiguration, speedup
from benchmarks.perf_load import PerfAnalyzer
from tests.bench.factories import positive, recorded, run_benchmark


@pytest.fixture(autouse=True)
def _omp_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both benchmarks set these for the processes they start; set here first, they are put back after the test."""
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.mark.slow
def test_speedup_profiles_plans_and_measures_both_sides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    output = tmp_path / "speedup.json"
    args = ["--quick", "--models", "mlp", "--batches", "2", "--threads", "2", "--profile-max-batch", "2"]
    args += ["--max-repeats", "1", "--budget-s", "0.1", "--attempts", "1", "--output", str(output)]
    run_benchmark(monkeypatch, tmp_path, speedup, *args)
    report = recorded(output, "benchmarks.packrat.speedup")
    model = report["models"]["mlp"]
    assert model["profile"]["batches"] == [1, 2] and set(model["profile"]["latency_ms"]) == {
        f"t={t},b={b}" for t in (1, 2) for b in (1, 2)
    }
    (row,) = model["rows"]
    assert row["batch"] == 2 and sum(i * b for i, _, b in row["plan"]) == 2
    if model["profile"]["unstable"] is None:
        assert positive(row["expected"]["fat_ms"], row["expected"]["packrat_ms"])
    else:  # a busy machine left a cell unstable: the plan is the stated default, with nothing expected of it
        assert row["plan"] == [[1, 2, 2]] and row["expected"]["packrat_ms"] is None
    for part in ("in_process", "end_to_end"):
        assert positive(row[part]["fat_ms"], row[part]["packrat_ms"], row[part]["speedup"]), row[part]
        assert [len(row[part]["samples"][side]) for side in speedup.SIDES] == [1, 1]
    assert row["end_to_end_matches_plan"] in (True, False) and model["server"]
    assert model["summary"]["all_b"]["batches"] == [2] and model["summary"]["b_ge_8"]["batches"] == []
    assert report["bars"] == {"all_pass": False}  # no B ≥ 8 measured: nothing passes


@pytest.mark.slow
def test_reconfiguration_calibrates_both_sets_and_runs_the_stepped_timeline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    output = tmp_path / "reconfiguration.json"
    args = [
        "--quick",
        "--model",
        "mlp",
        "--phases-s",
        "1,2,1",
        "--calibration-s",
        "1",
        "--attempts",
        "1",
        "--quiet-s",
        "0",
    ]
    run_benchmark(monkeypatch, tmp_path, reconfiguration, *args, "--output", str(output))
    report = recorded(output, "benchmarks.packrat.reconfiguration")
    assert report["model"]["name"] == "mlp_auto" and set(report["entries"]) == {"mlp_auto", "mlp_set8", "mlp_set64"}
    calibration = report["calibration"]
    assert set(calibration) == {"8", "64"}
    assert all(positive(c["requests_per_s"], c["mean_ms"]) and c["errors"] == 0 for c in calibration.values())
    assert [(phase["from_s"], phase["to_s"]) for phase in report["phases"]] == [(0.0, 1.0), (1.0, 3.0), (3.0, 4.0)]
    assert report["summary"]["requests"] == sum(phase["requests"] for phase in report["phases"]) > 0
    assert report["summary"]["ok"] > 0 and report["failed_requests"]["server_failures"] == 0
    assert report["initial_worker_set"]["batch"] == 8 and report["final_worker_set"]["workers"]
    assert report["polls"] and set(report["timeline"]) >= {"t_s", "requests", "mean_ms"}


@pytest.mark.slow
def test_default_on_sweeps_hand_written_sets_and_follows_both_profiles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, perf_analyzer: PerfAnalyzer
) -> None:
    output = tmp_path / "default.json"
    args = ["--quick", "--model", "mlp", "--sets", "fat,default", "--window-s", "4", "--chunk-s", "2"]
    args += ["--measure-s", "2", "--poll-s", "1", "--quiet-s", "0"]
    args += ["--perf-venv", str(perf_analyzer.binary.parent.parent), "--output", str(output)]
    run_benchmark(monkeypatch, tmp_path, default, *args)
    report = recorded(output, "benchmarks.packrat.default")
    assert set(report["sweep"]) == {"fat", "default"} and report["load"]["concurrency"] == 16
    rate = 0.5 * report["sweep"]["default"]["requests_per_s"]  # the window's traffic: half what the default served
    assert report["window_load"] == {"kind": "poisson", "rate": round(rate, 1)} or not rate
    assert report["sweep"]["fat"]["worker_set"]["workers"] == [
        [report["model"]["max_batch_size"], len(os.sched_getaffinity(0))]
    ]
    assert all(m["runs"] and m["worker_set"]["planner"] for m in report["sweep"].values())
    for key, hog in (("packrat", False), ("packrat_hog", True)):
        run = report[key]
        assert run["initial"]["planner"] == "default" and "background" in run["initial"]["reason"], run["initial"]
        assert run["chunks"] and run["samples"] and run["reached"]["runs"]
        assert run["changes"][0]["t_s"] == run["samples"][0]["t_s"] and "background" in run["changes"][0]["background"]
        assert run["switched"] is (run["switched_at_s"] is not None)  # on a busy machine it may not switch: a result
        assert (run["hog"] is not None) is hog
    assert report["packrat_hog"]["hog"]["processes"] == len(os.sched_getaffinity(0))
    assert report["default_after_hog"]["worker_set"]["reason"] == DEFAULT_SET
    bars = report["bars"]
    assert set(bars) == {"reaches_best", "hog_never_slower"} and all(isinstance(b["pass"], bool) for b in bars.values())
    assert bars["reaches_best"]["best_set"] in report["sweep"]
