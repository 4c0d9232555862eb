"""Workers die under load: no accepted request is lost, and the worker set is restored."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tritonclient.http as httpclient

from tests.server.reference import reference_outputs
from tests.server_utils import ServerHandle


def worker_pids(client: httpclient.InferenceServerClient, model: str) -> list[int]:
    workers = json.loads(client.get_model_config(model)["parameters"]["workers"]["string_value"])
    return [w["pid"] for w in workers]


def restarts(server: ServerHandle, model: str) -> float:
    with urllib.request.urlopen(f"http://{server.http_url}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(f'adaserve_worker_restarts_total{{model="{model}"'):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no restart counter")


def test_killed_workers_lose_no_request(server: ServerHandle) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    model = "cnn"
    before = worker_pids(client, model)
    restarts_before = restarts(server, model)
    rng = np.random.default_rng(6)
    arrays = [rng.random((int(rng.integers(1, 9)), 1, 28, 28), dtype=np.float32) for _ in range(600)]
    victims = before[::2]  # three of the six workers, of several granularities

    def kill_during_load() -> None:
        for pid in victims:
            time.sleep(0.3)
            os.kill(pid, signal.SIGKILL)

    def send(array: np.ndarray) -> np.ndarray:
        local = httpclient.InferenceServerClient(server.http_url)
        tensor = httpclient.InferInput("image", list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
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
