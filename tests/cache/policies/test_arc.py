from tests.cache.factories import driver


def test_hand_worked_adaptation_with_unit_sizes() -> None:
    """Megiddo & Modha's ARC with c = 2: a B1 ghost hit grows p, a B2 ghost hit shrinks it."""
    cache = driver("arc", 2)
    arc = cache.policy
    assert cache.replay("AAB") == []  # T2 = [A], T1 = [B]
    assert cache.request("C") == ["B"]  # case IV, |T1| = 1 > p = 0: the LRU of T1 becomes a B1 ghost
    assert (list(arc.t1), list(arc.t2), list(arc.b1), arc.target_t1_bytes) == (["C"], ["A"], ["B"], 0)
    assert cache.request("B") == ["A"]  # case II: p = 0 + max(1, 0/1) = 1; |T1| = 1 = p: the LRU of T2 goes
    assert (list(arc.t1), list(arc.t2), list(arc.b2), arc.target_t1_bytes) == (["C"], ["B"], ["A"], 1)
    assert cache.request("A") == ["C"]  # case III: p = 1 - max(1, 0/1) = 0; |T1| = 1 > 0: C goes to B1
    assert (list(arc.t1), list(arc.t2), list(arc.b1), arc.target_t1_bytes) == ([], ["B", "A"], ["C"], 0)
    assert cache.request("D") == ["B"]  # case IV, T1 empty: the LRU of T2 goes to B2
    assert (list(arc.t1), list(arc.t2), list(arc.b1), list(arc.b2)) == (["D"], ["A"], ["C"], ["B"])


def test_no_ghost_while_t1_fills_the_cache() -> None:
    """Case IV with |T1| = c: the paper deletes the LRU of T1 without keeping a ghost."""
    cache = driver("arc", 2)
    assert cache.replay("ABC") == ["A"]
    assert list(cache.policy.b1) == []


def test_a_hit_promotes_to_t2_and_t2_is_spared_while_t1_is_over_target() -> None:
    cache = driver("arc", 3)
    cache.replay("ABA")
    assert list(cache.policy.t2) == ["A"]
    cache.replay("C")
    assert cache.request("D") == ["B"]  # T1 = [B, C] is over p = 0; A in T2 stays


def test_ghost_hit_moves_p_by_the_models_bytes() -> None:
    cache = driver("arc", 10, sizes={"a": 2, "big": 4, "b": 2, "c": 4})
    cache.replay(["a", "a", "big", "b"])  # T2 = [a], T1 = [big, b]: 8 bytes
    assert cache.request("c") == ["big"]  # |T1| = 6 bytes > p = 0; B1 keeps it: |T1| + |B1| = 10 <= c
    cache.request("big")  # a B1 hit: p grows by 4 bytes · max(1, |B2| / |B1|)
    assert cache.policy.target_t1_bytes == 4


def test_ghosts_are_trimmed_to_the_budget_in_bytes() -> None:
    cache = driver("arc", 10, sizes={"big": 6, "a": 2, "b": 2, "c": 4})
    cache.replay(["big", "a", "b", "c"])  # big goes to B1, but T1 (8 bytes) + B1 (6) > c: the ghost is dropped
    assert list(cache.policy.b1) == []
