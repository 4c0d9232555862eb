"""The server's handles on a model's processes: its host (which forks workers) and each worker.

Plumbing only; what to send and when is the engine's business.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
from collections import deque

from adaserve.config import WorkerSpec
from adaserve.engine.messages import (
    HostFailed,
    HostLaunch,
    HostReady,
    Rest,
    RunBatch,
    SpawnWorker,
    Stop,
    WorkerSpawned,
    decode_from_host,
    encode,
    write_message,
)
from adaserve.errors import ConfigError
from adaserve.repository import ModelSpec

log = logging.getLogger("adaserve.engine")


class WorkerProcess:
    """One running worker; `result_fd` is the non-blocking pipe its messages arrive on."""

    def __init__(self, worker_id: int, spec: WorkerSpec, pid: int, command_fd: int, result_fd: int) -> None:
        self.id = worker_id
        self.spec = spec
        self.pid = pid
        self._command_fd = command_fd
        self.result_fd = result_fd
        os.set_blocking(result_fd, False)

    def run(self, command: RunBatch) -> bool:
        """Send a batch; False when the worker is already gone (its pipe is closed)."""
        try:
            write_message(self._command_fd, command)
        except OSError:
            return False
        return True

    def rest(self) -> None:
        """Ask the worker to stop polling for its next batch (another worker took the core)."""
        with contextlib.suppress(OSError):
            write_message(self._command_fd, Rest())

    def stop(self) -> None:
        """Ask the worker to exit after the batch it is running."""
        with contextlib.suppress(OSError):
            write_message(self._command_fd, Stop())

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)

    def close(self) -> None:
        """Release the pipes; the caller has stopped reading `result_fd`."""
        for fd in (self._command_fd, self.result_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


class ModelHost:
    """The host process of one model: it loads the model once, then forks a worker per `spawn`.

    Made by `HostLauncher.launch`, which hands the model to a host process that has already started.
    """

    def __init__(self, model: ModelSpec, process: subprocess.Popen[bytes], control: socket.socket) -> None:
        self.model = model
        self.process = process
        self._control = control
        self._control.setblocking(False)
        # One exchange at a time; `stop` takes it too, since a socket closed under a pending receive never wakes it.
        self._lock = asyncio.Lock()
        self._stopping = False
        self._loop = asyncio.get_running_loop()
        # Readable once the process has exited, whenever that is: then it is reaped at once. A host killed from
        # outside stayed a zombie until a worker died and its restart found the host gone.
        self._exit_fd: int | None = os.pidfd_open(process.pid)
        self._loop.add_reader(self._exit_fd, self._exited)

    def _exited(self) -> None:
        self._unwatch()
        code = self.process.poll()  # reaps it
        if not self._stopping:
            log.warning(
                "model host exited; its workers serve on, and the next worker to start starts another host",
                extra={"model": self.model.name, "pid": self.process.pid, "how": how_it_exited(code or 0)},
            )

    def _unwatch(self) -> None:
        if self._exit_fd is not None:
            self._loop.remove_reader(self._exit_fd)
            os.close(self._exit_fd)
            self._exit_fd = None

    async def ready(self) -> HostReady:
        """Wait until the model is loaded; ConfigError with the host's reason when it cannot be."""
        async with self._lock:
            reply = await self._receive()
        if isinstance(reply, HostFailed):
            raise ConfigError(reply.error)
        assert isinstance(reply, HostReady)
        return reply

    async def spawn(self, worker_id: int, spec: WorkerSpec) -> WorkerProcess:
        """Fork a worker from the host; it reports readiness on its own result pipe."""
        async with self._lock:
            command_read, command_write = os.pipe()
            result_read, result_write = os.pipe()
            request = SpawnWorker(worker_id, spec.batch, spec.threads, list(spec.cpus) if spec.cpus else None)
            try:
                socket.send_fds(self._control, [encode(request)], [command_read, result_write])
            except OSError as exc:
                os.close(command_write)
                os.close(result_read)
                raise ConfigError(f"model '{self.model.name}': its host process is gone ({exc})") from None
            finally:
                os.close(command_read)  # the worker holds its own copies now
                os.close(result_write)
            try:
                reply = await self._receive()
            except BaseException:
                # The host may have forked the worker and died (or been abandoned) before naming it: closing our
                # ends gives that worker end-of-file on its command pipe, and it exits instead of waiting for ever.
                os.close(command_write)
                os.close(result_read)
                raise
            assert isinstance(reply, WorkerSpawned)
            return WorkerProcess(worker_id, spec, reply.pid, command_write, result_read)

    async def _receive(self) -> HostReady | HostFailed | WorkerSpawned:
        try:
            data = await asyncio.get_running_loop().sock_recv(self._control, 1 << 16)
        except OSError:  # reset by a host that died: the same as its end closing
            data = b""
        except asyncio.CancelledError:
            self._control.close()  # its answer, left unread, would be taken for the next exchange's: end the host
            raise
        if not data:
            how = await _how_it_ended(self.process)
            raise ConfigError(f"model '{self.model.name}': its host process {how}")
        return decode_from_host(data)

    async def stop(self) -> None:
        """Close the control socket, after the exchange under way; the host exits at once (workers are stopped
        separately)."""
        self._stopping = True
        async with self._lock:
            self._control.close()
        await _wait_or_kill(self.process)
        self._unwatch()


class HostLauncher:
    """Starts model hosts, keeping `spares` of them started ahead: a spare has started Python, imported torch and
    adaserve's engine (about 2.5 s of CPU on the 2-core machine, more than half of loading a small model), paid the
    first program load's one-off second (`host.prime_program_loading`), and waits on its control socket for a model.
    A load takes a spare, if one is alive, and a new spare starts behind it.

    With `spares=0` every load starts its host then; the host code is the same either way.
    """

    def __init__(self, spares: int = 0) -> None:
        if spares < 0:
            raise ConfigError(f"spare hosts must be 0 or more, got {spares}")
        self.spares = spares
        self.launches = {"spare": 0, "cold": 0}  # loads given to a spare / to a host started for them
        self._waiting: deque[tuple[subprocess.Popen[bytes], socket.socket]] = deque()
        self._refill()

    def launch(self, model: ModelSpec, *, pool_fd: int, slots: int, stage_fd: int | None = None) -> ModelHost:
        """Give `model` (its shared pool and slot count, and a CUDA model's stage pipe) to a spare, or to a host
        started now when none is alive."""
        launch = encode(
            HostLaunch(config_json=model.config.model_dump_json(), artifact=str(model.artifact), slots=slots)
        )
        while True:
            kind, (process, control) = ("spare", self._waiting.popleft()) if self._waiting else ("cold", _start_host())
            try:
                socket.send_fds(control, [launch], [pool_fd] if stage_fd is None else [pool_fd, stage_fd])
                break
            except OSError as exc:
                control.close()
                if kind == "cold":  # the fault is on this side (a closed pool, say): another host would fail too
                    process.kill()
                    process.wait()
                    raise ConfigError(f"model '{model.name}': cannot hand the model to a host: {exc}") from None
                process.wait()  # a spare that died while it waited (killed from outside): discard it, take the next
        self.launches[kind] += 1
        self._refill()
        return ModelHost(model, process, control)

    @property
    def waiting_pids(self) -> list[int]:
        return [process.pid for process, _ in self._waiting]

    async def close(self) -> None:
        """End the spares: each exits when its control socket closes."""
        waiting, self._waiting = list(self._waiting), deque()
        for _, control in waiting:
            control.close()
        await asyncio.gather(*(_wait_or_kill(process) for process, _ in waiting))

    def _refill(self) -> None:
        while len(self._waiting) < self.spares:
            self._waiting.append(_start_host())


def _start_host() -> tuple[subprocess.Popen[bytes], socket.socket]:
    """A host process, told its model later over the returned control socket (`adaserve/engine/host.py`)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    # Passive OpenMP waiting unless the operator chose otherwise: workers share cores with each other and with
    # the server, and spinning idle OpenMP threads took them (a 2-thread worker beside others ran ~9× slower).
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
        "TORCH_FORCE_WEIGHTS_ONLY_LOAD": "1",
    }
    # A session of its own: a terminal's Ctrl-C (SIGINT to its foreground process group) and the like reach the
    # server alone, which stops its hosts and workers in order; the host also ignores SIGINT and SIGTERM itself.
    process = subprocess.Popen(
        [sys.executable, "-m", "adaserve.engine.host", str(theirs.fileno())],
        pass_fds=(theirs.fileno(),),
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    theirs.close()
    return process, ours


async def _how_it_ended(process: subprocess.Popen[bytes], timeout_s: float = 1.0) -> str:
    """How a process whose end of a socket closed ended, for an error message: its exit code or the signal that
    killed it. The socket closes before the process is reaped, so it is waited for a moment first."""
    with contextlib.suppress(TimeoutError):
        await _wait(process, timeout_s)
    code = process.poll()
    return "closed its control socket" if code is None else how_it_exited(code)


def how_it_exited(returncode: int) -> str:
    """A child's return code in words: 'exited with code 1', 'was killed by SIGKILL'."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        return f"was killed by {signal.Signals(-returncode).name}"
    except ValueError:  # a signal Python has no name for (a real-time one)
        return f"was killed by signal {-returncode}"


async def _wait_or_kill(process: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    try:
        await _wait(process, timeout_s)
    except TimeoutError:
        process.kill()
        await _wait(process)


async def _wait(process: subprocess.Popen[bytes], timeout_s: float | None = None) -> None:
    """Until the process has exited (TimeoutError after `timeout_s`), off the event loop."""
    await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(None, process.wait), timeout_s)
