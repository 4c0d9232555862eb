"""ModelEngine driven in-process, with real host and worker processes: what it measures, and worker-set switches."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from adaserve.config import WorkerSpec
from adaserve.engine.engine import EngineState, ModelEngine, PendingRequest, idle_spin_in_force
from adaserve.engine.worker_sets import FixedWorkerSet, WorkerSetChoice
from adaserve.errors import InvalidInputError, ModelNotReadyError, OverloadedError
from adaserve.repository import ModelRepository
from benchmarks.common import tree_cpu_s
from tests.engine.engines import live_hosts, run_engine
from tests.server_utils import link_example, write_slow_model

ONE_WORKER = [{"batch": 4, "threads": 1}]
#: The set the switch tests switch to.
TWO_OF_BATCH_2 = (WorkerSpec(batch=2, threads=1), WorkerSpec(batch=2, threads=1))


def test_the_engine_measures_the_weights_and_each_workers_workspace(tmp_path: Path) -> None:
    link_example(tmp_path, "mlp", workers=[{"batch": 4, "threads": 1}, {"batch": 16, "threads": 1}])

    async def body(engine: ModelEngine) -> None:
        weights = (784 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10) * 4  # the example MLP's FP32 parameters
        assert engine.model_bytes == weights
        assert len(engine.workers) == 2
        assert engine.memory_bytes == weights + sum(w.workspace_bytes for w in engine.workers.values())

    run_engine(tmp_path, body)


def test_a_worker_polls_for_its_next_batch_until_another_worker_starts(tmp_path: Path) -> None:
    """`idle_spin_us`: after a batch it ran alone a worker polls its pipe (it uses CPU while idle); a batch for
    another worker tells it to rest (it sleeps again)."""
    batching = {"policy": "elastic", "idle_spin_us": 1_000_000, "max_busy_threads": 1}
    link_example(tmp_path, "mlp", workers=[{"batch": 1, "threads": 1}, {"batch": 2, "threads": 1}], batching=batching)

    async def body(engine: ModelEngine) -> None:
        pid = next(w.pid for w in engine.workers.values() if w.batch == 1)
        await engine.infer([np.zeros((1, 784), np.float32)], 1, {})  # the batch-1 worker runs it, then polls
        before = tree_cpu_s(pid)
        await asyncio.sleep(0.4)
        assert tree_cpu_s(pid) - before > 0.1
        await engine.infer([np.zeros((2, 784), np.float32)], 2, {})  # the batch-2 worker takes the core
        await asyncio.sleep(0.05)
        before = tree_cpu_s(pid)
        await asyncio.sleep(0.4)
        assert tree_cpu_s(pid) - before < 0.05

    run_engine(tmp_path, body)


def test_the_saturated_limit_reaches_the_scheduler(tmp_path: Path) -> None:
    batching = {"policy": "elastic", "max_busy_threads": 0, "max_busy_threads_saturated": 1}
    link_example(tmp_path, "mlp", workers=[{"batch": 1, "threads": 1}], batching=batching)

    async def body(engine: ModelEngine) -> None:
        scheduler = engine.scheduler
        assert (scheduler.max_busy_threads, scheduler.saturated_busy_threads) == (None, 1)

    run_engine(tmp_path, body)


@pytest.mark.parametrize(("device", "cpus", "expected"), [("cpu", {0, 1}, 5000), ("cpu", {0}, 0), ("cuda", {0, 1}, 0)])
def test_workers_poll_only_on_cpu_and_with_a_core_beside_the_frontend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, device: str, cpus: set[int], expected: int
) -> None:
    config = ModelRepository(link_example(tmp_path, "mlp", device=device).parent).read("mlp").config
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: cpus)
    assert idle_spin_in_force(config) == expected


def test_a_new_worker_that_dies_before_the_switch_is_started_again(tmp_path: Path) -> None:
    """The gap between a standby worker's readiness and the switch: the new set must not run one short. The first
    new worker is ready and gone before the second has even been forked (on a loaded machine a fork can take that
    long; CI once caught the switch counting only the new workers still alive, and running one short)."""
    link_example(tmp_path, "mlp", workers=ONE_WORKER)

    async def body(engine: ModelEngine) -> None:
        original = engine._spawn
        killed: list[int] = []

        async def spawn_then_kill_first(spec: WorkerSpec, set_id: int) -> tuple[int, asyncio.Future[None]]:
            worker_id, started = await original(spec, set_id)
            if set_id != engine._active_set and not killed:
                killed.append(worker_id)
                await started
                os.kill(engine._processes[worker_id].pid, signal.SIGKILL)  # our own worker, by its PID
                while worker_id in engine._processes:
                    await asyncio.sleep(0.01)
            return worker_id, started

        engine._spawn = spawn_then_kill_first  # type: ignore[method-assign]
        await engine.switch_workers(WorkerSetChoice(workers=TWO_OF_BATCH_2, reason="test"))
        deadline = time.monotonic() + 60.0  # a restart forks and warms up a worker: slow on a busy machine
        while sorted(w.batch for w in engine.workers.values()) != [2, 2] and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert sorted(w.batch for w in engine.workers.values()) == [2, 2]
        rows = np.zeros((3, 784), dtype=np.float32)
        result: Any = await engine.infer([rows], 3, {})
        assert result.outputs[0].shape == (3, 10)

    run_engine(tmp_path, body)


def test_a_set_the_planner_prepares_as_the_model_loads_starts_with_its_max_inflight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a CUDA model's stream-profile planner does at load (`prepare`), on the CPU: the prepared set replaces
    the initial one before any worker starts, and its MaxInf is the scheduler's."""
    link_example(tmp_path, "mlp", workers=ONE_WORKER)
    chosen = WorkerSetChoice(TWO_OF_BATCH_2, "prepared", max_inflight=3)
    monkeypatch.setattr(FixedWorkerSet, "prepare", lambda self: chosen)

    async def body(engine: ModelEngine) -> None:
        assert engine.worker_set is chosen and engine.scheduler.max_inflight == 3
        assert sorted(w.batch for w in engine.workers.values()) == [2, 2]
        result: Any = await engine.infer([np.zeros((3, 784), dtype=np.float32)], 3, {})
        assert result.outputs[0].shape == (3, 10)

    run_engine(tmp_path, body)


@pytest.mark.parametrize("replaced_before_the_switch", [True, False])
def test_an_old_worker_that_dies_while_the_new_set_starts_leaves_only_the_new_set(
    tmp_path: Path, replaced_before_the_switch: bool
) -> None:
    """An old worker dies while the new set warms up, and is replaced: the replacement belongs to the old set and
    stops at the switch, whether it was ready before the switch or forked after it. Found by a soak of `workers:
    auto` under worker kills: the switch retired the old workers it had listed before the wait, failed on the
    dead one's id (KeyError), which ended Packrat's load-following task with the new set never activated, and the
    replacement served on beside it."""
    link_example(tmp_path, "mlp", workers=ONE_WORKER)

    async def body(engine: ModelEngine) -> None:
        original = engine._spawn
        switched = asyncio.Event()
        (old_id,) = engine._processes

        async def spawn(spec: WorkerSpec, set_id: int) -> tuple[int, asyncio.Future[None]]:
            if set_id == 0 and not replaced_before_the_switch:
                await switched.wait()  # the old worker's replacement is forked only after the switch
            worker_id, started = await original(spec, set_id)
            if set_id == 1 and old_id in engine._processes:
                os.kill(engine._processes[old_id].pid, signal.SIGKILL)  # our own worker, by its PID
                while old_id in engine._processes or (
                    replaced_before_the_switch and len([w for w in engine.workers if w != worker_id]) < 1
                ):
                    await asyncio.sleep(0.01)
            return worker_id, started

        engine._spawn = spawn  # type: ignore[method-assign]
        await engine.switch_workers(WorkerSetChoice(workers=TWO_OF_BATCH_2, reason="test"))
        switched.set()
        assert engine.stats.worker_restarts == 1 and engine.stats.reconfigurations == 1
        deadline = time.monotonic() + 60.0  # the replacement forks, warms up and stops: slow on a busy machine
        while len(engine._processes) != 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert sorted(p.spec.batch for p in engine._processes.values()) == [2, 2]
        assert sorted(w.batch for w in engine.scheduler.workers) == [2, 2]
        rows = np.zeros((3, 784), dtype=np.float32)
        assert (await engine.infer([rows], 3, {})).outputs[0].shape == (3, 10)

    run_engine(tmp_path, body)


def test_a_switch_under_way_when_the_model_unloads_ends_and_leaves_no_process(tmp_path: Path) -> None:
    """Packrat's switch forks its new set while the model unloads (an eviction, an API unload): stop() ends the
    host mid-fork. The switch must end, start no new host, and leave no worker behind. Before, its spawn took the
    ended host for a dead one, started another, and waited for ever on a worker that never came."""
    link_example(tmp_path, "mlp", workers=ONE_WORKER)

    async def main() -> None:
        others = live_hosts()
        engine = ModelEngine(ModelRepository(tmp_path).read("mlp"))
        await engine.start()
        switch = asyncio.get_running_loop().create_task(engine.switch_workers(WorkerSetChoice(TWO_OF_BATCH_2, "test")))
        await asyncio.sleep(0)  # the switch has sent its first spawn to the host
        # Well under stop()'s own 10 s wait for the workers it told to stop: no worker forked meanwhile was missed.
        await asyncio.wait_for(engine.stop(drain_timeout_s=5.0), 8.0)
        await asyncio.wait_for(switch, 5.0)  # at once: a spawn the host had answered, or one it never will
        assert engine._processes == {} and engine.stats.host_restarts == 0
        assert set(live_hosts()) <= set(others)  # the host is gone (its workers were waited for by stop())

    asyncio.run(main())


def test_a_start_that_is_cancelled_stops_the_processes_it_had_started(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A load cut off half-way (the server stopping, say) must not leave its host or workers running. Before, only
    a start that failed stopped them. The host, hung up on while it loads, exits quietly when it finds no one to
    report to (before: a traceback and exit code 1)."""
    link_example(tmp_path, "mlp", workers=ONE_WORKER)

    async def main() -> None:
        others = live_hosts()
        engine = ModelEngine(ModelRepository(tmp_path).read("mlp"))
        start = asyncio.get_running_loop().create_task(engine.start())
        deadline = time.monotonic() + 60.0
        while len(live_hosts()) == len(others) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # the host is starting
        start.cancel()
        with pytest.raises(asyncio.CancelledError):
            await start
        assert engine._processes == {}
        assert set(live_hosts()) <= set(others)
        if engine._host is not None:  # else the cancel came while the host was forked, and the launch ended it
            assert await engine._host.process.wait() == 0

    asyncio.run(main())
    assert "Traceback" not in capfd.readouterr().err


def test_a_request_whose_timeout_passes_before_it_starts_is_refused_and_its_slots_freed(tmp_path: Path) -> None:
    """Triton's `timeout` request parameter (microseconds): a request still queued when it passes is answered with
    a 503 naming it; one that started runs to the end; a bad value is refused before anything is queued."""
    write_slow_model(tmp_path, "slow", rounds=4000)  # one worker of batch 1; ~20 ms a row, far past the timeout

    async def body(engine: ModelEngine) -> None:
        x = np.ones((1, 4), dtype=np.float32)
        running = asyncio.get_running_loop().create_task(engine.infer([x], 1, {"timeout": 1000}))
        await asyncio.sleep(0)  # dispatched at once: the worker was idle
        with pytest.raises(OverloadedError, match=r"its timeout \(1000 µs\) passed before any of its rows started"):
            await engine.infer([x], 1, {"timeout": 1000})
        np.testing.assert_array_equal((await running).outputs[0], x)  # started in time: it ran to the end
        assert engine.stats.failures["timeout"] == 1 and engine._ring.in_use == 0
        assert (await engine.infer([x], 1, {"timeout": 0})).outputs[0].shape == (1, 4)  # 0: no limit
        for bad in (-1, 1.5, "soon", True):
            with pytest.raises(InvalidInputError, match="parameter 'timeout' must be a whole number of micro"):
                await engine.infer([x], 1, {"timeout": bad})

    run_engine(tmp_path, body, model="slow")


async def finish_order(engine: ModelEngine, queued: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The order in which requests finish on a one-worker model: `first` runs at once, then `queued` (name and
    parameters of each) are sent while it computes, so they all wait together."""
    x = np.ones((1, 4), dtype=np.float32)
    finished: list[str] = []

    async def send(name: str, parameters: dict[str, Any]) -> None:
        await engine.infer([x], 1, parameters)
        finished.append(name)

    loop = asyncio.get_running_loop()
    calls = [loop.create_task(send("first", {}))]
    await asyncio.sleep(0)  # dispatched at once: the worker was idle
    calls += [loop.create_task(send(name, parameters)) for name, parameters in queued]
    await asyncio.sleep(0)
    assert engine.scheduler.ready == len(queued)
    await asyncio.gather(*calls)
    return finished


@pytest.mark.parametrize(
    ("levels", "order"), [(2, ["first", "high", "low", "low too"]), (0, ["first", "low", "low too", "high"])]
)
def test_a_request_of_higher_priority_queued_last_runs_next(tmp_path: Path, levels: int, order: list[str]) -> None:
    """Triton's `priority` parameter (1 the highest): with two levels, a request sent with priority 1 behind two
    sent without (the default, the lowest level) runs as soon as the worker is free; with priority off
    (`priority_levels: 0`, the default) the queue keeps arrival order."""
    write_slow_model(tmp_path, "slow", rounds=4000, batching={"priority_levels": levels})  # one worker, ~20 ms a row

    async def body(engine: ModelEngine) -> None:
        assert await finish_order(engine, [("low", {}), ("low too", {}), ("high", {"priority": 1})]) == order

    run_engine(tmp_path, body, model="slow")


def test_a_request_whose_timeout_passes_under_a_delay_policy_waits_on_behind_its_level(tmp_path: Path) -> None:
    """Triton's `timeout_action: DELAY`: a request still queued when its timeout passes is not refused; it runs
    after the requests of its level that are still in time, the two sent after it here."""
    policy = {"timeout_action": "delay", "default_timeout_us": 0}
    write_slow_model(tmp_path, "slow", rounds=4000, batching={"default_queue_policy": policy})  # one worker, ~20 ms

    async def body(engine: ModelEngine) -> None:
        sent = [("late", {"timeout": 1000}), ("b", {}), ("c", {})]
        assert await finish_order(engine, sent) == ["first", "b", "c", "late"]
        assert engine.stats.delayed == 1 and not engine.stats.failures

    run_engine(tmp_path, body, model="slow")


def test_a_level_whose_queue_is_full_refuses_while_the_others_still_queue(tmp_path: Path) -> None:
    """A queue policy's `max_queue_size` bounds the rows waiting at its level alone (503 naming the level)."""
    batching = {"priority_levels": 2, "priority_queue_policy": {1: {"max_queue_size": 1}}}
    write_slow_model(tmp_path, "slow", rounds=4000, batching=batching)  # one worker of batch 1, ~20 ms a row

    async def body(engine: ModelEngine) -> None:
        x = np.ones((1, 4), dtype=np.float32)
        loop = asyncio.get_running_loop()
        calls = [loop.create_task(engine.infer([x], 1, {}))]
        await asyncio.sleep(0)  # dispatched at once: the worker was idle
        calls.append(loop.create_task(engine.infer([x], 1, {"priority": 1})))
        await asyncio.sleep(0)
        with pytest.raises(OverloadedError, match=r"1 rows queued at priority level 1 \(the queue policy's max_queue"):
            await engine.infer([x], 1, {"priority": 1})
        calls.append(loop.create_task(engine.infer([x], 1, {"priority": 2})))
        await asyncio.sleep(0)
        assert (engine.scheduler.ready, engine.stats.failures["overloaded"]) == (2, 1)
        assert len(await asyncio.gather(*calls)) == 3

    run_engine(tmp_path, body, model="slow")


def test_a_queued_request_whose_caller_stops_waiting_leaves_the_queue_and_never_runs(tmp_path: Path) -> None:
    """A client that hangs up or whose gRPC deadline passes cancels the call awaiting `infer`: rows not started are
    taken back out of the queue, so no worker computes answers no one will read; rows started run to the end.
    Before, every abandoned row still ran, and a flood of abandoned requests filled the queue for the others."""
    write_slow_model(tmp_path, "slow", rounds=4000)  # one worker of batch 1; ~20 ms a row: the next one queues

    async def body(engine: ModelEngine) -> None:
        x = np.ones((1, 4), dtype=np.float32)
        loop = asyncio.get_running_loop()
        running = loop.create_task(engine.infer([x], 1, {}))
        await asyncio.sleep(0)  # dispatched at once: the worker was idle
        queued = loop.create_task(engine.infer([x], 1, {}))
        await asyncio.sleep(0)
        assert engine.scheduler.ready == 1
        queued.cancel()
        running.cancel()
        for call in (queued, running):
            with pytest.raises(asyncio.CancelledError):
                await call
        assert engine.scheduler.ready == 0 and engine.stats.failures["cancelled"] == 1
        await asyncio.wait_for(engine._idle.wait(), 30.0)  # the started row ran to the end, and freed its slot
        assert engine._ring.in_use == 0 and engine.stats.inference_count == 1
        np.testing.assert_array_equal((await engine.infer([x], 1, {})).outputs[0], x)

    run_engine(tmp_path, body, model="slow")


def test_a_request_that_finds_no_contiguous_slots_waits_for_them_and_is_answered(tmp_path: Path) -> None:
    """A fragmented pool: the request waits (counted against the queue limit), then runs once slots free up."""
    link_example(tmp_path, "mlp", workers=ONE_WORKER)

    async def body(engine: ModelEngine) -> None:
        taken = engine._ring.allocate(engine.slots - 2)  # leaves two free slots: too few for three rows
        assert taken is not None
        rows = np.random.default_rng(0).standard_normal((3, 784)).astype(np.float32)
        waiting = asyncio.get_running_loop().create_task(engine.infer([rows], 3, {}))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        assert engine._waiting_rows == 3
        engine._ring.free(taken, engine.slots - 2)
        engine._admit_waiting()
        result = await asyncio.wait_for(waiting, 10.0)
        alone = await engine.infer([rows[:1]], 1, {})
        np.testing.assert_allclose(result.outputs[0][:1], alone.outputs[0], rtol=1e-5, atol=1e-5)
        assert engine._waiting_rows == 0
        assert engine._ring.in_use == 0

    run_engine(tmp_path, body)


def test_a_waiting_request_that_is_cancelled_gives_its_slots_back(tmp_path: Path) -> None:
    link_example(tmp_path, "mlp", workers=ONE_WORKER)

    async def body(engine: ModelEngine) -> None:
        taken = engine._ring.allocate(engine.slots)
        assert taken is not None
        rows = np.zeros((2, 784), dtype=np.float32)
        waiting = asyncio.get_running_loop().create_task(engine.infer([rows], 2, {}))
        await asyncio.sleep(0.05)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        assert engine._waiting_rows == 0
        engine._ring.free(taken, engine.slots)
        engine._admit_waiting()
        assert engine._ring.in_use == 0
        assert (await engine.infer([rows], 2, {})).outputs[0].shape == (2, 10)

    run_engine(tmp_path, body)


def test_a_host_that_died_is_started_again_when_a_worker_must_be_replaced(tmp_path: Path) -> None:
    """On CPU the workers outlive their host; the next worker to die needs a new one. (On CUDA the workers are the
    host's threads and die with it: this is how that model comes back.)"""
    link_example(tmp_path, "mlp", workers=ONE_WORKER)

    async def body(engine: ModelEngine) -> None:
        assert engine._host is not None
        first_host = engine._host.process.pid
        os.kill(first_host, signal.SIGKILL)  # our own host, by its PID
        (worker,) = engine._processes.values()
        os.kill(worker.pid, signal.SIGKILL)  # and our own worker
        deadline = time.monotonic() + 60.0
        while (len(engine.workers) != 1 or worker.id in engine._processes) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert len(engine.workers) == 1 and engine._host.process.pid != first_host
        assert engine.stats.host_restarts == 1 and engine.stats.worker_restarts == 1
        rows = np.random.default_rng(0).standard_normal((2, 784)).astype(np.float32)
        result: Any = await engine.infer([rows], 2, {})
        assert result.outputs[0].shape == (2, 10)

    run_engine(tmp_path, body)


def test_a_host_that_dies_is_reaped_at_once_and_its_workers_serve_on(tmp_path: Path) -> None:
    """A killed host stayed a zombie until the next worker death restarted it; it is reaped as it exits now."""
    link_example(tmp_path, "mlp", workers=ONE_WORKER)

    async def body(engine: ModelEngine) -> None:
        assert engine._host is not None
        host = engine._host.process.pid
        os.kill(host, signal.SIGKILL)  # our own host, by its PID
        deadline = time.monotonic() + 30.0
        while Path(f"/proc/{host}").exists() and time.monotonic() < deadline:  # a zombie keeps its /proc entry
            await asyncio.sleep(0.01)
        assert not Path(f"/proc/{host}").exists()
        result: Any = await engine.infer([np.zeros((2, 784), np.float32)], 2, {})
        assert result.outputs[0].shape == (2, 10) and engine.stats.host_restarts == 0

    run_engine(tmp_path, body)


def test_rows_sent_to_workers_already_dead_are_run_again_without_counting_a_death(tmp_path: Path) -> None:
    """Workers that die together (on CUDA, every worker of a host that dies) are seen to exit one by one, and the
    rows of the first are handed to the next before its exit is seen: a batch that never reached its worker is no
    death of the request's (it used to count, and the request failed as if it had killed two workers)."""
    link_example(tmp_path, "mlp", workers=[{"batch": 1, "threads": 1}] * 2)

    async def body(engine: ModelEngine) -> None:
        pids = [process.pid for process in engine._processes.values()]
        for pid in pids:
            os.kill(pid, signal.SIGKILL)  # our own workers, by their PIDs
        deadline = time.monotonic() + 30.0
        while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.01)  # blocks the event loop on purpose: the engine must not see the exits yet
        rows = np.random.default_rng(1).standard_normal((1, 784)).astype(np.float32)
        result: Any = await asyncio.wait_for(engine.infer([rows], 1, {}), 60.0)
        assert result.outputs[0].shape == (1, 10)
        assert engine.stats.worker_restarts == 2 and not engine._undelivered

    run_engine(tmp_path, body)


def test_parameters_that_cannot_reach_a_worker_are_refused_and_the_model_keeps_serving(tmp_path: Path) -> None:
    """An integer beyond 64 bits cannot be sent in a batch: the request is refused before it is queued. (It used to
    fail while its batch was being sent, leaving that worker busy forever.)"""
    link_example(tmp_path, "mlp", workers=[{"batch": 1, "threads": 1}])

    async def body(engine: ModelEngine) -> None:
        rows = np.zeros((1, 784), np.float32)
        for _ in range(2):
            with pytest.raises(InvalidInputError, match="parameter 'priority' cannot be passed to the model"):
                await engine.infer([rows], 1, {"priority": 2**70})
        answers = await asyncio.wait_for(asyncio.gather(*(engine.infer([rows], 1, {}) for _ in range(3))), 10.0)
        assert len(answers) == 3
        assert engine._ring.in_use == 0

    run_engine(tmp_path, body)


def test_a_request_keeps_one_report_per_row_when_its_rows_run_again_split_differently() -> None:
    """Rows whose worker died after reporting them run again, perhaps split into other batches: the new reports
    replace the old ones they overlap, so no row counts twice."""
    loop = asyncio.new_event_loop()
    try:
        pending = PendingRequest(10, 6, 0, {}, loop.create_future(), outstanding=6)
        pending.record(10, 2, {"exited_rows": 2})
        pending.record(12, 4, {"exited_rows": 1})
        pending.record(12, 2, {"exited_rows": 0})  # rows 12-15 ran again as 2 + 2
        pending.record(14, 2, {"exited_rows": 2})
        assert pending.parts == {10: (2, {"exited_rows": 2}), 12: (2, {"exited_rows": 0}), 14: (2, {"exited_rows": 2})}
        pending.record(10, 4, {"exited_rows": 3})  # and rows 10-13 again as one batch
        assert pending.parts == {10: (4, {"exited_rows": 3}), 14: (2, {"exited_rows": 2})}
    finally:
        loop.close()


def fail_spawns(engine: ModelEngine, times: int) -> list[float]:
    """Make the engine's next `times` worker starts fail as when the server's open files are exhausted; the
    loop times at which starts were tried."""
    original, tried = engine._spawn, []

    async def spawn(spec: WorkerSpec, set_id: int) -> tuple[int, asyncio.Future[None]]:
        tried.append(asyncio.get_running_loop().time())
        if len(tried) <= times:
            raise OSError(24, "Too many open files")
        return await original(spec, set_id)

    engine._spawn = spawn  # type: ignore[method-assign]
    return tried


async def kill_a_worker(engine: ModelEngine, batch: int) -> None:
    worker = next(w for w in engine.workers.values() if w.batch == batch)
    os.kill(worker.pid, signal.SIGKILL)  # our own worker, by its PID
    while worker.id in engine.workers:
        await asyncio.sleep(0.01)


async def wait_for_workers(engine: ModelEngine, batches: list[int], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s  # a restart forks and warms up a worker: slow on a busy machine
    while sorted(w.batch for w in engine.workers.values()) != batches and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert sorted(w.batch for w in engine.workers.values()) == batches


def test_a_worker_that_cannot_be_restarted_is_tried_again_with_backoff_while_the_others_serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker killed while the server's open files were exhausted: 'cannot restart worker: [Errno 24]', and the
    model stayed unavailable for good with 5 of its 6 workers alive. Now it stays ready, its other worker serves,
    and the restart is tried again after 0.05, then 0.1 s, until it starts."""
    monkeypatch.setattr("adaserve.engine.engine.RESTART_BACKOFF_S", 0.05)
    link_example(tmp_path, "mlp", workers=[{"batch": 1, "threads": 1}, {"batch": 2, "threads": 1}])

    async def body(engine: ModelEngine) -> None:
        tried = fail_spawns(engine, times=2)
        await kill_a_worker(engine, batch=1)
        result: Any = await engine.infer([np.zeros((1, 784), np.float32)], 1, {})  # the batch-2 worker serves
        assert result.outputs[0].shape == (1, 10) and engine.state is EngineState.READY
        await wait_for_workers(engine, [1, 2])
        assert len(tried) == 3 and tried[2] - tried[1] >= 0.1 - 0.01 and tried[1] - tried[0] >= 0.05 - 0.01
        assert engine.stats.worker_restarts == 1

    run_engine(tmp_path, body)


def test_a_model_none_of_whose_workers_can_start_is_unavailable_until_one_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With its only worker gone and three starts failed in a row, the model cannot serve at all: its requests get
    a 503 that says why. It keeps trying, and is ready again once a worker starts."""
    monkeypatch.setattr("adaserve.engine.engine.RESTART_BACKOFF_S", 0.05)
    link_example(tmp_path, "mlp", workers=[{"batch": 1, "threads": 1}])

    async def body(engine: ModelEngine) -> None:
        tried = fail_spawns(engine, times=4)
        await kill_a_worker(engine, batch=1)
        while len(tried) < 3:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.01)
        assert engine.state is EngineState.UNAVAILABLE
        with pytest.raises(ModelNotReadyError, match=r"no worker could be started \(3 tries in a row: .*retrying"):
            await engine.infer([np.zeros((1, 784), np.float32)], 1, {})
        await wait_for_workers(engine, [1])
        assert engine.state is EngineState.READY and len(tried) == 5
        result: Any = await engine.infer([np.zeros((1, 784), np.float32)], 1, {})
        assert result.outputs[0].shape == (1, 10)

    run_engine(tmp_path, body)
