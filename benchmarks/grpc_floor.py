"""The floor under adaserve's gRPC latency: a gRPC server of the same service that answers every ModelInfer for
the example `mlp` with a canned output, running no model and no engine.

`benchmarks.serving_overhead` starts it beside adaserve and measures it with the same perf_analyzer settings, so the
part of a gRPC request that is grpcio's own (its poller thread handing each completion to the asyncio loop through a
socket pair, protobuf, HTTP/2) is measured rather than argued. Only what perf_analyzer asks for is served.

`--loop` is the server loop: `aio` (grpc.aio on uvloop, as adaserve's gRPC frontend runs), `threads` (grpcio's
synchronous server, each call answered on a thread of its pool) or `threads-hop` (the same, each call answered on an
asyncio loop the pool's thread waits for, as a frontend whose engine lives on an event loop would have to).
`benchmarks.grpc_loops` measures them side by side.

    .venv/bin/python -m benchmarks.grpc_floor --port PORT [--loop aio]     # 127.0.0.1 only
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from benchmarks.common import serve_on_port

MODEL = "mlp"
INPUT, OUTPUT = ("image", 784), ("logits", 10)
ANSWER = np.zeros(OUTPUT[1], dtype=np.float32).tobytes()
#: The server loops `--loop` runs; the first is adaserve's.
LOOPS = ("aio", "threads", "threads-hop")
#: The synchronous server's pool: a thread for each call of the highest concurrency the benchmarks send.
THREADS = 8


class Canned:
    """Answers `mlp` batch-1 requests with zeros; metadata and config as adaserve reports them for the example."""

    def ServerLive(self, request: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    def ServerReady(self, request: Any) -> Any:
        return service_pb2.ServerReadyResponse(ready=True)

    def ServerMetadata(self, request: Any) -> Any:
        return service_pb2.ServerMetadataResponse(name="grpc-floor", version="0")

    def ModelReady(self, request: Any) -> Any:
        return service_pb2.ModelReadyResponse(ready=request.name == MODEL)

    def ModelMetadata(self, request: Any) -> Any:
        tensor = service_pb2.ModelMetadataResponse.TensorMetadata
        return service_pb2.ModelMetadataResponse(
            name=MODEL,
            versions=["1"],
            platform="pytorch",
            inputs=[tensor(name=INPUT[0], datatype="FP32", shape=[-1, INPUT[1]])],
            outputs=[tensor(name=OUTPUT[0], datatype="FP32", shape=[-1, OUTPUT[1]])],
        )

    def ModelConfig(self, request: Any) -> Any:
        config = model_config_pb2.ModelConfig(name=MODEL, max_batch_size=16, platform="pytorch")
        config.input.add(name=INPUT[0], data_type=model_config_pb2.TYPE_FP32, dims=[INPUT[1]])
        config.output.add(name=OUTPUT[0], data_type=model_config_pb2.TYPE_FP32, dims=[OUTPUT[1]])
        return service_pb2.ModelConfigResponse(config=config)

    def ModelInfer(self, request: Any) -> Any:
        response = service_pb2.ModelInferResponse(model_name=MODEL, model_version="1", id=request.id)
        response.outputs.add(name=OUTPUT[0], datatype="FP32", shape=[1, OUTPUT[1]])
        response.raw_output_contents.append(ANSWER)
        return response


RPCS = ("ServerLive", "ServerReady", "ServerMetadata", "ModelReady", "ModelMetadata", "ModelConfig", "ModelInfer")


def servicer(loop: str, event_loop: asyncio.AbstractEventLoop | None = None) -> Any:
    """The canned service for server loop `loop` (`LOOPS`); `event_loop`: where `threads-hop` answers each call."""
    canned = Canned()
    methods = {rpc: _method(loop, getattr(canned, rpc), event_loop) for rpc in RPCS}
    return type("CannedServicer", (service_pb2_grpc.GRPCInferenceServiceServicer,), methods)()


def _method(loop: str, answer: Callable[[Any], Any], event_loop: asyncio.AbstractEventLoop | None) -> Any:
    if loop == "aio":

        async def on_aio(self: Any, request: Any, context: Any) -> Any:
            return answer(request)

        return on_aio
    if loop == "threads":

        def on_thread(self: Any, request: Any, context: Any) -> Any:
            return answer(request)

        return on_thread
    assert event_loop is not None

    async def answered(request: Any) -> Any:
        return answer(request)

    def hop(self: Any, request: Any, context: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(answered(request), event_loop).result()

    return hop


async def serve(port: int, loop: str = LOOPS[0]) -> None:
    """Serve on 127.0.0.1:`port` with server loop `loop`, until terminated."""
    address = f"127.0.0.1:{port}"
    if loop == "aio":
        server = grpc.aio.server()
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer(loop), server)
        server.add_insecure_port(address)
        await server.start()
        await server.wait_for_termination()
        return
    threads = grpc.server(ThreadPoolExecutor(THREADS))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer(loop, asyncio.get_running_loop()), threads)
    threads.add_insecure_port(address)
    threads.start()
    await asyncio.Event().wait()  # the loop `threads-hop` answers on


if __name__ == "__main__":
    serve_on_port(serve, __doc__, LOOPS)
