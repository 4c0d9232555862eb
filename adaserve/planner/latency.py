"""What a model's run costs, as the planner sees it: the time from sending a node's request to its answer.

GATI plans with the base model's latency (Algorithm 1's `BaseModelLatency`) and lets early exits show up as time
saved, so only runs in which no row exited early are kept. They are kept per batch size, the newest
`window` of each; a batch size not seen yet is priced as that many rows of one.
"""

from __future__ import annotations

from collections import deque

import numpy as np


class LatencyBook:
    def __init__(self, quantile: float, window: int) -> None:
        self.quantile = quantile
        self.window = window
        self._runs: dict[tuple[str, int], deque[float]] = {}

    def observe(self, model: str, rows: int, latency_ms: float) -> None:
        """A whole run of `model` on `rows` rows."""
        self._runs.setdefault((model, rows), deque(maxlen=self.window)).append(latency_ms)

    def estimate_ms(self, model: str, rows: int) -> float | None:
        """The planning latency of `model` on `rows` rows; None before any run of it."""
        runs = self._runs.get((model, rows))
        if runs:
            return float(np.quantile(np.fromiter(runs, float), self.quantile))
        single = self._runs.get((model, 1))
        if single:
            return rows * float(np.quantile(np.fromiter(single, float), self.quantile))
        return None
