"""The gRPC frontend in a process of its own (`--grpc-frontend process`): a grpc.aio server that relays every call,
as its bytes, to the engine's process over a Unix socket (`server/grpc_relay.py`), and answers what comes back.

Why a process: inline, grpc.aio's Cython and its event-engine thread share the engine's process and its GIL (on a
2-core VM adaserve's gRPC served 0.38x REST's requests a second at 8 clients, its main thread 71% busy, 68% of that
in grpc.aio). Here grpc.aio has a process and a GIL to itself. The price is a hop: on that 2-core VM, where the
frontend's process has no core of its own, it served 0.74-0.89x inline's requests a second at 8 clients and took
1.12-1.32x its p50 at one, so `--grpc-frontend auto` keeps gRPC inline there (`grpc_frontend_mode`).

Its handlers take and return bytes (no (de)serializers) for every method of `inference.GRPCInferenceService` and
of `grpc.health.v1.Health`; all that belongs to the socket is here (TLS, the message-size limit, compression of the
answers, the connection count, the handshake and idle timeouts, SO_REUSEPORT), the rest is the engine's: the
restrictions are checked there on the relayed metadata, and errors come back with their status and message. A call
the client cancels, or whose deadline passes, is cancelled here, which closes its connection to the engine, which
stops the request. It imports no torch and no engine (a frontend's memory is a server's memory).

`server/grpc_process.py` starts it (`python -m adaserve.server.grpc_frontend SETTINGS`), restarts it and stops it:
it writes a line on stdout once it listens, stops within `STOP_GRACE_S` on SIGTERM or SIGINT, and stops when its
stdin closes (the engine's process is gone), removing the socket's directory the engine could not. Each line on its
stdin is the server's log settings (Triton's names, `adaserve.logs.LevelSwitches`), the first before it listens:
it logs as the server does, each relayed call at debug.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import grpc
from grpc_health.v1 import health_pb2

from adaserve.arguments import PROCESS_FRONTEND_CORES
from adaserve.collector import freeze_startup_heap
from adaserve.logs import SWITCHES, configure_logging
from adaserve.server.content_coding import GRPC_COMPRESSION_LEVELS
from adaserve.server.grpc_relay import RemoteError, relayed_answer, relayed_request
from adaserve.server.grpc_stream import stream_answers
from adaserve.server.health import watch
from adaserve.server.http_client import ConnectionPool
from adaserve.server.limits import ClientLimits
from adaserve.server.protos import grpc_service_pb2 as service_pb2
from adaserve.server.tls import TlsSettings

log = logging.getLogger("adaserve.grpc")

#: How long calls in progress may take to finish once the frontend is told to stop (the REST frontend's, too).
STOP_GRACE_S = 5.0
#: How long a relayed call may take: a call has the deadline its client gives it, at which it is cancelled here.
RELAY_TIMEOUT_S = 24 * 3600.0
#: The services relayed, and their methods' kinds: unary unless named here.
SERVICES = {
    "inference.GRPCInferenceService": [
        m.name for m in service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods
    ],
    "grpc.health.v1.Health": ["Check", "Watch"],
}
STREAM_STREAM, UNARY_STREAM = ("ModelStreamInfer",), ("Watch",)

GrpcFrontendMode = Literal["inline", "process", "auto"]


def grpc_frontend_mode(mode: GrpcFrontendMode) -> Literal["inline", "process"]:
    """The frontend `--grpc-frontend` asks for; `auto` by the cores this process may use."""
    if mode != "auto":
        return mode
    return "process" if len(os.sched_getaffinity(0)) >= PROCESS_FRONTEND_CORES else "inline"


def grpc_server_options(
    message_bytes: int, limits: ClientLimits, reuse_port: bool, compression_level: str
) -> list[tuple[str, int]]:
    """The grpc.aio server's options, inline or in this process: what belongs to the socket."""
    return [
        ("grpc.max_receive_message_length", message_bytes),
        ("grpc.max_send_message_length", -1),
        ("grpc.so_reuseport", int(reuse_port)),  # gRPC's default is 1: a taken port must fail
        ("grpc.max_allowed_incoming_connections", limits.max_connections),
        ("grpc.server_handshake_timeout_ms", int(limits.header_timeout_s * 1000)),
        ("grpc.max_connection_idle_ms", int(limits.idle_timeout_s * 1000)),
        # gRPC picks an algorithm the client accepts for the level, per call
        ("grpc.default_compression_level", GRPC_COMPRESSION_LEVELS.index(compression_level)),
    ]


@dataclass(frozen=True)
class FrontendSettings:
    """What the engine's process tells the frontend's (its one argument, as JSON)."""

    address: str  # host:port to listen on
    engine: str  # the engine's Unix socket (`grpc_process.py`)
    options: list[tuple[str, int]]  # `grpc_server_options`
    tls: TlsSettings | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), default=str)

    @classmethod
    def from_json(cls, text: str) -> FrontendSettings:
        document = json.loads(text)
        tls = document["tls"]
        return cls(
            address=document["address"],
            engine=document["engine"],
            options=[(name, value) for name, value in document["options"]],
            tls=None
            if tls is None
            else TlsSettings(
                Path(tls["cert"]), Path(tls["key"]), Path(tls["root"]) if tls["root"] else None, tls["mutual"]
            ),
        )


class RelayHandler(grpc.GenericRpcHandler):
    """A handler of bytes for each method of `SERVICES`, which relays the call to the engine."""

    def __init__(self, engine: str) -> None:
        self.pool = ConnectionPool("localhost", 0, RELAY_TIMEOUT_S, unix=engine)
        self._handlers = {
            f"/{service}/{method}": self._handler(method) for service, methods in SERVICES.items() for method in methods
        }

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return self._handlers.get(handler_call_details.method)

    def _handler(self, rpc: str) -> grpc.RpcMethodHandler:
        if rpc in STREAM_STREAM:
            return grpc.stream_stream_rpc_method_handler(self._stream(rpc))
        if rpc in UNARY_STREAM:
            return grpc.unary_stream_rpc_method_handler(self._watch(rpc))

        async def unary(raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
            async with _ending_on_errors(context):
                return await self.relay(rpc, raw, context)
            raise AssertionError("unreachable: an error aborts the call")

        return grpc.unary_unary_rpc_method_handler(unary)

    def _stream(self, rpc: str) -> Any:
        """ModelStreamInfer: each request relayed as it is read (a failed one is answered in the stream, by the
        engine); a call refused its restricted category, or the engine gone, ends the stream."""

        async def stream(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            async with _ending_on_errors(context):
                async for answer in stream_answers(requests, lambda raw: self.relay(rpc, raw, context)):
                    yield answer

        return stream

    def _watch(self, rpc: str) -> Any:
        """Health's Watch: the status read from the engine every `WATCH_PERIOD_S`, written when it changes."""

        async def watched(raw: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            async def status() -> int:
                return int(health_pb2.HealthCheckResponse.FromString(await self.relay(rpc, raw, context)).status)

            async with _ending_on_errors(context):
                async for answer in watch(status):
                    yield answer.SerializeToString()

        return watched

    async def relay(self, rpc: str, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """The call's answer from the engine; RemoteError with the status its error, or the engine's absence,
        ends the call with."""
        request = relayed_request(rpc, "engine", raw, context.invocation_metadata() or ())
        log.debug("relaying a gRPC call to the engine", extra={"rpc": rpc})
        try:
            answer = await self.pool.request(*request)
        except (OSError, TimeoutError, ValueError) as exc:
            raise RemoteError(grpc.StatusCode.UNAVAILABLE, f"the server's engine did not answer: {exc}") from None
        return relayed_answer(answer)


@contextlib.asynccontextmanager
async def _ending_on_errors(context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
    """A RemoteError ends the call with its status and message (aborted outside the `except`, so the exception
    `abort` raises does not hold the failed request's frames)."""
    try:
        yield
    except RemoteError as exc:
        status = exc.grpc_code, str(exc)
    else:
        return
    await context.abort(*status)


async def serve(settings: FrontendSettings) -> None:
    """Take the log settings, listen, say so on stdout, and relay calls until told to stop."""
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    if not await _take_log_settings(stdin):  # the engine's process ended before it said how to log
        shutil.rmtree(Path(settings.engine).parent, ignore_errors=True)
        return
    handler = RelayHandler(settings.engine)
    server = grpc.aio.server(options=settings.options)
    server.add_generic_rpc_handlers((handler,))
    try:
        if settings.tls is None:
            server.add_insecure_port(settings.address)
        else:
            server.add_secure_port(settings.address, settings.tls.grpc_credentials())
    except RuntimeError:  # grpcio gives no reason: its C core logs one
        print(f"cannot listen for gRPC on {settings.address}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    await server.start()
    freeze_startup_heap()
    print("listening", flush=True)

    stopping = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    orphaned = loop.create_task(_follow_log_settings(stdin))
    await asyncio.wait([loop.create_task(stopping.wait()), orphaned], return_when=asyncio.FIRST_COMPLETED)
    await server.stop(grace=STOP_GRACE_S)
    await handler.pool.close()
    if orphaned.done():  # the engine's process is gone (killed, say) and cannot remove its socket's directory
        shutil.rmtree(Path(settings.engine).parent, ignore_errors=True)


async def _take_log_settings(stdin: asyncio.StreamReader) -> bool:
    """Log as the next line of `stdin` says; False when stdin has closed: the engine's process, which holds its
    other end, is gone."""
    line = await stdin.readline()
    if line:
        SWITCHES.update(json.loads(line))
    return bool(line)


async def _follow_log_settings(stdin: asyncio.StreamReader) -> None:
    """Log as each line of `stdin` says; returns when it closes."""
    while await _take_log_settings(stdin):
        pass


def main() -> None:
    import uvloop

    settings = FrontendSettings.from_json(sys.argv[1])
    configure_logging()
    uvloop.run(serve(settings))


if __name__ == "__main__":
    main()
