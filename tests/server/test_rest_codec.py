"""The REST codec's reading of an inference response (what a DAG query's stage run on another node answers): the
outputs and parameters `encode_response` wrote, whether the outputs went as binary data or as JSON values."""

from __future__ import annotations

import numpy as np
import pytest

from adaserve.server.protocol import InferenceResponse, RequestedOutput, Tensor
from adaserve.server.rest_codec import HEADER_LENGTH, decode_response, encode_response


@pytest.mark.parametrize("binary", [True, False])
def test_a_response_reads_back_as_its_outputs_and_parameters(binary: bool) -> None:
    logits = np.arange(6, dtype=np.float32).reshape(2, 3)
    classes = np.array([[1], [2]], dtype=np.int64)
    response = InferenceResponse(
        model_name="m",
        model_version="1",
        outputs=[Tensor("logits", "FP32", (2, 3), logits), Tensor("classes", "INT64", (2, 1), classes)],
        forms=[RequestedOutput("logits", binary), RequestedOutput("classes", binary)],
        parameters={"exited_rows": 1, "note": "x"},
    )
    body, headers = encode_response(response)
    outputs, parameters = decode_response(body, headers.get(HEADER_LENGTH))
    assert parameters == {"exited_rows": 1, "note": "x"}
    assert list(outputs) == ["logits", "classes"]
    np.testing.assert_array_equal(outputs["logits"], logits)
    np.testing.assert_array_equal(outputs["classes"], classes)
    assert outputs["classes"].dtype == np.int64
