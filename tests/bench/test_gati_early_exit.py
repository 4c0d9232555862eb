"""The GATI early-exit benchmark and the planner's replanning benchmark at their smallest
(`tests/bench/gati_smoke.py`), to check that each runs end to end and what it records; the figures are the
benchmarks', not these tests'. Both train the small base network; the second reuses its weights."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.gati import early_exit
from benchmarks.planner import models as planner_models
from benchmarks.planner import replanning
from tests.bench.factories import gati_seed, recorded, run_benchmark
from tests.bench.gati_smoke import SMALL_SPECIALISTS, small_gati


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with small_gati(tmp_path_factory.mktemp("gati-weights")):
        yield


@pytest.mark.slow
@pytest.mark.filterwarnings(  # its int8 baselines use torch's deprecated quantization, as the paper's did
    "ignore:torch.ao.quantization is deprecated:DeprecationWarning",
    "ignore::UserWarning:torch.ao",
)
def test_early_exit_measures_every_method_sweep_batch_and_the_server(
    small: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(early_exit, "QUICK", early_exit.Rows(40, 40, 40, 20))
    monkeypatch.setattr(early_exit, "DISTILL_ROWS", 500)
    monkeypatch.setattr(early_exit, "FINE_TUNE_ROWS", 500)
    monkeypatch.setattr(early_exit, "ACCURACY_ROWS", 1000)
    monkeypatch.setattr(early_exit, "ALPHAS", (0.0, 1.0))
    monkeypatch.setattr(early_exit, "BUDGET_FRACTIONS", (0.5, None))
    monkeypatch.setattr(early_exit, "BATCHES", (1, 2))
    run_benchmark(monkeypatch, tmp_path, early_exit, "--quick", "--models", "resnet", "--seeds", "5")
    report = recorded(tmp_path / "gati_early_exit.json", "benchmarks.gati.early_exit", png=False)
    resnet = report["models"]["resnet"]
    methods = resnet["methods"]
    assert {"base", "base chain", "gati", "gati process", "cascade", "distilled"} <= set(methods)
    assert all(methods[name]["requests"] == 40 for name in ("base", "gati", "gati process"))
    assert {key for key in resnet["sweeps"] if key.startswith("alpha")} == {"alpha 0", "alpha 1"}
    assert set(resnet["batching"]) == {"1", "2"}
    assert resnet["server"]
    (seed,) = resnet["seeds"]  # one seed here: a second costs a build (~20 s); test_the_bars_... covers three
    assert seed["seed"] == 5 and resnet["cache_set"]["settings"]["seed"] == 5
    assert seed["methods"] == {name: methods[name] for name in ("base", "base chain", "gati", "gati process")}
    bars = report["bars"]
    assert len(bars) == 4 and all(bar["pass"] in (True, False) for bar in bars)
    for speed, p99, name in ((bars[0], bars[1], "gati"), (bars[2], bars[3], "gati process")):
        figures = seed["figures"][name]
        base = min(methods["base"]["mean_ms"], methods["base chain"]["mean_ms"])
        assert figures["speedup"] == speed["speedup"] == base / methods[name]["mean_ms"]
        assert figures["p99_ratio"] == p99["p99_ratio"] and len(p99["p99_ratio_95"][0]) == 2
        assert "median of 1 seed" in speed["bar"] and "median of 1 seed" in speed["measured"]
    assert all((tmp_path / f"gati_early_exit.{kind}.png").stat().st_size > 0 for kind in ("latency", "sweeps"))


def test_the_bars_judge_the_median_seed_and_the_agreement_of_every_seed() -> None:
    bars = early_exit.bars({"seeds": [gati_seed(1.0), gati_seed(0.4), gati_seed(0.5)]})
    speed, p99 = bars[0], bars[1]
    assert speed["speedups"] == pytest.approx([1.5, 3.75, 3.0]) and speed["speedup"] == pytest.approx(3.0)
    assert speed["pass"] and "median of 3 seeds" in speed["bar"] and speed["measured"].startswith("3.00×")
    assert p99["p99_ratio"] == pytest.approx(0.5 / 1.5) and p99["pass"] and len(p99["p99_ratio_95"]) == 3
    one_short = early_exit.bars({"seeds": [gati_seed(1.0), gati_seed(0.4, agreement=0.98), gati_seed(0.5)]})[0]
    assert one_short["speedup"] == pytest.approx(3.0) and not one_short["pass"]  # the median met it, one seed not
    slow = early_exit.bars({"seeds": [gati_seed(2.0), gati_seed(0.4), gati_seed(1.6)]})
    assert not slow[0]["pass"] and not slow[1]["pass"]  # 0.94× the base, its p99 1.07× the base's


def test_a_result_from_before_seeds_is_judged_as_one_seed() -> None:
    bars = early_exit.bars(gati_seed(0.5))
    assert bars[0]["speedups"] == pytest.approx([3.0]) and "median of 1 seed" in bars[0]["bar"]


@pytest.mark.slow
def test_replanning_builds_the_query_and_measures_every_policy_slo_and_method(
    small: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in (planner_models, replanning):
        monkeypatch.setattr(module, "SPECIALISTS", SMALL_SPECIALISTS)
    monkeypatch.setattr(planner_models, "QUICK_ROWS", 400)
    monkeypatch.setattr(planner_models, "TIMED_CALLS", 20)
    monkeypatch.setattr(planner_models, "WARMUP_CALLS", 5)
    monkeypatch.setattr(planner_models, "ROUND_CALLS", 10)
    monkeypatch.setattr(planner_models, "VALIDATION_ROWS", 500)
    monkeypatch.setattr(replanning, "SLO_POINTS", 2)
    monkeypatch.setattr(replanning, "CALIBRATION_CALLS", 25)
    monkeypatch.setattr(replanning, "WARM_UP", 5)
    run_benchmark(monkeypatch, tmp_path, replanning, "--quick", "--rows", "6")
    report = recorded(tmp_path / "planner_replanning.json", "benchmarks.planner.replanning")
    assert set(report["build"]["models"]) == set(planner_models.MODELS)
    assert len(report["slos_ms"]) == 2 and report["settings"]["rows"] == 6
    cells = {(c["policy"], c["slo_ms"], c["method"]) for c in report["cells"]}
    assert cells == {(p, s, m) for p in replanning.POLICIES for s in report["slos_ms"] for m in replanning.METHODS}
    assert all(c["rows"] == 6 and 0 <= c["accuracy"] <= 1 for c in report["cells"])
    assert len(report["summary"]) == len(replanning.POLICIES) * 2
    reference = report["reference"]  # no routed row (a weak classify on six rows) leaves no accuracy on them
    routed_accuracy = [reference[f"{s.name}_on_routed_rows"] for s in SMALL_SPECIALISTS]
    assert all((a is None) == (reference["routed_rows"] == 0) for a in routed_accuracy), reference
