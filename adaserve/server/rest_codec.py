"""REST wire format of inference: JSON tensors and the binary tensor data extension, both directions.

Binary extension: the body is a JSON header of `Inference-Header-Content-Length` bytes followed by the raw
tensors in input order; an input carrying `"parameters": {"binary_data_size": N}` takes the next N bytes. An
output is sent the same way when it asks for `"binary_data": true` (or the request for `"binary_data_output"`).
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from adaserve.config import Interface
from adaserve.errors import InvalidInputError
from adaserve.server.protocol import (
    InferenceRequest,
    InferenceResponse,
    RequestedOutput,
    Tensor,
    array_from_buffer,
    array_from_values,
    check_input,
    check_shape,
    class_count,
    refuse_shared_memory,
    refuse_unsupported,
    shared_memory_ref,
    tensor_bytes,
)
from adaserve.server.shared_memory import SharedMemoryRegions

HEADER_LENGTH = "inference-header-content-length"
#: The binary data extension's switches.
BOOLEAN_PARAMETERS = frozenset({"binary_data", "binary_data_output"})
_json = msgspec.json.Decoder()
_encode = msgspec.json.Encoder().encode


def decode_request(
    config: Interface, version: str, body: bytes, header_length: str | None, regions: SharedMemoryRegions
) -> InferenceRequest:
    """A request for the model (or DAG query) `config` describes, each input checked against it before its data
    is converted."""
    header, binary = _split(body, header_length)
    document = decode_json(header)
    if not isinstance(document, dict):
        raise InvalidInputError("request body must be a JSON object with an 'inputs' list")
    return _request(config, version, document, binary, regions)


def decode_response(body: bytes, header_length: str | None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """An inference response another server sent (a DAG query's stage run on another node): its outputs by name,
    and its `parameters`. `{"model_name", "outputs": [{"name", "datatype", "shape", "data" or "parameters":
    {"binary_data_size"}}], "parameters"}`."""
    header, binary = _split(body, header_length)
    document = decode_json(header)
    raw_outputs = document.get("outputs") if isinstance(document, dict) else None
    if not isinstance(raw_outputs, list):
        raise InvalidInputError("response must be a JSON object with an 'outputs' list")
    outputs, offset = {}, 0
    for raw in raw_outputs:
        name, datatype, shape = _described(raw, "output")
        tensor, used = _tensor(name, datatype, shape, raw, _object(raw.get("parameters")), binary[offset:])
        outputs[name] = tensor.data
        offset += used
    return outputs, _object(document.get("parameters"))


def _object(raw: Any) -> dict[str, Any]:
    """A response's `parameters` as they came (a server's answer is not checked as a client's request is)."""
    return dict(raw) if isinstance(raw, dict) else {}


def _split(body: bytes, header_length: str | None) -> tuple[bytes, memoryview]:
    """A body's JSON part and its binary tensors (the binary data extension)."""
    if header_length is None:
        return body, memoryview(b"")
    try:
        size = int(header_length)
    except ValueError:
        raise InvalidInputError(f"Inference-Header-Content-Length is not an integer: {header_length!r}") from None
    if not 0 <= size <= len(body):
        raise InvalidInputError(f"Inference-Header-Content-Length {size} is outside the body of {len(body)} bytes")
    return body[:size], memoryview(body)[size:]


def _request(
    config: Interface, version: str, document: dict[str, Any], binary: memoryview, regions: SharedMemoryRegions
) -> InferenceRequest:
    raw_inputs = document.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InvalidInputError("request must have a non-empty 'inputs' list")
    inputs, offset = [], 0
    for raw in raw_inputs:
        tensor, used = _input(config, raw, binary[offset:], regions)
        inputs.append(tensor)
        offset += used
    if offset != len(binary):
        raise InvalidInputError(f"{len(binary) - offset} bytes of binary data are not claimed by any input")
    parameters = checked_parameters(document.get("parameters"), "request")
    refuse_shared_memory("request", parameters)
    outputs = None
    if "outputs" in document:
        raw_outputs = document["outputs"]
        if not isinstance(raw_outputs, list):
            raise InvalidInputError("'outputs' must be a list")
        outputs = [_requested_output(raw) for raw in raw_outputs]
    request_id = document.get("id", "")
    return InferenceRequest(
        model_name=config.name,
        model_version=version,
        inputs=inputs,
        outputs=outputs,
        id=request_id if isinstance(request_id, str) else str(request_id),
        parameters={k: v for k, v in parameters.items() if k != "binary_data_output"},
        binary_outputs=parameters.get("binary_data_output", False),
    )


def _input(config: Interface, raw: Any, binary: memoryview, regions: SharedMemoryRegions) -> tuple[Tensor, int]:
    name, datatype, shape = _described(raw, "input")
    check_input(config, name, datatype, shape)
    parameters = checked_parameters(raw.get("parameters"), f"input '{name}'")
    placed = shared_memory_ref(f"input '{name}'", parameters)
    if placed is not None:
        if parameters.get("binary_data_size") is not None or "data" in raw:
            raise InvalidInputError(f"input '{name}': data in a shared memory region and in the request too")
        data = array_from_buffer(name, datatype, shape, regions.read(placed, f"input '{name}'"))
        return Tensor(name, datatype, shape, data), 0
    return _tensor(name, datatype, shape, raw, parameters, binary)


def _described(raw: Any, kind: str) -> tuple[str, str, tuple[int, ...]]:
    """A tensor's name, datatype and shape, as an input or output entry gives them."""
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise InvalidInputError(f"each {kind} must be an object with a 'name'")
    name = raw["name"]
    datatype = raw.get("datatype")
    if not isinstance(datatype, str):
        raise InvalidInputError(f"{kind} '{name}': missing 'datatype'")
    return name, datatype, check_shape(name, raw.get("shape"))


def _tensor(
    name: str,
    datatype: str,
    shape: tuple[int, ...],
    raw: dict[str, Any],
    parameters: dict[str, Any],
    binary: memoryview,
) -> tuple[Tensor, int]:
    """A tensor's data, from the binary data after the JSON (`binary_data_size`) or its `data`; the bytes used."""
    size = parameters.get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or size < 0 or size > len(binary):
            raise InvalidInputError(f"input '{name}': binary_data_size {size!r} exceeds the binary data sent")
        return Tensor(name, datatype, shape, array_from_buffer(name, datatype, shape, binary[:size])), size
    if "data" not in raw:
        raise InvalidInputError(f"input '{name}': no 'data' and no binary_data_size")
    return Tensor(name, datatype, shape, array_from_values(name, datatype, shape, raw["data"])), 0


def _requested_output(raw: Any) -> RequestedOutput:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise InvalidInputError("each requested output must be an object with a 'name'")
    where = f"output '{raw['name']}'"
    parameters = checked_parameters(raw.get("parameters"), where)
    placed = shared_memory_ref(where, parameters)
    binary = parameters.get("binary_data", False)  # a boolean: `checked_parameters` checked it
    return RequestedOutput(raw["name"], binary, placed, class_count(where, parameters))


def checked_parameters(raw: Any, where: str) -> dict[str, Any]:
    """The protocol's parameters: a JSON object whose values are booleans, numbers or strings, asking for no
    extension this server lacks (`refuse_unsupported`)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InvalidInputError(f"{where}: 'parameters' must be an object")
    for key, value in raw.items():
        if not isinstance(value, bool | int | float | str):
            raise InvalidInputError(
                f"{where}: parameter '{key}' must be a boolean, a number or a string, got {type(value).__name__}"
            )
    for key in BOOLEAN_PARAMETERS & raw.keys():
        if not isinstance(raw[key], bool):
            raise InvalidInputError(f"{where}: parameter '{key}' must be true or false, got {raw[key]!r}")
    refuse_unsupported(where, raw)
    return raw


def encode_response(response: InferenceResponse) -> tuple[bytes, dict[str, str]]:
    """The body and extra headers; binary outputs follow the JSON header in output order."""
    outputs, blobs = [], []
    for tensor, form in zip(response.outputs, response.forms, strict=True):
        entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
        outputs.append(entry)
        if form.shared_memory is not None:  # in the client's region already: named without data, as Triton does
            continue
        if form.binary:
            blob = tensor_bytes(tensor)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        elif tensor.datatype == "BYTES":  # JSON has strings, not bytes
            entry["data"] = [item.decode(errors="replace") for item in tensor.data.ravel()]
        else:
            entry["data"] = tensor.data.ravel().tolist()
    document: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        document["id"] = response.id
    if response.parameters:
        document["parameters"] = response.parameters
    document["outputs"] = outputs
    header = _encode(document)
    if not blobs:
        return header, {"content-type": "application/json"}
    return b"".join([header, *blobs]), {
        "content-type": "application/octet-stream",
        "inference-header-content-length": str(len(header)),
    }


def decode_json(data: bytes | memoryview) -> Any:
    """A request's JSON; InvalidInputError naming what is wrong with it. Arrays nested past the decoder's depth
    limit (a few thousand `[`) raise RecursionError, which is the client's error too, not the server's."""
    try:
        return _json.decode(data)
    except msgspec.DecodeError as exc:
        raise InvalidInputError(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidInputError("request body is not valid JSON: it nests arrays or objects too deeply") from None


def encode_json(document: Any) -> bytes:
    return _encode(document)
