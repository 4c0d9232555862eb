"""What each model a node holds can serve, and has waiting: the inputs of the controller's replication.

A replica's capacity is measured, not configured: the requests its workers answered per second of compute time
over the last report, times the workers its scheduler lets run at once. It is what the replica would serve were its
workers never idle, at the batch sizes the load gave it (Packrat's batch-size estimator has already grown those as
far as the queue let it). The queue is the rows waiting in the model's input pool now. A model that computed
nothing since the last report says nothing of its capacity.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from adaserve.engine.engine import ModelEngine


@dataclass(frozen=True)
class _Counters:
    compute_ns: int
    requests: int


class LoadMeter:
    """Samples the engines' counters at each report and gives each model's queue and measured capacity."""

    def __init__(self) -> None:
        self._last: dict[str, _Counters] = {}

    def sample(self, engines: Mapping[str, ModelEngine]) -> tuple[dict[str, int], dict[str, float]]:
        """Per model: rows queued now, and requests a second one replica serves (only where it computed)."""
        queued: dict[str, int] = {}
        capacity: dict[str, float] = {}
        last, self._last = self._last, {}
        for name, engine in engines.items():
            stats = engine.stats
            now = _Counters(stats.compute.ns, stats.success.count)
            self._last[name] = now
            queued[name] = engine.scheduler.ready
            before = last.get(name)
            if before is None:
                continue
            compute_ns, requests = now.compute_ns - before.compute_ns, now.requests - before.requests
            if compute_ns > 0 and requests > 0:
                workers = engine.scheduler.max_busy_threads or len(engine.worker_set.workers)
                capacity[name] = requests / (compute_ns / 1e9) * workers
        return queued, capacity
