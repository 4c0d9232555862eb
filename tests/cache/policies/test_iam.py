import math

import pytest

from adaserve.cache.policies import IAMPolicy, ImportanceQueue, create_policy
from adaserve.cache.stats import StatsRegistry
from adaserve.errors import ConfigError
from tests.cache.factories import Driver, driver

TAU = 100.0


def _iam(budget: int = 100, **options: float) -> Driver:
    """An IAM cache whose statistics saw a first request TAU s before 0, so `requests` requests at 0 give Δ =
    requests / TAU (they share the gap since)."""
    stats = StatsRegistry()
    stats.record_request("clock start", -TAU)
    return driver("iam", budget, stats=stats, **options)


def _load(cache: Driver, name: str, *, penalty: float, size: int, requests: int, now: float = 0.0) -> None:
    """`requests` requests at `now` (Δ = requests / TAU), then a load taking `penalty` s of `size` bytes."""
    cache.sizes[name], cache.penalties[name] = size, penalty
    for _ in range(requests):
        cache.request(name, now)


def test_utility_and_rank_follow_equations_1_and_2() -> None:
    cache = _iam()
    iam: IAMPolicy = cache.policy
    _load(cache, "A", penalty=2.0, size=1, requests=1)  # u = 2 / 1 · 1/τ
    _load(cache, "B", penalty=1.0, size=1, requests=3)  # u = 1 / 1 · 3/τ
    _load(cache, "C", penalty=8.0, size=4, requests=1)  # u = 8 / 4 · 1/τ: the same as A
    _load(cache, "D", penalty=1.0, size=2, requests=1)  # u = 1 / 2 · 1/τ
    assert iam.utility("A", 0.0) == pytest.approx(2.0 / TAU)
    assert iam.utility("B", 0.0) == pytest.approx(3.0 / TAU)
    assert iam.utility("D", 0.0) == pytest.approx(0.5 / TAU)
    # rank_i = log(#{j != i : u_i > u_j} + b0), b0 = 1
    assert iam.importance("D", 0.0) == pytest.approx(math.log(1))
    assert iam.importance("A", 0.0) == pytest.approx(math.log(2))
    assert iam.importance("C", 0.0) == pytest.approx(math.log(2))
    assert iam.importance("B", 0.0) == pytest.approx(math.log(4))


def test_evicts_in_importance_order_after_a_refresh() -> None:
    cache = _iam(budget=8, refresh_period_s=1.0)
    _load(cache, "B", penalty=1.0, size=1, requests=3)
    _load(cache, "A", penalty=2.0, size=1, requests=1)
    _load(cache, "C", penalty=8.0, size=4, requests=1)
    _load(cache, "D", penalty=1.0, size=2, requests=1)
    # Each entered the queue ranked against the models resident then; at the refresh all are ranked anew.
    iam, resident = cache.policy, {"A", "B", "C", "D"}
    order = [iam.victim(resident, 1, now=1.0) for _ in range(4)]
    assert order == ["D", "A", "C", "B"]  # A and C tie at log 2: A was loaded first


def test_the_least_important_model_is_evicted_at_the_refresh() -> None:
    cache = _iam(budget=3, refresh_period_s=1.0)
    _load(cache, "hot", penalty=1.0, size=1, requests=5)
    _load(cache, "cold", penalty=1.0, size=1, requests=1)
    _load(cache, "mid", penalty=1.0, size=1, requests=2)
    assert cache.request("new", now=2.0) == ["cold"]


def _stale_pair() -> Driver:
    """A loaded alone (rank log 1), then B, less useful than A, also at rank log 1: A's entry is older."""
    cache = _iam(budget=2, refresh_period_s=10.0)
    _load(cache, "A", penalty=1.0, size=1, requests=2, now=0.0)
    _load(cache, "B", penalty=1.0, size=1, requests=1, now=0.0)
    return cache


def test_the_old_queue_serves_evictions_until_the_period_ends() -> None:
    cache = _stale_pair()
    assert cache.request("C", now=5.0) == ["A"]  # the read-only IQ still ranks A with the rank it entered with
    assert cache.policy.refreshes == 0


def test_the_shadow_queue_is_swapped_in_after_the_period() -> None:
    cache = _stale_pair()
    assert cache.request("C", now=10.0) == ["B"]  # rebuilt: u_A > u_B, so A ranks log 2 and B log 1
    assert cache.policy.refreshes == 1


def test_by_default_every_eviction_ranks_the_models_as_they_stand() -> None:
    cache = _iam(budget=2)  # no refresh period: the queue is rebuilt when a victim is asked for
    _load(cache, "A", penalty=1.0, size=1, requests=2, now=0.0)
    _load(cache, "B", penalty=1.0, size=1, requests=1, now=0.0)
    assert cache.request("C", now=5.0) == ["B"]  # the stale queue of the paper's refresh would evict A (above)
    assert cache.policy.refreshes == 1
    assert cache.request("B", now=5.0) == ["C"]  # one request in 105 s against two in 100: C goes before A
    assert cache.policy.refreshes == 2


def test_one_model_that_alone_makes_room_at_less_cost_goes_instead_of_two() -> None:
    """The cost of evicting a model is P_i / T_i = u_i · S_i: here 2.4, 2.5 and 3.9 (over τ) for S1, S2 and L."""
    for refresh, victims in ((None, ["L"]), (1.0, ["S1", "S2"])):  # the paper's queue takes the two least useful
        cache = _iam(budget=7, refresh_period_s=refresh)
        _load(cache, "S1", penalty=2.4, size=2, requests=1)  # u = 1.2 / τ
        _load(cache, "S2", penalty=2.5, size=2, requests=1)  # u = 1.25 / τ
        _load(cache, "L", penalty=3.9, size=3, requests=1)  # u = 1.3 / τ: the most useful per byte
        cache.sizes["new"] = 3
        assert sorted(cache.request("new", now=1.0)) == victims


def test_a_pinned_model_at_the_top_of_the_queue_is_skipped_and_kept() -> None:
    queue = ImportanceQueue([(0.0, "a"), (1.0, "b"), (2.0, "c")])
    assert queue.pop_min({"b", "c"}) == "b"
    assert queue.pop_min({"a", "c"}) == "a"
    queue.set(5.0, "c")  # a new importance replaces the old entry
    queue.set(3.0, "d")
    assert queue.pop_min({"c", "d"}) == "d"
    with pytest.raises(ValueError, match="holds none of"):
        queue.pop_min({"a", "b"})


def test_a_model_without_recent_requests_has_no_utility() -> None:
    iam = IAMPolicy(StatsRegistry(), 10)
    assert iam.utility("never", 0.0) == 0.0


def test_with_foresight_t_is_the_requests_until_the_models_next_one() -> None:
    """Equal penalties and sizes: utility is 1/T. Once the queue is rebuilt, the model requested last goes."""
    cache = driver("iam-foresight", 3, future=list("ABCDACB"), refresh_period_s=1.0)
    cache.replay("ABC")
    iam = cache.policy
    assert [iam.time_to_next(name, 0.0) for name in "ABCD"] == [2, 4, 3, 1]  # A at 4, B at 6, C at 5, D at 3
    assert cache.request("D", now=5.0) == ["B"]
    assert cache.replay("AC", now=5.0) == []
    assert iam.time_to_next("D", 5.0) == math.inf  # never again
    with pytest.raises(ValueError, match="request 6 is for 'A'"):
        cache.request("A", now=5.0)


def test_with_known_rates_t_is_the_windows_length_over_the_models_requests_in_it() -> None:
    """Equal penalties and sizes: utility is 1/T, T the window's 2w+1 requests over the model's requests in it."""
    cache = driver("iam-known-rate", 2, future=list("AAABAAAABB"), window=2)
    cache.replay("AAAB")  # the latest request is index 3, the window indices 1 to 5: A A B A A
    iam = cache.policy
    assert (iam.time_to_next("A", 0.0), iam.time_to_next("B", 0.0)) == (5 / 4, 5 / 1)
    assert iam.time_to_next("C", 0.0) == 10.0  # never requested: one gap the sequence's length
    assert cache.replay("AAAA") == []
    assert iam.time_to_next("A", 0.0) == 5 / 3  # index 7: A A A B B
    assert iam.time_to_next("B", 0.0) == 5 / 2  # B's rate known before its requests come
    with pytest.raises(ConfigError, match="window must be at least 1"):
        create_policy("iam-known-rate", StatsRegistry(), 2, future=["A"], window=0)
