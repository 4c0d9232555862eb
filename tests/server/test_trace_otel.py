"""Triton's OpenTelemetry trace mode on a real server: traced requests reach an OTLP/HTTP receiver (here, one in the
test process decoding OpenTelemetry's own protobuf messages) as Triton's three spans, nested in time and by parent,
on the wall clock, with the request's attributes; a DAG query's models as spans under the query's."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from adaserve.server.trace_otel import monotonic_to_wall_ns
from tests.server.test_dag import ONE_WORKER, write_dag
from tests.server_utils import (
    Clients,
    OtlpReceiver,
    ServerHandle,
    free_port,
    link_example,
    logged_errors,
    metric,
    otlp_receiver,
    running_server,
    span_attributes,
    write_fussy_model,
    write_slow_model,
)


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with otlp_receiver() as server:
        yield server


@pytest.fixture(scope="module")
def otel_server(tmp_path_factory: pytest.TempPathFactory, receiver: OtlpReceiver) -> Iterator[ServerHandle]:
    root = tmp_path_factory.mktemp("otel") / "models"
    link_example(root, "mlp")
    write_fussy_model(root, "double", workers=ONE_WORKER)
    write_slow_model(root, "slow", rounds=30, max_batch_size=4, workers=ONE_WORKER)
    write_dag(root, "pipe")
    options = ["mode=opentelemetry", f"opentelemetry,url={receiver.url}", "opentelemetry,bsp_schedule_delay=100"]
    options += ["opentelemetry,resource=service.name=adaserve-test", "level=TIMESTAMPS", "rate=1"]
    with running_server(root, *(f"--trace-config={option}" for option in options)) as handle:
        yield handle


def by_name(spans: list[Any]) -> dict[str, list[Any]]:
    named: dict[str, list[Any]] = {}
    for span in spans:
        named.setdefault(span.name, []).append(span)
    return named


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_traced_request_is_three_nested_spans(
    otel_server: ServerHandle, receiver: OtlpReceiver, protocol: str, tmp_path: Path, clients: Clients
) -> None:
    module: Any = httpclient if protocol == "http" else grpcclient
    client = clients.of(otel_server, protocol)
    assert client.get_trace_settings(as_json=True) if protocol == "grpc" else client.get_trace_settings()
    tensor = module.InferInput("image", [1, 784], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 784), dtype=np.float32))
    before = time.time_ns()
    client.infer("mlp", [tensor], request_id=f"otel-{protocol}")
    after = time.time_ns()
    spans = by_name(receiver.wait_for(f"otel-{protocol}", 3))
    (top,), (model,), (compute,) = spans["InferRequest"], spans["mlp"], spans["compute"]
    assert not top.parent_span_id and model.parent_span_id == top.span_id and compute.parent_span_id == model.span_id
    assert len({top.trace_id, model.trace_id, compute.trace_id}) == 1
    assert before <= top.start_time_unix_nano <= model.start_time_unix_nano <= compute.start_time_unix_nano
    assert compute.end_time_unix_nano <= model.end_time_unix_nano <= top.end_time_unix_nano <= after + 10**9
    request = {"model_name": "mlp", "model_version": 1, "request_id": f"otel-{protocol}", "parent_id": 0}
    assert span_attributes(model) == request
    frontend = ["HTTP_RECV_START", "HTTP_RECV_END", "HTTP_SEND_START", "HTTP_SEND_END"]
    if protocol == "grpc":
        frontend = ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "GRPC_SEND_START", "GRPC_SEND_END"]
    assert [e.name for e in top.events] == frontend
    assert [e.name for e in model.events] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
    resources = [resource for resource, span in receiver.spans if span.span_id == top.span_id]
    assert resources[0]["service.name"] == "adaserve-test"


def test_a_dag_querys_models_are_spans_under_the_querys(
    otel_server: ServerHandle, receiver: OtlpReceiver, clients: Clients
) -> None:
    client = clients.http(otel_server.http_url)
    assert client.get_trace_settings()["trace_mode"] == "opentelemetry"
    tensor = httpclient.InferInput("x", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.array([[1, 0, 0, 0]], dtype=np.float32))  # class 0: both nodes run
    client.infer("pipe", [tensor], request_id="otel-dag")
    spans = by_name(receiver.wait_for("otel-dag", 6))  # the top span, pipe's, and two models with a compute each
    (query,) = spans["pipe"]
    models = [span for name in ("double", "slow") for span in spans.get(name, [])]
    assert len(models) == 2 and all(span.parent_span_id == query.span_id for span in models)
    assert {span.parent_span_id for span in spans["compute"]} == {span.span_id for span in models}


def test_a_collector_that_cannot_be_reached_costs_a_warning_not_the_service(tmp_path: Path, clients: Clients) -> None:
    root = tmp_path / "models"
    link_example(root, "mlp")
    url = f"127.0.0.1:{free_port()}/v1/traces"  # nothing listens there
    options = ["mode=opentelemetry", f"opentelemetry,url={url}", "opentelemetry,bsp_schedule_delay=100"]
    options += ["level=TIMESTAMPS", "rate=1"]
    with running_server(root, *(f"--trace-config={option}" for option in options)) as server:
        client = clients.http(server.http_url)
        tensor = httpclient.InferInput("image", [1, 784], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, 784), dtype=np.float32))
        for _ in range(5):
            assert client.infer("mlp", [tensor]).as_numpy("logits").shape == (1, 10)
        deadline = time.monotonic() + 30
        while "cannot export traces" not in server.log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        lines = server.log.read_text().splitlines()
        assert sum("cannot export traces" in line for line in lines) == 1  # once a minute, naming the url
        assert logged_errors(server) == 0 and client.is_server_ready()


def exporter_pid(server: ServerHandle) -> int:
    """The server's trace exporter process: its child started by multiprocessing's spawn."""
    children = Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()
    spawned = [int(pid) for pid in children if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(spawned) == 1, spawned
    return spawned[0]


def test_an_exporter_that_dies_is_started_again_and_the_server_serves_on(
    tmp_path: Path, receiver: OtlpReceiver, clients: Clients
) -> None:
    """Spans are made in a process of their own; killed, it is noticed when its queue (here four records: twelve
    spans) is full, those traces are dropped, and the next go through a new one."""
    root = tmp_path / "models"
    link_example(root, "mlp")
    options = ["mode=opentelemetry", f"opentelemetry,url={receiver.url}", "opentelemetry,bsp_schedule_delay=100"]
    options += ["opentelemetry,bsp_max_queue_size=12", "opentelemetry,bsp_max_export_batch_size=12"]
    options += ["level=TIMESTAMPS", "rate=1"]
    with running_server(root, *(f"--trace-config={option}" for option in options)) as server:
        client = clients.http(server.http_url)
        tensor = httpclient.InferInput("image", [1, 784], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, 784), dtype=np.float32))
        client.infer("mlp", [tensor], request_id="before")
        receiver.wait_for("before", 3)
        first = exporter_pid(server)
        os.kill(first, signal.SIGKILL)
        while Path(f"/proc/{first}/stat").read_text().split()[2] != "Z":  # dead (a zombie until the server looks)
            time.sleep(0.01)
        for index in range(6):  # four fill the dead one's queue, the fifth finds it full and its process gone
            client.infer("mlp", [tensor], request_id=f"while-dead-{index}")
        client.infer("mlp", [tensor], request_id="after")
        receiver.wait_for("after", 3)
        assert exporter_pid(server) != first
        lines = server.log.read_text().splitlines()
        assert sum("the trace exporter process exited" in line for line in lines) == 1
        assert metric(server, 'adaserve_traces_total{mode="opentelemetry"}') == 8
        # the five the dead exporter's queue held or refused, and those refused before its death was seen
        assert metric(server, 'adaserve_traces_dropped_total{mode="opentelemetry"}') >= 5
        assert client.is_server_ready()


def test_spans_held_at_stop_are_exported_before_the_server_exits(
    tmp_path: Path, receiver: OtlpReceiver, clients: Clients
) -> None:
    root = tmp_path / "models"
    link_example(root, "mlp")
    options = ["mode=opentelemetry", f"opentelemetry,url={receiver.url}", "level=TIMESTAMPS", "rate=1"]
    with running_server(root, *(f"--trace-config={option}" for option in options)) as server:  # 5 s export period
        client = clients.http(server.http_url)
        tensor = httpclient.InferInput("image", [1, 784], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, 784), dtype=np.float32))
        client.infer("mlp", [tensor], request_id="at-stop")
        exporter = exporter_pid(server)
    assert len(receiver.wait_for("at-stop", 3, timeout_s=0.1)) == 3  # sent while the server stopped
    assert not Path(f"/proc/{exporter}").exists()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_clients_trace_context_is_traced_and_parents_the_spans(
    otel_server: ServerHandle, receiver: OtlpReceiver, protocol: str, clients: Clients
) -> None:
    """A W3C `traceparent` is traced whatever the sampling says (here one request in a million), under the client's
    trace and span."""
    http = clients.http(otel_server.http_url)
    http.update_trace_settings("mlp", {"trace_rate": "1000000"})
    trace_id, span_id = "4bf92f3577b34da6a3ce929d0e0e47" + ("36" if protocol == "http" else "37"), "00f067aa0ba902b7"
    try:
        module: Any = httpclient if protocol == "http" else grpcclient
        client = clients.of(otel_server, protocol)
        tensor = module.InferInput("image", [1, 784], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 784), dtype=np.float32))
        headers = {"traceparent": f"00-{trace_id}-{span_id}-01"}
        client.infer("mlp", [tensor], request_id=f"propagated-{protocol}", headers=headers)
        client.infer("mlp", [tensor], request_id=f"sampled-out-{protocol}")
    finally:
        http.update_trace_settings("mlp", {})
    spans = by_name(receiver.wait_for(f"propagated-{protocol}", 3))
    (top,) = spans["InferRequest"]
    assert top.trace_id.hex() == trace_id and top.parent_span_id.hex() == span_id
    time.sleep(1.0)  # ten export periods: the request after it would have come by now, had it been traced
    assert not [
        span for _, span in receiver.spans if span_attributes(span).get("request_id") == f"sampled-out-{protocol}"
    ]


def test_the_clock_offset_comes_from_its_tightest_bracket(monkeypatch: pytest.MonkeyPatch) -> None:
    """A preemption between reading the wall clock and the monotonic one put every span's times off by its length
    (a span began 8 ms before its request was sent, beside a spinner): the bracket it widened is not used."""
    wall = 1_000_000_000_000  # the wall clock is this far ahead of the monotonic one
    monotonic = iter([0, 10_000_000, 10_000_100, 10_000_300, *range(20_000_000, 20_000_060, 2)])
    monkeypatch.setattr(time, "perf_counter_ns", lambda: next(monotonic))
    # the wall clock is read at the first bracket's start (then the process sleeps 10 ms), and mid-bracket after
    walls = iter([wall, wall + 10_000_200, *(wall + 20_000_000 + 4 * i + 1 for i in range(8))])
    monkeypatch.setattr(time, "time_ns", lambda: next(walls))
    assert abs(monotonic_to_wall_ns(reads=3) - wall) <= 100
