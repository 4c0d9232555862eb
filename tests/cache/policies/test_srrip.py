from tests.cache.factories import driver


def test_hand_worked_rrpv_sequence() -> None:
    """2-bit SRRIP-HP: insert at 2, a hit sets 0, the victim is the first to reach 3 as all age together."""
    cache = driver("srrip", 2)
    cache.replay("ABA")  # A: 0, B: 2
    assert cache.request("C") == ["B"]  # B reaches 3 first; everyone ages by 1: A 1, then C enters at 2
    assert cache.request("D") == ["C"]  # C (2) before A (1); ages by 1: A 2; D enters at 2
    assert cache.request("E") == ["A"]  # A and D tie at 2: the one resident longest goes; D ages to 3
    assert cache.request("F") == ["D"]
    assert cache.policy._rrpv == {"E": 2, "F": 2}


def test_scan_resistant_where_lru_is_not() -> None:
    """A re-referenced model outlives one-off models that LRU would keep instead of it."""
    srrip, lru = driver("srrip", 2), driver("lru", 2)
    for cache in (srrip, lru):
        cache.replay("AA")
        cache.replay(["x1", "x2", "x3"])
    assert "A" in srrip.resident()
    assert "A" not in lru.resident()
