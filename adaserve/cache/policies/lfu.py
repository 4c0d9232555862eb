"""Least Frequently Used: SageMaker multi-model endpoints' policy, the paper's main baseline (§6.3)."""

from __future__ import annotations

from adaserve.cache.policies.base import RankedPolicy
from adaserve.cache.stats import StatsRegistry


class LFUPolicy(RankedPolicy):
    """Evicts the resident model with the fewest requests since it was loaded; ties go to the least recent.

    In-cache LFU, as in the O(1) LFU of Shah et al. and `cachetools.LFUCache`: a model's count starts with the
    request that loaded it (and those that waited for the load) and is forgotten when it is evicted.
    """

    name = "lfu"

    def __init__(self, stats: StatsRegistry, budget_bytes: int) -> None:
        super().__init__(stats, budget_bytes)
        self._count: dict[str, int] = {}
        self._last: dict[str, float] = {}

    def on_request(self, name: str, now: float) -> None:
        self._count[name] = self._count.get(name, 0) + 1
        self._last[name] = now

    def on_evict(self, name: str, now: float) -> None:
        self._count.pop(name, None)
        self._last.pop(name, None)

    def rank_key(self, name: str) -> tuple[int, float, str]:
        return self._count.get(name, 0), self._last.get(name, -1.0), name


class LFUCoverPolicy(LFUPolicy):
    """LFU taking its victims as a set (`RankedPolicy`)."""

    name = "lfu-cover"
    takes_cover = True
