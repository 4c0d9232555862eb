"""Model hosts forked by the zygote, and HostLauncher's spares, with real processes and a real model."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from adaserve.engine.engine import ModelEngine
from adaserve.engine.processes import HostLauncher, ModelHost, Zygote, how_it_exited
from adaserve.errors import ConfigError
from adaserve.repository import ModelRepository
from tests.server_utils import EXAMPLES, link_example, parent_pid

ONE_WORKER = [{"batch": 1, "threads": 1}]


@pytest.fixture
def own_zygote() -> Iterator[Zygote]:
    """A zygote of the test's own (not the process-wide one other tests fork from), ended after it."""
    zygote = Zygote()
    yield zygote
    if zygote._process is not None and zygote._control is not None:  # started by this test: end it
        zygote._control.close()
        zygote._process.wait(timeout=30)


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


def test_a_load_takes_the_spare_forked_behind_the_one_before(tmp_path: Path) -> None:
    link_example(tmp_path, "mlp", workers=ONE_WORKER)

    async def main() -> None:
        launcher = HostLauncher(spares=1)
        try:
            assert launcher.waiting_pids == []  # nothing forked before the first load
            await _serve_one_request(tmp_path, launcher)
            [spare] = launcher.waiting_pids
            assert await _serve_one_request(tmp_path, launcher) == spare
            [behind] = launcher.waiting_pids
            assert behind != spare
            assert launcher.launches == {"spare": 1, "cold": 1}
        finally:
            await launcher.close()
        assert launcher.waiting_pids == []

    asyncio.run(main())


def test_a_spare_that_died_while_it_waited_is_replaced(tmp_path: Path) -> None:
    link_example(tmp_path, "mlp", workers=ONE_WORKER)

    async def main() -> None:
        launcher = HostLauncher(spares=1)
        try:
            await _serve_one_request(tmp_path, launcher)
            [(spare, _)] = launcher._waiting
            spare.kill()
            assert await spare.wait() == -signal.SIGKILL  # as the zygote, which reaped it, reports
            served_by = await _serve_one_request(tmp_path, launcher)
            assert served_by != spare.pid
            assert launcher.launches == {"spare": 0, "cold": 2}  # the dead spare's load went to a host forked then
        finally:
            await launcher.close()

    asyncio.run(main())


def test_closing_ends_every_spare(tmp_path: Path) -> None:
    link_example(tmp_path, "mlp", workers=ONE_WORKER)

    async def main() -> None:
        launcher = HostLauncher(spares=2)
        await _serve_one_request(tmp_path, launcher)
        waiting = list(launcher._waiting)
        assert len(waiting) == 2
        await launcher.close()
        assert [await process.wait() for process, _ in waiting] == [0, 0]  # each exited on its own at the hang-up

    asyncio.run(main())


def test_without_spares_each_load_forks_its_own_host(tmp_path: Path) -> None:
    link_example(tmp_path, "mlp", workers=ONE_WORKER)

    async def main() -> None:
        launcher = HostLauncher()
        first = await _serve_one_request(tmp_path, launcher)
        second = await _serve_one_request(tmp_path, launcher)
        assert first != second and launcher.waiting_pids == []
        assert launcher.launches == {"spare": 0, "cold": 2}

    asyncio.run(main())


def test_a_host_forked_for_a_load_that_cannot_take_it_fails_the_load_once() -> None:
    """A failed hand-over to a host forked for the load is this side's fault (here a closed pool): the load fails
    naming it, and no other host is forked for it (the server once started hosts for ever while it stopped)."""
    model = ModelRepository(EXAMPLES).read("mlp")
    closed = 4095  # not a pipe closed here: the host's fork would open a socket under the freed number
    with pytest.raises(OSError):
        os.fstat(closed)
    launcher = HostLauncher()
    with pytest.raises(ConfigError, match=r"model 'mlp': cannot hand the model to a host: \[Errno 9\]"):
        asyncio.run(launcher.launch(model, pool_fd=closed, slots=16))
    assert launcher.launches == {"spare": 0, "cold": 0}


def test_hosts_share_the_zygote_and_the_zygote_that_died_is_started_again(tmp_path: Path, own_zygote: Zygote) -> None:
    link_example(tmp_path, "mlp", workers=ONE_WORKER)

    async def main() -> None:
        launcher = HostLauncher(zygote=own_zygote)
        engine = ModelEngine(ModelRepository(tmp_path).read("mlp"), hosts=launcher)
        began = asyncio.get_running_loop().time()
        await engine.start()
        try:
            took = asyncio.get_running_loop().time() - began
            # A cold zygote imports torch before its first fork: the first load waits for it, not for its model.
            assert 0.2 < engine.host_wait_s < took
            first_zygote = own_zygote._process
            assert first_zygote is not None and engine._host is not None
            assert parent_pid(engine._host.process.pid) == first_zygote.pid
            first_zygote.kill()  # started by this test's zygote handle
            first_zygote.wait()
            # The host it forked serves on; the next load forks from a zygote started again.
            result = await engine.infer([np.zeros((1, 784), np.float32)], 1, {})
            assert result.outputs[0].shape == (1, 10)
            second = await _serve_one_request(tmp_path, launcher)
            assert own_zygote._process is not None and own_zygote._process.pid != first_zygote.pid
            assert parent_pid(second) in (own_zygote._process.pid, None)  # None: already exited
        finally:
            await engine.stop(drain_timeout_s=5.0)

    asyncio.run(main())


def test_stop_ends_a_zygote_still_importing(own_zygote: Zygote) -> None:
    """What `adaserve serve` does at exit: a zygote that ignores SIGTERM and has not reached its socket yet is killed
    and reaped, not left to import torch for nothing."""
    own_zygote.start()
    process = own_zygote._process
    assert process is not None
    own_zygote.stop()
    assert process.returncode == -signal.SIGKILL
    own_zygote.stop()  # a zygote already gone: nothing to do


def test_a_host_killed_before_its_model_loaded_fails_the_load_naming_the_signal() -> None:
    """The control socket closes before the zygote has reaped the host and reported it: the error still says how
    it ended, not "code None"."""
    model = ModelRepository(EXAMPLES).read("mlp")

    async def main() -> None:
        process, control = await asyncio.to_thread(HostLauncher()._fork)
        host = ModelHost(model, process, control)  # a host waiting for its model, told nothing yet
        process.kill()
        with pytest.raises(ConfigError) as error:
            await host.ready()
        assert str(error.value) == "model 'mlp': its host process was killed by SIGKILL"
        await host.stop()

    asyncio.run(main())


def test_how_a_process_ended_is_named_by_its_code_or_signal() -> None:
    assert how_it_exited(3) == "exited with code 3"
    assert how_it_exited(-signal.SIGTERM) == "was killed by SIGTERM"
    assert how_it_exited(-40) == "was killed by signal 40"


#: In a fresh interpreter: optionally prime (keeping its program in argv[3]), then count the modules the first
#: program load imports.
FIRST_LOAD = """
import sys
from pathlib import Path
from adaserve.engine.host import prime_program_loading
from adaserve.repository import read_artifact
if sys.argv[2] == "prime":
    prime_program_loading(Path(sys.argv[3]))
before = set(sys.modules)
read_artifact(Path(sys.argv[1]), 16)
print(len(set(sys.modules) - before))
"""


def test_a_primed_zygote_forks_hosts_that_load_their_first_program_without_importing_anything(
    tmp_path: Path,
) -> None:
    def modules_imported_by_first_load(prime: str) -> int:
        artifact = str(EXAMPLES / "cnn" / "1" / "model.pt2")
        command = [sys.executable, "-c", FIRST_LOAD, artifact, prime, str(tmp_path / "cache")]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
        return int(done.stdout.split()[-1])

    assert modules_imported_by_first_load("no") > 100  # what priming takes off the load's path
    assert modules_imported_by_first_load("prime") == 0  # the program exported, and kept
    (stored,) = (tmp_path / "cache").iterdir()
    assert stored.name.startswith("prime-torch-") and stored.suffix == ".pt2"
    written = stored.stat().st_mtime_ns
    assert modules_imported_by_first_load("prime") == 0  # the kept program loaded
    assert stored.stat().st_mtime_ns == written
    stored.write_bytes(b"not a program")
    assert modules_imported_by_first_load("prime") == 0  # exported again, and kept in its place
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [stored.name] and stored.stat().st_size > 1000


def test_the_server_starts_its_zygote_before_importing_numpy_pydantic_or_torch() -> None:
    """`adaserve serve` starts the zygote, whose torch import is its start's longest step, before its own imports:
    the zygote's handle needs none of these (importing them came first, and delayed it by 0.4 s of CPU)."""
    script = (
        "import sys; from adaserve.engine.processes import ZYGOTE; "
        "print([m for m in ('numpy', 'pydantic', 'yaml', 'torch') if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"


#: In a fresh interpreter: the zygote's imports and priming (its program kept in argv[1]), then what they did.
PREPARE = """
import gc, sys
from pathlib import Path
from adaserve.engine import zygote
thresholds, full = gc.get_threshold(), gc.get_stats()[2]["collections"]
zygote.prepare(Path(sys.argv[1]))
print(gc.get_stats()[2]["collections"] - full, gc.get_threshold() == thresholds, gc.get_freeze_count() > 0)
print([m for m in ("grpc", "uvloop") if m in sys.modules])
"""


def test_the_zygote_imports_and_primes_with_one_full_collection_and_no_frontend_package(tmp_path: Path) -> None:
    """The zygote's imports run no full collection (they made six, walking the growing heap), priming's one freezes
    what survives, and the collector's thresholds are as they were for every child. What the zygote imports every
    host and worker shares, and every server holds once: grpc, the frontend's (2 MiB there), is not among it,
    though the errors hosts raise carry their gRPC status."""
    command = [sys.executable, "-c", PREPARE, str(tmp_path / "cache")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.splitlines() == ["1 True True", "[]"]
