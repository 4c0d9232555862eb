"""The Open Inference Protocol's inference request and response, independent of REST or gRPC.

The REST codec and the gRPC codec each translate their wire form to these types; the data plane sees only these.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from adaserve.config import DATATYPES, Interface
from adaserve.errors import InvalidInputError

#: Parameters that ask for a protocol extension this server does not implement, and what it is called: refused
#: with a 400 that names it, never ignored (a request asking for top classes must not get the whole logits back).
UNSUPPORTED = {
    "sequence_id": "the sequence extension (every model here is stateless)",
    "sequence_start": "the sequence extension (every model here is stateless)",
    "sequence_end": "the sequence extension (every model here is stateless)",
}


def refuse_unsupported(where: str, parameters: Iterable[str]) -> None:
    """InvalidInputError if `where` (a request, an input, an output) asks for an extension not implemented here."""
    for name in parameters:
        if name in UNSUPPORTED:
            raise InvalidInputError(
                f"{where}: parameter '{name}' asks for {UNSUPPORTED[name]}, which this server does not implement"
            )


#: Triton's system shared-memory extension: where an input's data lies, or where an output is to be written.
SHARED_MEMORY_PARAMETERS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")


@dataclass(frozen=True)
class SharedMemoryRef:
    """`{"shared_memory_region": "input0", "shared_memory_byte_size": 3136, "shared_memory_offset": 0}`: a slice
    of a registered system shared-memory region."""

    region: str
    byte_size: int
    offset: int = 0


def shared_memory_ref(where: str, parameters: dict[str, Any]) -> SharedMemoryRef | None:
    """The shared-memory slice a tensor's parameters name, checked; None when they name none."""
    if SHARED_MEMORY_PARAMETERS[0] not in parameters:
        stray = [name for name in SHARED_MEMORY_PARAMETERS[1:] if name in parameters]
        if stray:
            raise InvalidInputError(f"{where}: parameter '{stray[0]}' without 'shared_memory_region'")
        return None
    region, size, offset = (parameters.get(name) for name in SHARED_MEMORY_PARAMETERS)
    if not isinstance(region, str) or not region:
        raise InvalidInputError(f"{where}: parameter 'shared_memory_region' must be a region's name, got {region!r}")
    if type(size) is not int or size < 0:
        raise InvalidInputError(
            f"{where}: parameter 'shared_memory_byte_size' must be a whole number >= 0, got {size!r}"
        )
    if offset is None:
        offset = 0
    if type(offset) is not int or offset < 0:
        raise InvalidInputError(
            f"{where}: parameter 'shared_memory_offset' must be a whole number >= 0, got {offset!r}"
        )
    return SharedMemoryRef(region, size, offset)


def refuse_shared_memory(where: str, parameters: Iterable[str]) -> None:
    """A request's own parameters cannot place tensors: the shared-memory parameters belong on an input or output."""
    for name in parameters:
        if name in SHARED_MEMORY_PARAMETERS:
            raise InvalidInputError(f"{where}: parameter '{name}' belongs on an input or an output, not on the request")


@dataclass(frozen=True)
class Tensor:
    """`{"name": "image", "datatype": "FP32", "shape": [1, 784], "data": [...]}` as a typed numpy array."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray


@dataclass(frozen=True)
class RequestedOutput:
    """`{"name": "logits", "parameters": {"binary_data": true}}`, or an output to be written into shared memory, or
    (`{"classification": 3}`) answered as each row's top classes."""

    name: str
    binary: bool = False
    shared_memory: SharedMemoryRef | None = None
    class_count: int = 0  # the classification extension: this many top classes a row; 0: the tensor itself


def class_count(where: str, parameters: dict[str, Any]) -> int:
    """The classification extension's `classification` parameter of an output: a whole number above 0, or 0 when
    absent."""
    count = parameters.get("classification")
    if count is None:
        return 0
    if type(count) is not int or count < 1:
        raise InvalidInputError(f"{where}: parameter 'classification' must be a whole number above 0, got {count!r}")
    return count


@dataclass(frozen=True)
class InferenceRequest:
    """`{"id": "42", "parameters": {...}, "inputs": [tensor, ...], "outputs": [requested output, ...]}`."""

    model_name: str
    model_version: str
    inputs: list[Tensor]
    outputs: list[RequestedOutput] | None = None  # None: every output
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    binary_outputs: bool = False  # request parameter "binary_data_output": every output in binary form


@dataclass(frozen=True)
class InferenceResponse:
    """`{"model_name": ..., "model_version": ..., "id": ..., "parameters": {...}, "outputs": [tensor, ...]}`."""

    model_name: str
    model_version: str
    outputs: list[Tensor]
    forms: list[RequestedOutput]  # per output, how it is sent: JSON or binary data (REST; gRPC always sends raw
    # contents), or written into shared memory already and named in the response
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)


def array_from_buffer(name: str, datatype: str, shape: tuple[int, ...], buffer: bytes | memoryview) -> np.ndarray:
    """A tensor from raw little-endian bytes (binary data extension and gRPC raw contents)."""
    dtype = wire_dtype(name, datatype)
    expected = math.prod(shape) * dtype.itemsize
    if len(buffer) != expected:
        raise InvalidInputError(
            f"input '{name}': {len(buffer)} bytes of data for shape {list(shape)} {datatype}; expected {expected}"
        )
    return np.frombuffer(buffer, dtype=dtype).reshape(shape)


#: numpy's kind of the values a datatype's kind takes: booleans for BOOL, numbers for the others (a whole number
#: written 2.0, or one numpy read as a float because the list also holds an integer above INT64's range, is fine
#: for an integer type).
_ACCEPTED_KINDS = {"b": "b", "i": "iuf", "u": "iuf", "f": "iuf"}
_KIND_NAMES = {"b": "booleans", "i": "integers", "u": "integers", "f": "fractional numbers", "U": "strings"}
#: Integers a float64 holds exactly.
_EXACT_FLOAT_INTEGER = 2**53


def array_from_values(name: str, datatype: str, shape: tuple[int, ...], values: Any) -> np.ndarray:
    """A tensor from JSON or typed-proto values, flat or nested, checked against its shape and its datatype. Values
    the datatype cannot hold are refused, not converted: a string or null, a boolean for a number type, a fraction
    for an integer type, a number outside the type's range."""
    dtype = wire_dtype(name, datatype)
    try:
        array = np.asarray(values)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"input '{name}': data is not a list of {datatype} values: {exc}") from None
    if array.size != math.prod(shape):
        raise InvalidInputError(f"input '{name}': {array.size} values for shape {list(shape)}")
    if not array.size:
        return np.empty(shape, dtype)
    kind = array.dtype.kind
    if kind not in _ACCEPTED_KINDS[dtype.kind]:
        found = _KIND_NAMES.get(kind, "nulls or values of mixed types")
        raise InvalidInputError(f"input '{name}': {datatype} data must be {_KIND_NAMES[dtype.kind]}, got {found}")
    if dtype.kind in "iu":
        if kind == "f" and not np.array_equal(array, np.trunc(array)):
            raise InvalidInputError(f"input '{name}': {datatype} data must be integers, got fractional numbers")
        if kind == "f" and np.abs(array).max() >= _EXACT_FLOAT_INTEGER:
            raise InvalidInputError(
                f"input '{name}': {datatype} values mixing integers at or above 2**63 with others, or written as "
                "fractions at or above 2**53, lose precision as JSON numbers; send the tensor as binary data"
            )
        limits = np.iinfo(dtype)
        if array.min() < limits.min or array.max() > limits.max:
            raise InvalidInputError(f"input '{name}': a value is outside {datatype}'s range {limits.min}..{limits.max}")
    with np.errstate(over="ignore"):  # an overflow is refused just below
        result = array.astype(dtype, copy=False)
    if dtype.kind == "f" and not np.isfinite(result).all():  # JSON has no infinity: a finite value overflowed
        raise InvalidInputError(f"input '{name}': a value is outside {datatype}'s range")
    return result.reshape(shape)


#: The protocol's datatypes as they are on the wire: little-endian. Made once; numpy builds a dtype per call.
WIRE_DTYPES = {datatype: dtype.newbyteorder("<") for datatype, dtype in DATATYPES.items()}


def tensor_bytes(tensor: Tensor) -> bytes:
    """An output's contents as binary data and gRPC's raw contents carry them: little-endian values, or for BYTES
    (the classification extension's strings) each element's length in 4 little-endian bytes, then the element."""
    if tensor.datatype == "BYTES":
        return b"".join(len(item).to_bytes(4, "little") + item for item in tensor.data.ravel())
    return tensor.data.astype(tensor.data.dtype.newbyteorder("<"), copy=False).tobytes()


def wire_dtype(name: str, datatype: str) -> np.dtype:
    dtype = WIRE_DTYPES.get(datatype)
    if dtype is None:
        raise InvalidInputError(f"input '{name}': unsupported datatype {datatype!r}")
    return dtype


def check_input(config: Interface, name: str, datatype: str, shape: tuple[int, ...]) -> None:
    """InvalidInputError unless `config` takes an input `name` of this datatype and shape, a batch of 1 to
    `max_batch_size` rows. The codecs check each input as they decode it, before its data is converted, so data a
    model cannot take costs nothing to refuse (a gRPC input of 60 MB of typed values took 2.6 s to convert)."""
    spec = next((spec for spec in config.inputs if spec.name == name), None)
    if spec is None:
        expected = ", ".join(spec.name for spec in config.inputs)
        raise InvalidInputError(f"unknown input '{name}' for model '{config.name}'; it takes: {expected}")
    if datatype != spec.datatype:
        raise InvalidInputError(f"input '{name}': datatype {datatype} does not match the model's {spec.datatype}")
    if len(shape) != len(spec.shape) or shape[1:] != spec.row_shape:
        raise InvalidInputError(f"input '{name}': shape {list(shape)} does not match the model's {list(spec.shape)}")
    if not 1 <= shape[0] <= config.max_batch_size:
        raise InvalidInputError(
            f"input '{name}': batch size {shape[0]} is outside 1..{config.max_batch_size} (max_batch_size)"
        )


#: The most a tensor's value takes in a JSON request: a float64 written out in full ("-1.2345678901234567e-308",
#: 24 characters), its separator, and room for the brackets and indentation of nested, pretty-printed lists.
JSON_BYTES_PER_VALUE = 64
#: Room in a request for what it holds beside its tensors' values: names, shapes, parameters, its id, the outputs.
REQUEST_OVERHEAD_BYTES = 64 * 1024


def request_bytes_limit(config: Interface) -> int:
    """The largest request body `config` can take: every input at `max_batch_size` rows written as JSON (binary
    data takes less), with room for the rest. A larger body is refused before it is decompressed or parsed: a
    64 KB gzip body that inflated to 63 MiB of JSON numbers stalled the event loop for 3 s to be parsed, then
    refused for its shape."""
    return most_values(config) * JSON_BYTES_PER_VALUE + REQUEST_OVERHEAD_BYTES


def most_values(config: Interface) -> int:
    """The values a request for `config` holds at most: every input at `max_batch_size` rows."""
    return sum(config.max_batch_size * math.prod(spec.row_shape) for spec in config.inputs)


#: The most a tensor's value takes in a gRPC request: an INT64 as a negative varint in typed contents (raw
#: contents take the datatype's size, less).
GRPC_BYTES_PER_VALUE = 10


def grpc_bytes_limit(config: Interface) -> int:
    """The largest gRPC request `config` can take: every input at `max_batch_size` rows, as typed contents, with
    room for the rest (`request_bytes_limit`'s, for JSON)."""
    return most_values(config) * GRPC_BYTES_PER_VALUE + REQUEST_OVERHEAD_BYTES


def check_shape(name: str, shape: Any) -> tuple[int, ...]:
    if not isinstance(shape, list | tuple) or not all(type(d) is int and d >= 0 for d in shape):  # not a bool
        raise InvalidInputError(f"input '{name}': shape must be a list of non-negative integers, got {shape!r}")
    return tuple(shape)
