"""Everything the queue does at once, on real processes: bursts past the queue bound, requests of several sizes and
priority levels, timeouts that reject or delay, callers that stop waiting, and workers killed mid-batch. Whatever
happens, every request gets an answer (its own rows, or an error that says why), and the pool, the queue and its
per-level counts come back to empty."""

from __future__ import annotations

import asyncio
import os
import random
import signal
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from adaserve.engine.engine import ModelEngine
from adaserve.errors import InferenceError, OverloadedError
from tests.engine.engines import run_engine
from tests.server_utils import write_slow_model

BURSTS = 12
BURST = 40  # requests of 1-4 rows at once: about 100 rows against a queue of 48


@pytest.mark.parametrize("action", ["reject", "delay"])
def test_bursts_with_every_queue_feature_lose_no_request_and_leave_nothing_behind(tmp_path: Path, action: str) -> None:
    policy = {"timeout_action": action}
    batching = {
        "priority_levels": 3,
        "default_queue_policy": policy,
        "priority_queue_policy": {1: {**policy, "max_queue_size": 8, "default_timeout_us": 20_000}},
    }
    workers = [{"batch": 1, "threads": 1}, {"batch": 2, "threads": 1}, {"batch": 4, "threads": 1}]
    write_slow_model(
        tmp_path, "slow", rounds=300, max_batch_size=4, max_queue_size=48, workers=workers, batching=batching
    )
    rng = random.Random(7)
    outcomes: Counter[str] = Counter()

    async def one(engine: ModelEngine, index: int) -> None:
        rows = rng.randint(1, 4)
        x = np.full((rows, 4), index, dtype=np.float32)
        parameters: dict[str, int] = {}
        if rng.random() < 0.5:
            parameters["priority"] = rng.randint(0, 4)
        if rng.random() < 0.4:
            parameters["timeout"] = rng.choice([500, 2000, 10_000, 50_000])
        try:
            result = await engine.infer([x], rows, parameters)
        except OverloadedError as error:
            outcomes["timeout" if "timeout" in str(error) else "full"] += 1
        except InferenceError:
            outcomes["worker_died"] += 1  # a row whose worker died twice
        except asyncio.CancelledError:
            outcomes["cancelled"] += 1
        else:
            np.testing.assert_array_equal(result.outputs[0], x)  # its own rows, whatever batches carried them
            outcomes["ok"] += 1

    async def body(engine: ModelEngine) -> None:
        loop = asyncio.get_running_loop()
        calls: list[asyncio.Task[None]] = []
        for burst in range(BURSTS):
            batch = [loop.create_task(one(engine, burst * BURST + i)) for i in range(BURST)]
            calls += batch
            await asyncio.sleep(0)  # queued
            for call in rng.sample(batch, 2):
                call.cancel()  # its caller stopped waiting: queued rows leave, started ones run to the end
            if burst in (4, 8):
                os.kill(rng.choice([p.pid for p in engine._processes.values()]), signal.SIGKILL)  # our own worker
            await asyncio.sleep(0.05)
        await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 120)
        await asyncio.wait_for(engine._idle.wait(), 30)
        assert sum(outcomes.values()) == BURSTS * BURST, outcomes
        assert outcomes["ok"] > 0 and outcomes["full"] > 0 and outcomes["cancelled"] > 0, outcomes
        assert engine.stats.worker_restarts == 2
        if action == "delay":
            assert engine.stats.delayed > 0 and outcomes["timeout"] == 0, outcomes
        else:
            assert engine.stats.delayed == 0 and outcomes["timeout"] > 0, outcomes
        scheduler = engine.scheduler
        assert (scheduler.ready, scheduler.inflight, engine._ring.in_use) == (0, 0, 0)
        assert all(scheduler.rows_at(rank) == 0 for rank in range(8))

    run_engine(tmp_path, body, model="slow")
