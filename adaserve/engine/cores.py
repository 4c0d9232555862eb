"""The server's CPU cores, as every CPU model's scheduler shares them.

Each model has a scheduler and workers of its own, but the CPU models of one server run on the same cores. Each
scheduler's busy-thread limit and its polling rule were written for a model that has the cores to itself: with two
copies of the example CNN loaded, each could keep a worker busy and another polling, beside the frontend, on two
cores. Measured on the 2-core VM (two perf_analyzers at half the rate each, Poisson, 6 s): at 1,440 req/s in all,
two models answered in 4.1–5.3 ms on average against 1.0–1.2 ms when both clients sent to one model; at 3,000 req/s,
4.3 ms against 2.2 ms.

So the models' schedulers share one `Cores`:

* a model's limit counts the threads busy in every model sharing it (any worker may still start when none is busy),
  unless each batch the others run is expected to go on for more than two of its own batches: then waiting would
  cost it more than sharing a core, and it counts only its own (a light model beside a heavy one);
* the cores the server's workers have to themselves (`spare_cores`: the CPUs less what the frontend and every other
  program on them used lately, `adaserve.engine.machine_cpu.SpareCores`) are one account for every model's
  pollers: a worker may poll only while the other models' busy threads and their pollers leave a whole core for it
  (its own model's batches run on that core), and a batch that starts where they do not tells other models'
  pollers to rest (a model's own poller always rests when another of its workers starts). On two cores that is one
  poller for the whole server; on sixteen, one per model while cores are free;
* threads freed by one model's batch go to the model whose oldest ready row is oldest (`pump`), so one busy model
  does not starve another.

A model without a limit (`max_busy_threads: 0`) is still counted, but does not wait for the others.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from adaserve.engine.machine_cpu import SpareCores

if TYPE_CHECKING:
    from adaserve.engine.scheduler import Scheduler


@dataclass
class _Member:
    pump: Callable[[], None] | None = None  # schedule this model's ready rows now
    rest: Callable[[int], None] | None = None  # tell this model's worker (by id) to stop polling
    worker_pids: Callable[[], Iterable[int]] | None = None  # this model's worker processes now


class Cores:
    """The schedulers sharing a set of cores: their busy threads, their polling workers, and whom to pump."""

    def __init__(self) -> None:
        # The CPUs less what the frontend and other programs used lately; the engines keep it current (`measure`).
        self.spare_cores = math.inf
        self._meter: SpareCores | None = None  # made on the first `measure`: a server whose workers never poll
        self._members: dict[Scheduler, _Member] = {}
        self._pollers: dict[Scheduler, int] = {}  # each model's polling worker, the longest-polling first

    def join(self, scheduler: Scheduler) -> None:
        self._members.setdefault(scheduler, _Member())

    def connect(
        self,
        scheduler: Scheduler,
        *,
        pump: Callable[[], None],
        rest: Callable[[int], None],
        worker_pids: Callable[[], Iterable[int]],
    ) -> None:
        """How to reach the engine behind `scheduler`: its scheduling step, its workers' rest, and their PIDs."""
        self._members[scheduler] = _Member(pump, rest, worker_pids)

    def measure(self, now: float) -> None:
        """Bring `spare_cores` up to date at `now` (monotonic; /proc is read at most every 0.1 s)."""
        if self._meter is None:
            self._meter = SpareCores(self._worker_pids)
        self.spare_cores = self._meter.update(now)

    def _worker_pids(self) -> Iterator[int]:
        for member in list(self._members.values()):
            if member.worker_pids is not None:
                yield from member.worker_pids()

    def leave(self, scheduler: Scheduler) -> None:
        """A model stopped: its threads no longer count, and its poller is forgotten."""
        self._members.pop(scheduler, None)
        self._pollers.pop(scheduler, None)

    @property
    def busy_threads(self) -> int:
        """Worker threads busy now in every model sharing these cores (summed, so a model that leaves takes its
        own with it)."""
        return sum(scheduler.busy_threads for scheduler in self._members)

    def others_end_within(self, scheduler: Scheduler, seconds: float, now: float) -> bool:
        """Whether a batch another model runs is expected to end within `seconds` of `now`."""
        return any(
            end - now <= seconds for other in self._members if other is not scheduler for end in other.running_ends()
        )

    def held_by_others(self, scheduler: Scheduler) -> int:
        """Cores the other models hold now: their busy threads and their polling workers."""
        busy = sum(other.busy_threads for other in self._members if other is not scheduler)
        return busy + sum(other is not scheduler for other in self._pollers)

    def starting(self, scheduler: Scheduler, worker_id: int, threads: int) -> int | None:
        """`scheduler`'s worker `worker_id` starts a batch of `threads` threads. The model's own poller stops: it is
        returned if it is another worker (its rest goes with the batch). Other models' pollers keep their cores
        while a whole core is still free beside every busy thread and poller, and are told to rest through their
        engines, the longest-polling first, until one is."""
        own = self._pollers.pop(scheduler, None)
        busy = self.busy_threads + threads
        for other in list(self._pollers):
            if busy + len(self._pollers) < self.spare_cores:
                break
            polling = self._pollers.pop(other)
            member = self._members.get(other)
            if member is not None and member.rest is not None:
                member.rest(polling)
        return None if own == worker_id else own

    def polls(self, scheduler: Scheduler, worker_id: int) -> None:
        """`scheduler`'s worker `worker_id` may poll after the batch it starts."""
        self._pollers[scheduler] = worker_id

    def forget(self, scheduler: Scheduler, worker_id: int) -> None:
        """A worker left its set: it no longer polls."""
        if self._pollers.get(scheduler) == worker_id:
            del self._pollers[scheduler]

    def pump(self) -> None:
        """Threads were freed: let every model with ready rows schedule them, the one waiting longest first."""
        waiting = [(scheduler.oldest_arrival(), scheduler) for scheduler in self._members if scheduler.ready]
        for _, scheduler in sorted(waiting, key=lambda entry: entry[0] or 0.0):
            member = self._members.get(scheduler)
            if member is not None and member.pump is not None:
                member.pump()
