"""Triton's system shared-memory extension against the real server, with `tritonclient.http` and `.grpc`: the
client creates POSIX shared memory (here with Python's `multiprocessing.shared_memory`, as a Python client would;
tritonclient's own helper needs `pkg_resources`, which current setuptools no longer ships), registers regions of it,
and names them in requests; inputs are read from it and outputs written into it."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from multiprocessing import shared_memory
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from adaserve.cli import build_parser
from adaserve.errors import InvalidInputError, NotAllowedError
from adaserve.server.protocol import SharedMemoryRef
from adaserve.server.shared_memory import SharedMemoryRegions
from tests.server.reference import reference_outputs
from tests.server_utils import Clients, ServerHandle

PROTOCOLS = {"http": (httpclient, "400"), "grpc": (grpcclient, "StatusCode.INVALID_ARGUMENT")}
ROW_BYTES = 784 * 4
LOGITS_BYTES = 10 * 4


@pytest.fixture
def memory() -> Iterator[shared_memory.SharedMemory]:
    """64 KiB of POSIX shared memory, removed after the test."""
    block = shared_memory.SharedMemory(name=f"adaserve_test_{uuid.uuid4().hex[:12]}", create=True, size=1 << 16)
    try:
        yield block
    finally:
        block.close()
        block.unlink()


def connect(clients: Clients, server: ServerHandle, protocol: str) -> tuple[Any, Any]:
    """The protocol's tritonclient module, and a client of the session's server with no regions registered."""
    module, _ = PROTOCOLS[protocol]
    client = clients.of(server, protocol)
    client.unregister_system_shared_memory()
    return module, client


def rows(count: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((count, 784), dtype=np.float32)


def put(memory: shared_memory.SharedMemory, array: np.ndarray, offset: int = 0) -> None:
    np.frombuffer(memory.buf, np.uint8, count=array.nbytes, offset=offset)[:] = array.reshape(-1).view(np.uint8)


def regions(client: Any, protocol: str) -> dict[str, dict[str, Any]]:
    status = client.get_system_shared_memory_status()
    if protocol == "grpc":
        fields = ("name", "key", "offset", "byte_size")
        return {name: {f: getattr(region, f) for f in fields} for name, region in status.regions.items()}
    return {region["name"]: region for region in status}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_inputs_are_read_from_and_outputs_written_into_shared_memory(
    server: ServerHandle, memory: shared_memory.SharedMemory, protocol: str, clients: Clients
) -> None:
    module, client = connect(clients, server, protocol)
    key = f"/{memory.name}"
    images = rows(4)
    put(memory, images, offset=4096)
    client.register_system_shared_memory("inputs", key, 4 * ROW_BYTES, offset=4096)
    client.register_system_shared_memory("outputs", key, 1024, offset=32768)
    assert regions(client, protocol)["inputs"] == {
        "name": "inputs",
        "key": key,
        "offset": 4096,
        "byte_size": 4 * ROW_BYTES,
    }
    assert "system_shared_memory" in (
        client.get_server_metadata()["extensions"] if protocol == "http" else client.get_server_metadata().extensions
    )

    tensor = module.InferInput("image", [4, 784], "FP32")
    tensor.set_shared_memory("inputs", 4 * ROW_BYTES)
    output = module.InferRequestedOutput("logits")
    output.set_shared_memory("outputs", 512, offset=64)
    result = client.infer("mlp", [tensor], outputs=[output])

    expected = reference_outputs("mlp", images)
    written = np.frombuffer(memory.buf, np.float32, count=40, offset=32768 + 64).reshape(4, 10).copy()
    np.testing.assert_allclose(written, expected, rtol=1e-5, atol=1e-5)
    named = result.get_output("logits")  # named, with its shape, and no data: it is in the region
    assert list(named["shape"] if protocol == "http" else named.shape) == [4, 10]
    if protocol == "http":
        assert "data" not in named and "parameters" not in named
    else:
        assert result.get_response().raw_output_contents == [b""]

    # An input in shared memory with the output in the response; then one row at an offset inside the region.
    plain = module.InferRequestedOutput("logits", **({"binary_data": True} if protocol == "http" else {}))
    np.testing.assert_allclose(
        client.infer("mlp", [tensor], outputs=[plain]).as_numpy("logits"), expected, rtol=1e-5, atol=1e-5
    )
    single = module.InferInput("image", [1, 784], "FP32")
    single.set_shared_memory("inputs", ROW_BYTES, offset=2 * ROW_BYTES)
    np.testing.assert_allclose(client.infer("mlp", [single]).as_numpy("logits"), expected[2:3], rtol=1e-5, atol=1e-5)

    client.unregister_system_shared_memory("inputs")
    assert list(regions(client, protocol)) == ["outputs"]
    client.unregister_system_shared_memory()
    assert regions(client, protocol) == {}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_rows_from_shared_memory_answer_as_the_same_rows_in_the_body(
    server: ServerHandle, memory: shared_memory.SharedMemory, protocol: str, clients: Clients
) -> None:
    module, client = connect(clients, server, protocol)
    images = rows(2, seed=3)
    put(memory, images)
    client.register_system_shared_memory("both", f"/{memory.name}", 2 * ROW_BYTES)
    placed = module.InferInput("image", [2, 784], "FP32")
    placed.set_shared_memory("both", 2 * ROW_BYTES)
    sent = module.InferInput("image", [2, 784], "FP32")
    sent.set_data_from_numpy(images)
    np.testing.assert_array_equal(
        client.infer("mlp", [placed]).as_numpy("logits"), client.infer("mlp", [sent]).as_numpy("logits")
    )
    client.unregister_system_shared_memory()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bad_shared_memory_use_is_refused_by_name_and_the_server_keeps_serving(
    server: ServerHandle, memory: shared_memory.SharedMemory, protocol: str, clients: Clients
) -> None:
    module, client = connect(clients, server, protocol)
    status = PROTOCOLS[protocol][1]
    key = f"/{memory.name}"
    client.register_system_shared_memory("small", key, ROW_BYTES)

    def refused(call: Any, message: str) -> None:
        with pytest.raises(InferenceServerException) as raised:
            call()
        assert raised.value.status() == status, raised.value
        assert message in raised.value.message()

    def infer(region: str, size: int, offset: int = 0, rows_: int = 1, output: int | None = None) -> Any:
        tensor = module.InferInput("image", [rows_, 784], "FP32")
        tensor.set_shared_memory(region, size, offset=offset)
        outputs = None
        if output is not None:
            outputs = [module.InferRequestedOutput("logits")]
            outputs[0].set_shared_memory("small", output)
        return lambda: client.infer("mlp", [tensor], outputs=outputs)

    refused(infer("nowhere", ROW_BYTES), "input 'image': shared memory region 'nowhere' is not registered")
    refused(infer("small", ROW_BYTES, offset=4), "runs past the end of region 'small' (3136 bytes)")
    refused(infer("small", ROW_BYTES - 4), "input 'image': 3132 bytes of data for shape [1, 784] FP32; expected 3136")
    refused(infer("small", ROW_BYTES, output=8), "output 'logits': shared_memory_byte_size 8 is too small for the 40")
    refused(lambda: client.register_system_shared_memory("small", key, 16), "region 'small' is already registered")
    refused(lambda: client.register_system_shared_memory("x", "/adaserve_no_such_key", 16), "No such file or directory")
    refused(lambda: client.register_system_shared_memory("x", "../etc/passwd", 16), "is not a POSIX shared-memory name")
    refused(lambda: client.register_system_shared_memory("x", key, 1 << 20), "fewer than offset 0 + byte_size 1048576")
    refused(
        lambda: client.get_system_shared_memory_status("absent"),
        "shared memory region 'absent' is not registered",
    )
    twice = [module.InferInput("image", [1, 784], "FP32") for _ in range(2)]  # one in shared memory, one sent
    twice[0].set_shared_memory("small", ROW_BYTES)
    twice[1].set_data_from_numpy(rows(1))
    refused(lambda: client.infer("mlp", twice), "input 'image' is given twice")
    assert list(regions(client, protocol)) == ["small"]
    tensor = module.InferInput("image", [1, 784], "FP32")
    tensor.set_data_from_numpy(rows(1))
    assert client.infer("mlp", [tensor]).as_numpy("logits").shape == (1, 10)
    client.unregister_system_shared_memory()


def test_registering_is_refused_unless_the_server_allows_client_shared_memory(
    memory: shared_memory.SharedMemory,
) -> None:
    """Off by default, as in Triton: a client could otherwise have the server read and write any shared-memory
    object the server may open. The server's metadata then leaves the extension out."""
    regions = SharedMemoryRegions(allowed=False)
    with pytest.raises(NotAllowedError, match="start the server with --allow-client-shm"):
        regions.register("r", f"/{memory.name}", 0, 64)
    regions.unregister()  # tritonclient and perf_analyzer unregister everything first: not an error
    assert regions.status() == []
    with pytest.raises(InvalidInputError, match="'r' is not registered \\(client shared memory is off"):
        regions.read(SharedMemoryRef("r", 4), "input 'x'")
    assert build_parser().parse_args(["serve"]).allow_client_shm is False
    assert build_parser().parse_args(["serve", "--allow-client-shm"]).allow_client_shm is True
    assert build_parser().parse_args(["serve", "--allow-client-shm=true"]).allow_client_shm is True
    assert build_parser().parse_args(["serve", "--allow-client-shm=false"]).allow_client_shm is False


def test_an_input_read_from_a_region_is_the_requests_own_copy(memory: shared_memory.SharedMemory) -> None:
    """Read when the request is decoded: unregistering the region, or the client writing it again, leaves it."""
    regions = SharedMemoryRegions(allowed=True)
    put(memory, np.arange(4, dtype=np.float32))
    regions.register("r", memory.name, 0, 16)  # a key with or without its leading slash
    held = np.frombuffer(regions.read(SharedMemoryRef("r", 16), "input 'x'"), np.float32)
    put(memory, np.zeros(4, dtype=np.float32))
    regions.unregister("r")
    np.testing.assert_array_equal(held, [0, 1, 2, 3])
    assert regions.status() == []


def test_a_region_whose_object_shrank_is_an_error_for_the_request_not_a_crash(
    memory: shared_memory.SharedMemory,
) -> None:
    """Read through a mapping, a client's object truncated after registering killed the server with SIGBUS."""
    regions = SharedMemoryRegions(allowed=True)
    regions.register("r", memory.name, 4096, 8192)
    descriptor = os.open(f"/dev/shm/{memory.name}", os.O_RDWR)
    try:
        os.ftruncate(descriptor, 6000)
    finally:
        os.close(descriptor)
    with pytest.raises(InvalidInputError, match=r"key '.*' now holds fewer bytes .*read 1904 of 4096.*truncated"):
        regions.read(SharedMemoryRef("r", 4096, 0), "input 'x'")
    with pytest.raises(InvalidInputError, match=r"now holds fewer bytes than the region names; was it truncated"):
        regions.write(SharedMemoryRef("r", 40, 2000), np.ones(10, np.float32), "output 'y'")
    regions.close()
