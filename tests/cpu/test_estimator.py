"""The batch-size estimator with a steered clock: EWMA → power-of-two floor → mode, checked once per timeout."""

from __future__ import annotations

import logging

import pytest

from adaserve.cpu.estimator import (
    ArrivalRate,
    BatchSizeEstimator,
    EstimatorSettings,
    Reconfigurator,
    power_of_two_floor,
)
from adaserve.cpu.optimizer import Optimizer, Plan, Profile


@pytest.mark.parametrize(
    ("value", "expected"), [(0, 1), (0.4, 1), (1, 1), (1.99, 1), (2, 2), (3.9, 2), (4, 4), (63.5, 32), (64, 64)]
)
def test_power_of_two_floor(value: float, expected: int) -> None:
    assert power_of_two_floor(value) == expected


def test_ewma_follows_the_paper_formula() -> None:
    estimator = BatchSizeEstimator(EstimatorSettings(alpha=0.5, window=1), current_batch=1, now=0.0)
    assert estimator.observe(8) == 8  # the first depth seeds the average
    assert estimator.observe(0) == 4  # 0.5·0 + 0.5·8
    assert estimator.ewma == 4.0
    assert estimator.observe(0) == 2
    assert estimator.observe(0) == 1
    assert estimator.observe(100) == 32  # 0.5·100 + 0.5·0.5 = 50.25


def test_estimates_are_capped_before_rounding() -> None:
    estimator = BatchSizeEstimator(EstimatorSettings(alpha=1.0, max_batch=24), current_batch=1, now=0.0)
    assert estimator.observe(1000) == 16


def test_mode_of_the_last_n_estimates_ignores_a_burst() -> None:
    estimator = BatchSizeEstimator(EstimatorSettings(alpha=1.0, window=5), current_batch=8, now=0.0)
    for depth in (8, 8, 8, 64, 8):
        estimator.observe(depth)
    assert estimator.smoothed == 8
    for depth in (64, 64, 64):
        estimator.observe(depth)
    assert list(estimator.estimates) == [64, 8, 64, 64, 64]
    assert estimator.smoothed == 64


def test_a_tie_keeps_the_current_batch_else_takes_the_newest() -> None:
    estimator = BatchSizeEstimator(EstimatorSettings(alpha=1.0, window=4), current_batch=4, now=0.0)
    for depth in (4, 4, 16, 16):
        estimator.observe(depth)
    assert estimator.smoothed == 4
    estimator.current_batch = 2
    assert estimator.smoothed == 16
    assert BatchSizeEstimator(EstimatorSettings(), current_batch=2, now=0.0).smoothed == 2  # nothing observed yet


def should_reconfigure(estimator: BatchSizeEstimator, now: float) -> int | None:
    """B̃ when a check is due and B̃ differs from the configured B; None otherwise (what the Reconfigurator acts on)."""
    smoothed = estimator.due(now)
    return smoothed if smoothed != estimator.current_batch else None


def test_reconfigures_only_after_the_timeout_and_only_on_a_change() -> None:
    settings = EstimatorSettings(alpha=1.0, window=3, reconfigure_timeout_s=10.0)
    estimator = BatchSizeEstimator(settings, current_batch=8, now=100.0)
    for depth in (8, 8, 8):
        estimator.observe(depth)
    assert should_reconfigure(estimator, now=111.0) is None  # same B: nothing to do, timer restarts
    for depth in (16, 16, 16):
        estimator.observe(depth)
    assert should_reconfigure(estimator, now=115.0) is None  # only 4 s since the last check
    assert should_reconfigure(estimator, now=121.0) == 16
    estimator.reconfigured(16, now=121.0)
    assert estimator.current_batch == 16
    assert should_reconfigure(estimator, now=131.0) is None


def test_an_overloaded_set_is_replaced_before_the_timeout() -> None:
    """B̃ four times B is acted on 2 s after the last check; twice B waits out the timeout; with the rule off (0),
    so does four times B."""
    settings = EstimatorSettings(alpha=1.0, window=3, reconfigure_timeout_s=10.0)
    estimator = BatchSizeEstimator(settings, current_batch=8, now=100.0)
    for depth in (32, 32, 32):
        estimator.observe(depth)
    assert estimator.overloaded
    assert should_reconfigure(estimator, now=101.5) is None  # not 2 s yet
    assert should_reconfigure(estimator, now=102.0) == 32
    estimator.reconfigured(32, now=102.0)
    for depth in (64, 64, 64):
        estimator.observe(depth)
    assert not estimator.overloaded and should_reconfigure(estimator, now=105.0) is None
    paper = BatchSizeEstimator(EstimatorSettings(alpha=1.0, window=3, overload_factor=0), current_batch=8, now=100.0)
    for depth in (32, 32, 32):
        paper.observe(depth)
    assert should_reconfigure(paper, now=109.0) is None
    assert should_reconfigure(paper, now=110.0) == 32


def test_reconfigurator_asks_the_optimizer_for_the_smoothed_batch() -> None:
    profile = Profile({(t, b): b / t**0.5 for t in (1, 2) for b in (1, 2, 4, 8)})
    optimizer = Optimizer(profile)
    asked: list[int] = []

    def plan_for(batch: int) -> Plan:
        asked.append(batch)
        return optimizer.plan(2, batch)

    settings = EstimatorSettings(alpha=0.5, window=4, reconfigure_timeout_s=5.0, overload_factor=0)
    reconfigurator = Reconfigurator(BatchSizeEstimator(settings, current_batch=1, now=0.0), plan_for)
    depths = [1] * 5 + [9] * 15
    plans = [reconfigurator.update(depth, 100 * second, float(second)) for second, depth in enumerate(depths)]
    changes = [(second, plan.batch) for second, plan in enumerate(plans) if plan is not None]
    assert changes == [(10, 8)]
    assert asked == [8]
    assert reconfigurator.estimator.current_batch == 8


def test_the_arrival_rate_is_counted_over_the_window() -> None:
    rate = ArrivalRate(window_s=10.0)
    assert rate.observe(0, now=0.0) is None
    assert rate.observe(100, now=1.0) == 100.0
    for second in range(2, 12):
        rate.observe(100 * second, now=float(second))  # 100 rows/s for 11 s
    assert rate.observe(1110, now=12.0) == (1110 - 200) / 10  # over 2..12 s, the last second at 10 rows/s
    assert rate.observe(1110, now=25.0) == 0.0  # nothing arrived for more than a window


def test_a_smaller_set_that_cannot_keep_up_is_not_taken() -> None:
    """B̃ falls from 8 to 2 on a shallow queue; at 100 rows/s the B=2 set (planned 40 rows/s) and the B=4 set
    (80 rows/s) cannot keep up with 1.5× headroom, so the set stays; at 10 rows/s B=2 is taken."""
    latency_s = {1: 0.025, 2: 0.05, 4: 0.05, 8: 0.05}  # B=2: 40 rows/s, B=4: 80, B=8: 160

    def run(rows_per_second: int) -> list[tuple[int, int]]:
        settings = EstimatorSettings(alpha=1.0, window=1, reconfigure_timeout_s=5.0, capacity_headroom=1.5)
        reconfigurator = Reconfigurator(
            BatchSizeEstimator(settings, current_batch=8, now=0.0), lambda b: b, lambda b: b / latency_s[b]
        )
        plans = [reconfigurator.update(2, rows_per_second * second, float(second)) for second in range(12)]
        return [(second, plan) for second, plan in enumerate(plans) if plan is not None]

    assert run(100) == []
    assert run(50) == [(5, 4)]  # B=2 plans 40 < 75 rows/s, B=4 plans 80 ≥ 75
    assert run(10) == [(5, 2)]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"alpha": 0},
        {"alpha": 1.5},
        {"window": 0},
        {"reconfigure_timeout_s": -1},
        {"max_batch": 0},
        {"capacity_headroom": -1},
        {"overload_factor": 1},
        {"overload_after_s": -1},
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        EstimatorSettings(**kwargs)  # type: ignore[arg-type]


def held_or_taken(
    rows_per_s: dict[int, float], current: int, wanted_depth: int, arrival_rows_per_s: int
) -> tuple[int | None, int]:
    """The set a Reconfigurator on `current` takes when B̃ moves to `wanted_depth` under a steady arrival rate,
    and the B it is left configured for; the plans are their batch sizes, planning `rows_per_s[B]`."""
    settings = EstimatorSettings(alpha=1.0, window=1, reconfigure_timeout_s=5.0, capacity_headroom=1.5)
    reconfigurator = Reconfigurator(
        BatchSizeEstimator(settings, current_batch=current, now=0.0), lambda b: b, rows_per_s.get, model="m"
    )
    plans = [reconfigurator.update(wanted_depth, arrival_rows_per_s * s, float(s)) for s in range(6)]
    taken = [plan for plan in plans if plan is not None]
    return (taken[0] if taken else None), reconfigurator.estimator.current_batch


def test_a_larger_set_below_the_arrival_rate_and_the_current_set_is_not_taken(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A noisy profile can plan a larger B slower than the current one: at 100 rows/s the B=16 set (90 rows/s)
    keeps up less than the B=8 set (120 rows/s), so the B=8 set stays, and the log says why."""
    with caplog.at_level(logging.INFO, logger="adaserve.packrat"):
        assert held_or_taken({8: 120.0, 16: 90.0}, current=8, wanted_depth=16, arrival_rows_per_s=100) == (None, 8)
    (record,) = caplog.records
    assert record.levelno == logging.INFO and record.model == "m"  # type: ignore[attr-defined]
    assert record.getMessage() == (
        "keeping the worker set for B=8 (120.0 rows/s planned) rather than B=16 (90.0 rows/s): a set must plan "
        "1.5 × the 100.0 rows/s arriving, or more than the current set"
    )


def test_a_larger_set_below_the_floor_is_taken_when_it_beats_the_current_set() -> None:
    assert held_or_taken({8: 80.0, 16: 120.0}, current=8, wanted_depth=16, arrival_rows_per_s=100) == (16, 16)
    assert held_or_taken({8: 80.0, 16: 200.0}, current=8, wanted_depth=16, arrival_rows_per_s=100) == (16, 16)


def test_a_smaller_set_held_back_by_the_floor_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="adaserve.packrat"):
        assert held_or_taken({2: 40.0, 4: 80.0, 8: 160.0}, current=8, wanted_depth=2, arrival_rows_per_s=100) == (
            None,
            8,
        )
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "keeping the worker set for B=8 (160.0 rows/s planned) rather than B=2 (40.0 rows/s)"
    ]


def steps(reconfigurator: Reconfigurator[int], phases: list[tuple[int, float, int]]) -> list[tuple[int, int]]:
    """Drive `reconfigurator` a second at a time through (queue depth, arrival rows/s, seconds) phases; the
    (second, B) of each set it takes."""
    taken, arrived, second = [], 0.0, 0
    for depth, rows_per_s, seconds in phases:
        for _ in range(seconds):
            second += 1
            arrived += rows_per_s
            plan = reconfigurator.update(depth, int(arrived), float(second))
            if plan is not None:
                taken.append((second, plan))
    return taken


def test_a_set_left_for_a_larger_one_is_not_returned_to_at_that_load(caplog: pytest.LogCaptureFixture) -> None:
    """The profile plans the B=8 set 200 rows/s, enough for 1.5 × 100; but at 100 rows/s its queue outgrew it and B
    went to 16. When the B=16 set's shallower queue asks for 8 again at that rate, the B=8 set counts as taking the
    100 rows/s it was left at, below the floor: B stays 16. At 50 rows/s it is taken."""
    settings = EstimatorSettings(alpha=1.0, window=1, reconfigure_timeout_s=5.0, capacity_headroom=1.5)
    planned = {8: 200.0, 16: 300.0}
    reconfigurator = Reconfigurator(BatchSizeEstimator(settings, current_batch=8, now=0.0), lambda b: b, planned.get)
    with caplog.at_level(logging.INFO, logger="adaserve.packrat"):
        taken = steps(reconfigurator, [(16, 100, 5), (8, 100, 20), (8, 50, 20)])
    assert taken == [(5, 16), (30, 8)]
    held = caplog.records[0].getMessage()
    assert held.startswith("keeping the worker set for B=16 (300.0 rows/s planned) rather than B=8 (200.0 rows/s, left")
    assert ", left at 100.0)" in held
    assert reconfigurator.limits == {8: 100.0}
    assert reconfigurator.capacity(8, 8) == 100.0 and reconfigurator.capacity(16, 16) == 300.0


def test_a_set_seen_keeping_up_at_its_limit_loses_it() -> None:
    """Left at 100 rows/s, the B=8 set is taken again at 50; when its queue then stays within B at 120 rows/s, it
    keeps up after all: the limit is forgotten and the B=8 set counts as its plan's 200 rows/s again."""
    settings = EstimatorSettings(alpha=1.0, window=1, reconfigure_timeout_s=5.0, capacity_headroom=1.5)
    reconfigurator = Reconfigurator(
        BatchSizeEstimator(settings, current_batch=8, now=0.0), lambda b: b, {8: 200.0, 16: 300.0}.get
    )
    assert steps(reconfigurator, [(16, 100, 5), (8, 50, 20), (8, 120, 5)]) == [(5, 16), (10, 8)]
    assert reconfigurator.limits == {}
    assert reconfigurator.capacity(8, 8) == 200.0
