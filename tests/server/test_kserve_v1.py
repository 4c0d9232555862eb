"""KServe's V1 protocol (TensorFlow Serving's REST predict API) beside the Open Inference Protocol: the row and
columnar forms, model listing and readiness, and bad bodies refused by name."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import numpy as np
import pytest

from adaserve.errors import InvalidInputError
from adaserve.server.kserve_v1 import decode_predict, encode_predict
from adaserve.server.protocol import InferenceResponse, RequestedOutput, Tensor
from tests.server.reference import reference_outputs
from tests.server_utils import ServerHandle


def call(server: ServerHandle, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://{server.http_url}{path}", data=data, method="GET" if data is None else "POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def images(rows: int, shape: tuple[int, ...] = (784,)) -> np.ndarray:
    return np.random.default_rng(rows).random((rows, *shape), dtype=np.float32)


def test_models_are_listed_and_ready(server: ServerHandle) -> None:
    status, listing = call(server, "/v1/models")
    assert status == 200 and {"mlp", "cnn", "mlp_torchscript"} <= set(listing["models"])
    assert call(server, "/v2/models") == (200, listing)  # KServe's servers list them under both
    assert call(server, "/v1/models/mlp") == (200, {"name": "mlp", "ready": True})
    status, answer = call(server, "/v1/models/nope")
    assert status == 404 and "unknown model 'nope'" in answer["error"]
    status, answer = call(server, "/v1/models/broken")  # its artifact cannot load
    assert status == 503 and "broken" in answer["error"]
    status, answer = call(server, "/v1/models/mlp:predict")  # a GET of the predict route, not a model's readiness
    assert status == 405 and answer["error"] == "method GET is not allowed here: /v1/models/mlp:predict"


@pytest.mark.parametrize("model", ["mlp", "cnn"])
@pytest.mark.parametrize("named", [False, True])
def test_row_form_answers_a_prediction_per_instance(server: ServerHandle, model: str, named: bool) -> None:
    shape = (784,) if model == "mlp" else (1, 28, 28)
    array = images(3, shape)
    input_name = "image"
    instances = [{input_name: row} for row in array.tolist()] if named else array.tolist()
    status, answer = call(server, f"/v1/models/{model}:predict", {"instances": instances})
    assert status == 200 and set(answer) == {"predictions"}
    np.testing.assert_allclose(answer["predictions"], reference_outputs(model, array), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("named", [False, True])
def test_columnar_form_answers_in_columns(server: ServerHandle, named: bool) -> None:
    array = images(2)
    inputs = {"image": array.tolist()} if named else array.tolist()
    status, answer = call(server, "/v1/models/mlp/versions/1:predict", {"inputs": inputs})
    assert status == 200 and set(answer) == {"outputs"}
    np.testing.assert_allclose(answer["outputs"], reference_outputs("mlp", array), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("path", "body", "status", "words"),
    [
        ("/v1/models/nope:predict", {"instances": [[0.0]]}, 404, "unknown model 'nope'"),
        ("/v1/models/mlp/versions/7:predict", {"instances": [[0.0] * 784]}, 404, "unknown version '7'"),
        ("/v1/models/mlp:predict", [1, 2], 400, "must be a JSON object with 'instances' or 'inputs'"),
        ("/v1/models/mlp:predict", {"instance": [[0.0]]}, 400, "unknown key(s) ['instance']"),
        ("/v1/models/mlp:predict", {"instances": [], "inputs": []}, 400, "exactly one of 'instances'"),
        ("/v1/models/mlp:predict", {"instances": []}, 400, "'instances' must be a non-empty list"),
        ("/v1/models/mlp:predict", {"instances": [[0.0] * 784, [0.0]]}, 400, "rows are not all the same shape"),
        ("/v1/models/mlp:predict", {"instances": [[0.0] * 3]}, 400, "shape [1, 3] does not match"),
        ("/v1/models/mlp:predict", {"instances": [["a"] * 784]}, 400, "FP32 data must be fractional numbers"),
        ("/v1/models/mlp:predict", {"instances": [{"x": [0.0] * 784}]}, 400, "names inputs ['x']; the model takes"),
        ("/v1/models/mlp:predict", {"inputs": 0.5}, 400, "a single value, not a batch of rows"),
        ("/v1/models/mlp:predict", {"inputs": {"x": [[0.0]]}}, 400, "'inputs' names ['x']"),
        ("/v1/models/mlp:predict", {"instances": [[0.0] * 784], "signature_name": "other"}, 400, "one signature"),
        ("/v1/models/mlp:predict", {"instances": [[0.0] * 784], "parameters": [1]}, 400, "must be an object"),
        (
            "/v1/models/mlp:predict",
            {"instances": [[0.0] * 784], "parameters": {"binary_data_output": True}},
            400,
            "the V1 protocol answers in JSON",
        ),
        ("/v1/models/mlp:predict", {"instances": [[0.0] * 784] * 17}, 400, "batch size 17 is outside 1..16"),
    ],
)
def test_bad_predict_bodies_are_refused_by_name(
    server: ServerHandle, path: str, body: Any, status: int, words: str
) -> None:
    answer_status, answer = call(server, path, body)
    assert answer_status == status and words in answer["error"], answer
    assert call(server, "/v1/models/mlp:predict", {"instances": [[0.0] * 784]})[0] == 200


# -- several inputs and outputs: the codec alone ---------------------------------------------------------------------
METADATA = {
    "inputs": [{"name": "a", "datatype": "FP32", "shape": [-1, 2]}, {"name": "b", "datatype": "INT64", "shape": [-1]}],
    "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}, {"name": "z", "datatype": "INT64", "shape": [-1]}],
}


def test_rows_of_a_model_with_several_inputs_name_them() -> None:
    document = {"instances": [{"a": [1.0, 2.0], "b": 3}, {"b": 4, "a": [5.0, 6.0]}], "parameters": {"priority": 1}}
    request, columnar = decode_predict("m", "", document, METADATA)
    assert not columnar and request.parameters == {"priority": 1}
    a, b = request.inputs
    assert (a.name, a.datatype, a.shape, b.name, b.datatype, b.shape) == ("a", "FP32", (2, 2), "b", "INT64", (2,))
    np.testing.assert_array_equal(a.data, [[1.0, 2.0], [5.0, 6.0]])
    assert a.data.dtype == np.float32 and b.data.dtype == np.int64 and b.data.tolist() == [3, 4]
    for bad, words in [
        ({"instances": [[1.0, 2.0]]}, "every instance must be an object naming its inputs ['a', 'b']"),
        ({"instances": [{"a": [1.0, 2.0]}]}, "'instances'[0] names inputs ['a']"),
        ({"instances": [{"a": [1.0, 2.0], "b": 2.5}]}, "INT64 data must be integers"),
        ({"inputs": [[1.0, 2.0]]}, "'inputs' must be an object naming the model's inputs ['a', 'b']"),
    ]:
        with pytest.raises(InvalidInputError, match=words.replace("[", r"\[").replace("(", r"\(")):
            decode_predict("m", "", bad, METADATA)


def test_several_outputs_answer_an_object_per_row_or_per_column() -> None:
    y = Tensor("y", "FP32", (2, 2), np.array([[1.0, 2.0], [3.0, 4.0]], np.float32))
    z = Tensor("z", "INT64", (2,), np.array([7, 8]))
    response = InferenceResponse("m", "1", [y, z], [RequestedOutput("y"), RequestedOutput("z")], parameters={"e": 1})
    assert encode_predict(response, columnar=False) == {
        "predictions": [{"y": [1.0, 2.0], "z": 7}, {"y": [3.0, 4.0], "z": 8}],
        "parameters": {"e": 1},
    }
    assert encode_predict(response, columnar=True) == {
        "outputs": {"y": [[1.0, 2.0], [3.0, 4.0]], "z": [7, 8]},
        "parameters": {"e": 1},
    }
