"""Several models' schedulers on one set of cores (`adaserve.engine.cores`): the busy-thread limit counts every
model's workers, pollers share the cores the frontend leaves, and freed threads go to the model that waited longest."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
import signal
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from adaserve.engine import scheduler as scheduler_module
from adaserve.engine.batching import ElasticPolicy, FixedTimeoutPolicy, NoBatchingPolicy, WorkerSlot
from adaserve.engine.cores import Cores
from adaserve.engine.engine import ModelEngine
from adaserve.engine.scheduler import WAIT_FOR_OTHERS_BATCHES, Batch, Scheduler
from adaserve.errors import InferenceError
from adaserve.repository import ModelRepository
from tests.server_utils import write_slow_model

#: `Cores.spare_cores` on the 2-core VM at low load: the CPUs less a fifth of one that the frontend used.
TWO_CORES = 1.8


def model(cores: Cores, *workers: tuple[int, int], limit: int | None = 1, spin: bool = False) -> Scheduler:
    """A model's scheduler on `cores`: workers (batch, threads) with ids 0, 1, …"""
    scheduler = Scheduler(ElasticPolicy(), 32, max_busy_threads=limit, idle_spin=spin, cores=cores)
    for worker_id, (batch, threads) in enumerate(workers):
        scheduler.add_worker(WorkerSlot(worker_id, batch, threads))
    return scheduler


def test_a_model_waits_while_another_models_worker_holds_the_limit() -> None:
    cores = Cores()
    a, b = model(cores, (1, 1)), model(cores, (1, 1))
    a.enqueue(0, 1, 0.0)
    (running,) = a.schedule(0.0)
    b.enqueue(0, 1, 0.1)
    assert b.schedule(0.1) == []  # a's worker holds the one thread both models allow
    assert cores.busy_threads == 1
    a.finish(running.id, now=0.2)
    assert [batch.worker_id for batch in b.schedule(0.2)] == [0]


def learned(scheduler: Scheduler, batch_s: float, at: float) -> None:
    """Run one batch of `scheduler` that takes `batch_s`, ending at `at`, so it knows its batch time."""
    scheduler.enqueue(0, 1, at - batch_s)
    (batch,) = scheduler.schedule(at - batch_s)
    scheduler.finish(batch.id, now=at)


def test_a_light_model_starts_beside_a_heavy_models_long_batch_and_the_heavy_one_waits_for_a_short_one() -> None:
    """Waiting for another model's batch costs the wait and gains nothing (rows of two models never share a
    batch): a model waits only for batches expected to end within two of its own batch times."""
    cores = Cores()
    heavy, light = model(cores, (1, 1)), model(cores, (1, 1))
    learned(heavy, 0.030, at=1.0)
    learned(light, 0.0001, at=1.0)
    heavy.enqueue(1, 1, 2.0)
    (long_batch,) = heavy.schedule(2.0)
    light.enqueue(1, 1, 2.001)
    assert len(light.schedule(2.001)) == 1  # the heavy batch runs 29 ms more: start beside it
    heavy.finish(long_batch.id, now=2.03)
    heavy.enqueue(2, 1, 2.03)
    assert heavy.schedule(2.03) == []  # the light batch ends within a heavy batch's time: wait for it
    assert cores.busy_threads == 1


def test_models_of_about_the_same_batch_time_wait_for_each_other() -> None:
    cores = Cores()
    a, b = model(cores, (1, 1)), model(cores, (1, 1))
    learned(a, 0.0005, at=1.0)
    learned(b, 0.0004, at=1.0)
    a.enqueue(1, 1, 2.0)
    a.schedule(2.0)
    b.enqueue(1, 1, 2.0)
    assert b.schedule(2.0) == []  # a's batch, just started, runs 0.5 ms: within two of b's 0.4 ms


def test_alone_a_model_with_a_shared_set_of_cores_schedules_as_with_its_own() -> None:
    shared = Cores()
    a, own = model(shared, (2, 1), (1, 1), limit=2), model(Cores(), (2, 1), (1, 1), limit=2)
    for scheduler in (a, own):
        scheduler.enqueue(0, 3, 0.0)
    assert [(x.worker_id, x.rows) for x in a.schedule(0.0)] == [(x.worker_id, x.rows) for x in own.schedule(0.0)]


def test_a_model_without_a_limit_does_not_wait_but_is_counted() -> None:
    cores = Cores()
    limited, unlimited = model(cores, (1, 1)), model(cores, (1, 1), limit=None)
    limited.enqueue(0, 1, 0.0)
    limited.schedule(0.0)
    unlimited.enqueue(0, 1, 0.0)
    assert len(unlimited.schedule(0.0)) == 1  # beside the limited model's busy worker
    other = model(cores, (1, 1), limit=2)
    other.enqueue(0, 1, 0.0)
    assert other.schedule(0.0) == []  # two threads busy, one in each of the other models


def test_on_two_cores_one_worker_of_all_models_polls_and_another_models_batch_tells_it_to_rest() -> None:
    cores = Cores()
    cores.spare_cores = TWO_CORES
    rested: list[tuple[str, int]] = []
    a, b = model(cores, (1, 1), limit=1, spin=True), model(cores, (1, 1), limit=1, spin=True)
    cores.connect(a, pump=lambda: None, rest=lambda worker: rested.append(("a", worker)), worker_pids=list)
    cores.connect(b, pump=lambda: None, rest=lambda worker: rested.append(("b", worker)), worker_pids=list)
    a.enqueue(0, 1, 0.0)
    (first,) = a.schedule(0.0)
    assert first.spin  # started alone: a's worker may poll after it
    a.finish(first.id, now=0.001)
    b.enqueue(0, 1, 0.002)
    (second,) = b.schedule(0.002)
    assert rested == [("a", 0)]  # b's batch takes the core a's worker polls on
    assert (second.spin, second.rests) == (True, ())
    b.finish(second.id, now=0.003)
    b.enqueue(1, 1, 0.004)
    (third,) = b.schedule(0.004)
    assert rested == [("a", 0)] and third.rests == ()  # its own poller takes it: nobody to tell


@pytest.mark.parametrize(("spare", "polls"), [(TWO_CORES, False), (15.0, True)])
def test_a_worker_may_poll_beside_another_models_busy_one_only_where_a_core_is_free(spare: float, polls: bool) -> None:
    cores = Cores()
    cores.spare_cores = spare
    a, b = model(cores, (1, 1), limit=2, spin=True), model(cores, (1, 1), limit=2, spin=True)
    a.enqueue(0, 1, 0.0)
    b.enqueue(0, 1, 0.0)
    (first,) = a.schedule(0.0)
    (second,) = b.schedule(0.0)
    assert (first.spin, second.spin) == (True, polls)
    assert second.rests == ()  # a's worker is told through a's engine, not in b's batch


def test_on_many_cores_each_model_keeps_a_poller_until_the_cores_run_short() -> None:
    cores = Cores()
    cores.spare_cores = 15.0
    rested: list[str] = []
    a, b, c = (model(cores, (1, 1), spin=True) for _ in range(3))
    for name, scheduler in (("a", a), ("b", b), ("c", c)):
        cores.connect(
            scheduler, pump=lambda: None, rest=lambda worker, name=name: rested.append(name), worker_pids=list
        )
    for i, scheduler in enumerate((a, b)):
        scheduler.enqueue(0, 1, float(i))
        (batch,) = scheduler.schedule(float(i))
        assert batch.spin
        scheduler.finish(batch.id, now=float(i) + 0.001)
    c.enqueue(0, 1, 2.0)
    (third,) = c.schedule(2.0)
    assert third.spin and rested == []  # 1 busy + 2 polling leave cores free: nobody rests
    cores.spare_cores = 2.5  # the frontend got busy
    c.finish(third.id, now=2.001)
    c.enqueue(1, 1, 2.002)
    c.schedule(2.002)  # c's own poller takes it: 1 busy and a's and b's pollers need 3 cores
    assert rested == ["a"]  # the longest-polling rests first, until some core is free again


def test_freed_threads_go_to_the_model_whose_oldest_row_waited_longest() -> None:
    cores = Cores()
    a, b, c = model(cores, (1, 1)), model(cores, (1, 1)), model(cores, (1, 1))
    pumped: list[str] = []
    for name, scheduler in (("a", a), ("b", b), ("c", c)):

        def pump(name: str = name, scheduler: Scheduler = scheduler) -> None:
            pumped.append(name)
            scheduler.schedule(1.0)

        cores.connect(scheduler, pump=pump, rest=lambda worker: None, worker_pids=list)
    a.enqueue(0, 1, 0.0)
    (running,) = a.schedule(0.0)
    c.enqueue(0, 1, 0.1)
    b.enqueue(0, 1, 0.2)
    a.finish(running.id, now=1.0)
    cores.pump()
    assert pumped == ["c", "b"]  # a has nothing ready and is not asked; c's row came first and takes the thread
    assert (b.ready, c.ready) == (1, 0)


def test_a_model_that_leaves_takes_its_busy_threads_and_its_poller_with_it() -> None:
    cores = Cores()
    cores.spare_cores = TWO_CORES
    rested: list[int] = []
    a, b = model(cores, (1, 1), spin=True), model(cores, (1, 1), spin=True)
    cores.connect(a, pump=lambda: None, rest=rested.append, worker_pids=list)
    a.enqueue(0, 1, 0.0)
    a.schedule(0.0)
    assert cores.busy_threads == 1
    cores.leave(a)
    assert cores.busy_threads == 0
    b.enqueue(0, 1, 0.1)
    assert len(b.schedule(0.1)) == 1
    assert rested == []  # a's poller was forgotten with it


def test_a_removed_worker_no_longer_polls() -> None:
    cores = Cores()
    cores.spare_cores = TWO_CORES
    rested: list[int] = []
    a, b = model(cores, (1, 1), spin=True), model(cores, (1, 1), spin=True)
    cores.connect(a, pump=lambda: None, rest=rested.append, worker_pids=list)
    a.enqueue(0, 1, 0.0)
    (batch,) = a.schedule(0.0)
    a.finish(batch.id, now=0.001)
    a.remove_worker(0)
    b.enqueue(0, 1, 0.002)
    b.schedule(0.002)
    assert rested == []


def test_random_runs_keep_the_limit_and_the_pollers_within_the_cores() -> None:
    """Three models of random workers, limits and policies on two or many cores; rows arrive and batches finish at
    random. A batch starts only within its model's limit counting every model's busy threads (or only its own while
    the others' batches are all expected to run on past one of its own), or when none is busy;
    a model has at most one poller, and on two cores the server has one; only a poller is told to rest; every row
    runs once."""
    for seed in range(60):
        rng = random.Random(seed)
        cores = Cores()
        cores.spare_cores = rng.choice((TWO_CORES, 10.0))
        rested: list[tuple[int, int]] = []
        models: list[Scheduler] = []
        for index in range(3):
            policy = rng.choice((ElasticPolicy(), NoBatchingPolicy(), FixedTimeoutPolicy(4, 1000)))
            limit, spin = rng.choice((None, 1, 2)), rng.random() < 0.7
            scheduler = Scheduler(policy, 64, max_busy_threads=limit, idle_spin=spin, cores=cores)
            for worker_id in range(rng.randint(1, 3)):
                scheduler.add_worker(WorkerSlot(worker_id, rng.choice((1, 2, 4)), rng.choice((1, 1, 2))))
            told = rested.append
            cores.connect(
                scheduler,
                pump=lambda: None,
                rest=lambda worker, i=index, told=told: told((i, worker)),
                worker_pids=list,
            )
            models.append(scheduler)
        polling: set[tuple[int, int]] = set()
        running: dict[tuple[int, int], Batch] = {}
        slots = [0, 0, 0]
        enqueued, done = [0, 0, 0], [0, 0, 0]
        now = 0.0
        for _ in range(400):
            now += rng.choice((0.0, 0.0005, 0.01))
            index = rng.randrange(3)
            scheduler = models[index]
            if rng.random() < 0.5 or not running:
                rows = rng.randint(1, 4)
                scheduler.enqueue(slots[index], rows, now)
                slots[index] += rows
                enqueued[index] += rows
            else:
                key = rng.choice(sorted(running))
                batch = running.pop(key)
                models[key[0]].finish(batch.id, now=now)
                done[key[0]] += batch.rows
            for i in rng.sample(range(3), 3):
                scheduler = models[i]
                busy_before, own_before = cores.busy_threads, scheduler.busy_threads
                # the others' batches all run on past a batch of this model's: it may count only its own threads
                alone_counts = scheduler.batch_s is not None and not cores.others_end_within(
                    scheduler, WAIT_FOR_OTHERS_BATCHES * scheduler.batch_s, now
                )
                for batch in scheduler.schedule(now):
                    limit = scheduler.max_busy_threads
                    counted = own_before if alone_counts else busy_before
                    assert limit is None or counted == 0 or counted + batch.threads <= limit
                    busy_before += batch.threads
                    own_before += batch.threads
                    told = {(i, worker) for worker in batch.rests} | set(rested)
                    assert told <= polling, "told a worker to rest that was not polling"
                    polling -= told | {(i, batch.worker_id)}
                    rested.clear()
                    if batch.spin:
                        polling.add((i, batch.worker_id))
                    assert len({model for model, _ in polling}) == len(polling), "a model has two pollers"
                    assert len(polling) <= 1 or cores.spare_cores > 2, "two pollers on two cores"
                    running[(i, batch.id)] = batch
            assert cores.busy_threads == sum(b.threads for b in running.values())
        while running or any(scheduler.ready for scheduler in models):  # everything accepted runs in the end
            assert now < 10_000, "rows left waiting"
            for key in sorted(running):
                batch = running.pop(key)
                models[key[0]].finish(batch.id, now=now)
                done[key[0]] += batch.rows
            now += 1.0
            for i, scheduler in enumerate(models):
                for batch in scheduler.schedule(now):
                    running[(i, batch.id)] = batch
        assert done == enqueued


@pytest.mark.parametrize("share", [True, False])
def test_two_models_on_shared_cores_never_compute_at_once(
    tmp_path: Path, share: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real engines, each with one worker under a limit of one busy thread: sharing the cores, one model's batch
    never runs while the other's does, and every request is answered; with `share_cores: false` they overlap. (Two
    models of one batch time always wait for each other, but under a loaded CI machine their smoothed times can
    drift apart by more than the wait rule's factor, which its own tests cover: here it is set out of reach.)"""
    monkeypatch.setattr(scheduler_module, "WAIT_FOR_OTHERS_BATCHES", math.inf)
    batching = {"policy": "elastic", "max_busy_threads": 1, "share_cores": share}
    for name in ("left", "right"):
        write_slow_model(tmp_path, name, rounds=3000, batching=batching)  # ~14 ms a batch: long enough to overlap
    repository = ModelRepository(tmp_path)

    async def main() -> list[tuple[str, int, int]]:
        cores = Cores()
        engines = {name: ModelEngine(repository.read(name), cores=cores) for name in ("left", "right")}
        try:
            for engine in engines.values():
                await engine.start()
            x = np.ones((1, 4), np.float32)
            calls = [(name, engine.infer([x], 1, {})) for name, engine in engines.items() for _ in range(4)]
            results = await asyncio.gather(*(call for _, call in calls))
        finally:
            for engine in engines.values():
                await engine.stop(drain_timeout_s=5.0)
        names = [name for name, _ in calls]
        times = [result.times for result in results]
        return [(name, t.compute_start_ns, t.compute_end_ns) for name, t in zip(names, times, strict=True)]

    spans = asyncio.run(main())
    assert len(spans) == 8
    overlaps = [
        (a, b) for a in spans for b in spans if a[0] == "left" and b[0] == "right" and a[1] < b[2] and b[1] < a[2]
    ]
    assert (overlaps == []) is share


def test_a_stop_that_is_cancelled_still_takes_the_model_off_the_cores(tmp_path: Path) -> None:
    """A busy model's threads must not hold the others back forever because its stop was cut short."""
    write_slow_model(tmp_path, "slow", rounds=4000)

    async def main() -> None:
        cores = Cores()
        engine = ModelEngine(ModelRepository(tmp_path).read("slow"), cores=cores)
        await engine.start()
        request = asyncio.ensure_future(engine.infer([np.ones((1, 4), np.float32)], 1, {}))
        while cores.busy_threads == 0:
            await asyncio.sleep(0.001)
        stop = asyncio.ensure_future(engine.stop(drain_timeout_s=30.0))
        await asyncio.sleep(0.01)
        stop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stop
        assert cores.busy_threads == 0
        await engine.stop(drain_timeout_s=30.0)
        assert (await request).outputs[0].shape == (1, 4)

    asyncio.run(main())


def test_bursts_to_two_models_on_shared_cores_with_workers_killed_lose_no_request(tmp_path: Path) -> None:
    """Bursts of requests of 1-4 rows to two models at once, a worker of each killed mid-run: every request gets
    its own rows back or says why, and the cores' account comes back to nothing busy."""
    workers = [{"batch": 1, "threads": 1}, {"batch": 4, "threads": 1}]
    for name in ("left", "right"):
        write_slow_model(tmp_path, name, rounds=200, max_batch_size=4, workers=workers)
    repository = ModelRepository(tmp_path)
    rng = random.Random(3)
    outcomes: Counter[str] = Counter()

    async def one(engine: ModelEngine, index: int) -> None:
        rows = rng.randint(1, 4)
        x = np.full((rows, 4), index, dtype=np.float32)
        try:
            result = await engine.infer([x], rows, {})
        except InferenceError:
            outcomes["worker_died"] += 1  # a row whose worker died twice
        else:
            np.testing.assert_array_equal(result.outputs[0], x)
            outcomes["ok"] += 1

    async def main() -> None:
        cores = Cores()
        engines = [ModelEngine(repository.read(name), cores=cores) for name in ("left", "right")]
        try:
            for engine in engines:
                await engine.start()
            calls = []
            for burst in range(6):
                calls += [asyncio.ensure_future(one(rng.choice(engines), burst * 20 + i)) for i in range(20)]
                if burst in (2, 4):
                    victim = engines[burst // 2 - 1]
                    os.kill(rng.choice([p.pid for p in victim._processes.values()]), signal.SIGKILL)  # our own
                await asyncio.sleep(0.03)
            await asyncio.wait_for(asyncio.gather(*calls), 120)
            assert sum(outcomes.values()) == 120 and outcomes["ok"] > 100, outcomes
            assert cores.busy_threads == 0
            assert all(engine.stats.worker_restarts == 1 for engine in engines)
        finally:
            for engine in engines:
                await engine.stop(drain_timeout_s=5.0)

    asyncio.run(main())
