"""Triton's CUDA shared-memory extension with `tritonclient.http` and `.grpc`: on a GPU machine a client's GPU memory
(here a torch tensor, shared by its CUDA IPC handle) is registered, an input read from it and an output written into
it; everywhere, registration is refused by name where it cannot work, and the routes and RPCs answer."""

from __future__ import annotations

import base64
import json
import urllib.request
import uuid
from multiprocessing import shared_memory
from typing import Any

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from adaserve.errors import InvalidInputError, NotAllowedError
from adaserve.server.cuda_ipc import cuda_driver_present
from adaserve.server.shared_memory import SharedMemoryRegions
from tests.server.reference import reference_outputs
from tests.server_utils import Clients, ServerHandle, needs_cuda

PROTOCOLS = {"http": httpclient, "grpc": grpcclient}
HANDLE = bytes(range(64))


def connect(clients: Clients, server: ServerHandle, protocol: str) -> Any:
    client = clients.of(server, protocol)
    client.unregister_cuda_shared_memory()
    return client


def cuda_regions(client: Any, protocol: str) -> dict[str, dict[str, int]]:
    status = client.get_cuda_shared_memory_status()
    if protocol == "grpc":  # a map of RegionStatus messages
        return {name: {"device_id": r.device_id, "byte_size": r.byte_size} for name, r in status.regions.items()}
    return {r["name"]: {"device_id": r["device_id"], "byte_size": r["byte_size"]} for r in status}


def extensions(client: Any, protocol: str) -> list[str]:
    metadata = client.get_server_metadata()
    return list(metadata["extensions"] if protocol == "http" else metadata.extensions)


def test_a_server_that_does_not_allow_client_memory_refuses_a_cuda_region_by_name() -> None:
    regions = SharedMemoryRegions(allowed=False)
    with pytest.raises(NotAllowedError, match="cannot register CUDA shared memory region 'gpu': client shared memory"):
        regions.register_cuda("gpu", HANDLE, 0, 1024)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (("", HANDLE, 0, 64), "CUDA shared memory region '': a region needs a name"),
        (("gpu", HANDLE[:10], 0, 64), "CUDA shared memory region 'gpu': a CUDA IPC handle is 64 bytes, got 10"),
        (("gpu", HANDLE, -1, 64), "CUDA shared memory region 'gpu': device_id must be a whole number >= 0, got -1"),
        (("gpu", HANDLE, 0, 0), "CUDA shared memory region 'gpu': byte_size must be a whole number >= 1, got 0"),
    ],
)
def test_a_bad_cuda_registration_is_refused_before_the_driver_is_asked(
    arguments: tuple[Any, ...], message: str
) -> None:
    with pytest.raises(InvalidInputError, match=message):
        SharedMemoryRegions(allowed=True).register_cuda(*arguments)


@pytest.mark.skipif(cuda_driver_present(), reason="this machine has a CUDA driver")
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_without_a_cuda_driver_registering_says_so_and_the_extension_is_not_announced(
    server: ServerHandle, protocol: str, clients: Clients
) -> None:
    client = connect(clients, server, protocol)
    with pytest.raises(InferenceServerException, match="CUDA shared memory needs a CUDA driver"):
        client.register_cuda_shared_memory("gpu", base64.b64encode(HANDLE).decode(), 0, 1024)
    assert cuda_regions(client, protocol) == {}
    announced = extensions(client, protocol)
    assert "system_shared_memory" in announced and "cuda_shared_memory" not in announced


def test_a_raw_handle_that_is_not_base64_is_a_400(server: ServerHandle) -> None:
    body = json.dumps({"raw_handle": {"b64": "not base64!"}, "device_id": 0, "byte_size": 64}).encode()
    request = urllib.request.Request(f"http://{server.http_url}/v2/cudasharedmemory/region/gpu/register", body)
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(request, timeout=10)
    assert raised.value.code == 400 and json.loads(raised.value.read())["error"] == "raw_handle: 'b64' is not base64"


def test_system_and_cuda_regions_share_one_namespace_and_each_kind_keeps_to_its_own() -> None:
    block = shared_memory.SharedMemory(name=f"adaserve_test_{uuid.uuid4().hex[:12]}", create=True, size=4096)
    regions = SharedMemoryRegions(allowed=True)
    try:
        regions.register("x", block.name, 0, 4096)
        with pytest.raises(InvalidInputError, match="CUDA shared memory region 'x' is already registered"):
            regions.register_cuda("x", HANDLE, 0, 64)
        with pytest.raises(InvalidInputError, match="shared memory region 'x' is a system region, not cuda"):
            regions.status("x", "cuda")
        regions.unregister("x", "cuda")  # not a CUDA region: left alone, and not an error (Triton's)
        regions.unregister(kind="cuda")
        assert regions.status(kind="cuda") == [] and [r["name"] for r in regions.status()] == ["x"]
    finally:
        regions.close()
        block.close()
        block.unlink()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_cuda_routes_and_rpcs_answer_with_no_region(server: ServerHandle, protocol: str, clients: Clients) -> None:
    client = connect(clients, server, protocol)
    client.unregister_cuda_shared_memory("absent")  # not registered: not an error
    assert cuda_regions(client, protocol) == {}


# -- on a GPU ----------------------------------------------------------------------------------------------------
@needs_cuda
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_inputs_are_read_from_and_outputs_written_to_a_clients_gpu_memory(
    server: ServerHandle, protocol: str, clients: Clients
) -> None:
    module, client = PROTOCOLS[protocol], connect(clients, server, protocol)
    x = np.random.default_rng(7).random((2, 784), dtype=np.float32)
    block = torch.zeros(1 << 16, dtype=torch.uint8, device="cuda")  # the client's GPU memory
    block[: x.nbytes].copy_(torch.from_numpy(x.view(np.uint8).reshape(-1)))
    torch.cuda.synchronize()
    # torch's handle is a version byte, a kind byte, then cudaIpcGetMemHandle's 64 bytes for the allocation the
    # tensor lies in (the caching allocator's); the tensor starts `start` bytes into that allocation.
    _, shared, size, start, *_ = block.untyped_storage()._share_cuda_()
    handle = shared[2:]
    client.register_cuda_shared_memory("gpu", base64.b64encode(handle).decode(), 0, start + size)
    assert cuda_regions(client, protocol) == {"gpu": {"device_id": 0, "byte_size": start + size}}

    image = module.InferInput("image", [2, 784], "FP32")
    image.set_shared_memory("gpu", x.nbytes, offset=start)
    logits = module.InferRequestedOutput("logits", **({"binary_data": True} if protocol == "http" else {}))
    logits.set_shared_memory("gpu", 2 * 10 * 4, offset=start + 8192)
    result = client.infer("mlp", [image], outputs=[logits])
    assert result.get_output("logits") is not None
    torch.cuda.synchronize()
    written = block[8192 : 8192 + 80].cpu().numpy().view(np.float32).reshape(2, 10)
    np.testing.assert_allclose(written, reference_outputs("mlp", x), rtol=1e-4, atol=1e-4)
    assert "cuda_shared_memory" in extensions(client, protocol)

    with pytest.raises(InferenceServerException, match="runs past the end of region 'gpu'"):
        image.set_shared_memory("gpu", x.nbytes, offset=start + size)
        client.infer("mlp", [image])
    client.unregister_cuda_shared_memory("gpu")
    assert cuda_regions(client, protocol) == {}
