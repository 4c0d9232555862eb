"""The GATI locality benchmark at its smallest: the example CNN with a tiny cache set (not the benchmark's trained
ResNet and its minutes-long build) through a short class-skewed stream, timed, with one retraining; what it
records, not its figures."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from adaserve.adaptive.gati.explore import load_build_data
from adaserve.adaptive.gati.predictors import VariantSpec
from adaserve.datasets import FASHION_MNIST_CLASSES, load_fashion_mnist
from adaserve.repository import ModelRepository
from benchmarks.common import write_json
from benchmarks.gati import adaptation, locality
from tests.adaptive.gati.conftest import TINY, build_timed_alike
from tests.server_utils import link_example

TARGET = 0.9
#: conftest's tiny exploration, with a variant that certifies an exit on the CNN.
SMALL = replace(TINY, variants=(VariantSpec.parse("Pool(4096)"),), max_samples=1500)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> adaptation.Build:
    """The example CNN and a tiny cache set, in the shape the benchmark's `build` returns."""
    root = tmp_path_factory.mktemp("locality")
    link_example(root, "cnn")
    spec = ModelRepository(root).read("cnn")
    cache_set = build_timed_alike(spec, SMALL, [TARGET])
    validation_x, _, _ = load_build_data("fashion-mnist", None, spec.config)
    images, labels = load_fashion_mnist("test")
    used = np.concatenate([rows for name, rows in cache_set.scores().items() if name.endswith("_rows")])
    unused = np.setdiff1d(np.arange(len(images)), used)
    return adaptation.Build(spec, cache_set, 0.0, validation_x, images, labels, unused)


def test_zipf_shares_fall_with_rank() -> None:
    shares = locality.zipf(1.5)
    assert shares.sum() == pytest.approx(1.0) and np.all(np.diff(shares) < 0)
    assert shares[0] == pytest.approx(0.501, abs=1e-3)


def test_the_stream_is_skewed_and_changes_its_dominant_class(built: adaptation.Build) -> None:
    stream = locality.Skewed(built, chunk_rows=200, chunks=6, period=2, seed=3)
    chunks = list(stream)
    dominants = [c.about["dominant"] for c in chunks]
    assert dominants[0] == dominants[1] != dominants[2] == dominants[3] != dominants[4]
    for chunk in chunks:
        top = FASHION_MNIST_CLASSES.index(chunk.about["dominant"])
        assert np.mean(chunk.labels == top) > 0.35  # half the rows, give or take
    served = np.concatenate([c.x for c in chunks]).reshape(1200, -1)
    first = np.concatenate(stream.first_seen)
    assert sum(c.about["repeats"] for c in chunks) == (~first).sum()
    assert len(np.unique(served[first], axis=0)) == first.sum()  # no image twice before its class runs out


def test_the_benchmark_times_every_side_and_adapts(
    built: adaptation.Build, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(adaptation.WINDOW, "min_rows", 10)
    monkeypatch.setitem(adaptation.WINDOW, "fraction", 1.0)
    monkeypatch.setattr(adaptation, "PERIOD_S", 2 * adaptation.CHUNK_S)  # a retraining after the second chunk
    stream = locality.Skewed(built, chunk_rows=30, chunks=3, period=2)
    record = {"settings": {"alpha": 1.5, "period": 2, "target": TARGET}} | locality.run(built, TARGET, stream)

    dominants = [c["dominant"] for c in record["chunks"]]
    assert dominants[0] == dominants[1] != dominants[2]
    assert len(record["retrains"]) >= 1 and record["retrains"][0]["after_chunk"] == 1
    for chunk in record["chunks"]:
        assert chunk["rows"] == 30 and chunk["base"]["mean_ms"] > 0
        for side in ("static", "adapted"):
            assert 0 <= chunk[side]["hit_rate"] <= 1 and 0 <= chunk[side]["agreement"] <= 1
    overall = record["overall"]
    assert overall["rows"] == 90 and overall["faster_base"] in ("base", "base chain")
    for side in locality.SIDES:
        assert len(overall[side]["latency_us"]) == 90 and overall[side]["mean_ms"] > 0
    assert overall["static"]["first_seen"]["hit_rate"] >= 0
    adapted = overall["adapted"]
    assert record["bars"][0]["pass"] == (adapted["speedup"] >= 4.0 and adapted["agreement"] >= 0.99)

    out = tmp_path / "gati_locality.json"
    write_json(record | {"benchmark": "gati_locality"}, out)
    locality.plot(json.loads(out.read_text()), out.with_suffix(".png"))
    locality._print(json.loads(out.read_text()), out)
    assert out.with_suffix(".png").stat().st_size > 0
    assert "| side | mean (ms) |" in capsys.readouterr().out


def test_the_drifting_stream_is_served_as_the_adaptation_benchmark_serves_it(
    built: adaptation.Build, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop both benchmarks share, with the adaptation benchmark's stream and its untimed batches."""
    plan = [("clean", 0), ("blur", 2)]
    stream = adaptation.drifting(built, 20, plan, seed=0)
    record = adaptation.serve_stream(built, TARGET, 20, stream, 0, "traffic", scratch=False)
    assert [(c["corruption"], c["severity"]) for c in record["chunks"]] == plan
    assert all(set(c) >= {"static", "adapted", "base_accuracy"} and c["rows"] == 20 for c in record["chunks"])
    first = record["chunks"][0]
    assert first["adapted"].pop("version") == 1 and first["adapted"] == first["static"]  # v1 on both sides
