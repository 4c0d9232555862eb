"""`adaserve caches build`, `compose` and `list` end to end: a few hundred Fashion-MNIST rows through the example
CNN, and the errors a user can cause."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from adaserve.adaptive.gati.blocks import BlocksError
from adaserve.adaptive.gati.cacheset import load_cache_set, read_manifest
from adaserve.adaptive.gati.cli import choose_default, format_cache_set
from adaserve.adaptive.gati.explore import ExploreSettings, _rows_within_budget, build_cache_set, load_build_data
from adaserve.adaptive.gati.predictors import TrainSettings, VariantSpec
from adaserve.cli import main
from adaserve.errors import ConfigError
from adaserve.repository import ModelRepository
from tests.adaptive.gati.conftest import TINY, write_tiny_mlp
from tests.server_utils import link_example

QUICKISH = ExploreSettings(
    variants=(VariantSpec.parse("Pool(4096)"), VariantSpec.parse("Conv(3,1)")),
    train=TrainSettings(epochs=2),
    max_samples=400,
    selector_steps=100,
    latency_repeats=5,
)


def adaserve(*args: str) -> int:
    with pytest.raises(SystemExit) as exited:
        main(list(args))
    return int(exited.value.code or 0)


def test_a_tiny_build_on_fashion_mnist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    link_example(tmp_path, "cnn")
    spec = ModelRepository(tmp_path).read("cnn")
    cache_set = build_cache_set(spec, "fashion-mnist", QUICKISH, targets=[0.97], progress=False)
    manifest = cache_set.manifest
    assert manifest.blocks == ("stage1", "stage2", "head") and manifest.data.rows == 400
    assert [(v.block, v.variant) for v in manifest.variants] == [
        ("stage1", "Pool(4096)"),
        ("stage1", "Conv(3,1)"),
        ("stage2", "Pool(4096)"),
        ("stage2", "Conv(3,1)"),
    ]
    for variant in manifest.variants:
        assert variant.lookup_latency_s > 0 and variant.memory_bytes > 0
        record = variant.targets["0.97"]
        assert 0 <= record.selector.hit_rate <= 1 and 0 <= record.softmax.hit_rate <= 1
    default = cache_set.composition(0.97)
    assert default.method == "overall" and default.calibrate.agreement >= 0.97
    assert default.evaluate.mean_latency_s <= sum(manifest.block_latency_s)

    # Recompose for a second target without retraining; the first target's compositions stay, and the config gets
    # the block a build would have given it (or is told why not).
    assert adaserve("caches", "compose", "cnn", "--model-repository", str(tmp_path), "--target", "0.95") == 0
    printed = capsys.readouterr().out
    assert "rewrote" in printed
    recomposed = load_cache_set(spec).manifest
    served = ModelRepository(tmp_path).read("cnn").config.caches
    if choose_default(recomposed) is None:
        assert "no target deploys an exit on cnn, so no caches block was added" in printed and served is None
    else:
        assert "added `caches: {targets: [" in printed and served is not None
    assert sorted({c.target for c in recomposed.compositions}) == [0.95, 0.97]
    assert all({"0.95", "0.97"} <= set(v.targets) for v in recomposed.variants)

    smallest = min(manifest.variants, key=lambda v: v.memory_bytes)
    code = adaserve("caches", "compose", "cnn", "--model-repository", str(tmp_path), "--memory-mb", "0.000001")
    assert code == 2
    assert (
        f"memory budget 1e-06 MB is below the smallest cache ({smallest.key}: {smallest.memory_bytes / 1e6:.6g} MB); "
        "no cache fits" in capsys.readouterr().err
    )


def test_the_list_shows_each_versions_origin_and_expectations_and_the_one_served(
    tmp_path: Path, tiny_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_tiny_mlp(tmp_path, caches={"targets": [0.9]})
    built = build_cache_set(spec, str(tiny_data), TINY, targets=[0.9], progress=False)
    adapted = spec.directory / "caches" / "v2"
    shutil.copytree(built.directory, adapted)
    settings = {**built.manifest.settings, "adapted_from": "v1", "retrain_s": 7.3}
    (adapted / "manifest.json").write_text(built.manifest.model_copy(update={"settings": settings}).model_dump_json())
    (spec.directory / "caches" / "v3").mkdir()
    listing = ["caches", "list", "tiny", "--model-repository", str(tmp_path)]

    assert adaserve(*listing) == 0
    lines = capsys.readouterr().out.splitlines()
    composition = built.composition(0.9)
    evaluate = composition.evaluate
    expected = sum(built.manifest.block_latency_s) / evaluate.mean_latency_s
    exits = ", ".join(e.block for e in composition.exits)
    target = (
        f"    target 0.9: agreement {evaluate.agreement:.4f}, hit rate {sum(evaluate.exit_rates):.3f}, "
        f"{expected:.2f}× expected; " + (f"exits after {exits}" if exits else "no exit: the model runs whole")
    )
    created = read_manifest(built.directory).created
    assert lines[0] == f"tiny: 3 cache set versions in {spec.directory / 'caches'}; the config names v3 (latest)"
    assert lines.pop(1).startswith("a request that sets no parameter gets target 0.9: the model runs whole (")
    assert lines[1].startswith(f"v1  {created}  built from {tiny_data}, 400 rows  ") and lines[2] == target
    assert lines[3].startswith(f"v2  {created}  adapted from v1, retrained in 7.3 s  ") and lines[4] == target
    assert lines[5].startswith("v3  0.0 MB [the config's]  unreadable: ") and "cannot read" in lines[5]
    assert lines[5].endswith("; the model is served whole") and len(lines) == 6

    write_tiny_mlp(tmp_path, seed=1)  # other weights, and a config without caches
    assert adaserve(*listing) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("; its config has no caches section, so none is served")
    assert lines[2].startswith("    stale: built for tiny version 1 (artifact sha256 ")
    assert lines[2].endswith("), not what tiny serves now")
    shutil.rmtree(spec.directory / "caches")
    assert adaserve(*listing) == 0
    assert capsys.readouterr().out == "tiny has no cache set; build one with `adaserve caches build tiny`\n"


def test_fit_data_fits_the_predictors_and_the_validation_rows_set_and_measure_thresholds(
    tmp_path: Path, tiny_data: Path
) -> None:
    spec = write_tiny_mlp(tmp_path)
    rng = np.random.default_rng(1)
    fit_x = rng.normal(size=(600, 8)).astype(np.float32)
    np.savez(tmp_path / "fit.npz", x=fit_x, y=(fit_x[:, 0] > 0).astype(np.int64))
    fit = str(tmp_path / "fit.npz")
    cache_set = build_cache_set(spec, str(tiny_data), TINY, targets=[0.9], fit_source=fit, progress=False)
    data = cache_set.manifest.data
    assert (data.source, data.fit_source, data.rows, data.labels) == (str(tiny_data), fit, 1000, True)
    assert data.splits == {"fit_predictor": 600, "fit_selector": 120, "calibrate": 120, "evaluate": 160}
    assert f"1000 rows of {tiny_data} and {fit} (fit data) (fit_predictor 600," in format_cache_set(cache_set.manifest)
    arrays = cache_set.scores()
    np.testing.assert_array_equal(arrays["fit_predictor_rows"], np.arange(400, 1000))
    validation = np.concatenate([arrays[f"{split}_rows"] for split in ("fit_selector", "calibrate", "evaluate")])
    np.testing.assert_array_equal(np.sort(validation), np.arange(400))

    x, y, fit_rows = load_build_data(str(tiny_data), fit, spec.config)
    assert fit_rows == 600 and y is not None and len(x) == len(y) == 1000
    np.testing.assert_array_equal(x[400:], fit_x)
    np.savez(tmp_path / "unlabelled.npz", x=fit_x)
    assert load_build_data(str(tiny_data), str(tmp_path / "unlabelled.npz"), spec.config)[1] is None
    with pytest.raises(ConfigError, match=r"fit data .*tiny\.npz is the validation data: selectors and thresholds"):
        load_build_data(str(tiny_data), str(tmp_path / "." / "tiny.npz"), spec.config)


def test_validation_rows_keep_at_least_half_the_activation_budget_beside_fit_rows() -> None:
    shapes = {0: (25,), 1: (25,)}  # 200 bytes a row: the 0.2 MB below hold 1,000 rows
    settings = ExploreSettings(max_activation_mb=0.2)
    assert _rows_within_budget(800, 0, shapes, settings) == (800, 0)
    assert _rows_within_budget(800, 5000, shapes, settings) == (500, 500)
    assert _rows_within_budget(300, 5000, shapes, settings) == (300, 700)
    assert _rows_within_budget(800, 100, shapes, settings) == (800, 100)
    assert _rows_within_budget(800, 5000, shapes, ExploreSettings(max_activation_mb=0.2, max_samples=200)) == (200, 800)
    with pytest.raises(ConfigError, match=r"only 50 validation rows fit \(of 800\); caches need at least 100"):
        _rows_within_budget(800, 5000, shapes, ExploreSettings(max_activation_mb=0.02))


def test_validation_data_that_does_not_fit_the_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    link_example(tmp_path, "cnn")
    np.savez(tmp_path / "bad.npz", x=np.zeros((10, 5), np.float32))
    code = adaserve("caches", "build", "cnn", "--model-repository", str(tmp_path), "--data", str(tmp_path / "bad.npz"))
    assert code == 2
    assert "rows shaped [5] do not fit model 'cnn', whose input 'image' takes rows of [1, 28, 28]" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "cnn" / "caches").exists()


def test_validation_data_with_non_finite_rows_or_bad_labels_is_named(tmp_path: Path) -> None:
    """NaN in a row makes NaN activations and trains NaN weights; a label the model cannot score fails deep in the
    loss: each stops the build before any work, naming the data and the cause."""
    link_example(tmp_path, "cnn")
    spec = ModelRepository(tmp_path).read("cnn")
    x = np.zeros((200, 1, 28, 28), np.float32)
    x[17, 0, 3, 3] = np.nan
    np.savez(tmp_path / "nan.npz", x=x)
    with pytest.raises(ConfigError, match=r"nan\.npz: row 17 holds NaN or an infinity"):
        build_cache_set(spec, str(tmp_path / "nan.npz"), QUICKISH, targets=[0.97], progress=False)
    x[17] = 0
    for name, labels in (("negative", -np.ones(200)), ("fractional", np.full(200, 0.5))):
        np.savez(tmp_path / f"{name}.npz", x=x, y=labels)
        with pytest.raises(ConfigError, match=rf"{name}\.npz: 'y' must hold class indices"):
            build_cache_set(spec, str(tmp_path / f"{name}.npz"), QUICKISH, targets=[0.97], progress=False)
    np.savez(tmp_path / "eleven.npz", x=x, y=np.arange(200) % 12)
    with pytest.raises(ConfigError, match=r"the labels go up to 11, but the model scores 10 classes \(0–9\)"):
        build_cache_set(spec, str(tmp_path / "eleven.npz"), QUICKISH, targets=[0.97], progress=False)
    assert not (tmp_path / "cnn" / "caches").exists()


def test_blocks_that_do_not_exist_stop_the_build(tmp_path: Path) -> None:
    link_example(tmp_path, "cnn", caches={"blocks": ["stage1", "stage9", "head"]})
    spec = ModelRepository(tmp_path).read("cnn")
    with pytest.raises(BlocksError, match=r"model 'cnn' .*block 'stage9' does not exist"):
        build_cache_set(spec, "fashion-mnist", QUICKISH, targets=[0.97], progress=False)


def test_an_archive_without_x(tmp_path: Path) -> None:
    link_example(tmp_path, "cnn")
    np.savez(tmp_path / "labels.npz", y=np.zeros(3))
    with pytest.raises(ConfigError, match=r"labels\.npz: no array named 'x' \(found: y\)"):
        build_cache_set(ModelRepository(tmp_path).read("cnn"), str(tmp_path / "labels.npz"), QUICKISH, targets=[0.97])


def test_each_lookup_is_timed_right_after_its_block_inside_runs_of_the_chain() -> None:
    """Two caches share the first exit and take turns; each sees its block's output, never another block's, and
    its own time (a cache that sleeps 2 ms is timed at 2 ms or more, and above the others)."""
    import time

    import torch

    from adaserve.adaptive.gati.blocks import BlockChain
    from adaserve.adaptive.gati.explore import _lookup_latencies

    blocks = (torch.nn.Linear(4, 4), torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    chain = BlockChain(("a", "b", "c"), blocks, (80, 60, 32))
    seen: dict[str, list[tuple[int, ...]]] = {"fast": [], "slow": [], "late": []}

    def cache(name: str, sleep_s: float = 0.0) -> torch.nn.Module:
        class Recording(torch.nn.Module):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                seen[name].append(tuple(x.shape))
                time.sleep(sleep_s)
                return x

            def scripted(self) -> torch.nn.Module:  # timed as the runtime runs it: this module as it is
                return self

        return Recording()

    first = np.zeros((1, 4), dtype=np.float32)
    caches = [(0, cache("fast")), (0, cache("slow", 0.002)), (1, cache("late"))]
    fast, slow, late = _lookup_latencies(chain, first, caches, repeats=10)  # type: ignore[arg-type]
    assert seen == {"fast": [(1, 4)] * 13, "slow": [(1, 4)] * 13, "late": [(1, 3)] * 26}  # 3 warm-up runs each
    assert slow >= 0.002 and slow > fast and slow > late
