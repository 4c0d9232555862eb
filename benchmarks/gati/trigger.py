"""GATI's retraining trigger, what it expects of the caches serving (`caches.adaptation.expect`), side by side.

The trigger compares the live share of rows leaving by each exit with an expected one and retrains when it falls
more than the margin below. The paper's expectation (`composition`) is the deployed composition's rate on its
held-out rows, which are mostly validation rows even for an adapted version: on a drift that lasts it is out of
reach, and the trigger fired after every judged window once the drift had set in (the committed adaptation run
before this option: 16 retrainings in 24 chunks, 13 of them refused, one after every chunk from chunk 13 on).
`traffic`, the default, expects an adapted version's rates on the held-out rows of the window it was retrained on,
and after a refused retraining no more than the live rates last judged (`HitRateMonitor`).

One cache set is built as the adaptation benchmark builds it (`benchmarks/gati/adaptation.py`, target .98), and
two streams of its unused test images (seed 0) are each served twice by `serve_stream`, once with each
expectation, static caches beside both:

- `drifting`: the adaptation benchmark's, 4 clean chunks then brightness, contrast, blur and rotation at rising
  severity, a new drift at every chunk;
- `lasting`: 4 clean chunks, then one drift that stays, contrast at severity 3, for 20 chunks.

Recorded per stream and side: retrainings (accepted, refused) and their time on one core (forward pass and
retraining proper), agreement and hit rate per chunk, and the adaptation bar (adapted agreement never below
static's). The warm-against-scratch comparison is the adaptation benchmark's, not run here.

Usage: .venv/bin/python -m benchmarks.gati.trigger [--quick]
Writes benchmarks/results/gati_trigger.json and .png (--quick: under benchmarks/results/tmp/).
"""

from __future__ import annotations

import argparse
from typing import Any, get_args

import numpy as np
import torch

from adaserve.config import Expectation
from benchmarks.common import RESULTS, SCRATCH, figure, load_window, write_json
from benchmarks.gati.adaptation import (
    CHUNK_ROWS,
    TARGET,
    build,
    drifting,
    header,
    label_chunks,
    outcome_colour,
    schedule,
    serve_stream,
)

EXPECTATIONS: tuple[Expectation, ...] = get_args(Expectation)
LASTING = ("contrast", 3)


def plans(quick: bool) -> dict[str, list[tuple[str, int]]]:
    drifting = schedule(quick)
    clean = sum(kind == "clean" for kind, _ in drifting)
    return {"drifting": drifting, "lasting": drifting[:clean] + [LASTING] * (len(drifting) - clean)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small stream and quick exploration; under tmp/")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    out = (SCRATCH if args.quick else RESULTS) / "gati_trigger.json"
    streams = plans(args.quick)
    record = header("gati_trigger", args.quick, {"chunk_rows": CHUNK_ROWS, "seed": 0, "lasting": LASTING})
    record["streams"] = {}
    with load_window(record):
        built = build(TARGET, args.quick)
        for name, plan in streams.items():
            sides = {
                e: serve_stream(built, TARGET, CHUNK_ROWS, drifting(built, CHUNK_ROWS, plan, 0), 0, e, scratch=False)
                for e in EXPECTATIONS
            }
            record |= {key: sides["traffic"][key] for key in ("cache_set", "window", "adapt_settings")}
            record["streams"][name] = {
                "sides": {e: {k: s[k] for k in ("monitor", "chunks", "retrains", "bar")} for e, s in sides.items()},
                "summary": {e: tally(s) for e, s in sides.items()},
            }
    write_json(record, out)
    plot(record, out.with_suffix(".png"))
    for name, stream in record["streams"].items():
        for expect, figures in stream["summary"].items():
            print(f"{name}, expect {expect}: {figures}")
    print(f"wrote {out} and {out.with_suffix('.png')}")


def tally(stream: dict[str, Any]) -> dict[str, Any]:
    """One side's retrainings and their cost, and its agreement and hit rate over the stream beside static's."""
    retrains, chunks = stream["retrains"], stream["chunks"]
    accepted = sum(r["warm"]["accepted"] for r in retrains)

    def mean(side: str, key: str) -> float:
        return float(np.mean([c[side][key] for c in chunks]))

    return {
        "retrainings": len(retrains),
        "accepted": accepted,
        "refused": len(retrains) - accepted,
        "retraining_s": round(sum(r["warm"]["forward_s"] + r["warm"]["retrain_s"] for r in retrains), 1),
        "adapted": {"agreement": mean("adapted", "agreement"), "hit_rate": mean("adapted", "hit_rate")},
        "static": {"agreement": mean("static", "agreement"), "hit_rate": mean("static", "hit_rate")},
        "bar": stream["bar"],
    }


def plot(record: dict[str, Any], path: Any) -> None:
    streams = record["streams"]
    fig = figure(16, 7.5)
    grid = fig.subplots(3, len(streams), sharex="col", gridspec_kw={"height_ratios": [3, 3, 1]})
    for column, (name, stream) in enumerate(streams.items()):
        plot_stream(grid[:, column], name, stream["sides"], record["settings"]["target"])
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_stream(axes: Any, name: str, sides: dict[str, Any], target: float) -> None:
    chunks = sides[EXPECTATIONS[0]]["chunks"]
    index = [c["chunk"] for c in chunks]
    for key, ax in zip(("agreement", "hit_rate"), axes, strict=False):
        ax.plot(index, [c["static"][key] for c in chunks], "o-", color="grey", label="static", markersize=4)
        for expect, style in zip(EXPECTATIONS, ("s-", "^-"), strict=True):
            adapted = [c["adapted"][key] for c in sides[expect]["chunks"]]
            ax.plot(index, adapted, style, label=f"adapted, expect {expect}", markersize=4)
        ax.set_ylabel(key.replace("_", " "))
    axes[0].axhline(target, color="grey", linestyle=":", label=f"target {target:g}")
    for row, expect in enumerate(EXPECTATIONS):
        for retrain in sides[expect]["retrains"]:
            mark = {"color": outcome_colour(retrain), "markersize": 12, "markeredgewidth": 2}
            axes[2].plot(retrain["after_chunk"] + 0.5, row, "|", **mark)
    axes[2].set_yticks(range(len(EXPECTATIONS)), EXPECTATIONS)
    axes[2].set_ylim(-0.7, len(EXPECTATIONS) - 0.3)
    axes[2].set_ylabel("retrainings")
    label_chunks(axes[2], chunks)
    axes[0].legend(loc="lower left", fontsize=8)
    axes[0].set_title(
        f"{name} stream (ResNet-style CNN): what GATI's retraining trigger expects; "
        "retrainings green accepted, red refused",
        fontsize=9,
    )


if __name__ == "__main__":
    main()
