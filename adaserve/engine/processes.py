"""The server's handles on a model's processes: its host (which forks workers) and each worker.

Plumbing only; what to send and when is the engine's business.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys

import msgspec

from adaserve.config import WorkerSpec
from adaserve.engine.messages import (
    HostFailed,
    HostLaunch,
    HostReady,
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
    """The host process of one model: it loads the model once, then forks a worker per `spawn`."""

    def __init__(self, model: ModelSpec, *, pool_fd: int, slots: int) -> None:
        self.model = model
        self._control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        launch = HostLaunch(
            config_json=model.config.model_dump_json(),
            artifact=str(model.artifact),
            slots=slots,
            pool_fd=pool_fd,
            control_fd=theirs.fileno(),
        )
        # Passive OpenMP waiting unless the operator chose otherwise: workers share cores with each other and with
        # the server, and spinning idle OpenMP threads took them (a 2-thread worker beside others ran ~9× slower).
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
            "TORCH_FORCE_WEIGHTS_ONLY_LOAD": "1",
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "adaserve.engine.host", msgspec.json.encode(launch).decode()],
            pass_fds=(pool_fd, theirs.fileno()),
            stdin=subprocess.DEVNULL,
            env=env,
        )
        theirs.close()
        self._control.setblocking(False)
        self._lock = asyncio.Lock()

    async def ready(self) -> HostReady:
        """Wait until the model is loaded; ConfigError with the host's reason when it cannot be."""
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
            reply = await self._receive()
            assert isinstance(reply, WorkerSpawned)
            return WorkerProcess(worker_id, spec, reply.pid, command_write, result_read)

    async def _receive(self) -> HostReady | HostFailed | WorkerSpawned:
        data = await asyncio.get_running_loop().sock_recv(self._control, 1 << 16)
        if not data:
            code = self.process.poll()
            raise ConfigError(f"model '{self.model.name}': its host process exited (code {code})")
        return decode_from_host(data)

    async def stop(self) -> None:
        """Close the control socket; the host exits at once (workers are stopped separately)."""
        self._control.close()
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(loop.run_in_executor(None, self.process.wait), 10.0)
        except TimeoutError:
            self.process.kill()
            await loop.run_in_executor(None, self.process.wait)
