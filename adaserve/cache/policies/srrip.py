"""Static Re-Reference Interval Prediction (Jaleel et al., ISCA 2010), one of the paper's baselines (§6.3)."""

from __future__ import annotations

from collections.abc import Set

from adaserve.cache.policies.base import EvictionPolicy
from adaserve.cache.stats import StatsRegistry


class SRRIPPolicy(EvictionPolicy):
    """SRRIP-HP with M-bit re-reference prediction values (RRPV, 0 = "re-referenced soon", 2^M - 1 = "distant").

    A loaded model gets RRPV 2^M - 2 ("long"), a hit sets it to 0. The victim is a model with RRPV 2^M - 1; while
    there is none, every RRPV is incremented. The first candidate to reach the maximum is the one with the highest
    RRPV, so the search is one max() followed by the increments it would have made; ties go to the model resident
    longest (the paper's "leftmost way" has no meaning in a fully associative cache).
    """

    name = "srrip"

    def __init__(self, stats: StatsRegistry, budget_bytes: int, bits: int = 2) -> None:
        super().__init__(stats, budget_bytes)
        if bits < 1:
            raise ValueError(f"SRRIP needs at least 1 RRPV bit, got {bits}")
        self.distant = 2**bits - 1
        self._rrpv: dict[str, int] = {}  # insertion order = residency order

    def on_request(self, name: str, now: float) -> None:
        if name in self._rrpv:
            self._rrpv[name] = 0

    def on_load(self, name: str, now: float) -> None:
        self._rrpv[name] = self.distant - 1

    def on_evict(self, name: str, now: float) -> None:
        self._rrpv.pop(name, None)

    def victim(self, candidates: Set[str], needed_bytes: int, now: float) -> str:
        found = max((name for name in self._rrpv if name in candidates), key=self._rrpv.__getitem__)
        aging = self.distant - self._rrpv[found]
        for name, value in self._rrpv.items():
            self._rrpv[name] = min(self.distant, value + aging)
        return found
