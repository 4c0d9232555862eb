"""The GATI benchmarks at their smallest, to check that each runs end to end and what it records; the figures are
the benchmarks', not these tests'. What makes them small is the same for all of them, set here (as the perf smoke
tests set theirs): a one-block ResNet-style CNN in place of the benchmark's ResNet-18-style one, trained on 1,000 of
Fashion-MNIST's training rows (once for the module: every benchmark here reuses its kept weights), and a tiny
exploration (two predictor variants, one epoch, 1,500 validation rows). The adaptation benchmarks serve a short
stream at a target this small build can certify exits for."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from adaserve import zoo
from adaserve.adaptive.gati.adapt import AdaptSettings
from adaserve.adaptive.gati.explore import ExploreSettings
from adaserve.adaptive.gati.predictors import TrainSettings, VariantSpec
from adaserve.datasets import load_fashion_mnist
from benchmarks.gati import adaptation, early_exit, explore, fit_data, models, retraining, trigger, window_draw
from tests.bench.factories import positive, recorded, run_benchmark

#: Two variants, one epoch, few steps and timing runs, 1,500 validation rows and the fit rows 128 MB of
#: activations leave.
TINY = ExploreSettings(
    variants=(VariantSpec.parse("FC(32)"), VariantSpec.parse("Pool(256)")),
    train=TrainSettings(epochs=1),
    max_samples=1500,
    max_activation_mb=128.0,
    selector_steps=50,
    latency_repeats=5,
    quick=True,
)
TRAIN_ROWS = 1000
#: What the small build certifies exits for (on its few check rows .98 needs no disagreement at all).
SMOKE_TARGET = 0.7
SMALL_NET = models.Net(
    "resnet",
    lambda: zoo.resnet((1, 1, 1, 1), width=8, in_channels=1, num_classes=models.CLASSES, small_input=True),
    lambda: zoo.resnet((1, 1, 1, 1), width=4, in_channels=1, num_classes=models.CLASSES, small_input=True),
    1,
    "the smoke tests' ResNet-style CNN: 1 block per stage, width 8; student width 4",
)
#: Retraining: one epoch, few selector steps and validation rows.
SMALL_ADAPT = {"train": TrainSettings(epochs=1), "selector_steps": 20, "validation_per_window_row": 2.0}
GATI_MODULES = (adaptation, early_exit, explore, fit_data, retraining, trigger, window_draw)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every GATI benchmark module with the small network, training rows, exploration and target; the networks
    kept for the module (trained by the first test that needs them, reused by the others)."""

    def fewer_rows(split: str) -> tuple[np.ndarray, np.ndarray]:
        x, y = load_fashion_mnist(split)  # type: ignore[arg-type]
        return (x[:TRAIN_ROWS], y[:TRAIN_ROWS]) if split == "train" else (x, y)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(models, "WEIGHTS", tmp_path_factory.mktemp("gati-weights"))
        patch.setitem(models.NETS, "resnet", SMALL_NET)
        for module in GATI_MODULES:
            for name, value in (
                ("load_fashion_mnist", fewer_rows),
                ("explore_settings", lambda quick: TINY),
                ("TARGET", SMOKE_TARGET),
            ):
                if hasattr(module, name):
                    patch.setattr(module, name, value)
        # The adaptation benchmarks: a short stream (two corruptions), few build rows, a small window that fills.
        patch.setattr(adaptation, "BUILD_ROWS", TINY.max_samples)
        patch.setattr(adaptation, "SEVERITIES", dict(list(adaptation.SEVERITIES.items())[:2]))
        for module in (adaptation, trigger):
            patch.setattr(module, "CHUNK_ROWS", 40)
        patch.setattr(adaptation, "WINDOW", {"capacity": 200, "draw": 80, "fraction": 1.0, "min_rows": 40})
        for module in (adaptation, window_draw):
            patch.setattr(module, "AdaptSettings", lambda **fields: AdaptSettings(**(SMALL_ADAPT | fields)))
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
    monkeypatch.setattr(early_exit, "ALPHAS", (0.0, 1.0))
    monkeypatch.setattr(early_exit, "BUDGET_FRACTIONS", (0.5, None))
    monkeypatch.setattr(early_exit, "BATCHES", (1, 2))
    run_benchmark(monkeypatch, tmp_path, early_exit, "--quick", "--models", "resnet")
    report = recorded(tmp_path / "gati_early_exit.json", "benchmarks.gati.early_exit", png=False)
    resnet = report["models"]["resnet"]
    methods = resnet["methods"]
    assert {"base", "base chain", "gati", "gati process", "cascade", "distilled"} <= set(methods)
    assert all(methods[name]["requests"] == 40 for name in ("base", "gati", "gati process"))
    assert {key for key in resnet["sweeps"] if key.startswith("alpha")} == {"alpha 0", "alpha 1"}
    assert set(resnet["batching"]) == {"1", "2"}
    assert resnet["server"]
    assert len(report["bars"]) == 4 and all(bar["pass"] in (True, False) for bar in report["bars"])
    assert all(len(bar["p99_ratio_95"]) == 2 for bar in report["bars"][1::2])
    assert all((tmp_path / f"gati_early_exit.{kind}.png").stat().st_size > 0 for kind in ("latency", "sweeps"))


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
