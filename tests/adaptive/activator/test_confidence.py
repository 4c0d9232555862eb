"""KL confidence (0 when the predictions agree), its tables, and the calibration of the threshold."""

from __future__ import annotations

import numpy as np
import pytest

from adaserve.adaptive.activator.artifact import Activator
from adaserve.adaptive.activator.confidence import (
    build_confidence,
    calibrate,
    estimate_distance,
    first_within,
    kl_divergence,
)


def test_kl_is_zero_when_the_predictions_agree_unlike_the_papers_cross_entropy() -> None:
    logits = np.array([[2.0, 0.5, -1.0], [0.1, 0.0, 0.2]])
    assert np.allclose(kl_divergence(logits, logits), 0.0)
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    cross_entropy = -(p * np.log(p)).sum(axis=1)  # the paper's −c at k = 100%: the entropy, not 0
    assert (cross_entropy > 0.1).all()
    assert (kl_divergence(logits, logits[:, ::-1]) > 0).all()


def test_the_built_tables_give_distance_zero_at_k_100(activator: Activator) -> None:
    confidence = activator.confidence
    assert (confidence.values[:, -1] == 0).all() and confidence.global_mean[-1] == 0
    assert (confidence.values >= 0).all()


def test_tables_average_each_bucket_and_estimates_average_the_tables() -> None:
    keys = np.array([[0, 1], [0, 0], [1, 1]])  # 3 inputs, L = 2 tables, K = 1
    distances = np.array([[3.0, 0.0], [1.0, 0.0], [5.0, 0.0]])
    tables = build_confidence(keys, distances, bits=1)
    estimate = np.zeros(2)
    estimate_distance(np.array([0, 1]), tables.bucket_of, tables.values, tables.global_mean, estimate)
    assert estimate.tolist() == [(2.0 + 4.0) / 2, 0.0]  # table 0 bucket 0: mean(3, 1); table 1 bucket 1: mean(3, 5)
    assert first_within(np.array([0.5, 0.2, 0.0]), 0.3) == 1
    assert first_within(np.array([0.5, 0.4, 0.0]), 0.3) == 2


def test_calibration_is_the_accuracy_of_the_aclo_rule_non_increasing_in_the_threshold() -> None:
    estimates = np.array([[0.9, 0.1, 0.0], [0.5, 0.5, 0.0], [0.05, 0.01, 0.0]])
    correct = np.array([[False, True, True], [False, False, True], [True, True, True]])
    calibration = calibrate(estimates, correct, correct[:, -1], z=0.0)
    assert calibration.thresholds[0] == 0.0 and calibration.accuracy[0] == 1.0
    assert (np.diff(calibration.thresholds) > 0).all() and (np.diff(calibration.accuracy) <= 0).all()
    at = {float(t): float(a) for t, a in zip(calibration.thresholds, calibration.accuracy, strict=True)}
    assert at[max(at)] == 1 / 3  # δ = 0.9: every input takes its smallest k, only the easy one is right


def test_calibration_records_a_lower_confidence_bound_of_the_accuracy() -> None:
    """Less the spread of the per-input loss against dense: 0 where no input changes, so δ = 0 keeps dense's."""
    rng = np.random.default_rng(3)
    estimates = np.column_stack([rng.random((400, 2)), np.zeros(400)])
    correct = np.column_stack([rng.random((400, 2)) < 0.8, np.ones(400, np.bool_)])
    mean, bound = (calibrate(estimates, correct, correct[:, -1], z=z) for z in (0.0, 1.645))
    assert bound.accuracy[0] == mean.accuracy[0] == 1.0
    assert (bound.accuracy <= mean.accuracy).all() and (bound.accuracy < mean.accuracy)[1:].any()
    at = {float(t): float(a) for t, a in zip(bound.thresholds, bound.accuracy, strict=True)}
    lost = 1.0 - correct[:, 0]  # the largest δ: every input takes the smallest k
    assert at[max(at)] == pytest.approx(correct[:, 0].mean() - 1.645 * lost.std(ddof=1) / np.sqrt(400))
