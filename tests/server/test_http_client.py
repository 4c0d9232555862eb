"""The generator's HTTP/1.1 client against a scripted loopback server: reuse, stale connections, timeouts."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Awaitable, Callable

import pytest

from adaserve.bench.client import HttpSender, Outcome
from adaserve.bench.codec import Payload
from adaserve.server.http_client import ConnectFailed, ConnectionPool, Response, StaleConnection
from tests.server_utils import free_port

REQUEST = b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
OK = b"HTTP/1.1 200 OK\r\nInference-Header-Content-Length: 2\r\nContent-Length: 5\r\n\r\n{}abc"

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


async def _with_server(
    handler: Handler,
    client: Callable[[ConnectionPool], Awaitable[None]],
    timeout_s: float = 5.0,
) -> list[int]:
    """Run `client` against a server whose `handler(reader, writer, connection_number)` scripts each connection."""
    connections: list[int] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(len(connections))
        try:
            await handler(reader, writer, connections[-1])
        finally:
            writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = ConnectionPool("127.0.0.1", port, timeout_s)
    try:
        await client(pool)
    finally:
        await pool.close()
        server.close()
        await server.wait_closed()
    return connections


async def _answer_each(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
    while await reader.readuntil(b"\r\n\r\n"):
        writer.write(OK)
        await writer.drain()


def test_answers_reuse_one_connection() -> None:
    responses: list[Response] = []

    async def client(pool: ConnectionPool) -> None:
        for _ in range(3):
            responses.append(await pool.request(REQUEST))

    connections = asyncio.run(_with_server(_answer_each, client))
    assert connections == [0]
    assert responses[-1] == Response(200, 2, b"{}abc")


def test_concurrent_requests_open_more_connections() -> None:
    async def client(pool: ConnectionPool) -> None:
        await asyncio.gather(*(pool.request(REQUEST) for _ in range(5)))

    assert len(asyncio.run(_with_server(_answer_each, client))) == 5


def test_a_connection_the_server_closed_while_idle_is_replaced_silently() -> None:
    async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(OK)
        await writer.drain()
        await reader.read(1)  # closes as soon as the next request arrives, without answering it

    async def client(pool: ConnectionPool) -> None:
        assert (await pool.request(REQUEST)).status == 200
        assert (await pool.request(REQUEST)).status == 200

    assert asyncio.run(_with_server(once, client)) == [0, 1]


def test_send_now_uses_only_an_idle_connection_and_calls_back_once_with_the_answer_or_the_error() -> None:
    """The forwarding shortcut's send: nothing without an open idle connection; then its answer, or StaleConnection
    when the server had closed that connection (safe to send again), each delivered once."""

    async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        for _answer in range(2):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(OK)
            await writer.drain()
        await reader.read(1)  # closes as soon as the next request arrives, without answering it

    async def client(pool: ConnectionPool) -> None:
        outcomes: list[Response | Exception] = []
        arrived = asyncio.Event()

        def record(outcome: Response | Exception) -> None:
            outcomes.append(outcome)
            arrived.set()

        assert pool.send_now(REQUEST, b"", record) is None  # nothing open yet: nothing sent
        assert (await pool.request(REQUEST)).status == 200
        for expected in (Response, StaleConnection):
            arrived.clear()
            assert pool.send_now(REQUEST, b"", record) is not None
            await asyncio.wait_for(arrived.wait(), 5)
            assert isinstance(outcomes[-1], expected)
        await asyncio.sleep(0.05)
        assert len(outcomes) == 2  # the connection's close after its answer called nobody again

    assert asyncio.run(_with_server(once, client)) == [0]


def test_a_body_written_after_its_head_is_one_request_also_when_sent_again() -> None:
    """`request(head, body)` (a forwarded body, not copied onto its head) reaches the server as one request, and a
    request sent again on a new connection (the kept-alive one had been closed) carries its body again."""
    body = bytes(range(256)) * 64
    head = f"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    received: list[bytes] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int) -> None:
        while await reader.readuntil(b"\r\n\r\n"):
            received.append(await reader.readexactly(len(body)))
            writer.write(OK)
            await writer.drain()
            if number == 0:
                await reader.read(1)  # closes as soon as the next request arrives, without answering it
                return

    async def client(pool: ConnectionPool) -> None:
        assert (await pool.request(head, body)).status == 200
        assert (await pool.request(head, body)).status == 200

    assert asyncio.run(_with_server(record, client)) == [0, 1]
    assert received == [body, body]


def test_no_answer_is_a_timeout() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await reader.read()

    async def client(pool: ConnectionPool) -> None:
        with pytest.raises(TimeoutError, match=r"no answer within 0\.2 s"):
            await pool.request(REQUEST)

    asyncio.run(_with_server(silent, client, timeout_s=0.2))


def test_a_cancelled_request_closes_its_connection() -> None:
    """So the server sees its client gone and stops working on the request (a forwarding node's caller left)."""
    closed = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await reader.read()  # returns at end of file: the client closed
        closed.set()

    async def client(pool: ConnectionPool) -> None:
        request = asyncio.ensure_future(pool.request(REQUEST))
        await asyncio.sleep(0.1)
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        await asyncio.wait_for(closed.wait(), 2)

    asyncio.run(_with_server(silent, client))


@pytest.mark.parametrize(
    ("answer", "hang_up", "error", "message"),
    [
        (b"SMTP READY\r\n\r\n", False, ValueError, "malformed HTTP response"),  # an error, not a hang
        (OK[:-3], True, ConnectionResetError, "mid-response"),  # closing mid-response: a lost connection
    ],
)
def test_a_bad_answer_is_an_error(answer: bytes, hang_up: bool, error: type[Exception], message: str) -> None:
    async def server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        if not hang_up:
            await reader.read()

    async def client(pool: ConnectionPool) -> None:
        with pytest.raises(error, match=message):
            await pool.request(REQUEST)

    asyncio.run(_with_server(server, client))


def test_refused_connection() -> None:
    async def client() -> None:
        pool = ConnectionPool("127.0.0.1", free_port(), 1.0)
        with pytest.raises(ConnectFailed, match="connection refused"):
            await pool.request(REQUEST)
        await pool.close()

    asyncio.run(client())


def test_a_compressed_answer_names_its_coding_and_the_next_does_not() -> None:
    compressed = b"HTTP/1.1 200 OK\r\nContent-Encoding: GZIP\r\nContent-Length: 3\r\n\r\nabc"
    responses: list[Response] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        for reply in (compressed, OK):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(reply)
            await writer.drain()

    async def client(pool: ConnectionPool) -> None:
        for _ in range(2):
            responses.append(await pool.request(REQUEST))

    asyncio.run(_with_server(answer, client))
    assert [r.content_encoding for r in responses] == ["gzip", None]


@pytest.mark.parametrize(
    ("coding", "body", "expected"),
    [
        ("gzip", gzip.compress(b'{"parameters": {"exit_block": "stem"}}', mtime=0), ("ok", {"exit_block": "stem"})),
        ("gzip", b"not gzip", ("bad_response", "the answer is not valid gzip data")),
        ("br", b"\x00", ("bad_response", "an answer in Content-Encoding 'br', which is not gzip or deflate")),
    ],
)
def test_the_http_sender_reads_compressed_answers(coding: str, body: bytes, expected: tuple[str, object]) -> None:
    reply = b"HTTP/1.1 200 OK\r\nContent-Encoding: %s\r\nContent-Length: %d\r\n\r\n%s" % (
        coding.encode(),
        len(body),
        body,
    )

    async def run() -> Outcome:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(reply)
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        sender = HttpSender(f"127.0.0.1:{server.sockets[0].getsockname()[1]}", 5.0, compression="gzip")
        try:
            return await sender.infer(Payload("m", REQUEST))
        finally:
            await sender.close()
            server.close()
            await server.wait_closed()

    outcome = asyncio.run(run())
    kind, detail = expected
    assert (outcome.error_kind or "ok") == kind
    assert outcome.parameters == detail if kind == "ok" else str(detail) in (outcome.error or "")
