import pytest

from tests.cache.factories import driver


def test_hand_worked_priorities() -> None:
    """H = L + F · cost / size; the smallest H goes and L becomes it."""
    cache = driver("gdsf", 3, sizes={"X": 1, "Y": 2, "Z": 1}, penalties={"X": 4.0, "Y": 2.0, "Z": 1.0})
    cache.replay("XY")  # H: X 0 + 4/1 = 4, Y 0 + 2/2 = 1
    assert cache.request("Z") == ["Y"]  # L = 1; Z: 1 + 1/1 = 2
    assert cache.policy.inflation == 1.0
    assert cache.request("Y") == ["Z"]  # L = 2; Y: 2 + 2/2 = 3
    assert cache.request("X") == []  # hit: X: 2 + 2 · 4/1 = 10
    assert cache.request("Z") == ["Y"]  # L = 3; Z: 3 + 1 = 4
    assert cache.policy.inflation == 3.0
    assert cache.policy._priority["X"][0] == pytest.approx(10.0)
    assert cache.policy._priority["Z"][0] == pytest.approx(4.0)


def test_prefers_to_keep_costly_small_models() -> None:
    cache = driver("gdsf", 4, sizes={"cheap": 2, "costly": 2, "new": 2}, penalties={"cheap": 0.1, "costly": 5.0})
    cache.replay(["costly", "cheap"])
    assert cache.request("new") == ["cheap"]
