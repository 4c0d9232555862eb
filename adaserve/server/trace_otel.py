"""Triton's OpenTelemetry trace mode: each traced request exported as spans over OTLP/HTTP.

`--trace-config mode=opentelemetry --trace-config opentelemetry,url=http://collector:4318/v1/traces` (Triton's
settings: `url`, `resource=KEY=VALUE` (repeatable), and the batch span processor's `bsp_max_queue_size`,
`bsp_schedule_delay` (ms), `bsp_max_export_batch_size`). Sampling and the trace API are those of Triton's mode; only
where a finished trace goes differs. As in Triton, a request makes three spans: the top-level `InferRequest` (from
its arrival to its send, the frontend's timestamps as events), a span named after the model (REQUEST_START to
REQUEST_END, with QUEUE_START), and `compute` (COMPUTE_START to COMPUTE_END, in the worker); each carries
`model_name`, `model_version`, `request_id` and `parent_id`. A DAG query's models make a model span and a compute
span each, under the query's model span. Timestamps are moved from CLOCK_MONOTONIC to the wall clock, which
OpenTelemetry uses, by one offset taken at start. Spans leave on the SDK's batch span processor thread, off the
event loop; the TENSORS level is not recorded in this mode (as in Triton).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Span, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from adaserve.server.trace import Trace, TraceSettings, _Scope

log = logging.getLogger("adaserve.trace")
PROPAGATOR = TraceContextTextMapPropagator()

DEFAULT_URL = "http://localhost:4318/v1/traces"
#: Triton's batch span processor settings and its defaults (the OpenTelemetry SDK's too).
BSP_DEFAULTS = {"bsp_max_queue_size": 2048, "bsp_schedule_delay": 5000, "bsp_max_export_batch_size": 512}
#: How often an unreachable collector is logged.
WARN_EVERY_S = 60.0
#: DAG queries whose models' traces are kept until the query's own is done.
MAX_WAITING_QUERIES = 10_000
FRONTEND_STAMPS = ("RECV_START", "RECV_END", "WAITREAD_START", "WAITREAD_END", "SEND_START", "SEND_END")


class QuietExporter(SpanExporter):
    """The OTLP exporter, with a collector that cannot be reached logged as one warning a minute naming it, rather
    than a traceback for every batch (the SDK's): the spans of those batches are dropped, and serving goes on."""

    def __init__(self, exporter: SpanExporter, url: str) -> None:
        self.exporter = exporter
        self.url = url
        self._warned_at = -math.inf

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            return self.exporter.export(spans)
        except OSError as exc:  # requests' ConnectionError and timeouts are OSErrors
            if time.monotonic() - self._warned_at >= WARN_EVERY_S:
                self._warned_at = time.monotonic()
                log.warning("cannot export traces", extra={"url": self.url, "error": str(exc)[:300]})
            return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self.exporter.shutdown()


class OpenTelemetryExport:
    mode: str = "opentelemetry"
    levels: tuple[str, ...] = ("TIMESTAMPS",)

    def __init__(self, url: str, resource: Mapping[str, str], bsp: Mapping[str, int]) -> None:
        self.url = url
        self.resource = {"service.name": "adaserve", **resource}
        self.bsp = {**BSP_DEFAULTS, **bsp}
        self.provider = TracerProvider(resource=Resource.create(self.resource))
        self.provider.add_span_processor(
            BatchSpanProcessor(
                QuietExporter(OTLPSpanExporter(endpoint=url), url),
                max_queue_size=self.bsp["bsp_max_queue_size"],
                schedule_delay_millis=self.bsp["bsp_schedule_delay"],
                max_export_batch_size=self.bsp["bsp_max_export_batch_size"],
            )
        )
        self.tracer = self.provider.get_tracer("adaserve")
        self.offset_ns = time.time_ns() - time.perf_counter_ns()  # CLOCK_MONOTONIC → wall clock
        self._children: dict[int, list[Trace]] = {}  # a DAG query's models' traces, until the query's is done

    def take(self, trace: Trace, scope: _Scope) -> None:
        if trace.parent_id:
            if len(self._children) >= MAX_WAITING_QUERIES:  # queries whose own trace never came (a lost client)
                self._children.pop(next(iter(self._children)))
            self._children.setdefault(trace.parent_id, []).append(trace)
            return
        stamps = dict(trace.timestamps)
        if not stamps:
            return
        frontend = {name: ns for name, ns in stamps.items() if name.split("_", 1)[-1] in FRONTEND_STAMPS}
        top = self.tracer.start_span(
            "InferRequest",
            context=PROPAGATOR.extract(trace.context) if trace.context else None,  # under the client's span
            start_time=self._wall(min(stamps.values())),
            attributes=self._attributes(trace),
        )
        for name, ns in sorted(frontend.items(), key=lambda item: item[1]):
            top.add_event(name, timestamp=self._wall(ns))
        model = self._model_spans(trace, stamps, set_span_in_context(top))
        for child in self._children.pop(trace.id, []):
            self._model_spans(child, dict(child.timestamps), set_span_in_context(model))
        top.end(end_time=self._wall(max(stamps.values())))

    def _model_spans(self, trace: Trace, stamps: dict[str, int], context: Context) -> Span:
        """The model span (and its compute span) of a trace, under `context`; ended, and returned."""
        start, end = stamps.get("REQUEST_START"), stamps.get("REQUEST_END")
        model = self.tracer.start_span(
            trace.model_name,
            context=context,
            start_time=self._wall(start) if start else None,
            attributes=self._attributes(trace),
        )
        for name in ("REQUEST_START", "QUEUE_START"):
            if name in stamps:
                model.add_event(name, timestamp=self._wall(stamps[name]))
        if "COMPUTE_START" in stamps and "COMPUTE_END" in stamps:
            compute = self.tracer.start_span(
                "compute",
                context=set_span_in_context(model),
                start_time=self._wall(stamps["COMPUTE_START"]),
                attributes=self._attributes(trace),
            )
            compute.add_event("COMPUTE_START", timestamp=self._wall(stamps["COMPUTE_START"]))
            compute.add_event("COMPUTE_END", timestamp=self._wall(stamps["COMPUTE_END"]))
            compute.end(end_time=self._wall(stamps["COMPUTE_END"]))
        if end:
            model.add_event("REQUEST_END", timestamp=self._wall(end))
        model.end(end_time=self._wall(end) if end else None)
        return model

    def _attributes(self, trace: Trace) -> dict[str, Any]:
        return {
            "model_name": trace.model_name,
            "model_version": int(trace.model_version) if trace.model_version.isdigit() else -1,
            "request_id": trace.request_id,
            "parent_id": trace.parent_id,
        }

    def _wall(self, ns: int) -> int:
        return ns + self.offset_ns

    def describe(self, settings: TraceSettings) -> dict[str, str]:
        resource = ",".join(f"{key}={value}" for key, value in self.resource.items())
        return {
            "trace_mode": self.mode,
            "url": self.url,
            "resource": resource,
            **{key: str(value) for key, value in self.bsp.items()},
        }

    def close(self, scopes: Iterable[_Scope]) -> None:
        """Export what the batch span processor still holds."""
        self.provider.shutdown()
