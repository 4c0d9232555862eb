"""Protocol extensions this server does not implement are refused by name over REST and gRPC, never ignored: a
client asking for a sequence must not get an answer that looks right."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.server_utils import Clients, ServerHandle

PROTOCOLS = {"http": (httpclient, "400"), "grpc": (grpcclient, "StatusCode.INVALID_ARGUMENT")}


def sequence(client: Any, module: Any, tensor: Any) -> Any:
    return client.infer("mlp", [tensor], sequence_id=7, sequence_start=True)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(
    ("ask", "message"),
    [
        (sequence, "asks for the sequence extension (every model here is stateless), which this server does not"),
    ],
)
def test_an_extension_not_implemented_is_refused_by_name(
    server: ServerHandle, protocol: str, ask: Callable[[Any, Any, Any], Any], message: str, clients: Clients
) -> None:
    module, status = PROTOCOLS[protocol]
    client = clients.of(server, protocol)
    tensor = module.InferInput("image", [1, 784], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 784), dtype=np.float32))
    with pytest.raises(InferenceServerException) as raised:
        ask(client, module, tensor)
    assert raised.value.status() == status
    assert message in raised.value.message()
    assert client.is_server_ready()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_timeout_parameter_is_read_not_passed_over(server: ServerHandle, protocol: str, clients: Clients) -> None:
    """tritonclient's `infer(timeout=...)` reaches the engine (tests/engine/test_engine.py checks what it does)."""
    module, status = PROTOCOLS[protocol]
    client = clients.of(server, protocol)
    tensor = module.InferInput("image", [1, 784], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 784), dtype=np.float32))
    assert client.infer("mlp", [tensor], timeout=10_000_000).as_numpy("logits").shape == (1, 10)
    with pytest.raises(InferenceServerException) as raised:
        client.infer("mlp", [tensor], timeout=-5)
    assert raised.value.status() == status
    assert "parameter 'timeout' must be a whole number of microseconds >= 0, got -5" in raised.value.message()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_priority_parameter_is_read_and_the_extension_announced(
    server: ServerHandle, protocol: str, clients: Clients
) -> None:
    """tritonclient's `infer(priority=...)` reaches the engine (tests/engine/test_engine.py checks the order it
    gives): together with `timeout` that is Triton's schedule-policy extension, which the server metadata names."""
    module, status = PROTOCOLS[protocol]
    client = clients.of(server, protocol)
    metadata = client.get_server_metadata()
    assert "schedule_policy" in (metadata["extensions"] if protocol == "http" else metadata.extensions)
    tensor = module.InferInput("image", [1, 784], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 784), dtype=np.float32))
    assert client.infer("mlp", [tensor], priority=1).as_numpy("logits").shape == (1, 10)
    if protocol == "http":  # the gRPC client sends priority as a uint64, and refuses a negative one itself
        with pytest.raises(InferenceServerException) as raised:
            client.infer("mlp", [tensor], priority=-5)
        assert raised.value.status() == status
        assert "parameter 'priority' must be a whole number >= 0 (1 the highest), got -5" in raised.value.message()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_logging_extension_reads_and_sets_the_servers_log_switches(
    server: ServerHandle, protocol: str, clients: Clients
) -> None:
    """tritonclient's `get_log_settings` / `update_log_settings`: the server's switches, changed while it runs;
    a setting that cannot be applied is refused by name and changes nothing."""
    _, status = PROTOCOLS[protocol]
    client = clients.of(server, protocol)

    def settings() -> dict[str, Any]:
        if protocol == "http":
            return dict(client.get_log_settings())
        answer = client.get_log_settings(as_json=True)["settings"]
        return {name: next(iter(value.values())) for name, value in answer.items()}

    assert "logging" in (
        client.get_server_metadata()["extensions"] if protocol == "http" else client.get_server_metadata().extensions
    )
    assert settings()["log_info"] is True
    try:
        client.update_log_settings({"log_info": False})
        assert settings()["log_info"] is False
        with pytest.raises(InferenceServerException) as raised:
            client.update_log_settings({"log_file": "/tmp/server.log"})
        assert raised.value.status() == status and "logs go to stderr here" in raised.value.message()
        assert settings()["log_info"] is False
    finally:
        client.update_log_settings({"log_info": True})  # the session's server, as it was
    assert settings()["log_info"] is True
