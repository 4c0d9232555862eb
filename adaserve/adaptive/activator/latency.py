"""Interference-aware latency (SLO-NNs §3.2): the profile T(k, β) and the live β a worker reads.

The profile is measured at build time: the one-row forward of the kernel (for a model with an MLP head, the head's
alone: the runtime counts the prefix in t0, see `build`) at every k of the grid, with β = 0 … N co-located busy
processes running the same model (its MLP head alone) densely in a bounded loop (real processes, started and stopped
by PID). At run time, `InterferenceProbe` measures β as the cores the rest of the machine keeps busy (other workers,
the server, other programs), from /proc/stat minus this process's own CPU time, smoothed over a few sampling
periods, and the profile is interpolated linearly in β (held at its last row beyond N).

T is the p99 of the call's *CPU time* (the thread's own clock): it grows with k and with what co-located work does
to caches and memory bandwidth, which is what choosing k can trade. Wall-clock p50 and p99 are stored beside it.
On a machine with more runnable work than cores, the wall p99 is a scheduler wait of several milliseconds at
every k; a profile built on it would send every request to the smallest k although a request that waits for a
core misses its target whatever k it runs at.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from adaserve.engine.machine_cpu import machine_busy_s

if TYPE_CHECKING:
    from adaserve.adaptive.activator.kernel import Kernel

__all__ = ["InterferenceProbe", "LatencyProfile", "busy_processes", "measure_latency"]


@dataclass(frozen=True)
class LatencyProfile:
    """Latency of the one-row forward per β (rows) and k of the grid (columns), in ms."""

    busy: np.ndarray  # int64 (levels,): β = 0 … N
    cpu_p99_ms: np.ndarray  # float64 (levels, k grid): T
    wall_p50_ms: np.ndarray  # float64 (levels, k grid)
    wall_p99_ms: np.ndarray  # float64 (levels, k grid)
    cpu_model: str  # the machine it was measured on

    def at(self, beta: float) -> list[float]:
        """T over the k grid at interference β (linear between measured levels, the last level beyond). Plain
        floats: this runs once per LCAO request, where numpy's per-call overhead would be most of the cost."""
        rows = self._rows
        position = min(max(beta, 0.0), len(rows) - 1.0)
        low = int(position)
        high = min(low + 1, len(rows) - 1)
        share = position - low
        return [(1 - share) * a + share * b for a, b in zip(rows[low], rows[high], strict=True)]

    @functools.cached_property
    def _rows(self) -> list[list[float]]:
        return self.cpu_p99_ms.tolist()


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def measure_latency(
    kernel: Kernel, rows: np.ndarray, levels: int, repeats: int, on_level: Callable[[], None] | None = None
) -> LatencyProfile:
    """T(k, β) for β = 0 … `levels`: `repeats` one-row calls per k (the k interleaved, so noise spreads evenly)."""
    grid = len(kernel.counts)
    cpu_p99, wall_p50, wall_p99 = (np.zeros((levels + 1, grid)) for _ in range(3))
    out = np.empty((1, int(kernel.network.sizes[-1])), np.float32)
    no_threshold = np.full(1, -1.0)
    for beta in range(levels + 1):
        with busy_processes(kernel, rows, beta, duration_s=600.0):
            cpu, wall = np.zeros((grid, repeats)), np.zeros((grid, repeats))
            for repeat in range(repeats):
                x = rows[repeat % len(rows)][None]
                for index in range(grid):
                    k_index = np.full(1, index, np.int64)
                    began_cpu, began = time.thread_time_ns(), time.perf_counter_ns()
                    kernel.run(x, out, k_index, no_threshold)
                    wall[index, repeat] = (time.perf_counter_ns() - began) / 1e6
                    cpu[index, repeat] = (time.thread_time_ns() - began_cpu) / 1e6
            cpu_p99[beta] = np.percentile(cpu, 99, axis=1)
            wall_p50[beta] = np.percentile(wall, 50, axis=1)
            wall_p99[beta] = np.percentile(wall, 99, axis=1)
        if on_level is not None:
            on_level()
    return LatencyProfile(np.arange(levels + 1), cpu_p99, wall_p50, wall_p99, cpu_model())


@contextmanager
def busy_processes(kernel: Kernel, rows: np.ndarray, count: int, duration_s: float) -> Iterator[list[int]]:
    """`count` processes running the model densely, one row after another, for at most `duration_s`; they are
    stopped by PID when the block ends. Forked, so they share the weights and the compiled kernel."""
    context = multiprocessing.get_context("fork")
    processes = [context.Process(target=_busy, args=(kernel, rows, duration_s), daemon=True) for _ in range(count)]
    for process in processes:
        process.start()
    try:
        if processes:
            time.sleep(0.2)  # let them reach their loop
        yield [process.pid for process in processes if process.pid is not None]
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join()


def _busy(kernel: Kernel, rows: np.ndarray, duration_s: float) -> None:
    from adaserve.adaptive.activator.kernel import DENSE  # here: the kernel module imports this one

    full = np.full(1, len(kernel.counts) - 1, np.int64)
    no_threshold = np.full(1, -1.0)
    out = np.empty((1, int(kernel.network.sizes[-1])), np.float32)
    deadline = time.monotonic() + duration_s
    row = 0
    while time.monotonic() < deadline:
        kernel.run(rows[row % len(rows)][None], out, full, no_threshold, DENSE)
        row += 1


class InterferenceProbe:
    """β now: the cores the rest of the machine keeps busy, sampled by a daemon thread every `interval_s` and
    smoothed (EWMA). Start it in the process that serves (threads do not survive fork)."""

    def __init__(self, interval_s: float = 0.05, alpha: float = 0.3) -> None:
        self.interval_s, self.alpha = interval_s, alpha
        self.busy = 0.0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="interference-probe", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _loop(self) -> None:
        machine, own, at = machine_busy_s(), _own_busy_s(), time.monotonic()
        while not self._stop.wait(self.interval_s):
            machine_now, own_now, now = machine_busy_s(), _own_busy_s(), time.monotonic()
            others = max(0.0, (machine_now - machine) - (own_now - own)) / max(now - at, 1e-6)
            self.busy += self.alpha * (others - self.busy)
            machine, own, at = machine_now, own_now, now


def _own_busy_s() -> float:
    times = os.times()
    return times.user + times.system
