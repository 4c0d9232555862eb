import pytest

from adaserve.cache.policies import create_policy
from adaserve.cache.residency import Residency, State
from adaserve.cache.stats import StatsRegistry
from adaserve.errors import CacheBusyError, ModelTooLargeError


def _core(budget: int = 10, policy: str = "lru") -> Residency:
    return Residency(budget, create_policy(policy, StatsRegistry(), budget))


def _resident(core: Residency, name: str, size: int, now: float = 0.0) -> list[str]:
    core.request(name, now)
    victims = core.admit(name, size, now)
    core.loaded(name, size, 1.0, now)
    return victims


def test_evicts_by_the_policy_until_the_model_fits() -> None:
    core = _core(10)
    for name in "abcd":
        _resident(core, name, 2)
    assert core.used_bytes == 8
    assert _resident(core, "big", 7) == ["a", "b", "c"]  # 2 free + 3 × 2 ≥ 7; LRU order
    assert core.used_bytes == 9
    assert set(core.residents()) == {"d", "big"}


def test_never_evicts_a_pinned_or_loading_model() -> None:
    core = _core(6)
    _resident(core, "a", 2)
    _resident(core, "b", 2)
    core.request("c", 0.0)
    core.admit("c", 2, 0.0)  # still loading
    pin = core.pin("a")  # a request in flight
    assert core.admit("d", 2, 0.0) == ["b"]  # a is least recent, but pinned; c is loading
    assert core.state("c") is State.LOADING
    with pytest.raises(CacheBusyError, match=r"no room for model 'e'.*busy \(in use or loading\): a, c, d"):
        core.admit("e", 2, 0.0)
    assert set(core.residents()) == {"a", "c", "d"}  # a refused admission evicts nothing
    core.loaded("d", 2, 1.0, 0.0)
    assert core.unpin(pin) is True
    assert core.admit("e", 2, 0.0) == ["a"]


def test_a_model_larger_than_the_budget_is_refused() -> None:
    core = _core(10)
    _resident(core, "a", 4)
    with pytest.raises(ModelTooLargeError, match=r"model 'huge' needs 0.0 MiB but the whole model-memory budget"):
        core.admit("huge", 11, 0.0)
    assert set(core.residents()) == {"a"}


def test_a_model_larger_than_its_estimate_evicts_more_after_its_load() -> None:
    core = _core(10)
    _resident(core, "a", 3)
    _resident(core, "b", 3)
    core.request("c", 0.0)
    assert core.admit("c", 2, 0.0) == []  # 8 of 10
    pin = core.pin("c")
    assert core.loaded("c", 6, 1.0, 0.0) == ["a"]  # 12 > 10: the LRU goes
    assert core.used_bytes == 9
    assert core.stats.size_bytes("c") == 6  # the next estimate is the measured size
    core.unpin(pin)


def test_over_budget_until_the_next_admission_when_nothing_can_go() -> None:
    core = _core(10)
    _resident(core, "a", 4)
    pin = core.pin("a")
    core.request("b", 0.0)
    core.admit("b", 4, 0.0)
    core.pin("b")
    assert core.loaded("b", 8, 1.0, 0.0) == []  # a is pinned: 12 of 10 for now
    assert core.used_bytes == 12
    core.unpin(pin)
    assert _resident(core, "c", 1) == ["a"]  # frees the overshoot and the newcomer's byte


def test_loaded_larger_than_the_whole_budget_is_dropped() -> None:
    core = _core(10)
    core.request("a", 0.0)
    core.admit("a", 2, 0.0)
    with pytest.raises(ModelTooLargeError, match=r"takes 0\.0 MiB once loaded"):
        core.loaded("a", 11, 1.0, 0.0)
    assert core.state("a") is None


def test_a_failed_load_releases_its_reservation() -> None:
    core = _core(10)
    core.request("a", 0.0)
    core.admit("a", 6, 0.0)
    core.load_failed("a")
    assert core.state("a") is None and core.used_bytes == 0


def test_a_stale_pin_does_not_release_a_newer_entry() -> None:
    core = _core(10)
    _resident(core, "a", 2)
    old = core.pin("a")
    assert core.remove("a", 0.0) is True  # unloaded outside the cache while in use
    _resident(core, "a", 2)
    new = core.pin("a")
    assert core.unpin(old) is False
    assert new.pins == 1


def test_request_records_stats_and_reports_the_state() -> None:
    core = _core(10)
    assert core.request("a", 1.0) is None
    core.admit("a", 2, 1.0)
    assert core.request("a", 2.0) is State.LOADING
    core.loaded("a", 2, 0.5, 3.0)
    assert core.request("a", 4.0) is State.LOADED
    stats = core.stats.get("a")
    assert (stats.requests, stats.loads, core.stats.penalty_s("a")) == (3, 1, 0.5)


def test_the_policy_must_be_made_for_the_same_budget() -> None:
    with pytest.raises(ValueError, match="made for 5 bytes, the cache has 10"):
        Residency(10, create_policy("lru", StatsRegistry(), 5))
