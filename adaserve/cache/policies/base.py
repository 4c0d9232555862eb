"""The eviction-policy interface: the residency core tells a policy what happened and asks it for victims.

Calls arrive in this order for a model: `on_request` at every request (hit or miss), `on_load` once it is loaded and
resident (its load time and size are already in the stats registry), `on_evict` when it leaves memory. `victim` is
asked only when room is needed, with the models that may go now (resident, loaded, no request in flight), once per
victim until the model coming in fits.
"""

from __future__ import annotations

import bisect
import math
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Callable, Sequence, Set
from typing import Any, ClassVar

from adaserve.cache.stats import StatsRegistry


class EvictionPolicy(ABC):
    """Chooses which resident model leaves to make room. Logic only: no clocks, no I/O, no asyncio."""

    #: The name `create_policy` knows it by (the value of `--policy`).
    name: ClassVar[str]
    #: Made with `future=[model names in request order]`: only the simulator has that, so only it can make one.
    needs_future: ClassVar[bool] = False

    def __init__(self, stats: StatsRegistry, budget_bytes: int) -> None:
        self.stats = stats
        self.budget_bytes = budget_bytes

    def on_request(self, name: str, now: float) -> None:  # noqa: B027 (a policy overrides the events it needs)
        """A request for `name` arrived; the stats registry has already counted it."""

    def on_load(self, name: str, now: float) -> None:  # noqa: B027 (a policy overrides the events it needs)
        """`name` is loaded and resident."""

    def on_evict(self, name: str, now: float) -> None:  # noqa: B027 (a policy overrides the events it needs)
        """`name` left memory: evicted, or unloaded outside the cache."""

    def eviction_rank(self, name: str) -> float | None:
        """The number the policy evicts `name` by as it stands (the least goes first), for the server's log; None
        for a policy that keeps no such number (LRU's order is its whole state)."""
        return None

    def size_of(self, name: str) -> int:
        """The bytes `name` holds as last measured; at least 1, so that a policy may divide by it (an unmeasured
        model counts as nearly free)."""
        return max(1, self.stats.size_bytes(name) or 0)

    @abstractmethod
    def victim(self, candidates: Set[str], needed_bytes: int, now: float) -> str:
        """The model to evict next, one of `candidates` (never empty), while `needed_bytes` more must be freed. The
        caller evicts the model returned, so a policy may update its own state here as its search would (SRRIP ages
        its RRPVs, GDSF raises its L)."""


class RankedPolicy(EvictionPolicy):
    """A policy that ranks the models one by one (`rank_key`, the least goes first). Plain, it evicts the first,
    again and again until the new model fits, as LRU, LFU and GDSF are defined. With `takes_cover` (the `-cover`
    forms) it takes its victims as a set, `cover`: the fewest first ones that make room, less any the others make
    it without: the plain form drops a 10 MB and a 40 MB model before the 300 MB one that alone was enough. The set
    is a stronger baseline on most workloads (`benchmarks.mcache.simulate` measures both forms), so IAM, which takes
    its own victims as a set, is measured against the better of the two."""

    #: Take the victims as a set (`cover`) rather than one by one.
    takes_cover: ClassVar[bool] = False

    @abstractmethod
    def rank_key(self, name: str) -> Any:
        """What `name` is ranked by as it stands: the least goes first."""

    def victim(self, candidates: Set[str], needed_bytes: int, now: float) -> str:
        if not self.takes_cover:
            return min(candidates, key=self.rank_key)
        return cover(sorted(candidates, key=self.rank_key), self.size_of, needed_bytes)[0]


def cover(ordered: Sequence[str], size_bytes: Callable[[str], int], needed_bytes: int) -> list[str]:
    """Victims for `needed_bytes` from models ranked one by one (`ordered`, the first to go first): the fewest first
    ones that free it, less each the others free it without, tried from the last taken back (see `BeladyOracle`)."""
    chosen: list[str] = []
    freed = 0
    for name in ordered:
        chosen.append(name)
        freed += size_bytes(name)
        if freed >= needed_bytes:
            break
    for name in reversed(chosen[:]):
        if freed - size_bytes(name) >= needed_bytes:
            chosen.remove(name)
            freed -= size_bytes(name)
    return chosen


class NextUse:
    """Where each model is requested next in a known request sequence, following the requests as they arrive: the
    future the simulator gives the policies that need one."""

    def __init__(self, future: Sequence[str]) -> None:
        self._future = list(future)
        self._positions: dict[str, list[int]] = defaultdict(list)
        for index, name in enumerate(self._future):
            self._positions[name].append(index)
        self.cursor = -1  # index of the latest request

    def advance(self, name: str) -> None:
        """The next request arrived; ValueError if the sequence given said another model."""
        self.cursor += 1
        expected = self._future[self.cursor] if self.cursor < len(self._future) else None
        if name != expected:
            raise ValueError(
                f"the policy was given a different request sequence: request {self.cursor} is for '{name}', "
                f"its future says {expected!r}"
            )

    def __len__(self) -> int:
        return len(self._future)

    def count_between(self, name: str, first: int, last: int) -> int:
        """Requests for `name` at indices `first` to `last`, both included."""
        positions = self._positions.get(name, [])
        return bisect.bisect_right(positions, last) - bisect.bisect_left(positions, first)

    def index(self, name: str) -> float:
        """Index of the next request for `name` after the latest one; infinite if there is none."""
        positions = self._positions.get(name, [])
        found = bisect.bisect_right(positions, self.cursor)
        return positions[found] if found < len(positions) else math.inf

    def distance(self, name: str) -> float:
        """Requests from the latest one to the next for `name` (1: it is the very next); infinite if none."""
        return self.index(name) - self.cursor
