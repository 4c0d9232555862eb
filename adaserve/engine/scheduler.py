"""The elastic scheduler's state: ready rows in arrival order, idle workers, rows in flight.

Pure logic (no processes, sockets or clocks of its own): the engine tells it what arrived and what finished, and
`schedule(now)` answers which batches to start. Tests drive it directly.

Priority (Triton's `priority` request parameter, as levels: 1 is served first) decides which rows the next batch
takes (`_window`). A worker reads its batch in place, so a batch is a contiguous stretch of the pool; with several
levels waiting it is the stretch that holds the first row of the highest level's oldest request and, of those, the
one with the most rows of that level, the earliest on a tie. While the queue is shorter than a batch that is the
whole queue from the front, as in arrival order; only a backlog is cut into. The engine's levels are queue ranks
(`schedule_policy.queue_rank`), so a request its queue policy delayed ranks behind its level's requests in time.
Two simpler forms lost (`benchmarks/README.md` §2, "Priority"): starting every batch at the high-priority request
left the rows stored before it as fragments that ran as small batches, and a ring of slots per level (no mixing at
all) made the high-priority batches so small that at 90% of capacity the other requests were refused.
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter, deque
from dataclasses import dataclass

from adaserve.engine.batching import BatchingPolicy, QueueView, WorkerSlot
from adaserve.engine.cores import Cores

#: Workers poll between batches only while some worker was busy less than this share of the last `BUSY_WINDOW_S`:
#: polling pays where a worker would sleep between requests, and past that the next batch mostly comes within a
#: wake-up anyway while the poll takes CPU the frontend needs (on two cores, elastic at 3,951 req/s: 8.5 ms mean
#: polling after every batch against 3.5 ms without).
POLL_BELOW_BUSY_SHARE = 0.5
BUSY_WINDOW_S = 1.0
#: `saturated_busy_threads` replaces the busy-thread limit while some worker was busy this share of the last
#: `BUSY_WINDOW_S` or more. Unlimited streams at half a GPU's load leave no stream busy about half the time; one
#: stream at a time near capacity is busy nearly all of it, so the switch back comes only as the load falls.
SATURATED_BUSY_SHARE = 0.8
#: Weight of the newest batch in a model's smoothed batch time (`Scheduler.batch_s`).
BATCH_TIME_SMOOTHING = 0.2
#: A model waits for another model's running batch (on shared cores) expected to end within this many of its own
#: batch times, and starts beside it otherwise. More than one, so that two models of about the same batch time, whose
#: estimates differ by noise, always wait for each other (the shared-cores benchmark's case).
WAIT_FOR_OTHERS_BATCHES = 2.0


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
    spin: bool = False  # the worker may poll for its next batch after this one (`Scheduler`'s idle_spin rules)
    rests: tuple[int, ...] = ()  # workers to tell to stop polling as this batch starts (it takes a core)


class Scheduler:
    """Algorithm 1's loop over a batching policy: take ready slots → feed idle workers → account in-flight rows.

    `max_busy_threads` is the CPU form of Ebird's engine: on a GPU, batches of several workers run side by side on
    the SMs; on a CPU, workers whose threads exceed the cores only time-share them, and a burst of small batches
    slows the large one beside it. So a worker is offered work only while the busy workers' threads leave room for
    its own (any worker may start when none is busy). None: no limit, Ebird's GPU form. The policy sees which idle
    worker finished last (`QueueView.warm`): under the limit that one takes the last batch if it holds the rows.
    `cores`: the schedulers of the other models on the same cores (`adaserve.engine.cores`); the limit counts their
    busy threads too, unless every batch they run is expected to go on for more than `WAIT_FOR_OTHERS_BATCHES` of
    this model's own batch times (`batch_s`, smoothed from the batches `finish` was told the time of): waiting would
    then cost more than sharing a core (an MLP behind a 28 ms batch of another model averaged 6.4 ms against 0.95
    beside it). Their busy threads and pollers also hold cores a poller here cannot have. Without it the model has
    the cores to itself.

    `idle_spin`: a worker that starts alone, with no more threads than the limit, while workers have been busy less
    than `POLL_BELOW_BUSY_SHARE` of the last second, may poll for its next batch once this one is done instead of
    sleeping (`Batch.spin`), so at low load the next request finds it awake. It holds that leave until it starts
    again or another worker starts, which takes the core it would poll on (`Batch.rests` names it then). The busy
    share needs `finish` to be told the time. Nor may it poll unless `cores.spare_cores` (the CPUs less what the
    frontend and other programs, a client on the same machine say, used lately) leave a whole core for the poller
    beside what other models hold. The model's own batches are not counted beside it: they run on the poller's core
    (at concurrency 1 over gRPC, counting them there stopped the poll that made the MLP 1.2x faster).

    `saturated_busy_threads`: the limit while workers were busy `SATURATED_BUSY_SHARE` of the last second or more
    (None: `max_busy_threads` always), so under load rows wait for a busy worker and grow into one larger batch.
    """

    def __init__(
        self,
        policy: BatchingPolicy,
        max_inflight: int,
        *,
        max_busy_threads: int | None = None,
        saturated_busy_threads: int | None = None,
        idle_spin: bool = False,
        cores: Cores | None = None,
    ) -> None:
        self.policy = policy
        self.max_inflight = max_inflight
        self.max_busy_threads = max_busy_threads
        self.saturated_busy_threads = saturated_busy_threads
        self._limit = max_busy_threads  # the limit in force for this scheduling pass (`_busy_limit`)
        self.idle_spin = idle_spin
        self._warm: int | None = None  # the worker whose batch finished last, while it stays idle
        self._busy_since: float | None = None  # when some worker last turned busy, while one is
        self._busy_spans: deque[tuple[float, float]] = deque()  # (start, end) of recent spans with a worker busy
        self._busy_total = 0.0  # their summed length
        self.busy_threads = 0
        self.batch_s: float | None = None  # smoothed dispatch-to-finish time of this model's batches
        self.inflight = 0
        self.ready = 0
        self._queue: deque[ReadyRun] = deque()
        self._levels: Counter[int] = Counter()  # runs waiting at each priority level (no zero counts)
        self._level_rows: Counter[int] = Counter()  # rows waiting at each priority level
        self._workers: dict[int, WorkerSlot] = {}
        self._idle: list[tuple[int, int]] = []  # (-batch, id): largest granularity first, like Ebird's idle queue
        self._batches: dict[int, Batch] = {}
        self._ids = itertools.count()
        self.cores = cores or Cores()  # also holds which workers poll, of this model and the others
        self.cores.join(self)

    # -- workers ---------------------------------------------------------------------------------------------
    def add_worker(self, worker: WorkerSlot) -> None:
        """A worker that is up and waiting for work."""
        self._workers[worker.id] = worker
        bisect.insort(self._idle, (-worker.batch, worker.id))

    def remove_worker(self, worker_id: int) -> Batch | None:
        """Forget a worker (stopped or dead); returns the batch it held, if any, for the caller to re-run or fail."""
        worker = self._workers.pop(worker_id, None)
        self._forget(worker_id)
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
        self._forget(worker_id)
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
        self._joined(level, rows)

    def requeue_front(self, start: int, rows: int, arrived_at: float, level: int = 0) -> None:
        """Put rows back at the head of the queue (a worker died holding them; they run next of their level)."""
        self._queue.appendleft(ReadyRun(start, rows, arrived_at, level))
        self._joined(level, rows)

    def withdraw(self, start: int, rows: int) -> bool:
        """Take a request's rows back out of the queue if none has started; False if they are not all waiting."""
        run = self._waiting_run(start, rows)
        if run is None:
            return False
        self._queue.remove(run)
        self._left(run)
        return True

    def move(self, start: int, rows: int, level: int) -> bool:
        """Move a request's rows, all still waiting, to another level in place; False if they are not all waiting.
        (A queue policy's `delay`: the request keeps its slots and its place in the pool, and only loses rank.)"""
        run = self._waiting_run(start, rows)
        if run is None:
            return False
        self._left(run)
        run.level = level
        self._joined(level, rows)
        return True

    def rows_at(self, level: int) -> int:
        """Rows waiting at `level`."""
        return self._level_rows[level]

    # -- the algorithm ---------------------------------------------------------------------------------------
    def schedule(self, now: float) -> list[Batch]:
        """Start every batch the policy allows now."""
        # A batch started in this pass adds no busy time before `now`, so the share holds for the whole pass.
        busy = self._busy_share(now)
        self._limit = self._busy_limit(busy)
        started: list[Batch] = []
        while self._idle and self.ready:
            busy_threads = self._busy_counted(now)
            choice = self.policy.pick(self._view(now, busy_threads), self._idle_slots(busy_threads))
            if choice is None:
                break
            worker, rows = choice
            started.append(self._start(worker, rows, now, busy))
        return started

    def running(self, batch_id: int) -> Batch | None:
        """The batch with this id if a worker is computing it now."""
        return self._batches.get(batch_id)

    def finish(self, batch_id: int, *, worker_back: bool = True, now: float | None = None) -> Batch:
        """A batch is done (or abandoned); its rows leave the in-flight count and its worker is idle again. `now`:
        when, for the busy share that decides polling (without it the span is not counted)."""
        batch = self._batches.pop(batch_id)
        if now is not None and worker_back:
            took, smoothed = now - batch.dispatched_at, self.batch_s
            self.batch_s = took if smoothed is None else smoothed + BATCH_TIME_SMOOTHING * (took - smoothed)
        self.inflight -= batch.rows
        self.busy_threads -= batch.threads
        if self.busy_threads == 0 and self._busy_since is not None:
            if now is not None:
                self._busy_spans.append((self._busy_since, now))
                self._busy_total += now - self._busy_since
            self._busy_since = None
        worker = self._workers.get(batch.worker_id)
        if worker_back and worker is not None:
            bisect.insort(self._idle, (-worker.batch, worker.id))
            self._warm = worker.id
        return batch

    def wake_after_s(self, now: float) -> float | None:
        """When the policy declined rows that are waiting, the delay after which it should be asked again."""
        if not self.ready or not self._workers:
            return None  # nothing waits, or rows wait for a worker to (re)start, which will schedule them
        busy_threads = self._busy_counted(now)
        if not self._idle_slots(busy_threads):
            return None  # every worker that could take them is busy: a batch's end schedules them
        return self.policy.wake_after_s(self._view(now, busy_threads))

    def oldest_arrival(self) -> float | None:
        return self._queue[0].arrived_at if self._queue else None

    # -- helpers ---------------------------------------------------------------------------------------------
    def _view(self, now: float, busy_threads: int) -> QueueView:
        return QueueView(
            front_run=self._front_run(*self._window(self._largest_batch())),
            ready=self.ready,
            headroom=self.max_inflight - self.inflight,
            inflight=self.inflight,
            oldest_wait_s=now - self._queue[0].arrived_at,
            smallest_batch=min(w.batch for w in self._workers.values()),
            thread_room=None if self._limit is None else self._limit - busy_threads,
            warm=self._warm,
        )

    def _idle_slots(self, busy_threads: int) -> list[WorkerSlot]:
        """Idle workers, largest granularity first, whose threads fit beside the `busy_threads` the limit counts."""
        idle = [self._workers[worker_id] for _, worker_id in self._idle]
        if self._limit is None or busy_threads == 0:
            return idle
        room = self._limit - busy_threads
        return [worker for worker in idle if worker.threads <= room]

    def _busy_counted(self, now: float) -> int:
        """The busy threads the limit counts at `now`: every model's on these cores, or only this model's own where
        each of the others' running batches is expected to run on for more than `WAIT_FOR_OTHERS_BATCHES` of this
        model's batches (while this model has no batch time yet, every model's)."""
        if self.batch_s is None or self.cores.others_end_within(self, WAIT_FOR_OTHERS_BATCHES * self.batch_s, now):
            return self.cores.busy_threads
        return self.busy_threads

    def running_ends(self) -> list[float]:
        """When this model's running batches are expected to end (a batch time after each was dispatched; at once
        while it has no batch time yet)."""
        return [batch.dispatched_at + (self.batch_s or 0.0) for batch in self._batches.values()]

    def _window(self, size: int) -> tuple[int, int]:
        """Where a batch of `size` rows starts: (queue index of a run, rows of it to leave before the batch). With
        one level waiting, the front. Otherwise among the stretches of `size` contiguous rows that hold the first
        row of the highest level's oldest run, the one with the most rows of that level, the earliest on a tie."""
        if len(self._levels) == 1:  # one level waits: arrival order
            return 0, 0
        top = min(self._levels)
        target = next(index for index, run in enumerate(self._queue) if run.level == top)
        first, before = target, 0  # the runs stored just before the target that a window may still reach
        while first > 0 and before < size - 1 and self._contiguous(first - 1):
            first -= 1
            before += self._queue[first].rows
        levels: list[int] = []  # the level of each row from `first` on, as far as a window from there reaches
        for index in range(first, len(self._queue)):
            if len(levels) >= before + size or (index > first and not self._contiguous(index - 1)):
                break
            levels += [self._queue[index].level] * self._queue[index].rows
        tops = [level == top for level in levels]
        offsets = range(max(0, before - size + 1), before + 1)  # windows that hold the target's first row
        best = max(offsets, key=lambda o: (o + size <= len(levels), sum(tops[o : o + size]), -o))
        index, skip = first, best
        while skip >= self._queue[index].rows:
            skip -= self._queue[index].rows
            index += 1
        return index, skip

    def _contiguous(self, index: int) -> bool:
        """Whether the run at `index + 1` is stored right after the one at `index`."""
        run = self._queue[index]
        return run.start + run.rows == self._queue[index + 1].start

    def _largest_batch(self) -> int:
        return max(w.batch for w in self._workers.values())

    def _front_run(self, head: int, skip: int = 0) -> int:
        """Ready rows contiguous in the pool from row `skip` of the run at `head` on (a batch is read in place, so
        no gaps), counted until they reach the largest worker's batch."""
        limit = self._largest_batch()
        run = self._queue[head].rows - skip
        end = self._queue[head].start + self._queue[head].rows
        for item in itertools.islice(self._queue, head + 1, None):
            if item.start != end or run >= limit:
                break
            run += item.rows
            end += item.rows
        return run

    def _start(self, worker: WorkerSlot, rows: int, now: float, busy: float) -> Batch:
        """Give `worker` the next `rows` ready rows at `now`; `busy`: the busy share, which decides its polling."""
        start = self._take(rows)
        self._idle.remove((-worker.batch, worker.id))
        if self._warm == worker.id:
            self._warm = None  # busy now; whichever worker finishes next is the warm one
        rested = self.cores.starting(self, worker.id, worker.threads)
        rests = () if rested is None else (rested,)
        alone = self.busy_threads == 0 and worker.threads <= (self._limit or worker.threads)
        # The poller needs a core of its own; its model's next batches run on that core.
        room = self.cores.spare_cores - 1 - self.cores.held_by_others(self)
        spin = self.idle_spin and alone and busy < POLL_BELOW_BUSY_SHARE and room >= 0
        if spin:
            self.cores.polls(self, worker.id)
        if self.busy_threads == 0:
            self._busy_since = now
        batch = Batch(next(self._ids), worker.id, start, rows, now, worker.threads, spin, rests)
        self._batches[batch.id] = batch
        self.inflight += rows
        self.busy_threads += worker.threads
        return batch

    def _take(self, rows: int) -> int:
        """Take `rows` contiguous rows from where `_window` starts a batch of that size, splitting the first run
        (its rows before the batch stay, as a run of their own) and the last (its rows after the batch stay)."""
        head, skip = self._window(rows)
        if skip:
            run = self._queue[head]
            self._queue.insert(head, ReadyRun(run.start, skip, run.arrived_at, run.level))
            self._levels[run.level] += 1
            run.start += skip
            run.rows -= skip
            head += 1
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
                self._level_rows[run.level] -= left
                left = 0
        return start

    def _busy_limit(self, busy: float) -> int | None:
        """The busy-thread limit in force at busy share `busy`: the saturated one while workers were busy enough."""
        if self.saturated_busy_threads is None or busy < SATURATED_BUSY_SHARE:
            return self.max_busy_threads
        return min(self.saturated_busy_threads, self.max_busy_threads or self.saturated_busy_threads)

    def _busy_share(self, now: float) -> float:
        """The share of the last `BUSY_WINDOW_S` during which some worker was busy."""
        since = now - BUSY_WINDOW_S
        while self._busy_spans and self._busy_spans[0][1] <= since:
            start, end = self._busy_spans.popleft()
            self._busy_total -= end - start
        if not self._busy_spans:
            self._busy_total = 0.0  # no rounding left over from the sums
        busy = self._busy_total - max(0.0, since - self._busy_spans[0][0]) if self._busy_spans else 0.0
        if self._busy_since is not None:
            busy += now - max(self._busy_since, since)
        return busy / BUSY_WINDOW_S

    def _forget(self, worker_id: int) -> None:
        """A worker that leaves the set needs no rest (its pipe closes or its Stop comes) and takes no batch."""
        self.cores.forget(self, worker_id)
        if self._warm == worker_id:
            self._warm = None

    def _waiting_run(self, start: int, rows: int) -> ReadyRun | None:
        """The run holding exactly a request's rows [start, start + rows), if they all wait as one still."""
        return next((run for run in self._queue if (run.start, run.rows) == (start, rows)), None)

    def _joined(self, level: int, rows: int) -> None:
        """A whole run joined the queue."""
        self.ready += rows
        self._levels[level] += 1
        self._level_rows[level] += rows

    def _left(self, run: ReadyRun) -> None:
        """A whole run left the queue."""
        self.ready -= run.rows
        self._level_rows[run.level] -= run.rows
        self._levels[run.level] -= 1
        if not self._levels[run.level]:
            del self._levels[run.level]
