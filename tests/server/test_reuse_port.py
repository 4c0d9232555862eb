"""Several servers on one machine: `serve --reuse-port` lets them share the HTTP and gRPC ports, `--cpus` gives each
its cores. Which server answered a connection is told by the PIDs of the workers its model config lists (each server
forks its own), asked on the same connection as the inference it answered."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.cpu.test_topology import allowed_cpus
from tests.server_utils import (
    EXAMPLES,
    Clients,
    ServerHandle,
    free_ports,
    link_example,
    process_stat,
    running_server,
    worker_pids,
)

#: New connections made through the shared port per check: all of them land on one of two servers with
#: probability 2 × 2^-24 when the kernel spreads them evenly.
CONNECTIONS = 24
ROW = [0.5] * 784  # one row of the example MLP's input


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("reuse_port") / "models"
    link_example(root, "mlp")
    return root


@contextlib.contextmanager
def two_servers(repository: Path, *extra_args: str) -> Iterator[tuple[ServerHandle, ServerHandle]]:
    """Two `serve --reuse-port` on the same two ports."""
    http_port, grpc_port = free_ports(2)
    ports = (http_port, grpc_port)
    with (
        running_server(repository, "--reuse-port", *extra_args, ports=ports) as first,
        running_server(repository, "--reuse-port", *extra_args, ports=ports) as second,
    ):
        yield first, second


def server_of(worker: int, servers: tuple[ServerHandle, ...]) -> int:
    """The PID of the server among `servers` that `worker` descends from (a worker is forked by its model host,
    which its server started)."""
    pids = {server.pid for server in servers}
    pid = worker
    while pid > 1:
        if pid in pids:
            return pid
        stat = process_stat(pid)
        if stat is None:
            break
        pid = int(stat[1])
    raise AssertionError(f"worker {worker} belongs to none of the servers {sorted(pids)}")


def answered_over_http(port: int) -> list[int]:
    """On one new connection: an inference (which must succeed), then the model's workers."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        body = json.dumps({"inputs": [{"name": "image", "shape": [1, 784], "datatype": "FP32", "data": ROW}]})
        connection.request("POST", "/v2/models/mlp/infer", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        answer = response.read()
        assert response.status == 200, answer
        assert len(json.loads(answer)["outputs"][0]["data"]) == 10
        connection.request("GET", "/v2/models/mlp/config")
        response = connection.getresponse()
        config = json.loads(response.read())
        assert response.status == 200, config
        return [w["pid"] for w in json.loads(config["parameters"]["workers"]["string_value"])]
    finally:
        connection.close()


def answered_over_grpc(url: str) -> list[int]:
    """On one new channel (a connection of its own): an inference, then the model's workers."""
    with grpcclient.InferenceServerClient(url) as client:
        tensor = grpcclient.InferInput("image", [1, 784], "FP32")
        tensor.set_data_from_numpy(np.array([ROW], dtype=np.float32))
        assert client.infer("mlp", [tensor]).as_numpy("logits").shape == (1, 10)
        config = client.get_model_config("mlp", as_json=True)["config"]
        return [w["pid"] for w in json.loads(config["parameters"]["workers"]["string_value"])]


def askers(servers: tuple[ServerHandle, ...]) -> dict[str, Callable[[], list[int]]]:
    http_port = int(servers[0].http_url.rsplit(":", 1)[1])
    return {"http": lambda: answered_over_http(http_port), "grpc": lambda: answered_over_grpc(servers[0].grpc_url)}


def test_servers_with_reuse_port_share_both_ports_and_each_answers(repository: Path) -> None:
    with two_servers(repository) as servers:
        for protocol, ask in askers(servers).items():
            answered = [{server_of(pid, servers) for pid in ask()} for _ in range(CONNECTIONS)]
            assert all(len(owners) == 1 for owners in answered), answered  # one server answers a connection
            counts = {server.pid: answered.count({server.pid}) for server in servers}
            assert all(count > 0 for count in counts.values()), (protocol, counts)
        # Without the flag a taken port is refused as before, even when the servers on it share it.
        http_port, grpc_port = (url.rsplit(":", 1)[1] for url in (servers[0].http_url, servers[0].grpc_url))
        for protocol, port, free in (("HTTP", http_port, "--grpc-port"), ("gRPC", grpc_port, "--http-port")):
            taken = "--http-port" if protocol == "HTTP" else "--grpc-port"
            alone = serve(repository, taken, port, free, "0")
            assert alone.returncode == 2, alone.stderr
            assert f"cannot listen for {protocol} on 127.0.0.1:{port}" in alone.stderr, alone.stderr


def test_a_server_killed_leaves_the_other_answering_every_connection(repository: Path) -> None:
    with two_servers(repository) as servers:
        victim, survivor = servers
        ports = [int(url.rsplit(":", 1)[1]) for url in (survivor.http_url, survivor.grpc_url)]
        assert [listeners(port) for port in ports] == [2, 2]
        os.kill(victim.pid, signal.SIGKILL)
        # Its sockets close once all its threads have exited, which may be after its main thread is a zombie; a
        # connection the kernel queued on them meanwhile is reset.
        deadline = time.monotonic() + 30
        while [listeners(port) for port in ports] != [1, 1] and time.monotonic() < deadline:
            time.sleep(0.05)
        for protocol, ask in askers(servers).items():
            owners = [server_of(pid, (survivor,)) for _ in range(CONNECTIONS) for pid in ask()]
            assert set(owners) == {survivor.pid}, protocol


def listeners(port: int) -> int:
    """Sockets listening on a TCP port of this machine (/proc/net/tcp: the local address's port in hex, state 0A)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for line in Path(table).read_text().splitlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                count += int(local.rsplit(":", 1)[1], 16) == port and state == "0A"
    return count


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="restricting to a core needs two to choose from")
def test_cpus_runs_the_server_and_its_workers_on_those_cores_alone(repository: Path, clients: Clients) -> None:
    core = max(os.sched_getaffinity(0))
    with running_server(repository, "--cpus", str(core)) as server:
        client = clients.http(server.http_url)
        workers = worker_pids(client, "mlp")
        parameters = client.get_model_config("mlp")["parameters"]
        assert allowed_cpus(server.pid) == [core]
        assert workers and all(allowed_cpus(pid) == [core] for pid in workers)
        # The engine planned one core, not the machine's: with one, workers do not poll between batches.
        assert parameters["idle_spin_us"]["string_value"] == "0"


def serve(repository: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "adaserve", "serve", "--model-repository", str(repository), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_bad_cpus_are_refused_naming_the_problem() -> None:
    usable = sorted(os.sched_getaffinity(0))
    outside = max(usable) + 1
    for cpus, message in (
        ("0-", "--cpus: expected CPU ids and ranges such as 0-3 or 0,2,4-7; got '0-'"),
        ("two", "--cpus: expected CPU ids and ranges"),
        ("3-1", "--cpus: the range 3-1 runs backwards"),
        (f"{usable[0]},{outside}", f"--cpus: CPUs {outside} are not available to this process"),
    ):
        refused = serve(EXAMPLES, "--cpus", cpus, "--http-port", "0", "--grpc-port", "0")
        assert refused.returncode == 2, refused.stderr
        assert message in refused.stderr and "Traceback" not in refused.stderr, refused.stderr


def test_a_port_held_without_reuse_port_is_refused_saying_what_sharing_needs() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = str(held.getsockname()[1])
        refused = serve(EXAMPLES, "--reuse-port", "--http-port", port, "--grpc-port", "0")
    assert refused.returncode == 2, refused.stderr
    assert f"cannot listen for HTTP on 127.0.0.1:{port}" in refused.stderr
    assert "only when all have --reuse-port" in refused.stderr
