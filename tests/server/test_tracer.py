"""The trace extension's settings and sampling (`adaserve.server.trace`), without a server: which requests are
traced, how a model's settings follow the server's, what the trace file holds, and every refusal by name."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from adaserve.engine.engine import RequestTimes
from adaserve.errors import ConfigError, InvalidInputError
from adaserve.server.trace import FORWARDED, TraceFile, Tracer, TraceSettings, parse_traceparent, tracer_from_config
from adaserve.server.trace_state import TraceState


@pytest.fixture
def tracer(tmp_path: Path) -> Iterator[Callable[..., Tracer]]:
    """Makes a tracer writing to `tmp_path / "trace.json"` with the given settings; closes it after the test."""
    made: list[Tracer] = []

    def make(**settings: Any) -> Tracer:
        made.append(Tracer(TraceSettings(**settings), TraceFile(tmp_path / "trace.json")))
        return made[-1]

    yield make
    for each in made:
        each.close()


def traced(tracer: Tracer, model: str, requests: int) -> list[int]:
    """The requests (1-based) of `requests` that were sampled, each finished at once."""
    sampled = []
    for number in range(1, requests + 1):
        trace = tracer.begin(model, f"r{number}")
        if trace is not None:
            sampled.append(number)
            tracer.finish(trace)
    return sampled


def test_every_rate_th_request_is_traced_while_the_count_lasts(tracer: Callable[..., Tracer]) -> None:
    server = tracer(level=("TIMESTAMPS",), rate=3, count=2)
    assert traced(server, "mlp", 12) == [3, 6]
    assert server.settings()["trace_count"] == "0"  # what is left, as Triton reports it
    server.update("", {"trace_count": ["-1"]})
    assert traced(server, "mlp", 7) == [3, 6]  # counting starts again with new settings


def test_nothing_is_traced_at_level_off(tracer: Callable[..., Tracer]) -> None:
    assert traced(tracer(rate=1), "mlp", 5) == []


def test_a_model_has_its_own_settings_and_follows_the_servers_in_the_rest(tracer: Callable[..., Tracer]) -> None:
    server = tracer(level=("TIMESTAMPS",), rate=1)
    mine = server.update("mlp", {"trace_rate": ["2"]})
    assert (mine["trace_rate"], mine["trace_level"]) == ("2", ["TIMESTAMPS"])
    assert traced(server, "mlp", 4) == [2, 4] and traced(server, "cnn", 2) == [1, 2]
    server.update("", {"trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": ["5"]})
    assert server.settings("mlp")["trace_level"] == ["TIMESTAMPS", "TENSORS"]  # not given for it: followed
    assert server.settings("mlp")["trace_rate"] == "2"  # given for it: kept
    server.update("mlp", {"trace_rate": None})  # cleared: follows the server's again
    assert server.settings("mlp")["trace_rate"] == "5"
    server.update("", {"trace_rate": None, "trace_level": None})  # the server's return to their values at start
    assert server.settings()["trace_rate"] == "1" and server.settings()["trace_level"] == ["TIMESTAMPS"]


def test_a_model_request_with_no_settings_drops_the_models_own(tracer: Callable[..., Tracer]) -> None:
    server = tracer(level=("TIMESTAMPS",), rate=1)
    server.update("mlp", {"trace_level": ["OFF"]})
    assert traced(server, "mlp", 3) == []
    server.update("mlp", {})
    assert traced(server, "mlp", 3) == [1, 2, 3]


def test_the_trace_file_holds_each_trace_in_tritons_form(tracer: Callable[..., Tracer], tmp_path: Path) -> None:
    server = tracer(level=("TIMESTAMPS", "TENSORS"), rate=1)
    trace = server.begin("mlp", "req-7")
    assert trace is not None
    trace.model_version = "1"
    trace.stamp("REQUEST_START", 100)
    trace.stamp_times(RequestTimes(queued_ns=110, compute_start_ns=120, compute_end_ns=130))
    trace.tensor("TENSOR_QUEUE_INPUT", "image", "FP32", np.array([[0.5, 1.0]], dtype=np.float32))
    trace.tensor("TENSOR_QUEUE_INPUT", "text", "BYTES", np.array([b"a", b"b"], dtype=np.object_))
    server.finish(trace)
    server.close()
    entries = json.loads((tmp_path / "trace.json").read_text())
    assert entries[0] == {"id": 1, "model_name": "mlp", "model_version": 1, "request_id": "req-7"}
    assert [(t["name"], t["ns"]) for t in entries[1]["timestamps"]] == [
        ("REQUEST_START", 100),
        ("QUEUE_START", 110),
        ("COMPUTE_START", 120),
        ("COMPUTE_END", 130),
    ]
    assert entries[2]["tensor"] == {"name": "image", "data": "0.5,1.0", "shape": "1,2", "dtype": "FP32"}
    assert entries[3]["tensor"]["data"] == "a,b"


def test_traces_go_log_frequency_at_a_time_into_numbered_files(tracer: Callable[..., Tracer], tmp_path: Path) -> None:
    server = tracer(level=("TIMESTAMPS",), rate=1, log_frequency=2)
    traced(server, "mlp", 5)
    assert len(json.loads((tmp_path / "trace.json.0").read_text())) == 2  # one entry each: nothing was stamped
    assert len(json.loads((tmp_path / "trace.json.1").read_text())) == 2
    assert not (tmp_path / "trace.json.2").exists()
    server.close()  # the fifth, at stop
    assert len(json.loads((tmp_path / "trace.json.2").read_text())) == 1
    assert json.loads((tmp_path / "trace.json").read_text()) == []


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"trace_file": ["/tmp/x"]}, "trace file location can not be updated through network protocol"),
        ({"trace_rat": ["1"]}, "unknown trace setting 'trace_rat'; the settings are: trace_file, trace_level"),
        ({"trace_rate": ["often"]}, "trace setting 'trace_rate' must be an integer, got 'often'"),
        ({"trace_rate": ["0"]}, "trace setting 'trace_rate' must be at least 1, got 0"),
        ({"trace_count": ["-2"]}, "trace setting 'trace_count' must be at least -1, got -2"),
        ({"log_frequency": ["1", "2"]}, "trace setting 'log_frequency' takes one value, got 2"),
        ({"trace_level": ["OFF", "TIMESTAMPS"]}, "trace_level OFF cannot be given with other levels"),
        ({"trace_level": ["VERBOSE"]}, "unknown trace_level ['VERBOSE']; the levels are OFF, TIMESTAMPS, TENSORS"),
    ],
)
def test_a_bad_setting_is_refused_by_name_and_changes_nothing(
    tracer: Callable[..., Tracer], changes: dict[str, list[str]], message: str
) -> None:
    server = tracer(level=("TIMESTAMPS",), rate=7)
    before = server.settings()
    with pytest.raises(InvalidInputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        server.update("", {"trace_count": ["5"], **changes})
    assert server.settings() == before


def test_without_a_trace_file_tracing_cannot_be_turned_on() -> None:
    server = Tracer(TraceSettings(), None)
    assert server.settings()["trace_file"] == "" and server.begin("mlp", "") is None
    with pytest.raises(InvalidInputError, match="tracing needs a trace file, and this server has none: start the"):
        server.update("mlp", {"trace_level": ["TIMESTAMPS"]})
    with pytest.raises(ConfigError, match=r"tracing at level \['TIMESTAMPS'\] needs a trace file"):
        Tracer(TraceSettings(level=("TIMESTAMPS",)), None)


def test_trace_config_takes_tritons_command_line_form(tmp_path: Path) -> None:
    tracer = tracer_from_config(
        [
            f"triton,file={tmp_path / 't.json'}",
            "triton,log-frequency=50",
            "rate=100",
            "level=TIMESTAMPS",
            "level=TENSORS",
            "count=10",
            "mode=triton",
        ]
    )
    try:
        assert tracer.initial == TraceSettings(level=("TIMESTAMPS", "TENSORS"), rate=100, count=10, log_frequency=50)
        assert isinstance(tracer.sink, TraceFile) and tracer.sink.path == tmp_path / "t.json"
    finally:
        tracer.close()


def test_trace_config_takes_tritons_opentelemetry_settings() -> None:
    tracer = tracer_from_config(
        [
            "mode=opentelemetry",
            "opentelemetry,url=127.0.0.1:1/v1/traces",
            "opentelemetry,resource=service.name=ours",
            "opentelemetry,resource=deployment=test",
            "opentelemetry,bsp_schedule_delay=100",
            "level=TIMESTAMPS",
        ]
    )
    try:
        settings = tracer.settings()
        assert settings["trace_mode"] == "opentelemetry" and settings["url"] == "http://127.0.0.1:1/v1/traces"
        assert settings["resource"] == "service.name=ours,deployment=test"
        assert settings["bsp_schedule_delay"] == "100" and settings["bsp_max_queue_size"] == "2048"
        assert "trace_file" not in settings  # as Triton answers in this mode
        with pytest.raises(
            InvalidInputError, match=r"trace mode opentelemetry does not record trace_level \['TENSORS'\]"
        ):
            tracer.update("", {"trace_level": ["TIMESTAMPS", "TENSORS"]})
    finally:
        tracer.close()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["mode=zipkin"], "the trace modes are triton and opentelemetry"),
        (["rate"], r"expected \[triton,\|opentelemetry,\]SETTING=VALUE"),
        (["speed=3"], "'speed=3': unknown setting"),
        (["triton,url=x"], "'triton,url=x': unknown setting"),
        (["rate=fast"], "--trace-config: trace setting 'trace_rate' must be an integer, got 'fast'"),
        (["opentelemetry,resource=novalue"], "a resource is KEY=VALUE"),
        (["opentelemetry,bsp_schedule_delay=0"], "expected a whole number above 0"),
        (["mode=opentelemetry", "opentelemetry,bsp_other=3"], "'opentelemetry,bsp_other=3': unknown setting"),
        (["mode=opentelemetry", "level=TENSORS"], "trace mode opentelemetry does not record trace_level"),
        (
            ["mode=opentelemetry", "opentelemetry,bsp_max_queue_size=8", "opentelemetry,bsp_max_export_batch_size=16"],
            "bsp_max_export_batch_size=16 is above bsp_max_queue_size=8",
        ),
    ],
)
def test_a_bad_trace_config_is_refused_by_name(options: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        tracer_from_config(options)


def test_an_unwritable_trace_file_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot write the trace file .*/missing/trace\.json: No such file"):
        TraceFile(tmp_path / "missing" / "trace.json")


def test_a_forwarded_request_is_traced_exactly_when_the_node_it_entered_traced_it(
    tracer: Callable[..., Tracer], tmp_path: Path
) -> None:
    """The entry node samples (every second request here); the holder traces what comes with the entry's trace
    context whatever its own rate, and nothing else forwarded, under the entry's forward span."""
    entry, holder = tracer(level=("TIMESTAMPS",), rate=2), tracer(level=("TIMESTAMPS",), rate=1000)
    assert entry.begin("mlp", "", lambda: {}) is None
    sent = entry.begin("mlp", "", lambda: {})
    assert sent is not None
    forward, context = sent.forward("b")
    forward.end()
    assert holder.begin("mlp", "r", lambda: {FORWARDED: "1"}) is None  # the entry did not trace it
    received = holder.begin("mlp", "r", lambda: {FORWARDED: "1", **context})
    assert received is not None
    version, trace_id, span_id, flags = context["traceparent"].split("-")
    assert (version, flags, span_id) == ("00", "01", forward.span_id)
    assert received.trace_id == sent.trace_id == trace_id
    entries = sent.entries()
    assert entries[0] == {"id": 1, "model_name": "mlp", "trace_id": trace_id}
    assert entries[1]["activity"] == "FORWARD" and entries[1]["holder"] == "b" and entries[1]["span_id"] == span_id
    assert [stamp["name"] for stamp in entries[1]["timestamps"]] == ["FORWARD_START", "FORWARD_END"]
    assert received.entries()[0] == {
        "id": 1,
        "model_name": "mlp",
        "request_id": "r",
        "trace_id": trace_id,
        "parent_span_id": span_id,
    }


def test_a_clients_trace_context_travels_on_with_a_span_of_the_forward() -> None:
    tracer = Tracer(TraceSettings(level=("TIMESTAMPS",)), TraceFile(Path(os.devnull)))
    client = {"traceparent": f"00-{'ab' * 16}-{'cd' * 8}-00", "tracestate": "vendor=1", FORWARDED: "1"}
    trace = tracer.begin("mlp", "", lambda: client)
    assert trace is not None
    _, first = trace.forward("b")
    _, second = trace.forward("c")  # sent again: a span of its own
    assert first["traceparent"].startswith(f"00-{'ab' * 16}-") and first["traceparent"].endswith("-00")
    assert first["traceparent"] != second["traceparent"] and first["tracestate"] == "vendor=1"
    tracer.close()


def test_a_dag_querys_stages_sent_to_other_nodes_share_its_trace(tracer: Callable[..., Tracer]) -> None:
    server = tracer(level=("TIMESTAMPS",), rate=1)
    query = server.begin("pipe", "q")
    assert query is not None
    stages = [server.child(query, model) for model in ("mlp", "cnn")]
    contexts = [stage.forward("b")[1]["traceparent"].split("-")[1] for stage in stages]
    assert contexts[0] == contexts[1] == query.trace_id == stages[0].trace_id
    assert server.child(query, "mlp").entries()[0]["parent_id"] == query.id


@pytest.mark.parametrize("value", ["", "00-xyz", f"ff-{'ab' * 16}-{'cd' * 8}-01", f"00-{'0' * 32}-{'cd' * 8}-01"])
def test_a_traceparent_that_is_not_valid_is_not_taken(value: str) -> None:
    assert parse_traceparent(value) is None


def test_a_state_adopted_restarts_the_count_only_where_it_gave_one(tracer: Callable[..., Tracer]) -> None:
    node = tracer(level=("TIMESTAMPS",), rate=1, count=3)
    assert traced(node, "mlp", 2) == [1, 2]
    state = node.state.changed(node.initial, "", {"trace_rate": ["2"]})
    node.adopt(state)
    assert node.settings()["trace_count"] == "1"  # what was left: the change gave no count
    assert traced(node, "mlp", 6) == [2]
    node.adopt(state.changed(node.initial, "", {"trace_count": ["3"]}))  # the count it had before, given again
    assert traced(node, "mlp", 8) == [2, 4, 6]


def test_a_state_adopted_gives_and_takes_models_their_own_settings(tracer: Callable[..., Tracer]) -> None:
    node = tracer(level=("TIMESTAMPS",), rate=1)
    other = tracer(level=("TIMESTAMPS",), rate=1)  # another node, under the same --trace-config
    state = node.state.changed(node.initial, "mlp", {"trace_rate": ["3"], "trace_level": ["TIMESTAMPS", "TENSORS"]})
    other.adopt(state)
    assert other.settings("mlp")["trace_rate"] == "3" and other.settings("cnn")["trace_rate"] == "1"
    assert other.settings("mlp")["trace_level"] == ["TIMESTAMPS", "TENSORS"]
    assert traced(other, "mlp", 6) == [3, 6]
    other.adopt(state.changed(node.initial, "mlp", {}))  # dropped: it follows the server's again
    assert other.settings("mlp") == other.settings() and traced(other, "mlp", 2) == [1, 2]


def test_a_state_the_sink_cannot_record_is_refused_and_changes_nothing() -> None:
    node = Tracer(TraceSettings(rate=5), None)
    refused = node.state.changed(node.initial, "mlp", {"trace_level": ["TIMESTAMPS"]})
    with pytest.raises(InvalidInputError, match="tracing needs a trace file"):
        node.adopt(refused)
    assert node.state == TraceState(TraceSettings(rate=5)) and node.settings("mlp")["trace_level"] == ["OFF"]


def test_a_cluster_node_counts_its_share_of_each_count(tracer: Callable[..., Tracer]) -> None:
    node = tracer(level=("TIMESTAMPS",), rate=1)
    state = node.state.changed(node.initial, "", {"trace_count": ["10"]})
    state = state.changed(node.initial, "mlp", {"trace_rate": ["2"]})  # a scope of its own, counting the server's 10
    node.adopt(state, {"": 3})
    assert (node.settings()["trace_count"], node.settings("mlp")["trace_count"]) == ("3", "0")  # none given: 0
    assert traced(node, "cnn", 5) == [1, 2, 3] and traced(node, "mlp", 4) == []
    assert node.wanting() == {"": state.recounted(""), "mlp": state.recounted("mlp")} and node.wanting() == {}
    node.adopt(state.changed(node.initial, "", {"trace_rate": ["2"]}), {"": 9})  # no count given: the share stays
    assert node.settings()["trace_count"] == "0"
