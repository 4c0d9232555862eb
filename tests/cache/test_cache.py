"""ModelCache, driven with events and a fake clock: nothing here sleeps to make something happen."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from adaserve.cache import Loaded, ModelCache, State
from adaserve.errors import CacheBusyError, ModelLoadError, ModelTooLargeError
from tests.cache.factories import FakeClock


@dataclass
class Backend:
    """The router's side: load (returns measured bytes and the wait for a host) and unload, with gates the test
    opens."""

    clock: FakeClock
    sizes: dict[str, int] = field(default_factory=dict)
    load_s: float = 2.0
    host_wait_s: float = 0.0
    loads: list[str] = field(default_factory=list)
    unloads: list[str] = field(default_factory=list)
    gates: dict[str, asyncio.Event] = field(default_factory=dict)
    failures: dict[str, list[BaseException]] = field(default_factory=dict)

    async def load(self, name: str) -> Loaded:
        self.loads.append(name)
        if name in self.gates:
            await self.gates[name].wait()
        self.clock.advance(self.load_s)
        if self.failures.get(name):
            raise self.failures[name].pop(0)
        return Loaded(self.sizes.get(name, 10), self.host_wait_s)

    async def unload(self, name: str) -> None:
        if f"unload {name}" in self.gates:
            await self.gates[f"unload {name}"].wait()
        self.unloads.append(name)

    def gate(self, key: str) -> asyncio.Event:
        return self.gates.setdefault(key, asyncio.Event())


def _cache(backend: Backend, budget: int = 20, **options: Any) -> ModelCache:
    return ModelCache(
        budget,
        options.pop("policy", "lru"),
        backend.load,
        backend.unload,
        size_hint=lambda name: backend.sizes.get(name, 10),
        clock=backend.clock,
        **options,
    )


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), timeout=10))


async def _settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def _use(cache: ModelCache, name: str, hold: asyncio.Event | None = None) -> None:
    async with cache.use(name):
        if hold is not None:
            await hold.wait()


def test_concurrent_requests_share_one_load() -> None:
    async def scenario() -> None:
        backend = Backend(FakeClock())
        cache = _cache(backend)
        gate = backend.gate("a")
        users = [asyncio.create_task(_use(cache, "a")) for _ in range(3)]
        await _settle()
        assert backend.loads == ["a"] and cache.state("a") is State.LOADING
        gate.set()
        await asyncio.gather(*users)
        await _use(cache, "a")
        snapshot = cache.snapshot()
        assert (snapshot.hits, snapshot.misses, snapshot.loads) == (1, 3, 1)
        assert backend.loads == ["a"]

    run(scenario)


def test_a_failed_load_reaches_every_waiter_and_a_later_request_retries() -> None:
    async def scenario() -> None:
        backend = Backend(FakeClock(), failures={"a": [RuntimeError("corrupt archive")]})
        cache = _cache(backend)
        gate = backend.gate("a")
        users = [asyncio.create_task(_use(cache, "a")) for _ in range(2)]
        await _settle()
        gate.set()
        results = await asyncio.gather(*users, return_exceptions=True)
        for error in results:
            assert isinstance(error, ModelLoadError)
            assert str(error) == "model 'a' failed to load: corrupt archive"
            assert isinstance(error.__cause__, RuntimeError)
        assert cache.state("a") is None and cache.snapshot().resident_bytes == 0
        await _use(cache, "a")  # the next request loads it again
        assert backend.loads == ["a", "a"]
        counters = cache.snapshot().models["a"].counters
        assert (counters.loads, counters.load_failures, counters.misses) == (1, 1, 3)

    run(scenario)


def test_a_request_waits_for_a_release_when_every_model_is_busy() -> None:
    async def scenario() -> None:
        backend = Backend(FakeClock())
        cache = _cache(backend, budget=10)
        hold = asyncio.Event()
        holder = asyncio.create_task(_use(cache, "a", hold))
        await _settle()
        waiter = asyncio.create_task(_use(cache, "b"))
        await _settle()
        assert backend.loads == ["a"] and not waiter.done()  # a is pinned: b waits
        hold.set()
        await asyncio.gather(holder, waiter)
        assert backend.loads == ["a", "b"] and backend.unloads == ["a"]
        assert cache.snapshot().models["a"].counters.evictions == 1

    run(scenario)


def test_waiting_for_a_release_times_out_with_a_clear_error() -> None:
    async def scenario() -> None:
        backend = Backend(FakeClock())
        cache = _cache(backend, budget=10, busy_timeout_s=0.01)
        hold = asyncio.Event()
        holder = asyncio.create_task(_use(cache, "a", hold))
        await _settle()
        with pytest.raises(CacheBusyError, match=r"no room for model 'b'.*busy \(in use or loading\): a.*waited"):
            await _use(cache, "b")
        hold.set()
        await holder
        assert cache.snapshot().busy_timeouts == 1

    run(scenario)


def test_a_load_waits_for_the_unloads_that_make_its_room() -> None:
    async def scenario() -> None:
        backend = Backend(FakeClock())
        cache = _cache(backend, budget=10)
        await _use(cache, "a")
        unloading = backend.gate("unload a")
        user = asyncio.create_task(_use(cache, "b"))
        await _settle()
        assert backend.loads == ["a"] and cache.state("a") is None  # a is out of the books, not yet out of memory
        unloading.set()
        await user
        assert backend.unloads == ["a"] and backend.loads == ["a", "b"]

    run(scenario)


def _logged(caplog: pytest.LogCaptureFixture, message: str) -> list[dict[str, Any]]:
    """The `extra` fields of the cache's info records with this message."""
    records = [r for r in caplog.records if r.name == "adaserve.cache" and r.getMessage() == message]
    assert all(r.levelno == logging.INFO for r in records)
    return [{k: v for k, v in vars(r).items() if k in LOGGED} for r in records]


LOGGED = {"model", "reason", "policy", "size_bytes", "estimate_bytes", "evicting", "eviction_rank", "load_s"}


def test_loads_and_evictions_are_logged_with_why(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        backend = Backend(FakeClock())
        cache = _cache(backend, budget=20, policy="iam")
        for name in ("a", "b", "c"):  # c needs the room of one of the others
            await _use(cache, name)

    with caplog.at_level(logging.INFO, "adaserve.cache"):
        run(scenario)
    loading = _logged(caplog, "model loading on demand")
    assert [(e["model"], e["reason"], e["estimate_bytes"]) for e in loading] == [
        (name, "a request found it not resident", 10) for name in "abc"
    ]
    (evicted,) = _logged(caplog, "model evicted")
    assert loading[-1]["evicting"] == [evicted["model"]] and evicted["model"] in ("a", "b")
    assert (evicted["policy"], evicted["reason"], evicted["size_bytes"]) == (
        "iam",
        "to make room for model 'c' (0.0 MiB)",
        10,
    )
    assert isinstance(evicted["eviction_rank"], float)  # IAM's importance, as the queue held it
    loaded = _logged(caplog, "model loaded on demand")
    assert [(e["model"], e["load_s"], e["size_bytes"]) for e in loaded] == [(name, 2.0, 10) for name in "abc"]


def test_a_model_measured_larger_than_its_hint_evicts_more(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        backend = Backend(FakeClock(), sizes={"a": 10, "b": 5})
        cache = ModelCache(20, "lru", backend.load, backend.unload, size_hint=lambda name: 5, clock=backend.clock)
        await _use(cache, "a")  # hinted 5, measured 10
        await _use(cache, "b")
        backend.sizes["c"] = 8
        await _use(cache, "c")  # hinted 5: fits (10 + 5 + 5); measured 8: 23 > 20, so a goes after the load
        assert backend.unloads == ["a"]
        assert cache.snapshot().resident_bytes == 13

    with caplog.at_level(logging.INFO, "adaserve.cache"):
        run(scenario)
    (evicted,) = _logged(caplog, "model evicted")
    assert evicted == {  # LRU keeps no rank to give
        "model": "a",
        "policy": "lru",
        "reason": "model 'c' took 0.0 MiB once loaded, more than estimated",
        "size_bytes": 10,
    }


def test_a_model_larger_than_the_budget_is_refused_before_or_after_loading() -> None:
    async def scenario() -> None:
        backend = Backend(FakeClock(), sizes={"huge": 30})
        cache = _cache(backend, budget=20)
        with pytest.raises(ModelTooLargeError, match="model 'huge' needs"):
            await _use(cache, "huge")
        assert backend.loads == []
        lying = ModelCache(20, "lru", backend.load, backend.unload, size_hint=lambda name: 1, clock=backend.clock)
        with pytest.raises(ModelTooLargeError, match=r"takes .* once loaded"):
            await _use(lying, "huge")
        await _settle()
        assert backend.unloads == ["huge"] and lying.state("huge") is None

    run(scenario)


def test_a_cancelled_waiter_leaves_the_load_to_the_others_and_its_pin_behind() -> None:
    async def scenario() -> None:
        backend = Backend(FakeClock())
        cache = _cache(backend, budget=10)
        gate = backend.gate("a")
        first = asyncio.create_task(_use(cache, "a"))
        second = asyncio.create_task(_use(cache, "a"))
        await _settle()
        first.cancel()
        await _settle()
        gate.set()
        await second
        assert first.cancelled() and backend.loads == ["a"]
        await _use(cache, "b")  # a has no pins left, so it can be evicted
        assert backend.unloads == ["a"]

    run(scenario)


def test_forget_drops_a_model_unloaded_elsewhere() -> None:
    async def scenario() -> None:
        backend = Backend(FakeClock())
        cache = _cache(backend)
        await _use(cache, "a")
        cache.forget("a")
        assert cache.state("a") is None and backend.unloads == []
        await _use(cache, "a")
        assert backend.loads == ["a", "a"]

    run(scenario)


def test_snapshot_counts_loads_time_and_bytes() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        backend = Backend(clock, sizes={"a": 12, "b": 8, "c": 9}, load_s=2.5)
        cache = _cache(backend, budget=20, policy="iam")
        for name in ("a", "a", "b", "c"):
            await _use(cache, name)
            clock.advance(1.0)
        snapshot = cache.snapshot()
        assert (snapshot.policy, snapshot.budget_bytes) == ("iam", 20)
        assert (snapshot.hits, snapshot.misses, snapshot.loads, snapshot.evictions) == (1, 3, 3, 1)
        assert snapshot.load_seconds_total == pytest.approx(7.5)
        evicted = next(name for name, model in snapshot.models.items() if model.state == "UNLOADED")
        kept = {name for name, model in snapshot.models.items() if model.state == "LOADED"}
        assert snapshot.resident_bytes == sum(backend.sizes[name] for name in kept)
        assert snapshot.models[evicted].counters.evictions == 1 and snapshot.models[evicted].resident_bytes == 0
        model = snapshot.models["c"]
        assert (model.resident_bytes, model.counters.load_seconds_total, model.smoothed_load_s) == (9, 2.5, 2.5)

    run(scenario)


def test_a_load_that_waited_for_a_host_counts_the_wait_for_every_model() -> None:
    async def scenario() -> None:
        backend = Backend(FakeClock(), load_s=3.0, host_wait_s=2.5)
        cache = _cache(backend, budget=100, policy="iam")
        await _use(cache, "a")
        backend.load_s, backend.host_wait_s = 1.0, 0.0
        await _use(cache, "b")
        snapshot = cache.snapshot()
        assert snapshot.load_seconds_total == pytest.approx(4.0)  # as the requests waited
        wait = 0.3 * 0.0 + 0.7 * 2.5  # the pooled wait, smoothed as P_i is (the default smoothing, 0.3)
        assert snapshot.models["a"].smoothed_load_s == pytest.approx(0.5 + wait)
        assert snapshot.models["b"].smoothed_load_s == pytest.approx(1.0 + wait)

    run(scenario)
