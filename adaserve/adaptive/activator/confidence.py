"""Confidence tables (SLO-NNs §3.2): the estimated distance between the full and the top-k% prediction, per bucket.

The paper's confidence is c(k, x) = −cross-entropy(ŷ, ŷ_k). That is not 0 when the two predictions agree: at
k = 100% it equals −entropy(ŷ), so an uncertain input never reaches a threshold near 0 and a prototype left about
55% of inputs at k = 100%. Here c(k, x) = −KL(softmax ŷ ‖ softmax ŷ_k): the same cross-entropy minus the entropy
of ŷ, so it is exactly 0 when ŷ_k = ŷ (at k = 100% in particular) and grows as the sparse prediction moves away.
Tables store the distance d = −c (smaller is better); ĉ(k, x) is the mean over the L buckets x hashes to (each
bucket's value is the mean over the training inputs that fell in it, the paper's aggregation).

Calibration: on held-out data, the ACLO rule "smallest k with d̂(k, x) ≤ δ" is applied for a sweep of thresholds
δ, and the accuracy a_δ of the resulting predictions is recorded; an accuracy target then maps to the largest δ
whose accuracy (made non-increasing in δ, so a larger δ never claims more) meets it. a_δ is a one-sided 95% lower
confidence bound, not the held-out mean: the mean less 1.645 standard errors of the per-input loss against the
dense prediction (paired, so inputs both get right or wrong add nothing). A mean alone meets a target on the
held-out inputs and misses it on new ones about half the time: the threshold calibrated for 0.3% loss on the wide
MLP lost 0.44% on the evaluation inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit


@dataclass(frozen=True)
class ConfidenceTables:
    """Mean distance d(k, x) over the k grid, per bucket of the first hidden layer's L FreeHash tables."""

    bucket_of: np.ndarray  # int32 (L, 2^K): row of `values`, -1 for a bucket no input reached
    values: np.ndarray  # float32 (rows, k grid): mean KL per bucket; the last column (k = 100%) is 0
    global_mean: np.ndarray  # float32 (k grid,): the mean over all inputs, for unseen buckets


@dataclass(frozen=True)
class Calibration:
    """Accuracy a_δ on held-out data of the ACLO rule at each threshold δ (ascending; accuracy non-increasing)."""

    thresholds: np.ndarray  # float64
    accuracy: np.ndarray  # float64
    dense_accuracy: float  # of the full model on the same held-out inputs
    samples: int


def kl_divergence(full_logits: np.ndarray, sparse_logits: np.ndarray) -> np.ndarray:
    """KL(softmax(full) ‖ softmax(sparse)) per row; 0 exactly when the rows are equal."""
    p_log = _log_softmax(full_logits.astype(np.float64))
    q_log = _log_softmax(sparse_logits.astype(np.float64))
    return np.maximum(np.sum(np.exp(p_log) * (p_log - q_log), axis=1), 0.0)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def build_confidence(keys: np.ndarray, distances: np.ndarray, bits: int) -> ConfidenceTables:
    """Per table and bucket, the mean of `distances` (inputs × k grid) over the inputs whose `keys` (inputs × L)
    fall in it."""
    tables = keys.shape[1]
    bucket_of = np.full((tables, 1 << bits), -1, np.int32)
    rows: list[np.ndarray] = []
    for t in range(tables):
        order = np.argsort(keys[:, t], kind="stable")
        present, starts, counts = np.unique(keys[order, t], return_index=True, return_counts=True)
        means = np.add.reduceat(distances[order], starts, axis=0) / counts[:, None]
        bucket_of[t, present] = np.arange(len(rows), len(rows) + len(present))
        rows.extend(means)
    return ConfidenceTables(
        bucket_of=bucket_of,
        values=np.asarray(rows, np.float32).reshape(len(rows), distances.shape[1]),
        global_mean=distances.mean(axis=0).astype(np.float32),
    )


@njit(cache=True)
def estimate_distance(
    keys: np.ndarray, bucket_of: np.ndarray, values: np.ndarray, global_mean: np.ndarray, out: np.ndarray
) -> None:
    """d̂(k, x) for every k of the grid: the mean of the L buckets' values (the global mean for an unseen one)."""
    out[:] = 0.0
    for t in range(keys.shape[0]):
        row = bucket_of[t, keys[t]]
        if row >= 0:
            out += values[row]
        else:
            out += global_mean
    out /= keys.shape[0]


@njit(cache=True)
def first_within(estimate: np.ndarray, threshold: float) -> int:
    """ACLO's choice: the smallest grid index whose estimated distance is at most the threshold (the last, k =
    100%, always is: its distance is 0)."""
    for index in range(estimate.shape[0]):
        if estimate[index] <= threshold:
            return index
    return estimate.shape[0] - 1


#: z of the calibration's one-sided bound: a target holds with about 95% confidence on inputs like the held-out ones.
CONFIDENCE_Z = 1.645


def calibrate(
    estimates: np.ndarray, correct: np.ndarray, dense_correct: np.ndarray, points: int = 256, z: float = CONFIDENCE_Z
) -> Calibration:
    """a_δ for thresholds δ spanning the estimates: `estimates` and `correct` are (inputs × k grid); `z` = 0
    records the held-out mean itself."""
    positive = estimates[estimates > 0]
    candidates = np.unique(np.quantile(positive, np.linspace(0, 1, points))) if positive.size else np.zeros(0)
    thresholds = np.concatenate([[0.0], candidates])
    # The first k within δ is the first k where the running minimum of the estimate is within δ.
    running_min = np.minimum.accumulate(estimates, axis=1)
    chosen = (running_min[:, None, :] > thresholds[None, :, None]).sum(axis=2)  # inputs × thresholds
    chosen = np.minimum(chosen, estimates.shape[1] - 1)
    right = np.take_along_axis(correct, chosen, axis=1)
    lost = dense_correct[:, None].astype(np.float64) - right  # per input: 1 lost, -1 gained against dense
    spread = lost.std(axis=0, ddof=1) if len(lost) > 1 else np.zeros(lost.shape[1])
    accuracy = right.mean(axis=0) - z * spread / np.sqrt(len(lost))
    return Calibration(
        thresholds=thresholds,
        accuracy=np.minimum.accumulate(accuracy),
        dense_accuracy=float(dense_correct.mean()),
        samples=len(estimates),
    )
