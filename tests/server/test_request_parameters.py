"""A response names the request parameters that were ignored, and why; the server logs each once per model.

Unit tests of the rules, then the session server over REST and gRPC (`mlp` there has neither learned caches nor an
activator). The conflict of `accuracy` with `latency_ms` needs an activator: `tests/adaptive/activator`.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from adaserve.server.request_parameters import IGNORED_KEY, KNOWN, IgnoredParameters, Target, ignored
from tests.server_utils import Clients, ServerHandle

PLAIN = Target("mlp")
GATI = Target("resnet", caches=True)
SLO = Target("mlp_slo", activator=True)


def test_unknown_and_inapplicable_parameters_are_named() -> None:
    reasons = ignored({"foo": 1, "latency_ms": 5, "accuracy": 0.9, "early_exit": False}, {}, PLAIN)
    assert reasons == {
        "foo": "unknown parameter",
        "latency_ms": "model 'mlp' has no activator (SLO-NNs): see adaserve activator build",
        "accuracy": "model 'mlp' has neither learned caches (GATI) nor an activator (SLO-NNs)",
        "early_exit": "model 'mlp' has no learned caches (GATI): see adaserve caches build",
    }


def test_a_conflict_names_the_parameter_that_won() -> None:
    assert ignored({"accuracy": 0.9, "latency_ms": 5}, {}, SLO) == {
        "latency_ms": "conflicts with accuracy, which won (SLO-NNs serves an accuracy target first)"
    }
    # A model's default can win a conflict: the request's parameter is still ignored, the default never named.
    assert list(ignored({"latency_ms": 5}, {"accuracy": 0.9}, SLO)) == ["latency_ms"]
    assert ignored({"accuracy": 0.9, "early_exit": False}, {}, GATI) == {
        "accuracy": "conflicts with early_exit false, which won (the whole model ran)"
    }


def test_parameters_that_are_used_or_known_are_not_named() -> None:
    assert ignored({"accuracy": 0.9, "early_exit": True, "priority": 1, "timeout": 5}, {}, GATI) == {}
    assert ignored({"accuracy": 0.9}, {}, SLO) == ignored({"latency_ms": 5}, {}, SLO) == {}
    reserved = {"sequence_id": 1, "headers": "x", "triton_enable_empty_final_response": True}
    assert (
        ignored({**reserved, **dict.fromkeys(KNOWN.keys() - {"accuracy", "latency_ms", "early_exit"}, 1)}, {}, PLAIN)
        == {}
    )
    # A DAG query's SLO is `latency_ms`, with or without an activator among its models.
    assert ignored({"latency_ms": 5, "accuracy": 0.9}, {}, Target("chain", caches=True, dag=True)) == {}


def test_a_tensor_parameter_on_the_request_is_named() -> None:
    assert ignored({"classification": 3}, {}, PLAIN) == {"classification": "an output's parameter, not the request's"}


def test_the_note_is_added_and_logged_once_per_model_and_parameter(caplog: pytest.LogCaptureFixture) -> None:
    notes = IgnoredParameters(remembered=2)
    with caplog.at_level(logging.WARNING, "adaserve.parameters"):
        for _ in range(3):
            answered = notes.annotate({"k": 0.5}, {"foo": 1, "bar": 2}, {}, lambda: PLAIN)
        notes.annotate({}, {"baz": 3}, {}, lambda: PLAIN)  # past `remembered`: said, not logged
    assert answered == {"k": 0.5, IGNORED_KEY: "bar: unknown parameter; foo: unknown parameter"}
    assert [(r.levelname, r.__dict__["model"], r.__dict__["parameter"]) for r in caplog.records] == [
        ("WARNING", "mlp", "foo"),
        ("WARNING", "mlp", "bar"),
    ]
    assert notes.annotate({"k": 0.5}, {}, {}, lambda: pytest.fail("no target is made for a request without any")) == {
        "k": 0.5
    }


# -- through the session server ------------------------------------------------------------------------------


def _infer(client: Any, protocol: str, parameters: dict[str, Any], **options: Any) -> dict[str, Any]:
    """The response parameters of one request to `mlp`, as plain values."""
    module = httpclient if protocol == "http" else grpcclient
    tensor = module.InferInput("image", [1, 784], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 784), np.float32))
    result = client.infer("mlp", [tensor], parameters=parameters, **options)
    if protocol == "http":
        return dict(result.get_response().get("parameters", {}))
    return {
        key: getattr(value, value.WhichOneof("parameter_choice"))
        for key, value in result.get_response().parameters.items()
    }


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_response_names_ignored_parameters(server: ServerHandle, clients: Clients, protocol: str) -> None:
    client = clients.of(server, protocol)
    answered = _infer(client, protocol, {"notes_test_unknown": "x", "latency_ms": 5.0})
    assert answered[IGNORED_KEY] == (
        "latency_ms: model 'mlp' has no activator (SLO-NNs): see adaserve activator build; "
        "notes_test_unknown: unknown parameter"
    )
    answered = _infer(client, protocol, {"accuracy": 0.9, "latency_ms": 5.0})
    assert answered[IGNORED_KEY].startswith("accuracy: model 'mlp' has neither learned caches")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_known_parameters_get_no_note(server: ServerHandle, clients: Clients, protocol: str) -> None:
    client = clients.of(server, protocol)
    assert IGNORED_KEY not in _infer(client, protocol, {}, priority=1, timeout=10_000_000)
    assert IGNORED_KEY not in _infer(client, protocol, {})


def test_the_server_logs_an_ignored_parameter_once(server: ServerHandle, clients: Clients) -> None:
    for protocol in ("http", "grpc", "http"):
        _infer(clients.of(server, protocol), protocol, {"notes_test_logged": 1})
    lines = [json.loads(line) for line in server.log.read_text().splitlines() if "notes_test_logged" in line]
    assert [(line["level"], line["model"], line["parameter"]) for line in lines] == [
        ("warning", "mlp", "notes_test_logged")
    ]
