import math

import numpy as np
import pytest

from adaserve.cache.stats import StatsRegistry


def test_t_is_the_smoothed_gap_until_a_longer_silence_counts_against_the_model() -> None:
    stats = StatsRegistry(gap_smoothing=0.5)
    assert stats.rate("m", 0.0) == 0.0
    assert stats.expected_gap_s("m", 0.0) == math.inf
    stats.record_request("m", 0.0)  # the registry's first request: no gap known yet
    assert stats.expected_gap_s("m", 3.0) == 3.0  # the silence so far
    stats.record_request("m", 10.0)
    stats.record_request("m", 14.0)
    assert stats.get("m").mean_gap_s == pytest.approx(0.5 * 4 + 0.5 * 10)
    assert stats.expected_gap_s("m", 15.0) == pytest.approx(7.0)
    assert stats.expected_gap_s("m", 114.0) == pytest.approx(100.0)  # silent for 100 s: Δ is 1/100, not 1/7
    assert stats.rate("m", 114.0) == pytest.approx(0.01)


def test_a_model_s_first_request_counts_the_time_since_the_registry_s_first() -> None:
    stats = StatsRegistry()
    stats.record_request("early", 0.0)
    stats.record_request("late", 3600.0)
    assert stats.get("late").mean_gap_s == 3600.0


def test_requests_at_one_instant_share_the_gap_before_them() -> None:
    """A controller that reports per-second counts must give the rate of the same requests spread over the second."""
    counted, spread = StatsRegistry(), StatsRegistry()
    for second in range(1, 200):
        for k in range(10):
            counted.record_request("m", float(second))
            spread.record_request("m", second - 1 + (k + 1) / 10)
    assert counted.rate("m", 199.0) == pytest.approx(10.0)
    assert spread.rate("m", 199.0) == pytest.approx(10.0)


def test_dense_poisson_arrivals_give_close_to_their_rate() -> None:
    """Azure-like density (one request every ~80 s): the estimate just after each request, averaged, is the rate."""
    rng = np.random.default_rng(0)
    stats, rate, now, seen = StatsRegistry(), 1 / 80, 0.0, []
    for _ in range(5000):
        now += rng.exponential(1 / rate)
        stats.record_request("m", now)
        seen.append(stats.rate("m", now))
    assert float(np.median(seen[100:])) == pytest.approx(rate, rel=0.15)


def test_sparse_arrivals_hours_apart_keep_a_finite_sensible_t() -> None:
    """Requests every ~3 h: T stays of the order of the gaps, not decayed to nothing, and grows through a silence."""
    rng = np.random.default_rng(1)
    stats, now = StatsRegistry(), 0.0
    stats.record_request("other", 0.0)
    gaps = rng.exponential(3 * 3600, size=6)
    for gap in gaps:
        now += float(gap)
        stats.record_request("m", now)
    expected = stats.expected_gap_s("m", now)
    assert math.isfinite(expected) and gaps.min() <= expected <= gaps.max()
    assert stats.expected_gap_s("m", now + 10 * 3600) == pytest.approx(10 * 3600)


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
    with pytest.raises(ValueError, match="gap_smoothing"):
        StatsRegistry(gap_smoothing=0)
    with pytest.raises(ValueError, match="penalty_smoothing"):
        StatsRegistry(penalty_smoothing=1.5)
    with pytest.raises(ValueError, match="model 'm'"):
        StatsRegistry().record_load("m", -1.0, 10)
    with pytest.raises(ValueError, match="waiting for a host"):
        StatsRegistry().record_load("m", 1.0, 10, host_wait_s=2.0)
