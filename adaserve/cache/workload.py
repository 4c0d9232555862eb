"""mCache's request-level workload from the Azure Functions 2019 trace (paper §6.1, "Inference workload").

The paper's three steps, and how each is read here:

1. "We count the number of invocations to each service in the trace and distribute them in a random order across
   the specified time ... we only count services triggered by HTTP requests ... we remove services whose popularity
   quantile is higher than the 90th." A function's popularity is its total invocations over the whole file; those
   above the 90th percentile of the HTTP functions' popularities are dropped. Each minute's invocations of a
   function are spread uniformly at random within that minute.
2. "We choose one of the 7 DL models for each service in four ways": `random` (a uniform draw per function);
   `round-robin` ("first sorts the models in order of decreasing loading time and then selects the model in a
   round-robin manner": function k of the file, in file order, gets model k mod M); `quantile` ("selects the model
   based on the popularity quantile of the service ... models with high loading time are selected for services with
   high popularity"): the kept functions, sorted by popularity, are cut into M groups of equal count (popularity
   quantiles), and the most popular group gets the model with the longest load time, the next group the next
   longest, and so on; `quantile-r`, the reverse (the most popular group gets the shortest load time).
3. "Down sample the service invocation events to an appropriate level": a uniform sample without replacement of
   the window's invocations, `requests` of them (the paper kept about 2,389 from one hour).

Everything random comes from the seed, so a seed names a workload; the four assignments of one seed share their
invocation times and differ only in which model each function asks for.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import numpy as np

from adaserve.bench.traces import TraceError

Assignment = Literal["random", "round-robin", "quantile", "quantile-r"]
ASSIGNMENTS: tuple[Assignment, ...] = get_args(Assignment)
_HEADER = ("HashOwner", "HashApp", "HashFunction", "Trigger")


@dataclass(frozen=True)
class Request:
    time_s: float
    model: str


@dataclass(frozen=True)
class FunctionTrace:
    """One row of the invocations file: a function, its trigger and its invocations per minute."""

    key: str  # owner/app/function hashes
    line: int
    trigger: str
    counts: np.ndarray

    @property
    def popularity(self) -> int:
        return int(self.counts.sum())


@dataclass(frozen=True)
class InvocationTrace:
    path: Path
    minutes: tuple[int, ...]  # the minute-of-day of each count column
    functions: tuple[FunctionTrace, ...]


@dataclass(frozen=True)
class Workload:
    """The requests (sorted by time, seconds from the window's first minute) and how they were made."""

    requests: tuple[Request, ...]
    assignment: dict[str, str]  # function key -> model
    kept_functions: int
    dropped_functions: int  # HTTP functions above the popularity quantile
    available: int  # invocations of the kept functions in the window, before downsampling


def read_invocations(path: Path) -> InvocationTrace:
    """Read `invocations_per_function_md`-format CSV; a malformed row is a TraceError naming file, line and problem."""
    try:
        with path.open(newline="") as stream:
            rows = list(csv.reader(stream))
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the invocations file: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise TraceError(f"{path}: not a CSV text file: {exc}") from None
    if not rows or tuple(rows[0][:4]) != _HEADER:
        raise TraceError(f"{path}: line 1: expected the header {','.join(_HEADER)},<minute>,...")
    try:
        minutes = tuple(int(label) for label in rows[0][4:])
    except ValueError:
        raise TraceError(f"{path}: line 1: the columns after Trigger must be minute numbers") from None
    if not minutes:
        raise TraceError(f"{path}: line 1: no minute columns")
    functions = [_parse_row(path, number, row, len(minutes)) for number, row in enumerate(rows[1:], start=2) if row]
    if not functions:
        raise TraceError(f"{path}: no functions after the header")
    return InvocationTrace(path, minutes, tuple(functions))


def _parse_row(path: Path, number: int, row: list[str], minutes: int) -> FunctionTrace:
    if len(row) != 4 + minutes:
        raise TraceError(f"{path}: line {number}: {len(row)} fields, expected {4 + minutes} (4 + one per minute)")
    if not all(row[:4]):
        raise TraceError(f"{path}: line {number}: empty HashOwner, HashApp, HashFunction or Trigger")
    try:
        counts = np.array([int(value) for value in row[4:]], dtype=np.int64)
    except ValueError:
        bad = next(i for i, value in enumerate(row[4:]) if not value.strip().lstrip("-").isdigit())
        raise TraceError(
            f"{path}: line {number}: invocation count {row[4 + bad]!r} (column {5 + bad}) is not an integer"
        ) from None
    if (counts < 0).any():
        raise TraceError(f"{path}: line {number}: negative invocation count {int(counts.min())}")
    return FunctionTrace(key="/".join(row[:3]), line=number, trigger=row[3], counts=counts)


def popular_cut(functions: Sequence[FunctionTrace], quantile: float) -> tuple[list[FunctionTrace], int]:
    """The functions at or below the `quantile` of popularity, and how many were dropped above it."""
    popularity = np.array([f.popularity for f in functions])
    limit = np.quantile(popularity, quantile)
    kept = [f for f in functions if f.popularity <= limit]
    return kept, len(functions) - len(kept)


def assign_models(
    functions: Sequence[FunctionTrace], load_s: Mapping[str, float], how: Assignment, rng: np.random.Generator
) -> dict[str, str]:
    """Pair each function with a model (§6.1 step 2); `load_s` gives every model's load time."""
    by_load = sorted(load_s, key=lambda name: (-load_s[name], name))  # longest load first
    if how == "random":
        draws = rng.integers(len(by_load), size=len(functions))
        return {f.key: by_load[i] for f, i in zip(functions, draws, strict=True)}
    if how == "round-robin":
        return {f.key: by_load[i % len(by_load)] for i, f in enumerate(functions)}
    if how not in ("quantile", "quantile-r"):
        raise ValueError(f"unknown assignment {how!r}; expected one of {', '.join(ASSIGNMENTS)}")
    ranked = sorted(functions, key=lambda f: (-f.popularity, f.line))  # most popular first
    models = by_load if how == "quantile" else by_load[::-1]
    groups = np.array_split(np.arange(len(ranked)), len(models))
    return {ranked[i].key: model for model, group in zip(models, groups, strict=True) for i in group}


def build_workload(
    path: Path,
    load_s: Mapping[str, float],
    *,
    assign: Assignment,
    requests: int,
    seed: int = 0,
    start_minute: int | None = None,
    minutes: int | None = None,
    trigger: str = "http",
    popularity_quantile: float = 0.9,
) -> Workload:
    """The §6.1 workload: `requests` requests for the models in `load_s` (name -> load time, s) from the window of
    `minutes` minutes starting at minute-of-day `start_minute` (default: the whole file)."""
    if not load_s:
        raise ValueError("a workload needs at least one model")
    if requests < 1:
        raise ValueError(f"requests must be at least 1, got {requests}")
    trace = read_invocations(path)
    first = 0
    if start_minute is not None:
        if start_minute not in trace.minutes:
            raise TraceError(f"{path}: no minute {start_minute}; it covers {trace.minutes[0]}-{trace.minutes[-1]}")
        first = trace.minutes.index(start_minute)
    window = slice(first, None if minutes is None else first + minutes)
    candidates = [f for f in trace.functions if f.trigger == trigger]
    if not candidates:
        raise TraceError(f"{path}: no function has trigger {trigger!r}")
    kept, dropped = popular_cut(candidates, popularity_quantile)
    # Two streams, so every assignment of one seed gets the same invocation times.
    events_rng, assign_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    assignment = assign_models(kept, load_s, assign, assign_rng)

    counts = np.stack([f.counts[window] for f in kept])  # functions × minutes
    available = int(counts.sum())
    if requests > available:
        raise TraceError(
            f"{path}: the window holds {available} invocations of the {len(kept)} kept functions; ask for at most "
            f"that many requests, or a longer window"
        )
    function_of, minute_of = np.nonzero(counts)
    repeats = counts[function_of, minute_of]
    events = np.repeat(np.arange(len(function_of)), repeats)  # one entry per invocation
    chosen = events[events_rng.choice(len(events), size=requests, replace=False)]
    times = minute_of[chosen] * 60.0 + events_rng.uniform(0.0, 60.0, size=requests)
    order = np.argsort(times, kind="stable")
    built = tuple(Request(float(times[i]), assignment[kept[function_of[chosen[i]]].key]) for i in order)
    return Workload(built, assignment, kept_functions=len(kept), dropped_functions=dropped, available=available)
