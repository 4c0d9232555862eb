"""Seeded fuzzing of both frontends (and KServe's V1 bodies) on the session server: mutated requests get an answer
that names a client error (never a 500 / INTERNAL / UNKNOWN), nothing is logged as an error, and the server still
answers correctly after.

The mutations are those of the ad hoc fuzzers that found the faults these tests now guard (a 500 on deeply nested
JSON, a HEAD answered with a body, an INTERNAL on an over-long model name): values of the wrong type or range for
every field of a request, shapes that overflow, contents that do not match, parameters of every kind."""

from __future__ import annotations

import copy
import gzip
import json
import random
import socket
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.server.reference import reference_outputs
from tests.server.test_http_protocol import connect, post, read_head, read_response
from tests.server_utils import ServerHandle

CASES = 600
MODELS = {"mlp": [784], "cnn": [1, 28, 28], "mlp_torchscript": [784]}
CLIENT_ERRORS_HTTP = {200, 400, 404, 405, 413, 503}
CLIENT_ERRORS_GRPC = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
ODD_VALUES: list[Any] = [
    None, True, -1, 0, 2**63, 1e308, "", "x" * 300, [], {}, [[]], [-1], [0, 784], [2**40, 784], [2**31, 2**31, 4],
    [1.5, 784], ["1", "784"], "FP32", "BYTES", "FP16", {"a": 1}, [[[[[[1]]]]]],
]  # fmt: skip
ODD_NAMES = ["", "nope", "m" * 3000, "mlp/..", "logits"]


def _mutate(value: Any, rng: random.Random) -> Any:
    """Replace, drop or add one field somewhere in a JSON document."""
    if isinstance(value, dict) and value:
        key = rng.choice(sorted(value))
        roll = rng.random()
        if roll < 0.25:
            del value[key]
        elif roll < 0.6:
            value[key] = copy.deepcopy(rng.choice(ODD_VALUES))
        elif roll < 0.7:
            value[f"extra{rng.randint(0, 9)}"] = copy.deepcopy(rng.choice(ODD_VALUES))
        else:
            _mutate(value[key], rng)
    elif isinstance(value, list) and value:
        index = rng.randrange(len(value))
        if rng.random() < 0.4:
            value[index] = copy.deepcopy(rng.choice(ODD_VALUES))
        else:
            _mutate(value[index], rng)
    return value


def _json_request(rng: random.Random) -> tuple[str, bytes]:
    model = rng.choice([*MODELS, rng.choice(ODD_NAMES)])
    rows = rng.choice([1, 2, 17])
    shape = [rows, *MODELS.get(model, [784])]
    document: dict[str, Any] = {
        "inputs": [{"name": "image", "shape": shape, "datatype": "FP32", "data": [0.5] * int(np.prod(shape))}],
        "parameters": {rng.choice(["timeout", "priority", "accuracy", "early_exit", "x"]): rng.choice(ODD_VALUES)},
        "outputs": [{"name": rng.choice(["logits", "nope"]), "parameters": {"binary_data": rng.choice(ODD_VALUES)}}],
    }
    for _ in range(rng.randint(1, 4)):
        _mutate(document, rng)
    return f"/v2/models/{model}/infer", json.dumps(document).encode()


def test_mutated_rest_requests_get_client_errors_and_the_server_keeps_serving(server: ServerHandle) -> None:
    rng = random.Random(0)
    statuses: set[int] = set()
    unexpected = _unexpected_errors(server)
    with connect(server) as sock:
        buffer = bytearray()
        for _ in range(CASES):
            path, body = _json_request(rng)
            method = rng.choice(["POST"] * 9 + ["HEAD"])
            sock.sendall(post(path, body).replace(b"POST", method.encode(), 1))
            status, _, answer = read_response(sock, buffer) if method == "POST" else _head(sock, buffer)
            statuses.add(status)
            assert status in CLIENT_ERRORS_HTTP, (path, body[:300], answer[:300])
            if status != 200 and method == "POST":
                assert json.loads(answer)["error"], answer
    assert {200, 400} <= statuses  # the mutations reach both outcomes
    _still_serves(server, unexpected)


def _v1_request(rng: random.Random) -> tuple[str, bytes, str]:
    """A KServe V1 predict body, mutated, sometimes gzipped (and then sometimes cut short or mislabelled)."""
    model = rng.choice([*MODELS, rng.choice(ODD_NAMES)])
    rows = [np.full(MODELS.get(model, [784]), 0.5).tolist()] * rng.choice([1, 2, 17])
    document: dict[str, Any] = rng.choice(
        [{"instances": rows}, {"instances": [{"image": row} for row in rows]}, {"inputs": {"image": rows}}]
    )
    document[rng.choice(["parameters", "signature_name"])] = copy.deepcopy(rng.choice(ODD_VALUES))
    for _ in range(rng.randint(0, 3)):
        _mutate(document, rng)
    body, coding = json.dumps(document).encode(), ""
    if rng.random() < 0.3:
        body, coding = gzip.compress(body), rng.choice(["gzip", "gzip", "deflate", "br"])
        body = body[: rng.randrange(len(body))] if rng.random() < 0.3 else body
    return f"/v1/models/{model}:predict", body, coding


def test_mutated_kserve_v1_requests_get_client_errors_and_the_server_keeps_serving(server: ServerHandle) -> None:
    rng = random.Random(0)
    statuses: set[int] = set()
    unexpected = _unexpected_errors(server)
    with connect(server) as sock:
        buffer = bytearray()
        for _ in range(CASES // 2):
            path, body, coding = _v1_request(rng)
            sock.sendall(post(path, body, f"Content-Encoding: {coding}\r\n" if coding else ""))
            status, _, answer = read_response(sock, buffer)
            statuses.add(status)
            assert status in CLIENT_ERRORS_HTTP | {415}, (path, body[:300], answer[:300])
            if status != 200:
                assert json.loads(answer)["error"], answer
    assert {200, 400} <= statuses
    _still_serves(server, unexpected)


def _head(sock: socket.socket, buffer: bytearray) -> tuple[int, dict[str, str], bytes]:
    status, headers = read_head(sock, buffer)
    return status, headers, b""


def _grpc_request(rng: random.Random) -> Any:
    model = rng.choice([*MODELS, rng.choice(ODD_NAMES)])
    rows = rng.choice([1, 2, 16])
    shape = [rows, *MODELS.get(model, [784])]
    request = service_pb2.ModelInferRequest(model_name=model, model_version=rng.choice(["", "", "1", "2", "x"]))
    tensor = request.inputs.add(name=rng.choice(["image"] * 4 + ODD_NAMES), datatype="FP32", shape=shape)
    request.raw_input_contents.append(np.zeros(shape, np.float32).tobytes())
    for _ in range(rng.randint(1, 3)):
        roll = rng.randrange(7)
        if roll == 0:
            del tensor.shape[:]
            tensor.shape.extend(rng.choice([[], [-1, 784], [0, 784], [2**40, 784], [2**62, 4], [17, 784]]))
        elif roll == 1:
            tensor.datatype = rng.choice(["", "BYTES", "BOOL", "FP16", "INT64", "X" * 100])
        elif roll == 2:
            request.raw_input_contents[0] = request.raw_input_contents[0][: rng.randrange(8)]
        elif roll == 3:
            tensor.contents.fp32_contents.extend([0.5] * rng.choice([1, 784]))
        elif roll == 4:
            parameter = request.parameters[rng.choice(["timeout", "priority", "accuracy", "sequence_id", "x"])]
            kind = rng.choice(["bool_param", "int64_param", "string_param", "double_param", "uint64_param"])
            setattr(parameter, kind, {"bool_param": True, "string_param": "x", "double_param": -1.0}.get(kind, 2**62))
        elif roll == 5:
            request.outputs.add(name=rng.choice(["logits", "nope"])).parameters["classification"].int64_param = 3
        else:
            request.raw_input_contents.append(b"xx")
    return request


def test_mutated_grpc_requests_get_client_errors_and_the_server_keeps_serving(server: ServerHandle) -> None:
    rng = random.Random(0)
    codes = set()
    unexpected = _unexpected_errors(server)
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for _ in range(CASES):
            request = _grpc_request(rng)
            try:
                stub.ModelInfer(request, timeout=60)
                code = grpc.StatusCode.OK
            except grpc.RpcError as exc:
                code = exc.code()
                assert code in CLIENT_ERRORS_GRPC, (str(request)[:300], exc.details())
            codes.add(code)
    assert {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT} <= codes
    _still_serves(server, unexpected)


def _unexpected_errors(server: ServerHandle) -> list[str]:
    """The server's log lines of errors it did not expect (the session's other tests cause expected ones)."""
    lines = server.log.read_text().splitlines()
    return [
        line for line in lines if '"level": "error"' in line and ("unexpected" in line.lower() or "Traceback" in line)
    ]


def _still_serves(server: ServerHandle, unexpected_before: list[str]) -> None:
    x = np.random.default_rng(1).random((3, 784), dtype=np.float32)
    with connect(server) as sock:
        body = json.dumps(
            {"inputs": [{"name": "image", "shape": [3, 784], "datatype": "FP32", "data": x.ravel().tolist()}]}
        )
        sock.sendall(post("/v2/models/mlp/infer", body.encode()))
        status, _, answer = read_response(sock, bytearray())
    assert status == 200
    logits = np.array(json.loads(answer)["outputs"][0]["data"], dtype=np.float32).reshape(3, 10)
    np.testing.assert_allclose(logits, reference_outputs("mlp", x), rtol=1e-4, atol=1e-4)
    assert _unexpected_errors(server) == unexpected_before
