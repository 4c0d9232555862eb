"""Learn then Test's pieces: the levels tuned for, the exact binomial p-value, and the fixed-sequence test."""

from __future__ import annotations

import pytest
from scipy.stats import binom

from adaserve.adaptive.gati.certify import accepted, levels, p_value, split


def test_levels_run_from_no_error_to_half_again_the_allowed_error() -> None:
    found = levels(0.99)
    assert found[0] == 1.0 and found[-1] == pytest.approx(0.985)
    assert found == sorted(found, reverse=True) and len(found) == 13
    assert min(levels(0.99, floor=0.99)) == pytest.approx(0.99)


def test_split_alternates_rows() -> None:
    tune, check = split(7)
    assert tune.tolist() == [0, 2, 4, 6] and check.tolist() == [1, 3, 5]


def test_p_value_is_the_exact_binomial_tail() -> None:
    assert p_value(0, 300, 0.99) == pytest.approx(0.99**300)  # 0.049: 300 clean rows certify .99 at 0.05
    assert p_value(3, 500, 0.99) == pytest.approx(binom.cdf(3, 500, 0.01))


def test_fixed_sequence_testing_stops_at_the_first_failure() -> None:
    # 500 rows at .99: up to 1 disagreement has p ≤ 0.04; 2 has p = 0.12.
    assert accepted([0, 1, 2, 0], 500, 0.99) == 2  # the fourth would pass alone, but testing stopped at the third
    assert accepted([2, 0], 500, 0.99) == 0
    assert accepted([2, 0], 500, 0.99, risk=0.2) == 2
    with pytest.raises(ValueError, match="risk must be in"):
        accepted([0], 500, 0.99, risk=0.0)
