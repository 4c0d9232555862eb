"""Compressed requests and answers: HTTP's content codings (tritonclient's `request_compression_algorithm` and
`response_compression_algorithm`, curl's `--compressed`) and gRPC's compression, with bad and oversized bodies."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import socket
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
from tritonclient.utils import InferenceServerException

from adaserve.server.content_coding import CodingError, accepted_coding, decode_body
from tests.conftest import MAX_REQUEST_BYTES
from tests.server.reference import reference_outputs
from tests.server.test_http_protocol import connect, infer_body, post, read_head, read_response
from tests.server_utils import ServerHandle, link_example, running_server

COMPRESS = {"gzip": gzip.compress, "deflate": zlib.compress}


def rows(count: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((count, 784), dtype=np.float32)


# -- the codings themselves ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("header", "coding"),
    [
        (None, None),
        ("", None),
        ("gzip", "gzip"),
        ("deflate", "deflate"),
        ("deflate, gzip, br, zstd", "gzip"),  # curl --compressed: equal weights go to gzip
        ("gzip;q=0.5, deflate", "deflate"),
        ("GZIP;Q=0.8", "gzip"),
        ("br", None),
        ("gzip;q=0", None),
        ("identity;q=1, gzip;q=0.5", None),
        ("*", "gzip"),
        ("*;q=0.3, gzip;q=0", "deflate"),
        ("gzip;q=high, deflate;q=2, br", None),  # malformed weights are skipped
    ],
)
def test_the_answer_is_in_the_coding_the_client_prefers(header: str | None, coding: str | None) -> None:
    assert accepted_coding(header) == coding


def decode(header: str | None, body: bytes, limit: int = 1 << 20) -> bytes:
    return asyncio.run(decode_body(header, body, limit))


def test_request_bodies_are_decoded_in_every_coding_and_order() -> None:
    data = b'{"inputs": []}' * 100
    assert decode(None, data) == decode("identity", data) == data
    assert decode("gzip", gzip.compress(data)) == decode("deflate", zlib.compress(data)) == data
    assert decode("deflate, gzip", gzip.compress(zlib.compress(data))) == data  # the last coding listed is undone first
    assert decode("gzip", gzip.compress(data[:700]) + gzip.compress(data[700:])) == data  # gzip members in a row
    pieces = [data[i : i + 20] for i in range(0, 1280, 20)]
    assert decode("gzip", b"".join(gzip.compress(piece) for piece in pieces)) == data[:1280]  # 64 members
    assert decode("gzip", b"") == b""


@pytest.mark.parametrize(
    ("header", "body", "status", "words"),
    [
        ("br", b"x", 415, "Content-Encoding 'br' is not supported; this server reads gzip, deflate"),
        ("gzip", b"not gzip at all", 400, "not valid gzip data"),
        ("deflate", gzip.compress(b"{}", mtime=0), 400, "not valid deflate data"),
        ("gzip", gzip.compress(b"{}" * 1000, mtime=0)[:-20], 400, "ends before its end marker"),
        ("deflate", zlib.compress(b"{}") + b"junk", 400, "4 bytes after the end of its deflate data"),
        ("gzip", gzip.compress(bytes(5000), mtime=0), 413, "exceeds the limit of 4096 bytes once decompressed (gzip)"),
        ("gzip", gzip.compress(b"", mtime=0) * 65, 400, "request body has more than 64 gzip members"),
    ],
)
def test_bodies_that_cannot_be_decoded_are_refused_by_name(header: str, body: bytes, status: int, words: str) -> None:
    with pytest.raises(CodingError) as refused:
        decode(header, body, limit=4096)
    assert refused.value.status == status and words in str(refused.value)
    assert refused.value.headers == ({"accept-encoding": "gzip, deflate"} if status == 415 else {})


# -- through the server --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("request_coding", [None, "gzip", "deflate"])
@pytest.mark.parametrize("response_coding", [None, "gzip", "deflate"])
@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_http_compression(
    server: ServerHandle, request_coding: str | None, response_coding: str | None, binary: bool
) -> None:
    array = rows(5)
    tensor = httpclient.InferInput("image", list(array.shape), "FP32")
    tensor.set_data_from_numpy(array, binary_data=binary)
    wanted = [httpclient.InferRequestedOutput("logits", binary_data=binary)]
    with httpclient.InferenceServerClient(server.http_url) as client:
        result = client.infer(
            "mlp",
            [tensor],
            outputs=wanted,
            request_compression_algorithm=request_coding,
            response_compression_algorithm=response_coding,
        )
    np.testing.assert_allclose(result.as_numpy("logits"), reference_outputs("mlp", array), rtol=1e-5, atol=1e-5)


def test_a_compressed_answer_says_so_and_a_head_counts_its_compressed_length(server: ServerHandle) -> None:
    body = infer_body(0.5)
    with connect(server) as sock:
        buffer = bytearray()
        sock.sendall(post("/v2/models/mlp/infer", body, "Accept-Encoding: gzip\r\n"))
        status, headers, answer = read_response(sock, buffer)
        assert status == 200 and headers["content-encoding"] == "gzip" and headers["vary"] == "accept-encoding"
        outputs = json.loads(gzip.decompress(answer))["outputs"][0]["data"]
        expected = reference_outputs("mlp", np.full((1, 784), 0.5, np.float32))[0]
        np.testing.assert_allclose(outputs, expected, rtol=1e-5, atol=1e-5)

        sock.sendall(post("/v2/models/mlp/infer", body))  # the same connection, not asking: answered as is
        status, headers, answer = read_response(sock, buffer)
        assert status == 200 and "content-encoding" not in headers and "vary" not in headers
        assert json.loads(answer)["outputs"][0]["data"] == outputs

        # The memory gauges (PSS) move whenever another process maps or drops a page they share, which on a busy
        # machine is between most two scrapes: the lengths are compared on a HEAD and a GET that saw the same content.
        for _ in range(50):
            sock.sendall(b"HEAD /metrics HTTP/1.1\r\nHost: t\r\nAccept-Encoding: deflate\r\n\r\n")
            status, headers = read_head(sock, buffer)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: t\r\nAccept-Encoding: deflate\r\n\r\n")
            status_get, headers_get, scraped = read_response(sock, buffer)
            if int(headers["content-length"]) == len(scraped):
                break
        assert status == status_get == 200
        assert headers["content-encoding"] == headers_get["content-encoding"] == "deflate"
        assert int(headers["content-length"]) == len(scraped) and b"adaserve_" in zlib.decompress(scraped)

        # metadata and errors go as they are, as Triton sends them: tritonclient reads them without decoding
        sock.sendall(b"GET /v2 HTTP/1.1\r\nHost: t\r\nAccept-Encoding: gzip, deflate\r\n\r\n")
        status, headers, metadata = read_response(sock, buffer)
        assert status == 200 and "content-encoding" not in headers and json.loads(metadata)["name"] == "adaserve"
        sock.sendall(post("/v2/models/nope/infer", body, "Accept-Encoding: gzip\r\n"))
        status, headers, error = read_response(sock, buffer)
        assert status == 404 and "content-encoding" not in headers and "nope" in json.loads(error)["error"]


def test_tritonclient_reads_errors_when_it_asks_for_compressed_answers(server: ServerHandle) -> None:
    tensor = httpclient.InferInput("image", [1, 783], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 783), np.float32))
    with (
        httpclient.InferenceServerClient(server.http_url) as client,
        pytest.raises(InferenceServerException, match=r"shape \[1, 783\] does not match"),
    ):
        client.infer("mlp", [tensor], response_compression_algorithm="gzip")


def test_tritonclient_asyncio_client(server: ServerHandle) -> None:
    """tritonclient.http.aio's session (aiohttp) asks for gzip on every request and decodes only inference answers."""
    array = rows(3, seed=2)

    async def run() -> tuple[dict[str, object], np.ndarray, np.ndarray]:
        async with aiohttpclient.InferenceServerClient(server.http_url) as client:
            assert await client.is_server_ready() and await client.is_model_ready("mlp")
            metadata = await client.get_model_metadata("mlp")
            await client.get_model_config("mlp")
            await client.get_inference_statistics("mlp")
            tensor = httpclient.InferInput("image", list(array.shape), "FP32")
            tensor.set_data_from_numpy(array)
            plain = await client.infer("mlp", [tensor])
            compressed = await client.infer("mlp", [tensor], response_compression_algorithm="deflate")
            return metadata, plain.as_numpy("logits"), compressed.as_numpy("logits")

    metadata, plain, compressed = asyncio.run(run())
    assert metadata["name"] == "mlp"
    for logits in (plain, compressed):
        np.testing.assert_allclose(logits, reference_outputs("mlp", array), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("coding", "body", "status", "words"),
    [
        ("br", infer_body(0.5), 415, "Content-Encoding 'br' is not supported"),
        ("gzip", infer_body(0.5), 400, "not valid gzip data"),
        ("gzip", gzip.compress(b" " * (MAX_REQUEST_BYTES + 1), mtime=0), 413, "exceeds the limit"),
    ],
)
def test_a_body_that_cannot_be_decoded_is_refused_and_the_connection_keeps_serving(
    server: ServerHandle, coding: str, body: bytes, status: int, words: str
) -> None:
    with connect(server) as sock:
        buffer = bytearray()
        sock.sendall(post("/v2/models/mlp/infer", body, f"Content-Encoding: {coding}\r\n"))
        answer_status, headers, answer = read_response(sock, buffer)
        assert answer_status == status and words in json.loads(answer)["error"]
        assert headers.get("accept-encoding") == ("gzip, deflate" if status == 415 else None)
        sock.sendall(post("/v2/models/mlp/infer", gzip.compress(infer_body(0.5)), "Content-Encoding: gzip\r\n"))
        assert read_response(sock, buffer)[0] == 200


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_tritonclient_grpc_compression(server: ServerHandle, coding: str) -> None:
    array = rows(7, seed=1)
    tensor = grpcclient.InferInput("image", list(array.shape), "FP32")
    tensor.set_data_from_numpy(array)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        result = client.infer("mlp", [tensor], compression_algorithm=coding)
    np.testing.assert_allclose(result.as_numpy("logits"), reference_outputs("mlp", array), rtol=1e-5, atol=1e-5)


def test_a_grpc_request_over_the_limit_once_decompressed_is_refused(server: ServerHandle) -> None:
    array = np.zeros((MAX_REQUEST_BYTES // (784 * 4) + 1, 784), np.float32)  # compresses to about a kilobyte
    tensor = grpcclient.InferInput("image", list(array.shape), "FP32")
    tensor.set_data_from_numpy(array)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        with pytest.raises(InferenceServerException) as refused:
            client.infer("mlp", [tensor], compression_algorithm="gzip")
        assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert client.is_server_live()


# -- gRPC answers compressed at a level ----------------------------------------------------------------------------
class ByteCounter:
    """A TCP relay in front of a server that counts the bytes the client sends (`sent`) and the server sends back
    (`received`)."""

    def __init__(self, target: str) -> None:
        host, port = target.split(":")
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.sent = self.received = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(self.target)
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, answers: bool) -> None:
        try:
            while data := source.recv(65536):
                if answers:
                    self.received += len(data)
                else:
                    self.sent += len(data)
                sink.sendall(data)
        except OSError:
            pass  # the other direction ended the connection
        for end in (source, sink):  # shutdown wakes the other direction's recv; close alone would not
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()

    def close(self) -> None:
        self.listener.close()


@pytest.fixture(scope="module")
def compressing_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    root: Path = tmp_path_factory.mktemp("compressing") / "models"
    link_example(root, "mlp")
    with running_server(root, "--grpc-infer-response-compression-level", "high") as handle:
        yield handle


def test_grpc_answers_are_compressed_for_clients_that_accept_it(compressing_server: ServerHandle) -> None:
    array = np.zeros((16, 784), np.float32)  # sixteen equal rows of logits: an answer that compresses well
    tensor = grpcclient.InferInput("image", list(array.shape), "FP32")
    tensor.set_data_from_numpy(array)
    received = {}
    for accepts in (True, False):
        relay = ByteCounter(compressing_server.grpc_url)
        # gRPC's bitset of the algorithms a channel takes: 1 is identity alone
        options = None if accepts else [("grpc.compression_enabled_algorithms_bitset", 1)]
        try:
            with grpcclient.InferenceServerClient(relay.url, channel_args=options) as client:
                for _ in range(10):
                    result = client.infer("mlp", [tensor])
                    np.testing.assert_allclose(
                        result.as_numpy("logits"), reference_outputs("mlp", array), rtol=1e-5, atol=1e-5
                    )
        finally:
            relay.close()
        received[accepts] = relay.received
    assert received[True] < 0.7 * received[False]
