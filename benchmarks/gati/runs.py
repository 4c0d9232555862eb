"""Per-request latency of several methods on the same rows, in-process: the methods take turns on every batch of
rows in a fresh random order, so noise from other work on the machine falls on all of them alike.

A method takes a batch of rows and returns, per row (one request each), when it was answered (seconds from the
batch's start), the class it answered, and the block it exited after (None for a method without exits). A plain
model answers every row when its forward returns; the GATI runtime answers a request the moment a cache hits it
(its `answer` callback, from the lookup thread) or when the chain ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from adaserve.adaptive.gati.runtime import EarlyExit
from adaserve.engine.messages import RowParameters
from benchmarks.common import TreeCPU, load_window, machine_busy_s

Model = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class Samples:
    """What one method did on every row, in row order."""

    latency_s: list[float] = field(default_factory=list)
    label: list[int] = field(default_factory=list)
    exit_block: list[str | None] = field(default_factory=list)
    busy_s: list[float] = field(default_factory=list)  # per batch: until the method returned (the worker is free)

    def add(self, answers: list[tuple[float, int, str | None]], busy_s: float) -> None:
        for latency, label, block in answers:
            self.latency_s.append(latency)
            self.label.append(label)
            self.exit_block.append(block)
        self.busy_s.append(busy_s)


Method = Callable[[np.ndarray], tuple[list[tuple[float, int, str | None]], float]]


def plain(model: Model) -> Method:
    """A model without exits: every row is answered when the forward returns."""

    def run(rows: np.ndarray) -> tuple[list[tuple[float, int, str | None]], float]:
        began = time.perf_counter()
        with torch.inference_mode():
            logits = model(torch.from_numpy(rows))
        elapsed = time.perf_counter() - began
        return [(elapsed, int(c), None) for c in logits.argmax(1)], elapsed

    return run


def early_exit(runtime: EarlyExit, classes: int) -> Method:
    """The worker's GATI runtime, one request per row (`RowParameters(row, 1, {})`)."""

    def run(rows: np.ndarray) -> tuple[list[tuple[float, int, str | None]], float]:
        outputs = np.empty((len(rows), classes), np.float32)
        answered: dict[int, tuple[float, str | None]] = {}

        def answer(responses: list[RowParameters]) -> None:
            now = time.perf_counter()
            for response in responses:
                answered[response.offset] = (now, response.values["exit_block"])

        requests = [RowParameters(i, 1, {}) for i in range(len(rows))]
        began = time.perf_counter()
        with torch.inference_mode():
            rest = runtime.run(torch.from_numpy(rows).to(runtime.device), outputs, requests, answer)
        ended = time.perf_counter()
        for response in rest:
            answered[response.offset] = (ended, response.values["exit_block"])
        answers = [(answered[i][0] - began, int(outputs[i].argmax()), answered[i][1]) for i in range(len(rows))]
        return answers, ended - began

    return run


def interleave(
    methods: dict[str, Method], rows: np.ndarray, batch: int = 1, *, warm_up: int = 20, seed: int = 0
) -> dict[str, Samples]:
    """Every method on every batch of `batch` consecutive rows (a remainder is dropped), in a fresh random order
    per batch, after `warm_up` untimed batches each."""
    for name in methods:
        for start in range(0, warm_up * batch, batch):
            methods[name](rows[start : start + batch])
    samples = {name: Samples() for name in methods}
    shuffle = np.random.default_rng(seed)
    names = list(methods)
    for start in range(0, len(rows) - batch + 1, batch):
        chunk = rows[start : start + batch]
        for index in shuffle.permutation(len(names)):
            samples[names[index]].add(*methods[names[index]](chunk))
    return samples


def summary(samples: Samples, reference: np.ndarray | None = None, base_mean_s: float | None = None) -> dict[str, Any]:
    """Mean, p50, p99 (ms), agreement with `reference` labels, speedup of the mean over `base_mean_s`, and the
    share of requests answered after each block."""
    ms = np.array(samples.latency_s) * 1e3
    result: dict[str, Any] = {
        "requests": len(ms),
        "mean_ms": float(ms.mean()),
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "busy_mean_ms": float(np.mean(samples.busy_s) * 1e3),
    }
    if reference is not None:
        result["agreement"] = float(np.mean(np.array(samples.label) == reference[: len(ms)]))
    if base_mean_s is not None:
        result["speedup"] = base_mean_s * 1e3 / result["mean_ms"]
    blocks = [b for b in samples.exit_block if b is not None]
    if blocks:
        names, counts = np.unique(blocks, return_counts=True)
        result["exits"] = {str(n): int(c) / len(blocks) for n, c in zip(names, counts, strict=True)}
    return result


@contextmanager
def cpu_window(record: dict[str, Any], *pids: int, field: str = "server_cores") -> Iterator[None]:
    """`load_window`'s fields, plus the cores this process (`own_cores`) and the process trees `pids` (a server, or
    a GATI model process: `field`) kept busy, and `other_cores`: what the rest of the machine took during the
    block."""
    trees = [TreeCPU(pid) for pid in pids]
    own, busy, servers = time.process_time(), machine_busy_s(), sum(tree.sample() for tree in trees)
    with load_window(record):
        yield
    wall = max(record["wall_s"], 1e-3)
    own_s = time.process_time() - own
    server_s = sum(tree.sample() for tree in trees) - servers
    record["own_cores"] = round(own_s / wall, 3)
    if pids:
        record[field] = round(server_s / wall, 3)
    record["other_cores"] = round(max(0.0, machine_busy_s() - busy - own_s - server_s) / wall, 3)
