"""Workers die under load: no accepted request is lost, and the worker set is restored. Many connections at once do
not stop the server accepting."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.server.reference import reference_outputs
from tests.server_utils import (
    Clients,
    ServerHandle,
    link_example,
    restarts,
    running_server,
    worker_pids,
    write_slow_model,
)


def test_killed_workers_lose_no_request(server: ServerHandle, clients: Clients) -> None:
    client = clients.http(server.http_url)
    model = "cnn"
    before = worker_pids(client, model)
    restarts_before = restarts(server, model)
    rng = np.random.default_rng(6)
    arrays = [rng.random((int(rng.integers(1, 9)), 1, 28, 28), dtype=np.float32) for _ in range(600)]
    victims = before[::2]  # every other worker: the only one on 2 cores (one busy thread), three of six on 16

    def kill_during_load() -> None:
        for pid in victims:
            time.sleep(0.3)
            os.kill(pid, signal.SIGKILL)

    def send(array: np.ndarray) -> np.ndarray:
        tensor = httpclient.InferInput("image", list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        with httpclient.InferenceServerClient(server.http_url) as local:
            return local.infer(model, [tensor]).as_numpy("logits")

    killer = threading.Thread(target=kill_during_load)
    killer.start()
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(send, arrays))
    killer.join()

    np.testing.assert_allclose(
        np.concatenate(results), reference_outputs(model, np.concatenate(arrays)), rtol=1e-4, atol=1e-4
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(worker_pids(client, model)) < len(before):
        time.sleep(0.1)
    after = worker_pids(client, model)
    assert len(after) == len(before)
    assert not set(victims) & set(after)
    assert restarts(server, model) == restarts_before + len(victims)
    stats = client.get_inference_statistics(model)["model_stats"][0]["inference_stats"]
    assert stats["fail"]["count"] == 0


def test_a_request_that_kills_its_worker_twice_gets_an_explicit_error(tmp_path: Path) -> None:
    """Its rows run once more after the first death; after the second, the request is answered with an error."""
    repository = tmp_path / "models"
    write_slow_model(repository, "glacial", rounds=60_000)  # about a second or more per request on this machine

    def send(url: str, value: float) -> list[list[float]]:
        tensor = httpclient.InferInput("x", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.full((1, 4), value, dtype=np.float32))
        with httpclient.InferenceServerClient(url, connection_timeout=120, network_timeout=120) as local:
            return local.infer("glacial", [tensor]).as_numpy("y").tolist()  # type: ignore[no-any-return]

    with running_server(repository) as handle, httpclient.InferenceServerClient(handle.http_url) as client:
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(send, handle.http_url, 1.0)
            killed: set[int] = set()
            for _ in range(2):
                pid = _wait_for_busy_worker(handle, client, other_than=killed)
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            with pytest.raises(InferenceServerException, match=r"died while computing this request \(2 times\)"):
                pending.result()
        assert send(handle.http_url, 3.0) == [[3.0] * 4]


def _wait_for_busy_worker(handle: ServerHandle, client: httpclient.InferenceServerClient, other_than: set[int]) -> int:
    """The pid of the model's one worker (not one already killed) once it holds the request (one row in flight)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://{handle.http_url}/metrics", timeout=10) as response:
            inflight = [
                line
                for line in response.read().decode().splitlines()
                if line.startswith('adaserve_inflight_rows{model="glacial"')
            ]
        pids = [pid for pid in worker_pids(client, "glacial") if pid not in other_than]
        if inflight and inflight[0].endswith(" 1.0") and pids:
            return pids[0]
        time.sleep(0.05)
    raise AssertionError("the request never reached a worker")


SOFT_DEFAULT = 1024  # the usual soft open-file limit
IDLE_CONNECTIONS = 1200


@pytest.mark.skipif(
    resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 2 * IDLE_CONNECTIONS,
    reason="needs a hard open-file limit above 2,400",
)
def test_the_server_raises_its_open_file_limit_so_many_idle_connections_do_not_stop_it(
    tmp_path: Path, clients: Clients
) -> None:
    """Started with the usual soft limit of 1,024 open files, the server raises it to the hard limit: with 1,200
    idle connections open, a new client is still answered. Before, connections past the limit were dropped unread,
    and a worker could not have been restarted."""
    link_example(tmp_path, "mlp", workers=[{"batch": 1, "threads": 1}])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (SOFT_DEFAULT, hard))  # what the server inherits
    try:
        with running_server(tmp_path) as server:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # room for this test's own connections
            limits = Path(f"/proc/{server.pid}/limits").read_text()
            assert [line.split()[3:5] for line in limits.splitlines() if line.startswith("Max open files")] == [
                [str(hard), str(hard)]
            ]
            host, port = server.http_url.split(":")
            with contextlib.ExitStack() as idle:
                for _ in range(IDLE_CONNECTIONS):
                    idle.enter_context(socket.create_connection((host, int(port)), timeout=30))
                client = clients.http(server.http_url, network_timeout=30)
                x = np.zeros((1, 784), dtype=np.float32)
                image = httpclient.InferInput("image", [1, 784], "FP32")
                image.set_data_from_numpy(x)
                np.testing.assert_allclose(
                    client.infer("mlp", [image]).as_numpy("logits"),
                    reference_outputs("mlp", x),
                    rtol=1e-5,
                    atol=1e-5,
                )
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
