"""The floor under any REST server's latency on this machine: an HTTP/1.1 server on uvloop that answers every
Open Inference Protocol call perf_analyzer makes for the example `mlp` with canned bytes, parsing nothing it does
not have to and running no model.

`benchmarks.latency_profile` measures it beside adaserve with the same perf_analyzer settings. Its latency at a
given offered load against its own closed loop at concurrency 1 is what the machine (a CPU woken from idle, the
client's own timers) adds at low load before any server's code runs.

    .venv/bin/python -m benchmarks.rest_floor --port PORT     # 127.0.0.1 only
"""

from __future__ import annotations

import asyncio
import json

from benchmarks.common import serve_on_port

MODEL = "mlp"
INPUT, OUTPUT = ("image", 784), ("logits", 10)


def _json(value: object) -> bytes:
    body = json.dumps(value).encode()
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


_STATISTICS = {
    key: {"count": 0, "ns": 0}
    for key in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")
}
#: Path → the whole answer; the inference answer is the same zeros for every request (JSON output, as adaserve
#: answers a perf_analyzer request that asks for no binary output).
ANSWERS = {
    "/v2": _json({"name": "rest-floor", "version": "0", "extensions": []}),
    "/v2/health/ready": _json({"ready": True}),
    f"/v2/models/{MODEL}": _json(
        {
            "name": MODEL,
            "versions": ["1"],
            "platform": "pytorch",
            "inputs": [{"name": INPUT[0], "datatype": "FP32", "shape": [-1, INPUT[1]]}],
            "outputs": [{"name": OUTPUT[0], "datatype": "FP32", "shape": [-1, OUTPUT[1]]}],
        }
    ),
    f"/v2/models/{MODEL}/config": _json(
        {
            "name": MODEL,
            "platform": "pytorch",
            "max_batch_size": 16,
            "input": [{"name": INPUT[0], "data_type": "TYPE_FP32", "dims": [INPUT[1]]}],
            "output": [{"name": OUTPUT[0], "data_type": "TYPE_FP32", "dims": [OUTPUT[1]]}],
        }
    ),
    f"/v2/models/{MODEL}/stats": _json(
        {"model_stats": [{"name": MODEL, "version": "1", "inference_stats": _STATISTICS, "batch_stats": []}]}
    ),
    f"/v2/models/{MODEL}/infer": _json(
        {
            "model_name": MODEL,
            "model_version": "1",
            "outputs": [{"name": OUTPUT[0], "datatype": "FP32", "shape": [1, OUTPUT[1]], "data": [0.0] * OUTPUT[1]}],
        }
    ),
}
NOT_FOUND = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"


class CannedProtocol(asyncio.Protocol):
    """Keep-alive HTTP/1.1 with content-length bodies (what perf_analyzer sends): each request answered whole."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.WriteTransport = transport  # type: ignore[assignment]  # a TCP server's transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            head = self.buffer[:end].decode("latin-1").split("\r\n")
            length = next(
                (int(line.split(":", 1)[1]) for line in head[1:] if line.lower().startswith("content-length:")), 0
            )
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length :]
            path = head[0].split(" ")[1].split("?")[0].replace("/versions/1", "")
            self.transport.write(ANSWERS.get(path, NOT_FOUND))


async def serve(port: int) -> None:
    """Serve on 127.0.0.1:`port` until terminated."""
    server = await asyncio.get_running_loop().create_server(CannedProtocol, "127.0.0.1", port)
    await server.serve_forever()


if __name__ == "__main__":
    serve_on_port(serve, __doc__)
