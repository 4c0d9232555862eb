"""Wire encoding: what the generator sends is the Open Inference Protocol's binary form."""

from __future__ import annotations

import msgspec
import numpy as np
from tritonclient.grpc import service_pb2

from adaserve.bench.codec import (
    Tensor,
    decode_grpc_parameters,
    decode_http_error,
    decode_http_parameters,
    encode_grpc,
    encode_http,
)

IMAGE = Tensor("image", "FP32", (1, 4), np.arange(4, dtype=np.float32).reshape(1, 4))


def test_http_body_is_json_header_then_binary_tensor() -> None:
    body, length = encode_http([IMAGE], ["logits"], {"latency_ms": 20})
    header = msgspec.json.decode(body[:length])
    assert header == {
        "inputs": [{"name": "image", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}],
        "outputs": [{"name": "logits", "parameters": {"binary_data": True}}],
        "parameters": {"latency_ms": 20},
    }
    np.testing.assert_array_equal(np.frombuffer(body[length:], np.float32), [0, 1, 2, 3])


def test_grpc_request_carries_raw_contents_and_typed_parameters() -> None:
    request = service_pb2.ModelInferRequest.FromString(
        encode_grpc("mlp", "2", [IMAGE], ["logits"], {"latency_ms": 20, "accuracy": 0.9, "fast": True, "tag": "a"})
    )
    assert (request.model_name, request.model_version) == ("mlp", "2")
    assert [(t.name, t.datatype, list(t.shape)) for t in request.inputs] == [("image", "FP32", [1, 4])]
    assert request.raw_input_contents[0] == IMAGE.data.tobytes()
    assert [o.name for o in request.outputs] == ["logits"]
    assert request.parameters["latency_ms"].int64_param == 20
    assert request.parameters["accuracy"].double_param == 0.9
    assert request.parameters["fast"].bool_param is True
    assert request.parameters["tag"].string_param == "a"


def test_response_parameters_are_read_without_decoding_tensors() -> None:
    head = b'{"model_name":"m","parameters":{"exit_layer":2},"outputs":[]}'
    assert decode_http_parameters(head + b"\x00" * 40, len(head)) == {"exit_layer": 2}
    assert decode_http_parameters(b'{"outputs": []}', None) == {}
    response = service_pb2.ModelInferResponse(model_name="m")
    response.parameters["exit_layer"].int64_param = 3
    assert decode_grpc_parameters(response.SerializeToString()) == {"exit_layer": 3}


def test_error_text_from_json_or_plain_body() -> None:
    assert decode_http_error(b'{"error": "model is busy"}') == "model is busy"
    assert decode_http_error(b"Internal Server Error") == "Internal Server Error"
