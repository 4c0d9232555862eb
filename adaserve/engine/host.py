"""A model host: the process that loads one model once and forks its workers on request (a zygote).

Started by the server as `python -m adaserve.engine.host '<HostLaunch as JSON>'`. Importing torch and loading a
program take seconds; forking a worker from a host that has done both takes milliseconds, and the workers share
the weights copy-on-write instead of each holding a copy. The host never computes, so no intra-op thread pool
exists at fork time. When the server's end of the control socket closes, the host exits; its workers exit when
their command pipes close.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import msgspec

from adaserve.config import ModelConfig
from adaserve.engine.messages import HostFailed, HostLaunch, HostReady, WorkerSpawned, decode_spawn, encode
from adaserve.engine.pool import PoolLayout, SharedRings
from adaserve.engine.worker import BatchRunner, RowStrategy, serve_worker
from adaserve.errors import ConfigError
from adaserve.repository import load_artifact, weight_bytes


def host(launch: HostLaunch) -> int:
    control = socket.socket(fileno=launch.control_fd)
    config = ModelConfig.model_validate_json(launch.config_json)
    try:
        model = load_artifact(Path(launch.artifact), config.max_batch_size)
        rings = SharedRings(PoolLayout.for_config(config, launch.slots), launch.pool_fd)
        runner = BatchRunner(config, model, rings, _row_strategy(config, Path(launch.artifact), model))
        model_bytes = weight_bytes(model)
    except Exception as exc:
        control.send(encode(HostFailed(str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}")))
        return 1
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers are reaped by the kernel; the server watches pipes
    control.send(encode(HostReady(os.getpid(), model_bytes)))
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


def main() -> None:
    sys.exit(host(msgspec.json.decode(sys.argv[1], type=HostLaunch)))


if __name__ == "__main__":
    main()
