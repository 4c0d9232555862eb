"""Importance-Aware Model caching (IAM): mCache's eviction algorithm (Mo et al., EAAI 2025, §4.3, Algorithm 1).

Definitions, quoted from the paper:

* Utility (Eq. 1): "Utility(i) = P_i / S_i · 1 / T_i where P_i denotes the cache miss penalty of model i, which is
  equivalent to the cold start-related latency overhead. S_i denotes the memory usage of model i, and T_i denotes
  the time to the next incoming invocation request for model i." Here P_i is the smoothed load time, S_i the
  measured size, and T_i = max(ḡ_i, time since its last request) from the model's smoothed gap ḡ_i
  (`adaserve.cache.stats`), so u_i = P_i · Δ_i / S_i with Δ_i = 1/T_i.
* Rank-based importance (Eq. 2): "rank_i = log(Σ_{j=1, j≠i}^{C} F(u_i > u_j) + b_0) ... b_0 serves as a bias to
  adjust the range of ranks on a logarithmic scale. F is an indicator function that returns a value of 1 when the
  condition u_i > u_j is true, and 0 otherwise." C is the set of models in the cache.
* Importance queue: "a min heap-based importance queue ... the key represents the importance score, and the value
  is a reference to the model item ... When the cache is full, the least important model at the top of the heap is
  evicted." A model enters the queue with its importance when it is inserted (Algorithm 1, lines 8-9 and 17-18).
* Shadow queue (§4.3.3): "mCache implements periodic updates of the importance scores ... a shadow cache with the
  same structure as the IQ is maintained. After importance updates, the IQ becomes read-only and is utilized only
  for eviction, while changes are recorded in the shadow cache. Once the shadow cache is fully rebuilt, it becomes a
  new IQ and the original one is released."

With `refresh_period_s` set, that is what runs: between refreshes a model keeps the importance it had when it entered
the queue, and once every period the queue is rebuilt from every resident model's current utility and swapped in.
The residency core is synchronous, so a rebuild completes within the call that finds it due and no change can arrive
while it is built; the old queue serves every eviction until then. A model's importance is computed when it is
loaded (its P_i and S_i just measured), against the models resident at that moment, itself included.

By default (`refresh_period_s=None`) the queue is rebuilt when a victim is asked for instead, so every eviction
ranks the resident models by their utilities as they stand. The paper refreshes periodically to keep ranking off
the request path at scale; here a rebuild is a sort of the resident models' utilities, microseconds for hundreds of
models, made only when a load already waits for room, never on a hit. Stale ranks cost: in the simulator (Azure
workload, random assignment, 5 seeds, one closed-loop client) ranking at eviction raised IAM's throughput from
0.775× to 0.826× the exact optimum's at 40% of the models' memory (0.965× to 0.984× at 20%, +1-2% at 60 and 80%),
with mean load times within 1% of the periodic queue's.

Ranking at eviction, IAM also takes its victims as a set (`cover`, `_cheapest_cover`). The paper pops the least
important model until the new one fits, and so may drop two small models where one large one, alone enough, would
cost less: evicting model i costs the load its next request pays, P_i per T_i, which is u_i · S_i. So the victims are
the queue's first models that make room, pruned of any the others make it without, unless one model that makes room
alone costs less than they do together. In the simulator (5 seeds, closed loop) that raised IAM's throughput from
0.824 / 0.786 / 0.784× to 0.836 / 0.795 / 0.806× the exact optimum's at 40 / 60 / 80% of memory on the random
workload, and on the sparse trace from 0.859 / 0.824 / 0.933× to 0.873 / 0.850 / 0.948×. With `refresh_period_s` set
IAM is the paper's Algorithm 1 throughout.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections.abc import Iterable, Sequence, Set
from typing import Any

from adaserve.cache.policies.base import EvictionPolicy, NextUse, cover
from adaserve.cache.stats import StatsRegistry

#: None: rebuild the queue at every eviction; a number of seconds: the paper's periodic refresh (it used 30 s here).
DEFAULT_REFRESH_PERIOD_S: float | None = None


class ImportanceQueue:
    """The paper's IQ: a min-heap of (importance, model); removal is lazy, so a pop skips stale entries."""

    def __init__(self, entries: Iterable[tuple[float, str]] = ()) -> None:
        self._order = itertools.count()
        self._heap = [(rank, next(self._order), name) for rank, name in entries]
        heapq.heapify(self._heap)
        self._live = {name: (rank, order) for rank, order, name in self._heap}

    def set(self, rank: float, name: str) -> None:
        entry = (rank, next(self._order), name)
        self._live[name] = entry[:2]
        heapq.heappush(self._heap, entry)

    def discard(self, name: str) -> None:
        self._live.pop(name, None)

    def least_important_first(self, names: Iterable[str]) -> list[str]:
        """`names` (all queued) in the order `pop_min` would give them."""
        return sorted(names, key=lambda name: self._live[name])

    def rank(self, name: str) -> float | None:
        """The importance `name` is queued with; None when it is not queued."""
        live = self._live.get(name)
        return None if live is None else live[0]

    def pop_min(self, allowed: Set[str]) -> str:
        """Remove and return the least important model in `allowed`; ties go to the one queued first."""
        skipped = []
        try:
            while self._heap:
                rank, order, name = heapq.heappop(self._heap)
                if self._live.get(name) != (rank, order):
                    continue  # discarded, or set again since
                if name in allowed:
                    del self._live[name]
                    return name
                skipped.append((rank, order, name))
            raise ValueError(f"the importance queue holds none of {sorted(allowed)}")
        finally:
            for entry in skipped:
                heapq.heappush(self._heap, entry)


class IAMPolicy(EvictionPolicy):
    """Evicts the resident model at the top of the importance queue (the smallest rank-based importance)."""

    name = "iam"

    def __init__(
        self,
        stats: StatsRegistry,
        budget_bytes: int,
        refresh_period_s: float | None = DEFAULT_REFRESH_PERIOD_S,
        b0: float = 1.0,
    ) -> None:
        super().__init__(stats, budget_bytes)
        if refresh_period_s is not None and refresh_period_s <= 0:
            raise ValueError(
                f"IAM refresh_period_s must be positive (or None: at every eviction), got {refresh_period_s}"
            )
        if b0 <= 0:
            raise ValueError(f"IAM b0 must be positive (log(0) is undefined for the least useful model), got {b0}")
        self.refresh_period_s = refresh_period_s
        self.b0 = b0
        self.queue = ImportanceQueue()
        self.refreshes = 0
        self._resident: dict[str, None] = {}  # load order
        self._next_refresh_s: float | None = None

    def utility(self, name: str, now: float) -> float:
        """u_i = P_i / S_i · 1 / T_i (Eq. 1); 0 for a model with no recent requests (T_i infinite)."""
        return self.stats.penalty_s(name) / self.size_of(name) / self.time_to_next(name, now)

    def time_to_next(self, name: str, now: float) -> float:
        """T_i from the model's own gaps (`StatsRegistry.expected_gap_s`), as §4.3.2 estimates it from Δ_i."""
        return self.stats.expected_gap_s(name, now)

    def importance(self, name: str, now: float) -> float:
        """rank_i = log(Σ_{j≠i} F(u_i > u_j) + b0) over the resident models (Eq. 2)."""
        return self._ranks([name, *(j for j in self._resident if j != name)], now)[0]

    def on_request(self, name: str, now: float) -> None:
        self._refresh_if_due(now)

    def on_load(self, name: str, now: float) -> None:
        self._refresh_if_due(now)
        self._resident[name] = None
        self.queue.set(self.importance(name, now), name)

    def on_evict(self, name: str, now: float) -> None:
        self._resident.pop(name, None)
        self.queue.discard(name)

    def victim(self, candidates: Set[str], needed_bytes: int, now: float) -> str:
        if self.refresh_period_s is not None:  # the paper's Algorithm 1: the top of the (read-only) queue
            self._refresh_if_due(now)
            return self.queue.pop_min(candidates)
        self._rebuild(now)
        return self.queue.pop_min(set(self._cheapest_cover(candidates, needed_bytes, now)))

    def eviction_rank(self, name: str) -> float | None:
        """Its importance in the queue evictions use now (set at its load or at the last refresh)."""
        return self.queue.rank(name)

    def _cheapest_cover(self, candidates: Set[str], needed_bytes: int, now: float) -> list[str]:
        """The victims in queue order (`cover`), or the one model that alone frees the room at less cost, the cost of
        evicting a model being the load time its next request will pay per second until then, P_i / T_i = u_i · S_i.
        The queue by itself can drop several small models where one large one costs less."""
        chosen = cover(self.queue.least_important_first(candidates), self.size_of, needed_bytes)
        cost = {name: self.utility(name, now) * self.size_of(name) for name in candidates}
        alone = [name for name in candidates if self.size_of(name) >= needed_bytes]
        cheapest = min(alone, key=lambda name: (cost[name], name), default=None)
        if cheapest is not None and cost[cheapest] < sum(cost[name] for name in chosen):
            return [cheapest]
        return chosen

    def _refresh_if_due(self, now: float) -> None:
        if self.refresh_period_s is None:
            return  # the queue is rebuilt at each eviction instead
        if self._next_refresh_s is None:
            self._next_refresh_s = now + self.refresh_period_s
        elif now >= self._next_refresh_s:
            self._rebuild(now)
            self._next_refresh_s = now + self.refresh_period_s

    def _rebuild(self, now: float) -> None:
        """Rank every resident model by its utility now into a shadow queue, and swap it in."""
        names = list(self._resident)
        self.queue = ImportanceQueue(zip(self._ranks(names, now), names, strict=True))  # the old one is released
        self.refreshes += 1

    def _ranks(self, names: list[str], now: float) -> list[float]:
        utilities = [self.utility(name, now) for name in names]
        ordered = sorted(utilities)
        # Σ_{j≠i} F(u_i > u_j) is the number of utilities strictly below u_i (u_i itself is not below itself).
        return [math.log(bisect.bisect_left(ordered, u) + self.b0) for u in utilities]


class IAMForesight(IAMPolicy):
    """IAM with T_i taken from the future rather than estimated (simulation only): the requests until the model's
    next one in the sequence. The paper credits IAM's hit ratio to its "foreknowledge of the upcoming requests"
    (§6.3.1) while §4.3.2 estimates T_i from the request rate; this measures what that foreknowledge is worth. Counted
    in requests, not seconds, so it means the same in the simulator's open and closed loops; IAM only compares
    utilities, and a common unit cancels."""

    name = "iam-foresight"
    needs_future = True

    def __init__(
        self,
        stats: StatsRegistry,
        budget_bytes: int,
        future: Sequence[str],
        refresh_period_s: float | None = DEFAULT_REFRESH_PERIOD_S,
        b0: float = 1.0,
    ) -> None:
        super().__init__(stats, budget_bytes, refresh_period_s, b0)
        self._next = NextUse(future)

    def on_request(self, name: str, now: float) -> None:
        self._next.advance(name)
        super().on_request(name, now)

    def time_to_next(self, name: str, now: float) -> float:
        return self._next.distance(name)


class IAMKnownRate(IAMForesight):
    """IAM with T_i taken from each model's true rate rather than estimated (simulation only): the mean gap between
    its requests within `window` requests either side of the latest one, read from the sequence. Where foresight
    knows when each model comes next, this knows only how often, as exactly as a rate can be known at that time
    scale: what IAM would reach were its estimate of Δ_i (§4.3.2) perfect. The default window, 100 either side, is
    about the span the online estimate's last nine gaps cover for one of eleven equally requested models. A model
    absent from the window counts one gap the length of the whole sequence. Counted in requests, as foresight is."""

    name = "iam-known-rate"

    def __init__(
        self, stats: StatsRegistry, budget_bytes: int, future: Sequence[str], window: int = 100, **options: Any
    ) -> None:
        super().__init__(stats, budget_bytes, future, **options)
        if window < 1:
            raise ValueError(f"IAM known-rate window must be at least 1 request, got {window}")
        self.window = window

    def time_to_next(self, name: str, now: float) -> float:
        """The window's length over the model's requests in it."""
        cursor = self._next.cursor
        requests = self._next.count_between(name, cursor - self.window, cursor + self.window)
        return (2 * self.window + 1) / requests if requests else float(len(self._next))
