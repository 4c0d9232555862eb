"""Forwarding a request to the node that holds its model, its bytes unchanged, over kept-alive HTTP/1.1.

REST: the request's body goes as it came (compressed or not, JSON or binary tensors), with the headers that shape
it, on a kept-alive connection to the other node (`adaserve.server.http_client`'s pool: one write, one parse); the
answer comes back as it left that node. gRPC: the request's bytes as they were received (the inference RPCs take
raw bytes, `server/grpc_service.py`) go on the same pool to the holder's internal endpoint for relayed calls on its
REST port (`server/grpc_relay.py`: the wire, and why not a grpc.aio channel); the holder runs the servicer's own
method on them and answers the answer's bytes, or the call's gRPC status and message, which the forwarding node
answers its caller as they are. A traced request goes with the W3C trace context of its forward (`traceparent`, as
a header or as metadata), in place of any its caller sent: the holder traces it as the forward's child
(`adaserve.server.trace`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import grpc

from adaserve.distributed.messages import NodeAddress
from adaserve.errors import ModelNotReadyError
from adaserve.server.grpc_relay import Metadata, RemoteError, relayed_answer, relayed_request
from adaserve.server.http import Request
from adaserve.server.http_client import ConnectionPool, OnAnswer
from adaserve.server.http_client import Response as Answer
from adaserve.server.restrictions import Restrictions
from adaserve.server.trace import FORWARDED, TRACE_CONTEXT

#: The header (REST) and metadata key (gRPC) a forwarded request carries: how many times it was forwarded (the
#: tracer knows a forwarded request by it: its trace context is the forwarding node's).
HOPS = FORWARDED
#: The request headers that travel with a forwarded body.
FORWARDED_HEADERS = ("content-type", "content-encoding", "inference-header-content-length", "accept-encoding")
#: How long a forwarded request may take end to end.
FORWARD_TIMEOUT_S = 300.0
#: A call's metadata that are the forwarding node's to set (`extra`), not forwarded as the caller gave them.
_FORWARDERS_METADATA = (HOPS, *TRACE_CONTEXT)


#: A forwarded REST request's answer: its status, headers (lower-case) and body.
Relayed = tuple[int, dict[str, str], bytes]


def relayed(answer: Answer) -> Relayed:
    """The status, headers and body to answer a forwarded REST request's client with, from its holder's answer."""
    headers = {"content-type": "application/json"}
    if answer.header_length is not None:
        headers = {
            "content-type": "application/octet-stream",
            "inference-header-content-length": str(answer.header_length),
        }
    if answer.content_encoding is not None:
        headers["content-encoding"] = answer.content_encoding
    return answer.status, headers, answer.body


class ForwardFailed(ModelNotReadyError):
    """The node a request was forwarded to did not answer (a 503 / UNAVAILABLE that names it)."""


class ForwardTimedOut(ForwardFailed):
    """The node a request was forwarded to did not answer within FORWARD_TIMEOUT_S."""


class Forwarder:
    """Kept-alive connections to the other nodes' REST ports, opened on first use.

    `credentials`: the REST frontend's restrictions, which every node of a cluster shares (they run with the same
    flags). A request of a restricted category carries its header to the other node: the client's was checked here,
    where it arrived, and a node's own questions (statistics, metrics) have no client header to pass on."""

    def __init__(self, credentials: Restrictions | None = None) -> None:
        self.credentials = credentials or Restrictions()
        self._pools: dict[str, ConnectionPool] = {}

    async def http(
        self,
        node: NodeAddress,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes,
        extra: Mapping[str, str],
        category: str,
    ) -> Relayed:
        """Send the request to `node` as it came, with the headers `extra` (its hops, its trace context) and the
        restriction header of its API `category` if it has one; its answer's status, headers (lower-case) and
        body."""
        head = self._head(node, method, path, headers, len(body), extra, category)
        return relayed(await self._request(node, head, body))

    def http_now(
        self, node: NodeAddress, request: Request, extra: Mapping[str, str], on_answer: OnAnswer
    ) -> Callable[[], None] | None:
        """`http` for a client's inference `request`, with neither a coroutine nor a future, on a connection to
        `node` already open and idle (None, having sent nothing, when there is none): `on_answer` gets the holder's
        answer (`relayed` gives the status, headers and body) or the error that means it was not answered
        (StaleConnection: safe to send again). Returns what to call when nobody waits for the answer any more (it
        closes the connection, so `node` stops working on it)."""
        pool = self._pools.get(node.http)
        if pool is None:
            return None
        body = request.body
        head = self._head(node, request.method, request.path, request.headers, len(body), extra, "inference")
        connection = pool.send_now(head, body, on_answer)
        if connection is None:
            return None
        return lambda: connection.fail(ConnectionAbortedError("the forwarded request's client went away"))

    def _head(
        self,
        node: NodeAddress,
        method: str,
        path: str,
        headers: Mapping[str, str],
        length: int,
        extra: Mapping[str, str],
        category: str,
    ) -> bytes:
        head = f"{method} {path} HTTP/1.1\r\nhost: {node.http}\r\ncontent-length: {length}\r\n"
        for name, value in extra.items():
            head += f"{name}: {value}\r\n"
        for name in FORWARDED_HEADERS:
            if name in headers:
                head += f"{name}: {headers[name]}\r\n"
        credential = self.credentials.required.get(category)
        if credential is not None:
            head += f"{credential.name}: {credential.value}\r\n"
        return (head + "\r\n").encode("latin-1")

    async def grpc(
        self, node: NodeAddress, rpc: str, raw: bytes, metadata: Metadata, extra: Mapping[str, str]
    ) -> bytes:
        """A unary call's request bytes to `node`'s `rpc`, with the caller's `metadata` (less its hops and trace
        context) and the forwarding node's `extra` (its hops, its trace context); the answer's bytes. An error
        the node answers is raised as a RemoteError with its code and message; a node that cannot be reached, or
        answers UNAVAILABLE (not ready there: another replica may be), is a ForwardFailed."""
        sent = [(key, value) for key, value in metadata if key not in _FORWARDERS_METADATA]
        try:
            answer = await self._request(node, *relayed_request(rpc, node.http, raw, [*sent, *extra.items()]))
        except ForwardTimedOut as exc:  # a deadline, as a channel's call has it: not sent again
            raise RemoteError(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc)) from None
        try:
            return relayed_answer(answer)
        except RemoteError as exc:
            if exc.grpc_code == grpc.StatusCode.UNAVAILABLE:
                raise ForwardFailed(f"node {node.http} did not answer the forwarded request: {exc}") from None
            raise

    async def _request(self, node: NodeAddress, head: bytes, body: bytes) -> Answer:
        """One request, its `head` and `body` (as it came), to `node`'s REST port, on a kept-alive connection."""
        pool = self._pools.get(node.http)
        if pool is None:
            host, port = node.http.rsplit(":", 1)
            pool = self._pools[node.http] = ConnectionPool(host, int(port), FORWARD_TIMEOUT_S)
        try:
            return await pool.request(head, body)
        except TimeoutError:
            raise ForwardTimedOut(f"node {node.http} did not answer within {FORWARD_TIMEOUT_S:g} s") from None
        except OSError as exc:
            raise ForwardFailed(f"node {node.http} did not answer the forwarded request: {exc}") from None

    async def close(self) -> None:
        await asyncio.gather(*(pool.close() for pool in self._pools.values()))
        self._pools.clear()
