"""A small HTTP/1.1 server for the REST frontend: `httptools` (the parser uvicorn uses) under an asyncio Protocol.

Why not uvicorn + Starlette: on this project's 2-core VM a request's cost is dominated by per-layer Python work
and by syscalls that wake another process. uvicorn writes a response's headers and body with two sends, and the
ASGI layers cost about 140 µs of CPU per request; this server parses with httptools, routes with one table, and
answers with a single write. It does what the REST frontend needs: keep-alive, pipelined requests answered in
order, chunked request bodies, `Expect: 100-continue`, a body limit enforced before the body is read, and a
graceful stop that lets requests in progress finish, and an idle timeout.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import cast
from urllib.parse import unquote

import httptools

from adaserve.server.content_coding import CodingError, accepted_coding, decode_body, encode_body

log = logging.getLogger("adaserve.http")

#: Pipelined requests buffered per connection before the server stops reading from it (it also stops once their
#: bodies pass `max_body_bytes` together).
MAX_PIPELINED = 32
#: After a last answer (an error, or `Connection: close`), how long unread input is drained before closing.
LINGER_S = 2.0
#: A request's URL and headers together; past this it is refused (431) and nothing more of it is read, so a client
#: cannot grow the server's memory with headers (the body has its own limit, `max_body_bytes`). Counted in whole
#: chunks of input, so a request may get up to one chunk past it.
MAX_HEAD_BYTES = 64 * 1024
#: A connection that sends nothing for this long while no answer is being computed is closed (nginx's keep-alive
#: timeout), so idle or abandoned connections cannot pile up; one that stops in the middle of a request gets a 408.
IDLE_TIMEOUT_S = 75.0


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    params: dict[str, str] = field(default_factory=dict)  # path parameters filled by the router
    received_ns: int = 0  # its first byte arrived, and its last (CLOCK_MONOTONIC): for traces
    complete_ns: int = 0


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    on_sent: Callable[[int, int], None] | None = None  # called with when its write began and ended (a trace's)
    compressible: bool = False  # compressed for a client that asks (`_respond`): inference answers and /metrics


Handler = Callable[[Request], Awaitable[Response]]


class Routes:
    """The route table: `add("POST", "/v2/models/{model}/infer", handler)`, matched in the order added."""

    def __init__(self) -> None:
        self._routes: list[tuple[str, re.Pattern[str], Handler]] = []

    def add(self, method: str, template: str, handler: Handler) -> None:
        pattern = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", template)
        self._routes.append((method, re.compile(f"^{pattern}$"), handler))

    def resolve(self, method: str, path: str) -> tuple[Handler, dict[str, str]] | list[str]:
        """The handler and path parameters; else the methods the path allows (none: a 404, some: a 405). The first
        template that matches owns the path: a GET of `/v1/models/m:predict` is refused, not taken for the readiness
        of a model named `m:predict`. A HEAD is a GET whose answer leaves out the body (RFC 9110 §9.3.2): load
        balancers probe health with it."""
        allowed: list[str] = []
        owner: re.Pattern[str] | None = None
        for route_method, pattern, handler in self._routes:
            if owner is not None and pattern.pattern != owner.pattern:
                continue
            match = pattern.match(path)
            if match is None:
                continue
            owner = pattern
            if route_method == method or (method == "HEAD" and route_method == "GET"):
                return handler, {name: unquote(value) for name, value in match.groupdict().items()}
            allowed += [route_method, "HEAD"] if route_method == "GET" else [route_method]
        return allowed


Application = Callable[[Request], Awaitable[Response]]


def render(response: Response, keep_alive: bool, with_body: bool = True) -> bytes:
    """Status line, headers and body as one buffer, so a response leaves in one send. Without the body (the answer
    to a HEAD), content-length still says what a GET would get."""
    reason = HTTPStatus(response.status).phrase
    lines = [
        f"HTTP/1.1 {response.status} {reason}",
        f"content-length: {len(response.body)}",
        f"content-type: {response.content_type}",
        *(f"{name}: {value}" for name, value in response.headers.items()),
    ]
    if not keep_alive:
        lines.append("connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (response.body if with_body else b"")


class HttpProtocol(asyncio.Protocol):
    """One client connection: parse requests as bytes arrive, answer them in order."""

    def __init__(
        self,
        app: Application,
        max_body_bytes: int,
        on_error: Callable[[int, str], Response],
        connections: set[HttpProtocol],
        idle_timeout_s: float = IDLE_TIMEOUT_S,
    ) -> None:
        self.app = app
        self.idle_timeout_s = idle_timeout_s
        self.max_body_bytes = max_body_bytes
        self.on_error = on_error
        self.connections = connections
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.pending: deque[tuple[Request | Response, bool]] = deque()  # a request, or an early error response
        self.task: asyncio.Task[None] | None = None
        self.closing = False  # the last answer is written; input is drained and discarded until close
        self._can_write = asyncio.Event()  # cleared while the client is not reading what was written
        self._can_write.set()
        self._messages = 0  # requests begun on this connection
        self._received_ns = 0  # when the current one began to arrive
        self._in_head = True  # the current request's URL and headers are not complete yet
        self._partial = False  # a request has begun and is not whole yet
        self._loop = asyncio.get_running_loop()
        self._last_input = self._loop.time()  # or the last answer's: what the idle timeout counts from
        self._idle_timer: asyncio.TimerHandle | None = None
        self._reset()

    def _reset(self) -> None:
        self._url = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._size = 0
        self._head_size = 0  # bytes of URL and headers received (in chunks that held nothing else)
        self._refused: Response | None = None

    # -- asyncio.Protocol ------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's TCPTransport does not subclass it
        self.connections.add(self)
        self._idle_timer = self._loop.call_later(self.idle_timeout_s, self._check_idle)

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        if self.task is not None:
            # The client is gone. Its end-of-file counts as that too, as in nginx and uvicorn: TCP cannot tell a
            # half-close from a close, and a request whose client timed out must not keep its place in the queue.
            # The engine takes back what has not started; a load or unload goes on.
            self.task.cancel()
        self.transport = None

    def pause_writing(self) -> None:
        """The client is not reading: answer nothing more until it does. The requests left wait, and past
        MAX_PIPELINED reading stops too, so a client that never reads holds a bounded amount of memory."""
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._last_input = self._loop.time()  # the client read: progress, for the idle timeout
        self._can_write.set()

    def data_received(self, data: bytes) -> None:
        self._last_input = self._loop.time()  # a float per chunk; the timer reads it when it fires
        if self.closing or self._head_size > MAX_HEAD_BYTES:
            return
        in_head, message = self._in_head, self._messages
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            self._fail(400, f"malformed HTTP request: {exc}")
        if in_head and self._in_head and message == self._messages:  # the whole chunk was URL and headers
            self._head_size += len(data)
            if self._head_size > MAX_HEAD_BYTES:  # the parser keeps a header until it ends: feed it no more
                self._fail(431, f"the request's URL and headers exceed the limit of {MAX_HEAD_BYTES} bytes")

    # -- httptools callbacks ---------------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._received_ns = time.perf_counter_ns()
        self._messages += 1
        self._partial = True
        self._reset()

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        self._headers[key] = f"{self._headers[key]}, {text}" if key in self._headers else text

    def on_headers_complete(self) -> None:
        self._in_head = False
        declared = self._headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            self._refuse(f"request body of {declared} bytes exceeds the limit of {self.max_body_bytes}")
        elif self._headers.get("expect", "").lower() == "100-continue" and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self._refused is not None:
            return
        self._size += len(body)
        if self._size > self.max_body_bytes:
            self._refuse(f"request body exceeds the limit of {self.max_body_bytes} bytes")
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._in_head = True  # of the next request
        self._partial = False
        keep_alive = self.parser.should_keep_alive()
        if self._refused is not None:
            self._enqueue(self._refused, False)
            return
        method = self.parser.get_method().decode("latin-1")
        path = httptools.parse_url(self._url).path.decode("latin-1")
        request = Request(method, path, self._headers, b"".join(self._body))
        request.received_ns, request.complete_ns = self._received_ns, time.perf_counter_ns()
        self._enqueue(request, keep_alive)

    # -- answering -------------------------------------------------------------------------------------------
    def _refuse(self, message: str) -> None:
        """Answer 413 at once and close: the rest of an oversized body is never parsed or kept."""
        self._refused = self.on_error(413, message)
        self._enqueue(self._refused, False)

    def _fail(self, status: int, message: str) -> None:
        self._enqueue(self.on_error(status, message), False)

    def _enqueue(self, item: Request | Response, keep_alive: bool) -> None:
        if self.pending and self.pending[-1][1] is False:
            return  # the connection is closing after an earlier answer
        self.pending.append((item, keep_alive))
        if self._backlog_full() and self.transport is not None:
            self.transport.pause_reading()
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._answer_all())

    async def _answer_all(self) -> None:
        while self.pending and self.transport is not None:
            await self._can_write.wait()
            item, keep_alive = self.pending.popleft()
            response = item if isinstance(item, Response) else await self._respond(item)
            if self.transport is None:
                break
            with_body = not (isinstance(item, Request) and item.method == "HEAD")
            sending_ns = time.perf_counter_ns()
            self.transport.write(render(response, keep_alive, with_body))
            if response.on_sent is not None:
                response.on_sent(sending_ns, time.perf_counter_ns())
            self._last_input = self._loop.time()
            if not keep_alive:
                self._linger()
                break
            if not self._backlog_full():
                self.transport.resume_reading()
        self.task = None

    async def _respond(self, request: Request) -> Response:
        """The app's answer to `request`, with its body decoded first and, where the answer is `compressible` and
        a success, encoded as the client asks (server/content_coding.py)."""
        try:
            request.body = await decode_body(request.headers.get("content-encoding"), request.body, self.max_body_bytes)
        except CodingError as exc:
            response = self.on_error(exc.status, str(exc))
            response.headers.update(exc.headers)
        else:
            response = await self.app(request)
        accept = request.headers.get("accept-encoding")
        if accept is None or not response.compressible:
            return response
        response.headers["vary"] = "accept-encoding"
        coding = accepted_coding(accept)
        if coding is not None and response.body and response.status == 200:
            response.body = await encode_body(coding, response.body)
            response.headers["content-encoding"] = coding
        return response

    def _backlog_full(self) -> bool:
        """Whether to stop reading: so many requests wait, or their bodies are so large together, that a client
        pipelining large bodies would hold up to 32 of them (2 GiB at the default limit) rather than about two."""
        if len(self.pending) > MAX_PIPELINED:
            return True
        return sum(len(item.body) for item, _ in self.pending if isinstance(item, Request)) > self.max_body_bytes

    def _linger(self) -> None:
        """Half-close and drain for a while: closing with unread input would reset the connection (RST) and could
        destroy the answer just written, e.g. a 413 while the client is still sending its body."""
        assert self.transport is not None
        self.closing = True
        self.transport.resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        asyncio.get_running_loop().call_later(LINGER_S, self.transport.close)

    def _check_idle(self) -> None:
        """The idle timer fired: close a connection quiet for `idle_timeout_s` (a 408 if it stopped mid-request);
        otherwise look again when it could first be."""
        if self.transport is None or self.closing:
            return
        quiet_s = self._loop.time() - self._last_input
        if self.busy or quiet_s < self.idle_timeout_s:
            wait_s = self.idle_timeout_s if self.busy else self.idle_timeout_s - quiet_s
            self._idle_timer = self._loop.call_later(wait_s, self._check_idle)
        elif not self._can_write.is_set():
            self.transport.abort()  # it stopped reading its answers: drop them (close would wait to flush them)
        elif self._partial:
            self._fail(408, f"the request stopped arriving: nothing came for {self.idle_timeout_s:g} s")
        else:
            self.transport.close()

    @property
    def busy(self) -> bool:
        """An answer is being computed (not merely waiting for the client to read)."""
        return self.task is not None and self._can_write.is_set()


class HttpServer:
    """Listens on a bound socket and serves `app`; `stop()` closes idle connections and waits for busy ones."""

    def __init__(
        self,
        app: Application,
        *,
        max_body_bytes: int,
        on_error: Callable[[int, str], Response],
        idle_timeout_s: float = IDLE_TIMEOUT_S,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.on_error = on_error
        self.idle_timeout_s = idle_timeout_s
        self.connections: set[HttpProtocol] = set()
        self._server: asyncio.Server | None = None

    async def start(self, sock: socket.socket, tls: ssl.SSLContext | None = None) -> None:
        """Serve on `sock`, over TLS when given a context (server/tls.py)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: HttpProtocol(self.app, self.max_body_bytes, self.on_error, self.connections, self.idle_timeout_s),
            sock=sock,
            ssl=tls,
        )

    async def stop(self, grace_s: float = 10.0) -> None:
        if self._server is not None:
            self._server.close()
        deadline = asyncio.get_running_loop().time() + grace_s
        while any(c.busy for c in self.connections) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.close()
