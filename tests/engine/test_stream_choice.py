"""The GPU's worker set and MaxInf chosen from hand-written stream profiles shaped like a GPU's (`gpu_like`: flat
in the batch up to a knee, streams overlapping until the SMs are full)."""

from __future__ import annotations

import pytest

from adaserve.engine.stream_choice import choose_streams
from tests.engine.stream_profiles import gpu_like, profile_of


def test_a_loose_target_gets_the_lowest_latency_of_the_saturating_sets() -> None:
    """5 rows/ms is the GPU's best; of the sets that reach it (1×8, 2×4, 3×2, ...), three streams of 2 rows
    overlap into the shortest batches (1.2 ms against 1.6 for one stream of 8)."""
    choice = choose_streams(profile_of(gpu_like), target_ms=100)
    assert (choice.granularities, choice.max_inflight) == ((2, 2, 2), 6)
    assert choice.meets_target and choice.rows_per_s == pytest.approx(5000)
    assert choice.latency_s == pytest.approx(1.2e-3)
    assert choice.reason.startswith("3 stream(s) of batch 2, MaxInf 6: the most rows a second (5000")


def test_a_tight_target_keeps_to_the_batches_that_end_in_time() -> None:
    """2.2 ms at high load leaves 1.1 ms a batch: the 1 ms cells only, of which 1×4, 2×2 and 4×1 compute 4 rows/ms;
    equal latencies, and the fewest streams wins."""
    choice = choose_streams(profile_of(gpu_like), target_ms=2.2)
    assert (choice.granularities, choice.max_inflight, choice.meets_target) == ((4,), 4, True)
    assert choice.rows_per_s == pytest.approx(4000)


def test_a_set_is_judged_by_the_slowest_smaller_batch_it_may_run() -> None:
    """A mix of smaller batches runs at their cells' latencies: one slow cell (1 stream of 2 rows, 5 ms) rules out
    every set of 2 rows or more under a 4 ms target, however fast its own cell."""
    choice = choose_streams(profile_of(lambda s, b: 5.0 if (s, b) == (1, 2) else gpu_like(s, b)), target_ms=4)
    assert choice.granularities == (1, 1, 1, 1) and choice.meets_target


def test_when_nothing_meets_the_target_the_fastest_set_is_chosen_and_said_so() -> None:
    choice = choose_streams(profile_of(gpu_like), target_ms=1.5)
    assert (choice.granularities, choice.max_inflight, choice.meets_target) == ((1,), 1, False)
    assert "no set meets the 1.5 ms target (the fastest batch takes 1.000 ms" in choice.reason


def test_near_equal_throughputs_are_measurement_noise_and_the_shorter_batch_wins() -> None:
    """4 streams of 8 rows measured 3% faster than the GPU's 5 rows/ms (noise): the 3×2 set still wins, its batches
    5× shorter."""
    profile = profile_of(lambda s, b: 6.2 if (s, b) == (4, 8) else gpu_like(s, b))
    choice = choose_streams(profile, target_ms=100)
    assert choice.granularities == (2, 2, 2) and choice.rows_per_s < 32 / 6.2e-3


def test_the_target_must_be_positive() -> None:
    with pytest.raises(ValueError, match="the latency target must be positive, got 0 ms"):
        choose_streams(profile_of(gpu_like), target_ms=0)
