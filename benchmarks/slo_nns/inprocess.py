"""The in-process measurements: accuracy against computed nodes, ACLO per input, LCAO under co-located load.

Everything runs one request row at a time in this process, the way a worker runs it: the activator rows through
`ActivatorRuntime.run` (the worker's code, Python overhead included), the dense kernel through the same compiled
kernel's `DENSE` plan, and torch through the model artifact the server loads (one intra-op thread).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from adaserve.adaptive.activator.artifact import Activator
from adaserve.adaptive.activator.kernel import DENSE, GLOBAL, LSH, RANDOM, ROWS, SERVE, Kernel
from adaserve.adaptive.activator.latency import busy_processes
from adaserve.adaptive.activator.runtime import ActivatorRuntime
from adaserve.adaptive.activator.select import aclo_threshold
from benchmarks.common import load_window, tree_cpu_s, wait_for_quiet

#: ACLO targets: the calibrated held-out dense accuracy minus these budgets.
LOSS_BUDGETS = (0.0, 0.001, 0.002, 0.003, 0.005, 0.01, 0.02)


class Methods:
    """One-row callables for every method, each returning the logits row."""

    def __init__(self, kernel: Kernel, activator: Activator, model: Callable[..., Any]) -> None:
        self.kernel, self.activator, self.model = kernel, activator, model
        self.runtime = ActivatorRuntime(kernel, activator)
        self.out = np.empty((1, int(kernel.network.sizes[-1])), np.float32)
        # The dense kernel's arguments made once: the baseline does no per-request work but the forward.
        self.full = np.full(1, len(activator.k_grid) - 1, np.int64)
        self.no_threshold = np.full(1, -1.0)

    def dense(self, x: np.ndarray) -> np.ndarray:
        self.kernel.run(x, self.out, self.full, self.no_threshold, DENSE)
        return self.out

    def exact(self, x: np.ndarray) -> np.ndarray:
        """The serving plan at k = 100%: every node, zero activations skipped."""
        self.kernel.run(x, self.out, self.full, self.no_threshold, SERVE)
        return self.out

    def torch(self, x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return self.model(torch.from_numpy(x)).numpy()

    def target(self, x: np.ndarray, parameters: dict[str, Any]) -> tuple[np.ndarray, dict[str, Any]]:
        response = self.runtime.run([x], [self.out], parameters)
        return self.out, response


def _with_target(methods: Methods, name: str, value: float, x: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    return methods.target(x, {name: value})


def accuracy_curves(kernel: Kernel, activator: Activator, x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """Accuracy at every k for the paper's forward (every hidden layer at top-k) ranked by LSH, a static global
    ranking and random dropout (three seeds), at equal computed nodes; and the serving plan with LSH."""
    out = np.empty((len(x), int(kernel.network.sizes[-1])), np.float32)
    threshold = np.full(len(x), -1.0)

    def accuracy(index: int, plan: int, ranking: int, seed: int = 0) -> float:
        kernel.run(x, out, np.full(len(x), index, np.int64), threshold, plan, ranking, seed)
        return float((out.argmax(axis=1) == y).mean())

    grid = range(len(activator.k_grid))
    return {
        "k": activator.k_grid.tolist(),
        "computed_nodes": kernel.counts.sum(axis=1).tolist(),
        "hidden_nodes": int(kernel.network.sizes[1:-1].sum()),
        "lsh": [accuracy(i, ROWS, LSH) for i in grid],
        "global": [accuracy(i, ROWS, GLOBAL) for i in grid],
        "random": [float(np.mean([accuracy(i, ROWS, RANDOM, seed) for seed in (1, 2, 3)])) for i in grid],
        "serving_plan_lsh": [accuracy(i, SERVE, LSH) for i in grid],
        "dense": accuracy(len(activator.k_grid) - 1, DENSE, LSH),
    }


def _timed(call: Callable[[np.ndarray], Any], rows: np.ndarray) -> tuple[float, Any]:
    began = time.perf_counter_ns()
    result = call(rows)
    return (time.perf_counter_ns() - began) / 1e6, result


#: Inputs per block: each method serves a block of consecutive inputs, as a worker serves a stream of requests
#: (its weights warm in the caches as they would be), and the methods take turns block by block so that a burst of
#: other work on the machine hits them alike.
BLOCK = 50


def run_blocked(
    calls: list[Callable[[np.ndarray], Any]], x: np.ndarray, passes: int
) -> tuple[np.ndarray, list[list[Any]]]:
    """Per method and input: the fastest of `passes` timings (other work only ever adds time; passes are apart in
    time, so no input is timed twice in a row) and the result of the first pass."""
    times = np.full((passes, len(calls), len(x)), np.inf)
    results: list[list[Any]] = [[None] * len(x) for _ in calls]
    for one in range(passes):
        for start in range(0, len(x), BLOCK):
            for index, call in enumerate(calls):
                for row in range(start, min(start + BLOCK, len(x))):
                    elapsed, result = _timed(call, x[row : row + 1])
                    times[one, index, row] = elapsed
                    if one == 0:  # the methods write into one buffer: keep a copy, taken after the timing
                        results[index][row] = (
                            (result[0].copy(), result[1]) if isinstance(result, tuple) else result.copy()
                        )
    return times.min(axis=0), results


def aclo(methods: Methods, x: np.ndarray, y: np.ndarray, repeats: int) -> dict[str, Any]:
    """Dense, torch, exact and ACLO at every loss budget on every input (`run_blocked`); per-input speedups and
    accuracy."""
    calibration = methods.activator.calibration
    targets = [calibration.dense_accuracy - budget for budget in LOSS_BUDGETS]
    names = ["dense", "torch", "exact", *(f"aclo_{b}" for b in LOSS_BUDGETS)]
    calls: list[Callable[[np.ndarray], Any]] = [
        methods.dense,
        methods.torch,
        methods.exact,
        *(functools.partial(_with_target, methods, "accuracy", a) for a in targets),
    ]
    record: dict[str, Any] = {}
    with load_window(record):
        times, results = run_blocked(calls, x, repeats)
    correct = np.zeros((len(names), len(x)), np.bool_)
    chosen_k = np.zeros((len(LOSS_BUDGETS), len(x)))
    for index, per_input in enumerate(results):
        for row, result in enumerate(per_input):
            logits, response = result if isinstance(result, tuple) else (result, None)
            correct[index, row] = int(np.argmax(logits)) == y[row]
            if response is not None:
                chosen_k[index - 3, row] = response["k"]
    dense_accuracy = float(correct[0].mean())
    rows_out = []
    for index, name in enumerate(names):
        accuracy = float(correct[index].mean())
        entry = {
            "method": name,
            "accuracy": accuracy,
            "loss": dense_accuracy - accuracy,
            "p50_ms": float(np.median(times[index])),
            "mean_ms": float(times[index].mean()),
            **_speedups(times[0] / times[index], "vs_dense"),
            **_speedups(times[1] / times[index], "vs_torch"),
        }
        if name.startswith("aclo_"):
            budget = LOSS_BUDGETS[index - 3]
            target = targets[index - 3]
            entry.update(
                budget=budget,
                target_accuracy=target,
                threshold=aclo_threshold(calibration.thresholds, calibration.accuracy, target),
                mean_k=float(chosen_k[index - 3].mean()),
                k_histogram=_histogram(chosen_k[index - 3]),
            )
        rows_out.append(entry)
    return {"inputs": len(x), "passes": repeats, "block": BLOCK, "rows": rows_out, **record}


def _histogram(values: np.ndarray) -> dict[str, int]:
    found, counts = np.unique(values, return_counts=True)
    return {str(value): int(count) for value, count in zip(found, counts, strict=True)}


def _speedups(ratio: np.ndarray, suffix: str) -> dict[str, float]:
    """Per-input speedup: average, minimum and maximum (the paper's Fig. 5), and the median (robust to the rare
    input that a preemption slowed in one method but not the other)."""
    return {
        f"speedup_{suffix}_mean": float(ratio.mean()),
        f"speedup_{suffix}_min": float(ratio.min()),
        f"speedup_{suffix}_max": float(ratio.max()),
        f"speedup_{suffix}_median": float(np.median(ratio)),
    }


def isolated_p50(methods: Methods, x: np.ndarray, call: str) -> float:
    """The p50 of one method alone (no busy process of ours), over the inputs."""
    run = getattr(methods, call)
    return float(np.median([_timed(run, x[r : r + 1])[0] for r in range(len(x))]))


def lcao(
    methods: Methods,
    x: np.ndarray,
    y: np.ndarray,
    busy_levels: int,
    taus: dict[str, float],
    settle_s: float,
    quiet_wait_s: float = 10.0,
) -> list[dict[str, Any]]:
    """For β = 0 … `busy_levels` busy processes running the dense model: per input, dense and LCAO at every τ
    (interleaved), with latency, misses and accuracy. The probe is the worker's, started here."""
    methods.runtime.probe.start()
    results = []
    try:
        for beta in range(busy_levels + 1):
            wait_for_quiet(quiet_wait_s)
            record: dict[str, Any] = {"busy_processes": beta}
            with busy_processes(methods.kernel, x[:64], beta, duration_s=900.0) as pids:
                record["busy_pids"] = pids
                time.sleep(settle_s)  # let the probe's average see them
                ours = tree_cpu_s(os.getpid())
                with load_window(record):
                    record.update(_lcao_runs(methods, x, y, taus))
                ours = (tree_cpu_s(os.getpid()) - ours) / max(record["wall_s"], 1e-3)  # a smoke run's may round to 0
            record["our_cores"] = round(ours, 3)  # this process and its busy children
            record["other_cores"] = round(record["machine_busy_cores"] - ours, 3)
            results.append(record)
    finally:
        methods.runtime.probe.stop()
    return results


def _lcao_runs(methods: Methods, x: np.ndarray, y: np.ndarray, taus: dict[str, float]) -> dict[str, Any]:
    """Dense, then LCAO at each τ, on every input (blocks as in `run_blocked`, one pass: every latency counts);
    misses are latencies above τ (t0 = 0: nothing queues here)."""
    names = ["dense", *(f"lcao_{name}" for name in taus)]
    calls: list[Callable[[np.ndarray], Any]] = [
        methods.dense,
        *(functools.partial(_with_target, methods, "latency_ms", tau) for tau in taus.values()),
    ]
    times, results = run_blocked(calls, x, passes=1)
    summary: dict[str, Any] = {"methods": {}}
    betas = []
    for index, name in enumerate(names):
        values = times[index]
        logits = [r[0] if isinstance(r, tuple) else r for r in results[index]]
        entry: dict[str, Any] = {
            "accuracy": float(np.mean([int(np.argmax(o)) == label for o, label in zip(logits, y, strict=True)])),
            "p50_ms": float(np.median(values)),
            "p99_ms": float(np.percentile(values, 99)),
            "miss_rate": {tau_name: float((values > tau).mean()) for tau_name, tau in taus.items()},
        }
        if index:
            responses = [r[1] for r in results[index]]
            entry["tau"] = name.removeprefix("lcao_")
            entry["mean_k"] = float(np.mean([r["k"] for r in responses]))
            betas += [r["interference"] for r in responses]
        summary["methods"][name] = entry
    summary["interference_mean"] = float(np.mean(betas))
    return summary
