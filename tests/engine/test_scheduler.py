"""The scheduler driven directly: explicit `now` values, rows enqueued at chosen slots, batches finished by hand."""

from __future__ import annotations

import random

import pytest

from adaserve.engine.batching import (
    BatchingPolicy,
    ElasticPolicy,
    FixedTimeoutPolicy,
    NoBatchingPolicy,
    WorkerSlot,
)
from adaserve.engine.scheduler import Batch, Scheduler

EBIRD = (16, 8, 4, 2, 1, 1)


def make_scheduler(*batches: int, policy: BatchingPolicy | None = None, max_inflight: int | None = None) -> Scheduler:
    """Workers with ids 0, 1, … and the given granularities; MaxInf defaults to their sum, as in the config."""
    scheduler = Scheduler(policy or ElasticPolicy(), sum(batches) if max_inflight is None else max_inflight)
    for worker_id, batch in enumerate(batches):
        scheduler.add_worker(WorkerSlot(worker_id, batch))
    return scheduler


def spans(batches: list[Batch]) -> list[tuple[int, int, int]]:
    """(worker id, first slot, rows) of each batch."""
    return [(b.worker_id, b.start, b.rows) for b in batches]


def test_ebird_fig7_example() -> None:
    scheduler = make_scheduler(*EBIRD)
    scheduler.enqueue(0, 12, arrived_at=0.0)
    batches = scheduler.schedule(now=1.0)
    assert spans(batches) == [(1, 0, 8), (2, 8, 4)]
    assert all(b.dispatched_at == 1.0 for b in batches)
    assert (scheduler.ready, scheduler.inflight) == (0, 12)


def test_seven_rows_go_to_4_2_1() -> None:
    scheduler = make_scheduler(*EBIRD)
    scheduler.enqueue(0, 7, arrived_at=0.0)
    assert spans(scheduler.schedule(now=0.0)) == [(2, 0, 4), (3, 4, 2), (4, 6, 1)]


def test_adjacent_runs_form_one_batch() -> None:
    scheduler = make_scheduler(8)
    scheduler.enqueue(0, 3, arrived_at=0.0)
    scheduler.enqueue(3, 5, arrived_at=0.1)
    assert spans(scheduler.schedule(now=0.2)) == [(0, 0, 8)]
    assert scheduler.ready == 0


def test_a_batch_never_spans_a_memory_gap() -> None:
    """6 rows are ready, but in two runs at slots 0..2 and 10..12: the batch-8 worker takes only the first."""
    scheduler = make_scheduler(8)
    scheduler.enqueue(0, 3, arrived_at=0.0)
    scheduler.enqueue(10, 3, arrived_at=0.1)
    [first] = scheduler.schedule(now=0.2)
    assert spans([first]) == [(0, 0, 3)]
    assert scheduler.ready == 3
    scheduler.finish(first.id)
    assert spans(scheduler.schedule(now=0.3)) == [(0, 10, 3)]


def test_front_run_ends_at_the_gap_for_the_policy() -> None:
    """With 4 + 4 ready across a gap, the batch-8 worker is not a fit; the 4 takes the front run."""
    scheduler = make_scheduler(8, 4)
    scheduler.enqueue(0, 4, arrived_at=0.0)
    scheduler.enqueue(20, 4, arrived_at=0.0)
    assert spans(scheduler.schedule(now=0.0)) == [(1, 0, 4)]
    assert scheduler.ready == 4


def test_a_run_is_split_across_two_workers() -> None:
    scheduler = make_scheduler(4, 2)
    scheduler.enqueue(5, 6, arrived_at=0.0)
    assert spans(scheduler.schedule(now=0.0)) == [(0, 5, 4), (1, 9, 2)]


def test_the_rest_of_a_split_run_waits_for_the_next_idle_worker() -> None:
    scheduler = make_scheduler(4)
    scheduler.enqueue(0, 5, arrived_at=0.0)
    [batch] = scheduler.schedule(now=0.0)
    assert spans([batch]) == [(0, 0, 4)]
    assert scheduler.schedule(now=1.0) == []  # the only worker is busy
    assert scheduler.oldest_arrival() == 0.0
    scheduler.finish(batch.id)
    assert spans(scheduler.schedule(now=2.0)) == [(0, 4, 1)]  # all workers larger than 1 row: a partial batch


def test_finish_returns_the_worker_and_frees_inflight() -> None:
    scheduler = make_scheduler(2)
    scheduler.enqueue(0, 4, arrived_at=0.0)
    [batch] = scheduler.schedule(now=0.0)
    assert scheduler.inflight == 2
    assert scheduler.finish(batch.id) == batch
    assert scheduler.inflight == 0
    assert spans(scheduler.schedule(now=0.0)) == [(0, 2, 2)]
    with pytest.raises(KeyError):
        scheduler.finish(batch.id)  # a batch finishes once


def test_max_inflight_bounds_the_rows_dispatched() -> None:
    scheduler = make_scheduler(4, 2, 2, max_inflight=6)
    scheduler.enqueue(0, 8, arrived_at=0.0)
    first = scheduler.schedule(now=0.0)
    assert spans(first) == [(0, 0, 4), (1, 4, 2)]
    assert (scheduler.inflight, scheduler.ready) == (6, 2)
    assert scheduler.schedule(now=0.0) == []  # worker 2 is idle, but no headroom
    scheduler.finish(first[1].id)
    assert spans(scheduler.schedule(now=0.0)) == [(1, 6, 2)]


def test_remove_busy_worker_returns_its_batch_and_requeued_rows_run_first() -> None:
    scheduler = make_scheduler(2, 2)
    scheduler.enqueue(0, 2, arrived_at=0.0)
    scheduler.enqueue(2, 2, arrived_at=0.1)
    scheduler.enqueue(4, 2, arrived_at=0.2)
    dead, alive = scheduler.schedule(now=0.3)
    assert spans([dead, alive]) == [(0, 0, 2), (1, 2, 2)]

    assert scheduler.remove_worker(0) == dead
    assert scheduler.inflight == 2
    assert [w.id for w in scheduler.workers] == [1]
    scheduler.requeue_front(dead.start, dead.rows, arrived_at=0.0)
    assert (scheduler.ready, scheduler.oldest_arrival()) == (4, 0.0)

    scheduler.finish(alive.id)
    assert spans(scheduler.schedule(now=0.4)) == [(1, 0, 2)]  # the requeued rows, before slots 4..5


def test_remove_idle_worker_returns_nothing_and_it_gets_no_work() -> None:
    scheduler = make_scheduler(4, 1)
    assert scheduler.remove_worker(0) is None
    assert scheduler.remove_worker(7) is None  # unknown: nothing happens
    scheduler.enqueue(0, 4, arrived_at=0.0)
    assert spans(scheduler.schedule(now=0.0)) == [(1, 0, 1)]


def test_a_removed_workers_batch_does_not_bring_it_back() -> None:
    scheduler = make_scheduler(2, 1)
    scheduler.enqueue(0, 2, arrived_at=0.0)
    [batch] = scheduler.schedule(now=0.0)
    scheduler.remove_worker(batch.worker_id)
    scheduler.enqueue(2, 2, arrived_at=1.0)
    assert spans(scheduler.schedule(now=1.0)) == [(1, 2, 1)]


def test_rows_wait_while_there_is_no_worker() -> None:
    """The only worker died holding rows; they are requeued and wait for its replacement (the engine then pumps)."""
    scheduler = make_scheduler(1)
    scheduler.enqueue(0, 1, arrived_at=0.0)
    [batch] = scheduler.schedule(now=0.0)
    held = scheduler.remove_worker(0)
    assert held == batch
    scheduler.requeue_front(batch.start, batch.rows, arrived_at=0.0)
    scheduler.enqueue(1, 1, arrived_at=0.5)  # a request arriving while the replacement starts

    assert scheduler.schedule(now=1.0) == []
    assert scheduler.wake_after_s(now=1.0) is None  # nothing a timer could start

    scheduler.add_worker(WorkerSlot(1, 1))
    assert spans(scheduler.schedule(now=2.0)) == [(1, 0, 1)]


def test_fixed_timeout_waits_for_the_delay_then_runs_one_batch_per_worker() -> None:
    scheduler = make_scheduler(8, policy=FixedTimeoutPolicy(8, max_queue_delay_us=500_000))
    scheduler.enqueue(0, 3, arrived_at=10.0)
    assert scheduler.schedule(now=10.0) == []
    assert scheduler.wake_after_s(now=10.25) == 0.25
    [batch] = scheduler.schedule(now=10.5)
    assert spans([batch]) == [(0, 0, 3)]

    scheduler.enqueue(3, 8, arrived_at=10.5)  # a full batch, but its one worker is busy
    assert scheduler.schedule(now=11.0) == []
    assert scheduler.wake_after_s(now=11.0) is None  # the batch's end is the next event
    scheduler.finish(batch.id)
    assert spans(scheduler.schedule(now=11.0)) == [(0, 3, 8)]


def test_fixed_timeout_feeds_a_second_worker_while_the_first_runs() -> None:
    """Two workers are Triton's two model instances: the second takes the next batch once it is due."""
    scheduler = make_scheduler(8, 8, policy=FixedTimeoutPolicy(8, max_queue_delay_us=500_000))
    scheduler.enqueue(0, 8, arrived_at=0.0)
    assert spans(scheduler.schedule(now=0.0)) == [(0, 0, 8)]
    scheduler.enqueue(8, 2, arrived_at=0.1)
    assert scheduler.schedule(now=0.2) == []
    assert scheduler.wake_after_s(now=0.2) == pytest.approx(0.4)
    assert spans(scheduler.schedule(now=0.6)) == [(1, 8, 2)]


def test_fixed_timeout_sets_no_timer_while_the_busy_thread_limit_holds_every_worker() -> None:
    """Rows past their delay whose idle worker the limit keeps out: no timer (it would fire at once, again and
    again); the running batch's end schedules them."""
    scheduler = Scheduler(FixedTimeoutPolicy(8, max_queue_delay_us=1000), 16, max_busy_threads=1)
    scheduler.add_worker(WorkerSlot(0, 8))
    scheduler.add_worker(WorkerSlot(1, 8))
    scheduler.enqueue(0, 8, arrived_at=0.0)
    [batch] = scheduler.schedule(now=0.0)
    scheduler.enqueue(8, 2, arrived_at=0.0)
    assert scheduler.schedule(now=1.0) == []
    assert scheduler.wake_after_s(now=1.0) is None
    scheduler.finish(batch.id)
    assert spans(scheduler.schedule(now=1.0)) == [(0, 8, 2)]


def test_no_batching_gives_one_row_to_each_idle_worker() -> None:
    scheduler = make_scheduler(1, 1, 4, policy=NoBatchingPolicy())
    scheduler.enqueue(0, 5, arrived_at=0.0)
    assert spans(scheduler.schedule(now=0.0)) == [(1, 0, 1), (0, 1, 1), (2, 2, 1)]
    assert scheduler.ready == 2


def test_wake_after_is_none_with_nothing_ready() -> None:
    scheduler = make_scheduler(4, policy=FixedTimeoutPolicy(4, 1000))
    assert scheduler.wake_after_s(now=0.0) is None
    assert scheduler.oldest_arrival() is None


# -- randomized simulation -------------------------------------------------------------------------------------


class Simulation:
    """Rows arrive in runs at random slots and priority levels, batches finish in random order, and workers
    sometimes die."""

    def __init__(self, rng: random.Random, policy: BatchingPolicy) -> None:
        self.rng = rng
        self.batches = tuple(rng.choice((1, 1, 2, 3, 4, 8, 16)) for _ in range(rng.randint(1, 5)))
        # fixed-timeout runs whole batches below a MaxInf smaller than a worker (test_batching's
        # test_fixed_respects_max_inflight); the other policies get any MaxInf, partial batches included
        lowest = max(self.batches) if isinstance(policy, FixedTimeoutPolicy) else 1
        self.max_inflight = rng.randint(lowest, sum(self.batches) + 4)
        self.scheduler = make_scheduler(*self.batches, policy=policy, max_inflight=self.max_inflight)
        self.scheduler.max_busy_threads = rng.choice((None, 1, 2, 3))  # the CPU form's limit, or Ebird's GPU form
        self.scheduler.saturated_busy_threads = rng.choice((None, None, 1, 2))  # and a tighter one under load
        self.scheduler.idle_spin = rng.random() < 0.5
        self.polling: set[int] = set()  # workers whose last batch let them poll, not told to rest since
        self.next_worker = len(self.batches)
        self.next_slot = 0
        self.now = 0.0
        self.enqueued: list[int] = []
        self.dispatched: list[int] = []  # each slot, once per batch that ran it
        self.done: list[int] = []  # each slot, once per batch that finished
        self.killed: list[int] = []  # each slot, once per batch whose worker died
        self.running: dict[int, Batch] = {}
        self.level: dict[int, int] = {}  # each slot's priority level
        self.requests: list[tuple[int, int]] = []  # (first slot, rows) of each arrival
        self.waiting: set[int] = set()  # slots ready and not dispatched

    def arrive(self) -> None:
        rows = self.rng.randint(1, 10)
        self.next_slot += self.rng.choice((0, 0, 0, 5))  # sometimes leave a gap before the run
        level = self.rng.choice((0, 0, 0, 1, 2))
        self.scheduler.enqueue(self.next_slot, rows, self.now, level)
        slots = range(self.next_slot, self.next_slot + rows)
        self.enqueued.extend(slots)
        self.level.update(dict.fromkeys(slots, level))
        self.waiting.update(slots)
        self.requests.append((self.next_slot, rows))
        self.next_slot += rows

    def move_one(self) -> None:
        """A queue policy's `delay`: a request, if it is all waiting still, changes level in place."""
        start, rows = self.rng.choice(self.requests)
        level = self.rng.choice((0, 1, 2, 3))
        slots = range(start, start + rows)
        all_waiting = all(s in self.waiting for s in slots)
        moved = self.scheduler.move(start, rows, level)
        assert all_waiting or not moved, "moved a request some of whose rows had started"
        if moved:
            self.level.update(dict.fromkeys(slots, level))

    def finish_one(self) -> None:
        batch = self.running.pop(self.rng.choice(sorted(self.running)))
        self.scheduler.finish(batch.id, now=self.now)
        self.done.extend(range(batch.start, batch.start + batch.rows))

    def kill_one(self) -> None:
        batch = self.running.pop(self.rng.choice(sorted(self.running)))
        worker = next(w for w in self.scheduler.workers if w.id == batch.worker_id)
        assert self.scheduler.remove_worker(worker.id) == batch
        self.polling.discard(worker.id)
        self.killed.extend(range(batch.start, batch.start + batch.rows))
        for slot in reversed(range(batch.start, batch.start + batch.rows)):  # each row at its own request's level
            self.scheduler.requeue_front(slot, 1, self.now, self.level[slot])
        self.waiting.update(range(batch.start, batch.start + batch.rows))
        self.scheduler.add_worker(WorkerSlot(self.next_worker, worker.batch))  # its replacement
        self.next_worker += 1

    def schedule(self) -> None:
        for batch in self.scheduler.schedule(self.now):
            slots = range(batch.start, batch.start + batch.rows)
            assert len({self.level[s] for s in self.waiting}) == 1 or any(
                self.level[s] == min(self.level[w] for w in self.waiting) for s in slots
            ), "the batch holds no row of the highest level waiting"
            assert all(s in self.waiting for s in slots), "a batch took a slot that was not waiting"
            self.dispatched.extend(slots)
            self.waiting.difference_update(slots)
            assert set(batch.rests) <= self.polling - {batch.worker_id}, "told a worker to rest that was not polling"
            self.polling -= {*batch.rests, batch.worker_id}
            if batch.spin:
                self.polling.add(batch.worker_id)
            assert len(self.polling) <= 1, "more than one worker may poll"
            self.running[batch.id] = batch
        self.check()

    def check(self) -> None:
        s = self.scheduler
        assert 0 <= s.inflight <= self.max_inflight
        assert s.inflight == sum(b.rows for b in self.running.values())
        busy = [b.worker_id for b in self.running.values()]
        assert len(busy) == len(set(busy)), "a worker holds two batches"
        assert all(b.rows <= max(self.batches) for b in self.running.values())
        assert s.ready == len(self.enqueued) - len(self.done) - s.inflight
        for level in (0, 1, 2, 3):
            assert s.rows_at(level) == sum(self.level[w] == level for w in self.waiting)

    def step(self) -> None:
        self.now += self.rng.choice((0.0, 0.001, 0.5))
        action = self.rng.random()
        if action < 0.4:
            self.arrive()
        elif self.requests and action < 0.45:
            self.move_one()
        elif self.running and action < 0.9:
            self.finish_one()
        elif self.running:
            self.kill_one()
        self.schedule()

    def drain(self) -> None:
        """No more arrivals: finish everything until nothing is ready or running."""
        for _ in range(10_000):
            if not self.running and not self.scheduler.ready:
                return
            self.now += 1.0
            if self.running:
                self.finish_one()
            self.schedule()
        pytest.fail(f"rows left waiting: {self.scheduler.ready} ready, workers {self.batches}")


@pytest.mark.parametrize("seed", range(60))
@pytest.mark.parametrize("policy", ["elastic", "fixed-timeout", "none"])
def test_random_simulation_runs_every_row_exactly_once(seed: int, policy: str) -> None:
    policies = {"elastic": ElasticPolicy(), "fixed-timeout": FixedTimeoutPolicy(16, 1000), "none": NoBatchingPolicy()}
    sim = Simulation(random.Random(seed), policies[policy])
    for _ in range(60):
        sim.step()
    sim.drain()
    assert sorted(sim.done) == sorted(sim.enqueued)
    assert len(sim.done) == len(set(sim.done))
    assert sorted(sim.dispatched) == sorted(sim.enqueued + sim.killed)  # dispatched again only when requeued
    assert (sim.scheduler.inflight, sim.scheduler.ready) == (0, 0)


def test_busy_threads_stay_within_the_cores_and_waiting_rows_form_a_bigger_batch() -> None:
    """The CPU form: with 2 cores, at most two 1-thread workers run; rows that wait go to the next free worker
    as one batch: the only one that can start, so the smallest worker that holds them all takes them."""
    scheduler = Scheduler(ElasticPolicy(), 32, max_busy_threads=2)
    for worker_id, batch in enumerate((1, 1, 2, 4, 8, 16)):
        scheduler.add_worker(WorkerSlot(worker_id, batch))
    first = []
    for slot in range(2):  # two requests arriving one after the other
        scheduler.enqueue(slot, 1, 0.0)
        first += scheduler.schedule(0.0)
    assert [(b.worker_id, b.rows) for b in first] == [(0, 1), (1, 1)]
    assert scheduler.busy_threads == 2
    for slot in range(2, 12):
        scheduler.enqueue(slot, 1, 0.1)
    assert scheduler.schedule(0.1) == []  # idle workers exist, but no core is free
    scheduler.finish(first[0].id)
    second = scheduler.schedule(0.2)
    assert [(b.worker_id, b.start, b.rows) for b in second] == [(5, 2, 10)]  # the 16-worker takes all 10 waiting
    assert scheduler.busy_threads == 2


@pytest.mark.parametrize(
    ("limit", "batches"),
    [(None, [(4, 8), (3, 4)]), (2, [(4, 8), (3, 4)]), (1, [(5, 12)])],
)
def test_rows_algorithm_1_would_split_run_as_one_batch_when_no_other_worker_may_start(
    limit: int | None, batches: list[tuple[int, int]]
) -> None:
    """12 ready rows: Algorithm 1 runs them as 8 and 4 side by side, which the limit 2 still allows; under a
    limit of 1 the 4 would only run after the 8, so the 16-worker takes all 12 at once."""
    scheduler = Scheduler(ElasticPolicy(), 32, max_busy_threads=limit)
    for worker_id, batch in enumerate((1, 1, 2, 4, 8, 16)):
        scheduler.add_worker(WorkerSlot(worker_id, batch))
    scheduler.enqueue(0, 12, 0.0)
    assert [(b.worker_id, b.rows) for b in scheduler.schedule(0.0)] == batches


def test_a_worker_wider_than_the_limit_runs_when_nothing_else_is_busy() -> None:
    scheduler = Scheduler(ElasticPolicy(), 8, max_busy_threads=2)
    scheduler.add_worker(WorkerSlot(0, 4, threads=4))
    scheduler.enqueue(0, 4, 0.0)
    (batch,) = scheduler.schedule(0.0)
    assert (batch.worker_id, batch.rows, scheduler.busy_threads) == (0, 4, 4)
    scheduler.finish(batch.id)
    assert scheduler.busy_threads == 0


@pytest.mark.parametrize(("limit", "busy", "inflight"), [(None, 3, 4), (2, 2, 2)])
def test_no_limit_is_ebirds_gpu_form(limit: int | None, busy: int, inflight: int) -> None:
    """Four single arrivals: without a limit the 1-, 1- and 2-workers all run (Algorithm 1); with 2 cores, two."""
    scheduler = Scheduler(ElasticPolicy(), 32, max_busy_threads=limit)
    for worker_id, batch in enumerate((1, 1, 2, 4, 8, 16)):
        scheduler.add_worker(WorkerSlot(worker_id, batch))
    for slot in range(4):
        scheduler.enqueue(slot, 1, 0.0)
        scheduler.schedule(0.0)
    assert (scheduler.busy_threads, scheduler.inflight) == (busy, inflight)


def saturated_scheduler(busy_s: float) -> Scheduler:
    """No limit, one busy thread once saturated; Ebird's workers; one row run for `busy_s` of the last second."""
    scheduler = Scheduler(ElasticPolicy(), 32, saturated_busy_threads=1)
    for worker_id, batch in enumerate((1, 1, 2, 4, 8, 16)):
        scheduler.add_worker(WorkerSlot(worker_id, batch))
    scheduler.enqueue(0, 1, 0.0)
    (batch,) = scheduler.schedule(1.0 - busy_s)
    scheduler.finish(batch.id, now=1.0)
    return scheduler


@pytest.mark.parametrize(
    ("busy_s", "batches"),
    [(0.5, [(2, 2), (0, 1)]), (0.85, [(3, 3)])],  # (worker id, rows): ids 0-5 are batch 1, 1, 2, 4, 8, 16
)
def test_when_saturated_rows_wait_for_one_worker_instead_of_starting_beside_it(
    busy_s: float, batches: list[tuple[int, int]]
) -> None:
    """Three rows: below the saturated share Algorithm 1 runs them as 2 and 1 side by side; once workers were busy
    80% of the last second, one worker takes all three (the batch-4: the warm batch-1 cannot hold them)."""
    scheduler = saturated_scheduler(busy_s)
    scheduler.enqueue(1, 3, 1.0)
    assert [(b.worker_id, b.rows) for b in scheduler.schedule(1.0)] == batches


def test_the_saturated_limit_applies_only_while_workers_stay_busy() -> None:
    scheduler = saturated_scheduler(0.9)
    scheduler.enqueue(1, 1, 1.0)
    (first,) = scheduler.schedule(1.0)
    scheduler.enqueue(2, 1, 1.0)
    assert scheduler.schedule(1.0) == []  # one busy: the next row waits
    scheduler.finish(first.id, now=1.01)
    scheduler.enqueue(3, 1, 3.0)
    assert len(scheduler.schedule(3.0)) == 1  # the waiting row and the new one: one batch of two
    scheduler.enqueue(4, 1, 3.0)
    assert len(scheduler.schedule(3.0)) == 1  # two seconds idle before: no limit, a second worker starts beside


def test_retiring_a_worker_that_was_never_added_is_allowed() -> None:
    """A replacement still starting when its set is replaced: it is not in the scheduler yet, and never will be."""
    scheduler = make_scheduler(1)
    assert scheduler.retire_worker(99) is True
    assert [w.id for w in scheduler.workers] == [0]


def test_a_request_that_has_not_started_can_be_withdrawn_and_one_that_has_cannot() -> None:
    """Triton's request timeout: rows that never started are taken back; the rest of the queue runs as before."""
    scheduler = make_scheduler(1)
    scheduler.enqueue(0, 1, arrived_at=0.0)
    scheduler.enqueue(1, 2, arrived_at=0.0)
    scheduler.enqueue(3, 1, arrived_at=0.0)
    assert spans(scheduler.schedule(now=0.0)) == [(0, 0, 1)]
    assert not scheduler.withdraw(0, 1)  # running
    assert scheduler.withdraw(1, 2)
    assert not scheduler.withdraw(1, 2)  # gone already
    assert scheduler.ready == 1
    scheduler.finish(0)
    assert spans(scheduler.schedule(now=0.0)) == [(0, 3, 1)]


# -- priority --------------------------------------------------------------------------------------------------


def test_a_queue_shorter_than_a_batch_runs_from_the_front_with_its_high_priority_rows_inside() -> None:
    """Levels 2, 1, 2 at slots 0, 1, 2..3 and a worker of batch 4: one batch holds them all, from the front."""
    scheduler = make_scheduler(4)
    scheduler.enqueue(0, 1, 0.0, level=2)
    scheduler.enqueue(1, 1, 0.1, level=1)
    scheduler.enqueue(2, 2, 0.2, level=2)
    assert spans(scheduler.schedule(0.3)) == [(0, 0, 4)]


def drain(scheduler: Scheduler) -> list[tuple[int, int]]:
    """(first slot, rows) of each batch, one worker finishing each before the next is scheduled."""
    order = []
    for step in range(100):
        batches = scheduler.schedule(float(step))
        if not batches:
            return order
        for batch in batches:
            order.append((batch.start, batch.rows))
            scheduler.finish(batch.id)
    raise AssertionError("the queue did not drain")


def enqueue_levels(scheduler: Scheduler, levels: list[int]) -> None:
    for slot, level in enumerate(levels):
        scheduler.enqueue(slot, 1, slot / 10, level)


def test_a_high_priority_row_behind_a_backlog_runs_next_with_the_rows_stored_just_before_it() -> None:
    """Six rows of level 2 wait (slots 0..5), then one of level 1 (slot 6) and one of level 2 (slot 7). The batch-4
    worker takes slots 3..6: the high-priority row and the three stored just before it, so what stays behind (0..2)
    is one stretch rather than fragments. Then arrival order again."""
    scheduler = make_scheduler(4)
    enqueue_levels(scheduler, [2, 2, 2, 2, 2, 2, 1, 2])
    assert drain(scheduler) == [(3, 4), (0, 3), (7, 1)]


def test_of_the_stretches_that_hold_the_oldest_high_priority_row_the_one_with_most_such_rows_runs() -> None:
    """High-priority rows at slots 6 and 8 behind a backlog: slots 5..8 hold both (3..6 and 4..7 hold one)."""
    scheduler = make_scheduler(4)
    enqueue_levels(scheduler, [2, 2, 2, 2, 2, 2, 1, 2, 1, 2])
    assert drain(scheduler)[0] == (5, 4)


def test_a_batch_may_start_inside_a_request_to_reach_the_high_priority_row() -> None:
    """A request of 10 rows (level 2) and one row of level 1 stored right after it; a worker of batch 8 takes the
    request's last 7 rows and the high-priority row; its first 3 rows stay and run next."""
    scheduler = make_scheduler(8)
    scheduler.enqueue(0, 10, 0.0, level=2)
    scheduler.enqueue(10, 1, 0.1, level=1)
    assert drain(scheduler) == [(3, 8), (0, 3)]


def test_a_batch_smaller_than_the_largest_still_holds_the_high_priority_row() -> None:
    """No batching (one row each) beside a batch-4 worker: the row taken is the high-priority one itself."""
    scheduler = make_scheduler(4, 1, policy=NoBatchingPolicy())
    scheduler.enqueue(0, 3, 0.0, level=2)
    scheduler.enqueue(3, 1, 0.1, level=1)
    assert spans(scheduler.schedule(0.2)) == [(1, 3, 1), (0, 0, 1)]
    assert scheduler.ready == 2


def test_among_runs_of_one_level_the_first_to_arrive_goes_first() -> None:
    scheduler = make_scheduler(1, policy=NoBatchingPolicy())
    for slot, level in enumerate((3, 1, 2, 1)):
        scheduler.enqueue(slot, 1, float(slot), level)
    order = []
    for step in range(4):
        (batch,) = scheduler.schedule(10.0 + step)
        order.append(batch.start)
        scheduler.finish(batch.id)
    assert order == [1, 3, 2, 0]


def test_rows_requeued_after_a_worker_died_run_next_within_their_level_not_before_a_higher_one() -> None:
    scheduler = make_scheduler(1, policy=NoBatchingPolicy())
    scheduler.enqueue(5, 1, 0.0, level=1)
    scheduler.requeue_front(2, 1, 0.0, level=2)  # a dead worker's row
    scheduler.requeue_front(3, 1, 0.0, level=1)
    starts = []
    for _ in range(3):
        (batch,) = scheduler.schedule(1.0)
        starts.append(batch.start)
        scheduler.finish(batch.id)
    assert starts == [3, 5, 2]


def test_a_withdrawn_high_priority_request_leaves_the_front_to_the_others() -> None:
    scheduler = make_scheduler(2)
    scheduler.enqueue(0, 2, 0.0, level=2)
    scheduler.enqueue(4, 2, 0.1, level=1)
    assert scheduler.withdraw(4, 2)
    assert spans(scheduler.schedule(0.2)) == [(0, 0, 2)]
    assert scheduler.ready == 0


def test_fixed_timeout_waits_for_the_oldest_row_but_starts_at_the_highest_priority() -> None:
    """The delay runs from the oldest ready row, whatever its level; the batch then starts at level 1's run."""
    scheduler = make_scheduler(16, policy=FixedTimeoutPolicy(16, 1000))
    scheduler.enqueue(0, 2, 0.0, level=2)
    scheduler.enqueue(8, 3, 0.0005, level=1)
    assert scheduler.schedule(0.0009) == []
    assert spans(scheduler.schedule(0.001)) == [(0, 8, 3)]


# -- queue policy: delay -----------------------------------------------------------------------------------------


def test_a_moved_request_keeps_its_slots_and_runs_after_its_new_levels_elders() -> None:
    """A queue policy's `delay` moves a waiting request to the rank behind its level (`queue_rank`): here from
    rank 2 to 3, behind the rank-2 row that arrived after it, ahead of the rank-4 one; counts follow the move."""
    scheduler = make_scheduler(1, policy=NoBatchingPolicy())
    scheduler.enqueue(0, 1, 0.0, level=4)
    scheduler.enqueue(1, 1, 0.1, level=2)
    scheduler.enqueue(2, 1, 0.2, level=2)
    assert scheduler.move(1, 1, 3)
    assert (scheduler.rows_at(2), scheduler.rows_at(3), scheduler.rows_at(4)) == (1, 1, 1)
    assert [start for start, _ in drain(scheduler)] == [2, 1, 0]
    assert scheduler.rows_at(3) == 0


def test_a_request_that_has_started_cannot_be_moved() -> None:
    scheduler = make_scheduler(2)
    scheduler.enqueue(0, 3, 0.0)
    assert spans(scheduler.schedule(0.0)) == [(0, 0, 2)]
    assert not scheduler.move(0, 3, 1)
    assert (scheduler.rows_at(0), scheduler.rows_at(1)) == (1, 0)


def spinning_scheduler(*workers: tuple[int, int], limit: int | None = 1) -> Scheduler:
    """Workers (batch, threads) with ids 0, 1, …, under `limit` busy threads, with idle polling on."""
    scheduler = Scheduler(ElasticPolicy(), 32, max_busy_threads=limit, idle_spin=True)
    for worker_id, (batch, threads) in enumerate(workers):
        scheduler.add_worker(WorkerSlot(worker_id, batch, threads))
    return scheduler


def test_a_worker_that_starts_alone_may_poll_and_keeps_that_leave_while_it_takes_every_batch() -> None:
    scheduler = spinning_scheduler((1, 1), (1, 1), (2, 1))
    for slot in range(3):  # low load: one request at a time, all to the same batch-1 worker
        scheduler.enqueue(slot, 1, float(slot))
        (batch,) = scheduler.schedule(float(slot))
        assert (batch.worker_id, batch.spin, batch.rests) == (1, True, ())
        scheduler.finish(batch.id)


def test_another_worker_starting_tells_the_polling_one_to_rest() -> None:
    scheduler = spinning_scheduler((1, 1), (2, 1))
    scheduler.enqueue(0, 1, 0.0)
    (first,) = scheduler.schedule(0.0)
    scheduler.finish(first.id)
    scheduler.enqueue(1, 2, 1.0)  # two rows: the batch-2 worker takes them, and needs the core worker 0 polls on
    (second,) = scheduler.schedule(1.0)
    assert (second.worker_id, second.spin, second.rests) == (1, True, (0,))
    scheduler.finish(second.id)
    scheduler.enqueue(3, 1, 2.0)
    (third,) = scheduler.schedule(2.0)
    assert (third.worker_id, third.spin, third.rests) == (1, True, ())  # the awake worker takes it: no one to tell


def test_under_the_limit_the_worker_that_finished_last_takes_the_next_batch_it_holds() -> None:
    """One worker at a time (two cores): the rows go to the warm worker rather than each size to its own."""
    scheduler = Scheduler(ElasticPolicy(), 32, max_busy_threads=1)
    for worker_id, batch in enumerate((1, 1, 2, 4, 8, 16)):
        scheduler.add_worker(WorkerSlot(worker_id, batch))
    taken = []
    for slot, rows in ((0, 1), (1, 3), (4, 1), (5, 2), (7, 6), (13, 1)):
        scheduler.enqueue(slot, rows, 0.0)
        (batch,) = scheduler.schedule(0.0)
        taken.append((batch.worker_id, batch.rows))
        scheduler.finish(batch.id)
    # 1 → a batch-1 worker; 3 → the batch-4 (the warm one cannot hold 3); 1 and 2 → the batch-4, warm;
    # 6 → the batch-8; 1 → the batch-8, warm
    assert taken == [(1, 1), (3, 3), (3, 1), (3, 2), (4, 6), (4, 1)]


def test_without_a_limit_the_warm_worker_does_not_change_algorithm_1() -> None:
    scheduler = make_scheduler(*EBIRD)
    scheduler.enqueue(0, 8, 0.0)
    (first,) = scheduler.schedule(0.0)
    scheduler.finish(first.id)
    scheduler.enqueue(8, 1, 1.0)
    (second,) = scheduler.schedule(1.0)
    assert (first.worker_id, second.worker_id, second.rows) == (1, 4, 1)  # the batch-8 took 8; one row: a batch-1


def test_a_worker_that_starts_beside_a_busy_one_may_not_poll_and_ends_the_others_leave() -> None:
    scheduler = spinning_scheduler((1, 1), (1, 1), limit=2)
    scheduler.enqueue(0, 1, 0.0)
    (first,) = scheduler.schedule(0.0)
    scheduler.enqueue(1, 1, 0.0)
    (second,) = scheduler.schedule(0.0)
    assert (first.spin, second.spin, second.rests) == (True, False, (first.worker_id,))
    # The rest reaches the busy worker's pipe behind its batch: it reads it when done, and sleeps.
    scheduler.finish(first.id)
    scheduler.finish(second.id)
    scheduler.enqueue(2, 1, 1.0)
    (third,) = scheduler.schedule(1.0)
    assert third.rests == ()  # nobody was left polling


def test_a_worker_wider_than_the_limit_never_polls() -> None:
    """Fixed-timeout's one worker of two threads on a 2-core machine: polling would hold the frontend's core."""
    scheduler = spinning_scheduler((16, 2), limit=1)
    scheduler.enqueue(0, 1, 0.0)
    (batch,) = scheduler.schedule(0.0)
    assert batch.spin is False


def test_without_idle_spin_no_worker_polls_or_is_told_to_rest() -> None:
    scheduler = Scheduler(ElasticPolicy(), 32, max_busy_threads=1)
    for worker_id, batch in enumerate((1, 2)):
        scheduler.add_worker(WorkerSlot(worker_id, batch))
    started = []
    for slot, rows in ((0, 1), (1, 2), (3, 1)):
        scheduler.enqueue(slot, rows, 0.0)
        (batch,) = scheduler.schedule(0.0)
        started.append((batch.spin, batch.rests))
        scheduler.finish(batch.id)
    assert started == [(False, ())] * 3


@pytest.mark.parametrize("leave", ["remove", "retire"])
def test_a_worker_that_leaves_the_set_is_not_told_to_rest(leave: str) -> None:
    scheduler = spinning_scheduler((1, 1), (2, 1))
    scheduler.enqueue(0, 1, 0.0)
    (first,) = scheduler.schedule(0.0)
    scheduler.finish(first.id)
    scheduler.remove_worker(0) if leave == "remove" else scheduler.retire_worker(0)
    scheduler.enqueue(1, 1, 1.0)
    (second,) = scheduler.schedule(1.0)
    assert (second.worker_id, second.rests) == (1, ())


def test_workers_stop_polling_once_some_worker_was_busy_half_of_the_last_second() -> None:
    scheduler = spinning_scheduler((1, 1))
    grants = []
    for i in range(10):  # a batch runs 80 ms of every 100 ms
        scheduler.enqueue(i, 1, i / 10)
        (batch,) = scheduler.schedule(i / 10)
        grants.append(batch.spin)
        scheduler.finish(batch.id, now=i / 10 + 0.08)
    assert grants == [True] * 7 + [False] * 3  # busy 0.48 s of the last second at the 7th start, 0.56 at the 8th
    scheduler.enqueue(10, 1, 5.0)
    (quiet,) = scheduler.schedule(5.0)  # seconds later: the last second was idle
    assert quiet.spin is True


def test_a_pollers_own_batches_run_on_the_core_it_polls_on() -> None:
    """Busy 30 ms of every 100 with 1.2 cores spare: a whole core is free for the poller and its model's batches
    (at concurrency 1 over gRPC, counting the batches beside the poller stopped a poll worth 1.2x the rate)."""
    scheduler = spinning_scheduler((1, 1))
    scheduler.cores.spare_cores = 1.2
    grants = []
    for i in range(10):
        scheduler.enqueue(i, 1, i / 10)
        (batch,) = scheduler.schedule(i / 10)
        grants.append(batch.spin)
        scheduler.finish(batch.id, now=i / 10 + 0.03)
    assert grants == [True] * 10


def test_no_worker_polls_unless_a_core_is_free_beside_the_frontend_and_other_programs() -> None:
    """gRPC at concurrency 8 kept the frontend and its client busy on most of two cores, and a poller took a quarter
    of the rate."""
    scheduler = spinning_scheduler((1, 1))
    grants = []
    for i, spare in enumerate((2.0, 1.5, 0.9, 0.4)):  # the CPUs less what the frontend and others used lately
        scheduler.cores.spare_cores = spare
        scheduler.enqueue(i, 1, float(i))
        (batch,) = scheduler.schedule(float(i))
        grants.append(batch.spin)
        scheduler.finish(batch.id)
    assert grants == [True, True, False, False]
