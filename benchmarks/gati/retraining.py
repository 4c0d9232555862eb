"""GATI retraining settings, judged where they matter: on fresh rows of the drift the window holds.

The adaptation benchmark's model and cache set (`benchmarks/gati/adaptation.py`, built afresh here, target .98)
are retrained once per window: the first 100, 300 or 1,000 of its unused test images, clean or with one
corruption at severity 3 (brightness, contrast, blur, rotation). Each window is retrained two ways, side by side:

- `paper`: the paper's settings as adaserve first ran them, 5 epochs, 500 selector steps, one validation row mixed
  in per window row;
- `default`: `AdaptSettings()`, adaserve's defaults (more epochs, fewer selector steps, 8 validation rows per
  window row).

Both results, accepted or not, are written as a scratch cache set version and served by the runtime's `EarlyExit`
(batches of the model's `max_batch_size`, lookups inline) on the same 1,000 fresh rows with the same corruption
(the last 1,000 unused images: no window ever holds them), beside the deployed caches (static). Recorded per
window: hit rate and agreement with the base model on the fresh rows of all three, what the acceptance rule said
of each retraining and on which figures, and the times.

Usage: .venv/bin/python -m benchmarks.gati.retraining [--quick]
Writes benchmarks/results/gati_retraining.json and .png (--quick: under benchmarks/results/tmp/).
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import torch

from adaserve.adaptive.gati.adapt import AdaptSettings, adapt
from adaserve.adaptive.gati.predictors import TrainSettings
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

SETTINGS = {
    "paper": AdaptSettings(train=TrainSettings(epochs=5), selector_steps=500, validation_per_window_row=1.0),
    "default": AdaptSettings(),
}
DRIFTS = (("clean", 0), ("brightness", 3), ("contrast", 3), ("blur", 3), ("rotation", 3))
WINDOWS, FRESH_ROWS = (100, 300, 1000), 1000


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="quick exploration, two drifts, one window; under tmp/")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    out = (SCRATCH if args.quick else RESULTS) / "gati_retraining.json"
    drifts, windows = (DRIFTS[:2], WINDOWS[1:2]) if args.quick else (DRIFTS, WINDOWS)
    retrain = {name: s.record() for name, s in SETTINGS.items()}
    record = header("gati_retraining", args.quick, {"fresh_rows": FRESH_ROWS, "retrain": retrain})
    with load_window(record):
        record |= run(args.quick, drifts, windows)
    write_json(record, out)
    plot(record, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")


def run(quick: bool, drifts: tuple[tuple[str, int], ...], windows: tuple[int, ...]) -> dict[str, Any]:
    built = build(TARGET, quick)
    spec, cache_set = built.spec, built.cache_set
    if len(built.unused) < max(windows) + FRESH_ROWS:
        raise SystemExit(f"{len(built.unused)} unused test rows; the windows and fresh rows need more")
    fresh_rows, composition = built.unused[-FRESH_ROWS:], cache_set.composition(TARGET)
    static = load_runtime(spec, TARGET, cache_set.version)
    results = []
    for kind, severity in drifts:
        rng = np.random.default_rng(0)
        fresh = corrupt(built.images[fresh_rows], kind, severity, rng)
        base = static.chain.run(torch.from_numpy(fresh)).argmax(1).numpy()
        static_side, _ = serve(static, fresh, base, spec.config.max_batch_size)
        for rows in windows:
            window = corrupt(built.images[built.unused[:rows]], kind, severity, rng)
            entry: dict[str, Any] = {"drift": kind, "severity": severity, "window_rows": rows, "static": static_side}
            for name, settings in SETTINGS.items():
                result = adapt(static.chain, cache_set, composition, window, built.validation_x, settings)
                entry[name] = {"fresh": serve_retrained(spec, TARGET, result, fresh, base)} | adaptation_record(result)
            results.append(entry)
            print(
                f"{kind:>10} {severity} window {rows:5d}: static {static_side} "
                + " ".join(f"{n} {entry[n]['fresh']} accepted={entry[n]['accepted']}" for n in SETTINGS),
                flush=True,
            )
    return {"cache_set": summary(cache_set, TARGET, built.build_s), "results": results, "tally": tally(results)}


def tally(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per setting: windows whose retrained caches beat static on the fresh rows in agreement, in hits, in both;
    accepted retrainings; mean figures."""
    out = {}
    for name in SETTINGS:
        sides = [(r[name]["fresh"], r["static"]) for r in results]
        more_agreement = [new["agreement"] >= old["agreement"] for new, old in sides]
        more_hits = [new["hit_rate"] >= old["hit_rate"] for new, old in sides]
        out[name] = {
            "windows": len(results),
            "agreement_at_least_static": sum(more_agreement),
            "hits_at_least_static": sum(more_hits),
            "both": sum(a and h for a, h in zip(more_agreement, more_hits, strict=True)),
            "accepted": sum(r[name]["accepted"] for r in results),
            "mean_fresh_agreement": float(np.mean([new["agreement"] for new, _ in sides])),
            "mean_fresh_hit_rate": float(np.mean([new["hit_rate"] for new, _ in sides])),
            "mean_retrain_s": float(np.mean([r[name]["retrain_s"] for r in results])),
        }
    out["static"] = {
        "mean_fresh_agreement": float(np.mean([r["static"]["agreement"] for r in results])),
        "mean_fresh_hit_rate": float(np.mean([r["static"]["hit_rate"] for r in results])),
    }
    return out


def plot(record: dict[str, Any], path: Any) -> None:
    results = record["results"]
    fig = figure(max(8.0, 0.7 * len(results) + 2), 6.5)
    axes = fig.subplots(2, 1, sharex=True)
    fresh_panels(axes, results, ("static", *SETTINGS), record["settings"]["target"])
    axes[1].set_xticks(np.arange(len(results)), [f"{r['drift']}\n{r['window_rows']}" for r in results], fontsize=7)
    axes[1].set_xlabel("drift, window rows")
    axes[0].set_title("caches retrained on a window, served on 1,000 fresh rows of the same drift")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def bar_offsets(sides: int) -> np.ndarray:
    """Where each side's bar sits around its group's tick, and (as the spacing) each bar's width."""
    return (np.arange(sides) - (sides - 1) / 2) * (0.8 / sides)


def fresh_panels(axes: Any, results: list[dict[str, Any]], sides: tuple[str, ...], target: float) -> None:
    """Agreement (with the target) and hit rate on the fresh rows, one bar per side (colour `C<i>`) per result."""
    x, offsets = np.arange(len(results)), bar_offsets(len(sides))
    width = 0.8 / len(sides)

    def on_fresh(result: dict[str, Any], side: str) -> dict[str, float]:
        return result[side] if side == "static" else result[side]["fresh"]

    for offset, (side, at) in enumerate(zip(sides, offsets, strict=True)):
        for ax, key in zip(axes[:2], ("agreement", "hit_rate"), strict=True):
            ax.bar(x + at, [on_fresh(r, side)[key] for r in results], width, label=side, color=f"C{offset}")
    axes[0].axhline(target, color="grey", linestyle=":", linewidth=1)
    lowest = min(on_fresh(r, side)["agreement"] for r in results for side in sides)
    axes[0].set_ylim(np.floor((lowest - 0.01) * 20) / 20, 1.005)
    axes[0].set_ylabel("agreement with base\n(fresh rows)")
    axes[1].set_ylabel("hit rate (fresh rows)")
    axes[0].legend(fontsize=8, ncol=len(sides), loc="lower left")


if __name__ == "__main__":
    main()
