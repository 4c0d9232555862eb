"""GATI's fit data side by side: one model's cache set built twice in one run, its predictors fitted on half of the
validation data (the default) and on Fashion-MNIST's training split (`adaserve caches build --fit-data
fashion-mnist-train`), everything else equal.

Both builds use the GATI benchmark's settings (the --quick variant set, FC(512), Pool(4096) and Conv(3,1); 8 GiB
of activations): the default fits predictors on 5,000 test rows for 10 epochs, the fit-data build on as many
training rows as the memory leaves beside the 10,000 test rows for 3 epochs (about as many steps or more). Each is
measured on its own evaluate rows, test rows no fit and no threshold of that build saw, so hit rates and agreement
need no timing. Per build: the rows in each split; every (block, variant) cache's hit rate and agreement among
hits at the target (its selector's threshold set on the calibrate rows); the default composition's exits,
held-out agreement, and expected speedup (from the latencies that build timed, so it carries their noise).

Models: the example CNN and MLP (trained 5 and 10 epochs, so closer fits of their training rows than the benchmark
networks) and the GATI benchmark's ResNet-style CNN (one epoch; trained as `early_exit` trains it, or its kept
weights).

Usage: .venv/bin/python -m benchmarks.gati.fit_data [--models cnn mlp resnet] [--output FILE]
Writes benchmarks/results/gati_fit_data.json and .png (or --output and the PNG beside it).
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from adaserve.adaptive.gati.cacheset import CacheSet
from adaserve.adaptive.gati.explore import build_cache_set
from adaserve.adaptive.gati.predictors import TrainSettings
from adaserve.datasets import load_fashion_mnist
from adaserve.repository import ModelRepository, ModelSpec
from benchmarks.common import RESULTS, ROOT, SCRATCH, command_line, figure, machine, write_json
from benchmarks.gati.early_exit import FIT_SOURCE, TARGET, explore_settings
from benchmarks.gati.models import NETS, export, trained
from benchmarks.gati.runs import cpu_window

EXAMPLES = ROOT / "examples" / "models"
REPOSITORY = SCRATCH / "gati" / "fit-data"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["cnn", "mlp", "resnet"], choices=["cnn", "mlp", "resnet"])
    parser.add_argument("--output", type=Path, default=RESULTS / "gati_fit_data.json", help="the PNG goes beside it")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    out = args.output
    record: dict[str, Any] = {
        "benchmark": "gati_fit_data",
        "command": command_line(),
        "machine": machine(),
        "settings": {"target": TARGET, "fit_source": FIT_SOURCE, "threads": 1},
        "models": {},
    }
    with cpu_window(record):
        for name in args.models:
            record["models"][name] = run_model(model_spec(name))
    write_json(record, out)
    plot(record, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")


def model_spec(name: str) -> ModelSpec:
    """A fresh scratch copy of an example model, or the benchmark ResNet exported there."""
    shutil.rmtree(REPOSITORY / name, ignore_errors=True)
    if name == "resnet":
        net = NETS[name]
        base, _ = trained(f"{net.name}-base", net.base, load_fashion_mnist("train"), net.epochs)
        return export(REPOSITORY, name, base, caches={"targets": [TARGET]}, workers=[{"batch": 1, "threads": 1}])
    shutil.copytree(EXAMPLES / name, REPOSITORY / name)
    return ModelRepository(REPOSITORY).read(name)


def run_model(spec: ModelSpec) -> dict[str, Any]:
    fitted = explore_settings(quick=False)  # the early-exit benchmark's, fit data and all
    # The same without fit data, for the default epochs of a full build.
    validation = dataclasses.replace(fitted, train=dataclasses.replace(fitted.train, epochs=TrainSettings().epochs))
    builds: dict[str, Any] = {}
    for label, fit_source, settings in (("validation", None, validation), ("fit data", FIT_SOURCE, fitted)):
        window: dict[str, Any] = {}
        with cpu_window(window):
            cache_set = build_cache_set(
                spec, "fashion-mnist", settings, targets=[TARGET], fit_source=fit_source, progress=False
            )
        builds[label] = summary(cache_set) | {"epochs": settings.train.epochs, "build": window}
        print(f"{spec.name}, {label}: built in {window['wall_s']:.0f} s", flush=True)
    before, after = builds["validation"], builds["fit data"]
    result = {
        "builds": builds,
        "hit_rate_gain": {
            key: after["caches"][key]["hit_rate"] - before["caches"][key]["hit_rate"] for key in before["caches"]
        },
        "expected_speedup_ratio": after["default"]["expected_speedup"] / before["default"]["expected_speedup"],
    }
    print_model(spec.name, result)
    return result


def summary(cache_set: CacheSet) -> dict[str, Any]:
    """The splits, every cache's hit rate and agreement at the target, and the default composition."""
    manifest = cache_set.manifest
    caches = {}
    for variant in manifest.variants:
        hits = variant.targets[f"{TARGET:g}"].selector
        caches[variant.key] = {"hit_rate": hits.hit_rate, "agreement": hits.agreement}
    default = cache_set.composition(TARGET)
    return {
        "splits": manifest.data.splits,
        "caches": caches,
        "default": {
            "exits": [e.key for e in default.exits],
            "exit_rates": list(default.evaluate.exit_rates),
            "agreement": default.evaluate.agreement,
            "expected_speedup": sum(manifest.block_latency_s) / default.evaluate.mean_latency_s,
        },
    }


def print_model(name: str, result: dict[str, Any]) -> None:
    builds = result["builds"]
    print(f"\n== {name}: hit rate at {TARGET:g} on each build's evaluate rows, validation | fit data")
    for key, gain in result["hit_rate_gain"].items():
        cells = [f"{b['caches'][key]['hit_rate']:.3f}" for b in builds.values()]
        print(f"  {key:>22}: {' | '.join(cells)}  ({gain:+.3f})")
    for label, b in builds.items():
        d = b["default"]
        print(f"  {label:>10}: exits {d['exits']} agreement {d['agreement']:.4f} expected {d['expected_speedup']:.2f}×")


def plot(record: dict[str, Any], path: Path) -> None:
    models = record["models"]
    fig = figure(14, 4.2 * len(models))
    for row, (name, result) in enumerate(models.items()):
        ax = fig.add_subplot(len(models), 1, row + 1)
        keys = list(result["hit_rate_gain"])
        positions = np.arange(len(keys))
        for offset, (label, build) in zip((-0.2, 0.2), result["builds"].items(), strict=True):
            rates = [build["caches"][key]["hit_rate"] for key in keys]
            ax.bar(
                positions + offset, rates, 0.4, label=f"{label} (expected {build['default']['expected_speedup']:.2f}×)"
            )
        ax.set_xticks(positions, keys, rotation=45, ha="right", fontsize=7)
        ax.set_ylabel(f"hit rate at {TARGET:g} (evaluate rows)")
        ax.set_ylim(0, 1)
        ax.set_title(f"{name}: predictors fitted on validation vs training rows")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
