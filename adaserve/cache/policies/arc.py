"""Adaptive Replacement Cache (Megiddo & Modha, FAST 2003), one of the paper's baselines (§6.3), in bytes.

ARC keeps two LRU lists of resident objects, T1 (seen once recently) and T2 (seen at least twice), and two ghost
lists of recently evicted names, B1 and B2. A miss that hits B1 says T1 was too small: the target size p of T1 grows;
a miss in B2 shrinks it. REPLACE evicts from T1 while T1 is larger than p, else from T2.

Models differ in size, so every length in the paper is a byte count here: c is the budget, |T1| the bytes resident in
T1, and p moves by the missed model's size times the paper's δ (max(1, |B2|/|B1|) or max(1, |B1|/|B2|)). Ghosts
are trimmed as in the paper's case IV, in bytes: |T1| + |B1| ≤ c and |T1| + |T2| + |B1| + |B2| ≤ 2c. With every
size 1 this is the paper's algorithm.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Set

from adaserve.cache.policies.base import EvictionPolicy
from adaserve.cache.stats import StatsRegistry

_Lru = OrderedDict[str, int]  # name -> bytes, least recent first


class ARCPolicy(EvictionPolicy):
    """ARC over variable-size models; `target_t1_bytes` is the paper's p."""

    name = "arc"

    def __init__(self, stats: StatsRegistry, budget_bytes: int) -> None:
        super().__init__(stats, budget_bytes)
        self.target_t1_bytes = 0.0
        self.t1: _Lru = OrderedDict()
        self.t2: _Lru = OrderedDict()
        self.b1: _Lru = OrderedDict()
        self.b2: _Lru = OrderedDict()
        self._incoming: dict[str, bool] = {}  # missed model -> it was a ghost hit (goes to T2 when loaded)
        self._last_miss_in_b2 = False

    def on_request(self, name: str, now: float) -> None:
        if name in self.t1 or name in self.t2:  # case I: a hit moves the model to the MRU end of T2
            source = self.t1 if name in self.t1 else self.t2
            self.t2[name] = source.pop(name)
            return
        b1, b2 = _bytes(self.b1), _bytes(self.b2)
        self._last_miss_in_b2 = name in self.b2
        if name in self.b1:  # case II: T1 was too small
            size = self.b1.pop(name)
            self.target_t1_bytes = min(self.budget_bytes, self.target_t1_bytes + size * max(1.0, b2 / b1))
            self._incoming[name] = True
        elif name in self.b2:  # case III: T2 was too small
            size = self.b2.pop(name)
            self.target_t1_bytes = max(0.0, self.target_t1_bytes - size * max(1.0, b1 / b2))
            self._incoming[name] = True
        else:  # case IV (or a request while the model is still loading)
            self._incoming.setdefault(name, False)

    def on_load(self, name: str, now: float) -> None:
        ghost_hit = self._incoming.pop(name, False)
        (self.t2 if ghost_hit else self.t1)[name] = self.size_of(name)
        self._trim_ghosts()

    def on_evict(self, name: str, now: float) -> None:
        self.t1.pop(name, None)
        self.t2.pop(name, None)

    def victim(self, candidates: Set[str], needed_bytes: int, now: float) -> str:
        """REPLACE: the LRU of T1 if |T1| > p (or = p after a B2 hit), else the LRU of T2; it becomes a ghost."""
        t1_bytes = _bytes(self.t1)
        from_t1 = t1_bytes > self.target_t1_bytes or (self._last_miss_in_b2 and t1_bytes == self.target_t1_bytes)
        first, second = (self.t1, self.t2) if from_t1 else (self.t2, self.t1)
        for source, ghosts in ((first, self._ghosts_of(first)), (second, self._ghosts_of(second))):
            found = next((name for name in source if name in candidates), None)
            if found is not None:
                ghosts[found] = source.pop(found)
                self._trim_ghosts()
                return found
        raise ValueError(f"ARC: none of {sorted(candidates)} is resident")

    def _ghosts_of(self, source: _Lru) -> _Lru:
        return self.b1 if source is self.t1 else self.b2

    def _trim_ghosts(self) -> None:
        while self.b1 and _bytes(self.t1) + _bytes(self.b1) > self.budget_bytes:
            self.b1.popitem(last=False)
        while self.b2 and _bytes(self.t1) + _bytes(self.t2) + _bytes(self.b1) + _bytes(self.b2) > 2 * self.budget_bytes:
            self.b2.popitem(last=False)


def _bytes(lru: _Lru) -> int:
    return sum(lru.values())
