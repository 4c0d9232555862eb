"""`adaserve serve --repository-poll-secs`: a server that follows its repository on disk, through tritonclient."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from tests.engine.test_poller import ONE_WORKER, add_identity_version
from tests.server_utils import Clients, link_example, running_server, write_fussy_model


def infer(client: httpclient.InferenceServerClient, value: float) -> tuple[float, str]:
    """The first output of `fussy` for a row of `value`, and the version that answered."""
    tensor = httpclient.InferInput("x", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.full((1, 4), value, dtype=np.float32))
    result = client.infer("fussy", [tensor])
    return float(result.as_numpy("y")[0, 0]), result.get_response()["model_version"]


def wait_for(check: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert check(), "the server did not follow the repository in time"


def test_a_new_version_is_served_with_no_request_failing_and_a_new_model_appears(
    tmp_path: Path, clients: Clients
) -> None:
    repository = tmp_path / "models"
    repository.mkdir()
    fussy = write_fussy_model(repository, workers=ONE_WORKER, batching={"policy": "elastic"})
    with running_server(repository, "--repository-poll-secs", "0.2") as server:
        client = clients.http(server.http_url)
        assert infer(client, 3.0) == (6.0, "1")
        answers: list[tuple[float, str]] = []
        failures: list[Exception] = []
        stop = threading.Event()

        def keep_asking() -> None:  # a client that never pauses across the reload
            with httpclient.InferenceServerClient(server.http_url) as own:  # closed here, in its own thread
                while not stop.is_set():
                    try:
                        answers.append(infer(own, 3.0))
                    except Exception as exc:  # any failure at all is what the test is for
                        failures.append(exc)

        asker = threading.Thread(target=keep_asking)
        asker.start()
        try:
            add_identity_version(fussy, 2)
            wait_for(lambda: bool(answers) and answers[-1] == (3.0, "2"))
        finally:
            stop.set()
            asker.join(timeout=30)
        assert not asker.is_alive() and failures == []
        assert set(answers) == {(6.0, "1"), (3.0, "2")}
        switch = answers.index((3.0, "2"))
        assert all(answer == (3.0, "2") for answer in answers[switch:])  # once swapped, the new version only

        link_example(repository, "mlp", workers=ONE_WORKER)
        wait_for(lambda: client.is_model_ready("mlp"))
