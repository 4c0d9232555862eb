"""Packrat's batch-size estimator (§3.8): when has the load moved enough to warrant a new worker set?

Reconfiguring takes seconds, so the estimate is smoothed twice to avoid flip-flopping: an EWMA of the queue depth
(Q̂_x = α·Q + (1 − α)·Q̂_{x−1}) rounded down to a power of two gives B̂_x, and the mode of the last n such
estimates gives B̃. Once per reconfiguration timeout, if B̃ differs from the batch size the current worker set was
planned for, the optimizer is asked for B̃. Pure logic: the caller passes the clock in, so tests steer time.

A capacity floor the paper does not have: the queue depth says nothing about the arrival rate, and a set planned
for a smaller B is also a set that computes fewer rows per second. Read off a shallow queue, B̃ can fall to a set
that cannot keep up with the load the larger set was handling; the queue then grows, B̃ climbs, and the sets
flip-flop (a ResNet-18 timeline switched 7 times in 160 s, 16 → 8 → 64 → 32 → 16 → 8 → 16, in
benchmarks/results/packrat_reconfiguration-no-floor.json). So a move to a smaller B is taken only when that set's
planned rows per second (B over its expected batch latency) is at least `capacity_headroom` × the rows per second
that arrived over the last reconfiguration timeout; otherwise the next larger B that is, if any is below the
current. The headroom covers what the profile does not see (the server and protocol around the model). A move to
a larger B is held to the same floor, with one way out: a set that can take more rows per second than the current
one is taken even below the floor, since it is the better of the two. A set that does neither is not switched to
(a bad profile once planned one batch-1 worker under 300 req/s, and p99 rose to 40 ms). Each move the floor holds
back is logged at info, with both sets' rows per second and the rate.

The profile over-promises, though: it times one worker's full batches, while the server runs partial ones and
shares the cores with its frontend. On 2 cores the B = 8 set of ResNet-18 plans 435 rows/s and answers 264-287
req/s, so at 282 req/s the floor let B fall from 16 to 8, whose queue then outgrew it, and B went 8 ↔ 16 nine times
in 160 s (`packrat_reconfiguration-no-limits-r2.json`). So the floor also remembers what it saw: when the
estimator leaves a set for a larger one, the arrival rate then is that set's observed limit, and its capacity
counts as no more than that until it is seen keeping up (a check that asks for no larger B while at least that
rate arrives forgets the limit). A set is not returned to at the load it was just left at.

The timeout paces moves down well (the paper's flip-flop), but a set that falls behind piles up a backlog until the
next check: a step up in the load came 0.3 s after one, and the B = 16 set's queue grew for 10 s before B moved
(`packrat_reconfiguration-timeout-only.json`: the high phase's p99 was 1,102 ms, against 401 ms with this rule).
So a B̃ that has outgrown B `overload_factor` times (4: two powers of two) is acted on once `overload_after_s`
(2 s) have passed since the last check. The mode over the last n estimates still has to agree, so a burst shorter
than half the window does not move B.
"""

from __future__ import annotations

import logging
import math
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["ArrivalRate", "BatchSizeEstimator", "EstimatorSettings", "Reconfigurator", "power_of_two_floor"]

PlanT = TypeVar("PlanT")
log = logging.getLogger("adaserve.packrat")


def power_of_two_floor(value: float) -> int:
    """The largest power of two ≤ `value`, and 1 for anything below 2 (an idle queue still runs batches of 1)."""
    if value < 2:
        return 1
    return 1 << (int(value).bit_length() - 1)


@dataclass(frozen=True)
class EstimatorSettings:
    alpha: float = 0.3  # EWMA weight of the newest queue depth
    window: int = 16  # n: the mode is taken over this many estimates
    reconfigure_timeout_s: float = 10.0  # the estimate is compared with the configured B this often
    max_batch: int | None = None  # B̂ is capped here (T × the largest worker batch), then rounded down
    capacity_headroom: float = 1.5  # a smaller set must plan this × the arrival rate; 0: no capacity floor
    overload_factor: float = 4.0  # B̃ this × B is acted on after `overload_after_s`, not the timeout; 0: never
    overload_after_s: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha}")
        if self.window < 1:
            raise ValueError(f"window must be ≥ 1, got {self.window}")
        if self.reconfigure_timeout_s < 0:
            raise ValueError(f"reconfigure_timeout_s must be ≥ 0, got {self.reconfigure_timeout_s}")
        if self.max_batch is not None and self.max_batch < 1:
            raise ValueError(f"max_batch must be ≥ 1, got {self.max_batch}")
        if self.capacity_headroom < 0:
            raise ValueError(f"capacity_headroom must be ≥ 0, got {self.capacity_headroom}")
        if self.overload_factor < 0 or 0 < self.overload_factor <= 1:
            raise ValueError(f"overload_factor must be 0 (off) or > 1, got {self.overload_factor}")
        if self.overload_after_s < 0:
            raise ValueError(f"overload_after_s must be ≥ 0, got {self.overload_after_s}")


class BatchSizeEstimator:
    """Feed it queue depths with `observe`; ask `due(now)` once in a while, and move when B̃ differs from B."""

    def __init__(self, settings: EstimatorSettings, *, current_batch: int, now: float) -> None:
        self.settings = settings
        self.current_batch = current_batch  # B: what the running worker set was planned for
        self.ewma: float | None = None  # Q̂
        self.estimates: deque[int] = deque(maxlen=settings.window)  # B̂_{x−n}..B̂_x
        self._last_check = now

    def observe(self, queue_depth: float) -> int:
        """Record the newest queue depth Q; returns this step's estimate B̂_x."""
        alpha = self.settings.alpha
        self.ewma = queue_depth if self.ewma is None else alpha * queue_depth + (1 - alpha) * self.ewma
        capped = self.ewma if self.settings.max_batch is None else min(self.ewma, self.settings.max_batch)
        estimate = power_of_two_floor(capped)
        self.estimates.append(estimate)
        return estimate

    @property
    def smoothed(self) -> int:
        """B̃: the most frequent recent estimate; a tie keeps the current B if it is among the tied, else the newest."""
        if not self.estimates:
            return self.current_batch
        counts = Counter(self.estimates)
        top = max(counts.values())
        tied = {b for b, n in counts.items() if n == top}
        if self.current_batch in tied:
            return self.current_batch
        return next(b for b in reversed(self.estimates) if b in tied)

    def due(self, now: float) -> int | None:
        """B̃ if a reconfiguration timeout has passed since the last check (which this starts again), or sooner if
        the set is overloaded; else None."""
        settings, elapsed = self.settings, now - self._last_check
        if elapsed < settings.reconfigure_timeout_s and not (elapsed >= settings.overload_after_s and self.overloaded):
            return None
        self._last_check = now
        return self.smoothed

    @property
    def overloaded(self) -> bool:
        """B̃ has outgrown B `overload_factor` times: the set falls behind, and waiting out the timeout only lets the
        backlog grow."""
        factor = self.settings.overload_factor
        return factor > 0 and self.smoothed >= factor * self.current_batch

    def reconfigured(self, batch: int, now: float) -> None:
        """The worker set for `batch` is now running; the next check is a full timeout away."""
        self.current_batch = batch
        self._last_check = now


class ArrivalRate:
    """Rows per second that arrived over the last `window_s` (the reconfiguration timeout: the span each decision
    covers), from a running count of arrived rows. A window, not an EWMA of 0.1 s samples: a Poisson dip of a
    second must not let the floor pass a set too small for the load."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._counts: deque[tuple[float, int]] = deque()  # (time, rows arrived so far), oldest first

    def observe(self, arrived_rows: int, now: float) -> float | None:
        self._counts.append((now, arrived_rows))
        while len(self._counts) > 2 and now - self._counts[1][0] >= self.window_s:
            self._counts.popleft()  # keep one sample at or beyond the window's start
        began, first = self._counts[0]
        return (arrived_rows - first) / (now - began) if now > began else None


class Reconfigurator(Generic[PlanT]):
    """Estimator and optimizer together: `update(queue_depth, arrived_rows, now)` returns a new plan when one is due.

    `plan_for(B)` is e.g. `functools.partial(optimizer.plan, T)` or `AutoPlanner.plan` (plan plus pinned workers);
    `rows_per_second(plan)` is what a plan is expected to compute (None: unknown, no capacity floor). Once it
    returns, the plan's B counts as configured; the caller starts the new worker set (active/passive swap).
    `plan_for` is called again for the sets it compares, so it should be cached (the optimizer's plans are).
    `limits` holds each set's observed limit (see the module docstring), and `capacity` what the floor counts.
    """

    def __init__(
        self,
        estimator: BatchSizeEstimator,
        plan_for: Callable[[int], PlanT],
        rows_per_second: Callable[[PlanT], float | None] = lambda plan: None,
        *,
        model: str | None = None,
    ) -> None:
        self.estimator = estimator
        self.model = model  # named in the log lines
        self.plan_for = plan_for
        self.rows_per_second = rows_per_second
        self.arrivals = ArrivalRate(max(estimator.settings.reconfigure_timeout_s, 1.0))
        self.limits: dict[int, float] = {}  # B → the rows/s arriving when its set was left for a larger one

    def update(self, queue_depth: float, arrived_rows: int, now: float) -> PlanT | None:
        self.estimator.observe(queue_depth)
        rate = self.arrivals.observe(arrived_rows, now)
        batch = self.estimator.due(now)
        if batch is None:
            return None
        current = self.estimator.current_batch
        self._learn(current, batch, rate)
        if batch == current:
            return None
        wanted, plan = batch, self.plan_for(batch)
        while batch < current and not self._keeps_up(batch, plan, rate):
            batch *= 2  # the capacity floor (see the module docstring)
            plan = self.plan_for(batch)
        held = batch == current
        if batch > current and not self._keeps_up(batch, plan, rate):
            held = not self._beats(batch, plan, current)
        if held:
            self._log_held(wanted, current, rate)
            return None
        self.estimator.reconfigured(batch, now)
        return plan

    def _learn(self, current: int, wanted: int, rate: float | None) -> None:
        """The current set's observed limit: the rate at which the estimator wants a larger one, forgotten once it
        asks for none at that rate or more."""
        if rate is None:
            return
        if wanted > current:
            self.limits[current] = rate
        elif rate >= self.limits.get(current, math.inf):
            del self.limits[current]

    def capacity(self, batch: int, plan: PlanT) -> float | None:
        """Rows per second the set for `batch` can take: its plan's, capped at its observed limit."""
        planned = self.rows_per_second(plan)
        limit = self.limits.get(batch)
        return planned if planned is None or limit is None else min(planned, limit)

    def _keeps_up(self, batch: int, plan: PlanT, rate: float | None) -> bool:
        capacity = self.capacity(batch, plan)
        headroom = self.estimator.settings.capacity_headroom
        return capacity is None or rate is None or capacity >= headroom * rate

    def _beats(self, batch: int, plan: PlanT, current: int) -> bool:
        capacity, current_capacity = self.capacity(batch, plan), self.capacity(current, self.plan_for(current))
        return capacity is None or current_capacity is None or capacity > current_capacity

    def _log_held(self, wanted: int, current: int, rate: float | None) -> None:
        log.info(
            "keeping the worker set for B=%d (%s rows/s planned) rather than B=%d (%s rows/s%s): a set must plan "
            "%g × the %s rows/s arriving, or more than the current set",
            current,
            _rows(self.rows_per_second(self.plan_for(current))),
            wanted,
            _rows(self.rows_per_second(self.plan_for(wanted))),
            "" if wanted not in self.limits else f", left at {self.limits[wanted]:.1f}",
            self.estimator.settings.capacity_headroom,
            _rows(rate),
            extra={"model": self.model, "batch": current, "wanted_batch": wanted},
        )


def _rows(per_second: float | None) -> str:
    return "unknown" if per_second is None else f"{per_second:.1f}"
