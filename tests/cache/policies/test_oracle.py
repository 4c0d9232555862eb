import math

import pytest

from adaserve.cache.policies import create_policy
from adaserve.cache.stats import StatsRegistry
from adaserve.errors import ConfigError
from tests.cache.factories import driver


def test_evicts_the_farthest_next_use() -> None:
    future = list("ABCDACB")
    cache = driver("oracle", 3, future=future)
    cache.replay("ABC")
    assert cache.request("D") == ["B"]  # next uses: A at 4, C at 5, B at 6
    assert cache.policy.next_use("B") == 6
    assert cache.replay("AC") == []
    assert cache.request("B") == ["D"]  # D is never requested again


def test_models_never_requested_again_go_first() -> None:
    cache = driver("oracle", 2, future=list("ABCA"))
    cache.replay("AB")
    assert cache.policy.next_use("B") == math.inf
    assert cache.request("C") == ["B"]


def test_size_aware_pruning_spares_small_models_that_need_not_go() -> None:
    """Farthest-first alone would evict s1, then s2, then X; X alone frees enough, so only X goes."""
    sizes = {"X": 10, "s1": 1, "s2": 2, "new": 5}
    cache = driver("oracle", 13, sizes=sizes, future=["X", "s1", "s2", "new", "X", "s2", "s1"])
    cache.replay(["X", "s1", "s2"])
    assert cache.request("new") == ["X"]


def test_a_different_sequence_is_refused() -> None:
    cache = driver("oracle", 2, future=list("AB"))
    cache.request("A")
    with pytest.raises(ValueError, match="request 1 is for 'C'"):
        cache.request("C")


def test_needs_the_future() -> None:
    with pytest.raises(ConfigError, match=r"oracle.*future"):
        create_policy("oracle", StatsRegistry(), 10)
