"""LRU, LFU and GDSF as defined (one victim at a time) and in their `-cover` forms (victims as a set)."""

import pytest

from tests.cache.factories import driver

#: A small model (S, 1 byte) ranked first, then a large one (L, 3 bytes) that alone makes room for N (3 bytes), then
#: a third (K) ranked last. Each policy is brought to that ranking its own way.
SIZES = {"S": 1, "L": 3, "K": 1, "N": 3}
PENALTIES = {"S": 1.0, "L": 6.0, "K": 9.0, "N": 1.0}
WARM_UP = {"lru": ["S", "L", "K"], "lfu": ["S", "L", "L", "K", "K", "K"], "gdsf": ["S", "L", "K"]}


@pytest.mark.parametrize("policy", sorted(WARM_UP))
def test_the_plain_form_takes_its_first_ranked_until_the_new_model_fits(policy: str) -> None:
    cache = driver(policy, 5, sizes=SIZES, penalties=PENALTIES)
    cache.replay(WARM_UP[policy])
    assert cache.request("N") == ["S", "L"]
    assert cache.resident() == {"K", "N"}


@pytest.mark.parametrize("policy", sorted(WARM_UP))
def test_the_cover_form_keeps_a_first_ranked_model_the_others_make_room_without(policy: str) -> None:
    cache = driver(f"{policy}-cover", 5, sizes=SIZES, penalties=PENALTIES)
    cache.replay(WARM_UP[policy])
    assert cache.request("N") == ["L"]
    assert cache.resident() == {"S", "K", "N"}


def test_gdsf_cover_raises_its_inflation_to_the_model_it_evicted() -> None:
    cache = driver("gdsf-cover", 5, sizes=SIZES, penalties=PENALTIES)
    cache.replay(WARM_UP["gdsf"])  # H: S 1/1 = 1, L 6/3 = 2, K 9/1 = 9
    cache.request("N")
    assert cache.policy.inflation == 2.0
