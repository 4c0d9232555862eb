"""The server's CPU cores, as every CPU model's scheduler shares them.

Each model has a scheduler and workers of its own, but the CPU models of one server run on the same cores. Each
scheduler's busy-thread limit and its polling rule were written for a model that has the cores to itself: with two
copies of the example CNN loaded, each could keep a worker busy and another polling, beside the frontend, on two
cores. Measured on the 2-core VM (two perf_analyzers at half the rate each, Poisson, 6 s): at 1,440 req/s in all,
two models answered in 4.1–5.3 ms on average against 1.0–1.2 ms when both clients sent to one model; at 3,000 req/s,
4.3 ms against 2.2 ms.

So the models' schedulers share one `Cores`: a model's limit counts the threads busy in every model sharing it, a
worker may poll only while no worker of any model is busy, at most one worker of them all polls (a batch started by
another model tells it to rest), and threads freed by one model's batch go to the model whose oldest ready row is
oldest (`pump`), so one busy model does not starve another. A model without a limit (CUDA streams, or
`max_busy_threads: 0`) is still counted, but does not wait for the others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from adaserve.engine.scheduler import Scheduler


@dataclass
class _Member:
    pump: Callable[[], None] | None = None  # schedule this model's ready rows now
    rest: Callable[[int], None] | None = None  # tell this model's worker (by id) to stop polling


class Cores:
    """The schedulers sharing a set of cores: their busy threads, the one polling worker, and whom to pump."""

    def __init__(self) -> None:
        self._members: dict[Scheduler, _Member] = {}
        self._poller: tuple[Scheduler, int] | None = None

    def join(self, scheduler: Scheduler) -> None:
        self._members.setdefault(scheduler, _Member())

    def connect(self, scheduler: Scheduler, *, pump: Callable[[], None], rest: Callable[[int], None]) -> None:
        """How to reach the engine behind `scheduler`: its scheduling step and its workers' rest."""
        self._members[scheduler] = _Member(pump, rest)

    def leave(self, scheduler: Scheduler) -> None:
        """A model stopped: its threads no longer count, and its poller is forgotten."""
        self._members.pop(scheduler, None)
        if self._poller is not None and self._poller[0] is scheduler:
            self._poller = None

    @property
    def busy_threads(self) -> int:
        """Worker threads busy now in every model sharing these cores (summed, so a model that leaves takes its
        own with it)."""
        return sum(scheduler.busy_threads for scheduler in self._members)

    def hand_over_polling(self, scheduler: Scheduler, worker_id: int, polls: bool) -> int | None:
        """`scheduler`'s worker `worker_id` starts a batch and, if `polls`, may poll after it. The worker polling
        until now must stop: returned if it is another of `scheduler`'s own (its rest goes with the batch), told
        through its engine's `rest` if it belongs to another model."""
        previous, self._poller = self._poller, (scheduler, worker_id) if polls else None
        if previous is None or previous == (scheduler, worker_id):
            return None
        owner, polling = previous
        if owner is scheduler:
            return polling
        member = self._members.get(owner)
        if member is not None and member.rest is not None:
            member.rest(polling)
        return None

    def forget(self, scheduler: Scheduler, worker_id: int) -> None:
        """A worker left its set: it no longer polls."""
        if self._poller == (scheduler, worker_id):
            self._poller = None

    def pump(self) -> None:
        """Threads were freed: let every model with ready rows schedule them, the one waiting longest first."""
        waiting = [(scheduler.oldest_arrival(), scheduler) for scheduler in self._members if scheduler.ready]
        for _, scheduler in sorted(waiting, key=lambda entry: entry[0] or 0.0):
            member = self._members.get(scheduler)
            if member is not None and member.pump is not None:
                member.pump()
