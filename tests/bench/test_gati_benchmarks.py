"""The GATI benchmarks of exploration and adaptation at their smallest (`tests/bench/gati_smoke.py`), to check that
each runs end to end and what it records; the figures are the benchmarks', not these tests'. The adaptation
benchmarks share one build of the small model's cache set."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from adaserve.adaptive.gati.adapt import AdaptSettings
from benchmarks.gati import adaptation, explore, fit_data, retraining, trigger, window_draw
from tests.bench.factories import positive, recorded, run_benchmark
from tests.bench.gati_smoke import SMALL_ADAPT, SMOKE_TARGET, TINY, small_gati


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with small_gati(tmp_path_factory.mktemp("gati-weights")):
        yield


@pytest.fixture(scope="module")
def built(small: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[adaptation.Build]:
    """The adaptation benchmarks' scratch model and cache set, built once (`adaptation.build`) and then handed to
    each of them in place of its own build: a build is most of a small run's time. Versions a benchmark deploys
    beside v1 stay; each starts from v1 or from what it deploys itself."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(adaptation, "SCRATCH", tmp_path_factory.mktemp("gati-adapt"))
        shared = adaptation.build(SMOKE_TARGET, quick=True)
    with pytest.MonkeyPatch.context() as patch:
        for module in (adaptation, retraining, trigger, window_draw):
            patch.setattr(module, "build", lambda target, quick: shared)
        yield shared


def test_explore_builds_measures_and_composes_the_example_model(
    small: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(explore, "ExploreSettings", SimpleNamespace(for_run=lambda quick: TINY))
    run_benchmark(monkeypatch, tmp_path, explore, "--quick", "--models", "mlp", "--targets", "0.9")
    report = recorded(tmp_path / "gati_explore.json", "benchmarks.gati.explore")
    model = report["models"]["mlp"]
    assert model["evaluate_rows"] > 0 and positive(model["whole"]["mean_us"], model["chain_without_caches"]["mean_us"])
    labels = {c["label"] for c in model["compositions"]}
    assert labels == {"built", *explore.STUDIES}
    assert set(model["chain_study"]) == {"0.9"}


def test_fit_data_builds_with_and_without_fit_data(
    small: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fit_data, "REPOSITORY", tmp_path / "fit-data")
    output = tmp_path / "gati_fit_data.json"
    run_benchmark(monkeypatch, tmp_path, fit_data, "--models", "mlp", "--output", str(output))
    report = recorded(output, "benchmarks.gati.fit_data")
    mlp = report["models"]["mlp"]
    assert set(mlp["builds"]) == {"validation", "fit data"}
    assert set(mlp["hit_rate_gain"]) == set(mlp["builds"]["validation"]["caches"])
    assert positive(mlp["expected_speedup_ratio"])


def _stream_checked(stream: dict[str, Any], chunks: int) -> None:
    """A served stream: every chunk on both sides, and each retraining's record."""
    assert [chunk["chunk"] for chunk in stream["chunks"]] == list(range(chunks))
    for chunk in stream["chunks"]:
        for side in ("static", "adapted"):
            assert 0 <= chunk[side]["hit_rate"] <= 1 and 0 <= chunk[side]["agreement"] <= 1
    for retrain in stream["retrains"]:
        assert retrain["warm"]["accepted"] in (True, False) and retrain["warm"]["rows"]["fit_predictor"]["window"] > 0
    assert stream["bar"]["adapted_never_below_static"] == (not stream["bar"]["chunks_below"])


def test_adaptation_serves_the_stream_static_and_adapted(
    built: adaptation.Build, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_benchmark(monkeypatch, tmp_path, adaptation, "--quick")
    report = recorded(tmp_path / "gati_adaptation.json", "benchmarks.gati.adaptation")
    assert report["settings"]["target"] == SMOKE_TARGET and report["cache_set"]["exits"]
    assert built.cache_set.composition(SMOKE_TARGET).exits
    _stream_checked(report, len(adaptation.schedule(quick=True)))
    assert report["retrains"], "the window filled and the monitor never asked for a retraining"
    assert all("scratch" in retrain for retrain in report["retrains"])
    assert set(report["warm_vs_scratch"]) == {"warm", "scratch"}


def test_trigger_serves_both_streams_for_each_expectation(
    built: adaptation.Build, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_benchmark(monkeypatch, tmp_path, trigger, "--quick")
    report = recorded(tmp_path / "gati_trigger.json", "benchmarks.gati.trigger")
    assert set(report["streams"]) == {"drifting", "lasting"}
    for name, stream in report["streams"].items():
        assert set(stream["sides"]) == set(stream["summary"]) == set(trigger.EXPECTATIONS)
        for side in stream["sides"].values():
            _stream_checked(side, len(trigger.plans(quick=True)[name]))
        assert all(s["retrainings"] == s["accepted"] + s["refused"] for s in stream["summary"].values())


def test_retraining_compares_both_settings_on_fresh_rows(
    built: adaptation.Build, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    small_settings = {"paper": AdaptSettings(**SMALL_ADAPT, warm_start=False), "default": AdaptSettings(**SMALL_ADAPT)}
    monkeypatch.setattr(retraining, "SETTINGS", small_settings)
    monkeypatch.setattr(retraining, "WINDOWS", (40, 80))
    monkeypatch.setattr(retraining, "FRESH_ROWS", 100)
    run_benchmark(monkeypatch, tmp_path, retraining, "--quick")
    report = recorded(tmp_path / "gati_retraining.json", "benchmarks.gati.retraining")
    results = report["results"]
    assert [(r["drift"], r["window_rows"]) for r in results] == [(kind, 80) for kind, _ in retraining.DRIFTS[:2]]
    for result in results:
        for name in small_settings:
            assert 0 <= result[name]["fresh"]["agreement"] <= 1 and result[name]["accepted"] in (True, False)
    assert report["tally"]["default"]["windows"] == len(results)


def test_window_draw_retrains_on_the_whole_window_and_on_a_draw(
    built: adaptation.Build, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(window_draw, "WINDOW_ROWS", 120)
    monkeypatch.setattr(window_draw, "DRAW_ROWS", 40)
    monkeypatch.setattr(window_draw, "FRESH_ROWS", 100)
    run_benchmark(monkeypatch, tmp_path, window_draw, "--quick")
    report = recorded(tmp_path / "gati_window_draw.json", "benchmarks.gati.window_draw")
    (result,) = report["results"]
    assert (result["older"], result["newer"]) == window_draw.PAIRS[1]
    assert result["whole"]["window_rows"] == 120 and result["draw"]["window_rows"] == 40
    assert result["whole"]["newer_share"] == 0.5
    assert set(report["tally"]) >= {"static", *window_draw.SIDES}
