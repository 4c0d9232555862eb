"""A gRPC call relayed over HTTP/1.1 as its bytes, to a servicer in another process: both ends of the wire.

Two relays use it. On a cluster, a node forwards a call for a model held elsewhere to the holder's REST port
(`adaserve.distributed.forward`). With `--grpc-frontend process`, the gRPC frontend's own process relays every call
to the engine's process over a Unix socket (`server/grpc_frontend.py`, `server/grpc_process.py`).

The wire: `POST /_adaserve/grpc/{rpc}`, the body the request message's bytes as the caller sent them, the call's
metadata as `grpc-metadata-*` headers (`-bin` values in base64, as gRPC sends them); the answer is the answer's
bytes (200), or the call's gRPC status and message (`{"error": ..., "grpc_status": code}`), which the relaying end
answers its caller as they are. Nothing is decoded and encoded again: a relay costs the copies and a hop, not the
tensors' conversion. A relay that is cancelled (its caller went away) closes its connection, and the serving end
stops the call (`server/http.py` cancels a request whose connection is lost).

Not a grpc.aio channel: in the relaying process grpc.aio's client machinery (the call objects, its completion
queue polled from a thread, the callbacks onto the event loop) cost more than the request's own serving, 67-90% of
a served request's CPU, where the same bytes over the HTTP/1.1 pool cost the write and one parse.

This module imports neither torch nor the engine: the gRPC frontend's process uses it.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence

import grpc

from adaserve.errors import AdaserveError
from adaserve.server.http import Handler, Request, Response
from adaserve.server.http_client import Response as Answer

log = logging.getLogger("adaserve.grpc")

#: The serving end's endpoint for a relayed gRPC call, the RPC's name after it.
GRPC_PATH = "/_adaserve/grpc/"
#: A relayed call's metadata travel as headers with this prefix (so no key can be taken for one of HTTP's own).
METADATA_PREFIX = "grpc-metadata-"
#: gRPC metadata that is the transport's, not the caller's: not relayed.
_TRANSPORT_METADATA = ("user-agent", "content-type", "te", "grpc-accept-encoding", "grpc-encoding", "grpc-timeout")
#: The gRPC status of a refusal the serving end's HTTP layer answers itself, before the endpoint (else INTERNAL).
_HTTP_LAYER_CODES = {413: grpc.StatusCode.RESOURCE_EXHAUSTED, 503: grpc.StatusCode.UNAVAILABLE}
_CODES = {code.value[0]: code for code in grpc.StatusCode}

Metadata = Sequence[tuple[str, str | bytes]]


class RemoteError(AdaserveError):
    """The serving end answered a relayed call with an error: passed on with its code and message."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.grpc_status = code.name


# -- the relaying end ------------------------------------------------------------------------------------------------
def relayed_request(rpc: str, host: str, raw: bytes, metadata: Metadata) -> tuple[bytes, bytes]:
    """The HTTP request that relays a call of `rpc` with its request's bytes `raw` and the caller's `metadata`: its
    head and its body (`raw` itself, which `ConnectionPool.request` writes after the head without copying it)."""
    lines = [f"POST {GRPC_PATH}{rpc} HTTP/1.1", f"host: {host}", f"content-length: {len(raw)}"]
    lines += [_metadata_line(key, value) for key, value in metadata if key not in _TRANSPORT_METADATA]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"), raw


def relayed_answer(answer: Answer) -> bytes:
    """The answer's bytes of a relayed call; RemoteError with the call's status and message when it failed."""
    if answer.status == 200:
        return answer.body
    try:
        document = json.loads(answer.body)
        message = str(document["error"])
    except (ValueError, KeyError, TypeError):
        raise RemoteError(grpc.StatusCode.INTERNAL, f"HTTP {answer.status}: {answer.body[:200]!r}") from None
    code = _CODES.get(document.get("grpc_status"), _HTTP_LAYER_CODES.get(answer.status, grpc.StatusCode.INTERNAL))
    raise RemoteError(code, message)


def _metadata_line(key: str, value: str | bytes) -> str:
    """A metadata entry as a header line; a binary one (`-bin`) in base64, as gRPC sends it."""
    text = base64.b64encode(value).decode("ascii") if isinstance(value, bytes) else value
    if "\r" in text or "\n" in text:  # no line of the caller's may end the header early
        raise RemoteError(grpc.StatusCode.INVALID_ARGUMENT, f"metadata '{key}' holds a line break")
    return f"{METADATA_PREFIX}{key}: {text}"


# -- the serving end -------------------------------------------------------------------------------------------------
#: Runs a relayed call: the request's bytes and the call's context in, the answer's bytes out; an error is
#: `context.abort`ed, as on a call (`InferenceServicer.relayed_calls`, `HealthService.relayed_calls`).
RelayedCall = Callable[[bytes, "RelayedContext"], Awaitable[bytes]]


def grpc_route(calls: Mapping[str, RelayedCall]) -> tuple[str, str, Handler]:
    """The route `POST /_adaserve/grpc/{rpc}` (`create_app`'s `internal`, or `relay_app`'s only one): the call run
    by the servicer's method `calls` names, as if it had come to a gRPC port with the metadata the headers carry
    (its restrictions checked on them, its trace context taken)."""

    async def endpoint(request: Request) -> Response:
        rpc = request.params["rpc"]
        call = calls.get(rpc)
        if call is None:
            return _error(404, grpc.StatusCode.UNIMPLEMENTED, f"no relayed gRPC call named '{rpc}'")
        try:
            answer = await call(request.body, RelayedContext(request.headers))
        except _Aborted as aborted:  # the HTTP status says it failed; the body says how
            return _error(500, aborted.code, aborted.message)
        return Response(200, answer, "application/x-protobuf")

    return "POST", GRPC_PATH + "{rpc}", endpoint


def relay_app(calls: Mapping[str, RelayedCall]) -> Callable[[Request], Awaitable[Response]]:
    """An application that serves relayed calls (`grpc_route`) and nothing else: the engine's end of the gRPC
    frontend's Unix socket, where no REST route may be reached."""
    _, _, endpoint = grpc_route(calls)

    async def app(request: Request) -> Response:
        if request.method != "POST" or not request.path.startswith(GRPC_PATH):
            return _error(404, grpc.StatusCode.UNIMPLEMENTED, f"no such endpoint: {request.path}")
        request.params = {"rpc": request.path[len(GRPC_PATH) :]}
        try:
            return await endpoint(request)
        except Exception as exc:  # the methods map their own errors: this one is a bug, logged
            log.exception("unexpected error", extra={"path": request.path})
            return _error(500, grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")

    return app


def _error(status: int, code: grpc.StatusCode, message: str) -> Response:
    return Response(status, json.dumps({"error": message, "grpc_status": code.value[0]}).encode())


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


class RelayedContext:
    """The servicer's context for a relayed call: the metadata it was relayed with; an abort ends it with its
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
