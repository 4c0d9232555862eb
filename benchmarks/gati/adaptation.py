"""GATI's cache adaptation on a drifting stream: static caches against caches retrained online (issue 6, item 5).

The early-exit benchmark's ResNet-style CNN (`benchmarks/gati/models.py`, trained on a first run and shared with
`early_exit`; exported under benchmarks/results/tmp/gati-adapt/) gets a cache set built as `adaserve caches build
--fit-data fashion-mnist-train` builds one, with the early-exit benchmark's exploration: predictors fitted on
Fashion-MNIST's training rows; selectors, thresholds and held-out figures on 8,000 of its 10,000 test images, for
target .98. Held-out rows are what certification needs, and at .99 none of this model's builds certified an exit:
not on 4,000 test rows (300 check rows, no disagreement allowed), nor with fit data on 4,000, 6,000 or 8,000 (600,
900 and 1,200 check rows; 1, 3 and 6 allowed). The other 2,000 test images become a stream that drifts through
Fashion-MNIST-C style corruptions the base model was never trained on — clean, then brightness, contrast, Gaussian
blur and rotation, each at rising severity — processed in chunks (one chunk stands for one minute of traffic). Both
sides run every chunk through the runtime's `EarlyExit` (batches of the model's `max_batch_size`, lookups inline,
composed as a worker serves them), as a worker would:

- static: cache set v1, never changed;
- adapted: the newest version. About 20% of the stream is offered to a `SampleWindow`; after each chunk the
  `HitRateMonitor` is checked (hits below what it expects, or the period passed), and on a trigger `adapt`
  retrains the composition's caches on a recency-weighted draw from the window mixed with the validation data; an
  accepted version is written with `deploy` and loaded through `EarlyExit.load` for the next chunk. What the
  trigger expects (`--expect`) is the server's `caches.adaptation.expect`: `traffic` (the default), an adapted
  version's rates on its window's held-out rows and after a refusal no more than the live rates, or
  `composition`, the paper's, the composition's on its held-out rows (`benchmarks/gati/trigger.py` runs both).

Per chunk: hit rate and agreement with the base model (argmax) of both, and the base model's accuracy on the true
labels (how hard the drift is). Per retraining: the trigger, the rows, held-out agreement and hit rate before and
after, accepted or why not, and the time (base model forward pass, and retraining proper); each retraining is also
run from scratch (no warm start) beside it, to compare. The bar: adapted agreement never below static's, per chunk.

Usage: .venv/bin/python -m benchmarks.gati.adaptation [--quick] [--target 0.98] [--expect composition]
Writes benchmarks/results/gati_adaptation.json and .png (--quick: under benchmarks/results/tmp/).
"""

from __future__ import annotations

import argparse
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Literal, get_args

import numpy as np
import torch
from scipy import ndimage

from adaserve.adaptive.gati.adapt import AdaptResult, AdaptSettings, HitRateMonitor, SampleWindow, adapt, deploy
from adaserve.adaptive.gati.cacheset import CacheSet, ChainRecord, write_cache_set
from adaserve.adaptive.gati.certify import DEFAULT_RISK, accepted, split
from adaserve.adaptive.gati.explore import build_cache_set, load_build_data
from adaserve.adaptive.gati.runtime import EarlyExit
from adaserve.config import Expectation, LearnedCachesSpec
from adaserve.datasets import load_fashion_mnist
from adaserve.engine.messages import ExitCounts, RowParameters
from adaserve.repository import ModelSpec, read_artifact
from benchmarks.common import (
    RESULTS,
    SCRATCH,
    command_line,
    figure,
    load_window,
    machine,
    shown_path,
    write_json,
)
from benchmarks.gati.early_exit import FIT_SOURCE, explore_settings
from benchmarks.gati.models import NETS, export, trained

#: Corruption → parameter per severity 1–5 (Fashion-MNIST-C / ImageNet-C style ladders, on [0, 1] pixels).
SEVERITIES: dict[str, tuple[float, ...]] = {
    "brightness": (0.1, 0.2, 0.3, 0.4, 0.5),  # added to every pixel
    "contrast": (0.6, 0.45, 0.3, 0.2, 0.1),  # factor on the distance from the image's mean
    "blur": (0.5, 0.75, 1.0, 1.25, 1.5),  # Gaussian sigma, pixels
    "rotation": (10.0, 20.0, 30.0, 40.0, 50.0),  # degrees, sign at random per image
}
BUILD_ROWS = 8000
#: The agreement target: at .99 no build of this model on 8,000 held-out rows or fewer certified an exit.
TARGET = 0.98


def corrupt(images: np.ndarray, kind: str, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Images [N, 1, 28, 28] in [0, 1] with one corruption at severity 1–5 (0: clean)."""
    if severity == 0:
        return images
    level = SEVERITIES[kind][severity - 1]
    if kind == "brightness":
        out = images + level
    elif kind == "contrast":
        mean = images.mean(axis=(1, 2, 3), keepdims=True)
        out = (images - mean) * level + mean
    elif kind == "blur":
        out = ndimage.gaussian_filter(images, sigma=(0, 0, level, level))
    else:
        angles = level * rng.choice([-1.0, 1.0], len(images))
        out = np.stack(
            [
                ndimage.rotate(image, angle, axes=(1, 2), reshape=False, order=1)
                for image, angle in zip(images, angles, strict=True)
            ]
        )
    return np.clip(out, 0.0, 1.0).astype(np.float32)


def schedule(quick: bool) -> list[tuple[str, int]]:
    """(corruption, severity) per chunk: clean first, then each corruption at rising severity."""
    clean, severities = (1, (2, 4)) if quick else (4, (1, 2, 3, 4, 5))
    return [("clean", 0)] * clean + [(kind, s) for kind in SEVERITIES for s in severities]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small stream and quick exploration; under tmp/")
    parser.add_argument("--target", type=float, default=TARGET)
    parser.add_argument(
        "--seed", type=int, default=0, help="the stream's order, its corruptions' randomness and the window's sample"
    )
    parser.add_argument(
        "--expect", choices=get_args(Expectation), default="traffic", help="what the retraining trigger expects"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    out = (SCRATCH if args.quick else RESULTS) / "gati_adaptation.json"
    plan = schedule(args.quick)
    settings = {"build_rows": BUILD_ROWS, "chunk_rows": CHUNK_ROWS, "chunk_s": CHUNK_S, "seed": args.seed}
    record = header("gati_adaptation", args.quick, settings | {"severities": SEVERITIES}, args.target)
    with load_window(record):
        built = build(args.target, args.quick)
        stream = drifting(built, CHUNK_ROWS, plan, args.seed)
        record |= serve_stream(built, args.target, CHUNK_ROWS, stream, args.seed, args.expect)
    write_json(record, out)
    plot(record, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")


def header(benchmark: str, quick: bool, settings: dict[str, Any], target: float = TARGET) -> dict[str, Any]:
    """A record before its run (this benchmark's and the other GATI adaptation benchmarks'): what, where, with which
    settings."""
    return {
        "benchmark": benchmark,
        "command": command_line(),
        "machine": machine(),
        "settings": {"quick": quick, "target": target, "fit_source": FIT_SOURCE} | settings | {"threads": 1},
    }


#: Rows per chunk, simulated seconds per chunk, and the monitor's period.
CHUNK_ROWS = 80
CHUNK_S = 60.0
PERIOD_S = 600.0
VERIFY_FRACTION = 0.2
#: The window: rows it holds, rows drawn for a retraining, the share of the stream offered rows it keeps, and the
#: fewest rows it must hold before a trigger is acted on.
WINDOW = {"capacity": 600, "draw": 400, "fraction": 0.2, "min_rows": 100}


@dataclass(frozen=True)
class Build:
    """The scratch model with a fresh cache set, and the data around it."""

    spec: ModelSpec
    cache_set: CacheSet
    build_s: float
    validation_x: np.ndarray  # the data the set was built from (test rows, then training rows), for `adapt`
    images: np.ndarray  # Fashion-MNIST's test split
    labels: np.ndarray
    unused: np.ndarray  # the test rows the set was not built from, in order


def build(target: float, quick: bool) -> Build:
    """Export the scratch model and build its cache set for `target` (SystemExit when it certifies no exit)."""
    spec = scratch_model()
    began = time.perf_counter()
    settings = replace(explore_settings(quick), max_samples=BUILD_ROWS)
    built = build_cache_set(spec, "fashion-mnist", settings, targets=[target], fit_source=FIT_SOURCE, progress=False)
    build_s = time.perf_counter() - began
    if not built.composition(target).exits:
        check = len(split(built.manifest.data.splits["calibrate"])[1])
        allowed = accepted(range(check + 1), check, target) - 1  # p grows with k: the test passes 0…allowed
        raise SystemExit(
            f"the cache set certified no exit for target {target:g}, so there is no cache to adapt: on its {check} "
            f"check rows the test at risk {DEFAULT_RISK:g} accepts a setting with at most {allowed} disagreements "
            "(-1: none), and the strictest had more; a lower --target accepts more"
        )
    validation_x, _, _ = load_build_data("fashion-mnist", FIT_SOURCE, spec.config)
    images, labels = load_fashion_mnist("test")
    used = np.concatenate([rows for name, rows in built.scores().items() if name.endswith("_rows")])
    return Build(spec, built, build_s, validation_x, images, labels, np.setdiff1d(np.arange(len(images)), used))


@dataclass(frozen=True)
class Chunk:
    """One chunk of a stream: its rows, their true labels, and the fields that describe it in the record."""

    x: np.ndarray
    labels: np.ndarray
    about: dict[str, Any]


def drifting(built: Build, chunk_rows: int, plan: list[tuple[str, int]], seed: int) -> Iterator[Chunk]:
    """The drifting stream: the unused test rows in a seeded order, each chunk with its (corruption, severity)."""
    stream = built.unused[: len(plan) * chunk_rows].copy()
    rng = np.random.default_rng(seed)
    rng.shuffle(stream)
    for index, (kind, severity) in enumerate(plan):
        rows = stream[index * chunk_rows : (index + 1) * chunk_rows]
        x = corrupt(built.images[rows], kind, severity, rng)
        yield Chunk(x, built.labels[rows], {"corruption": kind, "severity": severity})


@dataclass(frozen=True)
class Served:
    """A chunk as both sides served it: the base model's classes, each side's figures by name (`static`,
    `adapted`, and any other side measured), and the adapted side's exit counts, what the monitor observes."""

    base: np.ndarray
    sides: dict[str, dict[str, Any]]
    counts: ExitCounts


#: How a stream's chunk is served: (static runtime, adapted runtime, rows) → what they did.
ServeChunk = Callable[[EarlyExit, EarlyExit, np.ndarray], Served]


def batched(batch: int) -> ServeChunk:
    """Each chunk through both runtimes in batches of `batch` rows, one request per row, untimed."""

    def serve_chunk(static: EarlyExit, adapted: EarlyExit, x: np.ndarray) -> Served:
        base = static.chain.run(torch.from_numpy(x)).argmax(1).numpy()
        static_side, _ = serve(static, x, base, batch)
        adapted_side, counts = serve(adapted, x, base, batch)
        return Served(base, {"static": static_side, "adapted": adapted_side}, counts)

    return serve_chunk


def serve_stream(
    built: Build,
    target: float,
    chunk_rows: int,
    stream: Iterable[Chunk],
    seed: int,
    expect: Expectation,
    scratch: bool = True,
    serve_chunk: ServeChunk | None = None,
) -> dict[str, Any]:
    """A stream through static and adapted caches of a built set (v1; versions after it are written beside), each
    chunk served by `serve_chunk` (default: `batched` at the model's largest batch); `scratch`: also run each
    retraining from scratch, to compare with the warm start."""
    spec, validation_x = built.spec, built.validation_x
    serve_chunk = serve_chunk or batched(spec.config.max_batch_size)
    static = load_runtime(spec, target, built.cache_set.version)
    adapted, current = static, built.cache_set
    monitor = HitRateMonitor(
        current.composition(target), now=0.0, period_s=PERIOD_S, min_rows=chunk_rows, expect=expect
    )
    window = SampleWindow(int(WINDOW["capacity"]), fraction=WINDOW["fraction"], seed=seed)
    adapt_settings = AdaptSettings()
    chunks, retrains = [], []
    for index, chunk in enumerate(stream):
        served = serve_chunk(static, adapted, chunk.x)
        monitor.observe(served.counts)
        window.offer(chunk.x)
        chunks.append(
            {"chunk": index}
            | chunk.about
            | {"rows": len(chunk.x), "base_accuracy": float(np.mean(served.base == chunk.labels))}
            | served.sides
        )
        chunks[-1]["adapted"] = served.sides["adapted"] | {"version": current.version}
        about = " ".join(str(value) for value in chunk.about.values())
        print(f"chunk {index:2d} {about}: static {served.sides['static']} adapted {chunks[-1]['adapted']}", flush=True)
        now = (index + 1) * CHUNK_S
        reason = monitor.check(now)
        if reason is None or len(window) < WINDOW["min_rows"]:
            continue
        drawn = window.draw(int(WINDOW["draw"]))
        result = adapt(adapted.chain, current, current.composition(target), drawn, validation_x, adapt_settings)
        retrains.append(
            {"after_chunk": index, "trigger": reason, "window_rows": len(drawn), "warm": adaptation_record(result)}
        )
        if scratch:
            cold = replace(adapt_settings, warm_start=False)
            retrains[-1]["scratch"] = adaptation_record(
                adapt(adapted.chain, current, current.composition(target), drawn, validation_x, cold)
            )
        if result.accepted:
            current = deploy(spec, result)
            adapted = load_runtime(spec, target, "latest")
        monitor.reset(current.composition(target), now, settle=not result.accepted)  # as the server's service
        retrains[-1]["new_version"] = current.version
        print(f"  retrain ({reason}): {retrains[-1]['warm']}", flush=True)
    return {
        "cache_set": summary(built.cache_set, target, built.build_s),
        "window": WINDOW,
        "monitor": {
            "period_s": PERIOD_S,
            "margin": monitor.margin,
            "min_rows": monitor.min_rows,
            "min_verified": monitor.min_verified,
            "verify_fraction": VERIFY_FRACTION,
            "expect": expect,
        },
        "adapt_settings": adapt_settings.record(),
        "chunks": chunks,
        "retrains": retrains,
        "bar": bar(chunks),
    } | ({"warm_vs_scratch": warm_vs_scratch(retrains)} if scratch else {})


def scratch_model() -> ModelSpec:
    """The ResNet-style CNN of the early-exit benchmark, its caches composed as a worker serves them (lookups inline).
    The example CNN served here before: once lookups were timed in the flow, none of its caches saved more than its
    lookup cost, even costed beside the model, and its composition deployed none; this benchmark measures hit rate
    and agreement under drift, and needs a deployed cache (on the ResNet two exits are deployed)."""
    net = NETS["resnet"]
    base, _ = trained(f"{net.name}-base", net.base, load_fashion_mnist("train"), net.epochs)
    repository = SCRATCH / "gati-adapt" / "models"
    shutil.rmtree(repository / net.name, ignore_errors=True)
    return export(repository, net.name, base, caches={}, workers=[{"batch": 1, "threads": 1}])


def load_runtime(spec: ModelSpec, target: float, version: int | Literal["latest"]) -> EarlyExit:
    """The runtime a worker would load for the model with `caches: {targets: [target], version: version}`; a
    `VERIFY_FRACTION` of hits also runs to the end, for the monitor (answers are the cache's all the same), drawn
    from a seeded generator, so that a run repeats and two runs on one stream differ by what they compare only."""
    caches = LearnedCachesSpec(targets=(target,), version=version, verify_fraction=VERIFY_FRACTION)
    config = spec.config.model_copy(update={"caches": caches})
    early_exit = EarlyExit.load(config, spec.artifact, read_artifact(spec.artifact, config.max_batch_size))
    early_exit.start_lookups("inline")
    early_exit.seed(0)
    return early_exit


def serve(early_exit: EarlyExit, x: np.ndarray, base: np.ndarray, batch: int) -> tuple[dict[str, float], ExitCounts]:
    """One chunk through the runtime in batches, one request per row: hit rate and agreement with `base`."""
    outputs = np.empty((len(x), 10), np.float32)
    answered: list[RowParameters] = []
    with torch.inference_mode():
        for start in range(0, len(x), batch):
            part = slice(start, min(start + batch, len(x)))
            requests = [RowParameters(i, 1, {}) for i in range(part.stop - part.start)]
            early_exit.run(torch.from_numpy(x[part]), outputs[part], requests, answered.extend)
    (counts,) = early_exit.take_counts()  # one target
    return {
        "hit_rate": sum(counts.hits.values()) / len(x),
        "agreement": float(np.mean(outputs.argmax(1) == base)),
    }, counts


def serve_retrained(
    spec: ModelSpec, target: float, result: AdaptResult, x: np.ndarray, base: np.ndarray
) -> dict[str, float]:
    """A retraining's caches, accepted or not, served on `x` from a scratch version (removed afterwards): hit rate
    and agreement with `base`."""
    directory = write_cache_set(spec, result.manifest, result.weights, result.scores)
    try:
        served, _ = serve(load_runtime(spec, target, int(directory.name[1:])), x, base, spec.config.max_batch_size)
    finally:
        shutil.rmtree(directory)
    return served


def adaptation_record(result: AdaptResult) -> dict[str, Any]:
    return {
        "accepted": result.accepted,
        "reason": result.reason,
        "before": chain_record(result.before),
        "before_window": chain_record(result.before_window),
        "after_window": chain_record(result.after_window),
        "after": chain_record(result.after),
        "exits": [{"block": e.block, "threshold": e.threshold} for e in result.composition.exits],
        "rows": result.rows,
        "forward_s": round(result.forward_s, 3),
        "retrain_s": round(result.retrain_s, 3),
    }


def chain_record(chain: ChainRecord) -> dict[str, float]:
    return {"agreement": chain.agreement, "hit_rate": sum(chain.exit_rates)}


def summary(cache_set: CacheSet, target: float, build_s: float) -> dict[str, Any]:
    composition = cache_set.composition(target)
    return {
        "directory": shown_path(cache_set.directory),
        "build_s": round(build_s, 1),
        "rows": cache_set.manifest.data.splits,
        "exits": [{"key": e.key, "threshold": e.threshold} for e in composition.exits],
        "expected": chain_record(composition.evaluate),
    }


def bar(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    below = [c["chunk"] for c in chunks if c["adapted"]["agreement"] < c["static"]["agreement"]]
    return {"adapted_never_below_static": not below, "chunks_below": below}


def warm_vs_scratch(retrains: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over the retrainings of each start: held-out agreement and hit rate after, times, acceptances."""
    result = {}
    for side in ("warm", "scratch"):
        runs = [r[side] for r in retrains]
        means = {key: [run["after"][key] for run in runs] for key in ("agreement", "hit_rate")}
        means |= {key: [run[key] for run in runs] for key in ("retrain_s", "forward_s")}
        result[side] = {key: float(np.mean(v)) if v else None for key, v in means.items()}
        result[side]["accepted"] = sum(run["accepted"] for run in runs)
    return result


def outcome_colour(retrain: dict[str, Any]) -> str:
    """A retraining's mark on the plots: green accepted, red refused."""
    return "tab:green" if retrain["warm"]["accepted"] else "tab:red"


def label_chunks(ax: Any, chunks: list[dict[str, Any]]) -> None:
    """Name each chunk on the x axis by its corruption and severity."""
    ax.set_xticks([c["chunk"] for c in chunks], [f"{c['corruption'][:5]}{c['severity'] or ''}" for c in chunks])
    ax.tick_params(axis="x", labelrotation=60)


def plot(record: dict[str, Any], path: Any) -> None:
    chunks, target = record["chunks"], record["settings"]["target"]
    index = [c["chunk"] for c in chunks]
    fig = figure(11, 7.5)
    axes = fig.subplots(3, 1, sharex=True)
    for side, style in (("static", "o-"), ("adapted", "s-")):
        axes[0].plot(index, [c[side]["agreement"] for c in chunks], style, label=side, markersize=4)
        axes[1].plot(index, [c[side]["hit_rate"] for c in chunks], style, label=side, markersize=4)
    axes[0].axhline(target, color="grey", linestyle=":", label=f"target {target:g}")
    axes[0].set_ylabel("agreement with base")
    axes[1].set_ylabel("hit rate")
    axes[2].plot(index, [c["base_accuracy"] for c in chunks], "k^-", markersize=4)
    axes[2].set_ylabel("base model accuracy")
    for retrain in record["retrains"]:
        for ax in axes:
            ax.axvline(retrain["after_chunk"] + 0.5, color=outcome_colour(retrain), alpha=0.4, linewidth=1)
    label_chunks(axes[2], chunks)
    axes[0].legend(loc="lower left", fontsize=8)
    axes[0].set_title(
        "GATI adaptation on a drifting Fashion-MNIST stream (ResNet-style CNN); "
        "vertical lines: retraining (green accepted, red refused)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
