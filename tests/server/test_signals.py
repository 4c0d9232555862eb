"""Stop signals that reach every process at once: a terminal's Ctrl-C (SIGINT to its foreground process group) and a
service manager's stop (SIGTERM to every process of the cgroup). Hosts and workers ignore them and the server, which
handles them, stops its processes in order. Before, the workers died first, the server replaced them while it
drained, and a replacement host that could not be handed the closed pool was started again and again: the server
never stopped."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from tests.server_utils import link_example, process_stat, restarts, running_server, worker_pids


def test_hosts_and_workers_leave_stop_signals_to_the_server(tmp_path: Path) -> None:
    repository = tmp_path / "models"
    link_example(repository, "mlp")
    with running_server(repository) as server, httpclient.InferenceServerClient(server.http_url) as client:
        workers = worker_pids(client, "mlp")
        hosts = {_parent(pid) for pid in workers}
        assert all(os.getsid(host) == host for host in hosts)  # out of the server's process group and session
        for pid in [*hosts, *workers]:
            os.kill(pid, signal.SIGINT)
            os.kill(pid, signal.SIGTERM)
        time.sleep(1.0)
        assert all(_running(pid) for pid in [*hosts, *workers])
        assert restarts(server, "mlp") == 0
        tensor = httpclient.InferInput("image", [1, 784], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, 784), np.float32))
        assert client.infer("mlp", [tensor]).as_numpy("logits").shape == (1, 10)

        os.kill(server.pid, signal.SIGINT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_running(pid) for pid in [server.pid, *hosts, *workers]):
            time.sleep(0.1)
        assert not any(_running(pid) for pid in [server.pid, *hosts, *workers])
        assert '"msg": "stopped"' in server.log.read_text()


def _parent(pid: int) -> int:
    fields = process_stat(pid)
    assert fields is not None, f"process {pid} is gone"
    return int(fields[1])


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting for its parent to reap it."""
    fields = process_stat(pid)
    return fields is not None and fields[0] != "Z"
