"""The Open Inference Protocol's tensor decoding: values a datatype cannot hold exactly are refused, not converted."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from adaserve.errors import InvalidInputError
from adaserve.server.protocol import array_from_values, check_shape


@pytest.mark.parametrize(
    ("datatype", "values", "expected"),
    [
        ("FP32", [[0, 1.5]], np.array([[0.0, 1.5]], np.float32)),  # JSON may write 0.0 as 0
        ("INT8", [[-128, 127]], np.array([[-128, 127]], np.int8)),
        ("UINT64", [[2**64 - 1, 2**63]], np.array([[2**64 - 1, 2**63]], np.uint64)),
        ("INT64", [[2.0, -3]], np.array([[2, -3]], np.int64)),  # a whole number written with a point
        ("BOOL", [[True, False]], np.array([[True, False]])),
    ],
)
def test_values_become_the_datatype(datatype: str, values: Any, expected: np.ndarray) -> None:
    array = array_from_values("x", datatype, (1, 2), values)
    assert array.dtype == expected.dtype and np.array_equal(array, expected)


def test_no_values_for_an_empty_shape() -> None:
    array = array_from_values("x", "INT32", (0, 3), [])
    assert array.shape == (0, 3) and array.dtype == np.int32


@pytest.mark.parametrize(
    ("datatype", "values", "message"),
    [
        ("FP32", ["1.5", "NaN"], "FP32 data must be fractional numbers, got strings"),
        ("FP32", [None, 1.0], "got nulls or values of mixed types"),
        ("FP32", [True, False], "got booleans"),
        ("INT64", [1.5, 2.0], "INT64 data must be integers, got fractional numbers"),
        ("INT32", [True, False], "got booleans"),
        ("BOOL", [1, 0], "BOOL data must be booleans, got integers"),
        ("INT8", [300, 0], "a value is outside INT8's range -128..127"),
        ("UINT8", [-1, 0], "outside UINT8's range 0..255"),
        ("INT64", [2**63, 2**63], "outside INT64's range"),
        ("UINT64", [2**64 - 1, 0], "lose precision as JSON numbers; send the tensor as binary data"),
        ("UINT64", [2**64, 2**64], "got nulls or values of mixed types"),
        ("FP32", [1e40, 0.0], "a value is outside FP32's range"),
        ("FP16", [70000, 0], "a value is outside FP16's range"),
        ("FP32", [[1.0], [2.0, 3.0]], "data is not a list of FP32 values"),
        ("FP32", [1.0], "1 values for shape [2]"),
    ],
)
def test_values_the_datatype_cannot_hold_are_refused(datatype: str, values: Any, message: str) -> None:
    with pytest.raises(InvalidInputError, match="input 'x'") as raised:
        array_from_values("x", datatype, (2,), values)
    assert message in str(raised.value)


@pytest.mark.parametrize("shape", [[True, 784], [-1, 784], [1.0, 784], "1,784", None])
def test_a_shape_is_non_negative_integers(shape: Any) -> None:
    with pytest.raises(InvalidInputError, match="shape must be a list of non-negative integers"):
        check_shape("x", shape)
