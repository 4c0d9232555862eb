"""Structured logs: one JSON object a line, and grpcio's error for an answer to a call already ended kept at info."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator

import pytest

from adaserve.errors import InvalidInputError
from adaserve.logs import SWITCHES, configure_logging

GRPC_CORE = "grpc._cython.cygrpc"
UNSENT = "ExecuteBatchError raised in core by servicer method [/inference.GRPCInferenceService/ModelInfer]"


@pytest.fixture
def logged(capsys: pytest.CaptureFixture[str]) -> Iterator[pytest.CaptureFixture[str]]:
    """configure_logging sets up the root logger; it is put back as it was after the test."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield capsys
    root.handlers[:] = handlers
    SWITCHES.set_level(logging.INFO)
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


def test_the_logging_extension_switches_each_level_on_or_off_in_any_combination(
    logged: pytest.CaptureFixture[str],
) -> None:
    """Triton's log settings: warnings off while info and errors stay on is a combination no single level gives."""
    configure_logging("info")
    log = logging.getLogger("adaserve.test")
    assert SWITCHES.settings() == {
        "log_file": "",
        "log_info": True,
        "log_warning": True,
        "log_error": True,
        "log_verbose_level": 0,
        "log_format": "default",
    }
    after = SWITCHES.update({"log_warning": False, "log_verbose_level": 1})
    assert (after["log_warning"], after["log_verbose_level"]) == (False, 1)
    for emit in (log.debug, log.info, log.warning, log.error):
        emit(emit.__name__)
    assert [line["msg"] for line in lines(logged)] == ["debug", "info", "error"]
    SWITCHES.update({"log_info": False, "log_error": False, "log_verbose_level": 0})
    log.info("info")
    log.error("error")
    assert lines(logged) == [] and logging.getLogger().level > logging.CRITICAL  # nothing is even made


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"log_info": 1}, "log setting 'log_info' must be true or false, got 1"),
        ({"log_verbose_level": -1}, "'log_verbose_level' must be a whole number >= 0, got -1"),
        ({"log_verbose_level": True}, "'log_verbose_level' must be a whole number >= 0, got True"),
        ({"log_file": "/tmp/server.log"}, "logs go to stderr here; only '' is accepted"),
        ({"log_format": "ISO8601"}, "one format here (JSON lines); only 'default'"),
        ({"log_info": False, "loud": True}, "unknown log setting 'loud'; the settings are log_file, log_info"),
    ],
)
def test_a_log_setting_that_cannot_be_applied_is_refused_by_name_and_nothing_changes(
    logged: pytest.CaptureFixture[str], changes: dict[str, object], message: str
) -> None:
    configure_logging("info")
    before = SWITCHES.settings()
    with pytest.raises(InvalidInputError, match=re.escape(message)):
        SWITCHES.update(changes)
    assert SWITCHES.settings() == before


def test_each_listener_is_told_the_settings_after_every_change_and_none_after_a_refusal(
    logged: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    told: list[dict[str, object]] = []
    monkeypatch.setattr(SWITCHES, "listeners", [told.append])
    configure_logging("warning")
    SWITCHES.update({"log_verbose_level": 2})
    with pytest.raises(InvalidInputError):
        SWITCHES.update({"log_info": 1})
    assert [(settings["log_info"], settings["log_verbose_level"]) for settings in told] == [(False, 0), (False, 2)]
