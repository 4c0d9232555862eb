"""GATI's early exit on a ResNet-style and a VGG-style CNN (Fashion-MNIST, batch 1, CPU) against the base model and
the paper's baselines, in-process and through the server.

Per network (`benchmarks/gati/models.py`; trained on the train split, weights kept and reused by setting):

1. **Methods side by side** on the cache set's evaluate rows (held out from every fit and threshold), one request
   per row, the methods interleaved in a fresh random order per row, one intra-op thread each: the base model as a
   worker runs it whole, the base model's block chain, GATI as the worker runs it (`EarlyExit`, lookups inline, the
   CPU default; and beside the model, the chain in a model process of its own, `lookup: process`), dynamic int8
   (Linear only), FX static int8, 50% channel pruning (fine-tuned), the distilled student, and the student→base
   cascade (threshold set on the calibrate rows and certified at the same risk as GATI's default composition:
   `adaserve.adaptive.gati.certify`). Mean / p50 / p99, agreement with the base model, accuracy.
2. **Sweeps**: the same cache set recomposed (`compose`, from its stored scores) for memory budgets (the default,
   overall-target composition) and for α (the paper's MILP composition), each composition measured the same way.
3. **Batching**: GATI and the base model at batch 1, 2, 4, 8 (one request per row): speedup of the mean
   per-request latency over the base model at the same batch.
4. **Server**: `adaserve serve` (one worker, batch 1, one thread) on 127.0.0.1; tritonclient.http, binary data,
   one request at a time, early exit on and `early_exit: false` alternating in random order on the same images.

**Seeds.** One build's luck should not decide the headline, so every seed of `--seeds` (default 0, 1, 2) builds a
fresh cache set on the same trained networks (`ExploreSettings.for_run(..., seed=...)`: the data splits, the
predictors' training and the selectors differ). The first seed runs parts 1–4 on every network; on the ResNet, the
network the bars judge, every seed (the first included) records the methods the bars compare (the base model, its
block chain, GATI inline and beside the model) on its own evaluate rows, under `seeds`: a further seed costs its
build (about 4.5 minutes on 2 cores) and those four methods. The bars judge the median over seeds: the median
speedup, with the agreement target met in every seed (stricter than the median run's), and the median p99 ratio to
the base model.

Adaptation under distribution shift (the issue's item 5) is measured by `benchmarks/gati/adaptation.py`.

Usage: .venv/bin/python -m benchmarks.gati.early_exit [--quick] [--models resnet vgg] [--seeds 0,1,2]
       .venv/bin/python -m benchmarks.gati.early_exit --bars-of benchmarks/results/gati_early_exit.json
Writes benchmarks/results/gati_early_exit.json and gati_early_exit.{latency,sweeps}.png (--quick: under tmp/).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.stats import bootstrap
from torch import nn

from adaserve.adaptive.gati.cacheset import CacheSet, CompositionRecord
from adaserve.adaptive.gati.compose import compose
from adaserve.adaptive.gati.explore import ExploreSettings, build_cache_set
from adaserve.adaptive.gati.runtime import EarlyExit, ExitPlan
from adaserve.datasets import load_fashion_mnist
from adaserve.repository import ModelSpec, executable, read_artifact
from benchmarks.common import (
    RESULTS,
    SCRATCH,
    add_seeds_argument,
    command_line,
    machine,
    shown_path,
    wait_for_quiet,
    write_json,
)
from benchmarks.gati import baselines, plots
from benchmarks.gati.models import CLASSES, NETS, ROW_SHAPE, Net, Teacher, export, predict, trained
from benchmarks.gati.runs import Method, Model, cpu_window, early_exit, interleave, plain, summary
from benchmarks.gati.server import measure_server

TARGET = 0.99
#: The bars of the issue (ResNet-style CNN): mean-latency speedup over the base model at this overall agreement.
BAR_SPEEDUP, BAR_AGREEMENT = 2.5, 0.99
BAR_NET = "resnet"
PRUNE_FRACTION = 0.5
#: Training rows the student learns from the base (2 epochs) and the pruned network is fine-tuned on (1 epoch).
DISTILL_ROWS, FINE_TUNE_ROWS = 30_000, 10_000
#: The test rows the base, student and pruned networks' accuracy is recorded on (None: all of them).
ACCURACY_ROWS: int | None = None
#: The full build's activation memory (validation and fit rows) and predictor epochs.
FIT_ACTIVATION_MB, FIT_EPOCHS = 8192.0, 3
#: The rows that fit the predictors: Fashion-MNIST's training split.
FIT_SOURCE = "fashion-mnist-train"
ALPHAS = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
BATCHES = (1, 2, 4, 8)
#: The longest wait for a quiet second before each measured part (the wait and the reading are recorded).
QUIET_WAIT_S = 5.0
#: Memory budgets as fractions of what the unconstrained default composition holds (None: no limit).
BUDGET_FRACTIONS = (0.1, 0.25, 0.5, None)
#: GATI's two forms the bars judge, each with where its lookups run.
BAR_METHODS = {"gati": "lookups inline", "gati process": "lookups beside the model"}
Data = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class Rows:
    """How many evaluate rows each part measures (None: all)."""

    methods: int | None
    sweeps: int
    batches: int
    server: int


FULL, QUICK = Rows(None, 1000, 1000, 1000), Rows(300, 150, 160, 150)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the --quick exploration, fewer rows; under tmp/")
    parser.add_argument("--models", nargs="+", default=list(NETS), choices=list(NETS))
    add_seeds_argument(parser, build="fresh cache set", each="the methods the bars compare")
    parser.add_argument(
        "--bars-of", metavar="RESULT.json", help="print the bars of a recorded run from its per-row latencies; run none"
    )
    args = parser.parse_args(argv)
    if args.bars_of:
        recorded = json.loads(Path(args.bars_of).read_text())
        print(json.dumps(bars(recorded["models"].get(BAR_NET)), indent=2, ensure_ascii=False))
        return
    out = (SCRATCH if args.quick else RESULTS) / "gati_early_exit.json"
    rows = QUICK if args.quick else FULL
    record: dict[str, Any] = {
        "benchmark": "gati_early_exit",
        "command": command_line(),
        "machine": machine(),
        "settings": {
            "quick": args.quick,
            "target": TARGET,
            "threads": 1,
            "distill_rows": DISTILL_ROWS,
            "fine_tune_rows": FINE_TUNE_ROWS,
            "rows": dataclasses.asdict(rows),
            "prune_fraction": PRUNE_FRACTION,
            "alphas": ALPHAS,
            "budget_fractions": BUDGET_FRACTIONS,
            "batches": BATCHES,
            "seeds": args.seeds,
        },
        "adaptation": "under distribution shift (issue item 5): measured by benchmarks/gati/adaptation.py",
        "models": {},
    }
    train, test = load_fashion_mnist("train"), load_fashion_mnist("test")
    with cpu_window(record):
        for name in args.models:
            record["models"][name] = run_model(NETS[name], train, test, rows, args.quick, args.seeds)
    record["bars"] = bars(record["models"].get(BAR_NET))
    write_json(record, out)
    written = plots.plot(record, out)
    print("wrote", out, *written)


@dataclass(frozen=True)
class Prepared:
    """A network ready to measure: its trained forms, the exported base and its cache set, and their record."""

    spec: ModelSpec
    cache_set: CacheSet
    base: nn.Module
    student: nn.Module
    pruned: nn.Module
    record: dict[str, Any]


def run_model(net: Net, train: Data, test: Data, rows: Rows, quick: bool, seeds: list[int]) -> dict[str, Any]:
    """Parts 1-4 on the first seed's cache set, then (on BAR_NET) the bars' methods on a fresh cache set per further
    seed."""
    prepared = prepare(net, train, test, quick, seeds[0])
    result = prepared.record
    images, labels = evaluate_rows(prepared.cache_set, test, None)
    with loaded(prepared.spec) as (whole, runtime, beside):
        methods, result["cascade_threshold"] = build_methods(whole, runtime, beside, prepared, test[0], train[0][:512])
        part = images[: rows.methods]
        result["methods"] = measure(methods, part, labels[: len(part)], beside.model_process_pid)
    print(f"{net.name}: measured the methods in {result['methods']['window']['wall_s']:.0f} s", flush=True)
    result["sweeps"] = sweeps(whole, runtime, prepared.cache_set, images[: rows.sweeps])
    result["batching"] = batching(whole, runtime, images[: rows.batches])
    result["server"] = measure_server(prepared.spec, images[: rows.server])
    first = seed_record(seeds[0], prepared.cache_set, result["cache_set"]["build"], result["methods"])
    further = seeds[1:] if net.name == BAR_NET else []  # the other networks' headline is not judged
    result["seeds"] = [first] + [another_seed(prepared.spec, seed, test, rows, quick) for seed in further]
    print_model(net.name, result)
    return result


def another_seed(spec: ModelSpec, seed: int, test: Data, rows: Rows, quick: bool) -> dict[str, Any]:
    """A fresh cache set built with `seed` for the same base network (a new version beside the others, the one the
    runtime loads: `version: latest`), and the methods the bars compare on its evaluate rows."""
    cache_set, build = build_caches(spec, quick, seed)
    images, labels = evaluate_rows(cache_set, test, rows.methods)
    with loaded(spec) as (whole, runtime, beside):
        methods = {
            "base": plain(whole),
            "base chain": plain(runtime.chain.run),
            **{name: early_exit(form, CLASSES) for name, form in zip(BAR_METHODS, (runtime, beside), strict=True)},
        }
        measured = measure(methods, images, labels, beside.model_process_pid)
    return seed_record(seed, cache_set, build, measured)


def evaluate_rows(cache_set: CacheSet, test: Data, count: int | None) -> Data:
    """The first `count` (None: all) of the test rows the cache set held out from every fit and threshold."""
    evaluate = cache_set.scores()["evaluate_rows"][:count]
    return test[0][evaluate], test[1][evaluate]


@contextmanager
def loaded(spec: ModelSpec) -> Iterator[tuple[Model, EarlyExit, EarlyExit]]:
    """The base model as a worker without caches runs it, and GATI on the model's latest cache set as a worker runs
    it (lookups inline, the CPU default) and, while the block runs, with the chain in a model process beside it."""
    stored = read_artifact(spec.artifact, spec.config.max_batch_size)
    whole = executable(stored)
    runtime = EarlyExit.load(spec.config, spec.artifact, stored)  # its blocks share the program's weights
    runtime.start_lookups("inline")
    beside = EarlyExit(runtime.chain, runtime.plans, 0.0, "lookups beside the model, in a process", "process")
    with torch.inference_mode():
        beside.warm_up(1, ROW_SHAPE, torch.float32)  # forks the model process, sized for batch 1
    try:
        yield whole, runtime, beside
    finally:
        beside.stop_lookups()


def prepare(net: Net, train: Data, test: Data, quick: bool, seed: int) -> Prepared:
    """Train (or reuse) the base, student and pruned networks; export the base with a `caches:` section into a
    fresh scratch repository and build its cache set there with `seed`. Everything runs on one thread: the
    exploration as `adaserve caches build` does, because it times the blocks and lookups that composition weighs."""
    torch.set_num_threads(1)  # two threads beside other work on two cores ran ten times slower, not faster
    base, base_record = trained(f"{net.name}-base", net.base, train, net.epochs)
    distill = (train[0][:DISTILL_ROWS], train[1][:DISTILL_ROWS])
    teacher = Teacher(base, str(base_record["weights"]), distill[0])
    student, student_record = trained(f"{net.name}-student", net.student, distill, 2, teacher=teacher)
    tune = (train[0][:FINE_TUNE_ROWS], train[1][:FINE_TUNE_ROWS])
    pruned, pruned_record = trained(
        f"{net.name}-pruned", lambda: baselines.prune_channels(base, PRUNE_FRACTION), tune, 1, teacher=teacher
    )
    repository = SCRATCH / "gati" / ("repo-quick" if quick else "repo")
    shutil.rmtree(repository / net.name, ignore_errors=True)
    caches = {"targets": [TARGET], "verify_fraction": 0.0}
    spec = export(repository, net.name, base, caches=caches, workers=[{"batch": 1, "threads": 1}])
    cache_set, build = build_caches(spec, quick, seed)
    forms = {"base": base, "student": student, "pruned": pruned}
    images, labels = test[0][:ACCURACY_ROWS], test[1][:ACCURACY_ROWS]
    record = {
        "description": net.description,
        "parameters": {name: sum(p.numel() for p in m.parameters()) for name, m in forms.items()},
        "training": {"base": base_record, "student": student_record, "pruned": pruned_record},
        "test_accuracy": {name: float(np.mean(predict(m, images) == labels)) for name, m in forms.items()},
        "cache_set": {"directory": shown_path(cache_set.directory), "build": build} | _manifest(cache_set),
    }
    return Prepared(spec, cache_set, base, student, pruned, record)


def build_caches(spec: ModelSpec, quick: bool, seed: int) -> tuple[CacheSet, dict[str, Any]]:
    """A new cache set version for `spec`, explored with `seed`, and how long its build took (`cpu_window`)."""
    build: dict[str, Any] = {}
    with cpu_window(build):
        cache_set = build_cache_set(
            spec,
            "fashion-mnist",
            explore_settings(quick, seed),
            targets=[TARGET],
            fit_source=FIT_SOURCE,
            progress=False,
        )
    print(f"{spec.name}: built {cache_set.directory} (seed {seed}) in {build['wall_s']:.0f} s", flush=True)
    return cache_set, build


def explore_settings(quick: bool, seed: int = 0) -> ExploreSettings:
    """The exploration the benchmark builds its cache sets with (predictors fitted on FIT_SOURCE's rows).

    The --quick variant set (one per family) in both modes: the six variants after the ResNet's nine exits take
    longer than the whole run may on two shared cores. Predictors are fitted on as many training rows as
    FIT_ACTIVATION_MB leaves beside every test row (about 24,000 for the ResNet), for FIT_EPOCHS: about as many
    steps as 10 epochs of the 5,000 test rows a build without fit data fits on. --quick: 3,000 test rows, 2 GiB
    (about 5,000 training rows), 4 epochs. `seed` draws the data splits and seeds the predictors' training."""
    settings = ExploreSettings.for_run(quick=True, seed=seed, max_samples=3000 if quick else None)
    memory, epochs = (2048.0, settings.train.epochs) if quick else (FIT_ACTIVATION_MB, FIT_EPOCHS)
    train_settings = dataclasses.replace(settings.train, epochs=epochs)
    return dataclasses.replace(settings, max_activation_mb=memory, train=train_settings)


def build_methods(
    whole: Model,
    runtime: EarlyExit,
    beside: EarlyExit,
    prepared: Prepared,
    test_images: np.ndarray,
    calibration: np.ndarray,
) -> tuple[dict[str, Method], float | None]:
    """Every method of part 1 by name (`beside`: GATI with its model process started), and the cascade's threshold
    (None: the student never answers)."""
    calibrate = prepared.cache_set.scores()["calibrate_rows"]
    with torch.inference_mode():
        x = torch.from_numpy(test_images[calibrate])
        student = prepared.student(x)
        confidence = torch.softmax(student, 1).amax(1).numpy()
        agrees = student.argmax(1).numpy() == whole(x).argmax(1).numpy()
    threshold = baselines.cascade_threshold(confidence, agrees, TARGET)
    methods = {
        "base": plain(whole),
        "base chain": plain(runtime.chain.run),
        "gati": early_exit(runtime, CLASSES),
        "gati process": early_exit(beside, CLASSES),
        "int8 dynamic": plain(baselines.dynamic_int8(prepared.base)),
        "int8 static": plain(baselines.static_int8(prepared.base, calibration)),
        f"pruned {PRUNE_FRACTION:.0%}": plain(prepared.pruned),
        "distilled": plain(prepared.student),
        "cascade": plain(baselines.Cascade(prepared.student, whole, threshold)),
    }
    return methods, threshold if math.isfinite(threshold) else None


def measure(
    methods: dict[str, Method], images: np.ndarray, labels: np.ndarray, model_pid: int | None
) -> dict[str, Any]:
    """Part 1: every method on every row; summaries against the base model, and each one's latencies (µs).
    `model_pid`: GATI's model process, whose spinning is counted apart (`model_process_cores`), not as others'."""
    wait = wait_for_quiet(QUIET_WAIT_S)
    window: dict[str, Any] = {"quiet_wait": wait}
    with cpu_window(window, *([model_pid] if model_pid else []), field="model_process_cores"):
        samples = interleave(methods, images)
    reference = np.array(samples["base"].label)
    base_mean = float(np.mean(samples["base"].latency_s))
    result: dict[str, Any] = {"window": window, "rows": len(images)}
    for name, s in samples.items():
        result[name] = summary(s, reference, base_mean) | {
            "accuracy": float(np.mean(np.array(s.label) == labels)),
            "latency_us": [round(t * 1e6) for t in s.latency_s],
        }
    return result


def sweeps(whole: Any, runtime: EarlyExit, cache_set: CacheSet, images: np.ndarray) -> dict[str, Any]:
    """Part 2: the cache set recomposed for memory budgets (default composition) and α (MILP), each measured."""
    manifest, arrays = cache_set.manifest, cache_set.scores()
    unlimited = cache_set.composition(TARGET).memory_bytes
    smallest = min(v.memory_bytes for v in manifest.variants)
    compositions: dict[str, CompositionRecord] = {}
    for fraction in BUDGET_FRACTIONS:
        budget = None if fraction is None else max(smallest, int(fraction * unlimited))
        composed = compose(manifest, arrays, [TARGET], memory_budget_bytes=budget)
        label = "no limit" if budget is None else f"{budget / 1e6:.3g} MB"
        compositions[f"budget {label}"] = next(c for c in composed.compositions if c.default)
    for alpha in ALPHAS:
        composed = compose(manifest, arrays, [TARGET], alpha=alpha)
        compositions[f"alpha {alpha:g}"] = next(c for c in composed.compositions if c.method == "milp")
    methods: dict[str, Method] = {"base": plain(whole)}
    for label, composition in compositions.items():
        plan = ExitPlan(TARGET, {c.exit.block_index: c for c in cache_set.caches(composition)})
        composed_runtime = EarlyExit(runtime.chain, [plan], 0.0, label)
        composed_runtime.start_lookups("inline")
        methods[label] = early_exit(composed_runtime, CLASSES)
    with cpu_window(window := {"quiet_wait": wait_for_quiet(QUIET_WAIT_S)}):
        samples = interleave(methods, images)
    reference, base_mean = np.array(samples["base"].label), float(np.mean(samples["base"].latency_s))
    result: dict[str, Any] = {"window": window, "rows": len(images), "base": summary(samples["base"])}
    for label, composition in compositions.items():
        result[label] = summary(samples[label], reference, base_mean) | _composition(composition, manifest)
    return result


def batching(whole: Any, runtime: EarlyExit, images: np.ndarray) -> dict[str, Any]:
    """Part 3: GATI and the base model on the same batches of B rows (one request per row)."""
    methods = {"base": plain(whole), "base chain": plain(runtime.chain.run), "gati": early_exit(runtime, CLASSES)}
    result: dict[str, Any] = {}
    for batch in BATCHES:
        with cpu_window(window := {"quiet_wait": wait_for_quiet(QUIET_WAIT_S)}):
            samples = interleave(methods, images, batch)
        reference, base_mean = np.array(samples["base"].label), float(np.mean(samples["base"].latency_s))
        result[str(batch)] = {"window": window} | {
            name: summary(s, reference, base_mean) for name, s in samples.items()
        }
    return result


def seed_record(seed: int, cache_set: CacheSet, build: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    """One seed's build and the bars' methods as measured on its evaluate rows (per-row latencies kept, so
    `--bars-of` recomputes the bars), with its figures."""
    methods = {name: measured[name] for name in ("base", "base chain", *BAR_METHODS)}
    return {
        "seed": seed,
        "cache_set": shown_path(cache_set.directory),
        "build_s": build["wall_s"],
        "rows": measured["rows"],
        "window": measured["window"],
        "figures": seed_figures(methods),
        "methods": methods,
    }


def seed_figures(methods: dict[str, Any]) -> dict[str, Any]:
    """Per GATI form: its speedup of the mean latency over the faster of the two forms of the base model (whole
    program, block chain; so a slow baseline cannot make the speedup), its agreement, and its p99 against the base
    model's."""
    base = min((methods["base"], methods["base chain"]), key=lambda m: m["mean_ms"])
    return {
        name: {
            "speedup": base["mean_ms"] / methods[name]["mean_ms"],
            "agreement": methods[name]["agreement"],
            "mean_ms": methods[name]["mean_ms"],
            "base_mean_ms": base["mean_ms"],
            "p99_ms": methods[name]["p99_ms"],
            "base_p99_ms": base["p99_ms"],
        }
        | p99_ratio(methods[name]["latency_us"], base["latency_us"])
        for name in BAR_METHODS
    }


def bars(resnet: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The issue's bars on the ResNet-style CNN, in-process, for each place the lookups run (inline, and beside
    the model), over the seeds: the median speedup, with the agreement target met in every seed, and the median of
    the p99 ratios. A result from before `--seeds` counts as one seed."""
    if resnet is None:
        return []
    seeds = resnet.get("seeds") or [{"seed": None, "methods": resnet["methods"]}]
    figures = [seed_figures(seed["methods"]) for seed in seeds]
    runs = f"median of {len(seeds)} seed{'s' if len(seeds) > 1 else ''}"
    result = []
    for name, lookups in BAR_METHODS.items():
        each = [f[name] for f in figures]
        speedups, agreements = [f["speedup"] for f in each], [f["agreement"] for f in each]
        ratios = [f["p99_ratio"] for f in each]
        speedup, ratio = statistics.median(speedups), statistics.median(ratios)
        result += [
            {
                "bar": f"mean latency ≥ {BAR_SPEEDUP}× lower than the base model ({runs}) at ≥ {BAR_AGREEMENT:.0%} "
                f"agreement in every seed ({lookups})",
                "measured": f"{speedup:.2f}× ({runs}: {', '.join(f'{x:.2f}×' for x in speedups)}), agreement "
                f"{min(agreements):.4f} at least",
                "speedup": speedup,
                "speedups": speedups,
                "agreements": agreements,
                "pass": speedup >= BAR_SPEEDUP and min(agreements) >= BAR_AGREEMENT,
            },
            {
                "bar": f"p99 no worse than the base model's ({runs} of the p99 ratios; {lookups})",
                "measured": f"{ratio:.3f}× the base model's p99 ({', '.join(f'{x:.3f}' for x in ratios)})",
                "p99_ratio": ratio,
                "p99_ratios": ratios,
                "p99_ratio_95": [f["p99_ratio_95"] for f in each],
                "pass": ratio <= 1.0,
            },
        ]
    return result


def p99_ratio(method_us: list[int], base_us: list[int]) -> dict[str, Any]:
    """The method's p99 over the base model's, and its 95% bootstrap interval, resampling rows in pairs (each row
    was measured by both, one right after the other). The interval says whether this run decides the p99 bar; it
    covers the rows' sampling, not the machine's state, which moved the ratio from 0.85 to 1.16 over six runs on the
    2-core VM (2026-11-29)."""
    samples = np.asarray(method_us, float), np.asarray(base_us, float)

    def ratio(method: np.ndarray, base: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.percentile(method, 99, axis=axis) / np.percentile(base, 99, axis=axis)

    interval = bootstrap(samples, ratio, paired=True, n_resamples=2000, method="percentile", random_state=0)
    low, high = interval.confidence_interval
    return {"p99_ratio": float(ratio(*samples)), "p99_ratio_95": [float(low), float(high)]}


def _manifest(cache_set: CacheSet) -> dict[str, Any]:
    m = cache_set.manifest
    default = cache_set.composition(TARGET)
    return {
        "blocks": list(m.blocks),
        "block_latency_us": [round(t * 1e6, 1) for t in m.block_latency_s],
        "splits": m.data.splits,
        "settings": m.settings,
        "variants": [
            {"key": v.key, "lookup_us": round(v.lookup_latency_s * 1e6, 1), "memory_mb": v.memory_bytes / 1e6}
            for v in m.variants
        ],
        "default_composition": _composition(default, m),
    }


def _composition(c: CompositionRecord, manifest: Any) -> dict[str, Any]:
    return {
        "method": c.method,
        "alpha": c.alpha,
        "memory_budget_mb": None if c.memory_budget_bytes is None else c.memory_budget_bytes / 1e6,
        "memory_mb": c.memory_bytes / 1e6,
        "exits": [{"cache": e.key, "threshold": e.threshold} for e in c.exits],
        "expected": c.evaluate.model_dump() | {"speedup": sum(manifest.block_latency_s) / c.evaluate.mean_latency_s},
    }


def print_model(name: str, result: dict[str, Any]) -> None:
    methods = result["methods"]
    window = methods["window"]
    print(
        f"\n== {name}: {methods['rows']} evaluate rows, other cores {window['other_cores']}, "
        f"the model process {window.get('model_process_cores')}"
    )
    print(f"{'method':>16} {'mean ms':>8} {'p50':>7} {'p99':>7} {'agree':>7} {'acc':>6} {'speedup':>7}")
    for method, s in methods.items():
        if isinstance(s, dict) and "mean_ms" in s:
            print(
                f"{method:>16} {s['mean_ms']:8.3f} {s['p50_ms']:7.3f} {s['p99_ms']:7.3f} {s['agreement']:7.4f} "
                f"{s['accuracy']:6.4f} {s['speedup']:6.2f}×"
            )
    for label, s in result["sweeps"].items():
        if isinstance(s, dict) and "speedup" in s:
            print(f"  {label:>18}: {s['speedup']:.2f}× agree {s['agreement']:.4f}, {s['memory_mb']:.2f} MB")
    for batch, b in result["batching"].items():
        print(f"  batch {batch}: gati {b['gati']['speedup']:.2f}× agree {b['gati']['agreement']:.4f}")
    server = result["server"]
    on, off = server["on"], server["off"]
    print(f"  server: early exit {on['mean_ms']:.3f} vs off {off['mean_ms']:.3f} ms, agree {on['agreement']:.4f}")
    for seed in result.get("seeds", []):  # results from before --seeds have none
        forms = "; ".join(
            f"{name} {f['speedup']:.2f}× agree {f['agreement']:.4f} p99 {f['p99_ratio']:.2f}× the base's"
            for name, f in seed["figures"].items()
        )
        print(f"  seed {seed['seed']}: built in {seed['build_s']:.0f} s, {seed['rows']} evaluate rows: {forms}")


if __name__ == "__main__":
    main()
