"""PNG plots of one run or of several overlaid (for `compare`): latency CDF, latency and arrival rate over time,
throughput over time. Figures are built with matplotlib's object API (no pyplot), so nothing global is touched and
no display is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from adaserve.bench.results import BenchResult, Status

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

#: Candidate bin widths (s) for the over-time plots; the smallest giving at most `_MAX_BINS` bins is used.
_BIN_WIDTHS_S = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)
_MAX_BINS = 60

Labeled = Sequence[tuple[str, BenchResult]]


def plot_all(runs: Labeled, stem: Path) -> list[Path]:
    """The three plots as `<stem>.cdf.png`, `<stem>.timeline.png` and `<stem>.throughput.png`."""
    paths = [stem.with_name(f"{stem.name}.{kind}.png") for kind in ("cdf", "timeline", "throughput")]
    plot_cdf(runs, paths[0])
    plot_timeline(runs, paths[1])
    plot_throughput(runs, paths[2])
    return paths


def plot_cdf(runs: Labeled, path: Path) -> None:
    """Latency CDF of the answered requests, log-scaled so the tail shows."""
    fig = _figure(7, 4.5)
    ax = fig.subplots()
    for label, result in runs:
        latencies = np.sort([r.latency_ms for r in result.records if r.status is Status.OK and r.latency_ms])
        if latencies.size:
            ax.plot(latencies, np.arange(1, latencies.size + 1) / latencies.size, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("latency from scheduled time (ms)")
    ax.set_ylabel("fraction of answered requests")
    ax.set_title("Latency CDF")
    ax.grid(True, which="both", alpha=0.3)
    _finish(fig, ax, path)


def plot_timeline(runs: Labeled, path: Path) -> None:
    """Latency of each request against its scheduled time (with per-bin p99), and the arrival rate below it."""
    fig = _figure(9, 6)
    top, bottom = fig.subplots(2, 1, sharex=True)
    width = _bin_width(runs)
    for index, (label, result) in enumerate(runs):
        color = f"C{index}"
        answered = [(r.scheduled_s, r.latency_ms) for r in result.records if r.status is Status.OK and r.latency_ms]
        if answered:
            times, latencies = np.array(answered).T
            top.plot(times, latencies, ".", markersize=2, alpha=0.3, color=color)
            centers, p99 = _binned_p99(times, latencies, width)
            top.plot(centers, p99, "-", color=color, label=f"{label} p99")
        scheduled = [r.scheduled_s for r in result.records]
        sent = [r.sent_s for r in result.records if r.sent_s is not None]
        bottom.step(*_rate(sent, width), where="mid", color=color, label=f"{label} sent")
        bottom.step(*_rate(scheduled, width), where="mid", color=color, linestyle="--", label=f"{label} scheduled")
    top.set_yscale("log")
    top.set_ylabel("latency (ms)")
    top.set_title("Latency and arrival rate over time")
    bottom.set_ylabel(f"requests/s ({width:g} s bins)")
    bottom.set_xlabel("time since start (s)")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
    _finish(fig, top, path, extra=bottom)


def plot_throughput(runs: Labeled, path: Path) -> None:
    """Answers per second over time, and errors per second where there were any."""
    fig = _figure(9, 4)
    ax = fig.subplots()
    width = _bin_width(runs)
    for index, (label, result) in enumerate(runs):
        ok = [r.done_s for r in result.records if r.status is Status.OK and r.done_s is not None]
        failed = [r.done_s for r in result.records if r.status is Status.ERROR and r.done_s is not None]
        ax.step(*_rate(ok, width), where="mid", color=f"C{index}", label=f"{label} answered")
        if failed:
            ax.step(*_rate(failed, width), where="mid", color=f"C{index}", linestyle=":", label=f"{label} errors")
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel(f"responses/s ({width:g} s bins)")
    ax.set_title("Throughput over time")
    ax.grid(True, alpha=0.3)
    _finish(fig, ax, path)


def _figure(width: float, height: float) -> Figure:
    """A new figure; matplotlib is imported here because it takes ~0.4 s, which only plotting should pay."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height))


def _bin_width(runs: Labeled) -> float:
    end = max((r.done_s or r.scheduled_s for _, result in runs for r in result.records), default=1.0)
    return next((w for w in _BIN_WIDTHS_S if end / w <= _MAX_BINS), _BIN_WIDTHS_S[-1])


def _rate(times: Sequence[float], width: float) -> tuple[np.ndarray, np.ndarray]:
    """Bin centres and events per second in each bin."""
    if not times:
        return np.array([]), np.array([])
    edges = np.arange(0.0, max(times) + width, width)
    counts, _ = np.histogram(times, bins=edges)
    return edges[:-1] + width / 2, counts / width


def _binned_p99(times: np.ndarray, latencies: np.ndarray, width: float) -> tuple[np.ndarray, np.ndarray]:
    bins = np.floor(times / width).astype(int)
    keys = np.unique(bins)
    return (keys + 0.5) * width, np.array([np.percentile(latencies[bins == k], 99) for k in keys])


def _finish(fig: Figure, ax: Axes, path: Path, extra: Axes | None = None) -> None:
    for axes in (ax, extra):
        if axes is not None and axes.get_legend_handles_labels()[0]:
            axes.legend(loc="best", fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
