"""Forwarding a request to the node that holds its model, its bytes unchanged.

REST: the request's body goes as it came (compressed or not, JSON or binary tensors), with the headers that shape
it, on a kept-alive connection to the other node (`adaserve.bench.http1`'s pool: one write, one parse); the answer
comes back as it left that node. gRPC: the request's bytes as they were received (the inference RPCs take raw
bytes, `server/grpc_service.py`) on one channel per node, the answer's bytes relayed as they are. Nothing is decoded
and encoded again: forwarding costs the copies and a hop, not the tensors' conversion.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import grpc

from adaserve.bench.http1 import ConnectionPool
from adaserve.distributed.messages import NodeAddress
from adaserve.errors import AdaserveError, ModelNotReadyError

#: The request headers that travel with a forwarded body.
FORWARDED_HEADERS = ("content-type", "content-encoding", "inference-header-content-length", "accept-encoding")
#: How long a forwarded request may take end to end.
FORWARD_TIMEOUT_S = 300.0
#: gRPC metadata that is the transport's, not the caller's: not forwarded.
_TRANSPORT_METADATA = ("user-agent", "content-type", "te", "grpc-accept-encoding", "grpc-encoding", "grpc-timeout")


class ForwardFailed(ModelNotReadyError):
    """The node a request was forwarded to did not answer (a 503 / UNAVAILABLE that names it)."""


class RemoteError(AdaserveError):
    """The node a gRPC request was forwarded to answered it with an error: passed on with its code and message."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.grpc_code = code


class Forwarder:
    """Kept-alive connections to the other nodes, REST and gRPC, opened on first use."""

    def __init__(self, max_message_bytes: int) -> None:
        self._pools: dict[str, ConnectionPool] = {}
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._max_message_bytes = max_message_bytes

    async def http(
        self, node: NodeAddress, method: str, path: str, headers: Mapping[str, str], body: bytes, extra: str
    ) -> tuple[int, dict[str, str], bytes]:
        """Send the request to `node` as it came, with the header lines `extra`; its answer's status, headers
        (lower-case) and body."""
        pool = self._pools.get(node.http)
        if pool is None:
            host, port = node.http.rsplit(":", 1)
            pool = self._pools[node.http] = ConnectionPool(host, int(port), FORWARD_TIMEOUT_S)
        lines = [f"{method} {path} HTTP/1.1", f"host: {node.http}", f"content-length: {len(body)}", extra]
        lines += [f"{name}: {headers[name]}" for name in FORWARDED_HEADERS if name in headers]
        try:
            answer = await pool.request(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        except OSError as exc:
            raise ForwardFailed(f"node {node.http} did not answer the forwarded request: {exc}") from None
        out = {"content-type": "application/json"}
        if answer.header_length is not None:
            out = {
                "content-type": "application/octet-stream",
                "inference-header-content-length": str(answer.header_length),
            }
        if answer.content_encoding is not None:
            out["content-encoding"] = answer.content_encoding
        return answer.status, out, answer.body

    async def grpc(
        self, node: NodeAddress, method: str, raw: bytes, metadata: tuple[tuple[str, str | bytes], ...]
    ) -> bytes:
        """A unary call's request bytes to `node`'s `method` (its full path); the answer's bytes. An error the node
        answers is raised as a RemoteError with its code and message; a node that cannot be reached is a
        ForwardFailed."""
        channel = self._channels.get(node.grpc)
        if channel is None:
            options = [
                ("grpc.max_send_message_length", self._max_message_bytes),
                ("grpc.max_receive_message_length", -1),
            ]
            channel = self._channels[node.grpc] = grpc.aio.insecure_channel(node.grpc, options=options)
        call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        sent = tuple((key, value) for key, value in metadata if key not in _TRANSPORT_METADATA)
        try:
            answer: bytes = await call(raw, metadata=sent, timeout=FORWARD_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE:  # unreachable, or not ready there: another replica may be
                raise ForwardFailed(f"node {node.grpc} did not answer the forwarded request: {exc.details()}") from None
            raise RemoteError(exc.code(), exc.details() or exc.code().name) from None
        return answer

    async def close(self) -> None:
        await asyncio.gather(*(pool.close() for pool in self._pools.values()))
        await asyncio.gather(*(channel.close() for channel in self._channels.values()))
        self._pools.clear()
        self._channels.clear()
