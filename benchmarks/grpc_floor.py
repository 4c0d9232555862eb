"""The floor under adaserve's gRPC latency: a `grpc.aio` server of the same service that answers every ModelInfer
for the example `mlp` with a canned output, running no model and no engine.

`benchmarks.serving_overhead` starts it beside adaserve and measures it with the same perf_analyzer settings, so the
part of a gRPC request that is grpcio's own (its poller thread handing each completion to the asyncio loop through a
socket pair, protobuf, HTTP/2) is measured rather than argued. Only what perf_analyzer asks for is served.

    .venv/bin/python -m benchmarks.grpc_floor --port PORT     # 127.0.0.1 only
"""

from __future__ import annotations

from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from benchmarks.common import serve_on_port

MODEL = "mlp"
INPUT, OUTPUT = ("image", 784), ("logits", 10)
ANSWER = np.zeros(OUTPUT[1], dtype=np.float32).tobytes()


class CannedServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Answers `mlp` batch-1 requests with zeros; metadata and config as adaserve reports them for the example."""

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerReadyResponse(ready=True)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerMetadataResponse(name="grpc-floor", version="0")

    async def ModelReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ModelReadyResponse(ready=request.name == MODEL)

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        tensor = service_pb2.ModelMetadataResponse.TensorMetadata
        return service_pb2.ModelMetadataResponse(
            name=MODEL,
            versions=["1"],
            platform="pytorch",
            inputs=[tensor(name=INPUT[0], datatype="FP32", shape=[-1, INPUT[1]])],
            outputs=[tensor(name=OUTPUT[0], datatype="FP32", shape=[-1, OUTPUT[1]])],
        )

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        config = model_config_pb2.ModelConfig(name=MODEL, max_batch_size=16, platform="pytorch")
        config.input.add(name=INPUT[0], data_type=model_config_pb2.TYPE_FP32, dims=[INPUT[1]])
        config.output.add(name=OUTPUT[0], data_type=model_config_pb2.TYPE_FP32, dims=[OUTPUT[1]])
        return service_pb2.ModelConfigResponse(config=config)

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        response = service_pb2.ModelInferResponse(model_name=MODEL, model_version="1", id=request.id)
        response.outputs.add(name=OUTPUT[0], datatype="FP32", shape=[1, OUTPUT[1]])
        response.raw_output_contents.append(ANSWER)
        return response


async def serve(port: int) -> None:
    """Serve on 127.0.0.1:`port` on uvloop, as adaserve's front end runs, until terminated."""
    server = grpc.aio.server()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(CannedServicer(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    serve_on_port(serve, __doc__)
