"""Triton's OpenTelemetry trace mode: each traced request exported as spans over OTLP/HTTP.

`--trace-config mode=opentelemetry --trace-config opentelemetry,url=http://collector:4318/v1/traces` (Triton's
settings: `url`, `resource=KEY=VALUE` (repeatable), and the batch span processor's `bsp_max_queue_size`,
`bsp_schedule_delay` (ms), `bsp_max_export_batch_size`). Sampling and the trace API are those of Triton's mode; only
where a finished trace goes differs. As in Triton, a request makes three spans: the top-level `InferRequest` (from
its arrival to its send, the frontend's timestamps as events), a span named after the model (REQUEST_START to
REQUEST_END, with QUEUE_START), and `compute` (COMPUTE_START to COMPUTE_END, in the worker); each carries
`model_name`, `model_version`, `request_id` and `parent_id`. A DAG query's models make a model span and a compute
span each, under the query's model span. Timestamps are moved from CLOCK_MONOTONIC to the wall clock, which
OpenTelemetry uses, by one offset taken at start. The TENSORS level is not recorded in this mode (as in Triton).

On a cluster, each time a request (or a DAG stage) was sent to another node is a `FORWARD` span (attribute
`holder`) under its `InferRequest` (or the stage's model span), with the span id the holder was sent (`Forward`):
the holder's spans of it are its children, in the same trace.

The spans are built and exported in a process of their own, the exporter: the SDK does that work in Python (three
span objects a request, then protobuf encoding on its batch span processor thread), and in the server's
interpreter it held the lock the event loop needs: with every request traced, 0.37–0.67× the served rate and a p99 of
4–25 ms, against 0.53–0.74× and 2–9 ms now (`benchmarks/trace_overhead.py`, 2 cores). The server hands each
finished trace's stamps to a bounded queue; when the exporter falls behind, traces are dropped and counted, never
waited for. The exporter runs at nice 10: on a machine short of cores, serving comes first.
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing
import os
import queue
import signal
import time
from collections.abc import Iterable, Mapping, Sequence
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any, NamedTuple

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, TraceFlags, get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from adaserve.errors import ConfigError
from adaserve.logs import configure_logging
from adaserve.repository import is_version
from adaserve.server.trace import Trace, TraceSettings, _Scope

log = logging.getLogger("adaserve.trace")
PROPAGATOR = TraceContextTextMapPropagator()
SAMPLED = TraceFlags(TraceFlags.SAMPLED)

DEFAULT_URL = "http://localhost:4318/v1/traces"
#: Triton's batch span processor settings and its defaults (the OpenTelemetry SDK's too).
BSP_DEFAULTS = {"bsp_max_queue_size": 2048, "bsp_schedule_delay": 5000, "bsp_max_export_batch_size": 512}
#: How often an unreachable collector is logged.
WARN_EVERY_S = 60.0
#: DAG queries whose models' traces are kept until the query's own is done.
MAX_WAITING_QUERIES = 10_000
FRONTEND_STAMPS = ("RECV_START", "RECV_END", "WAITREAD_START", "WAITREAD_END", "SEND_START", "SEND_END")
#: The exporter's nice value: background work, which yields the cores to serving when they are short.
EXPORTER_NICENESS = 10
#: The spans a request makes (a DAG query's, more).
SPANS_PER_RECORD = 3
#: How long the exporter has at stop to send what it holds, and how often it looks whether the server is gone.
CLOSE_TIMEOUT_S = 15.0
PARENT_CHECK_S = 1.0


class SpanRecord(NamedTuple):
    """What the exporter needs of a finished trace: the request, its stamps, the client's trace context."""

    id: int
    model_name: str
    model_version: str
    request_id: str
    parent_id: int
    context: dict[str, str]
    timestamps: list[tuple[str, int]]
    trace_id: str  # its W3C trace, where it has one of its own (it was forwarded) or took its context's
    forwards: list[tuple[str, str, int, int]]  # (holder, span id, start, end) of each time it was forwarded

    @classmethod
    def of(cls, trace: Trace) -> SpanRecord:
        return cls(
            trace.id,
            trace.model_name,
            trace.model_version,
            trace.request_id,
            trace.parent_id,
            trace.context,
            trace.timestamps,
            trace.trace_id,
            [(f.holder, f.span_id, f.start_ns, f.end_ns or f.start_ns) for f in trace.forwards],
        )


class Every:
    """Says when something said once per `period_s` is due again (a warning a minute, not one per event)."""

    def __init__(self, period_s: float) -> None:
        self.period_s = period_s
        self._last = -math.inf

    def due(self) -> bool:
        now = time.monotonic()
        if now - self._last < self.period_s:
            return False
        self._last = now
        return True


class QuietExporter(SpanExporter):
    """The OTLP exporter, with a collector that cannot be reached logged as one warning a minute naming it, rather
    than a traceback for every batch (the SDK's): the spans of those batches are dropped, and serving goes on."""

    def __init__(self, exporter: SpanExporter, url: str) -> None:
        self.exporter = exporter
        self.url = url
        self._warning = Every(WARN_EVERY_S)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            return self.exporter.export(spans)
        except OSError as exc:  # requests' ConnectionError and timeouts are OSErrors
            if self._warning.due():
                log.warning("cannot export traces", extra={"url": self.url, "error": str(exc)[:300]})
            return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self.exporter.shutdown()


def monotonic_to_wall_ns(reads: int = 8) -> int:
    """What to add to CLOCK_MONOTONIC (`perf_counter_ns`) for the wall clock, from the tightest of `reads`
    brackets of a wall-clock read: the process preempted between two reads of the clocks put every span off by that
    long (spans began 8-10 ms before their requests were sent, beside a spinner on each core)."""
    gap, offset = math.inf, 0
    for _ in range(reads):
        before = time.perf_counter_ns()
        wall = time.time_ns()
        after = time.perf_counter_ns()
        if after - before < gap:
            gap, offset = after - before, wall - (before + after) // 2
    return offset


class OpenTelemetryExport:
    """The sink in the server: each finished trace's record goes to the exporter process (started here, restarted
    if it dies) through a queue of as many records as the exporter's span queue (`bsp_max_queue_size`) holds."""

    mode: str = "opentelemetry"
    levels: tuple[str, ...] = ("TIMESTAMPS",)

    def __init__(self, url: str, resource: Mapping[str, str], bsp: Mapping[str, int]) -> None:
        self.url = url
        self.resource = {"service.name": "adaserve", **resource}
        self.bsp = {**BSP_DEFAULTS, **bsp}
        if self.bsp["bsp_max_export_batch_size"] > self.bsp["bsp_max_queue_size"]:
            raise ConfigError(
                f"--trace-config opentelemetry,bsp_max_export_batch_size={self.bsp['bsp_max_export_batch_size']} "
                f"is above bsp_max_queue_size={self.bsp['bsp_max_queue_size']}: a batch is taken from the queue"
            )
        self.offset_ns = monotonic_to_wall_ns()
        self.dropped = 0
        self._warning = Every(WARN_EVERY_S)
        self._process, self._records = self._start()

    def _start(self) -> tuple[BaseProcess, Queue[SpanRecord | None]]:
        context = multiprocessing.get_context("spawn")  # not fork: the server runs gRPC's threads
        records: Queue[SpanRecord | None] = context.Queue(max(1, self.bsp["bsp_max_queue_size"] // SPANS_PER_RECORD))
        level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
        arguments = (records, self.url, self.resource, self.bsp, self.offset_ns, os.getpid(), level)
        process = context.Process(target=export, args=arguments, name="adaserve-trace-export", daemon=True)
        process.start()
        return process, records

    def take(self, trace: Trace, scope: _Scope) -> None:
        try:
            self._records.put_nowait(SpanRecord.of(trace))
        except queue.Full:
            self._drop()

    def _drop(self) -> None:
        """The exporter is behind (or gone): the trace is dropped, counted, and said once a minute."""
        self.dropped += 1
        if _exited(self._process):
            log.error("the trace exporter process exited; starting another", extra={"exitcode": self._process.exitcode})
            self.dropped += self._records.qsize()  # what it had not read is lost with it
            self._records.cancel_join_thread()
            self._records.close()  # its feeder thread and pipe go too
            self._process, self._records = self._start()
        elif self._warning.due():
            log.warning("traces dropped: the exporter is behind", extra={"url": self.url, "dropped": self.dropped})

    def describe(self, settings: TraceSettings) -> dict[str, str]:
        resource = ",".join(f"{key}={value}" for key, value in self.resource.items())
        return {
            "trace_mode": self.mode,
            "url": self.url,
            "resource": resource,
            **{key: str(value) for key, value in self.bsp.items()},
        }

    def close(self, scopes: Iterable[_Scope]) -> None:
        """The exporter sends what it still holds and exits, within `CLOSE_TIMEOUT_S`."""
        with contextlib.suppress(queue.Full):
            self._records.put(None, timeout=CLOSE_TIMEOUT_S)
        self._process.join(CLOSE_TIMEOUT_S)
        if self._process.exitcode is None:
            log.warning("the trace exporter did not finish in time; its traces are lost", extra={"url": self.url})
            self._process.kill()
            self._process.join()
        self._records.cancel_join_thread()  # what is left in the pipe has no reader now
        self._records.close()


def _exited(process: BaseProcess) -> bool:
    """Whether the exporter process has ended: its exit code, or else the kernel's word. A killed exporter was seen a
    zombie in /proc while `exitcode` (multiprocessing's waitpid) still said it ran, and the server went on dropping
    every trace instead of starting another (a test failed 1-2 runs in 5)."""
    if process.exitcode is not None:
        return True
    try:
        state = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True  # no such process any more
    return state in ("Z", "X")


def export(
    records: Queue[SpanRecord | None],
    url: str,
    resource: Mapping[str, str],
    bsp: Mapping[str, int],
    offset_ns: int,
    server_pid: int,
    level: str,
) -> None:
    """The exporter process: spans made from the server's records until it says stop (None) or is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the server says when to stop
    os.nice(EXPORTER_NICENESS)
    configure_logging(level.lower())
    spans = SpanBuilder(url, resource, bsp, offset_ns)
    while True:
        try:
            record = records.get(timeout=PARENT_CHECK_S)
        except queue.Empty:
            if os.getppid() != server_pid:  # the server died without a word
                break
            continue
        if record is None:
            break
        spans.take(record)
    spans.close()


class SpanBuilder:
    """Triton's spans for each record, handed to the SDK's batch span processor and OTLP/HTTP exporter.

    The spans are made whole, as the SDK's `ReadableSpan`s, since every timestamp is known when a record comes; the
    SDK's tracer, which opens a span and adds to it as a request goes, made each request's spans three times as
    slowly (147 against 46 µs on this VM)."""

    def __init__(self, url: str, resource: Mapping[str, str], bsp: Mapping[str, int], offset_ns: int) -> None:
        self.resource = Resource.create(dict(resource))
        self.processor = BatchSpanProcessor(
            QuietExporter(OTLPSpanExporter(endpoint=url), url),
            max_queue_size=bsp["bsp_max_queue_size"],
            schedule_delay_millis=bsp["bsp_schedule_delay"],
            max_export_batch_size=bsp["bsp_max_export_batch_size"],
        )
        self.scope = InstrumentationScope("adaserve")
        self.ids = RandomIdGenerator()
        self.offset_ns = offset_ns
        self._children: dict[int, list[SpanRecord]] = {}  # a DAG query's models' records, until the query's comes

    def take(self, trace: SpanRecord) -> None:
        if trace.parent_id:
            if len(self._children) >= MAX_WAITING_QUERIES:  # queries whose own trace never came (a lost client)
                self._children.pop(next(iter(self._children)))
            self._children.setdefault(trace.parent_id, []).append(trace)
            return
        stamps = {name: self._wall(ns) for name, ns in trace.timestamps}
        if not stamps:
            return
        client = get_current_span(PROPAGATOR.extract(trace.context)).get_span_context() if trace.context else None
        if client is not None and client.is_valid and not client.trace_flags.sampled:
            return  # the client's sampling decision holds (the SDK's default sampler: parent-based)
        parent = client if client is not None and client.is_valid else None
        trace_id = int(trace.trace_id, 16) if trace.trace_id else None
        top = self._context(trace_id or (parent.trace_id if parent else self.ids.generate_trace_id()))
        frontend = [(name, ns) for name, ns in stamps.items() if name.split("_", 1)[-1] in FRONTEND_STAMPS]
        events = [Event(name, timestamp=ns) for name, ns in sorted(frontend, key=lambda stamp: stamp[1])]
        start, end = min(stamps.values()), max(stamps.values())
        self._span("InferRequest", top, parent, trace, events, start, end)
        model = self._model_spans(trace, stamps, top)
        for child in self._children.pop(trace.id, []):
            self._model_spans(child, {name: self._wall(ns) for name, ns in child.timestamps}, model)

    def _model_spans(self, trace: SpanRecord, stamps: dict[str, int], parent: SpanContext) -> SpanContext:
        """The model span (and its compute span, or its forwards' spans) of a trace, under `parent`; returns the
        model span's context (`parent` itself for a request this node only forwarded: the forwards go under it)."""
        if "REQUEST_START" not in stamps:
            self._forward_spans(trace, parent)
            return parent
        model = self._context(parent.trace_id)
        self._forward_spans(trace, model)
        if "COMPUTE_START" in stamps and "COMPUTE_END" in stamps:
            start, end = stamps["COMPUTE_START"], stamps["COMPUTE_END"]
            events = [Event("COMPUTE_START", timestamp=start), Event("COMPUTE_END", timestamp=end)]
            self._span("compute", self._context(parent.trace_id), model, trace, events, start, end)
        named = ("REQUEST_START", "QUEUE_START", "REQUEST_END")
        events = [Event(name, timestamp=stamps[name]) for name in named if name in stamps]
        start = stamps.get("REQUEST_START", min(stamps.values(), default=0))
        end = stamps.get("REQUEST_END", max(stamps.values(), default=0))
        self._span(trace.model_name, model, parent, trace, events, start, end)
        return model

    def _forward_spans(self, trace: SpanRecord, parent: SpanContext) -> None:
        """A FORWARD span, under `parent`, for each time the request was sent to another node: its span id the one
        the holder was sent, so the holder's spans of it are its children."""
        for holder, span_id, start, end in trace.forwards:
            context = SpanContext(parent.trace_id, int(span_id, 16), is_remote=False, trace_flags=SAMPLED)
            events = [
                Event("FORWARD_START", timestamp=self._wall(start)),
                Event("FORWARD_END", timestamp=self._wall(end)),
            ]
            attributes = {**self._attributes(trace), "holder": holder}
            self._span("FORWARD", context, parent, trace, events, self._wall(start), self._wall(end), attributes)

    def _context(self, trace_id: int) -> SpanContext:
        return SpanContext(trace_id, self.ids.generate_span_id(), is_remote=False, trace_flags=SAMPLED)

    def _span(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        trace: SpanRecord,
        events: list[Event],
        start: int,
        end: int,
        attributes: dict[str, Any] | None = None,
    ) -> None:
        span = ReadableSpan(
            name,
            context,
            parent,
            self.resource,
            attributes or self._attributes(trace),
            events,
            start_time=start,
            end_time=end,
            instrumentation_scope=self.scope,
        )
        self.processor.on_end(span)

    def _attributes(self, trace: SpanRecord) -> dict[str, Any]:
        return {
            "model_name": trace.model_name,
            "model_version": int(trace.model_version) if is_version(trace.model_version) else -1,
            "request_id": trace.request_id,
            "parent_id": trace.parent_id,
        }

    def _wall(self, ns: int) -> int:
        return ns + self.offset_ns

    def close(self) -> None:
        """Export what the batch span processor still holds."""
        self.processor.shutdown()
