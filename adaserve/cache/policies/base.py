"""The eviction-policy interface: the residency core tells a policy what happened and asks it for victims.

Calls arrive in this order for a model: `on_request` at every request (hit or miss), `on_load` once it is loaded and
resident (its load time and size are already in the stats registry), `on_evict` when it leaves memory. `victim` is
asked only when room is needed, with the models that may go now (resident, loaded, no request in flight), once per
victim until the model coming in fits.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Set
from typing import ClassVar

from adaserve.cache.stats import StatsRegistry


class EvictionPolicy(ABC):
    """Chooses which resident model leaves to make room. Logic only: no clocks, no I/O, no asyncio."""

    #: The name `create_policy` knows it by (the value of `--policy`).
    name: ClassVar[str]

    def __init__(self, stats: StatsRegistry, budget_bytes: int) -> None:
        self.stats = stats
        self.budget_bytes = budget_bytes

    def on_request(self, name: str, now: float) -> None:  # noqa: B027 (a policy overrides the events it needs)
        """A request for `name` arrived; the stats registry has already counted it."""

    def on_load(self, name: str, now: float) -> None:  # noqa: B027 (a policy overrides the events it needs)
        """`name` is loaded and resident."""

    def on_evict(self, name: str, now: float) -> None:  # noqa: B027 (a policy overrides the events it needs)
        """`name` left memory: evicted, or unloaded outside the cache."""

    @abstractmethod
    def victim(self, candidates: Set[str], needed_bytes: int, now: float) -> str:
        """The model to evict next, one of `candidates` (never empty), while `needed_bytes` more must be freed. The
        caller evicts the model returned, so a policy may update its own state here as its search would (SRRIP ages
        its RRPVs, GDSF raises its L)."""
