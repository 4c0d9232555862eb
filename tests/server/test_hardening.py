"""Attacks on a real server, each answered with a cheap, early, named refusal while the other clients are served.

Each test is one row of what was tried as an attacker would (issue 54): bounded in time and count, seeded where it
draws, on loopback only. How much the other clients notice is measured in `benchmarks/hardening.py`; here the
bounds on their latency are generous, so that a busy machine does not fail them.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import http.client
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from adaserve.repository import ModelRepository
from adaserve.server.app import GRPC_DEFAULT_MESSAGE_BYTES, grpc_message_bytes
from adaserve.server.grpc_service import InferenceServicer, peek_model
from adaserve.server.grpc_stream import STREAM_WINDOW
from tests.server.reference import reference_outputs
from tests.server_utils import ServerHandle, link_example, running_server, write_config

#: A normal client's request during an attack is answered within this (on a quiet machine, milliseconds): before,
#: 16 gzip bombs in parallel made one wait 55 s.
PATIENCE_S = 10.0


def request(
    server: ServerHandle, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    """The status and JSON answer of a REST request (a POST when it has a body)."""
    method = "GET" if body is None else "POST"
    sent = urllib.request.Request(f"http://{server.http_url}{path}", body, headers or {}, method=method)
    try:
        with urllib.request.urlopen(sent, timeout=60) as answer:
            content = answer.read()
            return answer.status, json.loads(content) if content else None
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read())


def infer_body(rows: np.ndarray) -> bytes:
    tensor = {"name": "image", "datatype": "FP32", "shape": list(rows.shape), "data": rows.ravel().tolist()}
    return json.dumps({"inputs": [tensor]}).encode()


def normal_client(server: ServerHandle, stop: threading.Event, latencies: list[float]) -> None:
    """Infers one row at a time on fresh connections until `stop`, checking every answer, timing each."""
    rows = np.random.default_rng(0).random((1, 784), dtype=np.float32)
    expected = reference_outputs("mlp", rows)
    while not stop.is_set():
        started = time.monotonic()
        status, answer = request(server, "/v2/models/mlp/infer", infer_body(rows))
        latencies.append(time.monotonic() - started)
        assert status == 200, answer
        got = np.array(answer["outputs"][0]["data"], dtype=np.float32).reshape(expected.shape)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
        time.sleep(0.05)


@contextlib.contextmanager
def served_alongside(server: ServerHandle) -> Iterator[list[float]]:
    """A normal client running beside the block; its latencies, all answered correctly, when the block ends."""
    stop, latencies = threading.Event(), []
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(normal_client, server, stop, latencies)
        try:
            yield latencies
        finally:
            deadline = time.monotonic() + PATIENCE_S
            while len(latencies) < 3 and not running.done() and time.monotonic() < deadline:
                time.sleep(0.05)  # an attack refused faster than the client's first requests
            stop.set()
            running.result()
    assert latencies and max(latencies) < PATIENCE_S, latencies


# -- names, versions and shapes no model can have: 400 / INVALID_ARGUMENT, not 500 / INTERNAL ------------------
@pytest.mark.parametrize(
    ("method", "path", "words"),
    [
        ("POST", "/v2/repository/models/%00/load", "'\\x00' is not a model name: it holds a control character"),
        ("GET", "/v2/models/%00", "is not a model name"),
        ("GET", "/v2/models/%00/ready", "is not a model name"),
        ("GET", "/v2/models/a%2Fb/config", "'a/b' is not a model name: a name is one folder of the repository"),
        ("GET", "/v2/models/mlp/versions/%C2%B2", "version '²' is not a version number"),
        ("GET", "/v2/models/mlp/versions/%C2%B2/stats", "version '²' is not a version number"),
        ("GET", "/v2/models/mlp/versions/%C2%B2/config", "version '²' is not a version number"),
        ("POST", "/v2/models/mlp/versions/%C2%B2/infer", "version '²' is not a version number"),
        ("POST", "/v2/models/%00/infer", "is not a model name"),
    ],
)
def test_bad_names_and_versions_are_400s_over_rest(server: ServerHandle, method: str, path: str, words: str) -> None:
    status, answer = request(server, path, b"{}" if method == "POST" else None)
    assert (status, words in answer["error"]) == (400, True), answer


def test_a_shape_no_model_takes_is_a_400_before_its_data_is_read(server: ServerHandle) -> None:
    for shape, words in (
        ([0, 2**63], "does not match the model's [-1, 784]"),
        ([0, 2**63 - 1], "does not match the model's [-1, 784]"),
        ([2**40, 784], "batch size 1099511627776 is outside 1..16"),
    ):
        document = {"inputs": [{"name": "image", "datatype": "FP32", "shape": shape, "data": []}]}
        status, answer = request(server, "/v2/models/mlp/infer", json.dumps(document).encode())
        assert (status, words in answer["error"]) == (400, True), answer


@pytest.fixture
def stub(server: ServerHandle) -> Iterator[Any]:
    with grpc.insecure_channel(server.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def test_bad_names_versions_and_shapes_are_invalid_argument_over_grpc(stub: Any) -> None:
    calls = [
        (stub.ModelMetadata, service_pb2.ModelMetadataRequest(name="\x00"), "is not a model name"),
        (stub.ModelReady, service_pb2.ModelReadyRequest(name="mlp", version="²"), "is not a version number"),
        (stub.ModelConfig, service_pb2.ModelConfigRequest(name="mlp", version="²"), "is not a version number"),
        (stub.ModelStatistics, service_pb2.ModelStatisticsRequest(name="mlp", version="²"), "not a version number"),
        (stub.RepositoryModelLoad, service_pb2.RepositoryModelLoadRequest(model_name="\x00"), "is not a model name"),
    ]
    huge = service_pb2.ModelInferRequest(model_name="mlp")
    huge.inputs.add(name="image", datatype="FP32", shape=[0, 2**63 - 1])
    calls.append((stub.ModelInfer, huge, "does not match the model's [-1, 784]"))
    for call, message, words in calls:
        with pytest.raises(grpc.RpcError) as refused:
            call(message, timeout=30)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
        assert words in refused.value.details()


def test_typed_grpc_contents_a_model_cannot_take_are_refused_unread(stub: Any, server: ServerHandle) -> None:
    """60 MB of typed `fp32_contents` took 2.6 s of the event loop to convert before its shape was checked; then
    grpc.aio still parsed every message on the loop. A message larger than its model can take is now refused
    before it is parsed, and a shape it cannot take before its values are converted."""
    message = service_pb2.ModelInferRequest(model_name="mlp")
    tensor = message.inputs.add(name="image", datatype="FP32", shape=[200, 784])
    tensor.contents.fp32_contents.extend(np.zeros(200 * 784, dtype=np.float32))
    small = service_pb2.ModelInferRequest(model_name="mlp")
    small.inputs.add(name="image", datatype="FP32", shape=[20, 784]).contents.fp32_contents.extend([0.0] * 20)
    with served_alongside(server):
        for _ in range(5):
            with pytest.raises(grpc.RpcError) as refused:
                stub.ModelInfer(message, timeout=30)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "request for model 'mlp' of 627" in refused.value.details()
            assert "exceeds the 190976 bytes that 16 rows of its inputs can take" in refused.value.details()
            with pytest.raises(grpc.RpcError) as refused:
                stub.ModelInfer(small, timeout=30)
            assert "batch size 20 is outside 1..16" in refused.value.details()


@pytest.mark.parametrize(
    ("message", "named"),
    [
        (service_pb2.ModelInferRequest(model_name="mlp", model_version="2", id="x"), ("mlp", "2")),
        (service_pb2.ModelInferRequest(model_name="mlp"), ("mlp", "")),
        (service_pb2.ModelInferRequest(id="x"), None),
    ],
)
def test_a_grpc_request_names_its_model_before_it_is_parsed(message: Any, named: tuple[str, str] | None) -> None:
    assert peek_model(message.SerializeToString()) == named
    assert peek_model(b"\xff\xff") is None  # not protobuf: parsed, and refused by name, as any message


# -- bodies that inflate: held to what the model can take, decompressed in linear time ----------------------------
def test_a_gzip_bomb_of_json_numbers_is_refused_at_what_the_model_takes(server: ServerHandle) -> None:
    """A 64 KB gzip body inflating to 63 MiB of JSON numbers stalled the event loop 3 s each; 16 in parallel made a
    normal request wait 55 s. It is now refused once it inflates past what `mlp` can take (16 rows as JSON)."""
    numbers = b'{"inputs":[{"name":"image","datatype":"FP32","shape":[1,784],"data":[' + b"1.0," * (16 << 20)
    bomb = gzip.compress(numbers + b"1.0]}]}", 9)
    assert len(bomb) < 100_000
    with served_alongside(server), ThreadPoolExecutor(16) as pool:
        answers = list(
            pool.map(lambda _: request(server, "/v2/models/mlp/infer", bomb, {"Content-Encoding": "gzip"}), range(32))
        )
    for status, answer in answers:
        assert status == 413
        assert "request body for model 'mlp' (at most 16 rows of its inputs) exceeds the limit of" in answer["error"]


def test_a_body_of_many_empty_gzip_members_is_refused_at_the_member_cap(server: ServerHandle) -> None:
    """Each gzip member copied all the data after it: 4 MiB of empty members took 17 s of a core. Members are
    decompressed in linear time now, and a body holds at most 64: 950 kB of empty ones (48,000) are a 400."""
    members = gzip.compress(b"") * (950_000 // len(gzip.compress(b"")))
    with served_alongside(server):
        status, answer = request(server, "/v2/repository/index", members, {"Content-Encoding": "gzip"})
    assert status == 400 and "request body has more than 64 gzip members" in answer["error"]
    status, answer = request(server, "/v2/repository/index", gzip.compress(b"{}") * 64, {"Content-Encoding": "gzip"})
    assert status == 400 and "not valid JSON" in answer["error"]  # 64 members are read: "{}{}{}..." is no JSON


# -- the listen backlog -------------------------------------------------------------------------------------------
@pytest.mark.skipif(shutil.which("ss") is None, reason="needs iproute2's ss")
def test_the_http_port_listens_with_the_backlog_asked_for(server: ServerHandle) -> None:
    """asyncio listened again with 100 on the socket it was given: 141 connections were reset under overload."""
    port = server.http_url.rsplit(":", 1)[1]
    listing = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout
    somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
    assert [int(line.split()[2]) for line in listing.splitlines()] == [min(2048, somaxconn)]


# -- a server with small limits: held bodies, trickling headers, too many connections ------------------------
@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    """A server whose limits are small enough to reach in seconds: 4 MB a request, 8 MB held, 40 connections, 2 s
    for a request's headers."""
    root = tmp_path_factory.mktemp("limited") / "models"
    link_example(root, "mlp", workers=[{"batch": 1}, {"batch": 4}])
    flags = ["--max-request-bytes", "4000000", "--max-request-bytes-held", "8000000", "--max-connections", "40"]
    with running_server(root, *flags, "--http-header-timeout", "2", "--http-body-timeout", "2") as handle:
        yield handle


def rss_bytes(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) * 1024


def test_unfinished_bodies_on_many_connections_hold_no_more_than_the_budget(limited: ServerHandle) -> None:
    """30 connections each holding 60 MiB of an unfinished body took the server from 174 MB to 2.0 GB. Here 30
    hold 3.9 MB each (117 MB) on a route the server's limit holds them to (an inference route refuses a body its
    model cannot take at its headers): the server takes one, refuses the rest at once, and serves a normal
    client."""
    host, port = limited.http_url.split(":")
    before = rss_bytes(limited.pid)
    head = b"POST /v2/repository/index HTTP/1.1\r\nhost: x\r\ncontent-length: 3900000\r\n\r\n"
    refused = 0
    with contextlib.ExitStack() as holders, served_alongside(limited):
        for _ in range(30):
            sock = holders.enter_context(socket.create_connection((host, int(port)), timeout=30))
            sock.settimeout(0.5)
            try:
                sock.sendall(head + b"1" * 3_800_000)
                answer = sock.recv(4096)
            except (TimeoutError, OSError):
                continue  # still taking its body
            refused += answer.startswith(b"HTTP/1.1 503 ") and b"request bodies, too many" in answer
        grown = rss_bytes(limited.pid) - before
    assert refused >= 25
    assert grown < 40_000_000, f"the server grew by {grown} bytes"


def test_slowloris_connections_are_cut_at_the_header_deadline_and_make_room(limited: ServerHandle) -> None:
    """One header byte every 25 s held a connection for ever, and 19,980 of them exhausted the open files. Here
    120 connections, three times the limit, each send a byte every 0.5 s: each is closed within the 2 s head
    deadline or to make room, the server never holds more than its 40, and a normal client is served throughout."""
    host, port = limited.http_url.split(":")
    ended: list[float] = []

    def slowloris() -> None:
        started = time.monotonic()
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            try:
                for byte in b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\nx-a: " + b"a" * 100:
                    sock.sendall(bytes([byte]))
                    time.sleep(0.5)
                    if time.monotonic() - started > 20:
                        break
            except OSError:
                pass  # closed by the server
            ended.append(time.monotonic() - started)

    with served_alongside(limited), ThreadPoolExecutor(120) as pool:
        for _ in range(120):
            pool.submit(slowloris)
            time.sleep(0.02)  # 50 a second: at most 13 of the 40 are younger than 0.25 s
        time.sleep(1.0)
        sockets = sum(1 for link in Path(f"/proc/{limited.pid}/fd").iterdir() if "socket" in _target(link))
    assert max(ended) < 10.0, sorted(ended)
    assert sockets < 40 + 60  # the held connections, the gRPC and worker sockets, the listeners


def _target(link: Path) -> str:
    try:
        return str(link.readlink())
    except OSError:
        return ""


def test_a_label_file_linked_outside_the_repository_is_never_read(tmp_path: Path) -> None:
    """`labels.txt -> /etc/passwd` answered that file's lines as class labels. The model now fails to load, named."""
    root = tmp_path / "models"
    link_example(root, "mlp", workers=[{"batch": 1}])
    (root / "mlp" / "labels.txt").unlink()
    (root / "mlp" / "labels.txt").symlink_to("/etc/passwd")
    with running_server(root) as server:
        status, answer = request(server, "/v2/repository/index", b"{}")
        [row] = answer
        assert row["state"] == "UNAVAILABLE" and "links to /etc/passwd, outside the model repository" in row["reason"]
        status, answer = request(server, "/v2/models/mlp/infer", infer_body(np.zeros((1, 784), np.float32)))
        assert status == 503 and "root:" not in json.dumps(answer)


# -- a gRPC stream whose client never reads its answers -----------------------------------------------------------
def test_a_stream_whose_client_takes_no_answers_is_read_no_further_than_its_window() -> None:
    """A `ModelStreamInfer` call read every request its client sent and queued every answer the client did not
    take (1.5 KB each: 115 to 374 MB in 60 s). It now reads at most `STREAM_WINDOW` requests ahead of the answers
    taken, so gRPC's flow control holds the client's sends back; every request is still answered, once."""
    pulled = 0

    async def requests() -> Any:
        nonlocal pulled
        for index in range(1000):
            pulled += 1
            yield service_pb2.ModelInferRequest(model_name="mlp", id=str(index)).SerializeToString()

    async def parsed(raw: bytes) -> tuple[Any, Any]:
        return service_pb2.ModelInferRequest.FromString(raw), None

    async def answer(request: Any, config: Any, context: Any, arrived_ns: int) -> Any:
        return service_pb2.ModelInferResponse(model_name="mlp", id=request.id)

    servicer = InferenceServicer(plane=None)  # type: ignore[arg-type]  # no request reaches the data plane
    servicer._parsed = parsed  # type: ignore[method-assign]
    servicer._infer = answer  # type: ignore[method-assign]

    async def main() -> None:
        stream = servicer.ModelStreamInfer(requests(), context=None)  # type: ignore[arg-type]
        first = await anext(stream)
        await asyncio.sleep(0.5)  # the reader goes as far as it may
        assert pulled <= STREAM_WINDOW + 2
        answers = [first] + [each async for each in stream]
        assert sorted(int(each.infer_response.id) for each in answers) == list(range(1000))

    asyncio.run(main())


# -- client shared memory truncated after registering ------------------------------------------------------------
def test_an_input_region_truncated_after_registering_is_a_400_and_the_server_lives(server: ServerHandle) -> None:
    """Register a region, shrink its file, infer from it: read through a mapping, that killed the whole server,
    its hosts and workers with it (SIGBUS, exit 135)."""
    block = shared_memory.SharedMemory(name=f"adaserve_hardening_{os.getpid()}", create=True, size=1 << 16)
    region = f"shrunk_{os.getpid()}"
    try:
        register = {"key": block.name, "offset": 0, "byte_size": 784 * 4 * 4}
        path = f"/v2/systemsharedmemory/region/{region}/register"
        assert request(server, path, json.dumps(register).encode())[0] == 200
        descriptor = os.open(f"/dev/shm/{block.name}", os.O_RDWR)
        try:
            os.ftruncate(descriptor, 100)
        finally:
            os.close(descriptor)
        placed = {"shared_memory_region": region, "shared_memory_byte_size": 784 * 4}
        document = {"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 784], "parameters": placed}]}
        with served_alongside(server):
            for protocol_path in ("/v2/models/mlp/infer", "/v2/models/mlp/versions/1/infer"):
                status, answer = request(server, protocol_path, json.dumps(document).encode())
                assert status == 400 and "now holds fewer bytes than the region names" in answer["error"]
    finally:
        request(server, f"/v2/systemsharedmemory/region/{region}/unregister", b"")
        block.close()
        block.unlink()


# -- a worker killed while the server has no open file to spare ---------------------------------------------------
def steady_fd_floor(pid: int, samples: int = 10) -> int:
    """The lowest descriptor number that process `pid` had free in any of `samples` looks 50 ms apart: every number
    below it was held throughout, so none of them is a file the process opens and closes in passing."""
    lowest_free = []
    for _ in range(samples):
        held = {int(fd.name) for fd in Path(f"/proc/{pid}/fd").iterdir()}
        lowest_free.append(next(number for number in range(len(held) + 1) if number not in held))
        time.sleep(0.05)
    return min(lowest_free)


def test_a_worker_killed_while_open_files_are_exhausted_is_restarted_once_they_are_not(tmp_path: Path) -> None:
    """Killed while the server's open files were exhausted, a worker could not be restarted ([Errno 24]) and the
    model stayed unavailable for good with its other workers alive. The server is held here to the open files it
    has, one worker is killed: the other serves, the restart is tried again with backoff, and once files are
    allowed again the model has both workers back, with no manual load."""
    root = tmp_path / "models"
    link_example(root, "mlp", workers=[{"batch": 1}, {"batch": 2}])
    with (
        running_server(root) as server,
        contextlib.closing(
            http.client.HTTPConnection(*server.http_url.split(":"), timeout=30)  # opened before the cap
        ) as connection,
    ):
        rows = np.zeros((1, 784), np.float32)

        def infer() -> int:
            connection.request("POST", "/v2/models/mlp/infer", infer_body(rows))
            answer = connection.getresponse()
            answer.read()
            return answer.status

        def workers() -> list[int]:
            connection.request("GET", "/v2/models/mlp/config")
            config = json.loads(connection.getresponse().read())
            return sorted(w["pid"] for w in json.loads(config["parameters"]["workers"]["string_value"]))

        assert infer() == 200
        pids = workers()
        soft, hard = resource.prlimit(server.pid, resource.RLIMIT_NOFILE)
        # Two below the lowest descriptor number free at any moment for a while: the killed worker's two pipe ends
        # and up to two of the server's short-lived files (a /proc read) closing still leave fewer than the four
        # that a restart's pipes take.
        resource.prlimit(server.pid, resource.RLIMIT_NOFILE, (steady_fd_floor(server.pid) - 2, hard))
        try:
            os.kill(pids[0], signal.SIGKILL)  # a worker this test's server started, by its PID
            deadline = time.monotonic() + 60.0
            while "cannot restart worker; trying again" not in server.log.read_text():
                assert time.monotonic() < deadline, server.log.read_text()[-2000:]
                time.sleep(0.1)
            assert infer() == 200  # the other worker serves: the model is not unavailable
        finally:
            resource.prlimit(server.pid, resource.RLIMIT_NOFILE, (soft, hard))
        while len(workers()) < 2:
            assert time.monotonic() < deadline + 60.0, server.log.read_text()[-2000:]
            time.sleep(0.1)
        assert infer() == 200 and pids[0] not in workers()


# -- a model host killed from outside --------------------------------------------------------------------------
def test_a_killed_model_host_is_reaped_at_once_and_the_model_serves_on(limited: ServerHandle) -> None:
    """A killed host stayed a zombie until the next worker death restarted it."""
    _, config = request(limited, "/v2/models/mlp/config")
    workers = [w["pid"] for w in json.loads(config["parameters"]["workers"]["string_value"])]
    host = int(Path(f"/proc/{workers[0]}/stat").read_text().rsplit(")", 1)[1].split()[1])  # the worker's parent
    assert host not in (limited.pid, *workers)
    os.kill(host, signal.SIGKILL)  # the host of this test's server's model, by its PID
    deadline = time.monotonic() + 30.0
    while Path(f"/proc/{host}").exists():  # a zombie keeps its /proc entry until it is reaped
        assert time.monotonic() < deadline, "the killed host was not reaped"
        time.sleep(0.05)
    with served_alongside(limited):
        pass
    assert "model host exited; its workers serve on" in limited.log.read_text()


def test_grpc_takes_no_more_connections_than_the_limit(limited: ServerHandle) -> None:
    """gRPC's core holds its connections to `--max-connections` too (40 here): the 41st is not taken."""
    with contextlib.ExitStack() as stack:
        own = [("grpc.use_local_subchannel_pool", 1)]  # a connection each, not one shared by all
        channels = [stack.enter_context(grpc.insecure_channel(limited.grpc_url, options=own)) for _ in range(41)]
        ready = []
        for channel in channels:
            try:
                grpc.channel_ready_future(channel).result(timeout=3)
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                ready.append(stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=3).live)
            except (grpc.FutureTimeoutError, grpc.RpcError):
                ready.append(False)
    assert ready.count(True) == 40, ready


def test_grpc_receives_no_larger_message_than_the_repository_takes(tmp_path: Path) -> None:
    """gRPC's core refuses a message longer than its limit before receiving it; with --max-request-bytes unset the
    limit is the largest request the repository's models can take at start, at least gRPC's own 4 MiB."""
    root = tmp_path / "models"
    link_example(root, "mlp")
    repository = ModelRepository(root)
    assert grpc_message_bytes(repository, 64 << 20) == GRPC_DEFAULT_MESSAGE_BYTES  # 16 rows of 784 values: 190 KB
    image = {"name": "image", "datatype": "FP32", "shape": [-1, 3, 224, 224]}
    link_example(root, "mlp", "wide", inputs=[image])  # its config alone is read: the artifact does not matter
    write_config(root / "broken", {"inputs": "not a list"})
    assert grpc_message_bytes(repository, 64 << 20) == 16 * 3 * 224 * 224 * 10 + 64 * 1024
    assert grpc_message_bytes(repository, 10 << 20) == 10 << 20  # never past --max-request-bytes
