"""`--grpc-frontend process` against a real server with `tritonclient.grpc`: every answer, error and status the
same as the inline frontend's, streams, health, restrictions, a client's cancel reaching the engine, the
frontend's process restarted when it dies, its logging following the server's log settings, and a stop that
answers the calls in progress; and which frontend `auto` and a cluster's node servers get."""

from __future__ import annotations

import functools
import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.utils import InferenceServerException

from adaserve.arguments import PROCESS_FRONTEND_CORES
from adaserve.cli import build_parser
from adaserve.distributed.cli import cluster_settings
from adaserve.server.grpc_frontend import grpc_frontend_mode
from tests.server_utils import (
    Clients,
    ServerHandle,
    free_ports,
    link_example,
    logged_errors,
    metric,
    metrics,
    running_server,
    serve_command,
    spin_rounds,
    stop_server,
    wait_until_ready,
    write_slow_model,
)

#: Statistics answer only calls with this metadata (`--grpc-restricted-protocol`), on both servers.
RESTRICTION = ("statistics:admin=secret",)
ADMIN = {"triton-grpc-protocol-admin": "secret"}
#: Models slow enough that requests queue behind one another: "slow" about 0.4-1.4 s a request (warm, cold), well
#: within a stop's grace for two; "slowest" several seconds, far past a 0.5 s deadline.
SLOW_ROUNDS, SLOWEST_ROUNDS = 20_000, 150_000


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("grpc-frontend") / "models"
    link_example(root, "mlp")
    write_slow_model(root, "slow", rounds=SLOW_ROUNDS)
    write_slow_model(root, "slowest", rounds=SLOWEST_ROUNDS)
    return root


@pytest.fixture(scope="module")
def process(repository: Path) -> Iterator[ServerHandle]:
    with running_server(repository, "--grpc-frontend", "process", "--grpc-restricted-protocol", *RESTRICTION) as handle:
        yield handle


@pytest.fixture(scope="module")
def inline(repository: Path) -> Iterator[ServerHandle]:
    with running_server(repository, "--grpc-frontend", "inline", "--grpc-restricted-protocol", *RESTRICTION) as handle:
        yield handle


def frontend_pid(server: ServerHandle) -> int | None:
    """The PID of the server's gRPC frontend process (a child of the server running `grpc_frontend`)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if parent == server.pid and b"adaserve.server.grpc_frontend" in command:
            return int(entry.name)
    return None


def tensor(name: str, array: np.ndarray) -> grpcclient.InferInput:
    made = grpcclient.InferInput(name, list(array.shape), "FP32")
    made.set_data_from_numpy(array)
    return made


def failure(call: Callable[[], object]) -> tuple[Any, str]:
    """The status and message of a call that fails."""
    with pytest.raises(InferenceServerException) as raised:
        call()
    return raised.value.status(), raised.value.message()


def test_inference_answers_as_inline(process: ServerHandle, inline: ServerHandle, clients: Clients) -> None:
    array = np.random.default_rng(5).random((3, 784), dtype=np.float32)
    answers = [
        clients.grpc(server.grpc_url).infer("mlp", [tensor("image", array)], request_id="p-1")
        for server in (process, inline)
    ]
    assert np.array_equal(answers[0].as_numpy("logits"), answers[1].as_numpy("logits"))
    assert answers[0].get_response().id == "p-1"


def test_errors_carry_the_inline_status_and_message(
    process: ServerHandle, inline: ServerHandle, clients: Clients
) -> None:
    calls: list[Callable[[grpcclient.InferenceServerClient], object]] = [
        lambda client: client.infer("nope", [tensor("image", np.ones((1, 784), np.float32))]),
        lambda client: client.infer("mlp", [tensor("image", np.ones((1, 783), np.float32))]),
        lambda client: client.infer("mlp", [tensor("picture", np.ones((1, 784), np.float32))]),
        lambda client: client.get_model_config("nope"),
        lambda client: client.get_inference_statistics("mlp"),  # restricted: no header
    ]
    for call in calls:
        seen = [failure(functools.partial(call, clients.grpc(server.grpc_url))) for server in (process, inline)]
        assert seen[0] == seen[1]
    statistics = clients.grpc(process.grpc_url).get_inference_statistics("mlp", headers=ADMIN)
    assert statistics.model_stats[0].name == "mlp"


def test_metadata_config_index_and_health_as_inline(
    process: ServerHandle, inline: ServerHandle, clients: Clients
) -> None:
    def documents(server: ServerHandle) -> list[object]:
        client = clients.grpc(server.grpc_url)
        return [
            client.is_server_live(),
            client.is_server_ready(),
            client.is_model_ready("mlp"),
            client.get_model_metadata("mlp", as_json=True),
            {**client.get_model_config("mlp", as_json=True)["config"], "parameters": None},  # its workers' PIDs
            client.get_model_repository_index(as_json=True),
            client.get_server_metadata(as_json=True)["extensions"],
        ]

    assert documents(process) == documents(inline)
    with grpc.insecure_channel(process.grpc_url) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        serving = health_pb2.HealthCheckResponse.SERVING
        assert health.Check(health_pb2.HealthCheckRequest(service="")).status == serving
        with pytest.raises(grpc.RpcError) as unknown:
            health.Check(health_pb2.HealthCheckRequest(service="nope"))
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        watched = health.Watch(health_pb2.HealthCheckRequest(service="nope"))
        assert next(watched).status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
        watched.cancel()


def stream(
    server: ServerHandle, clients: Clients, requests: list[tuple[str, str, np.ndarray]]
) -> tuple[dict[str, np.ndarray], list[str]]:
    """Each request (id, model, input) sent on one stream; the outputs by id, and the errors' messages."""
    answers: queue.Queue[tuple[grpcclient.InferResult | None, InferenceServerException | None]] = queue.Queue()
    client = clients.grpc(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for request_id, model, array in requests:
            client.async_stream_infer(model, [tensor("image", array)], request_id=request_id)
        got = [answers.get(timeout=60) for _ in requests]
    finally:
        client.stop_stream()
    outputs = {r.get_response().id: r.as_numpy("logits") for r, _ in got if r is not None}
    return outputs, sorted(e.message() for _, e in got if e is not None)


def test_a_stream_answers_as_inline(process: ServerHandle, inline: ServerHandle, clients: Clients) -> None:
    """Every request answered once under its id, the bad one with its error, as inline (the outputs as close as
    batches of other sizes compute them)."""
    rng = np.random.default_rng(9)
    requests = [(f"r{i}", "mlp", rng.random((1 + i % 2, 784), dtype=np.float32)) for i in range(6)]
    requests.insert(3, ("bad", "mlp", np.ones((1, 783), np.float32)))
    outputs, errors = stream(process, clients, requests)
    inline_outputs, inline_errors = stream(inline, clients, requests)
    assert sorted(outputs) == sorted(inline_outputs) == [f"r{i}" for i in range(6)]
    assert all(np.allclose(outputs[key], inline_outputs[key], atol=1e-5) for key in outputs)
    assert errors == inline_errors and len(errors) == 1


def test_a_cancelled_call_is_taken_back_by_the_engine(process: ServerHandle) -> None:
    """Calls whose deadline passes while they queue behind a slow one: the client sees DEADLINE_EXCEEDED, and the
    engine runs none of those still queued (each would count as a success once run)."""
    before = metric(process, 'adaserve_inference_request_success_total{model="slowest"')
    statuses: list[Any] = []

    def call() -> None:
        with grpcclient.InferenceServerClient(process.grpc_url) as client:
            x = tensor("x", np.ones((1, 4), np.float32))
            statuses.append(failure(lambda: client.infer("slowest", [x], client_timeout=0.5))[0])

    threads = [threading.Thread(target=call) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert statuses == ["StatusCode.DEADLINE_EXCEEDED"] * len(threads)
    while metric(process, 'adaserve_queued_rows{model="slowest"') + metric(
        process, 'adaserve_inflight_rows{model="slowest"'
    ):
        time.sleep(0.1)
    assert metric(process, 'adaserve_inference_request_success_total{model="slowest"') - before <= 1


def test_the_frontend_process_killed_is_started_again(process: ServerHandle) -> None:
    killed = frontend_pid(process)
    assert killed is not None
    errors_before = logged_errors(process)
    os.kill(killed, signal.SIGKILL)
    while frontend_pid(process) in (None, killed):
        time.sleep(0.1)
    while True:  # the new process listens soon after it starts
        with grpcclient.InferenceServerClient(process.grpc_url) as client:
            try:
                answer = client.infer("mlp", [tensor("image", np.ones((1, 784), np.float32))])
                break
            except InferenceServerException:
                time.sleep(0.1)
    assert answer.as_numpy("logits").shape == (1, 10)
    assert "the gRPC frontend's process ended: starting it again" in process.log.read_text()
    assert logged_errors(process) == errors_before


def test_the_frontend_process_logs_as_the_log_settings_say(process: ServerHandle, clients: Clients) -> None:
    """A change over REST or gRPC reaches the frontend's process, and one started again starts with the settings
    of now: it logs each call it relays at log_verbose_level 1, and none at 0."""
    rest, grpc_client = clients.http(process.http_url), clients.grpc(process.grpc_url)
    try:
        rest.update_log_settings({"log_verbose_level": 1})
        grpc_client.is_model_ready("mlp")
        _wait_for_relayed(process, "ModelReady")
        grpc_client.update_log_settings({"log_verbose_level": 0})  # relayed to the engine, and from it back
        grpc_client.get_server_metadata()
        rest.update_log_settings({"log_verbose_level": 1})
        killed = frontend_pid(process)
        assert killed is not None
        os.kill(killed, signal.SIGKILL)
        while frontend_pid(process) in (None, killed):
            time.sleep(0.1)
        while True:  # the new process listens soon after it starts, at verbose level 1
            try:
                grpc_client.is_server_live()
                break
            except InferenceServerException:
                time.sleep(0.1)
        _wait_for_relayed(process, "ServerLive")
        assert "ServerMetadata" not in _relayed(process)
    finally:
        rest.update_log_settings({"log_verbose_level": 0})


def _relayed(server: ServerHandle) -> list[str]:
    """The RPCs of the calls the server's gRPC frontend process has logged relaying."""
    lines = [json.loads(line) for line in server.log.read_text().splitlines() if line.startswith("{")]
    return [line["rpc"] for line in lines if line["msg"] == "relaying a gRPC call to the engine"]


def _wait_for_relayed(server: ServerHandle, rpc: str) -> None:
    while rpc not in _relayed(server):
        time.sleep(0.1)


def test_a_stop_answers_the_calls_in_progress(tmp_path: Path) -> None:
    """SIGTERM with two calls, one running and one queued: all are answered, then the server and
    its frontend's process exit. Each call takes about 0.5 s whatever the machine: long enough to see both in the
    server, short enough for both to end within the stop's grace (5 s)."""
    repository = tmp_path / "models"
    write_slow_model(repository, "paced", rounds=spin_rounds(0.5))
    http_port, grpc_port = free_ports(2)
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            serve_command(repository, http_port, grpc_port, "--grpc-frontend", "process", "--model", "paced"),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    handle = ServerHandle(f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}", server.pid, log)
    try:
        wait_until_ready(handle, server, 180.0, lambda: '"msg": "serving"' in log.read_text())
        frontend = frontend_pid(handle)
        answers: queue.Queue[object] = queue.Queue()
        with grpcclient.InferenceServerClient(handle.grpc_url) as client:
            assert client.is_server_live()  # connected: the two calls leave together, however busy the machine
            for _ in range(2):
                client.async_infer(
                    "paced",
                    [tensor("x", np.ones((1, 4), np.float32))],
                    callback=lambda result, error: answers.put(error or result.as_numpy("y")),
                )
            deadline = time.monotonic() + 120
            series = ('adaserve_queued_rows{model="paced"', 'adaserve_inflight_rows{model="paced"')
            while sum(metrics(handle, *series)) < 2:
                assert time.monotonic() < deadline, "the two calls were never in the server together"
                time.sleep(0.02)
            os.kill(server.pid, signal.SIGTERM)
            results = [answers.get(timeout=120) for _ in range(2)]
        assert server.wait(timeout=60) == 0
    finally:
        stop_server(server)
    assert all(isinstance(result, np.ndarray) for result in results), results
    assert frontend is not None and not Path(f"/proc/{frontend}").exists()


@pytest.mark.parametrize(("cores", "mode"), [(2, "inline"), (PROCESS_FRONTEND_CORES, "process")])
def test_auto_puts_grpc_in_a_process_from_so_many_cores(monkeypatch: pytest.MonkeyPatch, cores: int, mode: str) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert grpc_frontend_mode("auto") == mode
    assert grpc_frontend_mode("inline") == "inline" and grpc_frontend_mode("process") == "process"


@pytest.mark.parametrize(
    ("command", "given", "mode"),
    [
        (["serve", "--ray", "auto"], ["--grpc-frontend", "process"], "process"),
        (["cluster", "up"], ["--grpc-frontend", "inline"], "inline"),
        (["cluster", "up"], [], "auto"),
    ],
)
def test_node_servers_run_grpc_where_the_command_says(command: list[str], given: list[str], mode: str) -> None:
    args = build_parser(command[0]).parse_args([*command, *given])
    serve_args = cluster_settings(args, port_stride=0, host_from_ray=False).node.serve_args
    assert serve_args[-2:] == ("--grpc-frontend", mode)


def test_cluster_up_refuses_an_unknown_grpc_frontend(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser("cluster").parse_args(["cluster", "up", "--grpc-frontend", "elsewhere"])
    assert "--grpc-frontend: invalid choice: 'elsewhere'" in capsys.readouterr().err


def test_a_killed_server_s_frontend_stops_and_removes_the_socket(repository: Path) -> None:
    """The server's process killed (no stop of its own): its frontend's process sees its stdin close, stops, and
    removes the private directory of the engine's socket."""
    with running_server(repository, "--grpc-frontend", "process", "--model", "mlp") as server:
        frontend = frontend_pid(server)
        assert frontend is not None
        arguments = Path(f"/proc/{frontend}/cmdline").read_bytes().split(b"\0")
        directory = Path(json.loads(arguments[3])["engine"]).parent
        assert directory.is_dir() and directory.stat().st_mode & 0o777 == 0o700
        os.kill(server.pid, signal.SIGKILL)
        while Path(f"/proc/{frontend}").exists() and "zombie" not in _state(frontend):
            time.sleep(0.1)
    assert not directory.exists()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return "zombie"


def test_a_stream_of_a_restricted_category_is_refused_as_inline(repository: Path) -> None:
    """Inline refuses the stream at its start; the frontend's process at its first request, with the same status
    and message; with the header the stream is answered."""
    refused = ("StatusCode.PERMISSION_DENIED", "This protocol is restricted, expecting header 'triton-grpc-protocol-k'")
    restricted = ("--grpc-restricted-protocol", "inference:k=v")
    with (
        running_server(repository, "--grpc-frontend", "process", "--model", "mlp", *restricted) as server,
        Clients() as clients,
    ):
        result, error = first_stream_answer(clients.grpc(server.grpc_url), {})
        assert result is None and error is not None and (str(error.status()), error.message()) == refused
        result, error = first_stream_answer(clients.grpc(server.grpc_url), {"triton-grpc-protocol-k": "v"})
        assert error is None and result is not None and result.get_response().id == "a"


def first_stream_answer(
    client: grpcclient.InferenceServerClient, headers: dict[str, str]
) -> tuple[Any, InferenceServerException | None]:
    """A stream opened with `headers`, one request sent on it: its answer or error."""
    answers: queue.Queue[tuple[Any, InferenceServerException | None]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)), headers=headers)
    try:
        client.async_stream_infer("mlp", [tensor("image", np.ones((1, 784), np.float32))], request_id="a")
        return answers.get(timeout=60)
    finally:
        client.stop_stream()
