"""Replay a request trace through the residency core and a policy object, in virtual time.

The service model (one device, as in the paper's testbed):

* Each model has one executor: its requests run one at a time, in arrival order, `exec_s` each (batch 1).
* Loads go through one loader, one at a time in admission order, `load_s` each: they share the link from storage
  to device memory (and here, the CPU's cores). Unloads take no time: evicted memory is free at once.
* A request for a non-resident model is admitted at once (victims evicted, its bytes reserved) and waits for the
  load; requests that arrive while it loads wait on that same load. If the unpinned resident models cannot make
  room, the request waits until a release lets it in (the server's CacheBusyError wait, without a timeout).
* A request pins its model from arrival to the end of its execution, so a model with queued work is never evicted.

Arrivals are open loop (each request at its `time_s`) or, with `clients=k`, closed loop: k clients send the
requests in order, each sending the next when its previous one is answered. The closed loop measures how many
requests a second the device sustains on this sequence, which is where the paper's throughput differences come from.

Per request: load wait = time from arrival until its model was loaded (0 for a hit), latency = arrival to answer.
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
from collections import defaultdict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from adaserve.cache.policies import POLICIES, create_policy
from adaserve.cache.residency import Residency, Resident, State
from adaserve.cache.stats import StatsRegistry
from adaserve.cache.workload import Request
from adaserve.errors import CacheBusyError, ConfigError, ModelTooLargeError


@dataclass(frozen=True)
class ModelFigures:
    """What the simulator knows of a model: bytes in memory, seconds to load, seconds per batch-1 request."""

    size_bytes: int
    load_s: float
    exec_s: float


def read_models(path: Path) -> dict[str, ModelFigures]:
    """A models file: JSON `{name: {size_bytes, load_s, exec_s}}`, or the same under a "models" key (as
    benchmarks/mcache writes its measurements; other fields are ignored). ConfigError names file, model and field."""
    try:
        document = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the models file: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ConfigError(f"{path}: not JSON: {exc}") from None
    return models_from(document, str(path))


def models_from(document: Any, source: str) -> dict[str, ModelFigures]:
    """The figures in a parsed models file; `source` names it in errors."""
    if isinstance(document, dict) and isinstance(document.get("models"), dict):
        document = document["models"]
    if not isinstance(document, dict) or not document:
        raise ConfigError(f"{source}: expected an object of models, {{name: {{size_bytes, load_s, exec_s}}}}")
    models = {}
    for name, entry in document.items():
        if not isinstance(entry, dict):
            raise ConfigError(f"{source}: model '{name}': expected an object with size_bytes, load_s, exec_s")
        for field in ("size_bytes", "load_s", "exec_s"):
            value = entry.get(field)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
                raise ConfigError(f"{source}: model '{name}': {field} must be a non-negative number, got {value!r}")
        if entry["size_bytes"] < 1:
            raise ConfigError(f"{source}: model '{name}': size_bytes must be at least 1")
        models[name] = ModelFigures(int(entry["size_bytes"]), float(entry["load_s"]), float(entry["exec_s"]))
    return models


@dataclass(frozen=True)
class SimulationResult:
    policy: str
    budget_bytes: int
    requests: int
    hits: int
    loads: int
    evictions: int
    hit_ratio: float
    mean_load_wait_s: float  # the paper's "model loading time", averaged over all requests (0 for hits)
    loading_s: float  # loader busy time
    throughput_rps: float  # answered requests / (last answer - first arrival)
    mean_latency_s: float
    p99_latency_s: float
    makespan_s: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Job:
    model: str
    arrival_s: float
    hit: bool = False
    ready_s: float = math.nan
    done_s: float = math.nan
    pin: Resident | None = None


def simulate(
    requests: Sequence[Request],
    models: Mapping[str, ModelFigures],
    budget_bytes: int,
    policy: str,
    *,
    clients: int | None = None,
    **policy_options: Any,
) -> SimulationResult:
    """Replay `requests` (in time order; ties keep their order) under `budget_bytes` with the policy named
    `policy`; a policy that needs the future (the oracle, IAM with foresight) is given the requests as its future.
    Raises ModelTooLargeError before replaying if a requested model exceeds the budget, and ConfigError for a request
    naming a model `models` lacks."""
    if not requests:
        raise ValueError("no requests to simulate")
    for name in {r.model for r in requests}:
        if name not in models:
            raise ConfigError(f"a request is for model '{name}', which the models file does not describe")
        if models[name].size_bytes > budget_bytes:
            raise ModelTooLargeError(
                f"model '{name}' needs {models[name].size_bytes} bytes, more than the whole budget of "
                f"{budget_bytes}; every request for it would fail"
            )
    if clients is not None and clients < 1:
        raise ValueError(f"clients must be at least 1, got {clients}")
    ordered = sorted(requests, key=lambda r: r.time_s)
    registry = StatsRegistry()
    if (known := POLICIES.get(policy.lower())) is not None and known.needs_future:
        policy_options = {**policy_options, "future": [r.model for r in ordered]}
    core = Residency(budget_bytes, create_policy(policy, registry, budget_bytes, **policy_options))
    return _Replay(core, models, ordered, clients).run()


class _Replay:
    """The event loop: a heap of (time, sequence, action, argument)."""

    def __init__(
        self, core: Residency, models: Mapping[str, ModelFigures], requests: list[Request], clients: int | None
    ) -> None:
        self.core, self.models, self.requests, self.clients = core, models, requests, clients
        self.events: list[tuple[float, int, Callable[[Any, float], None], Any]] = []
        self.sequence = itertools.count()
        self.jobs: list[_Job] = []
        self.waiting_load: dict[str, list[_Job]] = defaultdict(list)
        self.runnable: dict[str, deque[_Job]] = defaultdict(deque)
        self.executing: set[str] = set()
        self.loader_queue: deque[str] = deque()
        self.loader_busy = False
        self.loading_s = 0.0
        self.no_room: deque[_Job] = deque()
        self.loads = self.evictions = 0

    def run(self) -> SimulationResult:
        if self.clients is None:
            for request in self.requests:
                self._at(request.time_s, self._arrive, request)
        else:
            for request in self.requests[: self.clients]:
                self._at(0.0, self._arrive, request)
        while self.events:
            now, _, action, argument = heapq.heappop(self.events)
            action(argument, now)
        return self._result()

    def _at(self, when: float, action: Callable[[Any, float], None], argument: Any) -> None:
        heapq.heappush(self.events, (when, next(self.sequence), action, argument))

    # -- arrivals and admission ---------------------------------------------------------------------------------

    def _arrive(self, request: Request, now: float) -> None:
        job = _Job(request.model, now)
        self.jobs.append(job)
        state = self.core.request(job.model, now)
        job.hit = state is State.LOADED
        if any(waiting.model == job.model for waiting in self.no_room) or not self._enter(job, now):
            self.no_room.append(job)

    def _enter(self, job: _Job, now: float) -> bool:
        """Pin the job's model and queue the job (admitting the model first if it is not resident); False when
        there is no room for the model now."""
        state = self.core.state(job.model)
        if state is None:
            try:
                victims = self.core.admit(job.model, self.models[job.model].size_bytes, now)
            except CacheBusyError:
                return False
            self.evictions += len(victims)
            self.loader_queue.append(job.model)
            self._start_load(now)
            state = State.LOADING
        job.pin = self.core.pin(job.model)
        if state is State.LOADED:
            job.ready_s = now
            self._runnable(job, now)
        else:
            self.waiting_load[job.model].append(job)
        return True

    def _retry_no_room(self, now: float) -> None:
        for job in list(self.no_room):
            if self._enter(job, now):
                self.no_room.remove(job)

    # -- the loader ---------------------------------------------------------------------------------------------

    def _start_load(self, now: float) -> None:
        if self.loader_busy or not self.loader_queue:
            return
        model = self.loader_queue.popleft()
        self.loader_busy = True
        self._at(now + self.models[model].load_s, self._loaded, model)

    def _loaded(self, model: str, now: float) -> None:
        figures = self.models[model]
        self.loader_busy = False
        self.loads += 1
        self.loading_s += figures.load_s
        self.evictions += len(self.core.loaded(model, figures.size_bytes, figures.load_s, now))
        for job in self.waiting_load.pop(model):
            job.ready_s = now
            self._runnable(job, now)
        self._start_load(now)

    # -- the executors ------------------------------------------------------------------------------------------

    def _runnable(self, job: _Job, now: float) -> None:
        self.runnable[job.model].append(job)
        if job.model not in self.executing:
            self._execute(job.model, now)

    def _execute(self, model: str, now: float) -> None:
        job = self.runnable[model].popleft()
        self.executing.add(model)
        self._at(now + self.models[model].exec_s, self._answered, job)

    def _answered(self, job: _Job, now: float) -> None:
        job.done_s = now
        self.executing.discard(job.model)
        if self.runnable[job.model]:
            self._execute(job.model, now)
        assert job.pin is not None
        if self.core.unpin(job.pin):
            self._retry_no_room(now)
        if self.clients is not None and len(self.jobs) < len(self.requests):
            self._at(now, self._arrive, self.requests[len(self.jobs)])

    def _result(self) -> SimulationResult:
        latency = np.array([job.done_s - job.arrival_s for job in self.jobs])
        load_wait = np.array([job.ready_s - job.arrival_s for job in self.jobs])
        first = min(job.arrival_s for job in self.jobs)
        last = max(job.done_s for job in self.jobs)
        hits = sum(job.hit for job in self.jobs)
        return SimulationResult(
            policy=self.core.policy.name,
            budget_bytes=self.core.budget_bytes,
            requests=len(self.jobs),
            hits=hits,
            loads=self.loads,
            evictions=self.evictions,
            hit_ratio=hits / len(self.jobs),
            mean_load_wait_s=float(load_wait.mean()),
            loading_s=self.loading_s,
            throughput_rps=len(self.jobs) / (last - first) if last > first else math.inf,
            mean_latency_s=float(latency.mean()),
            p99_latency_s=float(np.percentile(latency, 99)),
            makespan_s=last - first,
        )
