"""Least Recently Used: what ModelMesh, Clockwork and most GPU model caches use (paper §2.3)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Set

from adaserve.cache.policies.base import EvictionPolicy
from adaserve.cache.stats import StatsRegistry


class LRUPolicy(EvictionPolicy):
    """Evicts the resident model whose last request is oldest."""

    name = "lru"

    def __init__(self, stats: StatsRegistry, budget_bytes: int) -> None:
        super().__init__(stats, budget_bytes)
        self._order: OrderedDict[str, None] = OrderedDict()  # least recently used first

    def on_request(self, name: str, now: float) -> None:
        if name in self._order:
            self._order.move_to_end(name)

    def on_load(self, name: str, now: float) -> None:
        self._order[name] = None
        self._order.move_to_end(name)

    def on_evict(self, name: str, now: float) -> None:
        self._order.pop(name, None)

    def victim(self, candidates: Set[str], needed_bytes: int, now: float) -> str:
        return next(name for name in self._order if name in candidates)
