"""`adaserve trace summary`'s reading of trace files: entries merged by id across files, spans per frontend, a DAG
query's children apart, and a file that is not a trace file refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adaserve.errors import InvalidInputError
from adaserve.server.trace_summary import format_summary, read_traces, summarize


def stamps(trace_id: int, **names: int) -> dict[str, object]:
    return {"id": trace_id, "timestamps": [{"name": name, "ns": ns} for name, ns in names.items()]}


HANDLER = {"REQUEST_START": 10_000, "QUEUE_START": 12_000, "COMPUTE_START": 20_000, "COMPUTE_END": 50_000}


def test_spans_are_cut_per_frontend_and_children_apart(tmp_path: Path) -> None:
    http = stamps(1, HTTP_RECV_START=0, HTTP_RECV_END=4_000, **HANDLER, REQUEST_END=51_000)
    http_sent = stamps(1, HTTP_SEND_START=53_000, HTTP_SEND_END=60_000)  # stamps of one trace in two entries
    grpc = stamps(2, GRPC_WAITREAD_START=7_000, GRPC_WAITREAD_END=7_000, **HANDLER, REQUEST_END=52_000)
    grpc_sent = stamps(2, GRPC_SEND_START=55_000, GRPC_SEND_END=55_000)
    child = stamps(3, **HANDLER, REQUEST_END=50_500)
    (tmp_path / "trace.json").write_text(
        json.dumps(
            [
                {"id": 1, "model_name": "mlp", "model_version": 1, "request_id": "a"},
                http,
                {"id": 2, "model_name": "mlp", "model_version": 1},
                grpc,
                {"id": 3, "model_name": "double", "model_version": 1, "parent_id": 9},
                child,
            ]
        )
    )
    (tmp_path / "trace.json.0").write_text(json.dumps([http_sent, grpc_sent]))
    traces = read_traces([tmp_path / "trace.json", tmp_path / "trace.json.0"])
    assert [t.frontend for t in traces] == ["HTTP", "GRPC", "child"]
    summary = summarize(traces)
    assert list(summary) == ["double (1) child", "mlp (1) GRPC", "mlp (1) HTTP"]
    http_spans = {span: value["p50_us"] for span, value in summary["mlp (1) HTTP"]["spans"].items()}
    assert http_spans == {
        "receive": 4,
        "decode": 6,
        "admission": 2,
        "queue": 8,
        "compute": 30,
        "answer": 1,
        "encode": 2,
        "send": 7,
    }
    assert summary["mlp (1) GRPC"]["spans"]["receive"]["p50_us"] == 0
    assert summary["mlp (1) GRPC"]["spans"]["decode"]["p50_us"] == 3
    assert summary["double (1) child"]["spans"]["decode"] is None  # no frontend
    assert summary["double (1) child"]["spans"]["answer"]["p50_us"] == 0.5
    table = format_summary(summary)
    assert "| mlp (1) HTTP | 1 | 4 (4) | 6 (6) |" in table and "| double (1) child | 1 | – | – | 2 (2) |" in table


@pytest.mark.parametrize("content", ["not json", '{"id": 1}', '[{"name": "x"}]', '[{"id": 1, "timestamps": [{}]}]'])
def test_a_file_that_is_not_a_trace_file_is_refused_by_name(tmp_path: Path, content: str) -> None:
    path = tmp_path / "x.json"
    path.write_text(content)
    with pytest.raises(InvalidInputError, match=f"{path}: not a trace file"):
        read_traces([path])
