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

from adaserve.config import Interface
from adaserve.errors import AdaserveError, InvalidInputError
from adaserve.server.dataplane import DataPlane
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

#: Requests of one `ModelStreamInfer` call read and not yet answered to the client: past it the call reads no more
#: until an answer is sent, so a client that never reads holds a bounded amount of the server's memory (unbounded,
#: 1.5 KB an answer piled up: 115 to 374 MB in 60 s).
STREAM_WINDOW = 64

Message = TypeVar("Message")


Method = Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[Message]]


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
                await context.abort(*_status(exc, method.__name__))
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


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, plane: DataPlane, restrictions: Restrictions | None = None) -> None:
        """`restrictions`: the RPC categories that answer only calls with a given metadata key
        (`--grpc-restricted-protocol`)."""
        self.plane = plane
        self.restrictions = restrictions or Restrictions()

    @_rpc("health")
    async def ServerLive(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return service_pb2.ServerLiveResponse(live=self.plane.live())

    @_rpc("health")
    async def ServerReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return service_pb2.ServerReadyResponse(ready=self.plane.ready())

    @_rpc("health")
    async def ModelReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return service_pb2.ModelReadyResponse(ready=self.plane.model_ready(request.name, request.version))

    @_rpc("metadata")
    async def ServerMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return json_format.ParseDict(self.plane.metadata(), service_pb2.ServerMetadataResponse())

    @_rpc("metadata")
    async def ModelMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        document = self.plane.model_metadata(request.name, request.version)
        return json_format.ParseDict(document, service_pb2.ModelMetadataResponse())

    @_rpc("model-config")
    async def ModelConfig(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        config = json_format.ParseDict(
            self.plane.model_config(request.name, request.version), model_config_pb2.ModelConfig()
        )
        return service_pb2.ModelConfigResponse(config=config)

    @_rpc("statistics")
    async def ModelStatistics(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
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
        document = self.plane.trace_settings(request.model_name, changes or None)
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
    async def ModelInfer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._infer(request, context)

    async def ModelStreamInfer(self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        """Triton's streaming inference (tritonclient's `start_stream` / `async_stream_infer`), for models that
        answer each request once: every request runs as it arrives, and its response is written when it is done, in
        the order requests finish (a client matches them by `id`); at most `STREAM_WINDOW` are read ahead of the
        answers the client has taken. A request that fails is answered with
        `error_message` and its `id`; the stream goes on until the client ends it."""
        try:
            self.restrictions.check_call("inference", context)
        except Exception as exc:
            await context.abort(*_status(exc, "ModelStreamInfer"))
        answers: asyncio.Queue[Any] = asyncio.Queue()
        running: set[asyncio.Task[None]] = set()
        room = asyncio.Semaphore(STREAM_WINDOW)  # taken by each request read, given back as its answer is sent

        async def answer(request: Any) -> None:
            try:
                response = service_pb2.ModelStreamInferResponse(infer_response=await self._infer(request, context))
            except Exception as exc:
                _, message = _status(exc, "ModelStreamInfer")
                named = service_pb2.ModelInferResponse(
                    model_name=request.model_name, model_version=request.model_version, id=request.id
                )
                response = service_pb2.ModelStreamInferResponse(error_message=message, infer_response=named)
            answers.put_nowait(response)

        async def read() -> None:
            try:
                async for request in requests:
                    await room.acquire()  # past the window, read no more: the client's sends wait (flow control)
                    task = asyncio.create_task(answer(request))
                    running.add(task)
                    task.add_done_callback(running.discard)
                if running:
                    await asyncio.wait(set(running))
            finally:
                answers.put_nowait(None)  # the end of the answers, also when reading failed

        reader = asyncio.create_task(read())
        try:
            while (response := await answers.get()) is not None:
                yield response  # returns once gRPC has taken it, as far as the client's flow control lets it
                room.release()
            await reader  # a failed read ends the call with its error
        finally:
            reader.cancel()  # the client went away: what has not started is taken back (engine.infer)
            for task in running:
                task.cancel()

    async def _infer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """One request; a traced one is stamped as read on arrival here and as sent when its answer is handed back
        (grpc.aio reads and writes the messages itself: those spans are points)."""
        arrived_ns = time.perf_counter_ns()
        config = self.plane.check_model(request.model_name, request.model_version)
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
