"""Packrat's optimizer (§3.3, appendix B): the worker set ⟨i, t, b⟩ that minimises batch latency for ⟨T, B⟩.

Pure functions over a `Profile`, the measured latency L[t, b] of one worker with t threads running a batch of b.
The knapsack is two-dimensional (threads, rows); the items are the profiled ⟨t, b⟩ cells, each usable any number
of times; a set of concurrent workers takes as long as its slowest member:

    opt[t, b] = min over profiled (t', b') of max(opt[t - t', b - b'], L[t', b']),   opt[t, 0] = 0

so the answer for ⟨T, B⟩ uses Σ i·t ≤ T threads and exactly Σ i·b = B rows, and may mix worker shapes (appendix B:
on T = 14, B = 16 the paper's optimizer picks ⟨1, 6, 8⟩ + ⟨2, 4, 4⟩). The table is filled once per T for every
b ≤ B with numpy (one vector operation per item and thread count), so T = 64, B = 256 takes well under a second;
plans are cached per ⟨T, B⟩ as the paper does.

Among plans of equal latency the optimizer prefers the one that uses more of the T threads (the paper's §3 states
Σ i·t = T), then the one whose workers' latencies sum lowest, so spare threads go to the workers that are not on
the critical path rather than idling. Table 2 of the paper relies on such ties: for T = 14, B = 16 its
⟨1, 6, 8⟩ + ⟨2, 4, 4⟩ can never beat ⟨2, 6, 8⟩ by Equation 1 (both hold a ⟨6, 8⟩ worker, so the mix is at best
as fast), but it uses all fourteen threads where ⟨2, 6, 8⟩ leaves two idle. These tie-breaks are applied per DP
state, greedily: the latency is always optimal, the tie-break nearly always (3 of 5,236 random small cases differ
from exhaustive search in threads used).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from adaserve.errors import ConfigError

__all__ = ["InfeasiblePlanError", "Instance", "Optimizer", "Plan", "Profile", "fat_instance_plan"]


class InfeasiblePlanError(ConfigError):
    """No worker set can hold B rows with T threads from the profiled cells; the message says why."""


@dataclass(frozen=True)
class Profile:
    """Mean batch latency in seconds of one worker, by (threads, batch); the optimizer's only input."""

    latency_s: Mapping[tuple[int, int], float]

    def __post_init__(self) -> None:
        if not self.latency_s:
            raise ValueError("a profile needs at least one measured (threads, batch) cell")
        for (t, b), value in self.latency_s.items():
            if t < 1 or b < 1:
                raise ValueError(f"profile cell (threads={t}, batch={b}): threads and batch must be ≥ 1")
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"profile cell (threads={t}, batch={b}): latency must be a positive number")

    @property
    def threads(self) -> list[int]:
        return sorted({t for t, _ in self.latency_s})

    @property
    def batches(self) -> list[int]:
        return sorted({b for _, b in self.latency_s})

    @property
    def max_threads(self) -> int:
        return max(t for t, _ in self.latency_s)

    def estimate(self, threads: int, batch: int) -> tuple[float, str] | None:
        """L[threads, batch] and how it was obtained: measured, interpolated or extrapolated along b.

        Packrat profiles only powers of two of b; a worker shape outside the grid (the fat instance for B = 12,
        say) is estimated linearly in b between the profiled neighbours at the same t, because batch latency
        grows close to linearly with rows once a batch fills the cores. None when t was not profiled at all.
        """
        if (threads, batch) in self.latency_s:
            return self.latency_s[threads, batch], "profiled"
        row = sorted((b, v) for (t, b), v in self.latency_s.items() if t == threads)
        if not row:
            return None
        below = [(b, v) for b, v in row if b < batch]
        above = [(b, v) for b, v in row if b > batch]
        if below and above:
            (b0, v0), (b1, v1) = below[-1], above[0]
            value = v0 + (v1 - v0) * (batch - b0) / (b1 - b0)
            return value, f"interpolated between b={b0} and b={b1} at t={threads}"
        b_near, v_near = below[-1] if below else above[0]
        return v_near * batch / b_near, f"extrapolated linearly in b from b={b_near} at t={threads}"


@dataclass(frozen=True)
class Instance:
    """`count` workers, each with `threads` intra-op threads taking batches of `batch` rows."""

    count: int
    threads: int
    batch: int
    latency_s: float  # one worker's expected batch latency
    source: str = "profiled"  # or how the latency was estimated

    @property
    def triple(self) -> tuple[int, int, int]:
        return (self.count, self.threads, self.batch)


@dataclass(frozen=True)
class Plan:
    """The optimizer's answer for ⟨T, B⟩, with the fat instance ⟨1, T, B⟩ it is measured against."""

    threads: int  # T: threads available
    batch: int  # B: rows per aggregated batch
    instances: tuple[Instance, ...]
    latency_s: float  # expected batch latency: the slowest worker's
    fat_latency_s: float | None  # ⟨1, T, B⟩; None when t = T was not profiled
    fat_source: str  # "profiled", or how the fat latency was estimated, or why there is none
    notes: tuple[str, ...] = field(default=())

    @property
    def triples(self) -> list[tuple[int, int, int]]:
        """The paper's notation: [(i_j, t_j, b_j)]."""
        return [instance.triple for instance in self.instances]

    @property
    def threads_used(self) -> int:
        return sum(i.count * i.threads for i in self.instances)

    @property
    def workers(self) -> int:
        return sum(i.count for i in self.instances)

    @property
    def speedup(self) -> float | None:
        """Fat-instance latency over this plan's: > 1 means the plan is expected to be faster."""
        if self.fat_latency_s is None or self.latency_s <= 0:
            return None
        return self.fat_latency_s / self.latency_s

    @property
    def estimated(self) -> bool:
        return any(i.source != "profiled" for i in self.instances)


def fat_instance_plan(profile: Profile | None, threads: int, batch: int, note: str) -> Plan:
    """The paper's baseline ⟨1, T, B⟩ as a plan: the stated default when no usable profile exists."""
    estimate = profile.estimate(threads, batch) if profile is not None else None
    latency, source = estimate if estimate is not None else (math.nan, "not profiled")
    instance = Instance(1, threads, batch, latency, source)
    return Plan(threads, batch, (instance,), latency, estimate[0] if estimate else None, source, (note,))


@dataclass(frozen=True)
class _Table:
    """opt[t, b] and the item chosen last there; ties on latency are broken by `used` (more), then `total` (less)."""

    latency: np.ndarray  # float64 [T + 1, B + 1]: the slowest worker (the paper's objective)
    used: np.ndarray  # int64: threads the workers use, Σ i·t
    total: np.ndarray  # float64: the sum of the workers' latencies
    choice: np.ndarray  # int32: index into items, -1 for none
    items: tuple[tuple[int, int, float, str], ...]  # (t, b, latency, source)


def solve(items: Iterable[tuple[int, int, float, str]], threads: int, batch: int) -> _Table:
    """Fill the 2-D unbounded knapsack table for every t ≤ `threads`, b ≤ `batch`.

    Items in the outer loop and thread counts ascending let an item be used again (row t reads row t - t', which
    this item has already updated). Rows differ by t' ≥ 1, so each row update is one vector operation over b.
    The latency is exact; the tie-breaks (use all T threads, as §3's Σ i·t = T; then the fastest workers off the
    critical path) are applied greedily per state (see the module docstring).
    """
    chosen = tuple(item for item in items if item[0] <= threads and item[1] <= batch)
    shape = (threads + 1, batch + 1)
    latency, total = np.full(shape, np.inf), np.full(shape, np.inf)
    used = np.zeros(shape, dtype=np.int64)
    latency[:, 0] = total[:, 0] = 0.0
    choice = np.full(shape, -1, dtype=np.int32)
    for index, (t_item, b_item, value, _) in enumerate(chosen):
        for t in range(t_item, threads + 1):
            source = (t - t_item, slice(0, batch + 1 - b_item))
            target = (t, slice(b_item, batch + 1))
            candidate = np.maximum(latency[source], value)
            candidate_used = used[source] + t_item
            candidate_total = total[source] + value
            current, current_used, current_total = latency[target], used[target], total[target]
            same = candidate == current
            better = (candidate < current) | (same & (candidate_used > current_used))
            better |= same & (candidate_used == current_used) & (candidate_total < current_total)
            if better.any():
                current[better] = candidate[better]
                current_used[better] = candidate_used[better]
                current_total[better] = candidate_total[better]
                choice[target][better] = index
    return _Table(latency, used, total, choice, chosen)


def _reconstruct(table: _Table, threads: int, batch: int) -> list[tuple[int, int, float, str]]:
    """Follow the choices back from ⟨threads, batch⟩; each step removes one worker."""
    pieces = []
    t, b = threads, batch
    while b > 0:
        index = int(table.choice[t, b])
        if index < 0:  # cannot happen for a finite cell; guards against an infinite loop
            raise InfeasiblePlanError(f"internal: no choice recorded at t={t}, b={b}")
        item = table.items[index]
        pieces.append(item)
        t, b = t - item[0], b - item[1]
    return pieces


class Optimizer:
    """Plans for one profile, cached per ⟨T, B⟩; the DP table per T is kept and reused for every B it covers."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self._profiled = tuple((t, b, v, "profiled") for (t, b), v in sorted(profile.latency_s.items()))
        self._tables: dict[tuple[int, bool], _Table] = {}
        self._plans: dict[tuple[int, int], Plan] = {}

    def plan(self, threads: int, batch: int) -> Plan:
        """The ⟨i, t, b⟩ configuration minimising batch latency for B = `batch` rows on T = `threads` threads.

        Only profiled cells are used when they can make up B exactly (the paper's optimizer); otherwise (B = 7 on
        two threads when b ∈ {1, 2, 4, 8} were profiled) cells interpolated in b are added, and the plan says so.
        """
        if threads < 1 or batch < 1:
            raise InfeasiblePlanError(f"T and B must be ≥ 1, got T={threads}, B={batch}")
        key = (threads, batch)
        if key not in self._plans:
            self._plans[key] = self._solve(threads, batch)
        return self._plans[key]

    @property
    def cached(self) -> int:
        return len(self._plans)

    def _solve(self, threads: int, batch: int) -> Plan:
        notes: list[str] = []
        table = self._table(threads, batch, interpolated=False)
        if not math.isfinite(table.latency[threads, batch]):
            table = self._table(threads, batch, interpolated=True)
            notes.append(
                f"B={batch} cannot be made of profiled batch sizes {self.profile.batches} with {threads} threads; "
                "latencies interpolated in b are used"
            )
        if not math.isfinite(table.latency[threads, batch]):
            largest = max(self.profile.batches)
            raise InfeasiblePlanError(
                f"B={batch} rows do not fit on T={threads} threads: each worker needs ≥ 1 thread and takes at most "
                f"b={largest} (the largest profiled batch), so at most {threads * largest} rows"
            )
        pieces = _reconstruct(table, threads, batch)
        counts = Counter(pieces)
        instances = tuple(
            Instance(count, t, b, value, source)
            for (t, b, value, source), count in sorted(counts.items(), key=lambda kv: (-kv[0][0], -kv[0][1]))
        )
        estimate = self.profile.estimate(threads, batch)
        if estimate is None:
            fat_latency, fat_source = None, f"not profiled (t={threads} > profiled {self.profile.max_threads})"
        else:
            fat_latency, fat_source = estimate
        return Plan(
            threads=threads,
            batch=batch,
            instances=instances,
            latency_s=float(table.latency[threads, batch]),
            fat_latency_s=fat_latency,
            fat_source=fat_source,
            notes=tuple(notes),
        )

    def _table(self, threads: int, batch: int, *, interpolated: bool) -> _Table:
        """The table for T = `threads` covering at least `batch` rows, grown (doubling) when B outgrows it."""
        cached = self._tables.get((threads, interpolated))
        if cached is not None and cached.latency.shape[1] > batch:
            return cached
        width = max(batch, 2 * (cached.latency.shape[1] - 1) if cached is not None else 0)
        items = self._profiled + (self._interpolated(width) if interpolated else ())
        table = solve(items, threads, width)
        self._tables[threads, interpolated] = table
        return table

    def _interpolated(self, width: int) -> tuple[tuple[int, int, float, str], ...]:
        """Estimated cells for every b up to the largest profiled batch that was not itself profiled."""
        largest = max(self.profile.batches)
        items = []
        for t in self.profile.threads:
            for b in range(1, min(width, largest) + 1):
                if (t, b) in self.profile.latency_s:
                    continue
                estimate = self.profile.estimate(t, b)
                if estimate is not None:
                    items.append((t, b, estimate[0], estimate[1]))
        return tuple(items)
