"""Structured logs: one JSON object a line, and grpcio's error for an answer to a call already ended kept at info."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from adaserve.logs import configure_logging

GRPC_CORE = "grpc._cython.cygrpc"
UNSENT = "ExecuteBatchError raised in core by servicer method [/inference.GRPCInferenceService/ModelInfer]"


@pytest.fixture
def logged(capsys: pytest.CaptureFixture[str]) -> Iterator[pytest.CaptureFixture[str]]:
    """configure_logging sets up the root logger; it is put back as it was after the test."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield capsys
    root.handlers[:] = handlers
    root.setLevel(level)


def lines(capsys: pytest.CaptureFixture[str]) -> list[dict[str, str]]:
    return [json.loads(line) for line in capsys.readouterr().err.splitlines()]


def test_each_record_is_a_json_line_with_its_extra_fields(logged: pytest.CaptureFixture[str]) -> None:
    configure_logging("info")
    logging.getLogger("adaserve.test").info("model ready", extra={"model": "mlp", "workers": 2})
    [line] = lines(logged)
    assert line["level"] == "info" and line["msg"] == "model ready" and line["model"] == "mlp" and line["workers"] == 2


def test_an_answer_to_a_call_already_ended_is_logged_at_info_saying_so(logged: pytest.CaptureFixture[str]) -> None:
    configure_logging("info")
    core = logging.getLogger(GRPC_CORE)
    try:
        raise RuntimeError("Failed execute_batch")
    except RuntimeError:
        core.exception(UNSENT)
    core.error("Unexpected [ValueError] raised by servicer method [/x]")  # anything else stays an error
    unsent, other = lines(logged)
    assert unsent["level"] == "info" and "exception" not in unsent
    assert unsent["msg"].startswith("an answer was not sent: its call had ended") and UNSENT in unsent["msg"]
    assert other["level"] == "error"
    configure_logging("warning")  # configured again: one filter still, and at warning the info line is left out
    core.error(UNSENT)
    assert lines(logged) == []
