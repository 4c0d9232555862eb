"""`ModelCache`: the asyncio face of the residency core, what the router calls around every request.

    cache = ModelCache(budget_bytes, "iam", load, unload, size_hint)   # or a policy object from create_policy
    async with cache.use("resnet"):      # a hit, or a load on a miss (evicting by the policy); pinned inside
        ...

`load(name)` brings a model into memory and returns what it measured (`Loaded`: its bytes, and how long the load
waited for a host process); `unload(name)` frees it; `size_hint(name)` estimates the bytes of a model never loaded.
Concurrent requests for a model being loaded wait on that one load; a failed load is raised to every waiter
(ModelLoadError, the cause chained) and leaves the model non-resident, so a later request tries again. When every
resident model is in use, a request waits for one to be released, up to `busy_timeout_s`, then gets CacheBusyError.
Victims are unloaded in the background; a load waits for the unloads that make its room (and for its own model's
unload, if it was just evicted).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from adaserve.cache.policies import EvictionPolicy, create_policy
from adaserve.cache.residency import Residency, Resident, State, mib
from adaserve.cache.stats import StatsRegistry
from adaserve.errors import CacheBusyError, ModelLoadError, ModelTooLargeError

log = logging.getLogger("adaserve.cache")

DEFAULT_BUSY_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Loaded:
    """What a load measured: the model's bytes once loaded, and the part of the load spent waiting for a host process
    to take the model (a spare still starting; the server's cost, not the model's: `adaserve.cache.stats`)."""

    size_bytes: int
    host_wait_s: float = 0.0


@dataclass
class ModelCounters:
    """One model's share of the cache's counters."""

    hits: int = 0
    misses: int = 0
    loads: int = 0
    load_failures: int = 0
    evictions: int = 0
    load_seconds_total: float = 0.0


@dataclass(frozen=True)
class ModelSnapshot:
    state: str  # LOADED, LOADING or UNLOADED
    resident_bytes: int
    counters: ModelCounters
    smoothed_load_s: float | None  # P_i, as the policy sees it


@dataclass(frozen=True)
class CacheSnapshot:
    """Plain numbers for /metrics: totals over all models, and each model's own."""

    policy: str
    budget_bytes: int
    resident_bytes: int
    hits: int
    misses: int
    loads: int
    load_failures: int
    evictions: int
    load_seconds_total: float
    busy_timeouts: int
    models: dict[str, ModelSnapshot] = field(default_factory=dict)


class ModelCache:
    def __init__(
        self,
        budget_bytes: int,
        policy: str | EvictionPolicy,
        load: Callable[[str], Awaitable[Loaded]],
        unload: Callable[[str], Awaitable[None]],
        size_hint: Callable[[str], int],
        *,
        clock: Callable[[], float] = time.monotonic,
        busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
    ) -> None:
        if isinstance(policy, str):
            policy = create_policy(policy, StatsRegistry(), budget_bytes)
        self._core = Residency(budget_bytes, policy)
        self._load_fn, self._unload_fn, self._size_hint = load, unload, size_hint
        self._clock = clock
        self.busy_timeout_s = busy_timeout_s
        self._loads: dict[str, asyncio.Task[None]] = {}
        self._unloads: dict[str, asyncio.Task[None]] = {}
        self._counters: dict[str, ModelCounters] = {}
        self._busy_timeouts = 0
        self._change: asyncio.Future[None] | None = None  # resolved (and replaced) whenever room may have appeared

    @asynccontextmanager
    async def use(self, name: str) -> AsyncIterator[None]:
        """Hold `name` in memory for the block, loading it first on a miss."""
        entry = await self._acquire(name)
        try:
            yield
        finally:
            if self._core.unpin(entry):
                self._notify()

    def forget(self, name: str) -> None:
        """`name` was unloaded outside the cache (the repository API): drop it from the books. A model the cache
        is loading right now is left to its load."""
        if name not in self._loads and self._core.remove(name, self._clock()):
            self._notify()

    def state(self, name: str) -> State | None:
        return self._core.state(name)

    def load_penalty_s(self, name: str) -> float | None:
        """P_i, the time a load of `name` is expected to take (its own, and the wait for a host); None before its
        first load."""
        return self._core.stats.penalty_s(name) if self._core.stats.get(name).loads else None

    def snapshot(self) -> CacheSnapshot:
        residents = self._core.residents()
        models = {
            name: ModelSnapshot(
                state=residents[name].state.value if name in residents else "UNLOADED",
                resident_bytes=residents[name].size_bytes if name in residents else 0,
                counters=ModelCounters(**vars(counters)),
                smoothed_load_s=self.load_penalty_s(name),
            )
            for name, counters in self._counters.items()
        }
        every = list(self._counters.values())
        return CacheSnapshot(
            policy=self._core.policy.name,
            budget_bytes=self._core.budget_bytes,
            resident_bytes=self._core.used_bytes,
            hits=sum(c.hits for c in every),
            misses=sum(c.misses for c in every),
            loads=sum(c.loads for c in every),
            load_failures=sum(c.load_failures for c in every),
            evictions=sum(c.evictions for c in every),
            load_seconds_total=sum(c.load_seconds_total for c in every),
            busy_timeouts=self._busy_timeouts,
            models=models,
        )

    async def _acquire(self, name: str) -> Resident:
        counters = self._counters.setdefault(name, ModelCounters())
        state = self._core.request(name, self._clock())
        if state is State.LOADED:
            counters.hits += 1
            return self._core.pin(name)
        counters.misses += 1
        deadline = asyncio.get_running_loop().time() + self.busy_timeout_s
        while True:
            state = self._core.state(name)
            if state is State.LOADED:
                return self._core.pin(name)
            if state is None:
                before, estimate = self._resident_now(), self._estimate(name)
                try:
                    victims = self._core.admit(name, estimate, self._clock())
                except CacheBusyError as exc:
                    await self._wait_for_room(deadline, exc)
                    continue
                log.info(
                    "model loading on demand",
                    extra={
                        "model": name,
                        "reason": "a request found it not resident",
                        "estimate_bytes": estimate,
                        "evicting": victims,
                    },
                )
                self._evicted(victims, before, f"to make room for model '{name}' ({mib(estimate)})")
                self._start_load(name, victims)
            entry = self._core.pin(name)
            try:
                await self._wait_for_load(name)
            except BaseException:
                if self._core.unpin(entry):
                    self._notify()
                raise
            return entry

    def _estimate(self, name: str) -> int:
        measured = self._core.stats.size_bytes(name)
        return measured if measured is not None else self._size_hint(name)

    def _start_load(self, name: str, victims: list[str]) -> None:
        task = asyncio.create_task(self._load(name, victims), name=f"adaserve-cache-load-{name}")
        task.add_done_callback(_retrieve)  # waiters may all be gone; the outcome is still logged and counted
        self._loads[name] = task

    async def _wait_for_load(self, name: str) -> None:
        """Wait for the load in flight; cancelling the waiter does not cancel the load others may share."""
        try:
            await asyncio.shield(self._loads[name])
        except ModelTooLargeError:
            raise
        except Exception as exc:
            raise ModelLoadError(f"model '{name}' failed to load: {exc}") from exc

    async def _load(self, name: str, victims: list[str]) -> None:
        counters = self._counters[name]
        try:
            await self._unloaded([name, *victims])
            began = self._clock()
            loaded = await self._load_fn(name)
            seconds = self._clock() - began
            counters.loads += 1
            counters.load_seconds_total += seconds
            host_wait_s = min(loaded.host_wait_s, seconds)  # the engine's clock and this one may differ by a hair
            before = self._resident_now()
            try:
                more = self._core.loaded(name, loaded.size_bytes, seconds, self._clock(), host_wait_s)
            except ModelTooLargeError:
                self._start_unload(name)
                raise
            log.info(
                "model loaded on demand",
                extra={"model": name, "load_s": round(seconds, 3), "size_bytes": loaded.size_bytes},
            )
            why = f"model '{name}' took {mib(loaded.size_bytes)} once loaded, more than estimated"
            self._evicted(more, before, why)
        except BaseException as exc:
            self._core.load_failed(name)
            counters.load_failures += 1
            log.error("model failed to load", extra={"model": name, "error": repr(exc)})
            raise
        finally:
            del self._loads[name]
            self._notify()

    def _resident_now(self) -> dict[str, tuple[int, float | None]]:
        """Each resident model's bytes and eviction rank, taken before an eviction (which forgets them) to log it."""
        policy = self._core.policy
        return {name: (entry.size_bytes, policy.eviction_rank(name)) for name, entry in self._core.residents().items()}

    def _evicted(self, victims: list[str], before: dict[str, tuple[int, float | None]], reason: str) -> None:
        """Count, log (with why, and the victim's bytes and rank as they were) and unload the policy's victims."""
        for victim in victims:
            self._counters.setdefault(victim, ModelCounters()).evictions += 1
            size_bytes, rank = before[victim]
            log.info(
                "model evicted",
                extra={
                    "model": victim,
                    "policy": self._core.policy.name,
                    "reason": reason,
                    "size_bytes": size_bytes,
                    **({"eviction_rank": round(rank, 4)} if rank is not None else {}),
                },
            )
            self._start_unload(victim)

    def _start_unload(self, name: str) -> None:
        previous = self._unloads.get(name)

        async def unload() -> None:
            if previous is not None:
                await previous
            try:
                await self._unload_fn(name)
            except Exception as exc:  # the model is out of the books either way; say so and carry on
                log.error("model failed to unload", extra={"model": name, "error": repr(exc)})
            finally:
                if self._unloads.get(name) is task:
                    del self._unloads[name]

        task = asyncio.create_task(unload(), name=f"adaserve-cache-unload-{name}")
        self._unloads[name] = task

    async def _unloaded(self, names: list[str]) -> None:
        pending = [self._unloads[name] for name in names if name in self._unloads]
        if pending:
            await asyncio.gather(*pending)

    async def _wait_for_room(self, deadline: float, busy: CacheBusyError) -> None:
        remaining = deadline - asyncio.get_running_loop().time()
        if self._change is None:
            self._change = asyncio.get_running_loop().create_future()
        try:
            if remaining <= 0:
                raise TimeoutError
            await asyncio.wait_for(asyncio.shield(self._change), remaining)
        except TimeoutError:
            self._busy_timeouts += 1
            raise CacheBusyError(f"{busy} (waited {self.busy_timeout_s:g} s for a release)") from None

    def _notify(self) -> None:
        if self._change is not None and not self._change.done():
            self._change.set_result(None)
        self._change = None


def _retrieve(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()
