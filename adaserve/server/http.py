"""A small HTTP/1.1 server for the REST frontend: `httptools` (the parser uvicorn uses) under an asyncio Protocol.

Why not uvicorn + Starlette: on this project's 2-core VM a request's cost is dominated by per-layer Python work
and by syscalls that wake another process. uvicorn writes a response's headers and body with two sends, and the
ASGI layers cost about 140 µs of CPU per request; this server parses with httptools, routes with one table, and
answers with a single write. It does what the REST frontend needs: keep-alive, pipelined requests answered in
order, chunked request bodies, `Expect: 100-continue`, and a graceful stop that lets requests in progress finish;
and it holds every client to `ClientLimits` (`server/limits.py`): a body limit enforced before the body is read,
one budget for the bodies of all connections, deadlines for a request's head and body that trickling bytes do not
move, an idle timeout, and a cap on connections.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import socket
import ssl
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import cast
from urllib.parse import unquote

import httptools

from adaserve.server.content_coding import accepted_coding, encode_body
from adaserve.server.limits import SMALL_BODY_BYTES, BodyBudget, ClientLimits

log = logging.getLogger("adaserve.http")

#: Pipelined requests buffered per connection before the server stops reading from it (it also stops once their
#: bodies pass `max_body_bytes` together).
MAX_PIPELINED = 32
#: After a last answer (an error, or `Connection: close`), how long unread input is drained before closing.
LINGER_S = 2.0
#: ... and for at most this much of it: past it the connection is reset. 29 clients refused at their headers went
#: on sending their 60 MiB bodies, and reading that to throw it away cost the other clients 4.6x their p99.
LINGER_BYTES = 4 * 1024 * 1024
#: A request's URL and headers together; past this it is refused (431) and nothing more of it is read, so a client
#: cannot grow the server's memory with headers (the body has its own limit, `max_body_bytes`). Counted in whole
#: chunks of input, so a request may get up to one chunk past it.
MAX_HEAD_BYTES = 64 * 1024
#: The listen backlog: connections the kernel completes before the server accepts them (capped by somaxconn).
LISTEN_BACKLOG = 2048
#: While stopping, how long a connection that has sent no byte yet is waited for: its client has connected and is
#: about to send a request (one sent an instant later than `stop()` began lost its answer to a reset).
FIRST_BYTES_S = 1.0


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    params: dict[str, str] = field(default_factory=dict)  # path parameters filled by the router
    received_ns: int = 0  # its first byte arrived, and its last (CLOCK_MONOTONIC): for traces
    complete_ns: int = 0
    held: int = 0  # bytes of the server's body budget it holds until it is answered
    state: dict[str, str] = field(default_factory=dict)  # what the layers it passes through note on it


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    on_sent: Callable[[int, int], None] | None = None  # called with when its write began and ended (a trace's)
    compressible: bool = False  # compressed for a client that asks (`_respond`): inference answers and /metrics


Handler = Callable[[Request], Awaitable[Response]]
#: What may answer a request before the app, with callbacks (`HttpServer`'s `shortcut`): given the request and what
#: to call with its answer (None: the app answers it after all), what to call if its client goes away; None where it
#: does not take the request.
Shortcut = Callable[[Request, Callable[[Response | None], None]], Callable[[], None] | None]


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
#: The most bytes a request body to (method, path) may be, and what that limit is, for the refusal; None for the
#: server's `max_body_bytes` (the REST app's `body_limit`: an inference route's model's).
BodyLimit = Callable[[str, str], tuple[int, str] | None]


#: Each status's reason phrase, made once rather than an HTTPStatus per response.
_REASONS = {status.value: status.phrase for status in HTTPStatus}


def render(response: Response, keep_alive: bool, with_body: bool = True) -> bytes:
    """Status line, headers and body as one buffer, so a response leaves in one send. Without the body (the answer
    to a HEAD), content-length still says what a GET would get."""
    status = response.status
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status) or HTTPStatus(status).phrase}\r\n"
        f"content-length: {len(response.body)}\r\ncontent-type: {response.content_type}\r\n"
    )
    for name, value in response.headers.items():
        head += f"{name}: {value}\r\n"
    if not keep_alive:
        head += "connection: close\r\n"
    return (head + "\r\n").encode("latin-1") + (response.body if with_body else b"")


class HttpProtocol(asyncio.Protocol):
    """One client connection: parse requests as bytes arrive, answer them in order."""

    def __init__(self, server: HttpServer) -> None:
        self.app = server.app
        self.limits = server.limits
        self.budget = server.budget
        self.on_error = server.on_error
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.pending: deque[tuple[Request | Response, bool]] = deque()  # a request, or an early error response
        self.task: asyncio.Task[None] | None = None
        self._shortcut: tuple[Request, Callable[[], None]] | None = None  # a request the shortcut is answering
        self.closing = False  # the last answer is written; input is drained and discarded until close
        self._drained = 0  # bytes discarded since
        self._can_write = True  # False while the client is not reading what was written
        self._writable: asyncio.Future[None] | None = None  # what answering waits on meanwhile
        self._messages = 0  # requests begun on this connection
        self._received_ns = 0  # when the current one began to arrive
        self._in_head = True  # the current request's URL and headers are not complete yet
        self._partial = False  # a request has begun and is not whole yet
        self._loop = asyncio.get_running_loop()
        self._connected = self._loop.time()
        self.last_input = self._connected  # or the last answer's: what the idle timeout counts from
        self._head_started = self._connected  # the current request's first byte (loop time)
        self._body_started = self._connected  # the end of its headers
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf  # when it fires (loop time)
        self._reset()

    def _reset(self) -> None:
        self._url = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._size = 0
        self._limit, self._limit_what = self.limits.max_body_bytes, "request body"  # set at the headers' end
        self._held = 0  # bytes of the body budget the current request holds
        self._head_size = 0  # bytes of URL and headers received (in chunks that held nothing else)
        self._refused: Response | None = None

    # -- asyncio.Protocol ------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's TCPTransport does not subclass it
        if not self.server.admit(self):
            refused = self.on_error(503, f"the server has {self.limits.max_connections} connections open; retry")
            refused.headers["retry-after"] = "1"
            self.closing = True
            self.transport.write(render(refused, keep_alive=False))
            self.transport.close()
            return
        self._arm(self._connected + self.limits.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.pop(self, None)
        if self._timer is not None:
            self._timer.cancel()
        self.budget.give_back(self._held)  # a body that was arriving
        self._held = 0
        for item, _ in self.pending:  # requests that waited their turn
            if isinstance(item, Request):
                self.budget.give_back(item.held)
        self.pending.clear()
        if self._shortcut is not None:
            request, cancel = self._shortcut
            self._shortcut = None
            self.budget.give_back(request.held)
            cancel()
        if self.task is not None:
            # The client is gone. Its end-of-file counts as that too, as in nginx and uvicorn: TCP cannot tell a
            # half-close from a close, and a request whose client timed out must not keep its place in the queue.
            # The engine takes back what has not started; a load or unload goes on.
            self.task.cancel()
        self.transport = None

    def pause_writing(self) -> None:
        """The client is not reading: answer nothing more until it does. The requests left wait, and past
        MAX_PIPELINED reading stops too, so a client that never reads holds a bounded amount of memory."""
        self._can_write = False
        self._arm(self.last_input + self.limits.idle_timeout_s)

    def resume_writing(self) -> None:
        self._touch()  # the client read: progress, for the idle timeout
        self._can_write = True
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def data_received(self, data: bytes) -> None:
        self._touch()
        if self.closing:
            self._drained += len(data)
            if self._drained > LINGER_BYTES and self.transport is not None:
                self.transport.abort()  # it keeps sending after its answer: stop reading it for it
            return
        if self._head_size > MAX_HEAD_BYTES:
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

    def _touch(self) -> None:
        """Input arrived, or the client read: the connection is not quiet (for the idle timeout and for choosing
        which connection makes room for a new one)."""
        self.last_input = self._loop.time()
        connections = self.server.connections
        if self in connections:  # not counted: refused, or closed to make room
            connections.move_to_end(self)

    # -- httptools callbacks ---------------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._received_ns = time.perf_counter_ns()
        if self._messages:  # the first request's head counts from the connection's start
            self._head_started = self._loop.time()
            self._arm(self._head_started + self.limits.header_timeout_s)
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
        self._body_started = self._loop.time()
        self._arm(self._body_started + self.limits.body_timeout_s)
        declared = self._headers.get("content-length", "")
        size = int(declared) if declared.isascii() and declared.isdigit() else 0
        if size > SMALL_BODY_BYTES or self._headers.get("transfer-encoding"):
            self._body_limit()  # a small body is held to its route's limit by the app alone: no second lookup
        if size > self._limit:
            self._refuse(413, f"{self._limit_what} of {declared} bytes exceeds the limit of {self._limit} bytes")
        elif size and not self._hold(size, size):
            return
        elif self._headers.get("expect", "").lower() == "100-continue" and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self._refused is not None:
            return
        self._size += len(body)
        if self._size > self._limit:
            self._refuse(413, f"{self._limit_what} exceeds the limit of {self._limit} bytes")
            return
        if self._size > self._held and not self._hold(self._size - self._held, self._size):  # chunked: as it comes
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
        request = Request(method, path, self._headers, b"".join(self._body), held=self._held)
        self._held = 0  # the request holds it now, until it is answered
        request.received_ns, request.complete_ns = self._received_ns, time.perf_counter_ns()
        self._enqueue(request, keep_alive)

    def _body_limit(self) -> None:
        """The most this request's body may be: its route's limit where the app has one, else the server's."""
        if self.server.body_limit is None:
            return
        try:
            path = httptools.parse_url(self._url).path.decode("latin-1")
        except httptools.HttpParserInvalidURLError:
            return  # answered as a malformed request at its end
        limited = self.server.body_limit(self.parser.get_method().decode("latin-1"), path)
        if limited is not None:
            self._limit, self._limit_what = min(limited[0], self.limits.max_body_bytes), limited[1]

    # -- answering -------------------------------------------------------------------------------------------
    def _hold(self, size: int, body_bytes: int) -> bool:
        """Take `size` bytes of the body budget for the current request's body; refuse it (503) when the server
        holds too much already."""
        if self.budget.take(size, body_bytes):
            self._held += size
            return True
        self._refuse(
            503,
            f"the server holds {self.budget.held} bytes of request bodies, too many to take a body of "
            f"{body_bytes} bytes now; retry later",
        )
        return False

    def _refuse(self, status: int, message: str) -> None:
        """Answer at once and close: the rest of the body is never parsed or kept."""
        self.budget.give_back(self._held)
        self._held = 0
        self._body.clear()
        self._refused = self.on_error(status, message)
        if status == 503:
            self._refused.headers["retry-after"] = "1"
        self._enqueue(self._refused, False)

    def _fail(self, status: int, message: str) -> None:
        self._enqueue(self.on_error(status, message), False)

    def _enqueue(self, item: Request | Response, keep_alive: bool) -> None:
        if self.pending and self.pending[-1][1] is False:
            if isinstance(item, Request):
                self.budget.give_back(item.held)
            return  # the connection is closing after an earlier answer
        shortcut = self.server.shortcut
        if isinstance(item, Request) and shortcut is not None and self._idle():
            cancel = shortcut(item, lambda response: self._shortcut_answered(item, keep_alive, response))
            if cancel is not None:
                self._shortcut = (item, cancel)
                return
        self.pending.append((item, keep_alive))
        if self._backlog_full() and self.transport is not None:
            self.transport.pause_reading()
        if self.task is None and self._shortcut is None:
            self.task = asyncio.get_running_loop().create_task(self._answer_all())

    def _idle(self) -> bool:
        """Nothing is being answered or waits to be, and the client reads: a request may be answered at once."""
        return not self.pending and self.task is None and self._shortcut is None and self._can_write

    def _shortcut_answered(self, request: Request, keep_alive: bool, response: Response | None) -> None:
        """The shortcut's answer to `request` (None: it gave the request back, for the app to answer): written, and
        the requests that arrived meanwhile answered after it."""
        if self._shortcut is None or self._shortcut[0] is not request:
            return  # its client went away (`connection_lost`)
        self._shortcut = None
        if response is None:
            self.pending.appendleft((request, keep_alive))
        else:
            self.budget.give_back(request.held)
            if self._can_write and self.transport is not None:
                if not self._write(request, response, keep_alive):
                    return
            else:
                self.pending.appendleft((response, keep_alive))
        if self.pending and self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._answer_all())

    async def _answer_all(self) -> None:
        while self.pending and self.transport is not None:
            if not self._can_write:
                self._writable = self._loop.create_future()
                await self._writable
            item, keep_alive = self.pending.popleft()
            try:
                response = item if isinstance(item, Response) else await self._respond(item)
            finally:
                if isinstance(item, Request):
                    self.budget.give_back(item.held)  # answered (or its client gone): its body is let go
            if self.transport is None or not self._write(item, response, keep_alive):
                break
        self.task = None

    def _write(self, item: Request | Response, response: Response, keep_alive: bool) -> bool:
        """Send `response`, the answer to `item`; False when the connection closes after it."""
        assert self.transport is not None
        with_body = not (isinstance(item, Request) and item.method == "HEAD")
        keep_alive = keep_alive and not (self.server.stopping and not self.pending)
        on_sent = response.on_sent
        sending_ns = time.perf_counter_ns() if on_sent is not None else 0  # the clock only for a traced answer
        self.transport.write(render(response, keep_alive, with_body))
        if on_sent is not None:
            on_sent(sending_ns, time.perf_counter_ns())
        self.last_input = self._loop.time()
        if not keep_alive:
            self._linger()
            return False
        if not self._backlog_full():
            self.transport.resume_reading()
        return True

    async def _respond(self, request: Request) -> Response:
        """The app's answer to `request`, encoded as the client asks where it is `compressible` and a success
        (server/content_coding.py). The app decodes a compressed body, once it knows how much the route takes."""
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
        if not self.pending:
            return False
        if len(self.pending) > MAX_PIPELINED:
            return True
        waiting = sum(len(item.body) for item, _ in self.pending if isinstance(item, Request))
        return waiting > self.limits.max_body_bytes

    def _linger(self) -> None:
        """Half-close and drain for a while: closing with unread input would reset the connection (RST) and could
        destroy the answer just written, e.g. a 413 while the client is still sending its body."""
        assert self.transport is not None
        self.closing = True
        self.transport.resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        asyncio.get_running_loop().call_later(LINGER_S, self.transport.close)

    def _deadline(self) -> float | None:
        """When the connection must next have moved on (loop time), or None while an answer is being computed.
        A request's head and body have deadlines that bytes trickling in do not move (the body's grows with what
        has arrived, at `body_min_rate`); a connection between requests, or whose client is not reading its
        answers, has the idle timeout from the last thing it did."""
        if self.busy:
            return None
        if not self._can_write:
            return self.last_input + self.limits.idle_timeout_s
        if self._partial and self._in_head:
            return self._head_started + self.limits.header_timeout_s
        if self._partial:
            return self._body_started + self.limits.body_time_s(self._size)
        if not self._messages:  # connected, and not a byte yet
            return self._connected + self.limits.header_timeout_s
        return self.last_input + self.limits.idle_timeout_s

    def _arm(self, at: float) -> None:
        """Have the timer fire by `at` (loop time). A timer set for later is set again; one set for earlier stays,
        and when it fires sets itself for the deadline then (`_check_deadline`): so requests in a row on one
        connection rarely touch it."""
        if at >= self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = self._loop.call_at(at, self._check_deadline)

    def _check_deadline(self) -> None:
        """The timer fired: close a connection past its deadline (a 408 if a request was arriving); otherwise look
        again when it could first be."""
        self._timer, self._timer_at = None, math.inf
        if self.transport is None or self.closing:
            return
        now, deadline = self._loop.time(), self._deadline()
        if deadline is None or now < deadline:
            self._arm(now + self.limits.idle_timeout_s if deadline is None else deadline)
        elif not self._can_write:
            self.transport.abort()  # it stopped reading its answers: drop them (close would wait to flush them)
        elif self._partial and self._in_head:
            self._fail(408, f"the request's URL and headers did not arrive within {self.limits.header_timeout_s:g} s")
        elif self._partial:
            self._fail(
                408,
                f"the request body arrived too slowly: {self._size} bytes in {now - self._body_started:.0f} s "
                f"(a body has {self.limits.body_timeout_s:g} s, and a second more per "
                f"{self.limits.body_min_rate:.0f} bytes)",
            )
        else:
            self.transport.close()

    @property
    def busy(self) -> bool:
        """An answer is being computed (not merely waiting for the client to read)."""
        return (self.task is not None or self._shortcut is not None) and self._can_write

    @property
    def owed_an_answer(self) -> bool:
        """What a stopping server waits for: an answer being computed, a request arriving, or a connection that
        opened moments ago and has not sent its request yet."""
        if self.busy or self._partial:
            return True
        return not self._messages and self._loop.time() - self._connected < FIRST_BYTES_S

    @property
    def evictable(self) -> bool:
        """Whether this connection may be closed to make room for a new one: no answer is being computed for it,
        and for `evict_after_s` or more it has been quiet between requests, or sent no byte, or has been
        sending one request's URL and headers (a client sends them in one go), or a body slower than
        `body_min_rate`. Bytes trickling in keep none of these from being chosen."""
        if self.busy or self.closing:
            return False
        now = self._loop.time()
        if self._partial and self._in_head:
            return now - self._head_started >= self.limits.evict_after_s
        if self._partial:
            elapsed = now - self._body_started
            return elapsed >= self.limits.evict_after_s and self._size < elapsed * self.limits.body_min_rate
        since = self._connected if not self._messages else self.last_input
        return now - since >= self.limits.evict_after_s

    def evict(self) -> None:
        """Close it for a newer connection: a 408 when a request was arriving, else quietly."""
        if self.transport is None:
            return
        if not self._can_write:
            self.transport.abort()  # it is not reading: nothing could be said to it
        elif self._partial:
            self._fail(408, "the connection was closed to make room for others: the request stopped arriving")
        else:
            self.transport.close()
        self.server.connections.pop(self, None)


class HttpServer:
    """Listens on a bound socket and serves `app` within `limits`; `stop()` answers what its clients have sent and
    closes every connection."""

    def __init__(
        self,
        app: Application,
        *,
        on_error: Callable[[int, str], Response],
        limits: ClientLimits | None = None,
        body_limit: BodyLimit | None = None,
        shortcut: Shortcut | None = None,
    ) -> None:
        """`shortcut`: what may answer a request before `app`, with callbacks rather than a task (on a cluster, a
        request forwarded to its model's holder: `adaserve.distributed.member`); it is asked only when nothing
        else on the connection is being answered or waits to be, so answers keep their order."""
        self.app = app
        self.shortcut = shortcut
        self.on_error = on_error
        self.body_limit = body_limit
        self.limits = limits or ClientLimits()
        self.budget = BodyBudget(self.limits.body_budget_bytes)
        #: The open connections, the one quiet longest first.
        self.connections: OrderedDict[HttpProtocol, None] = OrderedDict()
        self.stopping = False  # answers say `connection: close`, each connection's last
        self._server: asyncio.Server | None = None
        self._listener: socket.socket | None = None
        self._tls: ssl.SSLContext | None = None

    async def start(self, sock: socket.socket, tls: ssl.SSLContext | None = None) -> None:
        """Serve on `sock`, over TLS when given a context (server/tls.py)."""
        loop = asyncio.get_running_loop()
        # backlog: asyncio listens again with its own (100 by default) on a socket it is given
        self._server = await loop.create_server(lambda: HttpProtocol(self), sock=sock, ssl=tls, backlog=LISTEN_BACKLOG)
        self._listener, self._tls = sock, tls

    def admit(self, connection: HttpProtocol) -> bool:
        """Count a new connection in; at `max_connections`, close the one quiet longest to make room, or, when
        every one is busy or recently active, refuse the new one (False)."""
        if len(self.connections) >= self.limits.max_connections:
            victim = next((c for c in self.connections if c.evictable), None)
            if victim is None:
                return False
            victim.evict()
        self.connections[connection] = None
        return True

    async def stop(self, grace_s: float = 10.0) -> None:
        """Stop listening, answer within `grace_s` what clients have sent or are sending (then `connection:
        close`), and close every connection. Connections the kernel completed that were not accepted yet are
        accepted first: closing a listener resets them, and their clients, whose requests may be sent, would get
        no answer."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        self.stopping = True
        if self._server is not None:
            waiting = self._accept_waiting()
            self._server.close()  # in the same step as the last accept: no connection can complete in between
            self._server = None
            if waiting:
                adopting = [
                    loop.create_task(loop.connect_accepted_socket(lambda: HttpProtocol(self), sock, ssl=self._tls))
                    for sock in waiting
                ]
                _, late = await asyncio.wait(adopting, timeout=max(deadline - loop.time(), 0.1))
                for task in late:  # a TLS handshake still under way at the deadline
                    task.cancel()
        while any(c.owed_an_answer for c in self.connections) and loop.time() < deadline:
            await asyncio.sleep(0.01)
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.close()

    def _accept_waiting(self) -> list[socket.socket]:
        """Accept every connection waiting in the listen backlog."""
        assert self._listener is not None
        self._listener.setblocking(False)
        accepted: list[socket.socket] = []
        while True:
            try:
                sock, _ = self._listener.accept()
            except BlockingIOError:
                return accepted
            except OSError as exc:  # out of file descriptors: the rest are reset
                log.warning("cannot accept the connections waiting at stop", extra={"error": str(exc)})
                return accepted
            sock.setblocking(False)
            accepted.append(sock)
