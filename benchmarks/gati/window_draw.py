"""GATI retraining on a draw of the window against the whole window (`caches.adaptation.train_rows`).

The server's adaptation service keeps up to `window_rows` (2,000) sampled rows and, when its trigger fires, sends a
retraining a recency-weighted draw of `train_rows` (500) of them. Before, it sent the whole window: a retraining's
time grew with it, and drawing every row weighed none above another. This benchmark puts the two side by side on
windows whose traffic drifted while they filled.

The adaptation benchmark's model and cache set (`benchmarks/gati/adaptation.py`, built afresh here, target .98)
are retrained once per window of 1,000 rows (the first of its unused test images): the older half with one
corruption at severity 3, the newer half with the next (clean → brightness → contrast → blur → rotation). The
window is offered to a `SampleWindow` of that capacity, and each is retrained two ways with `AdaptSettings()`:

- `whole`: every row of the window, as the service did before;
- `draw`: a recency-weighted draw of a quarter of them (250), as the service's defaults do (500 of 2,000). The
  test set leaves 2,000 unused rows, a window and the fresh rows, so the window is half the server's default.

Both results, accepted or not, are served by the runtime's `EarlyExit` on the same 1,000 fresh rows with the newer
corruption (the last 1,000 unused images), beside the deployed caches (static). Recorded per window: hit rate and
agreement with the base model on the fresh rows, the share of the newer drift among the rows trained on, what the
acceptance rule said and the times (forward pass and retraining proper, one thread).

Usage: .venv/bin/python -m benchmarks.gati.window_draw [--quick]
Writes benchmarks/results/gati_window_draw.json and .png (--quick: under benchmarks/results/tmp/).
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import torch

from adaserve.adaptive.gati.adapt import AdaptSettings, SampleWindow, adapt
from benchmarks.common import RESULTS, SCRATCH, figure, load_window, write_json
from benchmarks.gati.adaptation import (
    TARGET,
    adaptation_record,
    build,
    corrupt,
    header,
    load_runtime,
    serve,
    serve_retrained,
    summary,
)
from benchmarks.gati.retraining import FRESH_ROWS, bar_offsets, fresh_panels

#: (older drift, newer drift), each corruption at `SEVERITY`; "clean" is none.
PAIRS = (("clean", "brightness"), ("brightness", "contrast"), ("contrast", "blur"), ("blur", "rotation"))
SEVERITY = 3
WINDOW_ROWS, DRAW_ROWS = 1000, 250
SIDES = ("whole", "draw")


def drifted(images: np.ndarray, kind: str, rng: np.random.Generator) -> np.ndarray:
    return corrupt(images, kind, 0 if kind == "clean" else SEVERITY, rng)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="quick exploration, one window; under tmp/")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    out = (SCRATCH if args.quick else RESULTS) / "gati_window_draw.json"
    settings = {"fresh_rows": FRESH_ROWS, "severity": SEVERITY, "window_rows": WINDOW_ROWS, "draw_rows": DRAW_ROWS}
    record = header("gati_window_draw", args.quick, settings | {"retrain": AdaptSettings().record()})
    with load_window(record):
        record |= run(args.quick, PAIRS[1:2] if args.quick else PAIRS)
    write_json(record, out)
    plot(record, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")


def run(quick: bool, pairs: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    built = build(TARGET, quick)
    spec, cache_set = built.spec, built.cache_set
    if len(built.unused) < WINDOW_ROWS + FRESH_ROWS:
        raise SystemExit(f"{len(built.unused)} unused test rows; the window and the fresh rows need more")
    composition = cache_set.composition(TARGET)
    static = load_runtime(spec, TARGET, cache_set.version)
    half = WINDOW_ROWS // 2
    results = []
    for older, newer in pairs:
        rng = np.random.default_rng(0)
        fresh = drifted(built.images[built.unused[-FRESH_ROWS:]], newer, rng)
        base = static.chain.run(torch.from_numpy(fresh)).argmax(1).numpy()
        static_side, _ = serve(static, fresh, base, spec.config.max_batch_size)
        rows = built.images[built.unused[:WINDOW_ROWS]]
        stream = np.concatenate([drifted(rows[:half], older, rng), drifted(rows[half:], newer, rng)])
        window = SampleWindow(WINDOW_ROWS, fraction=1.0, seed=0)
        window.offer(stream)
        newer_rows = {row.tobytes() for row in stream[half:]}
        entry: dict[str, Any] = {"older": older, "newer": newer, "static": static_side}
        for side, count in zip(SIDES, (WINDOW_ROWS, DRAW_ROWS), strict=True):
            trained_on = window.draw(count)
            result = adapt(static.chain, cache_set, composition, trained_on, built.validation_x, AdaptSettings())
            entry[side] = {
                "window_rows": len(trained_on),  # not "rows": adaptation_record's splits would overwrite it
                "newer_share": float(np.mean([row.tobytes() in newer_rows for row in trained_on])),
                "fresh": serve_retrained(spec, TARGET, result, fresh, base),
            } | adaptation_record(result)
        results.append(entry)
        print(
            f"{older:>10} → {newer:<10}: static {static_side} "
            + " ".join(
                f"{s} {entry[s]['fresh']} accepted={entry[s]['accepted']} "
                f"{entry[s]['forward_s'] + entry[s]['retrain_s']:.1f}s"
                for s in SIDES
            ),
            flush=True,
        )
    return {"cache_set": summary(cache_set, TARGET, built.build_s), "results": results, "tally": tally(results)}


def tally(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per side: mean fresh-row figures and times; for the draw, its time as a share of the whole window's."""
    out: dict[str, Any] = {
        "static": {key: float(np.mean([r["static"][key] for r in results])) for key in ("agreement", "hit_rate")}
    }
    for side in SIDES:
        out[side] = {key: float(np.mean([r[side]["fresh"][key] for r in results])) for key in ("agreement", "hit_rate")}
        out[side] |= {key: float(np.mean([r[side][key] for r in results])) for key in ("forward_s", "retrain_s")}
        out[side]["accepted"] = sum(r[side]["accepted"] for r in results)
    seconds = {side: out[side]["forward_s"] + out[side]["retrain_s"] for side in SIDES}
    out["draw_time_ratio"] = seconds["draw"] / seconds["whole"]
    return out


def plot(record: dict[str, Any], path: Any) -> None:
    results, settings = record["results"], record["settings"]
    fig = figure(max(7.0, 1.4 * len(results) + 2), 8.0)
    axes = fig.subplots(3, 1, sharex=True)
    sides = ("static", *SIDES)
    fresh_panels(axes, results, sides, settings["target"])
    x, offsets = np.arange(len(results)), bar_offsets(len(sides))
    for offset, side in enumerate(SIDES, start=1):  # the colours of `fresh_panels`
        seconds = [r[side]["forward_s"] + r[side]["retrain_s"] for r in results]
        axes[2].bar(x + offsets[offset], seconds, 0.8 / len(sides), color=f"C{offset}")
    axes[2].set_ylabel("retraining, s\n(one thread)")
    axes[2].set_xticks(x, [f"{r['older']} →\n{r['newer']}" for r in results], fontsize=8)
    axes[2].set_xlabel("window: older half's drift → newer half's (fresh rows: the newer)")
    axes[0].set_title(
        f"caches retrained on a window of {settings['window_rows']:,} rows or a draw of {settings['draw_rows']}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
