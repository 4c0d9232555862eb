"""The GATI benchmark's figures, drawn from its JSON record alone.

`<stem>.latency.png`, per network (the paper's Fig. 6): the latency CDF of every method, and mean latency against
agreement with the base model. `<stem>.sweeps.png`, per network: speedup and agreement against the memory budget
(Fig. 7a) and against α (Fig. 25), GATI's speedup against the batch size, and the server's latency CDF, early exit
on and off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.ticker import NullFormatter

from benchmarks.common import figure


def plot(record: dict[str, Any], out: Path) -> list[Path]:
    paths = [out.with_suffix(".latency.png"), out.with_suffix(".sweeps.png")]
    plot_latency(record["models"], paths[0])
    plot_sweeps(record["models"], paths[1])
    return paths


def plot_latency(models: dict[str, Any], path: Path) -> None:
    fig = figure(14, 4.6 * len(models))
    for row, (name, result) in enumerate(models.items()):
        methods = {k: v for k, v in result["methods"].items() if isinstance(v, dict) and "latency_us" in v}
        cdf = fig.add_subplot(len(models), 2, 2 * row + 1)
        for method, s in methods.items():
            ms = np.sort(np.array(s["latency_us"]) / 1e3)
            style = "-" if method.startswith(("gati", "base")) else "--"
            cdf.plot(ms, np.arange(1, len(ms) + 1) / len(ms), style, label=method, linewidth=1.4)
        cdf.set_xscale("log")
        cdf.xaxis.set_minor_formatter(NullFormatter())  # under a decade, minor tick labels overlap
        cdf.set_xlabel("latency (ms), batch 1, one thread")
        cdf.set_ylabel("fraction of requests")
        cdf.set_title(f"{name}: latency distribution ({result['methods']['rows']} evaluate rows)")
        cdf.legend(fontsize=7)
        scatter = fig.add_subplot(len(models), 2, 2 * row + 2)
        for method, s in methods.items():
            scatter.scatter(s["mean_ms"], s["agreement"], s=30)
            scatter.annotate(method, (s["mean_ms"], s["agreement"]), fontsize=7, xytext=(3, 3),
                             textcoords="offset points")  # fmt: skip
        scatter.axhline(0.99, color="grey", linewidth=0.8, linestyle=":")
        scatter.set_xlabel("mean latency (ms)")
        scatter.set_ylabel("agreement with the base model")
        scatter.set_title(f"{name}: latency against agreement")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_sweeps(models: dict[str, Any], path: Path) -> None:
    fig = figure(18, 4.2 * len(models))
    for row, (name, result) in enumerate(models.items()):
        sweeps = result["sweeps"]
        for column, prefix, xlabel in ((0, "budget ", "memory budget"), (1, "alpha ", "α (MILP composition)")):
            ax = fig.add_subplot(len(models), 4, 4 * row + column + 1)
            labels = [k for k in sweeps if k.startswith(prefix)]
            positions = np.arange(len(labels))
            ax.bar(positions, [sweeps[k]["speedup"] for k in labels], 0.6, label="measured speedup")
            ax.plot(positions, [sweeps[k]["expected"]["speedup"] for k in labels], "ko", label="expected")
            for p, k in enumerate(labels):
                ax.annotate(f"{sweeps[k]['agreement']:.3f}\n{sweeps[k]['memory_mb']:.2f} MB", (p, 0.05),
                            ha="center", fontsize=6, color="white")  # fmt: skip
            ax.set_xticks(positions, [k.removeprefix(prefix) for k in labels], fontsize=7)
            ax.set_xlabel(xlabel)
            ax.set_ylabel("mean-latency speedup over the base")
            ax.set_title(f"{name}: {xlabel} (labels: agreement, memory)", fontsize=9)
            ax.legend(fontsize=7)
        batching = result["batching"]
        ax = fig.add_subplot(len(models), 4, 4 * row + 3)
        batches = list(batching)
        ax.plot(batches, [batching[b]["gati"]["speedup"] for b in batches], "o-", label="gati vs base (whole)")
        ax.set_xlabel("batch size (one request per row)")
        ax.set_ylabel("speedup of the mean per-request latency")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{name}: batched early exit")
        ax.legend(fontsize=7)
        ax = fig.add_subplot(len(models), 4, 4 * row + 4)
        server = result["server"]
        for side in ("on", "off"):
            s = server[side]
            ax.bar(side, s["mean_ms"], 0.5, label=f"early exit {side}: p50 {s['p50_ms']:.2f}, p99 {s['p99_ms']:.2f}")
        ax.set_ylabel("mean latency (ms), client side")
        on = server["on"]
        ax.set_title(f"{name}: through the server ({on['speedup']:.2f}×, agree {on['agreement']:.3f})", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
