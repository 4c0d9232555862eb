"""A model host: the process that loads one model once and forks its workers on request (a zygote).

Started by the server as `python -m adaserve.engine.host CONTROL_FD`, possibly long before it has a model (a spare,
`processes.HostLauncher`): it imports torch and the engine, then waits for a HostLaunch on its control socket, with
the model's shared pool beside it. Importing torch and loading a program take seconds; forking a worker from a host
that has done both takes milliseconds, and the workers share the weights copy-on-write instead of each holding a
copy. The host never computes, so no intra-op thread pool exists at fork time. When the server's end of the control
socket closes, the host exits (a spare too); its workers exit when their command pipes close.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adaserve.config import ModelConfig
from adaserve.engine.messages import HostFailed, HostReady, WorkerSpawned, decode_launch, decode_spawn, encode
from adaserve.engine.pool import PoolLayout, SharedRings
from adaserve.engine.worker import BatchRunner, RowStrategy, serve_worker
from adaserve.errors import ConfigError
from adaserve.repository import executable, read_artifact, weight_bytes

if TYPE_CHECKING:
    from adaserve.adaptive.gati.runtime import EarlyExit


def host(control: socket.socket) -> int:
    """Wait for a model, load it, report, then fork a worker per spawn request until the server hangs up."""
    data, fds, _, _ = socket.recv_fds(control, 1 << 20, 1)
    if not data:
        return 0  # a spare the server no longer needs
    launch = decode_launch(data)
    config = ModelConfig.model_validate_json(launch.config_json)
    artifact = Path(launch.artifact)
    try:
        stored = read_artifact(artifact, config.max_batch_size)
        early_exit, early_exit_error = _early_exit(config, artifact, stored)
        rings = SharedRings(PoolLayout.for_config(config, launch.slots), fds[0])
        if early_exit is not None:
            runner = BatchRunner(config, early_exit.chain.run, rings, early_exit=early_exit)
            cache_bytes = early_exit.cache_bytes
            model_bytes = sum(early_exit.chain.weight_bytes) + cache_bytes
        else:
            model = executable(stored)
            runner = BatchRunner(config, model, rings, _row_strategy(config, artifact, model))
            cache_bytes, model_bytes = 0, weight_bytes(model)
    except Exception as exc:
        control.send(encode(HostFailed(str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}")))
        return 1
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers are reaped by the kernel; the server watches pipes
    description = early_exit.description if early_exit is not None else None
    control.send(encode(HostReady(os.getpid(), model_bytes, description, early_exit_error, cache_bytes)))
    while True:
        data, fds, _, _ = socket.recv_fds(control, 1 << 16, 2)
        if not data:
            return 0
        spawn = decode_spawn(data)
        pid = os.fork()
        if pid == 0:
            control.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            code = 1
            try:
                code = serve_worker(spawn, runner, fds[0], fds[1])
            finally:
                os._exit(code)
        for fd in fds:
            os.close(fd)
        control.send(encode(WorkerSpawned(spawn.worker_id, pid)))


def _row_strategy(config: ModelConfig, artifact: Path, model: Any) -> RowStrategy | None:
    """The model's SLO-NNs node activator, loaded and compiled once here for every worker (numba is imported only
    by hosts of models that have one)."""
    if config.activator is None:
        return None
    from adaserve.adaptive.activator.runtime import ActivatorRuntime

    return ActivatorRuntime.load(config, artifact, model)


def _early_exit(config: ModelConfig, artifact: Path, stored: Any) -> tuple[EarlyExit | None, str | None]:
    """The model's GATI caches, loaded once here for every worker; when they cannot serve, why not (the model then
    serves whole, through the same artifact)."""
    if config.caches is None:
        return None, None
    from adaserve.adaptive.gati.runtime import EarlyExit

    try:
        return EarlyExit.load(config, artifact, stored), None
    except ConfigError as exc:
        return None, str(exc)


def main() -> None:
    sys.exit(host(socket.socket(fileno=int(sys.argv[1]))))


if __name__ == "__main__":
    main()
