"""Triton's classification extension: an output asked for with `{"classification": k}` is answered as each row's
k highest classes, "value:index" or "value:index:label" strings (BYTES), highest first, in Triton's format (the
value as C's `%f`), so tritonclient's image client reads them as it reads Triton's."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from adaserve.config import TensorSpec
from adaserve.errors import InvalidInputError


def check_classifiable(spec: TensorSpec, where: str) -> None:
    """InvalidInputError unless the output has one dimension of classes a row (others of size 1), as Triton asks."""
    if sum(size > 1 for size in spec.shape[1:]) > 1:
        raise InvalidInputError(
            f"{where}: classification needs one dimension of classes a row; the output's shape is {list(spec.shape)}"
        )


def top_classes(scores: np.ndarray, count: int, labels: Sequence[str] = ()) -> np.ndarray:
    """Each row's `count` highest classes (all of them when it has fewer), highest first and ties by index, as an
    object array of bytes shaped (rows, min(count, classes))."""
    rows = scores.reshape(scores.shape[0], -1)
    count = min(count, rows.shape[1])
    order = np.argsort(-rows.astype(np.float64), axis=1, kind="stable")[:, :count]
    result = np.empty(order.shape, dtype=object)
    for r, row in enumerate(order):
        for c, index in enumerate(row):
            label = f":{labels[index]}" if index < len(labels) else ""
            result[r, c] = f"{float(rows[r, index]):f}:{index}{label}".encode()
    return result
