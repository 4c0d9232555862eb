"""Which layers run dense: measured at build time, per k of the grid, so the sparse forward is never the slower.

SLO-NNs saves the work of the nodes it drops and pays for hashing, ranking and gathering. On a small layer with
dense inputs (the paper's own 784-112-112-10 on Fashion-MNIST) the payment is the larger: that network's sparse
forward ran at 0.75-0.78x the dense kernel's speed. So the build times each layer both ways at each k and keeps
the sparse step only where it is faster:

* layer by layer from the input, each with the layers before it as already decided (a dense layer hands the next
  all its nodes, a sparse one only the chosen ones, which changes what the next one costs) and those after sparse;
* the whole one-row forward over held-out rows, at a fixed k, in interleaved passes, on the thread's CPU clock
  (as the latency profile, so a scheduler's wait on a busy machine does not decide); the median pass of each;
* a tie goes to dense: it is the exact forward, and it leaves the next layer all the nodes.

The result is `Kernel.dense_at`; the confidence tables, calibration and latency profile are then measured on the
gated kernel, so what ACLO and LCAO promise is what it computes.

ACLO pays once more before it saves: it hashes the first layer and estimates every k's distance to choose one.
At a tight accuracy target it mostly chooses k near 100% and is then slower than computing k = 100% outright, so the
build also times ACLO at thresholds across the calibrated range against that forward (k = 100%, gated, no hashing)
and records the least threshold from which ACLO is the faster (`aclo_from`). A target whose threshold is below it
runs at k = 100%: its accuracy is met exactly, and sooner.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable

import numpy as np

from adaserve.adaptive.activator.kernel import DENSE, SERVE, Kernel

__all__ = ["measure_aclo_floor", "measure_dense_layers"]

#: Interleaved passes per comparison (their median decides) and the CPU time one pass aims at.
PASSES = 7
PASS_S = 0.004


def measure_dense_layers(kernel: Kernel, rows: np.ndarray, passes: int = PASSES, pass_s: float = PASS_S) -> np.ndarray:
    """`dense_at` (k grid × layers, bool) for `kernel`, timed on `rows` of its network's input."""
    x = _pass_rows(kernel, rows, pass_s)
    dense_at = np.zeros_like(kernel.dense_at)
    grid, layers = dense_at.shape
    for index in range(grid):
        for layer in range(layers):
            trial = dense_at.copy()
            trial[index, layer] = True
            sparse = functools.partial(_pass_s, kernel.gated(dense_at), index=index)
            dense = functools.partial(_pass_s, kernel.gated(trial), index=index)
            sparse_s, dense_s = _median_s([sparse, dense], x, passes)
            dense_at[index, layer] = dense_s <= sparse_s
    return dense_at


def measure_aclo_floor(
    kernel: Kernel, rows: np.ndarray, thresholds: np.ndarray, candidates: int = 12, passes: int = PASSES,
    pass_s: float = PASS_S,
) -> float:  # fmt: skip
    """`aclo_from` for `kernel` (gated) over the calibrated `thresholds`, timed on `rows`: the least of `candidates`
    thresholds (quantiles of the positive ones) from which every larger one ran faster than k = 100%; inf if none."""
    positive = thresholds[thresholds > 0]
    if positive.size == 0:
        return math.inf
    x = _pass_rows(kernel, rows, pass_s)
    full = len(kernel.counts) - 1
    floor = math.inf
    for threshold in np.unique(np.quantile(positive, np.linspace(0, 1, candidates)))[::-1]:
        aclo = functools.partial(_pass_s, kernel, index=0, threshold=float(threshold))
        whole = functools.partial(_pass_s, kernel, index=full)
        aclo_s, whole_s = _median_s([aclo, whole], x, passes)
        if aclo_s >= whole_s:
            break
        floor = float(threshold)
    return floor


def _pass_rows(kernel: Kernel, rows: np.ndarray, pass_s: float) -> np.ndarray:
    """The first of `rows` whose dense forward takes about `pass_s` of CPU, at least 8 (and at most all of them),
    as the kernel reads them."""
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    seconds = _pass_s(kernel, rows[:8], len(kernel.counts) - 1, plan=DENSE)
    per_row = max(seconds / len(rows[:8]), 1e-9)
    return rows[: int(min(len(rows), max(8, pass_s / per_row)))]


def _median_s(calls: list[Callable[[np.ndarray], float]], x: np.ndarray, passes: int) -> list[float]:
    """Each call's median over `passes` interleaved passes over `x`."""
    for call in calls:  # warm: caches, and numba's dispatch of these arrays
        call(x[:1])
    seconds = np.zeros((len(calls), passes))
    for repeat in range(passes):
        for which, call in enumerate(calls):
            seconds[which, repeat] = call(x)
    return np.median(seconds, axis=1).tolist()


def _pass_s(kernel: Kernel, x: np.ndarray, index: int, plan: int = SERVE, threshold: float = -1.0) -> float:
    """CPU seconds of one call over the rows of `x` at grid index `index` (ACLO's choice where `threshold` ≥ 0)."""
    out = np.empty((len(x), int(kernel.network.sizes[-1])), np.float32)
    k_index = np.full(len(x), index, np.int64)
    thresholds = np.full(len(x), threshold)
    began = time.thread_time_ns()
    kernel.run(x, out, k_index, thresholds, plan)
    return (time.thread_time_ns() - began) / 1e9
