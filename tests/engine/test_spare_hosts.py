"""HostLauncher's spares: host processes started ahead of a load, with real processes and a real model."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from adaserve.engine.engine import ModelEngine
from adaserve.engine.host import _launch_waiting
from adaserve.engine.processes import HostLauncher, _how_it_ended
from adaserve.errors import ConfigError
from adaserve.repository import ModelRepository
from tests.server_utils import EXAMPLES, link_example

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


def test_a_host_started_for_a_load_that_cannot_take_it_fails_the_load_once() -> None:
    """A failed hand-over to a host started for the load is this side's fault (here a closed pool): the load fails
    naming it, and no other host is started for it (the server once started hosts for ever while it stopped)."""
    model = ModelRepository(EXAMPLES).read("mlp")
    closed = 4095  # not a pipe closed here: the host's start would open a socket under the freed number
    with pytest.raises(OSError):
        os.fstat(closed)
    launcher = HostLauncher()
    with pytest.raises(ConfigError, match=r"model 'mlp': cannot hand the model to a host: \[Errno 9\]"):
        launcher.launch(model, pool_fd=closed, slots=16)
    assert launcher.launches == {"spare": 0, "cold": 0}


def test_a_load_on_a_host_started_for_it_counts_the_start_as_waiting_for_a_host(tmp_path: Path) -> None:
    link_example(tmp_path, "mlp", workers=ONE_WORKER)

    async def main() -> None:
        engine = ModelEngine(ModelRepository(tmp_path).read("mlp"), hosts=HostLauncher())
        began = asyncio.get_running_loop().time()
        await engine.start()
        try:
            took = asyncio.get_running_loop().time() - began
            # Starting Python and importing torch is most of a cold load; the mlp's own load is a small part.
            assert 0.2 < engine.host_wait_s < took
        finally:
            await engine.stop(drain_timeout_s=5.0)

    asyncio.run(main())


#: In a fresh interpreter as a spare starts: optionally prime, then count the modules the first program load imports.
FIRST_LOAD = """
import sys
from pathlib import Path
from adaserve.engine.host import prime_program_loading
from adaserve.repository import read_artifact
if sys.argv[2] == "prime":
    prime_program_loading()
before = set(sys.modules)
read_artifact(Path(sys.argv[1]), 16)
print(len(set(sys.modules) - before))
"""


def test_a_primed_spare_loads_its_first_program_without_importing_anything() -> None:
    def modules_imported_by_first_load(prime: str) -> int:
        artifact = str(EXAMPLES / "cnn" / "1" / "model.pt2")
        command = [sys.executable, "-c", FIRST_LOAD, artifact, prime]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
        return int(done.stdout.split()[-1])

    assert modules_imported_by_first_load("no") > 100  # what priming takes off the load's path
    assert modules_imported_by_first_load("prime") == 0


def test_only_a_host_still_waiting_for_its_model_primes() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours, theirs:
        assert not _launch_waiting(theirs)  # a spare: nothing sent yet
        ours.send(b"launch")
        assert _launch_waiting(theirs)  # a host started for a load: the model is already there


def test_a_host_killed_while_it_loads_fails_the_load_naming_the_signal(tmp_path: Path) -> None:
    """The control socket closes before the dead host is reaped; the error says how it ended, not "code None"."""
    link_example(tmp_path, "mlp", workers=ONE_WORKER)

    async def main() -> None:
        launcher = HostLauncher(spares=0)
        engine = ModelEngine(ModelRepository(tmp_path).read("mlp"), hosts=launcher)
        starting = asyncio.get_running_loop().create_task(engine.start())
        while engine._host is None:  # a cold host takes seconds to import torch: it is still loading
            await asyncio.sleep(0.005)
        os.kill(engine._host.process.pid, signal.SIGKILL)  # our own host, by its PID
        with pytest.raises(ConfigError) as error:
            await starting
        assert str(error.value) == "model 'mlp': its host process was killed by SIGKILL"

    asyncio.run(main())


def test_how_a_process_ended_is_named_by_its_code_or_signal() -> None:
    async def ended(code: str) -> str:
        process = subprocess.Popen([sys.executable, "-c", code])
        return await _how_it_ended(process)

    async def main() -> None:
        assert await ended("raise SystemExit(3)") == "exited with code 3"
        assert await ended("import os, signal; os.kill(os.getpid(), signal.SIGTERM)") == "was killed by SIGTERM"
        assert await ended("import os; os.kill(os.getpid(), 40)") == "was killed by signal 40"

    asyncio.run(main())
