"""The OpenTelemetry exporter's spans of a request forwarded across nodes (`trace_otel.SpanBuilder`), without a
collector: the entry node's FORWARD span is the parent of the holder's spans, in one trace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from adaserve.server.trace import FORWARDED, TraceFile, Tracer, TraceSettings
from adaserve.server.trace_otel import SpanBuilder, SpanRecord


class Spans:
    """Stands in for the batch span processor: keeps the spans it is handed."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)

    def named(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.spans if span.name == name]


def _builder() -> tuple[SpanBuilder, Spans]:
    builder = SpanBuilder("http://127.0.0.1:9/v1/traces", {"service.name": "test"}, _bsp(), 0)
    builder.processor.shutdown()  # nothing is exported: the spans are kept here
    spans = Spans()
    builder.processor = spans  # type: ignore[assignment]
    return builder, spans


def _bsp() -> dict[str, int]:
    return {"bsp_max_queue_size": 8, "bsp_schedule_delay": 5000, "bsp_max_export_batch_size": 8}


def _tracer() -> Tracer:
    return Tracer(TraceSettings(level=("TIMESTAMPS",), rate=1), TraceFile(Path("/dev/null")))


def _context(span: ReadableSpan) -> tuple[int, int]:
    assert span.context is not None
    return span.context.trace_id, span.context.span_id


def test_a_forwarded_requests_spans_on_its_holder_are_children_of_the_forward() -> None:
    entry, holder = _tracer(), _tracer()
    sent = entry.begin("mlp", "")
    assert sent is not None
    sent.stamp("HTTP_RECV_START", 10)
    forward, context = sent.forward("b")
    forward.end()
    sent.stamp("HTTP_SEND_START", forward.end_ns + 1)
    received = holder.begin("mlp", "r", lambda: {FORWARDED: "1", **context})
    assert received is not None
    for name, ns in (("HTTP_RECV_START", 20), ("REQUEST_START", 21), ("REQUEST_END", 22), ("HTTP_SEND_END", 23)):
        received.stamp(name, ns)
    builder, spans = _builder()
    builder.take(SpanRecord.of(sent))
    builder.take(SpanRecord.of(received))
    (top, top_holder), (forwarded,) = spans.named("InferRequest"), spans.named("FORWARD")
    assert [span.name for span in spans.spans if span.parent == top.context] == ["FORWARD"]  # no model span here
    assert forwarded.parent == top.context and forwarded.attributes is not None
    assert forwarded.attributes["holder"] == "b"
    assert top_holder.parent is not None and top_holder.parent.span_id == _context(forwarded)[1]
    assert _context(top)[0] == _context(forwarded)[0] == _context(top_holder)[0] == int(sent.trace_id, 16)
    entry.close()
    holder.close()


def test_a_stage_forwarded_is_a_forward_span_under_its_model_span_in_its_querys_trace() -> None:
    tracer = _tracer()
    query = tracer.begin("pipe", "q")
    assert query is not None
    stage = tracer.child(query, "mlp")
    stage.stamp("REQUEST_START", 30)
    stage.forward("b")[0].end()
    stage.stamp("REQUEST_END", 40)
    for name, ns in (("HTTP_RECV_START", 10), ("REQUEST_START", 20), ("REQUEST_END", 50), ("HTTP_SEND_END", 60)):
        query.stamp(name, ns)
    builder, spans = _builder()
    builder.take(SpanRecord.of(stage))  # kept until its query's record comes
    builder.take(SpanRecord.of(query))
    named: dict[str, Any] = {span.name: span for span in spans.spans}
    assert named["FORWARD"].parent == named["mlp"].context and named["mlp"].parent == named["pipe"].context
    assert _context(named["FORWARD"])[0] == _context(named["InferRequest"])[0] == int(query.trace_id, 16)
    tracer.close()
