"""Which models are resident under a byte budget: the synchronous core both the server's cache and the simulator use.

It keeps the books (each resident model's bytes, whether it is still loading, how many requests pin it) and asks the
policy for victims when a model must come in. It never waits and never does I/O: `ModelCache` (asyncio) and the
simulator (virtual time) drive it, and call `loaded` when a load they started finishes.

Rules: a model with requests in flight (pinned) or still loading is never evicted; a model larger than the whole
budget is refused (`ModelTooLargeError`); when the unpinned models together cannot make room the admission is
refused for now (`CacheBusyError`) and the caller waits for a release. A loaded model that turns out larger than its
estimate evicts more after its load; if nothing more can go, the cache runs over budget until the next admission.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from adaserve.cache.policies import EvictionPolicy
from adaserve.cache.stats import StatsRegistry
from adaserve.errors import CacheBusyError, ModelTooLargeError


class State(enum.Enum):
    LOADING = "LOADING"
    LOADED = "LOADED"


@dataclass(eq=False)
class Resident:
    """One model in memory (or being loaded into it). Identity matters: a pin belongs to this entry, not the name."""

    name: str
    size_bytes: int
    state: State = State.LOADING
    pins: int = 0


class Residency:
    """The resident set under `budget_bytes`, with `policy` choosing victims."""

    def __init__(self, budget_bytes: int, policy: EvictionPolicy) -> None:
        if budget_bytes <= 0:
            raise ValueError(f"the model-memory budget must be positive, got {budget_bytes} bytes")
        if policy.budget_bytes != budget_bytes:
            raise ValueError(f"the policy was made for {policy.budget_bytes} bytes, the cache has {budget_bytes}")
        self.budget_bytes = budget_bytes
        self.policy = policy
        self._residents: dict[str, Resident] = {}

    @property
    def stats(self) -> StatsRegistry:
        return self.policy.stats

    @property
    def used_bytes(self) -> int:
        return sum(entry.size_bytes for entry in self._residents.values())

    def residents(self) -> dict[str, Resident]:
        return dict(self._residents)

    def state(self, name: str) -> State | None:
        entry = self._residents.get(name)
        return None if entry is None else entry.state

    def request(self, name: str, now: float) -> State | None:
        """Count a request in the stats and tell the policy; returns the model's state as the request found it."""
        self.stats.record_request(name, now)
        self.policy.on_request(name, now)
        return self.state(name)

    def admit(self, name: str, size_bytes: int, now: float) -> list[str]:
        """Reserve `size_bytes` for `name` (state LOADING), evicting by the policy until it fits; returns the victims,
        which the caller unloads. Raises ModelTooLargeError, or CacheBusyError when the unpinned models are not
        enough now (nothing is evicted then)."""
        if name in self._residents:
            raise ValueError(f"model '{name}' is already resident ({self._residents[name].state.value})")
        if size_bytes > self.budget_bytes:
            raise ModelTooLargeError(
                f"model '{name}' needs {mib(size_bytes)} but the whole model-memory budget is "
                f"{mib(self.budget_bytes)}; raise the budget or serve it elsewhere"
            )
        needed = self.used_bytes + size_bytes - self.budget_bytes
        evictable = sum(entry.size_bytes for entry in self._evictable().values())
        if needed > evictable:
            busy = sorted(n for n, e in self._residents.items() if e.pins or e.state is State.LOADING)
            raise CacheBusyError(
                f"no room for model '{name}' ({mib(size_bytes)}): the budget is {mib(self.budget_bytes)} and "
                f"the resident models that may be evicted free only {mib(evictable)}; busy (in use or loading): "
                f"{', '.join(busy)}"
            )
        victims = self._evict(needed, now)
        self._residents[name] = Resident(name, size_bytes)
        return victims

    def loaded(self, name: str, size_bytes: int, load_s: float, now: float, host_wait_s: float = 0.0) -> list[str]:
        """The load of `name` finished (`host_wait_s` of its `load_s` waiting for a host process): record its
        measured size and load time, mark it LOADED, and evict what else must go if it came out larger than its
        estimate (returns those victims). A model larger than the whole budget is dropped again and
        ModelTooLargeError raised; the caller unloads it."""
        entry = self._residents[name]
        entry.size_bytes, entry.state = size_bytes, State.LOADED
        self.stats.record_load(name, load_s, size_bytes, host_wait_s)
        self.policy.on_load(name, now)
        if size_bytes > self.budget_bytes:
            self.remove(name, now)
            raise ModelTooLargeError(
                f"model '{name}' takes {mib(size_bytes)} once loaded, more than the whole model-memory budget "
                f"of {mib(self.budget_bytes)}; raise the budget or serve it elsewhere"
            )
        over = self.used_bytes - self.budget_bytes
        if over <= 0:
            return []
        evictable = self._evictable(exclude=name)
        return self._evict(min(over, sum(e.size_bytes for e in evictable.values())), now, exclude=name)

    def load_failed(self, name: str) -> None:
        """The load of `name` failed: release its reservation; it is not resident and a later request retries."""
        self._residents.pop(name, None)

    def pin(self, name: str) -> Resident:
        """Hold `name` in memory for one request; give the returned entry back to `unpin`."""
        entry = self._residents[name]
        entry.pins += 1
        return entry

    def unpin(self, entry: Resident) -> bool:
        """Release one pin; True when the model has no pins left and is still resident (it may now be evicted)."""
        entry.pins = max(0, entry.pins - 1)
        return entry.pins == 0 and self._residents.get(entry.name) is entry

    def remove(self, name: str, now: float) -> bool:
        """Forget `name` (unloaded outside the cache, or failed once loaded); False if it was not resident."""
        if self._residents.pop(name, None) is None:
            return False
        self.policy.on_evict(name, now)
        return True

    def _evictable(self, exclude: str | None = None) -> dict[str, Resident]:
        return {
            name: entry
            for name, entry in self._residents.items()
            if entry.state is State.LOADED and entry.pins == 0 and name != exclude
        }

    def _evict(self, needed: int, now: float, exclude: str | None = None) -> list[str]:
        victims: list[str] = []
        while needed > 0:
            candidates = self._evictable(exclude)
            victim = self.policy.victim(candidates.keys(), needed, now)
            if victim not in candidates:
                raise RuntimeError(f"eviction policy '{self.policy.name}' chose '{victim}', which may not be evicted")
            needed -= candidates[victim].size_bytes
            self.remove(victim, now)
            victims.append(victim)
        return victims


def mib(size_bytes: int) -> str:
    """Bytes as the cache's messages give them: `12.3 MiB`."""
    return f"{size_bytes / 2**20:.1f} MiB"
