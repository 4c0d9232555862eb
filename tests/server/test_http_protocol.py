"""The HTTP/1.1 layer itself, over raw sockets: keep-alive, pipelining, chunked bodies, 100-continue, limits."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
import urllib.request
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from adaserve.server.http import LINGER_BYTES, MAX_HEAD_BYTES, HttpServer, Request, Response
from adaserve.server.limits import ClientLimits
from tests.conftest import MAX_REQUEST_BYTES
from tests.server.reference import reference_outputs
from tests.server_utils import ServerHandle, running_server, write_slow_model


def connect(server: ServerHandle) -> socket.socket:
    host, port = server.http_url.split(":")
    return socket.create_connection((host, int(port)), timeout=30)


def read_head(sock: socket.socket, buffer: bytearray) -> tuple[int, dict[str, str]]:
    """The status and headers of the next response (all of it, for an answer to a HEAD); the rest stays in
    `buffer`."""
    while b"\r\n\r\n" not in buffer:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before a response")
        buffer += chunk
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    buffer[:] = rest
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, value in (line.split(":", 1) for line in lines)}
    return int(status_line.split()[1]), headers


def read_response(sock: socket.socket, buffer: bytearray) -> tuple[int, dict[str, str], bytes]:
    """One response from the stream; leftover bytes stay in `buffer` for the next call."""
    status, headers = read_head(sock, buffer)
    rest = bytes(buffer)
    length = int(headers["content-length"])
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed inside a body")
        rest += chunk
    buffer[:] = rest[length:]
    return status, headers, rest[:length]


def refused_after(server: ServerHandle, head: bytes, piece: bytes, pieces: int) -> tuple[int, dict[str, str], bytes]:
    """Send `head`, then `piece` up to `pieces` times on one connection; the answer, and that the server closed."""
    with connect(server) as sock:
        sock.sendall(head)
        try:
            for _ in range(pieces):
                sock.sendall(piece)
        except OSError:
            pass  # the server may close while we are still sending: the answer is already there
        answer = read_response(sock, bytearray())
        assert sock.recv(1) == b""
    return answer


def infer_body(value: float) -> bytes:
    return json.dumps(
        {"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 784], "data": [value] * 784}]}
    ).encode()


def post(path: str, body: bytes, extra: str = "") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


def test_pipelined_requests_are_answered_in_order(server: ServerHandle) -> None:
    values = [0.0, 0.25, 0.5, 0.75, 1.0]
    with connect(server) as sock:
        sock.sendall(b"".join(post("/v2/models/mlp/infer", infer_body(v)) for v in values))
        buffer = bytearray()
        answers = [read_response(sock, buffer) for _ in values]
    for value, (status, headers, body) in zip(values, answers, strict=True):
        assert status == 200 and headers["content-type"] == "application/json"
        logits = np.array(json.loads(body)["outputs"][0]["data"], dtype=np.float32)
        expected = reference_outputs("mlp", np.full((1, 784), value, dtype=np.float32))[0]
        np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)


def test_chunked_body_and_expect_continue(server: ServerHandle) -> None:
    body = infer_body(0.5)
    pieces = [body[i : i + 700] for i in range(0, len(body), 700)]
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    with connect(server) as sock:
        sock.sendall(
            b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n"
            b"Expect: 100-continue\r\n\r\n"
        )
        buffer = bytearray()
        while b"\r\n\r\n" not in buffer:
            buffer += sock.recv(65536)
        assert bytes(buffer).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        del buffer[: len(b"HTTP/1.1 100 Continue\r\n\r\n")]
        sock.sendall(chunked)
        status, _, answer = read_response(sock, buffer)
    assert status == 200 and json.loads(answer)["outputs"][0]["shape"] == [1, 10]


@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("/v2/repository/index", f"request body exceeds the limit of {MAX_REQUEST_BYTES} bytes"),
        (  # an inference route: what its model can take, once that many bytes are in
            "/v2/models/mlp/infer",
            "request body for model 'mlp' (at most 16 rows of its inputs) exceeds the limit of 868352 bytes",
        ),
    ],
)
def test_an_oversized_chunked_body_is_refused_and_the_connection_closed(
    server: ServerHandle, path: str, error: str
) -> None:
    piece = b"x" * 65536
    head = f"POST {path} HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    chunk = b"%x\r\n%s\r\n" % (len(piece), piece)
    status, headers, body = refused_after(server, head, chunk, MAX_REQUEST_BYTES // len(piece) + 2)
    assert status == 413 and headers["connection"] == "close"
    assert json.loads(body)["error"] == error


def test_a_body_larger_than_its_model_takes_is_refused_at_its_headers(server: ServerHandle) -> None:
    """30 connections sent 60 MiB bodies to a 16-row model, and each was read whole before it was refused."""
    head = post("/v2/models/mlp/infer", b"")[: -len("\r\n")].replace(b"Content-Length: 0", b"Content-Length: 900000")
    with connect(server) as sock:
        sock.sendall(head + b"\r\n")  # the headers alone: the answer comes before any of the body
        status, headers, body = read_response(sock, bytearray())
    assert status == 413 and headers["connection"] == "close"
    words = "request body for model 'mlp' (at most 16 rows of its inputs) of 900000 bytes exceeds the limit of 868352"
    assert words in json.loads(body)["error"]


def test_malformed_requests_and_unknown_routes(server: ServerHandle) -> None:
    with connect(server) as sock:
        sock.sendall(b"GET /v2/nothing HTTP/1.1\r\nHost: t\r\n\r\nDELETE /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n")
        buffer = bytearray()
        missing, wrong_method = read_response(sock, buffer), read_response(sock, buffer)
    assert missing[0] == 404 and json.loads(missing[2])["error"] == "no such endpoint: /v2/nothing"
    assert wrong_method[0] == 405 and wrong_method[1]["allow"] == "GET, HEAD"
    with connect(server) as sock:
        sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        status, _, body = read_response(sock, bytearray())
    assert status == 400 and "malformed HTTP request" in json.loads(body)["error"]
    with connect(server) as sock:  # the server still serves
        sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: t\r\n\r\n")
        assert read_response(sock, bytearray())[0] == 200


@pytest.fixture(scope="module")
def slower(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    """A server of one model ten times slower than the session's `slow`: a leaving client's close must be seen
    before its row's turn, which a starved server on a busy machine once missed by tens of ms."""
    root = tmp_path_factory.mktemp("slower") / "models"
    root.mkdir()
    write_slow_model(root, "slow", rounds=3000, max_queue_size=2)
    with running_server(root) as handle:
        yield handle


def test_a_request_whose_client_closes_the_connection_is_not_computed(slower: ServerHandle) -> None:
    """A client that closes its connection (its own timeout, say) is gone: its request, not started, leaves the
    queue and no worker computes it. End-of-file reads as gone, as in nginx and uvicorn: TCP cannot tell a
    half-close from a close, and a timed-out client's request must not keep its place in the queue."""
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}).encode()
    before = rows_computed(slower, "slow")
    with connect(slower) as first, connect(slower) as second:
        first.sendall(post("/v2/models/slow/infer", body))  # runs (one worker, hundreds of ms a row)
        second.sendall(post("/v2/models/slow/infer", body))  # queued behind it
        with connect(slower) as gone:
            gone.sendall(post("/v2/models/slow/infer", body))  # queued behind both, then its client leaves
        assert read_response(first, bytearray())[0] == 200
        began = time.monotonic()
        assert read_response(second, bytearray())[0] == 200
        row_s = time.monotonic() - began  # about one row's compute
    time.sleep(2 * row_s + 0.5)  # time enough for the third row to have run, had it stayed
    assert rows_computed(slower, "slow") - before == 2


def rows_computed(server: ServerHandle, model: str) -> float:
    with urllib.request.urlopen(f"http://{server.http_url}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(f'adaserve_inference_count_total{{model="{model}"'):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no row counter for {model}")


def test_a_head_is_answered_as_a_get_without_the_body(server: ServerHandle) -> None:
    """RFC 9110: a HEAD gets a GET's status and headers, and no body, on every route (a 405 too); a body there
    would be read as the start of the next answer on the connection, as it was before."""
    with connect(server) as sock:
        sock.sendall(
            b"HEAD /v2/models/mlp HTTP/1.1\r\nHost: t\r\n\r\n"
            + post("/v2/models/mlp/infer", b"{}").replace(b"POST", b"HEAD", 1)
            + b"GET /v2/models/mlp HTTP/1.1\r\nHost: t\r\n\r\n"
        )
        buffer = bytearray()
        head = read_head(sock, buffer)
        refused = read_head(sock, buffer)
        get = read_response(sock, buffer)
    assert head[0] == 200 and get[0] == 200 and head[1]["content-length"] == str(len(get[2]))
    assert json.loads(get[2])["name"] == "mlp"
    assert refused[0] == 405 and refused[1]["allow"] == "POST"


def test_connection_close_is_honoured(server: ServerHandle) -> None:
    with connect(server) as sock:
        sock.sendall(b"GET /v2 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        status, headers, body = read_response(sock, bytearray())
        assert sock.recv(1) == b""
    assert status == 200 and headers["connection"] == "close" and json.loads(body)["name"] == "adaserve"


def test_endless_headers_are_refused_and_the_connection_closed(server: ServerHandle) -> None:
    """URL and headers have a limit of their own (the body's does not cover them): one header that never ends is
    refused, the connection closed, and the server still serves."""
    head = b"GET /v2/health/ready HTTP/1.1\r\nHost: t\r\nX-Endless: "
    status, headers, body = refused_after(server, head, b"v" * 4096, 4 * MAX_HEAD_BYTES // 4096)
    assert status == 431 and headers["connection"] == "close"
    assert json.loads(body)["error"] == f"the request's URL and headers exceed the limit of {MAX_HEAD_BYTES} bytes"
    with connect(server) as sock:
        sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: t\r\n\r\n")
        assert read_response(sock, bytearray())[0] == 200


def test_a_large_body_sent_with_its_headers_is_not_taken_for_headers(server: ServerHandle) -> None:
    """A body that arrives in the same chunks as the headers counts against the body's limit, not the headers'."""
    rows = np.random.default_rng(0).random((16, 784))  # about 20 characters a value
    body = json.dumps({"inputs": [{"name": "image", "datatype": "FP32", "shape": [16, 784], "data": rows.tolist()}]})
    assert len(body) > 2 * MAX_HEAD_BYTES
    with connect(server) as sock:
        sock.sendall(post("/v2/models/mlp/infer", body.encode()) * 2)  # two, pipelined, in one send
        buffer = bytearray()
        assert [read_response(sock, buffer)[0] for _ in range(2)] == [200, 200]


def test_idle_connections_are_closed_and_a_stalled_request_gets_a_408() -> None:
    """An in-process server with a 0.3 s idle timeout: a connection that sends nothing is closed, one that stops
    mid-request gets a 408 then is closed, and one whose answer is being computed is kept however long it takes."""

    async def main() -> None:
        release = asyncio.Event()

        async def app(request: Request) -> Response:
            await release.wait()  # a long inference
            return Response(body=b"{}")

        limits = ClientLimits(
            max_body_bytes=1024, body_budget_bytes=4096, idle_timeout_s=0.3, header_timeout_s=0.3, body_timeout_s=0.3
        )
        server = HttpServer(app, on_error=lambda status, text: Response(status), limits=limits)
        listener = socket.create_server(("127.0.0.1", 0))
        await server.start(listener)
        address = listener.getsockname()

        reader, writer = await asyncio.open_connection(*address)
        assert await asyncio.wait_for(reader.read(), 10.0) == b""  # idle: closed
        writer.close()

        reader, writer = await asyncio.open_connection(*address)
        writer.write(b"POST /infer HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n12345")
        answer = await asyncio.wait_for(reader.read(), 10.0)
        assert answer.startswith(b"HTTP/1.1 408 ")  # stalled mid-body: told so, then closed
        writer.close()

        reader, writer = await asyncio.open_connection(*address)
        writer.write(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n")
        await asyncio.sleep(1.0)  # more than three timeouts while its answer is computed
        release.set()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10.0)
        assert head.startswith(b"HTTP/1.1 200 ")
        writer.close()
        await server.stop(grace_s=1.0)

    asyncio.run(main())


def test_a_client_that_does_not_read_its_answers_gets_no_more_until_it_does() -> None:
    """Flow control: a client that pipelines requests and never reads used to have every answer computed and
    buffered (a 16-row MLP request in a loop for 40 s grew the server from 76 to 240 MiB). Now answering pauses
    while the connection's buffer is full, reading stops behind it, and the answers resume when the client reads;
    one that stops reading for the idle timeout is dropped."""
    answer = Response(body=b"x" * 100_000)
    requests = 300

    async def main() -> None:
        calls = 0

        async def app(request: Request) -> Response:
            nonlocal calls
            calls += 1
            return answer

        limits = ClientLimits(max_body_bytes=1024, body_budget_bytes=4096, idle_timeout_s=3)
        server = HttpServer(app, on_error=lambda status, text: Response(status), limits=limits)
        listener = socket.create_server(("127.0.0.1", 0))
        await server.start(listener)
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(listener.getsockname())
        client.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(client, b"GET /big HTTP/1.1\r\nhost: x\r\n\r\n" * requests)
        await asyncio.sleep(1.0)
        assert calls < requests // 2  # the kernel's buffers hold some answers; the rest wait for the reader
        while calls < requests:
            assert await asyncio.wait_for(loop.sock_recv(client, 1 << 20), 10.0)
        assert calls == requests  # reading let every answer through
        client.close()

        stalled = socket.socket()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(listener.getsockname())
        stalled.sendall(b"GET /big HTTP/1.1\r\nhost: x\r\n\r\n" * requests)
        await asyncio.sleep(0.5)
        assert len(server.connections) == 1
        await asyncio.sleep(4.0)  # past the idle timeout without reading: dropped
        assert not server.connections
        stalled.close()
        await server.stop(grace_s=1.0)

    asyncio.run(main())


def test_reading_stops_once_the_waiting_requests_bodies_pass_the_body_limit() -> None:
    """Pipelined requests wait their turn in memory: past 32 of them, or once their bodies together pass
    `max_body_bytes`, the server stops reading until they are answered. Before, only the count bounded them, and
    32 bodies of the 64 MiB default limit could wait on one connection."""
    requests, body = 20, b"x" * 60_000

    async def main() -> None:
        release = asyncio.Event()

        async def app(request: Request) -> Response:
            await release.wait()
            return Response(body=b"{}")

        limits = ClientLimits(max_body_bytes=100_000, body_budget_bytes=10_000_000)
        server = HttpServer(app, on_error=lambda status, text: Response(status), limits=limits)
        listener = socket.create_server(("127.0.0.1", 0))
        await server.start(listener)
        reader, writer = await asyncio.open_connection(*listener.getsockname())
        head = b"POST /infer HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % len(body)
        writer.write((head + body) * requests)
        await asyncio.sleep(1.0)
        [connection] = server.connections
        assert len(connection.pending) <= 2  # one answering, two waiting at most: their bodies pass 100 kB
        release.set()
        for _ in range(requests):
            assert (await asyncio.wait_for(reader.readuntil(b"{}"), 10.0)).startswith(b"HTTP/1.1 200 ")
        writer.close()
        await server.stop(grace_s=1.0)

    asyncio.run(main())


def trickle_server(limits: ClientLimits) -> tuple[HttpServer, list[float]]:
    """An in-process server whose app answers at once, and the loop times its requests came in at."""
    served: list[float] = []

    async def app(request: Request) -> Response:
        served.append(asyncio.get_running_loop().time())
        return Response(body=b"{}")

    return HttpServer(app, on_error=lambda status, text: Response(status, text.encode()), limits=limits), served


async def trickle(address: tuple[str, int], data: bytes, every_s: float, at_once: bytes = b"") -> tuple[bytes, float]:
    """Send `at_once`, then `data` a byte every `every_s`, and read what comes back; the answer and when the server
    closed, seconds after the first byte."""
    reader, writer = await asyncio.open_connection(*address)
    started = asyncio.get_running_loop().time()

    async def send() -> None:
        writer.write(at_once)
        with contextlib.suppress(OSError):  # the server closes while bytes still come
            for byte in data:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(every_s)

    sending = asyncio.create_task(send())
    answer = await asyncio.wait_for(reader.read(), 30.0)
    closed_after = asyncio.get_running_loop().time() - started
    sending.cancel()
    writer.close()
    return answer, closed_after


def test_headers_and_bodies_that_trickle_in_get_a_408_at_their_deadline() -> None:
    """Slowloris: one header byte every 25 s restarted a 75 s idle timer, so a connection could be held for ever.
    A head now has `header_timeout_s` from its first byte however its bytes come, and a body `body_timeout_s` plus
    a second per `body_min_rate` bytes; a connection between requests keeps the idle timeout."""
    limits = ClientLimits(
        max_body_bytes=1024,
        body_budget_bytes=4096,
        idle_timeout_s=3.0,
        header_timeout_s=0.5,
        body_timeout_s=0.5,
        body_min_rate=100,
    )

    async def main() -> None:
        server, served = trickle_server(limits)
        listener = socket.create_server(("127.0.0.1", 0))
        await server.start(listener)
        address = listener.getsockname()

        head = b"GET /x HTTP/1.1\r\nhost: x\r\nx-padding: " + b"a" * 100 + b"\r\n\r\n"
        answer, after = await trickle(address, head, every_s=0.05)  # 6 s to send it whole
        assert answer.startswith(b"HTTP/1.1 408 ") and b"did not arrive within 0.5 s" in answer
        assert after < 3.0  # the head's deadline, not the idle timeout restarted by each byte
        assert not served

        head = b"POST /x HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n" + b"b" * 100
        answer, after = await trickle(address, b"b" * 900, every_s=0.05, at_once=head)  # 20 bytes a second
        assert answer.startswith(b"HTTP/1.1 408 ") and b"request body arrived too slowly" in answer
        assert after < 8.0  # 0.5 s, and a second per 100 bytes: about 2 s; sending it whole would take 45 s

        reader, writer = await asyncio.open_connection(*address)
        writer.write(b"GET /x HTTP/1.1\r\nhost: x\r\n\r\n")
        assert (await asyncio.wait_for(reader.readuntil(b"{}"), 10.0)).startswith(b"HTTP/1.1 200 ")
        await asyncio.sleep(1.0)  # between requests: the idle timeout (3 s), not the head's deadline, counts
        writer.write(b"GET /x HTTP/1.1\r\nhost: x\r\n\r\n")
        assert (await asyncio.wait_for(reader.readuntil(b"{}"), 10.0)).startswith(b"HTTP/1.1 200 ")
        writer.close()
        await server.stop(grace_s=1.0)

    asyncio.run(main())


def test_request_bodies_share_one_budget_and_small_ones_always_find_room() -> None:
    """30 connections each holding 60 MiB of an unfinished body took the server to 2.0 GB. Bodies now take from one
    budget: a large body that would pass 3/4 of it is refused at once (503), before it is read, while a small
    request still gets through, and a body let go of makes room again."""
    limits = ClientLimits(max_body_bytes=1 << 20, body_budget_bytes=2 << 20)
    large = 700_000

    async def main() -> None:
        server, served = trickle_server(limits)
        listener = socket.create_server(("127.0.0.1", 0))
        await server.start(listener)
        address = listener.getsockname()
        head = b"POST /x HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n"
        holders = []
        for _ in range(2):  # 1.4 MB of the 1.5 MiB large bodies may hold
            reader, writer = await asyncio.open_connection(*address)
            writer.write(head % large + b"h" * (large - 1))  # all but the last byte
            holders.append((reader, writer))
        await asyncio.sleep(0.5)
        assert server.budget.held == 2 * large

        reader, writer = await asyncio.open_connection(*address)
        writer.write(head % large)
        answer = await asyncio.wait_for(reader.read(), 10.0)
        assert answer.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1" in answer
        assert b"too many to take a body of 700000 bytes" in answer
        writer.close()

        reader, writer = await asyncio.open_connection(*address)
        writer.write(head % 1000 + b"s" * 1000)  # small: room is kept for it
        assert (await asyncio.wait_for(reader.readuntil(b"{}"), 10.0)).startswith(b"HTTP/1.1 200 ")
        writer.close()

        holders[0][1].close()  # one holder goes: its body is let go of
        await asyncio.sleep(0.5)
        assert server.budget.held == large
        reader, writer = await asyncio.open_connection(*address)
        writer.write(head % large + b"l" * large)
        assert (await asyncio.wait_for(reader.readuntil(b"{}"), 10.0)).startswith(b"HTTP/1.1 200 ")
        writer.close()
        holders[1][1].close()
        await asyncio.sleep(0.5)
        assert server.budget.held == 0
        assert len(served) == 2
        await server.stop(grace_s=1.0)

    asyncio.run(main())


def test_past_the_connection_limit_the_quietest_connection_makes_room_or_the_new_one_is_refused() -> None:
    """Held connections exhausted the server's open files. At `max_connections`, a new connection closes the one
    quiet longest (for `evict_after_s`, here 2 s), or, when every one is active, is refused with a 503."""
    limits = ClientLimits(max_connections=3, evict_after_s=2.0)

    async def main() -> None:
        release = asyncio.Event()

        async def app(request: Request) -> Response:
            if request.path == "/slow":
                await release.wait()
            return Response(body=b"{}")

        server = HttpServer(app, on_error=lambda status, text: Response(status, text.encode()), limits=limits)
        listener = socket.create_server(("127.0.0.1", 0))
        await server.start(listener)
        address = listener.getsockname()
        quiet = [await asyncio.open_connection(*address) for _ in range(3)]
        await asyncio.sleep(0.1)
        assert len(server.connections) == 3
        reader, writer = await asyncio.open_connection(*address)
        answer = await asyncio.wait_for(reader.read(), 10.0)  # all three started less than 2 s ago
        assert answer.startswith(b"HTTP/1.1 503 ") and b"the server has 3 connections open" in answer
        writer.close()

        await asyncio.sleep(2.5)
        quiet[1][1].write(b"GET /x HTTP/1.1\r\nhost: x\r\n\r\n")  # the second is active again
        await asyncio.wait_for(quiet[1][0].readuntil(b"{}"), 10.0)
        reader, writer = await asyncio.open_connection(*address)
        writer.write(b"GET /x HTTP/1.1\r\nhost: x\r\n\r\n")
        assert (await asyncio.wait_for(reader.readuntil(b"{}"), 10.0)).startswith(b"HTTP/1.1 200 ")
        assert await asyncio.wait_for(quiet[0][0].read(), 10.0) == b""  # the quietest made room
        assert len(server.connections) == 3
        for _, each in [*quiet, (reader, writer)]:
            each.close()

        await asyncio.sleep(0.2)
        busy = [await asyncio.open_connection(*address) for _ in range(3)]
        for _, each in busy:
            each.write(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n")
        await asyncio.sleep(2.5)  # quiet, but their answers are being computed: none makes room
        reader, writer = await asyncio.open_connection(*address)
        assert (await asyncio.wait_for(reader.read(), 10.0)).startswith(b"HTTP/1.1 503 ")
        writer.close()
        release.set()
        for each_reader, each_writer in busy:
            assert (await asyncio.wait_for(each_reader.readuntil(b"{}"), 10.0)).startswith(b"HTTP/1.1 200 ")
            each_writer.close()
        await server.stop(grace_s=1.0)

    asyncio.run(main())


def test_a_client_that_keeps_sending_after_its_refusal_is_drained_only_so_far() -> None:
    """After a last answer the server drains unread input for a while, so as not to reset the answer away; it
    drained all of it for 2 s, and 29 clients refused at their headers sending 60 MiB each cost the others 4.6x
    their p99. Past `LINGER_BYTES` the connection is reset now."""
    limits = ClientLimits(max_body_bytes=1000, body_budget_bytes=4000)

    async def main() -> None:
        server, _ = trickle_server(limits)
        listener = socket.create_server(("127.0.0.1", 0))
        await server.start(listener)
        reader, writer = await asyncio.open_connection(*listener.getsockname())
        writer.write(b"POST /x HTTP/1.1\r\nhost: x\r\ncontent-length: 100000000\r\n\r\n")
        assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10.0)).startswith(b"HTTP/1.1 413 ")
        sent = 0
        with contextlib.suppress(ConnectionError):
            while sent < 256 << 20:  # drained for 2 s, this all went: loopback takes it in well under that
                writer.write(b"x" * 65536)
                await asyncio.wait_for(writer.drain(), 10.0)
                sent += 65536
        assert sent < 3 * LINGER_BYTES  # reset once the server had thrown away its fill (and the buffers theirs)
        writer.close()
        await server.stop(grace_s=1.0)

    asyncio.run(main())


def test_a_stop_answers_every_request_sent_and_then_closes() -> None:
    """A stop closes the listener, and the kernel resets the connections it completed that the server had not
    accepted yet: a client whose request was sent got a reset for an answer (a node drained under load lost one
    that way). Now those are accepted and answered first; so is a request sent moments after the stop began, on a
    connection opened before it, and on a kept-alive one; each answer says `connection: close`."""

    async def main() -> None:
        async def app(request: Request) -> Response:
            await asyncio.sleep(0.05)
            return Response(body=request.path.encode())

        server = HttpServer(app, on_error=lambda status, text: Response(status))
        listener = socket.create_server(("127.0.0.1", 0))
        await server.start(listener)
        address = listener.getsockname()
        kept = socket.create_connection(address, timeout=10)
        kept.sendall(b"GET /first HTTP/1.1\r\nhost: x\r\n\r\n")
        kept_buffer = bytearray()
        assert await asyncio.to_thread(read_response, kept, kept_buffer) == (
            200,
            {"content-length": "6", "content-type": "application/json"},
            b"/first",
        )
        # Blocking calls with no await in between: the server's loop cannot accept these before the stop.
        sent = socket.create_connection(address, timeout=10)
        sent.sendall(b"GET /sent HTTP/1.1\r\nhost: x\r\n\r\n")
        silent = socket.create_connection(address, timeout=10)
        stopping = asyncio.get_running_loop().create_task(server.stop(grace_s=5.0))
        await asyncio.sleep(0.2)
        silent.sendall(b"GET /late HTTP/1.1\r\nhost: x\r\n\r\n")
        kept.sendall(b"GET /kept HTTP/1.1\r\nhost: x\r\n\r\n")
        for sock, buffer, path in (
            (sent, bytearray(), b"/sent"),
            (silent, bytearray(), b"/late"),
            (kept, kept_buffer, b"/kept"),
        ):
            status, headers, body = await asyncio.to_thread(read_response, sock, buffer)
            assert (status, body, headers.get("connection")) == (200, path, "close")
            assert await asyncio.to_thread(sock.recv, 1) == b""  # then closed
            sock.close()
        await stopping
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(address, timeout=10)

    asyncio.run(main())


def test_a_shortcut_answers_before_the_app_and_answers_keep_their_order() -> None:
    """The shortcut (on a cluster, a forward to the model's holder) is asked for a request only when nothing else
    on its connection is being answered or waits: requests pipelined behind it wait for its answer, then the app
    answers them, in order. A request the shortcut gives back is the app's; one whose client goes away is
    cancelled, and the body budget it held is returned."""

    async def main() -> None:
        taken: list[tuple[Request, Callable[[Response | None], None]]] = []
        cancelled: list[str] = []

        def shortcut(request: Request, answer: Callable[[Response | None], None]) -> Callable[[], None] | None:
            if not request.path.startswith("/fast"):
                return None
            taken.append((request, answer))
            return lambda: cancelled.append(request.path)

        release = asyncio.Event()

        async def app(request: Request) -> Response:
            if request.path.startswith("/slow"):
                await release.wait()
            return Response(body=b"app " + request.path.encode() + b" " + request.body)

        server = HttpServer(app, on_error=lambda status, text: Response(status), shortcut=shortcut)
        listener = socket.create_server(("127.0.0.1", 0))
        await server.start(listener)
        reader, writer = await asyncio.open_connection(*listener.getsockname())

        async def answer() -> bytes:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10.0)
            length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
            return await reader.readexactly(length)

        writer.write(post("/fast/1", b"one") + post("/app/2", b"two") + post("/fast/3", b"three"))
        while not taken:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        assert [r.path for r, _ in taken] == ["/fast/1"]  # the other two wait behind it, for the app
        assert server.budget.held == len(b"one") + len(b"two") + len(b"three")
        taken[0][1](Response(body=b"shortcut /fast/1"))
        assert [await answer() for _ in range(3)] == [b"shortcut /fast/1", b"app /app/2 two", b"app /fast/3 three"]

        writer.write(post("/slow/a", b"a"))  # while the app answers it, a request behind it waits its turn
        await asyncio.sleep(0.1)
        writer.write(post("/fast/b", b"b"))
        await asyncio.sleep(0.2)
        release.set()
        assert [await answer() for _ in range(2)] == [b"app /slow/a a", b"app /fast/b b"]
        assert len(taken) == 1

        writer.write(post("/fast/4", b"four"))
        while len(taken) < 2:
            await asyncio.sleep(0.01)
        taken[1][1](None)  # given back: the app answers it
        assert await answer() == b"app /fast/4 four"
        assert server.budget.held == 0

        writer.write(post("/fast/5", b"five"))
        while len(taken) < 3:
            await asyncio.sleep(0.01)
        writer.close()  # its client goes away
        while not cancelled:
            await asyncio.sleep(0.01)
        assert cancelled == ["/fast/5"] and server.budget.held == 0
        taken[2][1](Response(body=b"too late"))  # an answer after that is dropped
        await server.stop(grace_s=1.0)

    asyncio.run(main())
