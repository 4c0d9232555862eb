"""ACLO and LCAO on hand-made tables, the latency profile, and validation of the targets."""

from __future__ import annotations

import numpy as np
import pytest

from adaserve.adaptive.activator.latency import InterferenceProbe, LatencyProfile
from adaserve.adaptive.activator.select import (
    ARRIVED_NS,
    Target,
    aclo_threshold,
    lcao_index,
    parse_target,
    prepare_parameters,
)
from adaserve.errors import InvalidInputError


def test_targets_are_read_from_the_parameters() -> None:
    assert parse_target({}) is None
    assert parse_target({"priority": 1}) is None
    assert parse_target({"accuracy": 0.9}) == Target("aclo", 0.9)
    assert parse_target({"accuracy": 1}) == Target("aclo", 1.0)
    assert parse_target({"latency_ms": 5}) == Target("lcao", 5.0)
    assert parse_target({"latency_ms": 5, "accuracy": 0.8}) == Target("aclo", 0.8)


@pytest.mark.parametrize(
    ("parameters", "named"),
    [
        ({"accuracy": 0}, "accuracy"),
        ({"accuracy": 1.01}, "accuracy"),
        ({"accuracy": -0.5}, "accuracy"),
        ({"accuracy": "high"}, "accuracy"),
        ({"accuracy": True}, "accuracy"),
        ({"latency_ms": 0}, "latency_ms"),
        ({"latency_ms": -3}, "latency_ms"),
        ({"latency_ms": float("nan")}, "latency_ms"),
        ({"latency_ms": float("inf")}, "latency_ms"),
    ],
)
def test_a_target_out_of_range_is_a_400_naming_the_parameter(parameters: dict[str, object], named: str) -> None:
    with pytest.raises(InvalidInputError, match=f"parameter '{named}'") as caught:
        parse_target(parameters)
    assert caught.value.http_status == 400


def test_only_a_latency_target_carries_its_arrival_time() -> None:
    assert prepare_parameters({"accuracy": 0.9}) == {"accuracy": 0.9}
    assert prepare_parameters({"x": 1}) == {"x": 1}
    prepared = prepare_parameters({"latency_ms": 2})
    assert isinstance(prepared[ARRIVED_NS], int) and prepared["latency_ms"] == 2


def test_aclo_takes_the_largest_threshold_whose_calibrated_accuracy_meets_the_target() -> None:
    thresholds = np.array([0.0, 0.01, 0.05, 0.2])
    accuracy = np.array([0.90, 0.89, 0.85, 0.70])
    assert aclo_threshold(thresholds, accuracy, 0.88) == 0.01
    assert aclo_threshold(thresholds, accuracy, 0.85) == 0.05
    assert aclo_threshold(thresholds, accuracy, 0.5) == 0.2
    assert aclo_threshold(thresholds, accuracy, 0.95) == 0.0  # unreachable: k = 100%


def test_lcao_takes_the_largest_k_that_fits_what_is_left_of_the_budget() -> None:
    latency = [0.1, 0.2, 0.4, 0.8]
    assert lcao_index(latency, 0.5) == 2
    assert lcao_index(latency, 10.0) == 3
    assert lcao_index(latency, 0.05) == 0  # nothing fits: the fastest
    assert lcao_index([0.3, 0.2, 0.2], 0.05) == 2  # a small model, where hashing makes small k no faster
    spiky = [0.1, 5.0, 0.3, 0.8]  # a noisy spike at one k does not rule out the k above it
    assert lcao_index(spiky, 0.5) == 2


def test_the_profile_is_interpolated_in_beta_and_held_beyond_its_last_level() -> None:
    t = np.array([[1.0, 2.0], [3.0, 6.0]])
    profile = LatencyProfile(busy=np.array([0, 1]), cpu_p99_ms=t, wall_p50_ms=t, wall_p99_ms=t, cpu_model="x")
    assert profile.at(0) == [1.0, 2.0]
    assert profile.at(0.5) == [2.0, 4.0]
    assert profile.at(7) == [3.0, 6.0]


def test_the_probe_sees_a_busy_process_beside_it() -> None:
    import multiprocessing
    import time

    probe = InterferenceProbe(interval_s=0.05, alpha=0.5)
    probe.start()
    spinner = multiprocessing.get_context("fork").Process(target=_spin, args=(1.5,), daemon=True)
    spinner.start()
    try:
        time.sleep(1.0)
        assert probe.busy > 0.5
    finally:
        spinner.terminate()
        spinner.join()
        probe.stop()


def _spin(seconds: float) -> None:
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
