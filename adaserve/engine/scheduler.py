"""The elastic scheduler's state: ready rows in arrival order, idle workers, rows in flight.

Pure logic (no processes, sockets or clocks of its own): the engine tells it what arrived and what finished, and
`schedule(now)` answers which batches to start. Tests drive it directly.

Priority (Triton's `priority` request parameter, as levels: 1 is served first) decides where the next batch starts:
at the first waiting run of the highest level, instead of the front of the queue. What rides along is still decided
by the pool: the rows contiguous after that run, whatever their level, since a worker reads its batch in place. With
one level waiting, the batch starts at the front, as Ebird's queue does.
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter, deque
from dataclasses import dataclass

from adaserve.engine.batching import BatchingPolicy, QueueView, WorkerSlot


@dataclass
class ReadyRun:
    """Rows [start, start + rows) of the pool, ready since `arrived_at`, at priority `level` (lower runs first)."""

    start: int
    rows: int
    arrived_at: float
    level: int = 0


@dataclass(frozen=True)
class Batch:
    """Rows [start, start + rows) given to one worker."""

    id: int
    worker_id: int
    start: int
    rows: int
    dispatched_at: float
    threads: int = 1  # the worker's threads, counted busy until the batch finishes


class Scheduler:
    """Algorithm 1's loop over a batching policy: take ready slots → feed idle workers → account in-flight rows.

    `max_busy_threads` is the CPU form of Ebird's engine: on a GPU, batches of several workers run side by side on
    the SMs; on a CPU, workers whose threads exceed the cores only time-share them, and a burst of small batches
    slows the large one beside it. So a worker is offered work only while the busy workers' threads leave room for
    its own (any worker may start when none is busy). None: no limit, Ebird's GPU form.
    """

    def __init__(self, policy: BatchingPolicy, max_inflight: int, *, max_busy_threads: int | None = None) -> None:
        self.policy = policy
        self.max_inflight = max_inflight
        self.max_busy_threads = max_busy_threads
        self.busy_threads = 0
        self.inflight = 0
        self.ready = 0
        self._queue: deque[ReadyRun] = deque()
        self._levels: Counter[int] = Counter()  # runs waiting at each priority level (no zero counts)
        self._workers: dict[int, WorkerSlot] = {}
        self._idle: list[tuple[int, int]] = []  # (-batch, id): largest granularity first, like Ebird's idle queue
        self._batches: dict[int, Batch] = {}
        self._ids = itertools.count()

    # -- workers ---------------------------------------------------------------------------------------------
    def add_worker(self, worker: WorkerSlot) -> None:
        """A worker that is up and waiting for work."""
        self._workers[worker.id] = worker
        bisect.insort(self._idle, (-worker.batch, worker.id))

    def remove_worker(self, worker_id: int) -> Batch | None:
        """Forget a worker (stopped or dead); returns the batch it held, if any, for the caller to re-run or fail."""
        worker = self._workers.pop(worker_id, None)
        if worker is not None and (-worker.batch, worker_id) in self._idle:
            self._idle.remove((-worker.batch, worker_id))
        held = next((b for b in self._batches.values() if b.worker_id == worker_id), None)
        if held is not None:
            self.finish(held.id, worker_back=False)
        return held

    def retire_worker(self, worker_id: int) -> bool:
        """Give a worker no more work; a batch it holds still finishes normally. True if it was idle (free to stop).

        This is how a worker set is replaced with no downtime: the new set is added, the old one retired.
        """
        worker = self._workers.pop(worker_id, None)
        if worker is None:
            return True  # not added yet (a replacement still starting): it never gets work, stop it now
        if (-worker.batch, worker_id) in self._idle:
            self._idle.remove((-worker.batch, worker_id))
            return True
        return False

    @property
    def workers(self) -> list[WorkerSlot]:
        return list(self._workers.values())

    # -- rows ------------------------------------------------------------------------------------------------
    def enqueue(self, start: int, rows: int, arrived_at: float, level: int = 0) -> None:
        self._queue.append(ReadyRun(start, rows, arrived_at, level))
        self._levels[level] += 1
        self.ready += rows

    def requeue_front(self, start: int, rows: int, arrived_at: float, level: int = 0) -> None:
        """Put rows back at the head of the queue (a worker died holding them; they run next of their level)."""
        self._queue.appendleft(ReadyRun(start, rows, arrived_at, level))
        self._levels[level] += 1
        self.ready += rows

    def withdraw(self, start: int, rows: int) -> bool:
        """Take a request's rows back out of the queue if none has started; False if they are not all waiting."""
        for run in self._queue:
            if (run.start, run.rows) == (start, rows):
                self._queue.remove(run)
                self._left(run)
                return True
        return False

    # -- the algorithm ---------------------------------------------------------------------------------------
    def schedule(self, now: float) -> list[Batch]:
        """Start every batch the policy allows now."""
        started: list[Batch] = []
        while self._idle and self.ready:
            choice = self.policy.pick(self._view(now), self._idle_slots())
            if choice is None:
                break
            worker, rows = choice
            started.append(self._start(worker, rows, now))
        return started

    def running(self, batch_id: int) -> Batch | None:
        """The batch with this id if a worker is computing it now."""
        return self._batches.get(batch_id)

    def finish(self, batch_id: int, *, worker_back: bool = True) -> Batch:
        """A batch is done (or abandoned); its rows leave the in-flight count and its worker is idle again."""
        batch = self._batches.pop(batch_id)
        self.inflight -= batch.rows
        self.busy_threads -= batch.threads
        worker = self._workers.get(batch.worker_id)
        if worker_back and worker is not None:
            bisect.insort(self._idle, (-worker.batch, worker.id))
        return batch

    def wake_after_s(self, now: float) -> float | None:
        """When the policy declined rows that are waiting, the delay after which it should be asked again."""
        if not self.ready or not self._workers:
            return None  # nothing waits, or rows wait for a worker to (re)start, which will schedule them
        return self.policy.wake_after_s(self._view(now))

    def oldest_arrival(self) -> float | None:
        return self._queue[0].arrived_at if self._queue else None

    # -- helpers ---------------------------------------------------------------------------------------------
    def _view(self, now: float) -> QueueView:
        return QueueView(
            front_run=self._front_run(self._head()),
            ready=self.ready,
            headroom=self.max_inflight - self.inflight,
            inflight=self.inflight,
            oldest_wait_s=now - self._queue[0].arrived_at,
            smallest_batch=min(w.batch for w in self._workers.values()),
            thread_room=None if self.max_busy_threads is None else self.max_busy_threads - self.busy_threads,
        )

    def _idle_slots(self) -> list[WorkerSlot]:
        """Idle workers, largest granularity first, whose threads fit beside the busy ones."""
        idle = [self._workers[worker_id] for _, worker_id in self._idle]
        if self.max_busy_threads is None or self.busy_threads == 0:
            return idle
        room = self.max_busy_threads - self.busy_threads
        return [worker for worker in idle if worker.threads <= room]

    def _head(self) -> int:
        """Where in the queue the next batch starts: the first run of the highest priority (the lowest level)."""
        if len(self._levels) == 1:  # one level waits: the front, in arrival order
            return 0
        top = min(self._levels)
        return next(index for index, run in enumerate(self._queue) if run.level == top)

    def _front_run(self, head: int) -> int:
        """Ready rows that are contiguous in the pool from the run at `head` on (a batch is read in place, so no
        gaps)."""
        limit = max(w.batch for w in self._workers.values())
        run = self._queue[head].rows
        end = self._queue[head].start + run
        for item in itertools.islice(self._queue, head + 1, None):
            if item.start != end or run >= limit:
                break
            run += item.rows
            end += item.rows
        return run

    def _start(self, worker: WorkerSlot, rows: int, now: float) -> Batch:
        start = self._take(rows)
        self._idle.remove((-worker.batch, worker.id))
        batch = Batch(next(self._ids), worker.id, start, rows, now, worker.threads)
        self._batches[batch.id] = batch
        self.inflight += rows
        self.busy_threads += worker.threads
        return batch

    def _take(self, rows: int) -> int:
        """Take `rows` contiguous rows from the queue's head run on (`_head`), splitting the last run if needed."""
        head = self._head()
        start = self._queue[head].start
        left = rows
        while left:
            run = self._queue[head]
            if run.rows <= left:
                left -= run.rows
                del self._queue[head]
                self._left(run)
            else:
                run.start += left
                run.rows -= left
                self.ready -= left
                left = 0
        return start

    def _left(self, run: ReadyRun) -> None:
        """A whole run left the queue."""
        self.ready -= run.rows
        self._levels[run.level] -= 1
        if not self._levels[run.level]:
            del self._levels[run.level]
