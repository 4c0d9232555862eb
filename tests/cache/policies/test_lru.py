from tests.cache.factories import driver


def test_evicts_the_least_recently_used() -> None:
    cache = driver("lru", 3)
    assert cache.replay("ABC") == []
    assert cache.replay("AD") == ["B"]  # A was used again, so B is the oldest
    assert cache.replay("E") == ["C"]
    assert cache.replay("AF") == ["D"]
    assert cache.resident() == {"A", "E", "F"}


def test_a_pinned_model_is_passed_over() -> None:
    cache = driver("lru", 2)
    cache.replay("AB")
    cache.core.pin("A")
    assert cache.replay("C") == ["B"]
