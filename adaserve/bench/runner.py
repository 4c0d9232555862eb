"""The load loop: open (requests fire at scheduled times whatever the server does) or closed (N clients in turn).

An open-loop issuer never waits for answers, so a slow server cannot slow the schedule down; each record keeps its
scheduled and actual send times, and the summary says when the generator itself fell behind. Every run is bounded:
issuing stops at the duration or count, then outstanding requests get `drain_s` to answer before they are cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from tqdm import tqdm

from adaserve.bench.client import (
    ClientTls,
    Compression,
    ModelUnavailable,
    Protocol,
    Sender,
    ServerUnreachable,
    create_sender,
)
from adaserve.bench.codec import Payload
from adaserve.bench.results import BenchResult, RequestRecord, Status, describe_machine
from adaserve.bench.schedules import ClosedSpec, Schedule, create_schedule
from adaserve.bench.summary import summarize
from adaserve.bench.traces import RequestSequence, load_sequence
from adaserve.bench.workload import RequestSpec, Workload, make_variants

#: Seconds between progress-bar refreshes; the bar reads counters, so the load loop pays nothing per request.
_PROGRESS_INTERVAL_S = 0.5
#: Request kinds drawn at once for the mix.
_MIX_BLOCK = 4096


class BenchConfig(BaseModel):
    """One run: the server, the protocol, the workload and the generator's own limits."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(min_length=1, description="host:port of the server's HTTP or gRPC endpoint")
    protocol: Protocol = "http"
    workload: Workload
    timeout_s: float = Field(default=30.0, gt=0, description="a request unanswered this long is a timeout error")
    drain_s: float = Field(default=10.0, ge=0, description="wait this long for outstanding answers after issuing")
    max_outstanding: int = Field(default=4096, ge=1, description="open loop: requests in flight before skipping")
    max_lateness_ms: float = Field(
        default=10.0, gt=0, description="open loop: p99 send lateness beyond which the run is not valid"
    )
    tls: ClientTls | None = Field(default=None, description="TLS to the server; an https:// URL implies it")
    compression: Compression | None = Field(
        default=None, description="compress requests and ask for compressed answers (see `client`)"
    )

    @field_validator("url")
    @classmethod
    def _host_and_port(cls, value: str) -> str:
        parts = urlsplit(value if "://" in value else f"http://{value}")
        try:
            port = parts.port
        except ValueError:
            port = None
        if parts.scheme not in ("http", "https") or not parts.hostname or port is None or parts.path not in ("", "/"):
            raise ValueError(f"expected host:port, http://host:port or https://host:port, got {value!r}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _https_is_tls(cls, data: Any) -> Any:
        if isinstance(data, dict) and str(data.get("url", "")).startswith("https://"):
            if data.get("protocol", "http") != "http":
                raise ValueError("an https:// URL is HTTP's; for gRPC over TLS give host:port and TLS settings")
            if data.get("tls") is None:
                data = {**data, "tls": ClientTls()}
        return data


SenderFactory = Callable[[BenchConfig], Sender]


def run_bench(
    config: BenchConfig,
    *,
    progress: bool = False,
    command: Sequence[str] = (),
    make_sender: SenderFactory | None = None,
) -> BenchResult:
    """Run one bounded benchmark and return every record and the summary.

    Bad input raises TraceError (a trace or request sequence with bad lines) or ScheduleError (a schedule that
    cannot be bounded); an unreachable server or model comes back as a result with `failure` set and `valid` false.
    `make_sender` replaces the network (tests steer answers with it); it is called inside the run's event loop.
    """
    workload = config.workload
    sequence = None if workload.sequence is None else load_sequence(workload.sequence)
    schedule = None if isinstance(workload.load, ClosedSpec) else create_schedule(workload.load, sequence)
    factory = make_sender or (lambda c: create_sender(c.protocol, c.url, c.timeout_s, c.tls, c.compression))
    # The default event loop, not uvloop: uvloop's millisecond timers fire up to ~1 ms early, which would send
    # requests before their scheduled time; asyncio's never do (measured: ~20% more CPU per request).
    return asyncio.run(_Run(config, schedule, sequence, progress).execute(factory, list(command)))


@dataclass(frozen=True)
class _Kind:
    """One request kind of the workload, encoded: its model name, the payloads it cycles through, and its index in
    the workload's `requests` (None: a sequence's model the workload does not list)."""

    model: str
    payloads: list[Payload]
    index: int | None


class _Mix:
    """Picks each request's kind by weight (seeded) and cycles through that kind's payloads."""

    def __init__(self, kinds: list[_Kind], weights: list[float], seed: int) -> None:
        self._kinds = kinds
        self._p = np.array(weights) / sum(weights)
        self._rng = np.random.default_rng(seed)
        self._block: list[int] = []
        self._turns = [0] * len(kinds)

    def next(self) -> tuple[_Kind, Payload]:
        if not self._block:
            self._block = self._rng.choice(len(self._kinds), size=_MIX_BLOCK, p=self._p).tolist()[::-1]
        index = self._block.pop()
        kind, turn = self._kinds[index], self._turns[index]
        self._turns[index] = turn + 1
        return kind, kind.payloads[turn % len(kind.payloads)]


class _InOrder:
    """A request sequence's models in order, each request with its model's kind (cycling through its payloads)."""

    def __init__(self, kinds: dict[str, _Kind], models: tuple[str, ...]) -> None:
        self._kinds = kinds
        self._models = iter(models)
        self._turns = dict.fromkeys(kinds, 0)

    def next(self) -> tuple[_Kind, Payload]:
        model = next(self._models)  # never runs out: the run's request limit is at most the sequence's length
        kind, turn = self._kinds[model], self._turns[model]
        self._turns[model] = turn + 1
        return kind, kind.payloads[turn % len(kind.payloads)]


class _Run:
    """The state of one run; `execute` reads as the algorithm: prepare → issue → drain → summarize."""

    def __init__(
        self, config: BenchConfig, schedule: Schedule | None, sequence: RequestSequence | None, progress: bool
    ) -> None:
        self._config = config
        self._workload = config.workload
        self._schedule = schedule
        self._sequence = sequence
        # A sequence is a bound of its own: the run sends at most its rows.
        limit = config.workload.max_requests
        self._limit = limit if sequence is None else min(limit or len(sequence), len(sequence))
        self._progress = progress
        self._records: list[RequestRecord] = []
        self._inflight: set[asyncio.Task[None]] = set()
        self._issuer: asyncio.Future[Any] | None = None
        self._notes: list[str] = list(schedule.notes) if schedule else []
        self._errors = 0
        self._issued = 0
        self._interrupted = False
        self._t0 = 0.0

    async def execute(self, make_sender: SenderFactory, command: list[str]) -> BenchResult:
        started = datetime.now(UTC).isoformat(timespec="seconds")
        sender = make_sender(self._config)
        loop = asyncio.get_running_loop()
        interrupt = False
        try:
            # 1. Check that every model is ready and encode each request kind once.
            try:
                mix = await self._prepare(sender)
            except (ServerUnreachable, ModelUnavailable) as exc:
                return self._result(command, started, window_s=0.0, cpu_s=0.0, wall_s=0.0, failure=str(exc))
            arrivals = self._arrivals()
            interrupt = self._catch_interrupt(loop)
            cpu0, self._t0 = time.process_time(), time.perf_counter()
            # 2. Issue requests until the bound, 3. then wait for the outstanding answers, at most drain_s.
            async with self._progress_bar(len(arrivals) if arrivals is not None else self._limit):
                window_s = await self._issue(sender, mix, arrivals)
                await self._drain()
            cpu_s, wall_s = time.process_time() - cpu0, self._now()
        finally:
            if interrupt:
                loop.remove_signal_handler(signal.SIGINT)
            await sender.close()
        # 4. Summarize what was measured.
        return self._result(command, started, window_s=window_s, cpu_s=cpu_s, wall_s=wall_s)

    def _now(self) -> float:
        """Seconds since the run started, from the finest clock there is."""
        return time.perf_counter() - self._t0

    async def _prepare(self, sender: Sender) -> _Mix | _InOrder:
        rng = np.random.default_rng(self._workload.seed)
        if self._sequence is None:
            kinds = [await self._encode(sender, spec, rng, i) for i, spec in enumerate(self._workload.requests)]
            return _Mix(kinds, [spec.weight for spec in self._workload.requests], self._workload.seed)
        listed = {spec.model: (i, spec) for i, spec in enumerate(self._workload.requests)}
        by_model = {}
        for model in dict.fromkeys(self._sequence.models):
            index, spec = listed.get(model, (None, RequestSpec(model=model)))
            by_model[model] = await self._encode(sender, spec, rng, index)
        return _InOrder(by_model, self._sequence.models)

    @staticmethod
    async def _encode(sender: Sender, spec: RequestSpec, rng: np.random.Generator, index: int | None) -> _Kind:
        """One request kind, checked against the model's metadata and encoded once."""
        info = await sender.model_info(spec.model, spec.version)
        outputs = spec.outputs or tuple(meta.name for meta in info.outputs)
        payloads = [
            sender.encode(spec.model, spec.version, tensors, outputs, spec.parameters)
            for tensors in make_variants(spec, info, rng)
        ]
        return _Kind(spec.model, payloads, index)

    def _arrivals(self) -> list[float] | None:
        if self._schedule is None:
            return None
        arrivals = self._schedule.arrivals(self._workload.duration_s, self._limit)
        return [float(t) for t in arrivals]

    async def _issue(self, sender: Sender, mix: _Mix | _InOrder, arrivals: list[float] | None) -> float:
        """Send until the bound or an interrupt; returns the window (s) that the rates are taken over."""
        duration = self._workload.duration_s
        issuer: asyncio.Future[Any]
        if arrivals is not None:
            issuer = asyncio.ensure_future(self._open_loop(sender, mix, arrivals))
        else:
            assert isinstance(self._workload.load, ClosedSpec)
            clients = [self._closed_client(sender, mix) for _ in range(self._workload.load.concurrency)]
            issuer = asyncio.gather(*clients)
        self._issuer = issuer
        # An open loop ends by itself after its last arrival; a closed loop is stopped at the duration.
        await asyncio.wait([issuer], timeout=duration if arrivals is None else None)
        issuer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await issuer
        elapsed = self._now()
        if self._interrupted or (duration is None and not arrivals):
            return elapsed
        if arrivals is not None:
            return duration if duration is not None else arrivals[-1]
        return min(duration, elapsed) if duration is not None else elapsed

    async def _open_loop(self, sender: Sender, mix: _Mix | _InOrder, arrivals: list[float]) -> None:
        for index, due in enumerate(arrivals):
            # Yield even when behind schedule, so answers are read and the last request's task starts now.
            await asyncio.sleep(max(0.0, due - self._now()))
            kind, payload = mix.next()
            if len(self._inflight) >= self._config.max_outstanding:
                self._records.append(
                    RequestRecord(
                        id=index,
                        model=kind.model,
                        kind=kind.index,
                        scheduled_s=due,
                        status=Status.NOT_SENT,
                        error_kind="generator_behind",
                        error=f"{self._config.max_outstanding} requests already outstanding",
                    )
                )
                continue
            self._launch(self._one(sender, index, kind, payload, due))

    async def _closed_client(self, sender: Sender, mix: _Mix | _InOrder) -> None:
        limit = self._limit
        while limit is None or self._issued < limit:
            kind, payload = mix.next()
            now = self._now()
            # asyncio.wait does not cancel the request when this client is cancelled at the end of the duration.
            await asyncio.wait([self._launch(self._one(sender, self._issued, kind, payload, now))])

    def _launch(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        self._issued += 1
        task = asyncio.ensure_future(coroutine)
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)
        return task

    async def _one(self, sender: Sender, index: int, kind: _Kind, payload: Payload, scheduled: float) -> None:
        sent = self._now()
        record = RequestRecord(
            id=index, model=kind.model, kind=kind.index, scheduled_s=scheduled, sent_s=sent, status=Status.CANCELLED
        )
        try:
            outcome = await sender.infer(payload)
        except asyncio.CancelledError:
            record.error_kind, record.error = "cancelled", "no answer before the drain timeout or an interrupt"
            self._records.append(record)
            raise
        record.done_s = self._now()
        record.latency_ms = (record.done_s - scheduled) * 1000
        record.parameters = outcome.parameters
        if outcome.error_kind is None:
            record.status = Status.OK
        else:
            record.status, record.error_kind, record.error = Status.ERROR, outcome.error_kind, outcome.error
            self._errors += 1
        self._records.append(record)

    async def _drain(self) -> None:
        if not self._inflight:
            return
        _, pending = await asyncio.wait(set(self._inflight), timeout=self._config.drain_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def _catch_interrupt(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Ctrl-C stops issuing (a second one cancels the outstanding requests) so a partial report is written."""

        def interrupt() -> None:
            if self._issuer is not None and not self._issuer.done():
                self._notes.append("interrupted: issuing stopped early by the user")
                self._interrupted = True
                self._issuer.cancel()
            else:
                for task in list(self._inflight):
                    task.cancel()

        try:
            loop.add_signal_handler(signal.SIGINT, interrupt)
        except (ValueError, RuntimeError):  # not the main thread: Ctrl-C cannot reach this loop anyway
            return False
        return True

    @contextlib.asynccontextmanager
    async def _progress_bar(self, total: int | None) -> AsyncIterator[None]:
        """A tqdm bar on stderr, refreshed from counters by its own task."""
        if not self._progress:
            yield
            return
        bar = tqdm(total=total, unit="req", dynamic_ncols=True, mininterval=_PROGRESS_INTERVAL_S)

        def update() -> None:
            bar.n = len(self._records)
            bar.set_postfix(errors=self._errors, inflight=len(self._inflight), refresh=False)
            bar.refresh()

        async def refresh() -> None:
            while True:
                update()
                await asyncio.sleep(_PROGRESS_INTERVAL_S)

        task = asyncio.ensure_future(refresh())
        try:
            yield
        finally:
            task.cancel()
            update()
            bar.close()

    def _result(
        self,
        command: list[str],
        started: str,
        *,
        window_s: float,
        cpu_s: float,
        wall_s: float,
        failure: str | None = None,
    ) -> BenchResult:
        records = sorted(self._records, key=lambda r: r.id)
        asked = self._schedule.expected(window_s) if self._schedule is not None and window_s > 0 else None
        summary = summarize(
            records,
            open_loop=self._schedule is not None,
            asked_requests=asked,
            window_s=window_s,
            cpu_s=cpu_s,
            wall_s=wall_s,
            max_lateness_ms=self._config.max_lateness_ms,
            failure=failure,
            interrupted=self._interrupted,
            kinds=[spec.label for spec in self._workload.requests] if self._sequence is None else (),
        )
        return BenchResult(
            machine=describe_machine(),
            command=command,
            started_at=started,
            config=self._config.model_dump(mode="json"),
            failure=failure,
            notes=self._notes,
            records=records,
            summary=summary,
        )
