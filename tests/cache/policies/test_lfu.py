from tests.cache.factories import driver


def test_evicts_the_least_frequently_used() -> None:
    cache = driver("lfu", 2)
    cache.replay("AAB")
    assert cache.replay("C") == ["B"]  # A: 2 requests, B: 1
    assert cache.replay("B") == ["C"]  # C: 1, A: 2
    assert cache.replay("AAD") == ["B"]


def test_ties_go_to_the_least_recent() -> None:
    cache = driver("lfu", 2)
    cache.request("A", now=1.0)
    cache.request("B", now=2.0)
    assert cache.request("C", now=3.0) == ["A"]


def test_counts_start_again_after_an_eviction() -> None:
    cache = driver("lfu", 2)
    cache.replay("AAAB")
    cache.core.pin("B")
    assert cache.replay("C") == ["A"]  # A's three requests are forgotten with it
    cache.core.unpin(cache.core.residents()["B"])
    cache.replay("CC")
    assert cache.replay("A") == ["B"]  # A: 1 request now, B: 1 (older), C: 3
