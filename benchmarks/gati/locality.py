"""GATI under temporal locality: static and adapted learned caches against the base model on a class-skewed stream
(issue 57, item 5; the paper's §7.2.2 (i) and (iii)).

The adaptation benchmark's model, cache set and online loop (`benchmarks/gati/adaptation.py`: the ResNet-style CNN,
its set built for target .98 on 8,000 Fashion-MNIST test images, a `SampleWindow` fed 20% of the stream, the
`HitRateMonitor` checked after each chunk, `adapt` and `deploy` on a trigger) serve a stream whose classes are
skewed instead of corrupted: each chunk's rows draw their class from a Zipf distribution, α = 1.5 over the 10
classes (the class ranked k has weight 1/k^α: the first takes 50% of the rows, the second 18%, the third 10%), and
the ranking is re-drawn every `--period` chunks with a new dominant class, as the paper's synthetic workload changes
its dominant class every 15 minutes. A class's images come from the 2,000 test images the set was not built from,
each once, in a seeded order; a class that has served all of its images starts over on them (`repeats` per chunk;
the overall figures are also given over the first-seen rows alone, which no retraining can have seen).

Every chunk is served one request at a time (batch 1, one thread, lookups inline, as early_exit measures): the base
model as a worker runs it whole, its block chain, the static caches (v1, never changed) and the adapted ones (the
newest accepted version), taking turns on each row in a random order (`benchmarks/gati/runs.py`). A runtime newly
loaded is warmed up on a few rows before it is timed, as the paper leaves out the requests that waited for a cache
update. A request's latency runs to its answer: a hit answers at its exit; the 20% of hits the runtime verifies for
the monitor run on to the end after answering (each side's `busy_mean_ms` counts that).

Recorded per chunk: the ranking and its dominant class, repeats, the base model's accuracy, and per side mean
latency, hit rate and agreement with the base model's argmax; overall, each side's mean / p50 / p99, speedup over
the faster form of the base model (whole program or chain, as early_exit's bars), agreement and hit rate; each
retraining as the adaptation benchmark records it. Bars (issue 57): adapted caches ≥ 4× lower mean latency than
the base at ≥ 99% agreement; adapted no worse than static (speedup at least static's, at agreement at least the
lower of static's and 99%).

There is no stream with frame-to-frame locality here: Fashion-MNIST holds unrelated still images, and this
machine has no video; a "video" made by perturbing one image frame to frame would measure the perturbation, so
none is made.

Usage: .venv/bin/python -m benchmarks.gati.locality [--quick] [--chunks 32] [--period 8] [--chunk-rows 60]
Writes benchmarks/results/gati_locality.json and .png (--quick: under benchmarks/results/tmp/).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.stats import bootstrap

from adaserve.adaptive.gati.runtime import EarlyExit
from adaserve.datasets import FASHION_MNIST_CLASSES
from adaserve.repository import executable, read_artifact
from benchmarks.common import RESULTS, SCRATCH, figure, load_window, write_json
from benchmarks.gati.adaptation import (
    TARGET,
    Build,
    Chunk,
    Served,
    build,
    header,
    outcome_colour,
    serve_stream,
)
from benchmarks.gati.models import CLASSES
from benchmarks.gati.runs import Method, Model, Samples, cpu_window, early_exit, interleave, plain, summary
from benchmarks.tables.summaries import listed_bars, table

ALPHA = 1.5
#: Rows per chunk, chunks in the stream and every how many the ranking of classes is re-drawn: 32 chunks of 60
#: rows are about as many rows as the 2,000 unused test images, and four rankings.
CHUNK_ROWS, CHUNKS, PERIOD = 60, 32, 8
QUICK_CHUNKS, QUICK_PERIOD = 8, 4
#: Rows each newly loaded runtime runs untimed before it is measured.
WARM_UP_ROWS = 20
BAR_SPEEDUP, BAR_AGREEMENT = 4.0, 0.99
SIDES = ("base", "base chain", "static", "adapted")
#: Each side's colour and marker on the plot.
STYLES = {"base": ("k", "^"), "base chain": ("grey", "v"), "static": ("C0", "o"), "adapted": ("C1", "s")}


def zipf(alpha: float, classes: int = CLASSES) -> np.ndarray:
    """The share of each rank: 1/k^α, normalised."""
    weights = 1.0 / np.arange(1, classes + 1) ** alpha
    return weights / weights.sum()


@dataclass
class Skewed:
    """The class-skewed stream over `built`'s unused test rows; `first_seen` fills as it is read: per chunk, which
    rows show an image for the first time in the stream."""

    built: Build
    chunk_rows: int
    chunks: int
    period: int
    alpha: float = ALPHA
    seed: int = 0
    first_seen: list[np.ndarray] = field(default_factory=list)

    def __iter__(self) -> Iterator[Chunk]:
        rng = np.random.default_rng(self.seed)
        labels = self.built.labels[self.built.unused]
        pools = {c: rng.permutation(self.built.unused[labels == c]) for c in range(CLASSES)}
        taken = dict.fromkeys(pools, 0)
        shares, ranking = zipf(self.alpha), rng.permutation(CLASSES)
        for index in range(self.chunks):
            if index and index % self.period == 0:
                ranking = self._redraw(rng, ranking)
            drawn = ranking[rng.choice(CLASSES, self.chunk_rows, p=shares)]
            rows, first = np.empty(self.chunk_rows, np.int64), np.empty(self.chunk_rows, bool)
            for position, c in enumerate(drawn):
                pool = pools[c]
                rows[position], first[position] = pool[taken[c] % len(pool)], taken[c] < len(pool)
                taken[c] += 1
            self.first_seen.append(first)
            about = {
                "dominant": FASHION_MNIST_CLASSES[ranking[0]],
                "ranking": [int(c) for c in ranking],
                "repeats": int((~first).sum()),
            }
            yield Chunk(self.built.images[rows], self.built.labels[rows], about)

    @staticmethod
    def _redraw(rng: np.random.Generator, ranking: np.ndarray) -> np.ndarray:
        """A new ranking whose dominant class is not the last one's."""
        while True:
            drawn = rng.permutation(CLASSES)
            if drawn[0] != ranking[0]:
                return drawn


class Timed:
    """Serves each chunk one request at a time, the base model (whole and chain) and both sides of caches taking
    turns on every row (`interleave`); keeps every side's samples over the stream. A `ServeChunk`."""

    def __init__(self, whole: Model, last: str) -> None:
        self.whole, self.last = whole, last
        self.samples = {side: Samples() for side in SIDES}
        self._warm: list[EarlyExit] = []

    def __call__(self, static: EarlyExit, adapted: EarlyExit, x: np.ndarray) -> Served:
        for runtime in (static, adapted):
            self._warm_up(runtime, x)
        methods: dict[str, Method] = {
            "base": plain(self.whole),
            "base chain": plain(static.chain.run),
            "static": early_exit(static, CLASSES),
        }
        if adapted is not static:
            methods["adapted"] = early_exit(adapted, CLASSES)
        samples = interleave(methods, x, warm_up=0, seed=len(self.samples["base"].label))
        samples.setdefault("adapted", samples["static"])  # the same caches: one runtime served both
        counts = adapted.take_counts()[0]
        static.take_counts()  # static's own, of no use (empty when it is the adapted one)
        reference = np.array(samples["base"].label)
        base_mean_s = min(float(np.mean(samples[side].latency_s)) for side in ("base", "base chain"))
        sides = {}
        for side in SIDES:
            extend(self.samples[side], samples[side])
            figures = summary(samples[side], reference, base_mean_s)
            sides[side] = {"mean_ms": figures["mean_ms"]}
            if side in ("static", "adapted"):
                sides[side] |= {
                    "hit_rate": float(hits(samples[side], self.last).mean()),
                    "agreement": figures["agreement"],
                    "speedup": figures["speedup"],
                }
        return Served(reference, sides, counts)

    def _warm_up(self, runtime: EarlyExit, x: np.ndarray) -> None:
        """A runtime's first rows run untimed (a new shape's first call costs about a millisecond); its counts
        of them are dropped."""
        if any(runtime is warm for warm in self._warm):
            return
        run = early_exit(runtime, CLASSES)
        for row in range(min(WARM_UP_ROWS, len(x))):
            run(x[row : row + 1])
        runtime.take_counts()
        self._warm.append(runtime)


def extend(total: Samples, part: Samples) -> None:
    """`part`'s rows after `total`'s."""
    for name in ("latency_s", "label", "exit_block", "busy_s"):
        getattr(total, name).extend(getattr(part, name))


def hits(samples: Samples, last: str) -> np.ndarray:
    """Which rows a cache answered: those that left the chain before its last block."""
    return np.array([block != last for block in samples.exit_block])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short stream and quick exploration; under tmp/")
    parser.add_argument("--target", type=float, default=TARGET)
    parser.add_argument("--chunks", type=int, help=f"chunks in the stream (default {CHUNKS}; --quick {QUICK_CHUNKS})")
    parser.add_argument("--period", type=int, help=f"re-draw the ranking every this many chunks (default {PERIOD})")
    parser.add_argument("--chunk-rows", type=int, default=CHUNK_ROWS)
    parser.add_argument("--alpha", type=float, default=ALPHA, help="the Zipf exponent of the class skew")
    parser.add_argument("--seed", type=int, default=0, help="the stream's classes and images, the window's sample")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    out = (SCRATCH if args.quick else RESULTS) / "gati_locality.json"
    chunks = args.chunks or (QUICK_CHUNKS if args.quick else CHUNKS)
    period = args.period or (QUICK_PERIOD if args.quick else PERIOD)
    settings = {"chunks": chunks, "period": period, "chunk_rows": args.chunk_rows, "alpha": args.alpha}
    record = header("gati_locality", args.quick, settings | {"seed": args.seed}, args.target)
    with load_window(record):
        built = build(args.target, args.quick)
        record |= run(built, args.target, Skewed(built, args.chunk_rows, chunks, period, args.alpha, args.seed))
    write_json(record, out)
    plot(record, out.with_suffix(".png"))
    _print(record, out)


def run(built: Build, target: float, stream: Skewed) -> dict[str, Any]:
    """The stream through the base model, static and adapted caches, timed; the overall figures and the bars."""
    whole = executable(read_artifact(built.spec.artifact, built.spec.config.max_batch_size))
    last = built.cache_set.manifest.blocks[-1]
    timed = Timed(whole, last)
    window: dict[str, Any] = {}
    with cpu_window(window):
        result = serve_stream(
            built, target, stream.chunk_rows, stream, stream.seed, "traffic", scratch=False, serve_chunk=timed
        )
    figures = overall(timed.samples, np.concatenate(stream.first_seen), last)
    return result | {"cpu": window, "overall": figures, "bars": bars(figures)}


def overall(samples: dict[str, Samples], first_seen: np.ndarray, last: str) -> dict[str, Any]:
    """Each side over the whole stream: mean / p50 / p99, speedup over the faster form of the base model, agreement
    with the base model and hit rate, and for the caches the same over the rows shown for the first time."""
    reference = np.array(samples["base"].label)
    faster = min(("base", "base chain"), key=lambda side: np.mean(samples[side].latency_s))
    base_mean_s = float(np.mean(samples[faster].latency_s))
    result: dict[str, Any] = {"faster_base": faster, "rows": len(reference), "first_seen_rows": int(first_seen.sum())}
    for side in SIDES:
        figures = summary(samples[side], reference, base_mean_s)
        if side in ("static", "adapted"):
            hit, agree = hits(samples[side], last), np.array(samples[side].label) == reference
            figures |= {
                "hit_rate": float(hit.mean()),
                "first_seen": {"agreement": float(agree[first_seen].mean()), "hit_rate": float(hit[first_seen].mean())},
            }
        result[side] = figures | {"latency_us": [round(t * 1e6) for t in samples[side].latency_s]}
    return result


def bars(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 57's bars for GATI under temporal locality."""
    adapted, static = figures["adapted"], figures["static"]
    base_ms = figures[figures["faster_base"]]["mean_ms"]
    ratio = mean_ratio(adapted["latency_us"], static["latency_us"])
    return [
        {
            "bar": f"mean latency ≥ {BAR_SPEEDUP:g}× lower than the base model at ≥ {BAR_AGREEMENT:.0%} agreement "
            "(adapted caches, class-skewed stream)",
            "measured": f"{adapted['speedup']:.2f}× ({adapted['mean_ms']:.3f} vs {base_ms:.3f} ms), agreement "
            f"{adapted['agreement']:.4f}",
            "pass": adapted["speedup"] >= BAR_SPEEDUP and adapted["agreement"] >= BAR_AGREEMENT,
        },
        {
            "bar": "adapted caches no worse than static: mean latency not above static's beyond its 95% interval, at "
            f"agreement at least the lower of static's and {BAR_AGREEMENT:.0%}",
            "measured": f"{adapted['speedup']:.2f}× vs {static['speedup']:.2f}× (adapted ÷ static mean latency "
            f"{ratio['ratio']:.3f}, 95% {ratio['interval'][0]:.3f}–{ratio['interval'][1]:.3f}), agreement "
            f"{adapted['agreement']:.4f} vs {static['agreement']:.4f}",
            "pass": ratio["interval"][0] <= 1.0 and adapted["agreement"] >= min(static["agreement"], BAR_AGREEMENT),
        },
    ]


def mean_ratio(adapted_us: list[int], static_us: list[int]) -> dict[str, Any]:
    """Adapted's mean latency over static's, and its 95% bootstrap interval resampling requests in pairs (each
    request was served by both, one right after the other): timing noise alone moves the ratio off 1 even where
    both sides serve the same caches."""
    samples = np.asarray(adapted_us, float), np.asarray(static_us, float)

    def ratio(adapted: np.ndarray, static: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.mean(adapted, axis=axis) / np.mean(static, axis=axis)

    interval = bootstrap(samples, ratio, paired=True, n_resamples=2000, method="percentile", random_state=0)
    low, high = interval.confidence_interval
    return {"ratio": float(ratio(*samples)), "interval": [float(low), float(high)]}


def _print(report: dict[str, Any], output: Path) -> None:
    """The cache set, the overall figures, the bars, the retrainings and the chunks, as Markdown tables."""
    cache_set, figures, cpu = report["cache_set"], report["overall"], report["cpu"]
    exits = ", ".join(f"{e['key']} (threshold {e['threshold']:.3f})" for e in cache_set["exits"])
    expected = cache_set["expected"]
    print(
        f"Cache set v1: exits {exits}; on its held-out rows agreement {expected['agreement']:.4f}, hit rate "
        f"{expected['hit_rate']:.3f}; built in {cache_set['build_s']:.0f} s. The stream: {figures['rows']} requests "
        f"in {cpu['wall_s']:.0f} s, this process {cpu['own_cores']:.2f} cores, others {cpu['other_cores']:.2f}."
    )
    print()
    rows = []
    for side in SIDES:
        s = figures[side]
        first = s.get("first_seen", {})
        rows.append(
            [
                side,
                f"{s['mean_ms']:.3f}",
                f"{s['p50_ms']:.3f}",
                f"{s['p99_ms']:.3f}",
                f"{s['speedup']:.2f}×",
                _cell(s.get("agreement"), ".4f"),
                _cell(s.get("hit_rate"), ".3f"),
                f"{_cell(first.get('agreement'), '.4f')} / {_cell(first.get('hit_rate'), '.3f')}",
            ]
        )
    header = ["side", "mean (ms)", "p50 (ms)", "p99 (ms)", "speedup", "agreement", "hit rate"]
    print(table([*header, f"first-seen rows ({figures['first_seen_rows']}): agreement / hit rate"], rows))
    print()
    print(listed_bars(report["bars"]))
    print()
    retrains = [
        [r["after_chunk"], r["trigger"], r["warm"]["accepted"] or r["warm"]["reason"], r.get("new_version", "")]
        for r in report["retrains"]
    ]
    print(table(["after chunk", "trigger", "accepted (or why not)", "version"], retrains) if retrains else "")
    print()
    chunk_rows = [
        [
            c["chunk"],
            c["dominant"],
            c["repeats"],
            f"{c['base']['mean_ms']:.3f}",
            _side(c["static"]),
            _side(c["adapted"]),
            c["adapted"]["version"],
        ]
        for c in report["chunks"]
    ]
    side = "mean ms / agreement / hit rate"
    print(table(["chunk", "dominant", "repeats", "base (ms)", f"static: {side}", "adapted", "v"], chunk_rows))
    print(f"\nwrote {output} and {output.with_suffix('.png')}")


def _cell(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _side(side: dict[str, Any]) -> str:
    return f"{side['mean_ms']:.3f} / {side['agreement']:.3f} / {side['hit_rate']:.3f}"


def plot(record: dict[str, Any], path: Path) -> None:
    """Per chunk: mean latency, hit rate and agreement of each side, retrainings and ranking changes marked; beside
    them, the latency distribution over the stream."""
    chunks, settings = record["chunks"], record["settings"]
    index = np.array([c["chunk"] for c in chunks])
    fig = figure(14, 8)
    grid = fig.add_gridspec(3, 2, width_ratios=(2.2, 1))
    axes = [fig.add_subplot(grid[0, 0])]
    axes += [fig.add_subplot(grid[row, 0], sharex=axes[0]) for row in (1, 2)]
    for side in ("base", "static", "adapted"):
        colour, marker = STYLES[side]
        style = {"color": colour, "marker": marker, "markersize": 3, "label": side}
        axes[0].plot(index, [c[side]["mean_ms"] for c in chunks], **style)
        if side != "base":
            axes[1].plot(index, [c[side]["hit_rate"] for c in chunks], **style)
            axes[2].plot(index, [c[side]["agreement"] for c in chunks], **style)
    for ax in axes[:2]:
        ax.tick_params(labelbottom=False)
    axes[0].set_ylabel("mean latency (ms)\nbatch 1, one thread")
    axes[0].set_ylim(bottom=0)
    axes[1].set_ylabel("hit rate")
    axes[2].set_ylabel("agreement with base")
    axes[2].axhline(BAR_AGREEMENT, color="grey", linestyle=":", label=f"{BAR_AGREEMENT:.0%}")
    for retrain in record["retrains"]:
        for ax in axes:
            ax.axvline(retrain["after_chunk"] + 0.5, color=outcome_colour(retrain), alpha=0.4, linewidth=1)
    starts = [c["chunk"] for c in chunks if c["chunk"] % settings["period"] == 0]
    for ax in axes:
        for start in starts[1:]:
            ax.axvline(start - 0.5, color="grey", linestyle="--", linewidth=0.8)
    axes[2].set_xticks(starts, [f"{chunks[s]['dominant']}\n(chunk {s})" for s in starts], fontsize=7)
    axes[2].set_xlabel("chunk; dashed: the ranking re-drawn (its dominant class below)")
    axes[0].legend(fontsize=8)
    axes[2].legend(fontsize=8, loc="lower left")
    axes[0].set_title(
        f"Zipf α = {settings['alpha']:g} over the classes; retraining green accepted, red refused", fontsize=9
    )
    cdf = fig.add_subplot(grid[:, 1])
    figures = record["overall"]
    for side in SIDES:
        ms = np.sort(np.array(figures[side]["latency_us"]) / 1e3)
        label = f"{side}: {figures[side]['mean_ms']:.3f} ms, {figures[side]['speedup']:.2f}×"
        cdf.plot(ms, np.arange(1, len(ms) + 1) / len(ms), color=STYLES[side][0], label=label)
    cdf.set_xscale("log")
    cdf.set_xlabel("latency (ms)")
    cdf.set_ylabel("fraction of requests")
    cdf.set_title(f"over the stream ({figures['rows']} requests)", fontsize=9)
    cdf.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
