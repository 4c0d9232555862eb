"""Triton's endpoint restrictions (`--http-restricted-api`, `--grpc-restricted-protocol`): a restricted category
answers only requests with its header and value, with tritonclient's `headers=` on both protocols; the others stay
open; a refusal names the header and is not logged as a server error; bad options stop the server at start."""

from __future__ import annotations

import contextlib
import queue
import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.utils import InferenceServerException

from adaserve.errors import ConfigError, NotAllowedError
from adaserve.server.restrictions import GRPC_PREFIX, Header, Restrictions, frontend_restrictions
from tests.server_utils import Clients, ServerHandle, link_example, logged_errors, running_server

ADMIN = ("model-repository,trace,logging", "admin-key", "s3cret")
INFER = ("inference", "infer-key", "letmein")
#: What each protocol's client sends as the header of a restriction keyed `key`, and its refusal's status.
PROTOCOLS = {
    "http": (httpclient, "{key}", "403", "This API is restricted, expecting header '{key}'"),
    "grpc": (
        grpcclient,
        "triton-grpc-protocol-{key}",
        "StatusCode.PERMISSION_DENIED",
        "This protocol is restricted, expecting header 'triton-grpc-protocol-{key}'",
    ),
}


@pytest.fixture(scope="module")
def restricted_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    root = tmp_path_factory.mktemp("restricted") / "models"
    link_example(root, "mlp")
    options = []
    for categories, key, value in (ADMIN, INFER):
        options += [f"--http-restricted-api={categories}:{key}={value}"]
        options += [f"--grpc-restricted-protocol={categories}:{key}={value}"]
    options += ["--grpc-restricted-protocol=health:probe-key=k8s"]  # not on REST: the test harness polls its ready
    with running_server(root, *options) as handle:
        yield handle


def header(protocol: str, key: str, value: str) -> dict[str, str]:
    return {PROTOCOLS[protocol][1].format(key=key): value}


def image(protocol: str) -> Any:
    tensor = PROTOCOLS[protocol][0].InferInput("image", [1, 784], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 784), dtype=np.float32))
    return tensor


def assert_refused(protocol: str, key: str, call: Any) -> None:
    _, _, status, message = PROTOCOLS[protocol]
    with pytest.raises(InferenceServerException) as refused:
        call()
    assert refused.value.status() == status and message.format(key=key) in refused.value.message()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_restricted_category_answers_only_with_its_header(
    restricted_server: ServerHandle, protocol: str, clients: Clients
) -> None:
    client = clients.of(restricted_server, protocol)
    errors_before = logged_errors(restricted_server)
    assert_refused(protocol, "admin-key", lambda: client.get_model_repository_index())
    assert_refused(protocol, "admin-key", lambda: client.get_trace_settings(headers=header(protocol, "admin-key", "")))
    wrong = header(protocol, "admin-key", "s3cret!")
    assert_refused(protocol, "admin-key", lambda: client.update_log_settings({"log_info": True}, headers=wrong))
    assert_refused(
        protocol, "admin-key", lambda: client.get_log_settings(headers=header(protocol, "infer-key", "s3cret"))
    )
    admin = header(protocol, "admin-key", "s3cret")
    index = client.get_model_repository_index(headers=admin)
    assert "mlp" in str(index)
    assert client.get_trace_settings(headers=admin)
    assert_refused(protocol, "infer-key", lambda: client.infer("mlp", [image(protocol)], headers=admin))
    answer = client.infer("mlp", [image(protocol)], headers=header(protocol, "infer-key", "letmein"))
    assert answer.as_numpy("logits").shape == (1, 10)
    assert logged_errors(restricted_server) == errors_before  # a refusal is the client's error


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_other_categories_stay_open(restricted_server: ServerHandle, protocol: str, clients: Clients) -> None:
    client = clients.of(restricted_server, protocol)
    if protocol == "http":
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("mlp")
    assert client.get_server_metadata() and client.get_model_metadata("mlp")
    assert client.get_model_config("mlp") and client.get_inference_statistics("mlp")


def test_the_health_category_covers_the_grpc_health_service(restricted_server: ServerHandle, clients: Clients) -> None:
    """Triton's `health` category: live, ready and model ready, and on gRPC the standard health service too."""
    client = clients.grpc(restricted_server.grpc_url)
    assert_refused("grpc", "probe-key", lambda: client.is_server_live())
    assert client.is_server_ready(headers=header("grpc", "probe-key", "k8s"))
    with grpc.insecure_channel(restricted_server.grpc_url) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            health.Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        metadata = [("triton-grpc-protocol-probe-key", "k8s")]
        answer = health.Check(health_pb2.HealthCheckRequest(), metadata=metadata, timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_an_http_header_name_matches_in_any_case(restricted_server: ServerHandle, clients: Clients) -> None:
    client = clients.http(restricted_server.http_url)
    assert client.get_model_repository_index(headers={"Admin-Key": "s3cret"})


def test_a_grpc_stream_is_refused_without_the_inference_header(
    restricted_server: ServerHandle, clients: Clients
) -> None:
    results: queue.Queue[Any] = queue.Queue()
    for metadata, refused in ((None, True), (header("grpc", "infer-key", "letmein"), False)):
        client = clients.grpc(restricted_server.grpc_url)
        client.start_stream(lambda result, error: results.put((result, error)), headers=metadata)
        with contextlib.suppress(InferenceServerException):  # a refused stream may have ended already
            client.async_stream_infer("mlp", [image("grpc")])
        result, error = results.get(timeout=30)
        client.stop_stream()
        if refused:
            assert error is not None and "expecting header 'triton-grpc-protocol-infer-key'" in error.message()
        else:
            assert error is None and result.as_numpy("logits").shape == (1, 10)


def test_restrictions_parse_tritons_form_and_check_headers() -> None:
    restrictions = Restrictions.parse(["trace,logging:Admin-Key=x", "inference:k=v=w"], "--grpc-restricted-protocol")
    assert restrictions.required == {
        "trace": Header("admin-key", "x"),
        "logging": Header("admin-key", "x"),
        "inference": Header("k", "v=w"),  # the value is everything after the first '='
    }
    restrictions.check("trace", lambda: {"admin-key": "x"})
    restrictions.check("health", lambda: {})  # not restricted
    with pytest.raises(NotAllowedError, match="This API is restricted, expecting header 'k'"):
        restrictions.check("inference", lambda: {"k": "v"})
    grpc = Restrictions.parse(["trace:key=x"], "--grpc-restricted-protocol", GRPC_PREFIX)
    with pytest.raises(
        NotAllowedError, match="This protocol is restricted, expecting header 'triton-grpc-protocol-key'"
    ):
        grpc.check("trace", lambda: {"key": "x"})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["trace"], "'trace': expected CATEGORY[,CATEGORY...]:KEY=VALUE"),
        (["trace:key"], "'trace:key': expected CATEGORY"),
        ([":key=v"], "':key=v': expected CATEGORY"),
        (["trace:=v"], "'trace:=v': expected CATEGORY"),
        (["tracing:key=v"], "unknown category 'tracing'; the categories are: health, metadata, inference"),
        (["trace:a=1", "logging,trace:b=2"], "category 'trace' is in more than one group"),
    ],
)
def test_a_bad_restriction_is_refused_by_name(options: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Restrictions.parse(options, "--http-restricted-api")
    assert message in str(refused.value)


def test_a_server_with_a_bad_restriction_does_not_start(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "adaserve", "serve", "--model-repository", str(tmp_path), "--http-port", "1"]
    done = subprocess.run([*command, "--http-restricted-api=infer:k=v"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "unknown category 'infer'" in done.stderr, done.stderr


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    """`--restricted-api` for model control and /metrics on both frontends, and REST's inference behind its own."""
    root = tmp_path_factory.mktemp("shared") / "models"
    link_example(root, "mlp")
    options = ["--restricted-api=model-repository,metrics:admin-key=s3cret", "--http-restricted-api=inference:k=v"]
    with running_server(root, *options) as handle:
        yield handle


def test_one_setting_restricts_both_frontends_and_the_metrics(shared_server: ServerHandle, clients: Clients) -> None:
    """`--http-restricted-api` did not reach gRPC (it has its own flag), and /metrics could not be restricted."""
    admin = {"admin-key": "s3cret"}
    for protocol in PROTOCOLS:
        client = clients.of(shared_server, protocol)
        with pytest.raises(InferenceServerException, match="restricted, expecting header 'admin-key'") as refused:
            client.load_model("mlp")
        assert refused.value.status() == PROTOCOLS[protocol][2]
        client.load_model("mlp", headers=admin)  # the same header on both
    url = f"http://{shared_server.http_url}/metrics"
    with pytest.raises(urllib.error.HTTPError) as refused_metrics:
        urllib.request.urlopen(url, timeout=30)
    assert refused_metrics.value.code == 403
    refused_metrics.value.close()
    with urllib.request.urlopen(urllib.request.Request(url, headers=admin), timeout=30) as answer:
        assert b"adaserve_" in answer.read()
    with pytest.raises(InferenceServerException, match="expecting header 'k'"):
        clients.http(shared_server.http_url).infer("mlp", [image("http")])  # REST's own restriction
    assert clients.grpc(shared_server.grpc_url).infer("mlp", [image("grpc")]).as_numpy("logits").shape == (1, 10)


@pytest.mark.parametrize(
    ("shared", "http", "grpc_options", "message"),
    [
        (["trace:a=1"], ["trace:b=2"], [], "--restricted-api and --http-restricted-api: category 'trace'"),
        (["logging:a=1"], [], ["logging:b=2"], "--restricted-api and --grpc-restricted-protocol: category 'log"),
        ([], [], ["metrics:a=1"], "category 'metrics' has no gRPC call (REST's /metrics)"),
    ],
)
def test_a_category_restricted_twice_on_a_frontend_is_refused(
    shared: list[str], http: list[str], grpc_options: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        frontend_restrictions(shared, http, grpc_options)
