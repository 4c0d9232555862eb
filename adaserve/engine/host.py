"""A model host: the process that loads one model once and forks its workers on request.

Forked by the zygote (`adaserve.engine.zygote`), which has imported torch and the engine and paid the first program
load's one-off cost (`prime_program_loading`) once for every host, possibly long before it has a model (a spare,
`processes.HostLauncher`): it waits for a HostLaunch on its control socket, with the model's shared pool beside it.
Loading a program takes a fraction of a second; forking a worker from a host that has done it takes milliseconds,
and the workers share the weights copy-on-write instead of each holding a copy. The host never computes, so no
intra-op thread pool exists at fork time. When the server's end of the control socket closes, the host exits (a
spare too); its workers exit when their command pipes close.

A `device: cuda` model's host forks nothing: its workers are threads with CUDA streams (`adaserve.engine.streams`),
started on the same spawn requests and talking to the engine over the same pipes.
"""

from __future__ import annotations

import gc
import io
import os
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adaserve.config import ModelConfig
from adaserve.engine.messages import (
    HostFailed,
    HostReady,
    SpawnWorker,
    WorkerSpawned,
    decode_launch,
    decode_spawn,
    encode,
)
from adaserve.engine.pool import PoolLayout, SharedRings
from adaserve.engine.worker import BatchRunner, Lane, RowStrategy, serve_worker
from adaserve.errors import ConfigError
from adaserve.repository import executable, read_artifact, weight_bytes

if TYPE_CHECKING:
    from adaserve.adaptive.gati.runtime import EarlyExit
    from adaserve.engine.streams import StagedInputs


def host(control: socket.socket) -> int:
    """Wait for a model, load it, report, then start a worker per spawn request (a fork; on CUDA a thread) until the
    server hangs up."""
    data, fds, _, _ = socket.recv_fds(control, 1 << 20, 2)
    if not data:
        return 0  # a spare the server no longer needs
    received = time.perf_counter()
    launch = decode_launch(data)
    config = ModelConfig.model_validate_json(launch.config_json)
    artifact = Path(launch.artifact)
    staged: StagedInputs | None = None
    try:
        stored = read_artifact(artifact, config.max_batch_size)
        rings = SharedRings(PoolLayout.for_config(config, launch.slots), fds[0])
        if config.device == "cuda":  # each worker gets a runner of its own at spawn (its stream, its graphs)
            stored, staged = _on_cuda(stored, rings, stage_fd=fds[1])
        early_exit, early_exit_error = _early_exit(config, artifact, stored, staged)
        if early_exit is not None:
            model: Any = early_exit.chain.run
            cache_bytes = early_exit.cache_bytes
            model_bytes = sum(early_exit.chain.weight_bytes) + cache_bytes
        else:
            model = executable(stored)
            cache_bytes, model_bytes = 0, weight_bytes(model)
        if staged is None:
            runner = BatchRunner(config, model, rings, _row_strategy(config, artifact, model), early_exit)
    except Exception as exc:
        control.send(encode(HostFailed(str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}")))
        return 1
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers are reaped by the kernel; the server watches pipes
    description = early_exit.description if early_exit is not None else None
    blocks = list(early_exit.chain.names) if early_exit is not None else []
    loaded_s = time.perf_counter() - received
    ready = HostReady(os.getpid(), model_bytes, description, early_exit_error, cache_bytes, loaded_s, blocks)
    control.send(encode(ready))
    while True:
        data, fds, _, _ = socket.recv_fds(control, 1 << 16, 2)
        if not data:
            return 0
        spawn = decode_spawn(data)
        if staged is not None:
            from adaserve.engine.streams import stream_worker

            _start_thread(spawn, *stream_worker(config, model, rings, staged, spawn.batch, early_exit), fds)
            control.send(encode(WorkerSpawned(spawn.worker_id, os.getpid())))
            continue
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


def prime_program_loading(cache_dir: Path | None = None) -> None:
    """Pay the first `torch.export.load`'s one-off cost once, in the zygote, rather than in each host's load.

    Whatever the program, the first load in a process imports and initialises the serializer, dynamo and sympy: on
    the 2-core VM 1.2 s of the example MLP's 1.25 s first load, and 20-40 ms for a later one. Loading a one-layer
    program pays it. The program is exported once per torch version and kept in `cache_dir` (`priming_cache_dir`):
    exporting it traces it, 0.4-0.5 s of CPU that every start paid on top of the 1.4-1.5 s the load costs. The
    garbage that leaves is collected and what survives is frozen out of the collector: else the next full
    collection, in the real load, walked it for another 0.2 s, and forked workers' collections would touch the
    shared pages."""
    import torch

    stored = (cache_dir or priming_cache_dir()) / f"prime-torch-{torch.__version__}.pt2"
    try:
        torch.export.load(stored)
    except Exception:  # not stored yet, unreadable, or from another build: export it (again) and keep it
        batch = torch.export.Dim("batch")
        program = torch.export.export(torch.nn.Linear(1, 1), (torch.zeros(2, 1),), dynamic_shapes=({0: batch},))
        buffer = io.BytesIO()
        torch.export.save(program, buffer)
        _store(stored, buffer.getvalue())
        buffer.seek(0)
        torch.export.load(buffer)
        del program, buffer
    gc.collect()
    gc.freeze()


def priming_cache_dir() -> Path:
    """Where the priming program is kept: adaserve's folder of the user's cache (`$XDG_CACHE_HOME`, ~/.cache)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "adaserve"


def _store(path: Path, data: bytes) -> None:
    """Write `path` whole or not at all (zygotes of several servers may write it at once); a folder that cannot be
    written only means the next start exports the program again."""
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.write_bytes(data)
        partial.replace(path)
    except OSError:
        partial.unlink(missing_ok=True)


def _on_cuda(stored: Any, rings: SharedRings, *, stage_fd: int) -> tuple[Any, StagedInputs]:
    """The model as stored, moved to the GPU; its device ring; and the stager thread that fills the ring as requests
    arrive."""
    from adaserve.engine.streams import StagedInputs, cuda_device, on_device

    device = cuda_device()
    staged = StagedInputs(rings, device)
    threading.Thread(target=staged.follow, args=(stage_fd,), name="stager", daemon=True).start()
    return on_device(stored, device), staged


def _start_thread(spawn: SpawnWorker, runner: BatchRunner, lane: Lane, fds: list[int]) -> None:
    """A worker as a thread of this process. When it ends, for any reason, its pipes close, which is how the engine
    learns that a worker is gone, as when a worker process exits."""

    def serve() -> None:
        try:
            serve_worker(spawn, runner, fds[0], fds[1], lane)
        except Exception:
            traceback.print_exc(file=sys.stderr)  # as a dying worker process would
        finally:
            for fd in fds:
                os.close(fd)

    threading.Thread(target=serve, name=f"worker-{spawn.worker_id}", daemon=True).start()


def _row_strategy(config: ModelConfig, artifact: Path, model: Any) -> RowStrategy | None:
    """The model's SLO-NNs node activator, loaded and compiled once here for every worker (numba is imported only
    by hosts of models that have one)."""
    if config.activator is None:
        return None
    from adaserve.adaptive.activator.runtime import ActivatorRuntime

    return ActivatorRuntime.load(config, artifact, model)


def _early_exit(
    config: ModelConfig, artifact: Path, stored: Any, staged: StagedInputs | None
) -> tuple[EarlyExit | None, str | None]:
    """The model's GATI caches, loaded once here for every worker (on the GPU beside the model when `staged`); when
    they cannot serve, why not (the model then serves whole, through the same artifact)."""
    if config.caches is None:
        return None, None
    from adaserve.adaptive.gati.runtime import EarlyExit

    try:
        return EarlyExit.load(config, artifact, stored, staged.device if staged is not None else None), None
    except ConfigError as exc:
        return None, str(exc)


def serve(control: socket.socket) -> int:
    """The host's life in a process the zygote has just forked: its exit code."""
    try:
        return host(control)
    except (BrokenPipeError, ConnectionResetError):
        return 0  # the server hung up mid-exchange (it stopped, or gave up on this host): no one to tell
