"""The planner benchmark's model repository: one generalist with learned caches and three "tops" specialists.

A GATI-style planner runs a query node after node; each node has several model options of different accuracy and
cost, and the planner picks per node the most accurate option that fits the node's share of the latency budget,
replanning when a node finishes early thanks to the learned-cache early exit. This module builds the options it
chooses between, as a Triton-layout repository (`<root>/<name>/config.yaml`, `<root>/<name>/1/model.pt2`; input
`image` FP32 [-1,1,28,28], output `logits` FP32 [-1,10], batch ≤ 8, one worker at batch 1 on one thread):

- `classify`: the GATI benchmark's ResNet-style base network (the same weights as `benchmarks/gati/early_exit.py`)
  with a `caches:` section and its learned-cache set, so its latency varies per request;
- `tops_small`, `tops_medium`, `tops_large`: 10-class networks trained only on the "tops" rows (T-shirt/top,
  Pullover, Coat, Shirt), each slower and more accurate on those rows than the one before.

Weights are trained once and kept by `benchmarks.gati.models.trained` (under `results/tmp/gati/weights/`), so only
the first build pays for the training. The build measures each model in-process (batch 1, one thread) and on the
validation rows, the test rows the cache set did not keep for its evaluate split.
"""

from __future__ import annotations

import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from adaserve import zoo
from adaserve.adaptive.gati.cacheset import CacheSet
from adaserve.adaptive.gati.explore import build_cache_set
from adaserve.datasets import load_fashion_mnist
from benchmarks.common import shown_path
from benchmarks.gati.early_exit import FIT_SOURCE, TARGET, explore_settings
from benchmarks.gati.models import CLASSES, NETS, export, predict, trained
from benchmarks.gati.runs import cpu_window

#: The Fashion-MNIST classes the specialists are trained on: the four that the generalist confuses most.
TOPS = (0, 2, 4, 6)
TOPS_NAMES = ("T-shirt/top", "Pullover", "Coat", "Shirt")
GENERALIST = "classify"
WORKERS = [{"batch": 1, "threads": 1}]
#: In-process latency per model: TIMED_CALLS timed calls in rounds of ROUND_CALLS, each after WARMUP_CALLS untimed.
WARMUP_CALLS, TIMED_CALLS, ROUND_CALLS = 30, 200, 50
#: --quick trains the specialists on the first this many tops rows only (the full build: all 24,000).
QUICK_ROWS = 12_000
#: The build measures each model's accuracy on the first this many validation rows (None: all of them).
VALIDATION_ROWS: int | None = None
Data = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class Specialist:
    """A tops specialist: how to build it, how long it trains (full build, --quick) and what it is, in words."""

    name: str
    build: Callable[[], nn.Module]
    epochs: int
    quick_epochs: int
    description: str


SPECIALISTS = (
    Specialist(
        "tops_small",
        lambda: zoo.resnet((1, 1, 1, 1), width=8, in_channels=1, num_classes=CLASSES, small_input=True),
        2,
        1,
        "ResNet: 1 basic block per stage, width 8",
    ),
    Specialist(
        "tops_medium",
        lambda: zoo.resnet((2, 2, 2, 2), width=12, in_channels=1, num_classes=CLASSES, small_input=True),
        3,
        1,
        "ResNet-18-style: 2 basic blocks per stage, width 12",
    ),
    Specialist(
        "tops_large",
        lambda: zoo.resnet((2, 2, 2, 2), width=32, in_channels=1, num_classes=CLASSES, small_input=True),
        3,
        1,
        "ResNet-18-style: 2 basic blocks per stage, width 32",
    ),
)
MODELS = (GENERALIST, *(s.name for s in SPECIALISTS))


@dataclass(frozen=True)
class Built:
    """What `build_repository` made: its JSON-able `record` (settings, and per model its parameters, training,
    latency and accuracy), the cache set's evaluate rows (indices into the test split, held out from every fit and
    threshold: the rows a benchmark should measure on) and the cache set's folder."""

    record: dict[str, Any]
    evaluate_rows: np.ndarray
    cache_set_directory: Path


def build_repository(root: Path, quick: bool) -> Built:
    """Write the four models into the repository `root` (replacing any of the same names), build `classify`'s cache
    set, and measure every model; `quick` trains the specialists on fewer rows and epochs and builds the cache set
    with the --quick exploration, as `benchmarks.gati.early_exit --quick` does."""
    torch.set_num_threads(1)  # the cache set's exploration times blocks and lookups on one thread, as a worker runs
    train, test = load_fashion_mnist("train"), load_fashion_mnist("test")
    modules: dict[str, nn.Module] = {}
    training: dict[str, dict[str, object]] = {}
    net = NETS["resnet"]
    modules[GENERALIST], training[GENERALIST] = trained(f"{net.name}-base", net.base, train, net.epochs)
    tops_train = _tops(train, QUICK_ROWS if quick else None)
    for option in SPECIALISTS:
        epochs = option.quick_epochs if quick else option.epochs
        modules[option.name], training[option.name] = trained(
            f"planner-{option.name}", option.build, tops_train, epochs
        )
    for name in MODELS:
        shutil.rmtree(root / name, ignore_errors=True)
    caches = {"targets": [TARGET], "verify_fraction": 0.0}
    spec = export(root, GENERALIST, modules[GENERALIST], caches=caches, workers=WORKERS)
    for option in SPECIALISTS:
        export(root, option.name, modules[option.name], workers=WORKERS)
    build: dict[str, Any] = {}
    with cpu_window(build):
        cache_set = build_cache_set(
            spec, "fashion-mnist", explore_settings(quick), targets=[TARGET], fit_source=FIT_SOURCE, progress=False
        )
    evaluate_rows = np.asarray(cache_set.scores()["evaluate_rows"], dtype=np.int64)
    validation = np.setdiff1d(np.arange(len(test[1])), evaluate_rows)[:VALIDATION_ROWS]
    images, labels = test[0][validation], test[1][validation]
    on_tops = np.isin(labels, TOPS)
    latency = _latency(modules, images)
    descriptions = {GENERALIST: net.description} | {s.name: s.description for s in SPECIALISTS}
    models: dict[str, Any] = {}
    for name, module in modules.items():
        correct = predict(module, images) == labels
        models[name] = {
            "description": descriptions[name],
            "parameters": sum(p.numel() for p in module.parameters()),
            "training": training[name],
            "latency_ms": latency[name],
            "accuracy": {"validation": float(correct.mean()), "validation_tops": float(correct[on_tops].mean())},
        }
    record = {
        "settings": {
            "quick": quick,
            "threads": 1,
            "tops": dict(zip(TOPS, TOPS_NAMES, strict=True)),
            "tops_training_rows": len(tops_train[1]),
            "epochs": {s.name: s.quick_epochs if quick else s.epochs for s in SPECIALISTS},
            "latency_calls": {"warmup_per_round": WARMUP_CALLS, "timed": TIMED_CALLS, "round": ROUND_CALLS},
        },
        "repository": shown_path(root),
        "validation_rows": {
            "all": len(labels),
            "tops": int(on_tops.sum()),
            "evaluate_rows_held_out": len(evaluate_rows),
        },
        "cache_set": _cache_summary(cache_set, build),
        "models": models,
    }
    return Built(record, evaluate_rows, cache_set.directory)


def _tops(data: Data, rows: int | None) -> Data:
    """The rows of `data` whose label is a tops class (the first `rows` of them, in the split's order)."""
    keep = np.flatnonzero(np.isin(data[1], TOPS))[:rows]
    return data[0][keep], data[1][keep]


def _latency(modules: dict[str, nn.Module], images: np.ndarray) -> dict[str, dict[str, float]]:
    """Batch-1 forward latency per module in eval + inference mode on one thread, over the same real rows. Each
    module runs ROUND_CALLS calls in a row (warm caches, as a worker that serves only it sees), and the modules take
    turns in a fresh random order each round, so a burst of other work on the shared cores lands on all of them
    alike rather than on whichever was being timed."""
    rows = [torch.from_numpy(images[i : i + 1]) for i in range(TIMED_CALLS)]
    times: dict[str, list[float]] = {name: [] for name in modules}
    order = list(modules)
    shuffle = random.Random(0).shuffle
    with torch.inference_mode():
        for module in modules.values():
            module.eval()
        for start in range(0, TIMED_CALLS, ROUND_CALLS):
            shuffle(order)
            for name in order:
                for row in rows[:WARMUP_CALLS]:  # before every round: the others' turns cooled the caches
                    modules[name](row)
                for row in rows[start : start + ROUND_CALLS]:
                    began = time.perf_counter()
                    modules[name](row)
                    times[name].append(time.perf_counter() - began)
    return {
        name: {
            "median": round(float(np.median(t)) * 1e3, 4),
            "p95": round(float(np.percentile(t, 95)) * 1e3, 4),
            "calls": len(t),
        }
        for name, t in times.items()
    }


def _cache_summary(cache_set: CacheSet, build: dict[str, Any]) -> dict[str, Any]:
    """Where the cache set is, how its build went, and what its default composition expects on the evaluate rows."""
    manifest = cache_set.manifest
    default = cache_set.composition(TARGET)
    return {
        "directory": shown_path(cache_set.directory),
        "build": build,
        "blocks": list(manifest.blocks),
        "block_latency_ms": round(sum(manifest.block_latency_s) * 1e3, 4),
        "splits": manifest.data.splits,
        "default_composition": {
            "target": TARGET,
            "exits": [{"cache": e.key, "threshold": e.threshold} for e in default.exits],
            "agreement": default.evaluate.agreement,
            "mean_latency_ms": round(default.evaluate.mean_latency_s * 1e3, 4),
            "exit_rates": list(default.evaluate.exit_rates),
        },
    }
