"""Triton's trace extension: sampled requests' timestamps (and tensors), written as Triton's JSON trace file.

Settings are Triton's (`trace_level`, `trace_rate`, `trace_count`, `log_frequency`, `trace_file`): the server's,
set by `--trace-config` at start and changed at run time through the trace API, and per model, where each setting
a model has not been given follows the server's. A request is traced when its model's settings sample it (every
`trace_rate`-th request, while `trace_count` lasts); its frontend, the data plane and the engine stamp it, and
when it has been sent it goes to the trace file: with `log_frequency` 0 into `trace_file` itself, one JSON array
closed when the server stops, else `log_frequency` traces at a time into `trace_file.0`, `trace_file.1`, ...
The file is fixed at start (as in Triton since 24.01: a client may not choose where the server writes).

Timestamps are CLOCK_MONOTONIC nanoseconds, the clock every process of the server shares, so a worker's compute
start and end line up with the frontend's.

On a cluster a traced request (or DAG stage) sent to the node that holds its model is one W3C trace across the
nodes: each send is a `Forward` of its trace on the node it left, with a span id of its own, sent as the request's
`traceparent`; the holder traces a forwarded request exactly when it carries one (the node it entered sampled it),
as a child of that forward. In the trace file, a trace that is part of such a trace names its `trace_id` (and the
span it is a child of, `parent_span_id`), and each forward is an entry of its own (`activity` FORWARD).
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Protocol

import numpy as np

from adaserve.engine.engine import RequestTimes
from adaserve.errors import ConfigError, InvalidInputError
from adaserve.repository import is_version
from adaserve.server.trace_state import LEVELS, SERVER, TraceSettings, TraceState, parse_changes

log = logging.getLogger("adaserve.trace")

#: W3C trace-context headers a client's OpenTelemetry context comes in.
TRACE_CONTEXT = ("traceparent", "tracestate")
#: The header (REST) and metadata key (gRPC) of a request one node server forwarded to another, with its hop count.
FORWARDED = "adaserve-forwarded"
#: A W3C `traceparent`: version, trace id, parent span id, flags (a later version may add fields after them).
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(?:$|-)")


@dataclass
class Forward:
    """A traced request (or DAG stage) sent to node `holder` to be served: the span whose id its `traceparent`
    carries there, so the holder's trace of it is its child."""

    holder: str
    span_id: str  # 16 hex digits
    start_ns: int
    end_ns: int = 0

    def end(self) -> None:
        self.end_ns = time.perf_counter_ns()

    def entry(self, trace_id: int) -> dict[str, Any]:
        """Its entry in the trace file, beside its trace's: the holder, its span, when it left and was answered."""
        stamps = [{"name": "FORWARD_START", "ns": self.start_ns}]
        stamps += [{"name": "FORWARD_END", "ns": self.end_ns}] if self.end_ns else []
        return {
            "id": trace_id,
            "activity": "FORWARD",
            "holder": self.holder,
            "span_id": self.span_id,
            "timestamps": stamps,
        }


@dataclass
class Trace:
    """One sampled request: what it was, and its timestamps and tensors as its path stamped them."""

    id: int
    model_name: str
    request_id: str
    level: tuple[str, ...]
    scope: _Scope
    model_version: str = ""
    parent_id: int = 0  # a DAG query's trace, for the traces of the models it ran
    context: dict[str, str] = field(default_factory=dict)  # the W3C trace context it came with: a client's, a node's
    trace_id: str = ""  # its W3C trace: its context's, its query's, or chosen when it is first forwarded
    timestamps: list[tuple[str, int]] = field(default_factory=list)
    tensors: list[dict[str, Any]] = field(default_factory=list)
    forwards: list[Forward] = field(default_factory=list)
    query: Trace | None = field(default=None, repr=False)  # a DAG query's, for the traces of the models it ran

    def stamp(self, name: str, ns: int) -> None:
        if "TIMESTAMPS" in self.level and ns:
            self.timestamps.append((name, ns))

    def stamp_times(self, times: RequestTimes) -> None:
        self.stamp("QUEUE_START", times.queued_ns)
        self.stamp("COMPUTE_START", times.compute_start_ns)
        self.stamp("COMPUTE_END", times.compute_end_ns)

    def tensor(self, activity: str, name: str, datatype: str, array: np.ndarray) -> None:
        """A tensor as Triton's TENSORS level writes it: its values and shape as comma-separated text."""
        if "TENSORS" in self.level:
            items = array.ravel().tolist()
            values = ",".join(v.decode(errors="replace") if isinstance(v, bytes) else str(v) for v in items)
            shape = ",".join(str(d) for d in array.shape)
            self.tensors.append(
                {"activity": activity, "tensor": {"name": name, "data": values, "shape": shape, "dtype": datatype}}
            )

    def forward(self, holder: str) -> tuple[Forward, dict[str, str]]:
        """It is sent to node `holder` now: the forward, and the W3C trace-context headers it goes with (the span
        the holder's trace is a child of; the client's `tracestate` and sampling flag, where it gave them). A DAG
        query's stages share its trace."""
        root = self.query or self
        parent = parse_traceparent(root.context.get("traceparent", ""))
        root.trace_id = self.trace_id = root.trace_id or secrets.token_hex(16)
        forward = Forward(holder, secrets.token_hex(8), time.perf_counter_ns())
        self.forwards.append(forward)
        headers = {"traceparent": f"00-{self.trace_id}-{forward.span_id}-{parent[2] if parent else '01'}"}
        if "tracestate" in root.context:
            headers["tracestate"] = root.context["tracestate"]
        return forward, headers

    def entries(self) -> list[dict[str, Any]]:
        """Its entries in Triton's trace file: the request, its timestamps (in the order stamped), its tensors, its
        forwards."""
        head: dict[str, Any] = {"id": self.id, "model_name": self.model_name}
        if is_version(self.model_version):
            head["model_version"] = int(self.model_version)
        if self.request_id:
            head["request_id"] = self.request_id
        if self.parent_id:
            head["parent_id"] = self.parent_id
        if self.trace_id:
            head["trace_id"] = self.trace_id
        parent = parse_traceparent(self.context.get("traceparent", ""))
        if parent is not None:
            head["parent_span_id"] = parent[1]
        entries = [head]
        if self.timestamps:
            stamps = [{"name": name, "ns": ns} for name, ns in self.timestamps]
            entries.append({"id": self.id, "timestamps": stamps})
        entries += [{"id": self.id, **tensor} for tensor in self.tensors]
        entries += [forward.entry(self.id) for forward in self.forwards]
        return entries


def parse_traceparent(value: str) -> tuple[str, str, str] | None:
    """A W3C `traceparent`'s trace id, parent span id and flags; None for one that is not valid."""
    match = _TRACEPARENT.match(value)
    if match is None or match[1] == "ff" or match[2] == "0" * 32 or match[3] == "0" * 16:
        return None
    return match[2], match[3], match[4]


class _Scope:
    """The settings one model's requests (or the server's default) are sampled under, and what they collected."""

    def __init__(self, settings: TraceSettings) -> None:
        self.settings = settings
        self.seen = 0  # requests since the settings last changed; every `rate`-th is traced
        self.collected: list[Trace] = []  # waiting for `log_frequency` of them
        self.missed = 0  # requests due a trace that the count had none left for (a cluster node asks for more)

    def reset(self, settings: TraceSettings) -> None:
        self.settings, self.seen = settings, 0

    def sample(self) -> bool:
        settings = self.settings
        if not settings.level:
            return False
        self.seen += 1
        if self.seen % settings.rate:
            return False
        if settings.count == 0:
            self.missed += 1
            return False
        if settings.count > 0:
            self.settings = replace(settings, count=settings.count - 1)
        return True


class TraceSink(Protocol):
    """Where finished traces go: Triton's trace file (`TraceFile`) or an OpenTelemetry collector
    (`adaserve.server.trace_otel.OpenTelemetryExport`)."""

    mode: str  # Triton's trace_mode: "triton" or "opentelemetry"
    levels: tuple[str, ...]  # the levels it can record
    dropped: int  # traces taken but lost (a full disk, an exporter behind): /metrics counts them

    def take(self, trace: Trace, scope: _Scope) -> None: ...

    def describe(self, settings: TraceSettings) -> dict[str, str]:
        """Its own entries of the trace setting response."""
        ...

    def close(self, scopes: Iterable[_Scope]) -> None: ...


class TraceFile:
    """Triton's trace file: `path` as one JSON array (opened at start, appended to as traces finish, closed at stop)
    when `log_frequency` is 0, and `path.N` for each part of `log_frequency` traces otherwise."""

    mode: str = "triton"
    levels: tuple[str, ...] = LEVELS

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._stream: IO[str] = path.open("w")
        except OSError as exc:
            raise ConfigError(f"cannot write the trace file {path}: {exc.strerror}") from None
        self._stream.write("[")
        self._empty = True
        self._parts = itertools.count()
        self.dropped = 0

    def append(self, trace: Trace) -> None:
        if not self._empty:
            self._stream.write(",")
        self._stream.write(",".join(json.dumps(entry) for entry in trace.entries()))
        self._empty = False

    def write_part(self, traces: Iterable[Trace]) -> None:
        entries = [entry for trace in traces for entry in trace.entries()]
        Path(f"{self.path}.{next(self._parts)}").write_text(json.dumps(entries))

    def take(self, trace: Trace, scope: _Scope) -> None:
        frequency = scope.settings.log_frequency
        try:
            if frequency == 0:
                self.append(trace)
                return
            scope.collected.append(trace)
            if len(scope.collected) >= frequency:
                self.write_part(scope.collected)
                scope.collected = []
        except OSError as exc:  # the disk is full, say: the request was answered, and the server goes on
            self.dropped += 1 if frequency == 0 else len(scope.collected)
            scope.collected = []
            log.error("cannot write traces", extra={"file": str(self.path), "error": exc.strerror})

    def describe(self, settings: TraceSettings) -> dict[str, str]:
        return {"log_frequency": str(settings.log_frequency), "trace_file": str(self.path), "trace_mode": self.mode}

    @staticmethod
    def describe_none(settings: TraceSettings) -> dict[str, str]:
        """What a server with no trace file says: Triton's mode, no file."""
        return {"log_frequency": str(settings.log_frequency), "trace_file": "", "trace_mode": "triton"}

    def close(self, scopes: Iterable[_Scope]) -> None:
        """Every trace kept for a part is written, and the array is closed."""
        for scope in scopes:
            if scope.collected:
                self.write_part(scope.collected)
                scope.collected = []
        if not self._stream.closed:
            self._stream.write("]")
            self._stream.close()


class Tracer:
    """The server's trace settings, the models' own, and where traces go; decides which requests are traced."""

    def __init__(self, settings: TraceSettings, sink: TraceSink | None) -> None:
        if settings.level and sink is None:
            raise ConfigError(f"tracing at level {list(settings.level)} needs a trace file: {FILE_HINT}")
        self.initial = settings  # what the server's settings return to when the API clears one
        self.sink = sink
        try:
            self._check_sink(settings)
        except InvalidInputError as exc:
            raise ConfigError(f"--trace-config: {exc}") from None
        self.state = TraceState(settings)  # the settings in force (`adopt`)
        self._server = _Scope(settings)
        self._models: dict[str, _Scope] = {}  # the models given settings of their own
        self._ids = itertools.count(1)
        self.finished = 0  # traces handed to the sink

    # -- sampling --------------------------------------------------------------------------------------------
    def begin(
        self, model_name: str, request_id: str, headers: Callable[[], Mapping[str, str]] | None = None
    ) -> Trace | None:
        """A trace for this request if its model's settings sample it, else None. While its model's tracing is on, a
        request another node forwarded (its `headers()` name FORWARDED) is traced exactly when it carries a W3C
        `traceparent`, under it: the node it entered sampled it. In OpenTelemetry mode, a client's request whose
        headers carry a `traceparent` is traced whatever the rate and count say, under the client's trace (as
        Triton does)."""
        scope = self._scope(model_name)
        given = headers() if headers is not None and scope.settings.level else {}
        if FORWARDED in given:
            context = _context(given)
            level = scope.settings.level
        else:
            context = _context(given) if self.sink is not None and self.sink.mode == "opentelemetry" else {}
            level = ("TIMESTAMPS",)
        if context:
            trace_id = parent[0] if (parent := parse_traceparent(context["traceparent"])) else ""
            return Trace(next(self._ids), model_name, request_id, level, scope, context=context, trace_id=trace_id)
        if FORWARDED in given or not scope.sample():
            return None
        return Trace(next(self._ids), model_name, request_id, scope.settings.level, scope)

    def off(self, model_name: str) -> bool:
        """No request for `model_name` is traced now (its level is OFF): `begin` would answer None."""
        return not self._scope(model_name).settings.level

    def _scope(self, model_name: str) -> _Scope:
        """Where `model_name`'s settings and counts are: its own, or the server's."""
        return self._models.get(model_name, self._server)

    def child(self, parent: Trace, model_name: str) -> Trace:
        """The trace of a model a traced DAG query runs: traced because its query is, under the query's settings
        (and its W3C trace, for a stage forwarded to another node)."""
        return Trace(
            next(self._ids),
            model_name,
            parent.request_id,
            parent.level,
            parent.scope,
            parent_id=parent.id,
            query=parent,
        )

    def finish(self, trace: Trace | None) -> None:
        """The request has been answered (or failed): hand its trace to the sink."""
        if trace is None or self.sink is None:  # the API cannot enable tracing without a sink
            return
        self.finished += 1
        live = trace.scope is self._server or any(trace.scope is scope for scope in self._models.values())
        self.sink.take(trace, trace.scope if live else self._server)  # else its model's own settings were dropped

    def sent(self, trace: Trace, frontend: str) -> Callable[[int, int], None]:
        """What the frontend calls once the response is written (from, to): stamps the send, finishes the trace."""

        def stamp(start_ns: int, end_ns: int) -> None:
            trace.stamp(f"{frontend}_SEND_START", start_ns)
            trace.stamp(f"{frontend}_SEND_END", end_ns)
            self.finish(trace)

        return stamp

    def close(self) -> None:
        """At stop: whatever the sink holds is written or exported."""
        if self.sink is not None:
            self.sink.close((self._server, *self._models.values()))

    # -- the trace API ---------------------------------------------------------------------------------------
    def settings(self, model_name: str = "") -> dict[str, Any]:
        """Triton's trace setting response: every value a string, the level a list."""
        settings = self._scope(model_name).settings
        own = self.sink.describe(settings) if self.sink is not None else TraceFile.describe_none(settings)
        return {
            "trace_level": list(settings.level) or ["OFF"],
            "trace_rate": str(settings.rate),
            "trace_count": str(settings.count),
            **own,
        }

    def update(self, model_name: str, changes: Mapping[str, list[str] | None]) -> dict[str, Any]:
        """Apply a trace setting request (`TraceState.changed`); the settings now in force."""
        self.adopt(self.state.changed(self.initial, model_name, changes))
        return self.settings(model_name)

    def check(self, state: TraceState) -> None:
        """An InvalidInputError if this server cannot trace as `state` says (no trace file, a level its sink does
        not record)."""
        for settings in (state.server, *(state.of(name) for name in state.models)):
            self._check_sink(settings)

    def adopt(self, state: TraceState, shares: Mapping[str, int] | None = None) -> None:
        """Sample under `state` from now on (checked first): a scope whose settings it changes starts sampling
        afresh, its count anew where `state` gave one, else what is left of it; a model it gives no settings of its
        own follows the server's again, what it collected going with theirs. `shares`: a cluster's node server
        counts its share of each scope's count (SERVER or a model; none: 0), the cluster's count split among its
        servers, not the whole count."""
        self.check(state)
        before, self.state = self.state, state

        def counted(name: str) -> TraceSettings:
            settings = state.of(name)
            if shares is None or settings.count < 0:
                return settings
            return replace(settings, count=shares.get(name, 0))

        self._reset(self._server, counted(SERVER), before.of(SERVER), state.recounted("") != before.recounted(""))
        for name in [name for name in self._models if name not in state.models]:
            self._server.collected += self._models.pop(name).collected
        for name in state.models:
            scope = self._models.get(name)
            if scope is None:
                self._models[name] = _Scope(counted(name))
            else:
                recount = state.recounted(name) != before.recounted(name)
                self._reset(scope, counted(name), before.of(name), recount)

    @staticmethod
    def _reset(scope: _Scope, settings: TraceSettings, before: TraceSettings, recount: bool) -> None:
        if recount:
            scope.reset(settings)
        elif replace(settings, count=before.count) != before:
            scope.reset(replace(settings, count=scope.settings.count))

    # -- a cluster's share of a count (`adaserve.distributed.trace_settings`) ----------------------------------------
    def scope_of(self, model_name: str) -> str:
        """The scope whose count model `model_name`'s requests draw on: the model's, if it has settings of its own,
        else the server's (SERVER)."""
        return model_name if model_name in self._models else SERVER

    def left(self, scope: str, serial: int, take: bool = False) -> int:
        """What is left of `scope`'s count, as the change `serial` gave it (`TraceState.recounted`): 0 for a scope
        counting under another change, or none; -1 for no limit. `take`: it is all taken back (the count is 0)."""
        found = self._counting(scope, serial)
        if found is None:
            return 0
        left = found.settings.count
        if take and left > 0:
            found.settings = replace(found.settings, count=0)
        return left

    def give(self, scope: str, serial: int, count: int) -> None:
        """Add `count` traces to `scope`'s count, if it still counts under the change `serial` and has a limit."""
        found = self._counting(scope, serial)
        if found is not None and found.settings.count >= 0:
            found.settings = replace(found.settings, count=found.settings.count + count)

    def _counting(self, scope: str, serial: int) -> _Scope | None:
        """`scope`'s sampler while it still counts under the change `serial`; None for another change, or none."""
        found = self._server if scope == SERVER else self._models.get(scope)
        return found if found is not None and self.state.recounted(scope) == serial else None

    def wanting(self) -> dict[str, int]:
        """The scopes that let a request due a trace go untraced, their count used up, since the last call; each
        with the change that gave the count."""
        wanting = {}
        for name, scope in {SERVER: self._server, **self._models}.items():
            if scope.missed and scope.settings.count == 0:
                wanting[name] = self.state.recounted(name)
            scope.missed = 0
        return wanting

    def _check_sink(self, settings: TraceSettings) -> None:
        if settings.level and self.sink is None:
            raise InvalidInputError(f"tracing needs a trace file, and this server has none: {FILE_HINT}")
        unsupported = [level for level in settings.level if self.sink is not None and level not in self.sink.levels]
        if unsupported:
            mode = self.sink.mode if self.sink is not None else ""
            raise InvalidInputError(f"trace mode {mode} does not record trace_level {unsupported}")


FILE_HINT = "start the server with --trace-config triton,file=PATH"


def _context(headers: Mapping[str, str]) -> dict[str, str]:
    """The W3C trace context in a request's headers (or metadata); empty without a `traceparent`."""
    return {key: headers[key] for key in TRACE_CONTEXT if key in headers} if "traceparent" in headers else {}


def tracer_from_config(options: Iterable[str]) -> Tracer:
    """The tracer `--trace-config` asks for, in Triton's form: `level=TIMESTAMPS` (repeatable), `rate=N`, `count=N`,
    `mode=triton|opentelemetry`; `triton,file=PATH`, `triton,log-frequency=N`; `opentelemetry,url=URL`,
    `opentelemetry,resource=KEY=VALUE` (repeatable), `opentelemetry,bsp_max_queue_size=N`, `...,bsp_schedule_delay=MS`,
    `...,bsp_max_export_batch_size=N`. ConfigError names a bad one."""
    changes: dict[str, list[str]] = {}
    mode, path = "triton", None
    telemetry: dict[str, Any] = {"url": None, "resource": {}, "bsp": {}}
    for option in options:
        scope, _, setting = (
            option.partition(",") if option.startswith(("triton,", "opentelemetry,")) else ("", "", option)
        )
        name, equals, value = setting.partition("=")
        if not equals:
            raise ConfigError(f"--trace-config '{option}': expected [triton,|opentelemetry,]SETTING=VALUE")
        if (scope, name) == ("", "mode"):
            if value not in ("triton", "opentelemetry"):
                raise ConfigError(f"--trace-config '{option}': the trace modes are triton and opentelemetry")
            mode = value
        elif (scope, name) == ("triton", "file"):
            path = Path(value)
        elif (scope, name) in (("", "level"), ("", "rate"), ("", "count"), ("triton", "log-frequency")):
            key = "trace_" + name if name != "log-frequency" else "log_frequency"
            changes[key] = [*changes.get(key, []), value] if key == "trace_level" else [value]
        elif (scope, name) == ("opentelemetry", "url"):
            telemetry["url"] = value if "://" in value else f"http://{value}"
        elif (scope, name) == ("opentelemetry", "resource"):
            key, equals, attribute = value.partition("=")
            if not equals or not key:
                raise ConfigError(f"--trace-config '{option}': a resource is KEY=VALUE")
            telemetry["resource"][key] = attribute
        elif scope == "opentelemetry" and name in (
            "bsp_max_queue_size",
            "bsp_schedule_delay",
            "bsp_max_export_batch_size",
        ):
            telemetry["bsp"][name] = _config_number(option, value)
        else:
            raise ConfigError(
                f"--trace-config '{option}': unknown setting; the settings are level, rate, count, mode, triton,file, "
                "triton,log-frequency, opentelemetry,url, opentelemetry,resource and opentelemetry,bsp_*"
            )
    try:
        settings = replace(TraceSettings(), **parse_changes(changes))
    except InvalidInputError as exc:
        raise ConfigError(f"--trace-config: {exc}") from None
    sink: TraceSink | None = TraceFile(path) if path is not None else None
    if mode == "opentelemetry":
        from adaserve.server.trace_otel import DEFAULT_URL, OpenTelemetryExport

        sink = OpenTelemetryExport(telemetry["url"] or DEFAULT_URL, telemetry["resource"], telemetry["bsp"])
    try:
        return Tracer(settings, sink)
    except ConfigError:
        if sink is not None:  # its file is open, or its exporter process started
            sink.close(())
        raise


def _config_number(option: str, text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) == 0:
        raise ConfigError(f"--trace-config '{option}': expected a whole number above 0")
    return int(text)
