"""A minimal HTTP/1.1 client: keep-alive connections over asyncio.Protocol, parsed by httptools.

Each request is sent as bytes encoded before the run, so the per-request work is one write and one parse. On this
project's 2-core machine that costs about half the CPU of aiohttp (README: "The generator's own cost"), and CPU
the generator spends is taken from the server under test. The load generator, a node server forwarding a request
to another (`adaserve.distributed.forward`) and the gRPC frontend's process relaying its calls to the engine over
a Unix socket (`server/grpc_frontend.py`) use it; it lives here, apart from `adaserve.bench`, so that the last
imports no more than it needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import httptools

#: Response header that gives the JSON part's length in a binary-tensor body.
_HEADER_LENGTH = b"inference-header-content-length"
_CONTENT_ENCODING = b"content-encoding"


@dataclass(slots=True)
class Response:
    """Status, the binary-tensor header length (None when absent), the body, and its coding (None: as is)."""

    status: int
    header_length: int | None
    body: bytes
    content_encoding: str | None = None


#: What a sent request's connection calls once, with its answer or with the error that ended it.
OnAnswer = Callable[["Response | Exception"], None]


class ConnectFailed(ConnectionError):
    """No connection could be opened (refused, unreachable, unknown host)."""


class StaleConnection(ConnectionResetError):
    """The server closed a kept-alive connection before answering; the request is safe to send again."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time."""

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._on_answer: OnAnswer | None = None
        self._chunks: list[bytes] = []
        self._header_length: int | None = None
        self._content_encoding: str | None = None
        self._answered = False
        self.deadline = 0.0

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # create_connection always gives a stream transport

    def data_received(self, data: bytes) -> None:
        self._answered = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.fail(ValueError(f"malformed HTTP response: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._pool.forget(self)
        if self._answered:
            self.fail(ConnectionResetError(f"the server closed the connection mid-response ({exc or 'EOF'})"))
        else:
            self.fail(StaleConnection(f"the server closed the connection ({exc or 'EOF'})"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == _HEADER_LENGTH:
            self._header_length = int(value)
        elif name == _CONTENT_ENCODING:
            self._content_encoding = value.decode("latin-1").strip().lower()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)

    def on_message_complete(self) -> None:
        response = Response(
            self._parser.get_status_code(), self._header_length, b"".join(self._chunks), self._content_encoding
        )
        on_answer, self._on_answer = self._on_answer, None
        self._chunks, self._header_length, self._content_encoding, self._answered = [], None, None, False
        if self._parser.should_keep_alive():
            self._pool.release(self)
        elif self._transport is not None:
            self._transport.close()
        if on_answer is not None:
            on_answer(response)

    def send(self, data: bytes, body: bytes, deadline: float, on_answer: OnAnswer) -> None:
        assert self._transport is not None
        self._on_answer = on_answer
        self.deadline = deadline
        if body:
            self._transport.writelines((data, body))  # one writev: the body is not copied onto the head
        else:
            self._transport.write(data)

    def fail(self, exc: Exception) -> None:
        """End the request in flight with `exc` and drop the connection, whose state is now unknown."""
        on_answer, self._on_answer = self._on_answer, None
        if on_answer is not None:
            on_answer(exc)
        if self._transport is not None:
            self._transport.abort()


class ConnectionPool:
    """Connections to one host: idle ones are reused, a new one opens whenever all are busy (no client queue)."""

    def __init__(
        self, host: str, port: int, timeout_s: float, tls: ssl.SSLContext | None = None, unix: str | None = None
    ) -> None:
        """`unix`: the path of a Unix socket to connect to instead of `host`:`port`."""
        self.host, self.port, self.unix = host, port, unix
        self._tls = tls
        self._timeout_s = timeout_s
        self._idle: list[_Connection] = []
        self._busy: set[_Connection] = set()
        self._sweeper: asyncio.Task[None] | None = None

    async def request(self, data: bytes, body: bytes = b"") -> Response:
        """Send one complete request, `data` (or its head, then its `body`: a forwarded body goes as it came,
        never copied onto its head), and read the answer.

        Raises ConnectFailed, TimeoutError past the timeout, another OSError when the connection breaks, and
        ValueError for a response that is not HTTP. Cancelled, it closes the connection: the server stops working on
        a request nobody waits for (a node forwarding the request of a client that went away, say).
        """
        answer: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        settle = _settles(answer)
        connection = self.send_now(data, body, settle)
        reused = connection is not None
        if connection is None:
            connection = await self._connect()
            self._send(connection, data, body, settle)
        try:
            return await answer
        except StaleConnection:
            if not reused:
                raise
            return await self.request(data, body)
        except asyncio.CancelledError:
            connection.fail(ConnectionAbortedError("the request was cancelled"))
            raise

    def send_now(self, data: bytes, body: bytes, on_answer: OnAnswer) -> _Connection | None:
        """`request` without a coroutine or a future, on a kept-alive connection: `on_answer` gets its answer, or
        the error `request` would raise (StaleConnection where the server had closed the connection: safe to send
        again). Returns the connection, which `fail`s the request when nobody waits for it any more; None, having
        sent nothing, when no connection is open and idle."""
        if self._sweeper is None:
            self._sweeper = asyncio.ensure_future(self._sweep())
        if not self._idle:
            return None
        connection = self._idle.pop()
        self._send(connection, data, body, on_answer)
        return connection

    def _send(self, connection: _Connection, data: bytes, body: bytes, on_answer: OnAnswer) -> None:
        self._busy.add(connection)
        connection.send(data, body, time.monotonic() + self._timeout_s, on_answer)

    def release(self, connection: _Connection) -> None:
        """An answered connection goes back to the idle list; busy/idle change only on connection events."""
        self._busy.discard(connection)
        self._idle.append(connection)

    def forget(self, connection: _Connection) -> None:
        self._busy.discard(connection)
        with contextlib.suppress(ValueError):
            self._idle.remove(connection)

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        for connection in [*self._idle, *self._busy]:
            connection.fail(ConnectionAbortedError("the client closed"))

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            if self.unix is not None:
                _, connection = await loop.create_unix_connection(lambda: _Connection(self), self.unix)
            else:
                _, connection = await loop.create_connection(
                    lambda: _Connection(self), self.host, self.port, ssl=self._tls
                )
        except OSError as exc:
            reason = "connection refused" if isinstance(exc, ConnectionRefusedError) else exc.strerror or str(exc)
            where = self.unix if self.unix is not None else f"{self.host}:{self.port}"
            raise ConnectFailed(f"cannot connect to {where}: {reason}") from exc
        return connection

    async def _sweep(self) -> None:
        """Fail requests past their deadline; one timer for all requests is cheaper than one per request."""
        period = min(1.0, max(0.01, self._timeout_s / 10))
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for connection in [c for c in self._busy if c.deadline < now]:
                connection.fail(TimeoutError(f"no answer within {self._timeout_s:g} s"))


def _settles(future: asyncio.Future[Response]) -> OnAnswer:
    """An `OnAnswer` that settles `future` (unless it was cancelled meanwhile)."""

    def settle(outcome: Response | Exception) -> None:
        if future.done():
            return
        if isinstance(outcome, Exception):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    return settle
