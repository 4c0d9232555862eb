"""The gRPC adapter: `inference.GRPCInferenceService` over the data plane.

The service is Triton's `grpc_service.proto`, vendored in `adaserve/server/protos/` (r24.07). Its core
RPCs (ServerLive … ModelInfer) are KServe's `grpc_predict_v2.proto` message for message and field for field, so
clients built from either proto work; the rest are Triton's extensions (config, statistics, repository, logging,
system shared memory).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from adaserve.config import Interface
from adaserve.errors import AdaserveError, InvalidInputError, RequestTooLargeError
from adaserve.server.content_coding import OFFLOAD_BYTES
from adaserve.server.dataplane import DataPlane
from adaserve.server.grpc_relay import RelayedCall
from adaserve.server.grpc_stream import stream_answers
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
    grpc_bytes_limit,
    refuse_shared_memory,
    refuse_unsupported,
    shared_memory_ref,
    tensor_bytes,
)
from adaserve.server.protos import grpc_service_pb2 as service_pb2
from adaserve.server.protos import grpc_service_pb2_grpc as service_pb2_grpc
from adaserve.server.protos import model_config_pb2
from adaserve.server.restrictions import Restrictions
from adaserve.server.shared_memory import RegionKind, SharedMemoryRegions

log = logging.getLogger("adaserve.grpc")

#: Which typed field of InferTensorContents carries each datatype (FP16 has none: raw contents only).
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}

Message = TypeVar("Message")


Method = Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[Message]]

#: On a cluster, where a call that names a model goes (`adaserve.distributed.member`): given the RPC's name, the
#: model, the request's bytes and the call, the answer's bytes from the node that served it, or None to serve it here.
Relay = Callable[[str, str, bytes, grpc.aio.ServicerContext], Awaitable[bytes | None]]
#: On a cluster, the statistics extension's answer for every replica: given a model and version (empty: all), the
#: document `DataPlane.statistics` gives for one server.
Statistics = Callable[[str, str], Awaitable[dict[str, Any]]]


def _rpc(category: str) -> Callable[[Method[Message]], Method[Message]]:
    """A unary RPC in one of Triton's API categories (`restrictions`): refused without the category's header, if it
    has one, and every error mapped from the one exception hierarchy to its status code, in one place."""

    def decorate(method: Method[Message]) -> Method[Message]:
        @functools.wraps(method)
        async def wrapper(self: InferenceServicer, request: Any, context: grpc.aio.ServicerContext) -> Message:
            try:
                self.restrictions.check_call(category, context)
                return await method(self, request, context)
            except Exception as exc:
                status = _status(exc, method.__name__)
            # Aborted outside the handler, with the request let go of: the exception `abort` raises keeps this frame,
            # and it kept the failed request's traceback with it, frames, message and all, until the cyclic garbage
            # collector ran (refused 60 MB messages grew the server by 60 MB each, to 800 MB).
            del request
            await context.abort(*status)
            raise AssertionError("unreachable: context.abort raises")

        return wrapper

    return decorate


def _status(exc: Exception, rpc: str) -> tuple[grpc.StatusCode, str]:
    """The status and message an error answers with; one outside the hierarchy is logged with its traceback (call
    it from the `except` block)."""
    if isinstance(exc, AdaserveError):
        return exc.grpc_code, str(exc)
    log.exception("unexpected error", extra={"rpc": rpc})
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"


#: The `SettingValue` field that carries a log setting of each type (Triton's logging extension).
_SETTING_KINDS = {bool: "bool_param", int: "uint32_param", str: "string_param"}


#: The RPCs whose requests come as their bytes (`add_to_server`).
RAW = ("ModelInfer", "ModelStreamInfer")
#: Every RPC the servicer runs on a relayed request's bytes (`relayed_calls`), by its request's message type (None:
#: taken as bytes). ModelStreamInfer is relayed a message at a time: a ModelInferRequest, answered with its
#: ModelStreamInferResponse.
RELAYED = {
    method.name: None if method.name in RAW else getattr(service_pb2, method.input_type.name)
    for method in service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods
}
#: On a cluster, the calls relayed to the node that holds their model (`Relay`); each message of a
#: ModelStreamInfer is relayed as a ModelInfer.
FORWARDED = ("ModelInfer", "ModelReady", "ModelMetadata", "ModelConfig")


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(
        self,
        plane: DataPlane,
        restrictions: Restrictions | None = None,
        relay: Relay | None = None,
        statistics: Statistics | None = None,
    ) -> None:
        """`restrictions`: the RPC categories that answer only calls with a given metadata key
        (`--grpc-restricted-protocol`). `relay`: on a cluster, sends the calls for models held elsewhere there.
        `statistics`: on a cluster, the statistics of every replica (the data plane's are this server's own)."""
        self.plane = plane
        self.restrictions = restrictions or Restrictions()
        self.relay = relay
        self.statistics = statistics

    def relayed_calls(self) -> dict[str, RelayedCall]:
        """The calls relayed here (`server/grpc_relay.py`) by RPC: from another node (`Relay`) or from the gRPC
        frontend's process. Each takes its request's bytes and runs the method that runs it when a client calls
        this frontend; an error is `context.abort`ed, as on a call."""
        calls: dict[str, RelayedCall] = {rpc: functools.partial(self._relayed_call, rpc) for rpc in RELAYED}
        calls["ModelStreamInfer"] = self._relayed_stream_message
        return calls

    async def _relayed_call(self, rpc: str, raw: bytes, context: Any) -> bytes:
        request_type = RELAYED[rpc]
        answer = await getattr(self, rpc)(raw if request_type is None else request_type.FromString(raw), context)
        return _serialize(answer)

    async def _relayed_stream_message(self, raw: bytes, context: Any) -> bytes:
        """One request of a stream the gRPC frontend's process reads (`grpc_stream.stream_answers` there): its
        answer, or its failure, as a `ModelStreamInferResponse`; a call refused its restricted category fails."""
        await self._check_stream(context)
        return _serialize(await self._answer_in_stream(raw, context))

    async def _relayed(self, rpc: str, name: str, request: Any, context: grpc.aio.ServicerContext) -> bytes | None:
        """The answer's bytes from the node that holds model `name`, or None to serve the call here."""
        if self.relay is None or not name:
            return None
        return await self.relay(rpc, name, request.SerializeToString(), context)

    async def _relayed_infer(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes | None:
        """An inference request's answer from the node that holds its model, or None to serve it here."""
        named = peek_model(raw) if self.relay is not None else None
        if self.relay is None or named is None:
            return None
        return await self.relay("ModelInfer", named[0], raw, context)

    @_rpc("health")
    async def ServerLive(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return service_pb2.ServerLiveResponse(live=self.plane.live())

    @_rpc("health")
    async def ServerReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return service_pb2.ServerReadyResponse(ready=self.plane.ready())

    @_rpc("health")
    async def ModelReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if (answer := await self._relayed("ModelReady", request.name, request, context)) is not None:
            return service_pb2.ModelReadyResponse.FromString(answer)
        return service_pb2.ModelReadyResponse(ready=self.plane.model_ready(request.name, request.version))

    @_rpc("metadata")
    async def ServerMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return json_format.ParseDict(self.plane.metadata(), service_pb2.ServerMetadataResponse())

    @_rpc("metadata")
    async def ModelMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if (answer := await self._relayed("ModelMetadata", request.name, request, context)) is not None:
            return service_pb2.ModelMetadataResponse.FromString(answer)
        document = self.plane.model_metadata(request.name, request.version)
        return json_format.ParseDict(document, service_pb2.ModelMetadataResponse())

    @_rpc("model-config")
    async def ModelConfig(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if (answer := await self._relayed("ModelConfig", request.name, request, context)) is not None:
            return service_pb2.ModelConfigResponse.FromString(answer)
        config = json_format.ParseDict(
            self.plane.model_config(request.name, request.version), model_config_pb2.ModelConfig()
        )
        return service_pb2.ModelConfigResponse(config=config)

    @_rpc("statistics")
    async def ModelStatistics(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if self.statistics is not None:
            document = await self.statistics(request.name, request.version)
        else:
            document = self.plane.statistics(request.name, request.version)
        return json_format.ParseDict(document, service_pb2.ModelStatisticsResponse())

    @_rpc("logging")
    async def LogSettings(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Triton's logging extension; each setting a `SettingValue` of the kind its value is."""
        changes = {}
        for name, value in request.settings.items():
            kind = value.WhichOneof("parameter_choice")
            if kind is None:
                raise InvalidInputError(f"log setting '{name}' has no value")
            changes[name] = getattr(value, kind)
        response = service_pb2.LogSettingsResponse()
        for name, setting in self.plane.log_settings(changes).items():
            setattr(response.settings[name], _SETTING_KINDS[type(setting)], setting)
        return response

    @_rpc("trace")
    async def TraceSetting(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Triton's trace extension: a setting with no values clears it; a request with no settings reads them."""
        changes = {name: list(setting.value) or None for name, setting in request.settings.items()}
        document = await self.plane.trace_settings(request.model_name, changes or None)
        response = service_pb2.TraceSettingResponse()
        for name, value in document.items():
            response.settings[name].value.extend(value if isinstance(value, list) else [value])
        return response

    @_rpc("shared-memory")
    async def SystemSharedMemoryStatus(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return self._region_status(service_pb2.SystemSharedMemoryStatusResponse, request.name, "system")

    @_rpc("shared-memory")
    async def SystemSharedMemoryRegister(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.plane.shared_memory.register(request.name, request.key, request.offset, request.byte_size)
        return service_pb2.SystemSharedMemoryRegisterResponse()

    @_rpc("shared-memory")
    async def SystemSharedMemoryUnregister(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.plane.shared_memory.unregister(request.name)
        return service_pb2.SystemSharedMemoryUnregisterResponse()

    @_rpc("shared-memory")
    async def CudaSharedMemoryStatus(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return self._region_status(service_pb2.CudaSharedMemoryStatusResponse, request.name, "cuda")

    def _region_status(self, response_type: Any, name: str, kind: RegionKind) -> Any:
        """A shared-memory status response: the regions of `kind` (one, when `name` is given) by name."""
        response = response_type()
        for region in self.plane.shared_memory.status(name, kind):
            response.regions[region["name"]].CopyFrom(response_type.RegionStatus(**region))
        return response

    @_rpc("shared-memory")
    async def CudaSharedMemoryRegister(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.plane.shared_memory.register_cuda(request.name, request.raw_handle, request.device_id, request.byte_size)
        return service_pb2.CudaSharedMemoryRegisterResponse()

    @_rpc("shared-memory")
    async def CudaSharedMemoryUnregister(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.plane.shared_memory.unregister(request.name, "cuda")
        return service_pb2.CudaSharedMemoryUnregisterResponse()

    @_rpc("model-repository")
    async def RepositoryIndex(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        rows = self.plane.repository_index(ready_only=request.ready)
        return json_format.ParseDict({"models": rows}, service_pb2.RepositoryIndexResponse())

    @_rpc("model-repository")
    async def RepositoryModelLoad(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self.plane.load(request.model_name, list(request.parameters))
        return service_pb2.RepositoryModelLoadResponse()

    @_rpc("model-repository")
    async def RepositoryModelUnload(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self.plane.unload(request.model_name, list(request.parameters))
        return service_pb2.RepositoryModelUnloadResponse()

    @_rpc("inference")
    async def ModelInfer(self, raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        """The request comes as its bytes (`add_to_server`): `_parsed` checks them against the model first. On a
        cluster, a request for a model held elsewhere is relayed as its bytes, and answered with the bytes that
        come back."""
        arrived_ns = time.perf_counter_ns()
        if (answer := await self._relayed_infer(raw, context)) is not None:
            return answer
        return await self._infer(*await self._parsed(raw), context, arrived_ns)

    async def ModelStreamInfer(self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        """Triton's streaming inference (tritonclient's `start_stream` / `async_stream_infer`), for models that
        answer each request once, as `grpc_stream.stream_answers` runs a stream. A request that fails is answered
        with `error_message` and its `id`; the stream goes on until the client ends it."""
        await self._check_stream(context)
        async for response in stream_answers(requests, lambda raw: self._answer_in_stream(raw, context)):
            yield response

    async def _check_stream(self, context: grpc.aio.ServicerContext) -> None:
        try:
            self.restrictions.check_call("inference", context)
        except Exception as exc:
            await context.abort(*_status(exc, "ModelStreamInfer"))

    async def _answer_in_stream(self, raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        """A stream's answer to one request, as its `ModelStreamInferResponse` (its bytes when relayed from another
        node); its failure, too, named by its model and `id`."""
        arrived_ns = time.perf_counter_ns()
        request = None
        try:
            if (relayed := await self._relayed_infer(raw, context)) is not None:
                return _stream_answer(relayed)
            request, config = await self._parsed(raw)
            answered = await self._infer(request, config, context, arrived_ns)
            return service_pb2.ModelStreamInferResponse(infer_response=answered)
        except Exception as exc:
            _, message = _status(exc, "ModelStreamInfer")
            model_name, model_version = peek_model(raw) or ("", "")
            named = service_pb2.ModelInferResponse(
                model_name=model_name, model_version=model_version, id=request.id if request is not None else ""
            )
            return service_pb2.ModelStreamInferResponse(error_message=message, infer_response=named)

    async def _parsed(self, raw: bytes) -> tuple[Any, Interface]:
        """A request's message out of its bytes, and what its model takes. The model is read from the message's
        first fields (`peek_model`), and a message larger than it can take is refused before it is parsed
        (RESOURCE_EXHAUSTED); one over `OFFLOAD_BYTES` is parsed off the event loop. grpc.aio parsed every message
        on the loop before any check: 60 MB of typed values for a 16-row model cost the other clients 50-100 ms a
        message, and a few hundred MB while they were parsed."""
        named = peek_model(raw)
        config = None
        if named is not None:
            config = self.plane.check_model(*named)
            limit = grpc_bytes_limit(config)
            if len(raw) > limit:
                raise RequestTooLargeError(
                    f"request for model '{named[0]}' of {len(raw)} bytes exceeds the {limit} bytes that "
                    f"{config.max_batch_size} rows of its inputs can take"
                )
        message = await asyncio.to_thread(_parse, raw) if len(raw) > OFFLOAD_BYTES else _parse(raw)
        if config is None:  # the model named after the tensors, which no serializer writes: checked once parsed
            config = self.plane.check_model(message.model_name, message.model_version)
        return message, config

    async def _infer(self, request: Any, config: Interface, context: grpc.aio.ServicerContext, arrived_ns: int) -> Any:
        """One request; a traced one is stamped as read on arrival (`arrived_ns`) and as sent when its answer is
        handed back (grpc.aio reads and writes the messages itself: those spans are points)."""
        inference = decode_request(request, config, self.plane.shared_memory)
        trace = self.plane.tracer.begin(
            request.model_name, inference.id, lambda: dict(context.invocation_metadata() or ())
        )
        if trace is None:
            return encode_response(await self.plane.infer(inference))
        trace.stamp("GRPC_WAITREAD_START", arrived_ns)
        trace.stamp("GRPC_WAITREAD_END", arrived_ns)
        try:
            response = encode_response(await self.plane.infer(inference, trace))
        except BaseException:
            self.plane.tracer.finish(trace)
            raise
        sent_ns = time.perf_counter_ns()
        self.plane.tracer.sent(trace, "GRPC")(sent_ns, sent_ns)
        return response


def decode_request(message: Any, config: Interface, regions: SharedMemoryRegions) -> InferenceRequest:
    """A request for the model (or DAG query) `config` describes, each input checked against it before its data
    is converted. Raw contents, where sent, are positional over the inputs not in shared memory (as tritonclient
    sends them)."""
    placed = []  # per input, in order: its shared-memory slice, or None
    for tensor in message.inputs:
        where = f"input '{tensor.name}'"
        refuse_unsupported(where, tensor.parameters)
        placed.append(shared_memory_ref(where, _parameters(tensor.parameters)))
    raw = iter(message.raw_input_contents)
    sent = placed.count(None)
    if message.raw_input_contents and len(message.raw_input_contents) != sent:
        raise InvalidInputError(
            f"{len(message.raw_input_contents)} raw_input_contents for {sent} inputs not in shared memory"
        )
    inputs = []
    refuse_unsupported("request", message.parameters)
    refuse_shared_memory("request", message.parameters)
    for tensor, ref in zip(message.inputs, placed, strict=True):
        shape = check_shape(tensor.name, list(tensor.shape))
        check_input(config, tensor.name, tensor.datatype, shape)
        if ref is not None:
            data = array_from_buffer(tensor.name, tensor.datatype, shape, regions.read(ref, f"input '{tensor.name}'"))
        elif message.raw_input_contents:
            data = array_from_buffer(tensor.name, tensor.datatype, shape, next(raw))
        else:
            field = CONTENTS_FIELD.get(tensor.datatype)
            if field is None:
                raise InvalidInputError(f"input '{tensor.name}': {tensor.datatype} data must be sent as raw contents")
            data = array_from_values(tensor.name, tensor.datatype, shape, getattr(tensor.contents, field))
        inputs.append(Tensor(tensor.name, tensor.datatype, shape, data))
    outputs = []
    for output in message.outputs:
        where = f"output '{output.name}'"
        refuse_unsupported(where, output.parameters)
        parameters = _parameters(output.parameters)
        into = shared_memory_ref(where, parameters)
        outputs.append(RequestedOutput(output.name, shared_memory=into, class_count=class_count(where, parameters)))
    return InferenceRequest(
        model_name=message.model_name,
        model_version=message.model_version,
        inputs=inputs,
        outputs=outputs or None,
        id=message.id,
        parameters=_parameters(message.parameters),
    )


def encode_response(response: InferenceResponse) -> Any:
    message = service_pb2.ModelInferResponse(
        model_name=response.model_name, model_version=response.model_version, id=response.id
    )
    for key, value in response.parameters.items():
        message.parameters[key].CopyFrom(_to_parameter(value))
    for tensor, form in zip(response.outputs, response.forms, strict=True):
        message.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=list(tensor.shape))
        if form.shared_memory is not None:  # in the client's region already; an empty entry keeps the places
            message.raw_output_contents.append(b"")
            continue
        message.raw_output_contents.append(tensor_bytes(tensor))
    return message


def _parameters(parameters: Any) -> dict[str, Any]:
    return {key: _from_parameter(key, value) for key, value in parameters.items()}


def _from_parameter(key: str, parameter: Any) -> Any:
    kind = parameter.WhichOneof("parameter_choice")
    if kind is None:
        raise InvalidInputError(f"parameter '{key}' has no value: set one of its bool, int64, uint64, double or string")
    return getattr(parameter, kind)


def _to_parameter(value: Any) -> Any:
    if isinstance(value, bool):
        return service_pb2.InferParameter(bool_param=value)
    if isinstance(value, int):
        return service_pb2.InferParameter(int64_param=value)
    if isinstance(value, float):
        return service_pb2.InferParameter(double_param=value)
    return service_pb2.InferParameter(string_param=str(value))


#: The service's full name, as its RPCs' paths begin.
SERVICE = "inference.GRPCInferenceService"
#: The fields of a request read for its model's name before the message is parsed (`peek_model`).
PEEK_FIELDS = 8


def add_to_server(servicer: InferenceServicer, server: grpc.aio.Server) -> None:
    """The service on `server`. Its inference RPCs take each request's bytes as they came, which the servicer
    parses once it knows what the model takes; registered first, these handlers answer those two RPCs, and the
    generated ones every other."""
    raw = {
        "ModelInfer": grpc.unary_unary_rpc_method_handler(servicer.ModelInfer, response_serializer=_serialize),
        "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(
            servicer.ModelStreamInfer, response_serializer=_serialize
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, raw),))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)


def _serialize(answer: Any) -> bytes:
    """An answer's bytes: a message serialized, or bytes relayed from another node as they are."""
    return answer if isinstance(answer, bytes) else answer.SerializeToString()


def _stream_answer(infer_response: bytes) -> bytes:
    """A `ModelStreamInferResponse` holding a relayed `ModelInferResponse`'s bytes (its field 2), built without
    parsing them."""
    size, head = len(infer_response), bytearray(b"\x12")
    while size >= 0x80:
        head.append(size & 0x7F | 0x80)
        size >>= 7
    head.append(size)
    return bytes(head) + infer_response


def peek_model(raw: bytes) -> tuple[str, str] | None:
    """The model name and version a serialized `ModelInferRequest` names (its fields 1 and 2, which serializers
    write first), read from its first `PEEK_FIELDS` fields without parsing the rest; None when the name is not
    among them or the bytes are not protobuf's."""
    name, version, position = None, "", 0
    try:
        for _ in range(PEEK_FIELDS):
            if position >= len(raw):
                break
            key, position = _varint(raw, position)
            field, wire = key >> 3, key & 7
            if wire == 2:
                size, position = _varint(raw, position)
                if field in (1, 2):
                    text = raw[position : position + size].decode()
                    name, version = (text, version) if field == 1 else (name, text)
                position += size
            elif wire == 0:
                _, position = _varint(raw, position)
            elif wire in (1, 5):
                position += 8 if wire == 1 else 4
            else:
                return None
    except (IndexError, UnicodeDecodeError):
        return None
    return None if name is None else (name, version)


def _varint(raw: bytes, position: int) -> tuple[int, int]:
    """A base-128 varint at `position`, and the position after it; IndexError past the end."""
    value = shift = 0
    while True:
        byte = raw[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7
        if shift > 63:
            raise IndexError("a varint longer than 10 bytes")


def _parse(raw: bytes) -> Any:
    try:
        return service_pb2.ModelInferRequest.FromString(raw)
    except DecodeError:
        raise InvalidInputError("the request is not a ModelInferRequest message") from None
