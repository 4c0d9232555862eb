"""Forwarding a request to the node that holds its model, its bytes unchanged, over kept-alive HTTP/1.1.

REST: the request's body goes as it came (compressed or not, JSON or binary tensors), with the headers that shape
it, on a kept-alive connection to the other node (`adaserve.bench.http1`'s pool: one write, one parse); the answer
comes back as it left that node. gRPC: the request's bytes as they were received (the inference RPCs take raw
bytes, `server/grpc_service.py`) go on the same pool to the holder's internal endpoint `POST /_adaserve/grpc/{rpc}`
on its REST port, the call's metadata as `grpc-metadata-*` headers; the holder runs the servicer's own method on
them (`InferenceServicer.relayed_call`) and answers the answer's bytes (200), or the call's gRPC status and message
(`{"error": ..., "grpc_status": code}`), which the forwarding node answers its caller as they are. Nothing is
decoded and encoded again: forwarding costs the copies and a hop, not the tensors' conversion. A traced request goes
with the W3C trace context of its forward (`traceparent`, as a header or as metadata), in place of any its caller
sent: the holder traces it as the forward's child (`adaserve.server.trace`).

Not a grpc.aio channel: in the forwarding node's process grpc.aio's client machinery (the call objects, its
completion queue polled from a thread, the callbacks onto the event loop) cost more than the request's own serving,
67-90% of a served request's CPU, where the same bytes over the HTTP/1.1 pool cost the write and one parse.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence

import grpc

from adaserve.server.http_client import ConnectionPool
from adaserve.server.http_client import Response as Answer
from adaserve.distributed.messages import NodeAddress
from adaserve.errors import AdaserveError, ModelNotReadyError
from adaserve.server.grpc_service import RELAYED
from adaserve.server.http import Handler, Request, Response
from adaserve.server.rest import error_response, json_response
from adaserve.server.restrictions import Restrictions
from adaserve.server.trace import FORWARDED, TRACE_CONTEXT

#: The header (REST) and metadata key (gRPC) a forwarded request carries: how many times it was forwarded (the
#: tracer knows a forwarded request by it: its trace context is the forwarding node's).
HOPS = FORWARDED
#: The request headers that travel with a forwarded body.
FORWARDED_HEADERS = ("content-type", "content-encoding", "inference-header-content-length", "accept-encoding")
#: How long a forwarded request may take end to end.
FORWARD_TIMEOUT_S = 300.0
#: The holder's endpoint for a relayed gRPC call, the RPC's name after it: only node servers call it.
GRPC_PATH = "/_adaserve/grpc/"
#: A relayed call's metadata travel as headers with this prefix (so no key can be taken for one of HTTP's own).
METADATA_PREFIX = "grpc-metadata-"
#: gRPC metadata that is the transport's, not the caller's, or the forwarding node's to set: not forwarded as given.
_TRANSPORT_METADATA = (
    "user-agent",
    "content-type",
    "te",
    "grpc-accept-encoding",
    "grpc-encoding",
    "grpc-timeout",
    HOPS,
    *TRACE_CONTEXT,
)
#: The gRPC status of a refusal the holder's HTTP layer answers itself, before the endpoint (else INTERNAL).
_HTTP_LAYER_CODES = {413: grpc.StatusCode.RESOURCE_EXHAUSTED, 503: grpc.StatusCode.UNAVAILABLE}
_CODES = {code.value[0]: code for code in grpc.StatusCode}

Metadata = Sequence[tuple[str, str | bytes]]


class ForwardFailed(ModelNotReadyError):
    """The node a request was forwarded to did not answer (a 503 / UNAVAILABLE that names it)."""


class ForwardTimedOut(ForwardFailed):
    """The node a request was forwarded to did not answer within FORWARD_TIMEOUT_S."""


class RemoteError(AdaserveError):
    """The node a gRPC request was forwarded to answered it with an error: passed on with its code and message."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.grpc_status = code.name


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
    ) -> tuple[int, dict[str, str], bytes]:
        """Send the request to `node` as it came, with the headers `extra` (its hops, its trace context) and the
        restriction header of its API `category` if it has one; its answer's status, headers (lower-case) and
        body."""
        lines = [f"{method} {path} HTTP/1.1", f"host: {node.http}", f"content-length: {len(body)}"]
        lines += [f"{name}: {value}" for name, value in extra.items()]
        lines += [f"{name}: {headers[name]}" for name in FORWARDED_HEADERS if name in headers]
        credential = self.credentials.required.get(category)
        if credential is not None:
            lines.append(f"{credential.name}: {credential.value}")
        answer = await self._request(node, lines, body)
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
        self, node: NodeAddress, rpc: str, raw: bytes, metadata: Metadata, extra: Mapping[str, str]
    ) -> bytes:
        """A unary call's request bytes to `node`'s `rpc`, with the caller's `metadata` (less its hops and trace
        context) and the forwarding node's `extra` (its hops, its trace context); the answer's bytes. An error
        the node answers is raised as a RemoteError with its code and message; a node that cannot be reached, or
        answers UNAVAILABLE (not ready there: another replica may be), is a ForwardFailed."""
        lines = [f"POST {GRPC_PATH}{rpc} HTTP/1.1", f"host: {node.http}", f"content-length: {len(raw)}"]
        lines += [_metadata_line(key, value) for key, value in metadata if key not in _TRANSPORT_METADATA]
        lines += [_metadata_line(key, value) for key, value in extra.items()]
        try:
            answer = await self._request(node, lines, raw)
        except ForwardTimedOut as exc:  # a deadline, as a channel's call has it: not sent again
            raise RemoteError(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc)) from None
        if answer.status == 200:
            return answer.body
        code, message = _grpc_error(answer)
        if code == grpc.StatusCode.UNAVAILABLE:
            raise ForwardFailed(f"node {node.http} did not answer the forwarded request: {message}")
        raise RemoteError(code, message)

    async def _request(self, node: NodeAddress, lines: list[str], body: bytes) -> Answer:
        """One request, its head's `lines` and `body`, to `node`'s REST port, on a kept-alive connection."""
        pool = self._pools.get(node.http)
        if pool is None:
            host, port = node.http.rsplit(":", 1)
            pool = self._pools[node.http] = ConnectionPool(host, int(port), FORWARD_TIMEOUT_S)
        try:
            return await pool.request(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        except TimeoutError:
            raise ForwardTimedOut(f"node {node.http} did not answer within {FORWARD_TIMEOUT_S:g} s") from None
        except OSError as exc:
            raise ForwardFailed(f"node {node.http} did not answer the forwarded request: {exc}") from None

    async def close(self) -> None:
        await asyncio.gather(*(pool.close() for pool in self._pools.values()))
        self._pools.clear()


def _metadata_line(key: str, value: str | bytes) -> str:
    """A metadata entry as a header line; a binary one (`-bin`) in base64, as gRPC sends it."""
    text = base64.b64encode(value).decode("ascii") if isinstance(value, bytes) else value
    if "\r" in text or "\n" in text:  # no line of the caller's may end the header early
        raise RemoteError(grpc.StatusCode.INVALID_ARGUMENT, f"metadata '{key}' holds a line break")
    return f"{METADATA_PREFIX}{key}: {text}"


def _grpc_error(answer: Answer) -> tuple[grpc.StatusCode, str]:
    """The gRPC status and message of a call the holder refused: the endpoint's, or its HTTP layer's refusal."""
    try:
        document = json.loads(answer.body)
        message = str(document["error"])
    except (ValueError, KeyError, TypeError):
        return grpc.StatusCode.INTERNAL, f"HTTP {answer.status}: {answer.body[:200]!r}"
    code = _CODES.get(document.get("grpc_status"), _HTTP_LAYER_CODES.get(answer.status, grpc.StatusCode.INTERNAL))
    return code, message


# -- the holder's end ------------------------------------------------------------------------------------------------
#: Runs a relayed call on this node's gRPC servicer (`InferenceServicer.relayed_call`).
RelayedCall = Callable[[str, bytes, "_ForwardedCall"], Awaitable[bytes]]


def grpc_route(relayed_call: RelayedCall) -> tuple[str, str, Handler]:
    """The route `POST /_adaserve/grpc/{rpc}` (`create_app`'s `internal`): the call run by this node's servicer, as
    if it had come to its gRPC port with the metadata the headers carry (its restrictions checked on them, its trace
    context taken)."""

    async def endpoint(request: Request) -> Response:
        rpc = request.params["rpc"]
        if rpc not in RELAYED:
            return error_response(404, f"no relayed gRPC call named '{rpc}'")
        try:
            answer = await relayed_call(rpc, request.body, _ForwardedCall(request.headers))
        except _Aborted as aborted:  # the HTTP status says it failed; the body says how
            return json_response({"error": aborted.message, "grpc_status": aborted.code.value[0]}, 500)
        return Response(200, answer, "application/x-protobuf")

    return "POST", GRPC_PATH + "{rpc}", endpoint


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


class _ForwardedCall:
    """The servicer's context for a relayed call: the metadata it was forwarded with; an abort ends it with its
    status (the servicer's methods use no more of a context)."""

    def __init__(self, headers: Mapping[str, str]) -> None:
        cut = len(METADATA_PREFIX)
        self._metadata = tuple(
            (name[cut:], base64.b64decode(value) if name.endswith("-bin") else value)
            for name, value in headers.items()
            if name.startswith(METADATA_PREFIX)
        )

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self._metadata

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise _Aborted(code, details)
