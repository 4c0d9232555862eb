"""Small builders for the cache tests: a fake clock, a policy with known measurements, a hand-driven cache."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from adaserve.cache.policies import EvictionPolicy, create_policy
from adaserve.cache.residency import Residency
from adaserve.cache.stats import StatsRegistry

#: The shared data lie beside the project (../shared/data from the project root).
AZURE_FUNCTIONS = Path(__file__).resolve().parents[3] / "shared/data/traces/azure-functions-2019/500_invocations.csv"
needs_azure_functions = pytest.mark.skipif(
    not AZURE_FUNCTIONS.is_file(), reason="shared/data traces are not beside the project"
)


@dataclass
class FakeClock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Driver:
    """A cache worked by hand: each request is a hit, or a miss that evicts, loads and records the victims."""

    core: Residency
    sizes: dict[str, int] = field(default_factory=dict)
    penalties: dict[str, float] = field(default_factory=dict)

    @property
    def policy(self) -> Any:
        return self.core.policy

    def request(self, name: str, now: float = 0.0) -> list[str]:
        """One request at `now`; returns the victims it caused ([] on a hit)."""
        if self.core.request(name, now) is not None:
            return []
        size = self.sizes.get(name, 1)
        victims = self.core.admit(name, size, now)
        self.core.loaded(name, size, self.penalties.get(name, 1.0), now)
        return victims

    def replay(self, names: str | list[str], now: float = 0.0) -> list[str]:
        """Requests for each name in turn (a string means one-letter names); returns every victim, in order."""
        victims = []
        for name in names:
            victims += self.request(name, now)
        return victims

    def resident(self) -> set[str]:
        return set(self.core.residents())


def driver(
    policy: str,
    budget_bytes: int,
    *,
    sizes: dict[str, int] | None = None,
    penalties: dict[str, float] | None = None,
    stats: StatsRegistry | None = None,
    **options: Any,
) -> Driver:
    """A Driver over `policy`; every model is 1 byte and loads in 1 s unless `sizes` / `penalties` say otherwise."""
    made: EvictionPolicy = create_policy(policy, stats or StatsRegistry(), budget_bytes, **options)
    return Driver(Residency(budget_bytes, made), sizes or {}, penalties or {})
