import math

import pytest

from adaserve.cache.stats import StatsRegistry


def test_rate_is_an_exponentially_decaying_count() -> None:
    stats = StatsRegistry(rate_time_constant_s=10.0)
    assert stats.rate("m", 0.0) == 0.0
    assert stats.expected_gap_s("m", 0.0) == math.inf
    stats.record_request("m", 0.0)
    stats.record_request("m", 0.0)
    assert stats.rate("m", 0.0) == pytest.approx(0.2)
    assert stats.rate("m", 10.0) == pytest.approx(0.2 / math.e)  # decays while no request comes
    stats.record_request("m", 10.0)
    assert stats.rate("m", 10.0) == pytest.approx(0.2 / math.e + 0.1)
    assert stats.expected_gap_s("m", 10.0) == pytest.approx(1 / (0.2 / math.e + 0.1))


def test_steady_arrivals_converge_to_their_rate() -> None:
    stats = StatsRegistry(rate_time_constant_s=60.0)
    for i in range(2000):
        stats.record_request("m", i * 0.5)  # 2 requests a second
    assert stats.rate("m", 999.5) == pytest.approx(2.0, rel=0.01)


def test_load_penalty_is_smoothed_and_size_measured() -> None:
    stats = StatsRegistry(penalty_smoothing=0.5)
    assert stats.size_bytes("m") is None and stats.penalty_s("m") == 0.0
    stats.record_load("m", 2.0, 100)
    stats.record_load("m", 4.0, 120)
    record = stats.get("m")
    assert (record.own_load_s, record.size_bytes, record.loads) == (3.0, 120, 2)
    assert stats.penalty_s("m") == 3.0


def test_the_wait_for_a_host_is_pooled_over_every_model_not_charged_to_the_one_that_waited() -> None:
    stats = StatsRegistry(penalty_smoothing=0.5)
    stats.record_load("small", 2.55, 10, host_wait_s=2.5)  # its spare was still starting
    stats.record_load("large", 1.0, 100)  # a ready spare took it
    assert stats.host_wait_s == pytest.approx(1.25)
    assert stats.penalty_s("small") == pytest.approx(0.05 + 1.25)
    assert stats.penalty_s("large") == pytest.approx(1.0 + 1.25)
    assert stats.penalty_s("never loaded") == 0.0


def test_bad_settings_and_measurements_are_refused() -> None:
    with pytest.raises(ValueError, match="rate_time_constant_s"):
        StatsRegistry(rate_time_constant_s=0)
    with pytest.raises(ValueError, match="penalty_smoothing"):
        StatsRegistry(penalty_smoothing=1.5)
    with pytest.raises(ValueError, match="model 'm'"):
        StatsRegistry().record_load("m", -1.0, 10)
    with pytest.raises(ValueError, match="waiting for a host"):
        StatsRegistry().record_load("m", 1.0, 10, host_wait_s=2.0)
