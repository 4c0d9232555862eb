"""The standard gRPC health service (`grpc.health.v1.Health`, what Kubernetes' gRPC probes call): SERVING while
the server is ready, NOT_FOUND for a service it does not have, and NOT_SERVING to a watcher once the server starts
to stop, so a load balancer stops sending before the port closes."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.server_utils import ServerHandle, link_example, running_server

Status = health_pb2.HealthCheckResponse


@pytest.mark.parametrize("service", ["", "inference.GRPCInferenceService"])
def test_check_says_serving_when_the_server_is_ready(server: ServerHandle, service: str) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
    assert answer.status == Status.SERVING


def test_check_of_an_unknown_service_is_not_found(server: ServerHandle) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel, pytest.raises(grpc.RpcError) as refused:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="nope"), timeout=10)
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND and "unknown service 'nope'" in refused.value.details()


def test_a_watcher_hears_not_serving_when_the_server_stops(tmp_path: Path) -> None:
    root = tmp_path / "models"
    link_example(root, "mlp")
    with running_server(root) as server, grpc.insecure_channel(server.grpc_url) as channel:
        updates = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""), timeout=60)
        assert next(updates).status == Status.SERVING
        os.kill(server.pid, signal.SIGTERM)
        assert next(updates).status == Status.NOT_SERVING
