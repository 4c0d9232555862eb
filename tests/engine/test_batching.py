"""Batching policies as pure functions of a QueueView and the idle workers (no scheduler, no clocks)."""

from __future__ import annotations

import pytest

from adaserve.config import BatchingSpec
from adaserve.engine.batching import (
    BatchingPolicy,
    ElasticPolicy,
    FixedTimeoutPolicy,
    NoBatchingPolicy,
    QueueView,
    WorkerSlot,
    create_batching_policy,
)

EBIRD = (16, 8, 4, 2, 1, 1)


def view(
    front_run: int,
    *,
    ready: int | None = None,
    headroom: int = 1000,
    inflight: int = 0,
    oldest_wait_s: float = 0.0,
    smallest_batch: int = 1,
    thread_room: int | None = None,
    warm: int | None = None,
) -> QueueView:
    return QueueView(
        front_run=front_run,
        ready=front_run if ready is None else ready,
        headroom=headroom,
        inflight=inflight,
        oldest_wait_s=oldest_wait_s,
        smallest_batch=smallest_batch,
        thread_room=thread_room,
        warm=warm,
    )


def idle(*batches: int) -> list[WorkerSlot]:
    """Idle workers as the scheduler hands them over: largest granularity first; ids say which is which."""
    return [WorkerSlot(id=i, batch=b) for i, b in sorted(enumerate(batches), key=lambda w: -w[1])]


def picked(policy: BatchingPolicy, queue: QueueView, workers: list[WorkerSlot]) -> tuple[int, int] | None:
    """(worker batch granularity, rows) of the pick, or None."""
    choice = policy.pick(queue, workers)
    return None if choice is None else (choice[0].batch, choice[1])


def drain(policy: BatchingPolicy, front_run: int, workers: list[WorkerSlot]) -> list[int]:
    """Ask again and again, as the scheduler does, taking the chosen worker out of the idle queue each time."""
    sizes = []
    workers = list(workers)
    smallest = min(w.batch for w in workers)
    while (choice := policy.pick(view(front_run, smallest_batch=smallest), workers)) is not None:
        worker, rows = choice
        workers.remove(worker)
        front_run -= rows
        sizes.append(rows)
    return sizes


# -- elastic (Ebird's Algorithm 1) -----------------------------------------------------------------------------


def test_ebird_fig7_example() -> None:
    """12 ready: the batch-8 worker takes 8 and is busy; 4 remain and the idle queue's first fit is the 4."""
    policy = ElasticPolicy()
    workers = idle(*EBIRD)
    worker, rows = policy.pick(view(12), workers) or pytest.fail("no pick")
    assert (worker, rows) == (WorkerSlot(1, 8), 8)
    workers.remove(worker)
    assert policy.pick(view(4), workers) == (WorkerSlot(2, 4), 4)


@pytest.mark.parametrize(
    ("front_run", "headroom", "expected"),
    [
        (12, 1000, (8, 8)),
        (12, 5, (4, 4)),  # MaxInf − inflight is the bound, not the ready rows
        (3, 1000, (2, 2)),
        (16, 16, (16, 16)),
        (40, 1000, (16, 16)),
        (1, 1000, (1, 1)),
    ],
)
def test_largest_idle_granularity_within_r(front_run: int, headroom: int, expected: tuple[int, int]) -> None:
    assert picked(ElasticPolicy(), view(front_run, headroom=headroom), idle(*EBIRD)) == expected


def test_r_is_the_front_run_not_all_ready_rows() -> None:
    """Rows behind a memory gap do not count: one batch is read in place and never spans it."""
    assert picked(ElasticPolicy(), view(3, ready=12), idle(*EBIRD)) == (2, 2)


@pytest.mark.parametrize(
    ("front_run", "sizes"),
    [(7, [4, 2, 1]), (12, [8, 4]), (31, [16, 8, 4, 2, 1]), (32, [16, 8, 4, 2, 1, 1]), (100, [16, 8, 4, 2, 1, 1])],
)
def test_ready_rows_decompose_over_the_idle_queue(front_run: int, sizes: list[int]) -> None:
    assert drain(ElasticPolicy(), front_run, idle(*EBIRD)) == sizes


@pytest.mark.parametrize("queue", [view(0), view(5, headroom=0), view(5, headroom=-1)])
def test_nothing_to_take(queue: QueueView) -> None:
    assert ElasticPolicy().pick(queue, idle(*EBIRD)) is None


def test_no_idle_worker() -> None:
    assert ElasticPolicy().pick(view(8), []) is None


def test_liveness_smallest_idle_takes_r_when_every_worker_is_larger() -> None:
    """A Packrat set of two batch-8 workers and 3 ready rows: without the rule the rows would wait forever."""
    assert ElasticPolicy().pick(view(3, smallest_batch=8), idle(8, 8)) == (WorkerSlot(1, 8), 3)


def test_liveness_picks_the_smallest_idle_worker() -> None:
    assert picked(ElasticPolicy(), view(5, smallest_batch=8), idle(16, 8)) == (8, 5)


def test_liveness_partial_batch_respects_headroom() -> None:
    assert picked(ElasticPolicy(), view(6, headroom=2, smallest_batch=8), idle(8)) == (8, 2)


def test_liveness_does_not_fire_when_a_busy_worker_is_small_enough() -> None:
    """Idle: 16 and 8; busy: a batch-2 worker. 3 rows wait for it rather than run as a partial batch."""
    assert ElasticPolicy().pick(view(3, smallest_batch=2), idle(16, 8)) is None


@pytest.mark.parametrize(
    ("rows", "warm", "expected"),
    [
        (3, None, (4, 3)),  # no warm worker: the smallest that holds all 3
        (3, 0, (16, 3)),  # the warm one holds them
        (3, 4, (4, 3)),  # the warm one (a batch-1) cannot
        (12, 2, (16, 12)),
        (20, 1, (16, 16)),  # more than any holds: the largest
    ],
)
def test_last_batch_goes_to_the_warm_worker_when_it_holds_the_rows(
    rows: int, warm: int | None, expected: tuple[int, int]
) -> None:
    """Room for one more 1-thread worker: whoever starts is the last, and takes every ready row it can."""
    assert picked(ElasticPolicy(), view(rows, thread_room=1, warm=warm), idle(*EBIRD)) == expected


def test_with_room_for_others_the_warm_worker_does_not_change_algorithm_1() -> None:
    assert picked(ElasticPolicy(), view(3, thread_room=4, warm=0), idle(*EBIRD)) == (2, 2)


def test_elastic_never_asks_to_be_woken() -> None:
    assert ElasticPolicy().wake_after_s(view(3, oldest_wait_s=10.0)) is None


# -- fixed-timeout (Triton's dynamic batching) -----------------------------------------------------------------


def fixed(max_batch_size: int = 8, delay_us: int = 500_000) -> FixedTimeoutPolicy:
    return FixedTimeoutPolicy(max_batch_size, delay_us)


def test_fixed_waits_while_the_batch_is_not_full_and_the_delay_not_reached() -> None:
    policy = fixed()
    queue = view(3, oldest_wait_s=0.25)
    assert policy.pick(queue, idle(8, 4)) is None
    assert policy.wake_after_s(queue) == 0.25


def test_fixed_runs_a_full_batch_at_once() -> None:
    assert picked(fixed(), view(8, oldest_wait_s=0.0), idle(8, 4)) == (8, 8)


def test_fixed_runs_a_partial_batch_when_the_delay_is_reached() -> None:
    policy = fixed()
    queue = view(3, oldest_wait_s=0.5)
    assert picked(policy, queue, idle(8, 4)) == (8, 3)
    assert policy.wake_after_s(queue) == 0.0
    assert policy.wake_after_s(view(3, oldest_wait_s=2.0)) == 0.0


def test_fixed_batch_is_capped_by_max_batch_size_worker_and_front_run() -> None:
    assert picked(fixed(max_batch_size=8), view(20), idle(8)) == (8, 8)
    assert picked(fixed(max_batch_size=8), view(20), idle(4, 2)) == (4, 4)
    assert picked(fixed(max_batch_size=8), view(5, ready=20), idle(8)) == (8, 5)


def test_fixed_respects_max_inflight() -> None:
    """MaxInf (config `max_inflight`) below the batch size: the batch is cut to the headroom, as elastic does."""
    assert picked(fixed(max_batch_size=8), view(8, headroom=3), idle(8)) == (8, 3)


def test_fixed_gives_each_idle_worker_a_batch_while_others_run() -> None:
    """Triton's dynamic batcher over several instances: a batch running on one does not hold back the next."""
    policy = fixed()
    assert picked(policy, view(8, inflight=8), idle(8)) == (8, 8)
    queue = view(3, inflight=8, oldest_wait_s=0.1)
    assert policy.pick(queue, idle(8)) is None
    assert policy.wake_after_s(queue) == pytest.approx(0.4)


def test_fixed_with_nothing_ready() -> None:
    policy = fixed()
    assert policy.pick(view(0, oldest_wait_s=5.0), idle(8)) is None
    assert policy.wake_after_s(view(0)) is None


def test_fixed_with_no_idle_worker() -> None:
    assert fixed().pick(view(8), []) is None


# -- none ------------------------------------------------------------------------------------------------------


def test_none_gives_one_row_to_the_smallest_idle_worker() -> None:
    assert NoBatchingPolicy().pick(view(5), idle(4, 1, 2)) == (WorkerSlot(1, 1), 1)


@pytest.mark.parametrize("queue", [view(0), view(5, headroom=0)])
def test_none_with_nothing_to_take(queue: QueueView) -> None:
    assert NoBatchingPolicy().pick(queue, idle(1)) is None


def test_none_with_no_idle_worker() -> None:
    assert NoBatchingPolicy().pick(view(5), []) is None


# -- factory ---------------------------------------------------------------------------------------------------


def test_factory_picks_by_name() -> None:
    assert isinstance(create_batching_policy(BatchingSpec(), 8), ElasticPolicy)
    assert isinstance(create_batching_policy(BatchingSpec(policy="none"), 8), NoBatchingPolicy)
    policy = create_batching_policy(BatchingSpec(policy="fixed-timeout", max_queue_delay_us=2500), 32)
    assert isinstance(policy, FixedTimeoutPolicy)
    assert (policy.name, policy.max_batch_size, policy.delay_s) == ("fixed-timeout", 32, 0.0025)
