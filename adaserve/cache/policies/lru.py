"""Least Recently Used: what ModelMesh, Clockwork and most GPU model caches use (paper §2.3)."""

from __future__ import annotations

import itertools

from adaserve.cache.policies.base import RankedPolicy
from adaserve.cache.stats import StatsRegistry


class LRUPolicy(RankedPolicy):
    """Evicts the resident model whose last request is oldest."""

    name = "lru"

    def __init__(self, stats: StatsRegistry, budget_bytes: int) -> None:
        super().__init__(stats, budget_bytes)
        self._clock = itertools.count()
        self._used: dict[str, int] = {}  # resident: when it was last requested (or loaded), in events

    def on_request(self, name: str, now: float) -> None:
        if name in self._used:
            self._used[name] = next(self._clock)

    def on_load(self, name: str, now: float) -> None:
        self._used[name] = next(self._clock)

    def on_evict(self, name: str, now: float) -> None:
        self._used.pop(name, None)

    def rank_key(self, name: str) -> int:
        return self._used[name]


class LRUCoverPolicy(LRUPolicy):
    """LRU taking its victims as a set (`RankedPolicy`)."""

    name = "lru-cover"
    takes_cover = True
