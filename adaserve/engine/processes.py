"""The server's handles on a model's processes: its host (which forks workers) and each worker.

Plumbing only; what to send and when is the engine's business.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from typing import TYPE_CHECKING

from adaserve.engine.messages import (
    Exited,
    Forked,
    ForkHost,
    ForkProfiler,
    HostFailed,
    HostLaunch,
    HostReady,
    Rest,
    RunBatch,
    SpawnWorker,
    Stop,
    WorkerSpawned,
    decode_from_host,
    decode_from_zygote,
    encode,
    readable,
    write_message,
)
from adaserve.errors import ConfigError

if TYPE_CHECKING:  # not imported: `adaserve serve` starts the zygote before importing pydantic and numpy
    from adaserve.config import WorkerSpec
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

    Made by `HostLauncher.launch`, which hands the model to a host the zygote has forked.
    """

    def __init__(self, model: ModelSpec, process: ForkedProcess, control: socket.socket) -> None:
        self.model = model
        self.process = process
        self._control = control
        self._control.setblocking(False)
        # One exchange at a time; `stop` takes it too, since a socket closed under a pending receive never wakes it.
        self._lock = asyncio.Lock()
        self._stopping = False
        self._watch = asyncio.ensure_future(self._log_exit())

    async def _log_exit(self) -> None:
        """Log a host that exited on its own, whenever that is."""
        code = await self.process.wait()
        if not self._stopping:
            log.warning(
                "model host exited; its workers serve on, and the next worker to start starts another host",
                extra={"model": self.model.name, "pid": self.process.pid, "how": _in_words(code)},
            )

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
            # The socket closes as the process exits, a moment before the zygote has reaped it and said how.
            code = await self.process.wait(timeout_s=1.0)
            raise ConfigError(f"model '{self.model.name}': its host process {_in_words(code)}")
        return decode_from_host(data)

    async def stop(self) -> None:
        """Close the control socket, after the exchange under way; the host exits at once (workers are stopped
        separately)."""
        self._stopping = True
        async with self._lock:
            self._control.close()
        if await self.process.wait(timeout_s=10.0) is None:
            self.process.kill()
            await self.process.wait()
        self._watch.cancel()


class HostLauncher:
    """Hands models to hosts forked by the zygote, keeping `spares` of them forked ahead, waiting on their control
    sockets for a model. A load takes a spare, if one is alive, and a new spare is forked behind it.

    The first spares are forked behind the first load. With `spares=0` every load forks its host then; the host
    code is the same either way. Since the zygote has imported torch and primed program loading for every host, a
    spare saves a load only the fork (milliseconds).
    """

    def __init__(self, spares: int = 0, zygote: Zygote | None = None) -> None:
        if spares < 0:
            raise ConfigError(f"spare hosts must be 0 or more, got {spares}")
        self.spares = spares
        self.launches = {"spare": 0, "cold": 0}  # loads given to a spare / to a host forked for them
        self._zygote = zygote or ZYGOTE
        self._zygote.start()  # its imports overlap whatever the server does before its first load
        self._waiting: deque[tuple[ForkedProcess, socket.socket]] = deque()
        self._lock = threading.Lock()  # launches run in threads (`launch`): one takes from the spares at a time

    async def launch(self, model: ModelSpec, *, pool_fd: int, slots: int, stage_fd: int | None = None) -> ModelHost:
        """Give `model` (its shared pool and slot count, and a CUDA model's stage pipe) to a spare, or to a host
        forked now. Off the event loop: the first fork waits for the zygote's imports."""
        launch = encode(
            HostLaunch(config_json=model.config.model_dump_json(), artifact=str(model.artifact), slots=slots)
        )
        fds = [pool_fd] if stage_fd is None else [pool_fd, stage_fd]
        handing = asyncio.ensure_future(asyncio.to_thread(self._hand_over, model, launch, fds))
        try:
            process, control = await asyncio.shield(handing)
        except asyncio.CancelledError:
            # The load was cut off (the server stopping, say) while a host was being forked: once the fork is done
            # (milliseconds, once the zygote is up), hang up on that host and wait for it to go.
            with contextlib.suppress(Exception):
                process, control = await handing
                control.close()
                await process.wait(timeout_s=10.0)
            raise
        return ModelHost(model, process, control)

    def _hand_over(self, model: ModelSpec, launch: bytes, fds: list[int]) -> tuple[ForkedProcess, socket.socket]:
        with self._lock:
            while True:
                kind = "spare" if self._waiting else "cold"
                process, control = self._waiting.popleft() if self._waiting else self._fork()
                try:
                    socket.send_fds(control, [launch], fds)
                    break
                except OSError as exc:
                    control.close()
                    if kind == "cold":  # the fault is on this side (a closed pool, say): another host would fail too
                        process.kill()
                        raise ConfigError(f"model '{model.name}': cannot hand the model to a host: {exc}") from None
                    # a spare that died while it waited (killed from outside): discard it, take the next
            self.launches[kind] += 1
            while len(self._waiting) < self.spares:
                self._waiting.append(self._fork())
            return process, control

    def _fork(self) -> tuple[ForkedProcess, socket.socket]:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            try:
                return self._zygote.fork_host(theirs), ours
            except BaseException:
                ours.close()
                raise

    @property
    def waiting_pids(self) -> list[int]:
        return [process.pid for process, _ in self._waiting]

    async def close(self) -> None:
        """End the spares: each exits when its control socket closes."""
        waiting, self._waiting = list(self._waiting), deque()
        for _, control in waiting:
            control.close()
        codes = await asyncio.gather(*(process.wait(timeout_s=10.0) for process, _ in waiting))
        for (process, _), code in zip(waiting, codes, strict=True):
            if code is None:
                process.kill()


class ForkedProcess:
    """A process forked by the zygote: a model host, or a background profile's child. Not this process's child: it
    is watched through a pidfd, signalled through it (never a reused PID), and its return code is what the zygote
    reports when it reaps it."""

    def __init__(self, pid: int, zygote: Zygote) -> None:
        self.pid = pid
        self._zygote = zygote
        self._exit_fd: int | None = None
        self._exit: asyncio.Future[None] | None = None  # done once the host has exited
        with contextlib.suppress(ProcessLookupError):  # already exited and reaped
            self._exit_fd = os.pidfd_open(pid)

    def kill(self) -> None:
        if self._exit_fd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._exit_fd, signal.SIGKILL)

    async def wait(self, timeout_s: float | None = None) -> int | None:
        """Until the process has exited: its return code (None when it has not exited within `timeout_s`, or
        the zygote has not said how within a second)."""
        if self._exit_fd is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._exited()), timeout_s)
            except TimeoutError:
                return None
        for _ in range(_REPORT_POLLS):  # the zygote reaps it and reports at once, after the pidfd has woken us
            code = self._zygote.returncode(self.pid)
            if code is not None:
                return code
            await asyncio.sleep(_REPORT_POLL_S)
        return None

    def wait_blocking(self) -> int | None:
        """`wait` for a thread with no event loop (a background profile's), without a time limit."""
        if self._exit_fd is not None:
            poller = select.poll()  # not select.select: a server's descriptors may number past FD_SETSIZE
            poller.register(self._exit_fd, select.POLLIN)
            poller.poll()
        for _ in range(_REPORT_POLLS):
            code = self._zygote.returncode(self.pid)
            if code is not None:
                return code
            time.sleep(_REPORT_POLL_S)
        return None

    def _exited(self) -> asyncio.Future[None]:
        """One future for every waiter: the pidfd is watched by one reader."""
        fd = self._exit_fd
        assert fd is not None
        if self._exit is None:
            loop = asyncio.get_running_loop()
            exit = self._exit = loop.create_future()

            def woke() -> None:
                loop.remove_reader(fd)
                if not exit.done():
                    exit.set_result(None)

            loop.add_reader(fd, woke)
        return self._exit

    def __del__(self) -> None:
        if self._exit_fd is not None:
            os.close(self._exit_fd)


_REPORT_POLLS, _REPORT_POLL_S = 100, 0.01  # how long the zygote is given to report an exit it has seen


class Zygote:
    """The server's end of the zygote (`adaserve/engine/zygote.py`), the process that forks every model host and
    background profile's child: one per server process (`ZYGOTE`), started when the first launcher is made, started
    again when it has died.

    `fork` blocks (a fork takes milliseconds, but the first waits for the zygote's imports): launchers call it off
    the event loop, one at a time."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self._control: socket.socket | None = None
        self._returncodes: dict[int, int] = {}  # processes the zygote has reported exited
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the zygote process unless it is running."""
        with self._lock:
            self._started()

    def stop(self) -> None:
        """End the zygote as the server leaves (`adaserve serve` calls it at exit). Left alone, it exits once it finds
        its socket closed, but only after its imports: a server that stopped at once on a bad setting (a port in
        use) left it importing torch for seconds, on CPU nobody needed, holding the server's stdout and stderr open
        so that whoever read them waited too. Killed: it ignores SIGTERM, and keeps nothing a kill loses (the hosts
        it forked are the server's to stop, and are in sessions of their own)."""
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    def fork_host(self, host_control: socket.socket) -> ForkedProcess:
        """A new host, talking on `host_control`'s other end. A zygote that died is started again once."""
        return self._fork(ForkHost(), host_control.fileno(), "a model host")

    def fork_profiler(self, job_json: str, result_fd: int) -> ForkedProcess:
        """A background profile's child, measuring `job_json` (`adaserve.cpu.profiler`) onto the pipe `result_fd`
        writes to."""
        return self._fork(ForkProfiler(job_json), result_fd, "a background profile")

    def _fork(self, request: ForkHost | ForkProfiler, fd: int, what: str) -> ForkedProcess:
        with self._lock:
            for attempt in (1, 2):
                control = self._started()
                try:
                    socket.send_fds(control, [encode(request)], [fd])
                    while True:
                        message = self._receive(control)
                        if isinstance(message, Forked):
                            return ForkedProcess(message.pid, self)
                except OSError as exc:
                    how = self._discard()
                    if attempt == 2:
                        raise ConfigError(f"cannot start {what}: the zygote process {how} ({exc})") from None
                    log.warning("the zygote process ended; starting it again", extra={"how": how})
        raise AssertionError("unreachable")

    def returncode(self, pid: int) -> int | None:
        """How process `pid` ended, if the zygote has said so; reads what it has said without waiting (nor while a
        fork is under way, whose reading keeps what it finds)."""
        if self._lock.acquire(blocking=False):
            try:
                while self._control is not None and readable(self._control, 0):
                    self._receive(self._control)
            except OSError:
                pass  # a zygote gone: the next fork starts another
            finally:
                self._lock.release()
        return self._returncodes.get(pid)

    def _receive(self, control: socket.socket) -> Forked | Exited:
        data = control.recv(1024)
        if not data:
            raise ConnectionResetError("the zygote closed its socket")
        message = decode_from_zygote(data)
        if isinstance(message, Exited):
            self._returncodes[message.pid] = message.returncode
        return message

    def _started(self) -> socket.socket:
        if self._process is not None and self._process.poll() is not None:
            self._discard()
        if self._control is None:
            self._process, self._control = _start_zygote()
        return self._control

    def _discard(self) -> str:
        """Forget a zygote that is gone (or broken): how it ended."""
        assert self._process is not None and self._control is not None
        self._control.close()
        self._control = None
        try:
            code = self._process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            self._process.kill()
            code = self._process.wait()
        self._process = None
        return how_it_exited(code)


def _start_zygote() -> tuple[subprocess.Popen[bytes], socket.socket]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.settimeout(300.0)  # a zygote that does not answer a fork (it cannot import torch, say) is started again
    # Passive OpenMP waiting unless the operator chose otherwise: workers share cores with each other and with
    # the server, and spinning idle OpenMP threads took them (a 2-thread worker beside others ran ~9× slower).
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
        "TORCH_FORCE_WEIGHTS_ONLY_LOAD": "1",
        # A CUDA model's host initialises CUDA after its fork; torch asks whether CUDA is there through NVML, which
        # leaves the zygote's CUDA uninitialised (a CUDA runtime does not survive a fork).
        "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
    }
    # A session of its own: a terminal's Ctrl-C (SIGINT to its foreground process group) and the like reach the
    # server alone, which stops its hosts and workers in order; the zygote and hosts also ignore SIGINT and SIGTERM.
    process = subprocess.Popen(
        [sys.executable, "-m", "adaserve.engine.zygote", str(theirs.fileno())],
        pass_fds=(theirs.fileno(),),
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    theirs.close()
    return process, ours


#: This process's zygote: every launcher forks its hosts from it, so torch is imported once per server.
ZYGOTE = Zygote()


def _in_words(returncode: int | None) -> str:
    """How a host ended, as far as is known: it closed its socket, and its code is unknown when the zygote that
    reaped it was gone."""
    return "closed its control socket" if returncode is None else how_it_exited(returncode)


def how_it_exited(returncode: int) -> str:
    """A child's return code in words: 'exited with code 1', 'was killed by SIGKILL'."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        return f"was killed by {signal.Signals(-returncode).name}"
    except ValueError:  # a signal Python has no name for (a real-time one)
        return f"was killed by signal {-returncode}"
