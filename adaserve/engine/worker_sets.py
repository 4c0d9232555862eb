"""Which workers exist: a worker-set planner behind one narrow interface, so the baseline is a config value.

* `FixedWorkerSet` — the configured `workers`, or Ebird's granularities 1,1,2,4,8,16 capped at `max_batch_size`
  (on a CPU, the largest of them as many as may compute at once: `ModelConfig.worker_set`); it never changes.
* `PackratWorkerSet` — `workers: auto`: the set ⟨instances, threads, batch⟩ the Packrat optimizer picks from the
  model's profile for the batch size the estimator reads off the queue depth, pinned to disjoint cores; when the
  smoothed batch size moves, it answers with a new set and the engine swaps sets with no downtime. A profile with
  unstable cells is not planned from (the fat instance is the stated default, its reason naming the cells).

The engine asks `initial()` once and, for planners with a `sample_interval_s`, feeds
`observe(queue_depth, arrived_rows, now)`.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from adaserve.config import WorkerSpec, cpu_busy_threads
from adaserve.repository import ModelSpec

log = logging.getLogger("adaserve.engine")


@dataclass(frozen=True)
class WorkerSetChoice:
    """A worker set and why it was chosen (shown in logs, in /metrics and by the model configuration endpoint)."""

    workers: tuple[WorkerSpec, ...]
    reason: str
    batch: int | None = None  # the batch size B the set was planned for (Packrat)
    details: dict[str, Any] = field(default_factory=dict)


class WorkerSetPlanner(ABC):
    name: str
    #: None: the set never changes; otherwise how often the engine reports the queue depth.
    sample_interval_s: float | None = None

    @abstractmethod
    def initial(self) -> WorkerSetChoice: ...

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


class FixedWorkerSet(WorkerSetPlanner):
    name = "fixed"

    def __init__(self, model: ModelSpec) -> None:
        self.config = model.config

    def initial(self) -> WorkerSetChoice:
        reason = "configured workers" if self.config.workers else "Ebird's granularities sized to the busy-thread limit"
        return WorkerSetChoice(self.config.worker_set, reason)

    def max_rows_in_flight(self) -> int:
        return self.config.inflight_limit


class PackratWorkerSet(WorkerSetPlanner):
    name = "packrat"

    def __init__(self, model: ModelSpec) -> None:
        from adaserve.cpu import AutoPlanner, BatchSizeEstimator, EstimatorSettings, Reconfigurator

        config = model.config
        settings = config.packrat
        self.config = config
        self.planner = AutoPlanner(model, threads=settings.threads)
        self.sample_interval_s = settings.sample_interval_s
        self.initial_batch = settings.initial_batch or config.max_batch_size
        estimator = BatchSizeEstimator(
            EstimatorSettings(
                alpha=settings.ewma_alpha,
                window=settings.window,
                reconfigure_timeout_s=settings.reconfigure_timeout_s,
                max_batch=self.max_rows_in_flight(),
                capacity_headroom=settings.capacity_headroom,
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


def create_worker_set_planner(model: ModelSpec) -> WorkerSetPlanner:
    return PackratWorkerSet(model) if model.config.auto_workers else FixedWorkerSet(model)
