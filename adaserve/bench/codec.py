"""Open Inference Protocol wire formats for the load generator: requests are encoded once, before the run.

Encoding every payload ahead of time keeps the generator's CPU cost per request to sending bytes and reading the
response's parameters; tensors always travel as binary (HTTP's binary tensor extension, gRPC's raw contents).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from adaserve.server.protocol import Tensor
from adaserve.server.protos import grpc_service_pb2 as service_pb2

#: HTTP header that gives the JSON part's length in a binary-tensor body (Triton's binary data extension).
HEADER_LENGTH = "Inference-Header-Content-Length"


@dataclass(frozen=True)
class TensorMeta:
    """A tensor as model metadata describes it: `{"name", "datatype", "shape"}`, -1 for variable dimensions."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ModelInfo:
    """`GET /v2/models/{name}`: `{"name", "versions", "platform", "inputs": [...], "outputs": [...]}`."""

    name: str
    inputs: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta, ...]


@dataclass(frozen=True)
class Payload:
    """One request as it goes on the wire: a whole HTTP/1.1 request, or a serialized `ModelInferRequest`."""

    model: str
    body: bytes


def encode_http(tensors: Sequence[Tensor], outputs: Sequence[str], parameters: Mapping[str, Any]) -> tuple[bytes, int]:
    """The body and its JSON header's length:
    `{"inputs": [{"name", "shape", "datatype", "parameters": {"binary_data_size"}}], "outputs", "parameters"}`
    followed by the tensors' bytes."""
    blobs = [np.ascontiguousarray(t.data).tobytes() for t in tensors]
    header: dict[str, Any] = {
        "inputs": [
            {
                "name": t.name,
                "shape": list(t.shape),
                "datatype": t.datatype,
                "parameters": {"binary_data_size": len(blob)},
            }
            for t, blob in zip(tensors, blobs, strict=True)
        ],
        "outputs": [{"name": name, "parameters": {"binary_data": True}} for name in outputs],
    }
    if parameters:
        header["parameters"] = dict(parameters)
    head = msgspec.json.encode(header)
    return head + b"".join(blobs), len(head)


def encode_grpc(
    model: str, version: str, tensors: Sequence[Tensor], outputs: Sequence[str], parameters: Mapping[str, Any]
) -> bytes:
    """A serialized `inference.ModelInferRequest` with `raw_input_contents`."""
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    for tensor in tensors:
        request.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        request.raw_input_contents.append(np.ascontiguousarray(tensor.data).tobytes())
    for name in outputs:
        request.outputs.add(name=name)
    for key, value in parameters.items():
        _set_parameter(request.parameters[key], value)
    return request.SerializeToString()


def decode_http_parameters(body: bytes, header_length: int | None) -> dict[str, Any]:
    """The `parameters` of an HTTP inference response; the tensors are not decoded."""
    head = body[:header_length] if header_length is not None else body
    parsed = msgspec.json.decode(head)
    found = parsed.get("parameters") if isinstance(parsed, dict) else None
    return dict(found) if isinstance(found, dict) else {}


def decode_http_error(body: bytes) -> str:
    """The text of `{"error": "..."}`, or the body itself when the server sent something else."""
    try:
        parsed = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return body[:500].decode(errors="replace").strip()
    if isinstance(parsed, dict) and "error" in parsed:
        return str(parsed["error"])
    return str(parsed)[:500]


def decode_grpc_parameters(body: bytes) -> dict[str, Any]:
    """The `parameters` map of a serialized `inference.ModelInferResponse`, as plain values."""
    response = service_pb2.ModelInferResponse.FromString(body)
    return {key: _get_parameter(value) for key, value in response.parameters.items()}


def model_info_from_json(data: Mapping[str, Any]) -> ModelInfo:
    """Model metadata from the REST `GET /v2/models/{name}` response."""
    return ModelInfo(
        name=str(data["name"]),
        inputs=tuple(_tensor_meta(t) for t in data.get("inputs", [])),
        outputs=tuple(_tensor_meta(t) for t in data.get("outputs", [])),
    )


def model_info_from_grpc(response: service_pb2.ModelMetadataResponse) -> ModelInfo:
    """Model metadata from the gRPC `ModelMetadata` response."""
    return ModelInfo(
        name=response.name,
        inputs=tuple(TensorMeta(t.name, t.datatype, tuple(t.shape)) for t in response.inputs),
        outputs=tuple(TensorMeta(t.name, t.datatype, tuple(t.shape)) for t in response.outputs),
    )


def _tensor_meta(data: Mapping[str, Any]) -> TensorMeta:
    return TensorMeta(str(data["name"]), str(data["datatype"]), tuple(int(d) for d in data["shape"]))


def _set_parameter(target: service_pb2.InferParameter, value: Any) -> None:
    if isinstance(value, bool):
        target.bool_param = value
    elif isinstance(value, int):
        target.int64_param = value
    elif isinstance(value, float):
        target.double_param = value
    else:
        target.string_param = str(value)


def _get_parameter(parameter: service_pb2.InferParameter) -> Any:
    choice = parameter.WhichOneof("parameter_choice")
    return getattr(parameter, choice) if choice else None
