"""Arrival schedules are pure and seeded: rates, spacing, bounds and validation, no server."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError
from scipy import stats

from adaserve.bench.schedules import (
    BurstSpec,
    ConstantSpec,
    DiurnalSpec,
    PoissonSpec,
    StepSpec,
    create_schedule,
)


def test_constant_is_evenly_spaced_from_zero() -> None:
    arrivals = create_schedule(ConstantSpec(rate=50)).arrivals(2.0, None)
    assert len(arrivals) == 100
    assert arrivals[0] == 0.0
    np.testing.assert_allclose(np.diff(arrivals), 0.02)


def test_poisson_has_the_rate_and_exponential_gaps() -> None:
    arrivals = create_schedule(PoissonSpec(rate=200, seed=3)).arrivals(60.0, None)
    assert len(arrivals) == pytest.approx(12_000, rel=0.03)
    gaps = np.diff(arrivals)
    assert stats.kstest(gaps, "expon", args=(0, 1 / 200)).pvalue > 0.01
    assert np.all(arrivals < 60.0) and np.all(gaps >= 0)


def test_same_seed_same_arrivals_other_seed_other_arrivals() -> None:
    first = create_schedule(PoissonSpec(rate=100, seed=1)).arrivals(5.0, None)
    again = create_schedule(PoissonSpec(rate=100, seed=1)).arrivals(5.0, None)
    other = create_schedule(PoissonSpec(rate=100, seed=2)).arrivals(5.0, None)
    np.testing.assert_array_equal(first, again)
    assert len(first) != len(other) or not np.array_equal(first, other)


def test_count_bound_without_duration() -> None:
    arrivals = create_schedule(PoissonSpec(rate=100, seed=0)).arrivals(None, 250)
    assert len(arrivals) == 250
    assert arrivals[-1] == pytest.approx(2.5, rel=0.2)


def test_both_bounds_take_the_first_reached() -> None:
    schedule = create_schedule(ConstantSpec(rate=10))
    assert len(schedule.arrivals(10.0, 5)) == 5
    assert len(schedule.arrivals(1.0, 500)) == 10


def test_step_rates_hold_between_changes() -> None:
    schedule = create_schedule(StepSpec(steps=((0, 20), (10, 200), (20, 0)), seed=4))
    arrivals = schedule.arrivals(30.0, None)
    counts = np.histogram(arrivals, bins=[0, 10, 20, 30])[0]
    assert counts[0] == pytest.approx(200, rel=0.2)
    assert counts[1] == pytest.approx(2000, rel=0.1)
    assert counts[2] == 0
    assert schedule.expected(30.0) == pytest.approx(2200)


def test_burst_raises_the_rate_only_inside_bursts() -> None:
    spec = BurstSpec(base_rate=10, burst_rate=500, burst_s=1, every_s=10, first_s=2, seed=5)
    arrivals = create_schedule(spec).arrivals(30.0, None)
    inside = ((arrivals % 10) >= 2) & ((arrivals % 10) < 3)
    assert inside.sum() == pytest.approx(3 * 500, rel=0.1)
    assert (~inside).sum() == pytest.approx(27 * 10, rel=0.25)


def test_burst_counted_before_its_first_burst_and_from_time_zero() -> None:
    late = create_schedule(BurstSpec(base_rate=10, burst_rate=100, burst_s=1, every_s=10, first_s=5))
    assert len(late.arrivals(None, 20)) == 20
    assert late.expected(5.0) == pytest.approx(50)
    at_zero = create_schedule(BurstSpec(base_rate=10, burst_rate=100, burst_s=1, every_s=10))
    assert at_zero.expected(1.0) == pytest.approx(100) and at_zero.expected(2.0) == pytest.approx(110)


def test_diurnal_peaks_mid_period_and_keeps_the_mean() -> None:
    schedule = create_schedule(DiurnalSpec(mean_rate=100, amplitude=0.9, period_s=20, seed=6))
    arrivals = schedule.arrivals(40.0, None)
    assert len(arrivals) == pytest.approx(4000, rel=0.05)
    assert schedule.expected(40.0) == pytest.approx(4000, rel=1e-6)
    trough = np.sum((arrivals % 20) < 2)
    peak = np.sum(np.abs((arrivals % 20) - 10) < 1)
    assert peak > 5 * trough


def test_a_schedule_that_stops_cannot_be_bounded_by_count_alone() -> None:
    schedule = create_schedule(StepSpec(steps=((0, 10), (1, 0))))
    with pytest.raises(ValueError, match="does not reach 100 requests"):
        schedule.arrivals(None, 100)


def test_unbounded_run_is_refused() -> None:
    with pytest.raises(ValueError, match="duration or a request count"):
        create_schedule(ConstantSpec(rate=1)).arrivals(None, None)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (lambda: StepSpec(steps=((1, 10),)), "first step must start at 0"),
        (lambda: StepSpec(steps=((0, 10), (5, 20), (5, 30))), "step times must increase"),
        (lambda: StepSpec(steps=((0, -1),)), "rates must be >= 0"),
        (lambda: BurstSpec(base_rate=1, burst_rate=2, burst_s=5, every_s=5), "must be shorter than every_s"),
        (lambda: PoissonSpec(rate=0), "greater than 0"),
        (lambda: DiurnalSpec(mean_rate=1, period_s=1, amplitude=1.5), "less than or equal to 1"),
    ],
)
def test_bad_specs_say_what_is_wrong(spec: object, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        spec()  # type: ignore[operator]
