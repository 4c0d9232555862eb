"""One model's request path on the event loop: input pool → elastic scheduler → worker processes → answers.

`infer` copies a request's rows into the pool the moment it arrives and asks the scheduler for batches; a worker's
results are answered the moment its batch finishes. Nothing here blocks the loop: compute is in the workers, and
their messages arrive through `loop.add_reader`.

A worker that dies is restarted; the rows it held run again once, and a request whose rows kill a worker twice
is answered with an explicit error. Nothing accepted is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from adaserve.adaptive.activator.select import prepare_parameters
from adaserve.adaptive.gati.requests import exit_target
from adaserve.adaptive.responses import Part, combine
from adaserve.config import AdaptationSpec, ModelConfig, WorkerSpec
from adaserve.engine.batching import WorkerSlot, create_batching_policy
from adaserve.engine.cores import Cores
from adaserve.engine.footprint import ProcessMemory, record_footprint
from adaserve.engine.messages import (
    BatchDone,
    FrameReader,
    RowParameters,
    RowsDone,
    RunBatch,
    WorkerFailed,
    WorkerReady,
    check_parameters,
    write_staged,
)
from adaserve.engine.pool import PoolLayout, SharedRings, SlotRing
from adaserve.engine.processes import HostLauncher, ModelHost, WorkerProcess
from adaserve.engine.schedule_policy import queue_rank, rank_level, schedule
from adaserve.engine.scheduler import Batch, Scheduler
from adaserve.engine.stats import ModelStats, RetrainingStats
from adaserve.engine.worker_sets import WorkerSetChoice, create_worker_set_planner
from adaserve.errors import ConfigError, InferenceError, ModelNotReadyError, OverloadedError
from adaserve.repository import ModelSpec

if TYPE_CHECKING:
    from adaserve.adaptive.gati.service import CacheAdaptation

log = logging.getLogger("adaserve.engine")

#: A request runs at most this many times: once its rows were held by this many workers that died, it is answered
#: with an error instead of running again.
MAX_RUNS = 2
#: Failed starts of replacement workers in a row, with no worker of the model left serving, before the model is
#: reported unavailable (its queued requests answered so); it keeps trying, and is ready again once one starts.
MAX_START_FAILURES = 3
#: A replacement worker that could not be started is tried again after this, doubling up to the most, so that a
#: passing shortage (open files, memory) heals by itself: before, one failed restart left the model unavailable
#: for good with 5 of its 6 workers alive.
RESTART_BACKOFF_S = 0.5
RESTART_BACKOFF_MAX_S = 30.0


class EngineState(Enum):
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


@dataclass(frozen=True)
class RequestTimes:
    """Where a request's time went, as CLOCK_MONOTONIC nanoseconds (Triton's trace timestamps QUEUE_START,
    COMPUTE_START and COMPUTE_END): queued on arrival, computed from when the first of its batches started to when
    the last ended (or a learned cache answered it)."""

    queued_ns: int
    compute_start_ns: int
    compute_end_ns: int


@dataclass(frozen=True)
class EngineResult:
    outputs: list[np.ndarray]  # in config order, `rows` rows each
    parameters: dict[str, Any]  # response parameters set by the worker (e.g. an early-exit block)
    times: RequestTimes


@dataclass(eq=False)
class PendingRequest:
    """A request whose rows are in the pool at [start, start + rows)."""

    start: int
    rows: int
    arrived_ns: int
    parameters: dict[str, Any]
    future: asyncio.Future[EngineResult]
    outstanding: int
    level: int = 0  # its rank in the queue (`schedule_policy.queue_rank`: its priority level, and if delayed)
    dispatched_ns: int = 0
    compute_start_ns: int = 0  # the first of its batches began (in its worker)
    compute_end_ns: int = 0  # the last ended, or a learned cache answered it
    answered: bool = False  # a learned cache answered it while its batch ran on
    # The worker processes that died holding its rows. A CUDA model's workers are threads of its host and report
    # the host's PID, so a host that dies counts once however many of its workers held the request's rows.
    deaths: set[int] = field(default_factory=set)
    error: str | None = None
    reason: str = ""
    # The response parameters its batches reported, by the first slot of each part (`responses.combine`)
    parts: dict[int, Part] = field(default_factory=dict)

    def record(self, slot: int, rows: int, values: dict[str, Any]) -> None:
        """A batch's response parameters for the request's rows [slot, slot + rows). Rows that ran again after
        their worker died replace what their first run reported, however the new batches split them."""
        for start in [s for s, (n, _) in self.parts.items() if s < slot + rows and slot < s + n]:
            del self.parts[start]
        self.parts[slot] = (rows, values)

    def computed(self, start_ns: int, end_ns: int) -> None:
        """One of its batches ran from `start_ns` to `end_ns` (worker clock, the same CLOCK_MONOTONIC)."""
        self.compute_start_ns = min(self.compute_start_ns or start_ns, start_ns)
        self.compute_end_ns = max(self.compute_end_ns, end_ns)


@dataclass(frozen=True)
class WorkerInfo:
    """A ready worker as the model configuration endpoint shows it."""

    id: int
    pid: int
    batch: int
    threads: int
    cpus: list[int]
    workspace_bytes: int


class ModelEngine:
    def __init__(
        self,
        model: ModelSpec,
        *,
        reload: Callable[[], None] | None = None,
        retrainings: RetrainingStats | None = None,
        hosts: HostLauncher | None = None,
        cores: Cores | None = None,
    ) -> None:
        """`reload`: asks the router to load the model again (GATI's adaptation deployed a new cache set);
        `retrainings`: where that adaptation counts its retrainings (the router's, so they outlive the reload);
        `hosts`: where the model's host process comes from (default: one started for it, no spares); `cores`: the
        CPU cores shared with the server's other CPU models (default, or with `batching.share_cores: false`: this
        model's alone; CUDA models never share them)."""
        config = model.config
        self.model = model
        self._reload = reload
        self.retrainings = retrainings or RetrainingStats()
        self._hosts = hosts or HostLauncher()
        self.adaptation: CacheAdaptation | None = None
        self.planner = create_worker_set_planner(model)
        self.worker_set = self.planner.initial()
        self.slots = config.max_queue_size + self.planner.max_rows_in_flight() + config.max_batch_size
        self.rings, self._pool_fd = SharedRings.create(PoolLayout.for_config(config, self.slots), model.name)
        self._ring = SlotRing(self.slots)
        self.idle_spin_us = idle_spin_in_force(config)
        # Whether the busy-thread limit and polling count the server's other CPU models (`adaserve.engine.cores`).
        self.shares_cores = cores is not None and config.device == "cpu" and config.batching.share_cores
        self.scheduler = Scheduler(
            create_batching_policy(config.batching, config.max_batch_size),
            config.inflight_limit_for(self.worker_set.workers, self.worker_set.max_inflight),
            max_busy_threads=self._busy_threads(),
            saturated_busy_threads=config.batching.max_busy_threads_saturated,
            idle_spin=self.idle_spin_us > 0,
            cores=cores if self.shares_cores else None,
        )
        self.scheduler.cores.connect(
            self.scheduler,
            pump=self._pump,
            rest=self._rest,
            worker_pids=lambda: [worker.pid for worker in self.workers.values()],
        )
        # A CUDA model's host copies each request into its device ring as it arrives: this pipe names the rows
        # (a new pipe for each host; `_launch_host` makes it).
        self._stage_pipe: tuple[int, int] | None = None
        self.stats = ModelStats()
        self.state = EngineState.LOADING
        self.workers: dict[int, WorkerInfo] = {}
        self.model_bytes = 0  # the weights (and learned caches), measured by the host once it has loaded them
        self.cache_bytes = 0  # GATI's learned caches
        self.host_wait_s = 0.0  # of the last start: waiting for a host process to take the model (a spare starting)
        self.early_exit: str | None = None  # the learned caches serving, as the host described them
        self.exit_blocks: list[str] = []  # their model's block chain, in order
        self._loop = asyncio.get_running_loop()
        self._owners: list[PendingRequest | None] = [None] * self.slots
        self._processes: dict[int, WorkerProcess] = {}
        self._readers: dict[int, FrameReader] = {}
        self._starting: dict[int, asyncio.Future[None]] = {}
        self._start_errors: dict[int, str] = {}
        self._start_failures = 0  # in a row, of replacement workers
        self._unavailable = ""  # why, while the state says so
        self._waiting: deque[tuple[int, asyncio.Future[int]]] = deque()  # (rows, future of a start slot)
        self._waiting_rows = 0
        self._arrived_rows = 0  # accepted so far: Packrat's arrival rate
        self._timer: asyncio.TimerHandle | None = None
        self._ids = itertools.count()
        self._host: ModelHost | None = None
        self._host_lock = asyncio.Lock()  # one relaunch, however many spawns find the host gone
        self._tasks: set[asyncio.Task[Any]] = set()
        # Each worker belongs to the worker set it was started for. The scheduler feeds the active set's; a worker of a
        # later set waits (standby) until `switch_workers` activates it; one of an earlier set is stopped.
        self._active_set = 0
        self._set_ids = itertools.count(1)
        self._set_of: dict[int, int] = {}  # worker id → its set
        self._retiring: set[int] = set()  # workers of a replaced set: they finish their batch, then stop
        self._undelivered: set[int] = set()  # batches sent to a worker already gone (see _dispatch)
        self._idle = asyncio.Event()  # set when no request holds slots
        self._idle.set()
        self._gone = asyncio.Event()  # set when no worker process is left
        self._gone.set()

    def _busy_threads(self) -> int | None:
        """The busy-thread limit: the config's, else the worker-set planner's default (None: no limit)."""
        config = self.model.config
        busy_threads = config.batching.max_busy_threads
        if busy_threads is None:  # CPU workers share the cores; CUDA streams share the GPU, which takes them all
            busy_threads = self.planner.default_busy_threads() if config.device == "cpu" else 0
        return busy_threads or None

    # -- lifecycle -------------------------------------------------------------------------------------------
    async def start(self, timeout_s: float = 300.0) -> None:
        """Start every worker and wait until each has loaded the model; ConfigError if one cannot. A start that
        fails or is cancelled stops the processes it had started."""
        try:
            await self._start(timeout_s)
        except BaseException:
            await self.stop(drain_timeout_s=0)
            raise

    async def _start(self, timeout_s: float) -> None:
        try:
            await asyncio.wait_for(self._start_processes(), timeout_s)
        except TimeoutError:
            raise ConfigError(f"model '{self.model.name}': workers not ready after {timeout_s:.0f} s") from None
        self.state = EngineState.READY
        log.info(
            "model ready",
            extra={
                "model": self.model.name,
                "version": self.model.version,
                "workers": [w.__dict__ for w in self.workers.values()],
                "worker_set": self.worker_set.reason,
                "policy": self.scheduler.policy.name,
                "slots": self.slots,
                "early_exit": self.early_exit,
            },
        )
        self._keep(self._loop.create_task(self._record_footprint("ready")))  # beside serving, not before it
        if self.planner.sample_interval_s is not None:
            self._keep(self._loop.create_task(self._follow_load(self.planner.sample_interval_s)))
        caches = self.model.config.caches
        if caches is not None and caches.adaptation is not None and self.early_exit is not None:
            await self._start_adaptation(caches.adaptation)

    async def _start_adaptation(self, settings: AdaptationSpec) -> None:
        """GATI's cache adaptation service. Torch is imported into the server only for models that use it, and
        that import and the cache set's loading (the artifact's digest) run off the event loop."""
        reload = self._reload or (lambda: None)
        self.adaptation = await self._loop.run_in_executor(
            None, _adaptation_service, self.model, settings, reload, self.retrainings
        )
        self._keep(self._loop.create_task(self.adaptation.follow(lambda: self.loaded)))

    @property
    def loaded(self) -> bool:
        """Started and not unloading: ready, or unavailable while its workers cannot be restarted."""
        return self.state in (EngineState.READY, EngineState.UNAVAILABLE)

    def process_memory(self) -> ProcessMemory:
        """What the model's host and workers add to the machine's memory now (its share of what they share with the
        zygote and the other models' processes included)."""
        return ProcessMemory.of(self._process_pids())

    def _process_pids(self) -> list[int]:
        """The host's and the workers', each once (a CUDA model's workers are threads of its host)."""
        host = [self._host.process.pid] if self._host is not None else []
        return list(dict.fromkeys(host + [worker.pid for worker in self.workers.values()]))

    async def _record_footprint(self, moment: Literal["ready", "unloading"]) -> None:
        """Keep what the model's processes add now beside the model, for `models list` (`adaserve.engine.footprint`);
        off the event loop, as it reads /proc and writes a file."""
        model = self.model
        pids = self._process_pids()
        await self._loop.run_in_executor(None, record_footprint, model.directory, model.version, pids, moment)

    @property
    def memory_bytes(self) -> int:
        """What serving this model holds: its weights (shared by the workers) and each worker's own workspace."""
        return self.model_bytes + sum(worker.workspace_bytes for worker in self.workers.values())

    async def _start_processes(self) -> None:
        chosen = await self._loop.run_in_executor(None, self.planner.prepare)
        if chosen is not None:
            self.worker_set = chosen
            self.scheduler.max_inflight = self.model.config.inflight_limit_for(chosen.workers, chosen.max_inflight)
        await self._launch_host()
        starts = [await self._spawn(worker, self._active_set) for worker in self.worker_set.workers]
        await asyncio.gather(*(started for _, started in starts))

    async def _launch_host(self) -> None:
        """Start the model's host and wait until it has loaded the model. A CUDA host gets a new stage pipe, and is
        told at once of the rows already in the pool (after a relaunch, their batches run again on its workers)."""
        if self._stage_pipe is not None:
            os.close(self._stage_pipe[1])
        self._stage_pipe = os.pipe() if self.model.config.device == "cuda" else None
        stage_fd = self._stage_pipe[0] if self._stage_pipe is not None else None
        launched = time.perf_counter()
        try:
            self._host = await self._hosts.launch(
                self.model, pool_fd=self._pool_fd, slots=self.slots, stage_fd=stage_fd
            )
        finally:
            if stage_fd is not None:
                os.close(stage_fd)  # the host holds its own copy
        ready = await self._host.ready()
        self.host_wait_s = max(0.0, time.perf_counter() - launched - ready.load_s)
        self.model_bytes, self.cache_bytes, self.early_exit = ready.model_bytes, ready.cache_bytes, ready.early_exit
        self.exit_blocks = ready.exit_blocks
        if ready.early_exit_error is not None:
            log.error(
                "learned caches cannot serve; the model serves without early exit",
                extra={"model": self.model.name, "error": ready.early_exit_error},
            )
        if self._stage_pipe is not None:
            for pending in {p for p in self._owners if p is not None}:
                write_staged(self._stage_pipe[1], pending.start, pending.rows)

    async def _relaunch_host(self, failed: ModelHost) -> None:
        """The host could not fork a worker: it died (on CUDA its workers, its threads, died with it) or its control
        socket broke. End it, by the PID this server started it with, and start another."""
        async with self._host_lock:
            if self._host is not failed:
                return  # another spawn has relaunched it
            pid = failed.process.pid
            log.warning("model host gone; starting it again", extra={"model": self.model.name, "pid": pid})
            self.stats.host_restarts += 1
            failed.process.kill()
            await failed.stop()
            await self._launch_host()

    # -- changing the worker set (Packrat) -------------------------------------------------------------------
    async def _follow_load(self, interval_s: float) -> None:
        """Report the queue depth to the worker-set planner; switch sets when it answers with a new one."""
        while self.loaded:
            await asyncio.sleep(interval_s)
            depth = self.scheduler.ready + self.scheduler.inflight
            choice = self.planner.observe(depth, self._arrived_rows, time.monotonic())
            if choice is not None and self.state is EngineState.READY:
                try:
                    await self.switch_workers(choice)
                except Exception:  # a bug must not end load-following for the model's life, silently
                    log.exception("worker set switch failed", extra={"model": self.model.name})

    async def switch_workers(self, choice: WorkerSetChoice) -> None:
        """Active/passive: start the new set beside the old, activate it once all of it is ready, retire the old.

        Requests keep flowing to the old set until the switch; the old workers finish the batches they hold. If the
        new set cannot start, the old one keeps serving.
        """
        began = time.monotonic()
        set_id = next(self._set_ids)
        starts: list[tuple[int, asyncio.Future[None]]] = []
        try:
            for spec in choice.workers:
                starts.append(await self._spawn(spec, set_id))
            await asyncio.gather(*(started for _, started in starts))
        except ConfigError as exc:
            if self.state is EngineState.READY:
                log.error(
                    "new worker set failed to start; keeping the old one",
                    extra={"model": self.model.name, "error": str(exc)},
                )
            self._abandon(starts)
            return
        if self.state is not EngineState.READY:  # the model began to unload while the new set started
            self._abandon(starts)
            return
        # From the spawns, not from the processes alive now: a new worker may already have started and died.
        new = {worker_id: spec for (worker_id, _), spec in zip(starts, choice.workers, strict=True)}
        self._active_set = set_id
        # The old set as it is now: a worker that died during the start was replaced by one that is old too (if that
        # replacement is still being forked, `_on_ready` stops it).
        for worker_id in [w for w in self._processes if self._set_of[w] != set_id and w not in self._retiring]:
            self._retire(worker_id, idle=self.scheduler.retire_worker(worker_id))
        self.scheduler.max_inflight = self.model.config.inflight_limit_for(choice.workers, choice.max_inflight)
        self.scheduler.max_busy_threads = self._busy_threads()  # a planner's default may follow its sets
        for worker_id, spec in new.items():
            if worker_id not in self._processes:
                self._respawn(spec)  # died after it was ready: start another, so the new set is not one short
                continue
            self.scheduler.add_worker(WorkerSlot(worker_id, spec.batch, spec.threads))
        self.worker_set = choice
        self.stats.reconfigurations += 1
        log.info(
            "worker set switched",
            extra={
                "model": self.model.name,
                "worker_set": choice.reason,
                "details": choice.details,
                "switch_s": round(time.monotonic() - began, 3),
            },
        )
        self._pump()

    def _abandon(self, starts: list[tuple[int, asyncio.Future[None]]]) -> None:
        """Stop the workers of a set that will not be switched to; they were never given work (one still starting
        reads Stop next)."""
        for worker_id, _ in starts:
            if worker_id in self._processes:
                self._retire(worker_id, idle=True)

    def _retire(self, worker_id: int, *, idle: bool) -> None:
        """Stop a worker of a replaced set now if idle, else after its batch (see `_on_batch_done`)."""
        self._retiring.add(worker_id)
        if idle:
            self._processes[worker_id].stop()

    def _keep(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @property
    def idle(self) -> bool:
        """No request holds slots: everything accepted has been answered."""
        return self._idle.is_set()

    async def wait_idle(self) -> None:
        """Return once the engine is `idle` (a stop, and a cluster node being drained, wait for this)."""
        await self._idle.wait()

    async def stop(self, drain_timeout_s: float = 30.0) -> None:
        """Finish what was accepted (up to `drain_timeout_s`), then stop the workers and release the pool."""
        loaded = self.loaded
        self.state = EngineState.UNLOADING
        try:
            if loaded:  # what it held while it served: the last figure `models list` shows
                await self._record_footprint("unloading")
            await self._stop(drain_timeout_s)
        finally:  # however the stop ended, its busy threads must not hold the other models back
            self.scheduler.cores.leave(self.scheduler)

    async def _stop(self, drain_timeout_s: float) -> None:
        self.planner.close()
        if self.adaptation is not None:
            self.adaptation.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wait_idle(), drain_timeout_s)
        await self._end_workers()
        if self._host is not None:
            await self._host.stop()
            # A spawn the host finished before it stopped forked a worker after the wait above (`_spawn` told it
            # to stop): it is waited for too, so no worker outlives the engine.
            await self._end_workers()
        self._fail_everything("the model was unloaded before this request finished")
        if self._timer is not None:
            self._timer.cancel()
        self.rings.close()
        os.close(self._pool_fd)
        if self._stage_pipe is not None:
            os.close(self._stage_pipe[1])

    async def _end_workers(self) -> None:
        """Tell every worker to stop after its batch and wait until they have exited (killed after 10 s)."""
        for process in list(self._processes.values()):
            process.stop()
        try:
            await asyncio.wait_for(self._gone.wait(), 10.0)
        except TimeoutError:
            for process in list(self._processes.values()):
                process.kill()
            await self._gone.wait()

    # -- requests --------------------------------------------------------------------------------------------
    async def infer(self, inputs: list[np.ndarray], rows: int, parameters: dict[str, Any]) -> EngineResult:
        """Run `rows` rows (inputs already validated against the config) and return the outputs."""
        if self.state is not EngineState.READY:
            why = f": {self._unavailable}" if self.state is EngineState.UNAVAILABLE else ""
            raise ModelNotReadyError(f"model '{self.model.name}' is {self.state.value.lower()}{why}")
        if parameters:
            check_parameters(parameters)
        if self.model.config.activator is not None:
            parameters = prepare_parameters(parameters)  # a bad target is a 400 before anything is queued
        if self.model.config.caches is not None:
            exit_target(parameters, 1.0)  # the same: a bad `early_exit` or `accuracy` is refused here
        level, policy, timeout_s = schedule(parameters, self.model.config.batching)
        self._admit(rows, level, policy.max_queue_size)
        arrived_ns = time.perf_counter_ns()
        self._arrived_rows += rows
        start = self._ring.allocate(rows)
        if start is None:
            start = await self._wait_for_slots(rows)
        for ring, array in zip(self.rings.inputs, inputs, strict=True):
            ring[start : start + rows] = array
        if self._stage_pipe is not None:
            with contextlib.suppress(OSError):  # the host is gone: its workers' exits answer for these rows
                write_staged(self._stage_pipe[1], start, rows)
        if self.adaptation is not None:
            self.adaptation.offer(inputs[0])
        rank = queue_rank(level)
        pending = PendingRequest(
            start, rows, arrived_ns, parameters, self._loop.create_future(), outstanding=rows, level=rank
        )
        self._owners[start : start + rows] = [pending] * rows
        self._idle.clear()
        self.scheduler.enqueue(start, rows, time.monotonic(), rank)
        if timeout_s is not None:
            waited_s = (time.perf_counter_ns() - arrived_ns) / 1e9  # a wait for contiguous slots counts too
            self._loop.call_later(
                max(0.0, timeout_s - waited_s), self._expire, pending, timeout_s, policy.timeout_action
            )
        self._pump()
        try:
            return await pending.future
        except asyncio.CancelledError:  # its client hung up, or its gRPC deadline passed: no one will read it
            self._take_back(pending, "its client stopped waiting before any of its rows started", "cancelled")
            raise

    def _admit(self, rows: int, level: int, level_bound: int) -> None:
        """Refuse (503) a request the queue has no room for: the model's `max_queue_size` bounds every waiting row
        (the pool's memory), the level's queue policy its own (0: no bound of its own)."""
        queued = self.scheduler.ready + self._waiting_rows
        if queued + rows > self.model.config.max_queue_size:
            self.stats.failures["overloaded"] += 1
            raise OverloadedError(
                f"model '{self.model.name}' has {queued} rows queued (max_queue_size "
                f"{self.model.config.max_queue_size}); retry later"
            )
        if not level_bound:
            return
        at_level = self.queued_at_level(level)
        if at_level + rows > level_bound:
            self.stats.failures["overloaded"] += 1
            raise OverloadedError(
                f"model '{self.model.name}' has {at_level} rows queued at priority level {level} (the queue "
                f"policy's max_queue_size {level_bound}); retry later"
            )

    def queued_at_level(self, level: int) -> int:
        """Rows waiting at priority `level`, those its queue policy delayed included."""
        return self.scheduler.rows_at(queue_rank(level)) + self.scheduler.rows_at(queue_rank(level, delayed=True))

    def _expire(self, pending: PendingRequest, timeout_s: float, action: str) -> None:
        """Triton's request timeout: a request none of whose rows has started by then is refused (503), or with
        the `delay` action waits on behind its level's requests still in time."""
        if action == "delay":
            delayed = queue_rank(rank_level(pending.level), delayed=True)
            if not pending.dispatched_ns and self.scheduler.move(pending.start, pending.rows, delayed):
                pending.level = delayed
                self.stats.delayed += 1
            return
        self._take_back(
            pending, f"its timeout ({timeout_s * 1e6:.0f} µs) passed before any of its rows started", "timeout"
        )

    def _take_back(self, pending: PendingRequest, error: str, reason: str) -> None:
        """Take a request none of whose rows has started back out of the queue and free its slots, failing it with
        `error`; one that has started runs to the end (a worker's batch is not cut short)."""
        if pending.dispatched_ns or pending.answered or not self.scheduler.withdraw(pending.start, pending.rows):
            return
        pending.error = error
        pending.reason = reason
        pending.outstanding = 0
        self._complete(pending)

    async def _wait_for_slots(self, rows: int) -> int:
        """The pool is fragmented by a slow batch; wait (bounded by the queue limit) for contiguous slots."""
        future: asyncio.Future[int] = self._loop.create_future()
        self._waiting.append((rows, future))
        self._waiting_rows += rows
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._ring.free(future.result(), rows)
            raise
        finally:
            self._waiting_rows -= rows

    def _admit_waiting(self) -> None:
        while self._waiting:
            rows, future = self._waiting[0]
            if future.done():
                self._waiting.popleft()
                continue
            start = self._ring.allocate(rows)
            if start is None:
                return
            self._waiting.popleft()
            future.set_result(start)

    # -- the scheduling step ---------------------------------------------------------------------------------
    def _pump(self) -> None:
        """Take ready slots → feed idle workers; arm a timer if the policy is waiting for a deadline."""
        now = time.monotonic()
        for batch in self.scheduler.schedule(now):
            self._dispatch(batch)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        wake = self.scheduler.wake_after_s(time.monotonic())
        if wake is not None:
            self._timer = self._loop.call_later(wake, self._pump)

    def _dispatch(self, batch: Batch) -> None:
        now_ns = time.perf_counter_ns()
        parameters, requests = [], []
        for pending, slot, rows in self._requests_in(batch):
            pending.dispatched_ns = pending.dispatched_ns or now_ns
            requests.append(rows)
            if pending.parameters:
                parameters.append(RowParameters(slot - batch.start, rows, pending.parameters))
        for worker_id in batch.rests:
            self._rest(worker_id)
        command = RunBatch(
            batch.id, batch.start, batch.rows, requests, parameters, self.idle_spin_us if batch.spin else 0
        )
        if not self._processes[batch.worker_id].run(command):
            # The worker is gone and its exit not yet seen (on CUDA, its host died and took every worker with it):
            # its exit handler re-runs the batch, which never reached it, so no death counts against these rows.
            self._undelivered.add(batch.id)

    def _rest(self, worker_id: int) -> None:
        """Tell a polling worker that another worker, of this model or another on the same cores, took its core."""
        if worker_id in self._processes:
            self._processes[worker_id].rest()

    def _requests_in(self, batch: Batch) -> Iterator[tuple[PendingRequest, int, int]]:
        """(request, first slot, rows) for each request with rows in the batch."""
        slot, end = batch.start, batch.start + batch.rows
        while slot < end:
            pending = self._owners[slot]
            assert pending is not None, f"slot {slot} of a batch has no request"
            rows = min(pending.start + pending.rows, end) - slot
            yield pending, slot, rows
            slot += rows

    # -- worker messages -------------------------------------------------------------------------------------
    async def _spawn(self, spec: WorkerSpec, set_id: int) -> tuple[int, asyncio.Future[None]]:
        """Fork a worker of set `set_id` from the host: its id, and a future that resolves when it has warmed up and
        is ready. A worker of a set that is being started gets no work until `switch_workers` activates its set."""
        assert self._host is not None
        worker_id = next(self._ids)
        host = self._host
        try:
            process = await host.spawn(worker_id, spec)
        except ConfigError:
            if self.state is EngineState.UNLOADING:
                raise  # stop() has ended the host: no new one for a model that is going
            await self._relaunch_host(host)
            process = await self._host.spawn(worker_id, spec)
        self._processes[worker_id] = process
        self._set_of[worker_id] = set_id
        self._readers[worker_id] = FrameReader()
        self._gone.clear()
        started: asyncio.Future[None] = self._loop.create_future()
        self._starting[worker_id] = started
        self._loop.add_reader(process.result_fd, self._on_readable, process)
        if self.state is EngineState.UNLOADING:
            process.stop()  # forked while stop() ran (it let the host finish this spawn): it stops once warmed up
        return worker_id, started

    def _on_readable(self, process: WorkerProcess) -> None:
        try:
            data = os.read(process.result_fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._on_exit(process)
            return
        for message in self._readers[process.id].feed(data):
            if isinstance(message, BatchDone):
                self._on_batch_done(message)
            elif isinstance(message, RowsDone):
                self._on_rows_done(message)
            elif isinstance(message, WorkerReady):
                self._on_ready(process, message)
            elif isinstance(message, WorkerFailed):
                self._start_errors[process.id] = message.error

    def _on_ready(self, process: WorkerProcess, message: WorkerReady) -> None:
        self.workers[process.id] = WorkerInfo(
            process.id, message.pid, process.spec.batch, message.threads, message.cpus, message.workspace_bytes
        )
        worker_set = self._set_of[process.id]  # a retiring worker's set is never the active one
        if worker_set == self._active_set:
            self.scheduler.add_worker(WorkerSlot(process.id, process.spec.batch, process.spec.threads))
        elif worker_set < self._active_set and process.id not in self._retiring:
            self._retire(process.id, idle=True)  # a replacement forked for a set that was switched away meanwhile
        self._start_failures = 0
        if self.state is EngineState.UNAVAILABLE and worker_set == self._active_set:
            self.state, self._unavailable = EngineState.READY, ""
            log.info("a worker restarted; model ready again", extra={"model": self.model.name})
        self._starting.pop(process.id).set_result(None)
        self._pump()

    def _on_batch_done(self, message: BatchDone) -> None:
        now = time.monotonic()
        batch = self.scheduler.finish(message.batch_id, now=now)
        if self.idle_spin_us:
            self.scheduler.cores.measure(now)
        if batch.worker_id in self._retiring:
            self._processes[batch.worker_id].stop()  # its set was replaced while it ran this batch
        self.stats.record_batch(batch.rows, message.compute_ns)
        for counts in message.early_exit:
            self.stats.early_exit.add(counts)
            if self.adaptation is not None:
                self.adaptation.observe(counts)
        for row_parameters in message.parameters:
            slot = batch.start + row_parameters.offset
            owner = self._owners[slot]
            if owner is not None:
                owner.record(slot, row_parameters.rows, row_parameters.values)
        ended_ns = message.started_ns + message.compute_ns
        for index, (pending, _, rows) in enumerate(list(self._requests_in(batch))):
            pending.computed(message.started_ns, ended_ns)
            pending.outstanding -= rows
            if message.errors is not None and message.errors[index] is not None:
                pending.error, pending.reason = message.errors[index], "model_error"
            if pending.outstanding == 0:
                self._complete(pending)
        self.scheduler.cores.pump()  # freed threads: this model's rows or another's, the longest-waiting first

    def _on_rows_done(self, message: RowsDone) -> None:
        """Requests a learned cache answered while the rest of their batch runs on: answer them now (their slots
        are freed with the batch). A request with rows in another batch too keeps this part's parameters and waits
        for all of its batches."""
        batch = self.scheduler.running(message.batch_id)
        if batch is None:
            return  # abandoned: its worker died, and its rows run again
        for answered in message.answered:
            slot = batch.start + answered.offset
            pending = self._owners[slot]
            if pending is None or pending.answered:
                continue  # answered already (its rows ran again after an error in their batch)
            pending.record(slot, answered.rows, answered.values)
            pending.computed(message.started_ns, message.answered_ns)
            if (pending.start, pending.rows) == (slot, answered.rows):
                self._answer(pending)

    def _on_exit(self, process: WorkerProcess) -> None:
        """A worker's pipe closed: it stopped or died. Re-run what it held and replace it if serving."""
        self._loop.remove_reader(process.result_fd)
        process.close()
        self._processes.pop(process.id)
        self._readers.pop(process.id)
        self.workers.pop(process.id, None)
        held = self.scheduler.remove_worker(process.id)
        if held is not None:
            self._recover(held, process.pid)
        started = self._starting.pop(process.id, None)
        if started is not None:
            error = self._start_errors.pop(process.id, f"worker {process.pid} exited before it was ready")
            started.set_exception(ConfigError(f"model '{self.model.name}': worker could not start: {error}"))
            started.exception()  # retrieved here; start() re-raises it when it is waiting for this worker
            self._start_failures += 1
            self._check_serving(error)
        if not self._processes:
            self._gone.set()
        # Only the active set's workers are replaced: a standby worker that dies fails its set's switch (see
        # switch_workers), and an old set's is not needed.
        active = self._set_of.pop(process.id) == self._active_set
        self._retiring.discard(process.id)
        if self.loaded and active:
            self._replace(process)
        self.scheduler.cores.pump()

    def _replace(self, process: WorkerProcess) -> None:
        """Start a worker in place of one that exited: at once, or, after starts that failed in a row, once their
        backoff has passed."""
        self.stats.worker_restarts += 1
        log.warning(
            "worker exited; restarting",
            extra={"model": self.model.name, "pid": process.pid, "batch": process.spec.batch},
        )
        self._respawn(process.spec)

    def _respawn(self, spec: WorkerSpec) -> None:
        delay_s = 0.0 if not self._start_failures else RESTART_BACKOFF_S * 2 ** (self._start_failures - 1)
        delay_s = min(delay_s, RESTART_BACKOFF_MAX_S)
        task = self._loop.create_task(self._spawn_after(delay_s, spec, self._active_set))
        self._keep(task)
        task.add_done_callback(lambda done: self._restarted(done, spec))

    async def _spawn_after(self, delay_s: float, spec: WorkerSpec, set_id: int) -> None:
        """A replacement for a worker of set `set_id`, unless the model is unloading or another set took over by
        then (that set has its own workers)."""
        await asyncio.sleep(delay_s)
        if self.loaded and set_id == self._active_set:
            await self._spawn(spec, set_id)

    def _restarted(self, task: asyncio.Task[None], spec: WorkerSpec) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is None or not self.loaded:
            return
        self._start_failures += 1
        log.error(
            "cannot restart worker; trying again",
            extra={"model": self.model.name, "error": str(error), "failures_in_a_row": self._start_failures},
        )
        self._check_serving(str(error))
        self._respawn(spec)

    def _check_serving(self, error: str) -> None:
        """After a failed start: with no worker of the active set serving and starts failing in a row, the model
        cannot serve at all, and says so (its queued requests are answered with why)."""
        serving = any(self._set_of.get(worker) == self._active_set for worker in self.workers)
        if serving or self._start_failures < MAX_START_FAILURES or self.state is not EngineState.READY:
            return
        self._unavailable = f"no worker could be started ({self._start_failures} tries in a row: {error}); retrying"
        log.error("no worker serves; model unavailable", extra={"model": self.model.name, "error": error})
        self.state = EngineState.UNAVAILABLE
        self._fail_everything(self._unavailable)

    def _recover(self, batch: Batch, pid: int) -> None:
        """Rows of a batch whose worker died: run them again, or fail requests that already killed a worker."""
        delivered = batch.id not in self._undelivered
        self._undelivered.discard(batch.id)
        again: list[tuple[int, int, float, int]] = []
        for pending, slot, rows in list(self._requests_in(batch)):
            if delivered:
                pending.deaths.add(pid)
            if len(pending.deaths) < MAX_RUNS:
                again.append((slot, rows, time.monotonic(), pending.level))
                continue
            pending.error = f"worker process {pid} died while computing this request ({len(pending.deaths)} times)"
            pending.reason = "worker_died"
            pending.outstanding -= rows
            if pending.outstanding == 0:
                self._complete(pending)
        for slot, rows, arrived, level in reversed(again):
            self.scheduler.requeue_front(slot, rows, arrived, level)

    # -- answers ---------------------------------------------------------------------------------------------
    def _complete(self, pending: PendingRequest) -> None:
        """All the request's rows are done: answer it (unless a learned cache did already) and free its slots."""
        if not pending.answered:
            self._answer(pending)
        self._owners[pending.start : pending.start + pending.rows] = [None] * pending.rows
        self._ring.free(pending.start, pending.rows)
        if self._ring.in_use == 0:
            self._idle.set()
        self._admit_waiting()

    def _answer(self, pending: PendingRequest) -> None:
        now_ns = time.perf_counter_ns()
        pending.answered = True
        ok = pending.error is None
        if not pending.future.done():
            if ok:
                end = pending.start + pending.rows
                outputs = [ring[pending.start : end].copy() for ring in self.rings.outputs]
                parameters = combine([pending.parts[slot] for slot in sorted(pending.parts)], self.exit_blocks)
                times = RequestTimes(pending.arrived_ns, pending.compute_start_ns, pending.compute_end_ns)
                pending.future.set_result(EngineResult(outputs, parameters, times))
            else:
                failure = OverloadedError if pending.reason == "timeout" else InferenceError
                pending.future.set_exception(failure(f"model '{self.model.name}': {pending.error}"))
        self.stats.record_request(
            ok=ok,
            total_ns=now_ns - pending.arrived_ns,
            queue_ns=(pending.dispatched_ns or now_ns) - pending.arrived_ns,
            reason=pending.reason,
        )
        self.stats.last_inference_ms = int(time.time() * 1000)

    def _fail_everything(self, reason: str) -> None:
        for pending in {p for p in self._owners if p is not None}:
            if not pending.future.done():
                pending.future.set_exception(ModelNotReadyError(f"model '{self.model.name}': {reason}"))
        for _, future in self._waiting:
            if not future.done():
                future.set_exception(ModelNotReadyError(f"model '{self.model.name}': {reason}"))
        self._waiting.clear()


def _adaptation_service(
    model: ModelSpec, settings: AdaptationSpec, reload: Callable[[], None], retrainings: RetrainingStats
) -> CacheAdaptation:
    from adaserve.adaptive.gati.service import CacheAdaptation

    return CacheAdaptation(model, settings, reload, retrainings)


def idle_spin_in_force(config: ModelConfig) -> int:
    """How long a worker polls for its next batch (`batching.idle_spin_us`). Not on CUDA, where a worker is a thread
    of the host and polling would hold the interpreter the others need; not with one CPU, where the poller would
    hold the core the frontend needs to hand it the request."""
    if config.device != "cpu" or len(os.sched_getaffinity(0)) < 2:
        return 0
    return config.batching.idle_spin_us
