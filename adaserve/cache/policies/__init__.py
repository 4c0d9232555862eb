"""Eviction policies behind one interface, picked by name: mCache's IAM and the baselines it is measured against.

`create_policy("iam", stats, budget_bytes)` gives IAM, and "lru", "lfu", "arc", "srrip", "gdsf" the baselines, so the
paper's comparison is a config value. "lru-cover", "lfu-cover" and "gdsf-cover" are those baselines taking their
victims as a set, as IAM does (`RankedPolicy`). Three need the future (`needs_future`): the offline oracle, IAM
with T_i read from it ("iam-foresight") and IAM with each model's true rate read from it ("iam-known-rate"):
`create_policy("oracle", stats, budget_bytes, future=[model names in request order])`, which only the simulator has.
"""

from __future__ import annotations

from typing import Any

from adaserve.cache.policies.arc import ARCPolicy
from adaserve.cache.policies.base import EvictionPolicy, RankedPolicy
from adaserve.cache.policies.gdsf import GDSFCoverPolicy, GDSFPolicy
from adaserve.cache.policies.iam import IAMForesight, IAMKnownRate, IAMPolicy, ImportanceQueue
from adaserve.cache.policies.lfu import LFUCoverPolicy, LFUPolicy
from adaserve.cache.policies.lru import LRUCoverPolicy, LRUPolicy
from adaserve.cache.policies.oracle import BeladyOracle
from adaserve.cache.policies.srrip import SRRIPPolicy
from adaserve.cache.stats import StatsRegistry
from adaserve.errors import ConfigError

__all__ = [
    "POLICIES",
    "ARCPolicy",
    "BeladyOracle",
    "EvictionPolicy",
    "GDSFCoverPolicy",
    "GDSFPolicy",
    "IAMForesight",
    "IAMKnownRate",
    "IAMPolicy",
    "ImportanceQueue",
    "LFUCoverPolicy",
    "LFUPolicy",
    "LRUCoverPolicy",
    "LRUPolicy",
    "RankedPolicy",
    "SRRIPPolicy",
    "create_policy",
]

POLICIES: dict[str, type[EvictionPolicy]] = {
    cls.name: cls
    for cls in (
        IAMPolicy,
        LRUPolicy,
        LFUPolicy,
        ARCPolicy,
        SRRIPPolicy,
        GDSFPolicy,
        LRUCoverPolicy,
        LFUCoverPolicy,
        GDSFCoverPolicy,
        IAMForesight,
        IAMKnownRate,
        BeladyOracle,
    )
}


def create_policy(name: str, stats: StatsRegistry, budget_bytes: int, **options: Any) -> EvictionPolicy:
    """The policy called `name`, reading `stats`, for a cache of `budget_bytes`; `options` go to its constructor
    (IAM: refresh_period_s, b0; SRRIP: bits; the oracle: future). ConfigError names an unknown policy or option."""
    cls = POLICIES.get(name.lower())
    if cls is None:
        raise ConfigError(f"unknown eviction policy '{name}'; expected one of {', '.join(POLICIES)}")
    try:
        return cls(stats, budget_bytes, **options)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"eviction policy '{cls.name}': {exc}") from exc
