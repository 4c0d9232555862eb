"""Triton's trace extension on a real server: tritonclient (HTTP and gRPC) and perf_analyzer read and change the
trace settings, and the traced requests' timestamps and tensors land in the trace file in Triton's form, every
step in order and within the client's own time (the worker's clock is the frontend's)."""

from __future__ import annotations

import glob
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from benchmarks.perf_load import PerfAnalyzer
from tests.server.test_dag import ONE_WORKER, write_dag
from tests.server_utils import (
    Clients,
    ServerHandle,
    link_example,
    logged_errors,
    metric,
    running_server,
    write_fussy_model,
    write_slow_model,
)

PROTOCOLS = {"http": httpclient, "grpc": grpcclient}
STEPS = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_END", "REQUEST_END"]
FRONTEND = {
    "http": (["HTTP_RECV_START", "HTTP_RECV_END"], ["HTTP_SEND_START", "HTTP_SEND_END"]),
    "grpc": (["GRPC_WAITREAD_START", "GRPC_WAITREAD_END"], ["GRPC_SEND_START", "GRPC_SEND_END"]),
}


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("traces") / "trace.json"


@pytest.fixture(scope="module")
def traced_server(tmp_path_factory: pytest.TempPathFactory, trace_file: Path) -> Iterator[ServerHandle]:
    """A server tracing every request at level TIMESTAMPS into `trace_file` (its array is written at stop)."""
    root = tmp_path_factory.mktemp("trace-repository") / "models"
    for name in ("mlp", "cnn"):
        link_example(root, name)
    write_fussy_model(root, "double", workers=ONE_WORKER)
    write_slow_model(root, "slow", rounds=30, max_batch_size=4, workers=ONE_WORKER)
    write_dag(root, "pipe")
    config = [f"--trace-config=triton,file={trace_file}", "--trace-config=level=TIMESTAMPS", "--trace-config=rate=1"]
    with running_server(root, *config) as handle:
        yield handle


def settings(document: Any) -> dict[str, Any]:
    """tritonclient's answer in the REST form on both protocols (gRPC's as_json has `{"value": [...]}`s)."""
    if "settings" not in document:
        return dict(document)
    values = {name: setting.get("value", []) for name, setting in document["settings"].items()}
    return {name: value if name == "trace_level" else value[0] for name, value in values.items()}


def traces_in_parts(trace_file: Path) -> dict[str, list[dict[str, Any]]]:
    """Every trace in the numbered files written so far, by request id: its entries (head, stamps, tensors)."""
    entries = [e for part in glob.glob(f"{trace_file}.*") for e in json.loads(Path(part).read_text())]
    request_of = {e["id"]: e.get("request_id", "") for e in entries if "model_name" in e}
    found: dict[str, list[dict[str, Any]]] = {}
    for entry in entries:
        found.setdefault(request_of[entry["id"]], []).append(entry)
    return found


def infer(clients: Clients, server: ServerHandle, protocol: str, model: str, array: np.ndarray, request_id: str) -> Any:
    module = PROTOCOLS[protocol]
    tensor = module.InferInput("image", list(array.shape), "FP32")
    tensor.set_data_from_numpy(array)
    return clients.of(server, protocol).infer(model, [tensor], request_id=request_id)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_trace_api_reads_and_sets_a_models_settings_beside_the_servers(
    traced_server: ServerHandle, trace_file: Path, protocol: str, clients: Clients
) -> None:
    triton = clients.of(traced_server, protocol)
    json_form = {"as_json": True} if protocol == "grpc" else {}
    start = {
        "trace_level": ["TIMESTAMPS"],
        "trace_rate": "1",
        "trace_count": "-1",
        "log_frequency": "0",
        "trace_file": str(trace_file),
        "trace_mode": "triton",
    }
    assert settings(triton.get_trace_settings(**json_form)) == start
    changed = settings(triton.update_trace_settings("cnn", {"trace_rate": "4", "trace_count": "9"}, **json_form))
    assert changed == {**start, "trace_rate": "4", "trace_count": "9"}
    assert settings(triton.get_trace_settings("cnn", **json_form)) == changed
    assert settings(triton.get_trace_settings(**json_form)) == start  # the server's are untouched
    cleared = triton.update_trace_settings("cnn", {"trace_rate": None, "trace_count": None}, **json_form)
    assert settings(cleared) == start


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(
    ("model", "changes", "status", "message"),
    [
        ("", {"trace_file": "/etc/passwd"}, "invalid", "trace file location can not be updated through network"),
        ("", {"trace_rate": "often"}, "invalid", "trace setting 'trace_rate' must be an integer, got 'often'"),
        ("mlp", {"trace_level": ["OFF", "TENSORS"]}, "invalid", "trace_level OFF cannot be given with other levels"),
        ("nonexistent", {"trace_rate": "2"}, "not found", "nonexistent"),
    ],
)
def test_a_bad_trace_setting_is_refused_by_name(
    traced_server: ServerHandle,
    protocol: str,
    model: str,
    changes: dict[str, Any],
    status: str,
    message: str,
    clients: Clients,
) -> None:
    expected = {
        ("http", "invalid"): "400",
        ("http", "not found"): "404",
        ("grpc", "invalid"): "StatusCode.INVALID_ARGUMENT",
        ("grpc", "not found"): "StatusCode.NOT_FOUND",
    }[protocol, status]
    errors_before = logged_errors(traced_server)
    with pytest.raises(InferenceServerException) as refused:
        clients.of(traced_server, protocol).update_trace_settings(model, changes)
    assert refused.value.status() == expected and message in refused.value.message()
    assert settings(clients.of(traced_server, "http").get_trace_settings())["trace_rate"] == "1"
    assert logged_errors(traced_server) == errors_before


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_traced_request_has_every_step_in_order_within_the_clients_time(
    traced_server: ServerHandle, trace_file: Path, protocol: str, clients: Clients
) -> None:
    """The model's requests go three at a time into numbered files; each trace's steps, stamped by the frontend,
    the data plane and the worker process, are in order and between the client's send and its answer (up to the
    send's start: the client may read the answer before the server's write returns)."""
    http = clients.of(traced_server, "http")
    http.update_trace_settings("mlp", {"log_frequency": "3"})
    windows = {}
    try:
        for number in range(3):
            request_id = f"{protocol}-{number}"
            sent = time.perf_counter_ns()
            infer(clients, traced_server, protocol, "mlp", np.ones((2, 784), dtype=np.float32), request_id)
            windows[request_id] = (sent, time.perf_counter_ns())
    finally:
        http.update_trace_settings("mlp", {})  # the model follows the server's settings again
    found = traces_in_parts(trace_file)
    received, sent_back = FRONTEND[protocol]
    for request_id, (sent, answered) in windows.items():
        head, stamps = found[request_id]
        assert head["model_name"] == "mlp" and head["model_version"] == 1
        names = [s["name"] for s in stamps["timestamps"]]
        assert names == received + STEPS + sent_back
        times = [s["ns"] for s in stamps["timestamps"]]
        assert sent <= times[0] and times == sorted(times) and times[-2] <= answered, (request_id, stamps)


def test_the_tensors_level_records_each_requests_inputs_and_outputs(
    traced_server: ServerHandle, trace_file: Path, clients: Clients
) -> None:
    http = clients.of(traced_server, "http")
    http.update_trace_settings("cnn", {"trace_level": ["TENSORS"], "log_frequency": "1"})
    try:
        image = np.random.default_rng(0).random((1, 1, 28, 28), dtype=np.float32)
        logits = infer(clients, traced_server, "http", "cnn", image, "with-tensors").as_numpy("logits")
    finally:
        http.update_trace_settings("cnn", {})
    head, *tensors = traces_in_parts(trace_file)["with-tensors"]
    assert head["model_name"] == "cnn"
    assert [t["activity"] for t in tensors] == ["TENSOR_QUEUE_INPUT", "TENSOR_BACKEND_OUTPUT"]  # no timestamps
    for entry, array in zip(tensors, (image, logits), strict=True):
        tensor = entry["tensor"]
        assert tensor["dtype"] == "FP32" and tensor["shape"] == ",".join(map(str, array.shape))
        values = np.array([float(v) for v in tensor["data"].split(",")], dtype=np.float32)
        assert np.array_equal(values, array.ravel())


def test_a_dag_querys_models_are_traced_as_its_children(
    traced_server: ServerHandle, trace_file: Path, clients: Clients
) -> None:
    """Each model the query runs gets its own trace, with the query's as its parent and its steps inside the
    query's, as Triton traces an ensemble's models."""
    http = clients.of(traced_server, "http")
    http.update_trace_settings("pipe", {"log_frequency": "1"})
    try:
        tensor = httpclient.InferInput("x", [2, 4], "FP32")
        tensor.set_data_from_numpy(np.array([[1, 0, 0, 0], [0, 1, 0, 0]], dtype=np.float32))  # row 0 runs both nodes
        http.infer("pipe", [tensor], request_id="dag-1")
    finally:
        http.update_trace_settings("pipe", {})
    entries = traces_in_parts(trace_file)["dag-1"]
    heads = {e["id"]: e for e in entries if "model_name" in e}
    stamps = {e["id"]: {s["name"]: s["ns"] for s in e["timestamps"]} for e in entries if "timestamps" in e}
    (query,) = [i for i, head in heads.items() if head["model_name"] == "pipe"]
    children = [i for i, head in heads.items() if head.get("parent_id") == query]
    assert sorted(heads[i]["model_name"] for i in children) in (["double", "double"], ["double", "slow"])
    assert set(stamps[query]) == {"HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "REQUEST_END"} | {
        "HTTP_SEND_START",
        "HTTP_SEND_END",
    }
    for child in children:
        assert list(stamps[child]) == STEPS
        assert stamps[query]["REQUEST_START"] <= stamps[child]["REQUEST_START"]
        assert stamps[child]["REQUEST_END"] <= stamps[query]["REQUEST_END"]


def test_perf_analyzer_turns_tracing_on_and_its_requests_are_traced(
    traced_server: ServerHandle, trace_file: Path, perf_analyzer: PerfAnalyzer, clients: Clients
) -> None:
    """perf_analyzer's --trace-* options set the server's settings through the trace API before it measures."""
    arguments = ["-m", "mlp", "-u", traced_server.http_url, "--concurrency-range", "1", "-b", "1"]
    arguments += ["--trace-level", "TIMESTAMPS", "--trace-rate", "5", "--log-frequency", "10"]
    arguments += ["--measurement-mode", "count_windows", "--measurement-request-count", "100", "-s", "1000"]
    before = set(glob.glob(f"{trace_file}.*"))
    try:
        done = subprocess.run(
            [str(perf_analyzer.binary), *arguments], env=perf_analyzer.env, capture_output=True, text=True, timeout=120
        )
    finally:
        clients.of(traced_server, "http").update_trace_settings(settings={"trace_rate": None, "log_frequency": None})
    assert done.returncode == 0, (done.stdout + done.stderr)[-2000:]
    parts = sorted(set(glob.glob(f"{trace_file}.*")) - before)
    assert parts, "no part of 10 traces was written"
    for part in parts:
        entries = json.loads(Path(part).read_text())
        assert sum("model_name" in e for e in entries) == 10
        for stamps in (e["timestamps"] for e in entries if "timestamps" in e):
            assert [s["name"] for s in stamps] == [*FRONTEND["http"][0], *STEPS, *FRONTEND["http"][1]]


def test_the_trace_file_is_one_json_array_of_every_trace_once_the_server_stops(
    tmp_path: Path, clients: Clients
) -> None:
    """Leaving the block stops the server (SIGTERM), which closes the file's array."""
    root = tmp_path / "models"
    link_example(root, "mlp")
    trace_file = tmp_path / "trace.json"
    config = [f"--trace-config=triton,file={trace_file}", "--trace-config=level=TIMESTAMPS", "--trace-config=rate=2"]
    with running_server(root, *config) as server:
        for number in range(5):
            protocol, rows = "http" if number % 2 else "grpc", np.zeros((1, 784), dtype=np.float32)
            infer(clients, server, protocol, "mlp", rows, f"r{number}")
        assert metric(server, 'adaserve_traces_total{mode="triton"}') == 2
        assert metric(server, 'adaserve_traces_dropped_total{mode="triton"}') == 0
    entries = json.loads(trace_file.read_text())
    assert [e.get("request_id") for e in entries if "model_name" in e] == ["r1", "r3"]  # every second request
    assert all(len(e["timestamps"]) == 9 for e in entries if "timestamps" in e)
    summary = subprocess.run(
        [sys.executable, "-m", "adaserve", "trace", "summary", str(trace_file)], capture_output=True, text=True
    )
    assert summary.returncode == 0, summary.stderr
    assert "| mlp (1) HTTP | 2 |" in summary.stdout  # r1 and r3 went over HTTP


def test_a_server_asked_to_trace_without_a_file_does_not_start(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "adaserve", "serve", "--model-repository", str(tmp_path), "--http-port", "1"]
    done = subprocess.run([*command, "--trace-config", "level=TIMESTAMPS"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "tracing at level ['TIMESTAMPS'] needs a trace file" in done.stderr, done.stderr
