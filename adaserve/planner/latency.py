"""What a model's run costs, as the planner sees it: the time from sending a node's request to its answer.

GATI plans with the base model's latency (Algorithm 1's `BaseModelLatency`) and lets early exits show up as time
saved, so only runs in which no row exited early are kept. They are kept per batch size, the newest
`window` of each; a batch size not seen yet is priced as that many rows of one. Each window is also kept sorted, so
a quantile is an index, not a sort: a request asks for every option's latency at each node, twice with replanning.
"""

from __future__ import annotations

import bisect
from collections import deque


class LatencyBook:
    def __init__(self, quantile: float, window: int) -> None:
        self.quantile = quantile
        self.window = window
        self._runs: dict[tuple[str, int], deque[float]] = {}  # in the order they came
        self._sorted: dict[tuple[str, int], list[float]] = {}  # the same runs, ascending

    def observe(self, model: str, rows: int, latency_ms: float) -> None:
        """A whole run of `model` on `rows` rows."""
        key = (model, rows)
        runs, ascending = self._runs.setdefault(key, deque()), self._sorted.setdefault(key, [])
        if len(runs) == self.window:
            del ascending[bisect.bisect_left(ascending, runs.popleft())]
        runs.append(latency_ms)
        bisect.insort(ascending, latency_ms)

    def estimate_ms(self, model: str, rows: int) -> float | None:
        """The planning latency of `model` on `rows` rows; None before any run of it."""
        own = self._quantile(model, rows)
        if own is not None:
            return own
        single = self._quantile(model, 1)
        return None if single is None else rows * single

    def _quantile(self, model: str, rows: int) -> float | None:
        """numpy's default (linear) quantile of the window."""
        ascending = self._sorted.get((model, rows))
        if not ascending:
            return None
        position = self.quantile * (len(ascending) - 1)
        low = int(position)
        high = min(low + 1, len(ascending) - 1)
        return ascending[low] + (ascending[high] - ascending[low]) * (position - low)
