"""HostLauncher's spares: host processes started ahead of a load, with real processes and a real model."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import numpy as np

from adaserve.engine.engine import ModelEngine
from adaserve.engine.processes import HostLauncher
from adaserve.repository import ModelRepository
from tests.server_utils import link_example

ONE_WORKER = [{"batch": 1, "threads": 1}]


async def _serve_one_request(repository: Path, launcher: HostLauncher) -> int:
    """Load mlp through `launcher`, answer one request, stop; the PID of the host that served it."""
    engine = ModelEngine(ModelRepository(repository).read("mlp"), hosts=launcher)
    await engine.start()
    try:
        result = await engine.infer([np.zeros((1, 784), np.float32)], 1, {})
        assert result.outputs[0].shape == (1, 10)
        assert engine._host is not None
        return engine._host.process.pid
    finally:
        await engine.stop(drain_timeout_s=5.0)


def test_a_load_takes_the_spare_and_a_new_spare_starts_behind_it(tmp_path: Path) -> None:
    link_example(tmp_path, "mlp", workers=ONE_WORKER)

    async def main() -> None:
        launcher = HostLauncher(spares=1)
        [spare] = launcher.waiting_pids
        try:
            assert await _serve_one_request(tmp_path, launcher) == spare
            [behind] = launcher.waiting_pids
            assert behind != spare
            # The next load takes the spare started behind the first.
            assert await _serve_one_request(tmp_path, launcher) == behind
            assert launcher.launches == {"spare": 2, "cold": 0}
        finally:
            await launcher.close()
        assert launcher.waiting_pids == []

    asyncio.run(main())


def test_a_spare_that_died_while_it_waited_is_replaced(tmp_path: Path) -> None:
    link_example(tmp_path, "mlp", workers=ONE_WORKER)

    async def main() -> None:
        launcher = HostLauncher(spares=1)
        [spare] = launcher.waiting_pids
        try:
            os.kill(spare, signal.SIGKILL)  # our own child, by its PID
            await asyncio.get_running_loop().run_in_executor(None, os.waitpid, spare, 0)
            served_by = await _serve_one_request(tmp_path, launcher)
            assert served_by != spare
            assert launcher.launches == {"spare": 0, "cold": 1}  # the dead spare's load went to a host started then
        finally:
            await launcher.close()

    asyncio.run(main())


def test_closing_ends_every_spare() -> None:
    async def main() -> None:
        launcher = HostLauncher(spares=2)
        waiting = list(launcher._waiting)
        assert len(waiting) == 2
        await launcher.close()
        assert [process.returncode for process, _ in waiting] == [0, 0]  # each exited on its own at the hang-up

    asyncio.run(main())


def test_without_spares_each_load_starts_its_own_host(tmp_path: Path) -> None:
    link_example(tmp_path, "mlp", workers=ONE_WORKER)

    async def main() -> None:
        launcher = HostLauncher()
        assert launcher.waiting_pids == []
        first = await _serve_one_request(tmp_path, launcher)
        second = await _serve_one_request(tmp_path, launcher)
        assert first != second and launcher.waiting_pids == []
        assert launcher.launches == {"spare": 0, "cold": 2}

    asyncio.run(main())
