"""What makes the GATI and planner benchmarks small enough for a smoke test, the same for all of them (as the perf
smoke tests cut theirs down): a one-block ResNet-style CNN in place of the benchmark's ResNet-18-style one, trained
on 1,000 of Fashion-MNIST's training rows (once per test module: the others reuse its kept weights), a tiny
exploration (two predictor variants, one epoch, 1,500 validation rows), small retraining, and a target this small
build certifies exits for."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from adaserve import zoo
from adaserve.adaptive.gati.adapt import AdaptSettings
from adaserve.adaptive.gati.explore import ExploreSettings
from adaserve.adaptive.gati.predictors import TrainSettings, VariantSpec
from adaserve.datasets import load_fashion_mnist
from benchmarks.gati import adaptation, early_exit, explore, fit_data, models, retraining, trigger, window_draw
from benchmarks.planner import models as planner_models

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


def tiny(quick: bool, seed: int = 0) -> ExploreSettings:
    """TINY explored with `seed` (the early-exit benchmark builds a cache set per seed)."""
    return replace(TINY, seed=seed, train=replace(TINY.train, seed=seed))


TRAIN_ROWS = 1000
#: What the small build certifies exits for (on its few check rows .98 needs no disagreement at all, and .7 was
#: once too strict for a model trained one epoch, whose threaded training does not repeat to the bit).
SMOKE_TARGET = 0.6
SMALL_NET = models.Net(
    "resnet",
    lambda: zoo.resnet((1, 1, 1, 1), width=8, in_channels=1, num_classes=models.CLASSES, small_input=True),
    lambda: zoo.resnet((1, 1, 1, 1), width=4, in_channels=1, num_classes=models.CLASSES, small_input=True),
    1,
    "the smoke tests' ResNet-style CNN: 1 block per stage, width 8; student width 4",
)
#: Retraining: one epoch, few selector steps and validation rows.
SMALL_ADAPT = {"train": TrainSettings(epochs=1), "selector_steps": 20, "validation_per_window_row": 2.0}
GATI_MODULES = (adaptation, early_exit, explore, fit_data, retraining, trigger, window_draw, planner_models)
#: The planner's three specialists, small (each wider than the one before, as the benchmark's are).
SMALL_SPECIALISTS = tuple(
    planner_models.Specialist(
        f"tops_{size}",
        lambda width=width: zoo.resnet((1, 1, 1, 1), width=width, in_channels=1, num_classes=10, small_input=True),
        1,
        1,
        f"ResNet: 1 basic block per stage, width {width}",
    )
    for size, width in (("small", 4), ("medium", 6), ("large", 8))
)


@contextmanager
def small_gati(weights: Path) -> Iterator[None]:
    """Every GATI benchmark module (and the planner's) with the small network, training rows, exploration and
    target while the block runs; the networks kept under `weights`."""

    def fewer_rows(split: str) -> tuple[np.ndarray, np.ndarray]:
        x, y = load_fashion_mnist(split)  # type: ignore[arg-type]
        return (x[:TRAIN_ROWS], y[:TRAIN_ROWS]) if split == "train" else (x, y)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(models, "WEIGHTS", weights)
        patch.setitem(models.NETS, "resnet", SMALL_NET)
        for module in GATI_MODULES:
            for name, value in (
                ("load_fashion_mnist", fewer_rows),
                ("explore_settings", tiny),
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
