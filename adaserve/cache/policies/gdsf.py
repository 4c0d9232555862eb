"""GreedyDual-Size-Frequency (Cherkasova, HP Labs 1998): the classic size- and cost-aware web-cache policy.

The paper did not compare against it; it is here because it weighs the same things IAM weighs (miss cost, size,
popularity) with a different rule, so it tells whether IAM's rank-based importance is what makes the difference.
"""

from __future__ import annotations

from collections.abc import Set

from adaserve.cache.policies.base import RankedPolicy
from adaserve.cache.stats import StatsRegistry


class GDSFPolicy(RankedPolicy):
    """H_i = L + F_i · C_i / S_i; evict the smallest H and set the inflation value L to it.

    C_i is the load penalty P_i, S_i the size, F_i the requests since the model was loaded (as in Squid's GDSF,
    including those that waited for the load). A hit recomputes H_i with the current L, so models that stop being
    requested age relative to newly loaded ones. Ties go to the model whose H was set earliest.
    """

    name = "gdsf"

    def __init__(self, stats: StatsRegistry, budget_bytes: int) -> None:
        super().__init__(stats, budget_bytes)
        self.inflation = 0.0  # L
        self._frequency: dict[str, int] = {}
        self._priority: dict[str, tuple[float, int]] = {}  # resident: (H, when it was set)
        self._tick = 0

    def on_request(self, name: str, now: float) -> None:
        self._frequency[name] = self._frequency.get(name, 0) + 1
        if name in self._priority:
            self._set_priority(name)

    def on_load(self, name: str, now: float) -> None:
        self._set_priority(name)

    def on_evict(self, name: str, now: float) -> None:
        self._frequency.pop(name, None)
        self._priority.pop(name, None)

    def rank_key(self, name: str) -> tuple[float, int]:
        return self._priority[name]

    def victim(self, candidates: Set[str], needed_bytes: int, now: float) -> str:
        found = super().victim(candidates, needed_bytes, now)
        self.inflation = self._priority[found][0]
        return found

    def _set_priority(self, name: str) -> None:
        cost, size = self.stats.penalty_s(name), self.size_of(name)
        self._tick += 1
        self._priority[name] = (self.inflation + self._frequency.get(name, 1) * cost / size, self._tick)


class GDSFCoverPolicy(GDSFPolicy):
    """GDSF taking its victims as a set (`RankedPolicy`)."""

    name = "gdsf-cover"
    takes_cover = True
