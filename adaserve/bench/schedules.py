"""Arrival schedules: when an open-loop generator sends each request, or how many clients a closed loop runs.

Open-loop schedules are pure functions of their spec and seed, so a run can be repeated exactly and checked without
a server. Rate-driven schedules share one method (time rescaling): unit-rate event times are mapped through the
inverse of the cumulative rate Λ(t), which is exact wherever the rate is piecewise constant.
"""

from __future__ import annotations

import itertools
import math
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from adaserve.bench.traces import RequestSequence, Trace, load_trace

#: Longest horizon searched for a count-bounded run of a schedule whose rate may fall to zero.
_MAX_HORIZON_S = 1e7
#: Points per period where Λ is linearised for the diurnal curve (relative error of Λ below 1e-4).
_DIURNAL_POINTS_PER_PERIOD = 512


class ScheduleError(ValueError):
    """A schedule that cannot produce the bounded run asked for."""


def relative_to_file(path: Path | None, info: ValidationInfo) -> Path | None:
    """A path field's validator: relative paths in a workload file are taken from the file's folder."""
    base = (info.context or {}).get("base")
    return path if path is None or path.is_absolute() or base is None else Path(base) / path


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ClosedSpec(_Spec):
    """Closed loop: `concurrency` clients, each sending its next request when its last one is answered."""

    kind: Literal["closed"] = "closed"
    concurrency: int = Field(ge=1)


class ConstantSpec(_Spec):
    """Open loop, evenly spaced requests at `rate` per second (perf_analyzer's constant distribution)."""

    kind: Literal["constant"] = "constant"
    rate: float = Field(gt=0)


class PoissonSpec(_Spec):
    """Open loop, Poisson arrivals at a mean `rate` per second."""

    kind: Literal["poisson"] = "poisson"
    rate: float = Field(gt=0)
    seed: int = 0


class StepSpec(_Spec):
    """Open loop, Poisson arrivals whose rate changes at given times: `steps: [[0, 10], [30, 50]]` as (at_s, rate)."""

    kind: Literal["step"] = "step"
    steps: tuple[tuple[float, float], ...] = Field(min_length=1)
    seed: int = 0

    @model_validator(mode="after")
    def _ordered(self) -> StepSpec:
        times = [at for at, _ in self.steps]
        if times[0] != 0:
            raise ValueError("the first step must start at 0 s")
        if any(b <= a for a, b in itertools.pairwise(times)):
            raise ValueError(f"step times must increase; got {times}")
        if any(rate < 0 for _, rate in self.steps):
            raise ValueError("step rates must be >= 0")
        return self


class BurstSpec(_Spec):
    """Open loop, Poisson at `base_rate`, with bursts at `burst_rate` for `burst_s` every `every_s` from `first_s`."""

    kind: Literal["burst"] = "burst"
    base_rate: float = Field(ge=0)
    burst_rate: float = Field(gt=0)
    burst_s: float = Field(gt=0)
    every_s: float = Field(gt=0)
    first_s: float = Field(default=0.0, ge=0)
    seed: int = 0

    @model_validator(mode="after")
    def _fits(self) -> BurstSpec:
        if self.burst_s >= self.every_s:
            raise ValueError(f"burst_s ({self.burst_s}) must be shorter than every_s ({self.every_s})")
        return self


class DiurnalSpec(_Spec):
    """Open loop, Poisson with rate `mean_rate·(1 − amplitude·cos(2πt/period_s))`: a trough at 0, a peak mid-period."""

    kind: Literal["diurnal"] = "diurnal"
    mean_rate: float = Field(gt=0)
    amplitude: float = Field(default=0.8, ge=0, le=1)
    period_s: float = Field(gt=0)
    seed: int = 0


class TraceSpec(_Spec):
    """Open loop, replay of recorded arrival timestamps with inter-arrivals scaled so the mean rate is `rate`."""

    kind: Literal["trace"] = "trace"
    path: Path
    rate: float = Field(gt=0)
    skip_bad_lines: bool = False

    _resolve_path = field_validator("path")(relative_to_file)


class SequenceSpec(_Spec):
    """Open loop at the times of the workload's request sequence, divided by `speedup` (a replay compressed in
    time); the sequence also names each request's model."""

    kind: Literal["sequence"] = "sequence"
    speedup: float = Field(default=1.0, gt=0)


OpenSpec = ConstantSpec | PoissonSpec | StepSpec | BurstSpec | DiurnalSpec | TraceSpec | SequenceSpec
LoadSpec = Annotated[ClosedSpec | OpenSpec, Field(discriminator="kind")]


class Schedule(ABC):
    """Open-loop arrivals: the times (s from the run's start) at which requests are due, whatever the server does."""

    @abstractmethod
    def expected(self, t: float) -> float:
        """Arrivals expected in [0, t): the asked load that the achieved rate is judged against."""

    @abstractmethod
    def arrivals(self, duration_s: float | None, max_requests: int | None) -> np.ndarray:
        """Sorted arrival times before `duration_s`, at most `max_requests` of them; at least one bound is given."""

    @property
    def notes(self) -> list[str]:
        """What the report must mention about how the schedule was built (e.g. skipped trace lines)."""
        return []


class RateSchedule(Schedule):
    """Arrivals of a (possibly time-varying) rate: Poisson when seeded, evenly spaced when `seed` is None."""

    def __init__(self, seed: int | None) -> None:
        self._seed = seed

    @abstractmethod
    def knots(self, horizon_s: float) -> tuple[np.ndarray, np.ndarray]:
        """Times from 0 to `horizon_s` and Λ at them, with the rate constant between neighbours."""

    def expected(self, t: float) -> float:
        return float(self.knots(t)[1][-1]) if t > 0 else 0.0

    def arrivals(self, duration_s: float | None, max_requests: int | None) -> np.ndarray:
        _check_bounds(duration_s, max_requests)
        if duration_s is not None:
            times, cumulative = self.knots(duration_s)
            units = self._units_below(float(cumulative[-1]), max_requests)
        else:
            assert max_requests is not None
            units = self._first_units(max_requests)
            horizon = 1.0
            while self.expected(horizon) <= units[-1]:
                horizon *= 2
                if horizon > _MAX_HORIZON_S:
                    raise ScheduleError(f"the schedule does not reach {max_requests} requests; give a duration")
            times, cumulative = self.knots(horizon)
        return np.interp(units, cumulative, times)

    def _first_units(self, count: int) -> np.ndarray:
        if self._seed is None:
            return np.arange(count, dtype=np.float64)
        return np.cumsum(np.random.default_rng(self._seed).exponential(size=count))

    def _units_below(self, total: float, limit: int | None) -> np.ndarray:
        """Unit-rate event times below `total`: the first `ceil(total)` suffice unless Poisson noise wants more."""
        count = math.ceil(total) + 10
        while True:
            if limit is not None:
                count = min(count, limit)
            units = self._first_units(count)
            if units[-1] >= total or count == limit:
                return units[units < total]
            count = 2 * count


class _PiecewiseSchedule(RateSchedule):
    """A rate that is constant between change points; Λ is linear between them, so the mapping is exact."""

    @abstractmethod
    def changes(self, horizon_s: float) -> list[tuple[float, float]]:
        """(at_s, rate) pairs from 0 up to the horizon, the first at 0."""

    def knots(self, horizon_s: float) -> tuple[np.ndarray, np.ndarray]:
        changes = [(at, rate) for at, rate in self.changes(horizon_s) if at < horizon_s]
        times = np.array([at for at, _ in changes] + [horizon_s])
        rates = np.array([rate for _, rate in changes])
        cumulative = np.concatenate([[0.0], np.cumsum(rates * np.diff(times))])
        return times, cumulative


class ConstantRate(_PiecewiseSchedule):
    """`rate` per second, Poisson or evenly spaced."""

    def __init__(self, rate: float, seed: int | None) -> None:
        super().__init__(seed)
        self._rate = rate

    def changes(self, horizon_s: float) -> list[tuple[float, float]]:
        return [(0.0, self._rate)]


class StepRate(_PiecewiseSchedule):
    """The rate changes at given times and holds until the next change."""

    def __init__(self, steps: tuple[tuple[float, float], ...], seed: int) -> None:
        super().__init__(seed)
        self._steps = list(steps)

    def changes(self, horizon_s: float) -> list[tuple[float, float]]:
        return self._steps


class BurstRate(_PiecewiseSchedule):
    """A base rate with periodic bursts."""

    def __init__(self, spec: BurstSpec) -> None:
        super().__init__(spec.seed)
        self._spec = spec

    def changes(self, horizon_s: float) -> list[tuple[float, float]]:
        spec = self._spec
        changes = [(0.0, spec.base_rate)]
        start = spec.first_s
        while start < horizon_s:
            changes += [(start, spec.burst_rate), (start + spec.burst_s, spec.base_rate)]
            start += spec.every_s
        if len(changes) > 1 and changes[1][0] == 0.0:
            changes.pop(0)
        return changes


class DiurnalRate(RateSchedule):
    """A day-like sinusoid; Λ is known in closed form and linearised on a fine grid."""

    def __init__(self, spec: DiurnalSpec) -> None:
        super().__init__(spec.seed)
        self._spec = spec

    def knots(self, horizon_s: float) -> tuple[np.ndarray, np.ndarray]:
        spec = self._spec
        points = max(2, math.ceil(horizon_s / spec.period_s * _DIURNAL_POINTS_PER_PERIOD) + 1)
        times = np.linspace(0.0, horizon_s, points)
        omega = 2 * math.pi / spec.period_s
        cumulative = spec.mean_rate * (times - spec.amplitude * np.sin(omega * times) / omega)
        return times, cumulative


class TraceReplay(Schedule):
    """Recorded arrivals, scaled to a mean rate; the trace starts over (after one mean gap) when it runs out."""

    def __init__(self, trace: Trace, rate: float) -> None:
        offsets = trace.offsets_s
        recorded_rate = (len(offsets) - 1) / offsets[-1]
        self._trace = trace
        self._times = offsets * (recorded_rate / rate)
        self._period = self._times[-1] + 1 / rate

    @property
    def notes(self) -> list[str]:
        skipped = self._trace.skipped_lines
        if not skipped:
            return []
        shown = ", ".join(map(str, skipped[:10])) + (", …" if len(skipped) > 10 else "")
        return [f"{self._trace.path}: skipped {len(skipped)} bad line(s): {shown}"]

    @property
    def scaled(self) -> np.ndarray:
        """One pass of the trace after scaling, starting at 0."""
        return self._times

    def expected(self, t: float) -> float:
        whole, rest = divmod(t, float(self._period))
        return whole * len(self._times) + float(np.searchsorted(self._times, rest, side="left"))

    def arrivals(self, duration_s: float | None, max_requests: int | None) -> np.ndarray:
        _check_bounds(duration_s, max_requests)
        wanted = math.inf if max_requests is None else max_requests
        if duration_s is not None:
            wanted = min(wanted, math.ceil(self.expected(duration_s)))
        passes = max(1, math.ceil(wanted / len(self._times)))
        times = (self._times[None, :] + self._period * np.arange(passes)[:, None]).ravel()
        if duration_s is not None:
            times = times[times < duration_s]
        return times[:max_requests]


class SequenceTimes(Schedule):
    """A request sequence's own times, compressed by a speedup; played once, never looped."""

    def __init__(self, sequence: RequestSequence, speedup: float) -> None:
        self._times = sequence.offsets_s / speedup

    def expected(self, t: float) -> float:
        return float(np.searchsorted(self._times, t, side="left"))

    def arrivals(self, duration_s: float | None, max_requests: int | None) -> np.ndarray:
        _check_bounds(duration_s, max_requests)
        times = self._times if duration_s is None else self._times[self._times < duration_s]
        return times[:max_requests]


def create_schedule(spec: OpenSpec, sequence: RequestSequence | None = None) -> Schedule:
    """The schedule an open-loop spec describes; trace files are read (and checked) here. `sequence` is the
    workload's request sequence, whose times the `sequence` kind replays."""
    match spec:
        case ConstantSpec():
            return ConstantRate(spec.rate, seed=None)
        case PoissonSpec():
            return ConstantRate(spec.rate, seed=spec.seed)
        case StepSpec():
            return StepRate(spec.steps, seed=spec.seed)
        case BurstSpec():
            return BurstRate(spec)
        case DiurnalSpec():
            return DiurnalRate(spec)
        case TraceSpec():
            return TraceReplay(load_trace(spec.path, skip_bad_lines=spec.skip_bad_lines), spec.rate)
        case SequenceSpec():
            if sequence is None:
                raise ScheduleError("load kind 'sequence' replays the workload's sequence file; give one")
            return SequenceTimes(sequence, spec.speedup)


def _check_bounds(duration_s: float | None, max_requests: int | None) -> None:
    if duration_s is None and max_requests is None:
        raise ScheduleError("an open-loop run needs a duration or a request count")
    if duration_s is not None and duration_s <= 0:
        raise ScheduleError(f"duration must be positive, got {duration_s}")
    if max_requests is not None and max_requests < 1:
        raise ScheduleError(f"request count must be at least 1, got {max_requests}")
