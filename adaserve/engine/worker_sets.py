"""Which workers exist: a worker-set planner behind one narrow interface, so the baseline is a config value.

* `FixedWorkerSet` — the configured `workers`, or Ebird's granularities 1,1,2,4,8,16 capped at `max_batch_size`
  (on a CPU, the largest of them as many as may compute at once: `ModelConfig.worker_set`); it never changes.
* `StreamProfileWorkerSet` — a CUDA model with no `workers` line: one set and MaxInf, chosen as the model loads
  from this GPU's stream profile (`adaserve.engine.stream_choice`), measured first if there is none.
* `PackratWorkerSet` — `workers: auto`: the set ⟨instances, threads, batch⟩ the Packrat optimizer picks from the
  model's profile for the batch size the estimator reads off the queue depth, pinned to disjoint cores; when the
  smoothed batch size moves, it answers with a new set and the engine swaps sets with no downtime. A profile with
  unstable cells is not planned from (the fat instance is the stated default, its reason naming the cells).

* `ProfilingWorkerSet` — a CPU model with no `workers` line and no usable profile: the default set at once, while
  this machine's profile is measured in the background at the lowest CPU priority; once a profile settles, Packrat's
  plan, and from then on `PackratWorkerSet` (with a usable profile at start, such a model is Packrat's at once).

The engine asks `initial()` once, then `prepare()` off the event loop (a set that replaces it, if any) and, for
planners with a `sample_interval_s`, feeds `observe(queue_depth, arrived_rows, now)`; `close()` when it stops.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from adaserve.config import WorkerSpec, cpu_busy_threads
from adaserve.repository import ModelSpec

if TYPE_CHECKING:
    import subprocess

    from adaserve.cpu import AutoPlanner

log = logging.getLogger("adaserve.engine")

#: Why the default set (`ModelConfig.worker_set`) is the one it is.
DEFAULT_SET = "Ebird's granularities sized to the busy-thread limit"

#: Held while a background profile is measured: one at a time in a server, as two at once would share cores (each
#: pins its t = 1 process to the first) and time each other.
_ONE_PROFILE = threading.Lock()


@dataclass(frozen=True)
class WorkerSetChoice:
    """A worker set and why it was chosen (shown in logs, in /metrics and by the model configuration endpoint)."""

    workers: tuple[WorkerSpec, ...]
    reason: str
    batch: int | None = None  # the batch size B the set was planned for (Packrat)
    details: dict[str, Any] = field(default_factory=dict)
    max_inflight: int | None = None  # MaxInf chosen with the set (a GPU's stream profile); None: the set's rows


class WorkerSetPlanner(ABC):
    name: str
    #: None: the set never changes; otherwise how often the engine reports the queue depth.
    sample_interval_s: float | None = None
    #: What the planner is doing meanwhile (a background profile), for the worker-set document; None: nothing.
    background: str | None = None

    @abstractmethod
    def initial(self) -> WorkerSetChoice: ...

    def prepare(self) -> WorkerSetChoice | None:
        """Work before the first set starts, off the event loop (a GPU's stream profile); a set that replaces
        `initial()`'s, or None."""
        return None

    @abstractmethod
    def max_rows_in_flight(self) -> int:
        """The most rows any set this planner may choose can compute at once (the input pool is sized for it)."""

    def observe(self, queue_depth: float, arrived_rows: int, now: float) -> WorkerSetChoice | None:
        """A new set when the load calls for one (`arrived_rows`: rows accepted so far); None to keep the current
        set."""
        return None

    def default_busy_threads(self) -> int:
        """`batching.max_busy_threads` on a CPU when the config leaves it out (`cpu_busy_threads`)."""
        return cpu_busy_threads()

    def close(self) -> None:  # noqa: B027 (most planners run nothing in the background)
        """End what the planner runs in the background (the engine is stopping)."""


class FixedWorkerSet(WorkerSetPlanner):
    name = "fixed"

    def __init__(self, model: ModelSpec) -> None:
        self.config = model.config

    def initial(self) -> WorkerSetChoice:
        reason = "configured workers" if self.config.workers else DEFAULT_SET
        return WorkerSetChoice(self.config.worker_set, reason)

    def max_rows_in_flight(self) -> int:
        return self.config.inflight_limit


class PackratWorkerSet(WorkerSetPlanner):
    name = "packrat"

    def __init__(self, model: ModelSpec, planner: AutoPlanner | None = None) -> None:
        """`planner`: the model's, if the caller has made it (it has read the profile)."""
        from adaserve.cpu import AutoPlanner, BatchSizeEstimator, EstimatorSettings, Reconfigurator

        config = model.config
        settings = config.packrat
        self.config = config
        self.planner = planner or AutoPlanner(model, threads=settings.threads)
        self.sample_interval_s = settings.sample_interval_s
        self.initial_batch = settings.initial_batch or config.max_batch_size
        estimator = BatchSizeEstimator(
            EstimatorSettings(
                alpha=settings.ewma_alpha,
                window=settings.window,
                reconfigure_timeout_s=settings.reconfigure_timeout_s,
                max_batch=self.max_rows_in_flight(),
                capacity_headroom=settings.capacity_headroom,
                overload_factor=settings.overload_factor,
                overload_after_s=settings.overload_after_s,
            ),
            current_batch=self.initial_batch,
            now=time.monotonic(),  # the engine's clock: the first check is a full timeout after the start
        )
        self.reconfigurator = Reconfigurator(estimator, self._choose, _rows_per_second, model=model.name)
        for warning in self.planner.warnings:  # what `adaserve plan` repeats, said where a server's operator looks
            log.warning("Packrat profile: %s", warning, extra={"model": model.name})

    def initial(self) -> WorkerSetChoice:
        return self._choose(self.initial_batch)

    def max_rows_in_flight(self) -> int:
        """T workers of max_batch_size rows each at most (a plan never uses more than T threads)."""
        return self.planner.threads * self.config.max_batch_size

    def observe(self, queue_depth: float, arrived_rows: int, now: float) -> WorkerSetChoice | None:
        return self.reconfigurator.update(queue_depth, arrived_rows, now)

    def default_busy_threads(self) -> int:
        """T: a Packrat plan's instances share T threads and are meant to run all at once."""
        return self.planner.threads

    def _choose(self, batch: int) -> WorkerSetChoice:
        chosen = self.planner.plan(batch)
        plan = chosen.plan
        summary = " + ".join(f"⟨{i},{t},{b}⟩" for i, t, b in plan.triples)
        details = {
            "instances": [list(triple) for triple in plan.triples],
            "expected_latency_ms": round(plan.latency_s * 1e3, 4),
            "fat_instance_latency_ms": None if plan.fat_latency_s is None else round(plan.fat_latency_s * 1e3, 4),
            "expected_speedup": None if plan.speedup is None else round(plan.speedup, 3),
            "threads": self.planner.threads,
            "from_profile": chosen.from_profile,
        }
        return WorkerSetChoice(
            tuple(chosen.workers), f"Packrat plan {summary} for B={batch}: {chosen.note}", batch, details
        )


def _rows_per_second(choice: WorkerSetChoice) -> float | None:
    """What a planned set is expected to compute: B rows per expected batch latency (None without a profile)."""
    latency_ms = choice.details.get("expected_latency_ms")
    if not choice.details.get("from_profile") or choice.batch is None or not latency_ms:
        return None
    return float(choice.batch / (latency_ms / 1e3))


class ProfilingWorkerSet(WorkerSetPlanner):
    """The default set now, Packrat's plan once this machine's profile, measured in the background, settled.

    The profile is measured once the model serves (the first `observe`), in a thread that waits on the profiler's
    child, which the server's zygote forks and which runs at the lowest CPU priority (`idle_runner`): serving comes
    first, and the child shares the zygote's torch rather than importing its own. A profile with unstable cells
    is stored but not planned from (other work disturbed it, most likely): measured again after `profile_retry_s`,
    doubling, `profile_attempts` in all, and then the default set stays. Each attempt first looks for a usable
    profile (`adaserve profile` may have been run meanwhile). The server's models are profiled one at a time.
    """

    name = "default"

    def __init__(self, model: ModelSpec, why: str) -> None:
        """`why`: why there is no usable profile now."""
        from adaserve.cpu import machine_topology, packrat_threads

        settings = model.config.packrat
        self.model = model
        self.sample_interval_s = settings.sample_interval_s
        self.threads = packrat_threads(settings.threads, machine_topology())
        self.background = f"profiling in the background ({why})"
        self.packrat: PackratWorkerSet | None = None  # the planner from the profile, once switched to
        self._planned: PackratWorkerSet | None = None  # made by the profiling thread, taken by `observe`
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()
        self.profiler_pid: int | None = None  # the profiler's child while one runs: its process group's ID too
        log.info("default set; profiling in the background: %s", why, extra={"model": model.name})

    def initial(self) -> WorkerSetChoice:
        return WorkerSetChoice(
            self.model.config.worker_set,
            f"default set ({DEFAULT_SET}); profiling in the background",
        )

    def max_rows_in_flight(self) -> int:
        """The default set's, or a Packrat plan's T workers of max_batch_size rows, whichever is more."""
        config = self.model.config
        return max(config.inflight_limit, self.threads * config.max_batch_size)

    def default_busy_threads(self) -> int:
        """The default set's, then Packrat's T."""
        return super().default_busy_threads() if self.packrat is None else self.packrat.default_busy_threads()

    def observe(self, queue_depth: float, arrived_rows: int, now: float) -> WorkerSetChoice | None:
        if self.packrat is not None:
            return self.packrat.observe(queue_depth, arrived_rows, now)
        if self._thread is None:  # the model serves: measure from now on
            self._thread = threading.Thread(target=self._profile, name=f"profile {self.model.name}", daemon=True)
            self._thread.start()
        if self._planned is None:
            return None
        self.packrat, self.name, self.background = self._planned, self._planned.name, None
        return self.packrat.initial()

    def close(self) -> None:
        self._closed.set()
        self._end_child()

    def _profile(self) -> None:
        """Attempts until one gives a plan, the attempts run out, or the engine stops."""
        settings = self.model.config.packrat
        wait_s = settings.profile_retry_s
        measuring = self.background  # "profiling in the background (why there is no usable profile)"
        for attempt in range(1, settings.profile_attempts + 1):
            if not self._take_turn():
                return
            if attempt > 1:
                measuring = f"profiling in the background again (attempt {attempt} of {settings.profile_attempts})"
            self.background = measuring
            try:
                why = self._attempt()
            except Exception as exc:  # a failed profile leaves the default set serving, and says why
                why = f"profiling failed: {exc}"
            finally:
                _ONE_PROFILE.release()
            if why is None or self._closed.is_set():
                return
            # Logged before it is shown: whoever reads `background` finds the log line already written.
            if attempt == settings.profile_attempts:
                gave_up = (
                    f"{why}; gave up after {attempt} background profile(s): the default set stays; run "
                    f"`adaserve profile {self.model.name}` on an idle machine to plan from a profile"
                )
                log.info("%s", gave_up, extra={"model": self.model.name})
                self.background = gave_up
                return
            retrying = f"{why}; retrying in {wait_s:g} s"
            log.info("%s", retrying, extra={"model": self.model.name})
            self.background = retrying
            if self._closed.wait(wait_s):
                return
            wait_s *= 2

    def _take_turn(self) -> bool:
        """Wait until no other model of this server is being profiled; False if the engine stopped meanwhile."""
        if _ONE_PROFILE.acquire(blocking=False):
            return True
        self.background = "waiting for another model's background profile to finish"
        while not _ONE_PROFILE.acquire(timeout=0.5):
            if self._closed.is_set():
                return False
        return True

    def _attempt(self) -> str | None:
        """Plan from this machine's profile, measuring and storing one first if there is no usable one; None once
        planned (for `observe` to switch to), else why not."""
        from adaserve.cpu import ProfileSettings, idle_runner, profile_model, save_profile, unstable_reason

        planner = self._usable_profile()
        if planner is None:
            stability = self.model.config.packrat.profile_stability_percentage
            settings = ProfileSettings.for_run(quick=False, stability_percentage=stability)
            try:
                record = profile_model(
                    self.model, self.threads, settings, progress=False, runner=idle_runner(self._started)
                )
            finally:
                self.profiler_pid = None
            save_profile(self.model.directory, record)  # stored even if unstable, as `adaserve profile` stores it
            unstable = unstable_reason(record)
            if unstable is not None:
                return f"profile unstable: {unstable}"
            planner = self._usable_profile()
            if planner is None:
                return "the model changed while it was profiled"
        assert planner.record is not None
        self._planned = PackratWorkerSet(self.model, planner)
        log.info(
            "Packrat plan from the profile of %s; switching from the default set",
            planner.record.created,
            extra={"model": self.model.name},
        )
        return None

    def _usable_profile(self) -> AutoPlanner | None:
        """The model's planner if this machine has a usable profile of it (a corrupt one is not: it is replaced)."""
        from adaserve.cpu import AutoPlanner, ProfileError

        try:
            planner = AutoPlanner(self.model, threads=self.threads)
        except ProfileError:
            return None
        return planner if planner.record is not None else None

    def _started(self, pid: int) -> None:
        self.profiler_pid = pid
        if self._closed.is_set():  # closed while it started
            self._end_child()

    def _end_child(self) -> None:
        child = self.profiler_pid
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child, signal.SIGKILL)


class StreamProfileWorkerSet(WorkerSetPlanner):
    """A CUDA model with no `workers` line: streams and MaxInf chosen from this GPU's stream profile
    (`adaserve.engine.stream_choice`), read or measured by a child process as the model loads (`prepare`), one
    model at a time (`stream_profile.server_profile`)."""

    name = "stream-profile"

    def __init__(self, model: ModelSpec) -> None:
        self.model = model
        self._child: subprocess.Popen[bytes] | None = None  # the profile's, while it measures
        self._closed = False

    def initial(self) -> WorkerSetChoice:
        """What the engine sizes itself with before `prepare` has chosen."""
        return WorkerSetChoice(self.model.config.worker_set, f"{DEFAULT_SET}, until the stream profile is read")

    def prepare(self) -> WorkerSetChoice:
        from adaserve.engine.stream_choice import WAIT_AND_RUN, choose_streams
        from adaserve.engine.stream_profile import server_profile

        config = self.model.config
        profile, source = server_profile(self.model, self._started)
        unstable = profile.unstable()
        if unstable:
            log.warning(
                "stream profile: cells whose trials did not agree: %s (other work on the GPU, most likely); "
                "planned from all the same, and measured again at the next load",
                ", ".join(unstable),
                extra={"model": self.model.name},
            )
        chosen = choose_streams(profile, config.batching.latency_target_ms)
        if not chosen.meets_target:
            log.warning("stream profile: %s", chosen.reason, extra={"model": self.model.name})
        details = {
            "expected_latency_ms": round(WAIT_AND_RUN * chosen.latency_s * 1e3, 4),
            "expected_rows_per_s": round(chosen.rows_per_s, 1),
            "latency_target_ms": config.batching.latency_target_ms,
            "meets_target": chosen.meets_target,
            "max_inflight": config.inflight_limit_for(chosen.workers, chosen.max_inflight),
            "unstable_cells": unstable,
        }
        reason = f"{chosen.reason}; from the {source}"
        if config.max_inflight is not None:
            reason += f"; max_inflight {config.max_inflight} configured"
        return WorkerSetChoice(chosen.workers, reason, details=details, max_inflight=chosen.max_inflight)

    def _started(self, child: subprocess.Popen[bytes]) -> None:
        self._child = child
        if self._closed:  # the load was given up while the child started
            child.kill()

    def close(self) -> None:
        """A load given up (cancelled, or past its time) while the profile measures: end the profile's child."""
        self._closed = True
        if self._child is not None and self._child.poll() is None:
            self._child.kill()

    def max_rows_in_flight(self) -> int:
        """Every stream of the default set with `max_batch_size` rows, at most (or the configured MaxInf)."""
        from adaserve.engine.stream_profile import stream_count

        config = self.model.config
        return config.max_inflight or stream_count(config) * config.max_batch_size


def create_worker_set_planner(model: ModelSpec) -> WorkerSetPlanner:
    """`workers: [...]` pins a set and `workers: auto` is Packrat's. A CUDA model that leaves `workers` out gets
    its set from the GPU's stream profile (`StreamProfileWorkerSet`). A CPU model that leaves `workers` out is
    Packrat's when this machine has a usable profile of it; without one it serves the default set, and with
    `packrat.background_profile` (the default) measures a profile meanwhile (`ProfilingWorkerSet`)."""
    from adaserve.cpu import AutoPlanner, ProfileError

    config = model.config
    if config.auto_workers:
        return PackratWorkerSet(model)
    if config.workers is not None:
        return FixedWorkerSet(model)
    if config.device == "cuda":
        return StreamProfileWorkerSet(model)
    try:
        planner = AutoPlanner(model, threads=config.packrat.threads)
    except ProfileError as exc:  # a corrupt profile.json: served meanwhile, the background profile replaces it
        log.warning("Packrat profile: %s", exc, extra={"model": model.name})
        why = str(exc)
    else:
        if planner.record is not None:
            return PackratWorkerSet(model, planner)
        assert planner.stale is not None
        why = planner.stale.reason
    return ProfilingWorkerSet(model, why) if config.packrat.background_profile else FixedWorkerSet(model)
