"""Per-model counters the engine keeps; the server reads them for `/metrics` and the statistics extension.

Plain numbers, no Prometheus objects: the engine stays free of the frontend's concerns, and the metrics endpoint
renders these at scrape time.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field

from adaserve.engine.messages import ExitCounts

#: Bucket bounds (seconds) for queue, compute and request latency histograms.
LATENCY_BUCKETS_S = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)


@dataclass
class Histogram:
    """Cumulative-free bucket counts plus sum, as Prometheus histograms need."""

    bounds: tuple[float, ...] = LATENCY_BUCKETS_S
    counts: list[int] = field(init=False)  # one per bound, and one above the last
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value


@dataclass
class DurationCount:
    """Triton's statistics pair: how many, and their total duration."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int) -> None:
        self.count += 1
        self.ns += ns


@dataclass
class ExitStats:
    """GATI's learned caches, summed over batches (the engine) or counted in one batch (the worker): lookups and
    hits per exit block (hits/lookups is the block's hit rate; hits and `whole` are the exit histogram) and the live
    agreement of verified hits."""

    lookups: Counter[str] = field(default_factory=Counter)
    hits: Counter[str] = field(default_factory=Counter)
    whole: int = 0
    verified: int = 0
    agreed: int = 0

    def add(self, counts: ExitCounts) -> None:
        self.lookups.update(counts.lookups)
        self.hits.update(counts.hits)
        self.whole += counts.whole
        self.verified += counts.verified
        self.agreed += counts.agreed

    def message(self, target: float) -> ExitCounts:
        """These counts, of the plan for `target`, as the worker reports them with a batch."""
        return ExitCounts(target, dict(self.lookups), dict(self.hits), self.whole, self.verified, self.agreed)


@dataclass
class RetrainingStats:
    """GATI's cache retrainings of one model version: outcome (accepted, refused, failed) → retrainings, and the last
    one's duration. The router keeps them across engines: an accepted retraining reloads the model, so counted in
    the engine that ran it they would vanish with that engine, and no accepted one would ever be seen."""

    outcomes: Counter[str] = field(default_factory=Counter)
    last_s: float | None = None


@dataclass
class ModelStats:
    success: DurationCount = field(default_factory=DurationCount)
    fail: DurationCount = field(default_factory=DurationCount)
    queue: DurationCount = field(default_factory=DurationCount)
    compute: DurationCount = field(default_factory=DurationCount)
    inference_count: int = 0  # rows computed
    execution_count: int = 0  # batches run
    batches: Counter[int] = field(default_factory=Counter)  # executed batch size → batches
    batch_ns: Counter[int] = field(default_factory=Counter)  # executed batch size → compute ns
    failures: Counter[str] = field(default_factory=Counter)  # failure reason → requests
    queue_s: Histogram = field(default_factory=Histogram)
    compute_s: Histogram = field(default_factory=Histogram)
    request_s: Histogram = field(default_factory=Histogram)
    worker_restarts: int = 0
    host_restarts: int = 0  # model host processes started again after they died
    reconfigurations: int = 0  # worker sets switched (Packrat)
    delayed: int = 0  # requests whose queue timeout passed, moved behind their level (timeout_action: delay)
    last_inference_ms: int = 0
    early_exit: ExitStats = field(default_factory=ExitStats)
    cache_hit: DurationCount = field(default_factory=DurationCount)  # answered from the response cache: lookup time
    cache_miss: DurationCount = field(default_factory=DurationCount)  # not found, then run: lookup and insertion time

    def record_batch(self, rows: int, compute_ns: int) -> None:
        self.execution_count += 1
        self.inference_count += rows
        self.batches[rows] += 1
        self.batch_ns[rows] += compute_ns
        self.compute.add(compute_ns)
        self.compute_s.observe(compute_ns / 1e9)

    def record_cache_hit(self, lookup_ns: int) -> None:
        """A request the response cache answered: as in Triton's statistics, a success that spent no time queued."""
        self.cache_hit.add(lookup_ns)
        self.success.add(lookup_ns)
        self.queue.add(0)

    def record_request(self, *, ok: bool, total_ns: int, queue_ns: int, reason: str = "") -> None:
        (self.success if ok else self.fail).add(total_ns)
        if not ok:
            self.failures[reason] += 1
        self.queue.add(queue_ns)
        self.queue_s.observe(queue_ns / 1e9)
        self.request_s.observe(total_ns / 1e9)
