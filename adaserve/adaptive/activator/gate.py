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
"""

from __future__ import annotations

import time

import numpy as np

from adaserve.adaptive.activator.kernel import DENSE, SERVE, Kernel

__all__ = ["measure_dense_layers"]

#: Interleaved passes per comparison (their median decides) and the CPU time one pass aims at.
PASSES = 7
PASS_S = 0.004


def measure_dense_layers(kernel: Kernel, rows: np.ndarray, passes: int = PASSES, pass_s: float = PASS_S) -> np.ndarray:
    """`dense_at` (k grid × layers, bool) for `kernel`, timed on `rows` of its network's input."""
    x = np.ascontiguousarray(rows[: _rows_per_pass(kernel, rows, pass_s)], dtype=np.float32)
    dense_at = np.zeros_like(kernel.dense_at)
    grid, layers = dense_at.shape
    for index in range(grid):
        for layer in range(layers):
            trial = dense_at.copy()
            trial[index, layer] = True
            sparse_s, dense_s = _median_pass_s([kernel.gated(dense_at), kernel.gated(trial)], x, index, passes)
            dense_at[index, layer] = dense_s <= sparse_s
    return dense_at


def _rows_per_pass(kernel: Kernel, rows: np.ndarray, pass_s: float) -> int:
    """Rows whose dense forward takes about `pass_s` of CPU, at least 8 (and at most all of them)."""
    probe = np.ascontiguousarray(rows[:8], dtype=np.float32)
    seconds = _pass_s(kernel, probe, len(kernel.counts) - 1, DENSE)
    per_row = max(seconds / len(probe), 1e-9)
    return int(min(len(rows), max(8, pass_s / per_row)))


def _median_pass_s(kernels: list[Kernel], x: np.ndarray, index: int, passes: int) -> list[float]:
    for kernel in kernels:  # warm: caches, and numba's dispatch of these arrays
        _pass_s(kernel, x[:1], index)
    seconds = np.zeros((len(kernels), passes))
    for repeat in range(passes):
        for which, kernel in enumerate(kernels):
            seconds[which, repeat] = _pass_s(kernel, x, index)
    return np.median(seconds, axis=1).tolist()


def _pass_s(kernel: Kernel, x: np.ndarray, index: int, plan: int = SERVE) -> float:
    """CPU seconds of one call over the rows of `x` at grid index `index`."""
    out = np.empty((len(x), int(kernel.network.sizes[-1])), np.float32)
    k_index = np.full(len(x), index, np.int64)
    no_threshold = np.full(len(x), -1.0)
    began = time.thread_time_ns()
    kernel.run(x, out, k_index, no_threshold, plan)
    return (time.thread_time_ns() - began) / 1e9
