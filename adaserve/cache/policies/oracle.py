"""A Belady-style offline oracle: the limit the online policies are measured against (simulation only)."""

from __future__ import annotations

from collections.abc import Sequence, Set

from adaserve.cache.policies.base import EvictionPolicy, NextUse, cover
from adaserve.cache.stats import StatsRegistry


class BeladyOracle(EvictionPolicy):
    """Farthest next use (Belady's MIN), made size-aware by pruning: it is given the whole request sequence.

    Belady's MIN evicts the object whose next request is farthest away, and maximises the hit ratio when objects
    have one size. Models differ in size, and taking victims one by one in that order evicts small models that did
    not need to go: to admit a 300 MB model it would drop a 10 MB and a 40 MB model first and the 300 MB one after.
    So the oracle takes candidates in farthest-next-use order until they free `needed_bytes`, then drops from that
    set, nearest next use first, every model the others cover without, and evicts the farthest of what is left.

    With sizes and load penalties, choosing victims to minimise misses or load time under a byte budget is NP-hard,
    so this is a strong reference point, not the exact optimum: an online policy can beat it on load time, and on
    hit ratio in corner cases. It needs the future, so only the simulator can make one.
    """

    name = "oracle"
    needs_future = True

    def __init__(self, stats: StatsRegistry, budget_bytes: int, future: Sequence[str]) -> None:
        super().__init__(stats, budget_bytes)
        self._next = NextUse(future)

    def on_request(self, name: str, now: float) -> None:
        self._next.advance(name)

    def next_use(self, name: str) -> float:
        """Index of the next request for `name` after the latest one; infinite if there is none."""
        return self._next.index(name)

    def victim(self, candidates: Set[str], needed_bytes: int, now: float) -> str:
        farthest_first = sorted(candidates, key=lambda name: (self.next_use(name), name), reverse=True)
        return cover(farthest_first, self.size_of, needed_bytes)[0]
