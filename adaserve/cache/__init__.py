"""mCache: more models than memory. Models load on demand and are evicted by a policy (IAM by default) under a
byte budget; the same residency core and policy objects drive the server's cache and the trace simulator."""

from adaserve.cache.cache import CacheSnapshot, Loaded, ModelCache, ModelCounters, ModelSnapshot
from adaserve.cache.policies import POLICIES, EvictionPolicy, create_policy
from adaserve.cache.residency import Residency, State
from adaserve.cache.stats import StatsRegistry

__all__ = [
    "POLICIES",
    "CacheSnapshot",
    "EvictionPolicy",
    "Loaded",
    "ModelCache",
    "ModelCounters",
    "ModelSnapshot",
    "Residency",
    "State",
    "StatsRegistry",
    "create_policy",
]
