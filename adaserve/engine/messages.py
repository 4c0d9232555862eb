"""Typed messages between the server and its worker processes, framed on pipes.

Each message is a tagged `msgspec.Struct` encoded with msgpack behind a 4-byte length. Tensors never travel in
messages: they stay in the shared input pool, and a message only names the slots.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import time
from typing import Any

import msgspec

from adaserve.errors import InvalidInputError

_LENGTH = struct.Struct("<I")


class ForkHost(msgspec.Struct, frozen=True, tag="fork_host"):
    """To the zygote (`adaserve.engine.zygote`): fork a model host; the host's control socket travels beside this
    message (SCM_RIGHTS)."""


class ForkProfiler(msgspec.Struct, frozen=True, tag="fork_profiler"):
    """To the zygote: fork a background profile's child (`adaserve.cpu.profiler.measure_beside_serving`); the
    write end of the pipe its cells go on travels beside this message (SCM_RIGHTS)."""

    job_json: str  # what `profile_model` asks the child to measure


class Forked(msgspec.Struct, frozen=True, tag="forked"):
    """From the zygote, in the order of the fork requests: the new process's PID."""

    pid: int


class Exited(msgspec.Struct, frozen=True, tag="exited"):
    """From the zygote, whenever it reaps a process it forked: how it ended (a return code as `subprocess` gives
    it)."""

    pid: int
    returncode: int


class HostLaunch(msgspec.Struct, frozen=True, tag="launch"):
    """Everything a model host (the process that loads the model and forks its workers) needs; the first message on
    its control socket, with the shared pool's fd beside it (SCM_RIGHTS). Spawn requests follow on the same
    socket."""

    config_json: str  # the validated ModelConfig, so no process re-reads a file that may have changed
    artifact: str  # path of model.pt2 / model.pt
    slots: int  # pool size; with the config it fixes the shared memory layout


class SpawnWorker(msgspec.Struct, frozen=True, tag="spawn"):
    """Fork one worker; its command and result pipes travel beside this message as SCM_RIGHTS fds."""

    worker_id: int
    batch: int
    threads: int
    cpus: list[int] | None


class HostReady(msgspec.Struct, frozen=True, tag="host_ready"):
    pid: int
    model_bytes: int  # parameters, buffers and constants of the loaded model (and its learned caches)
    early_exit: str | None = None  # GATI: the learned caches serving (None: the model runs whole)
    early_exit_error: str | None = None  # why a model configured with caches serves without them
    cache_bytes: int = 0  # the learned caches' parameters, included in model_bytes
    load_s: float = 0.0  # from the launch's arrival to this message: the model's own load, without the host's start
    exit_blocks: list[str] = []  # GATI: the block chain in order (to combine the exits of a request split in batches)


class HostFailed(msgspec.Struct, frozen=True, tag="host_failed"):
    """The model could not be loaded; the host exits after sending this."""

    error: str


class WorkerSpawned(msgspec.Struct, frozen=True, tag="spawned"):
    worker_id: int
    pid: int


class RowParameters(msgspec.Struct, frozen=True):
    """Per-request parameters for rows [offset, offset + rows) of a batch (request or response side)."""

    offset: int
    rows: int
    values: dict[str, Any]


class RunBatch(msgspec.Struct, frozen=True, tag="run"):
    batch_id: int
    start: int
    rows: int
    requests: list[int]  # rows of each request in the batch, in order: a failure is isolated per request
    parameters: list[RowParameters] = []
    spin_us: int = 0  # after the batch, wait for the next command by polling for up to this long (0: sleep at once)


class Stop(msgspec.Struct, frozen=True, tag="stop"):
    pass


class Rest(msgspec.Struct, frozen=True, tag="rest"):
    """Stop polling for the next command and sleep until it comes: another worker took the core."""


class WorkerReady(msgspec.Struct, frozen=True, tag="ready"):
    worker_id: int
    pid: int
    threads: int
    cpus: list[int]
    workspace_bytes: int  # resident memory the worker's warm-up run added: activations, allocator caches


class WorkerFailed(msgspec.Struct, frozen=True, tag="failed"):
    """The worker could not start (e.g. the model does not load); it exits after sending this."""

    worker_id: int
    error: str


class ExitCounts(msgspec.Struct, frozen=True):
    """What GATI's learned caches of one target's plan did in one batch (its rows asked for that target)."""

    target: float  # the configured accuracy target whose composition served these rows
    lookups: dict[str, int]  # exit block → rows looked up there
    hits: dict[str, int]  # exit block → rows answered there
    whole: int  # rows with early exit on that ran to the end
    verified: int  # hits also run to the end to check them
    agreed: int  # of those, the ones whose answer was the base model's (argmax)


class BatchDone(msgspec.Struct, frozen=True, tag="done"):
    batch_id: int
    compute_ns: int
    started_ns: int  # when the worker took the batch (CLOCK_MONOTONIC, which every process shares): for traces
    errors: list[str | None] | None = None  # None: all rows computed; else one entry per request of the batch
    parameters: list[RowParameters] = []
    early_exit: list[ExitCounts] = []  # one entry per target whose plan ran rows of the batch


class RowsDone(msgspec.Struct, frozen=True, tag="rows_done"):
    """Requests of a running batch answered before it ends (a learned cache hit): their outputs are in the pool.
    Each entry is a request's rows in the batch (offset in the batch, its rows, its response parameters): the whole
    request, or its part when its other rows are in other batches. Its slots stay held until the batch's
    `BatchDone`."""

    batch_id: int
    answered: list[RowParameters]
    started_ns: int  # when the worker took the batch, and when it answered these (CLOCK_MONOTONIC)
    answered_ns: int


ToWorker = RunBatch | Stop | Rest
FromWorker = WorkerReady | WorkerFailed | BatchDone | RowsDone

FromHost = HostReady | HostFailed | WorkerSpawned
ToZygote = ForkHost | ForkProfiler
FromZygote = Forked | Exited

_encoder = msgspec.msgpack.Encoder()
_to_worker = msgspec.msgpack.Decoder(ToWorker)
_from_worker = msgspec.msgpack.Decoder(FromWorker)
_from_host = msgspec.msgpack.Decoder(FromHost)
_spawn = msgspec.msgpack.Decoder(SpawnWorker)
_launch = msgspec.msgpack.Decoder(HostLaunch)
_from_zygote = msgspec.msgpack.Decoder(FromZygote)
_to_zygote = msgspec.msgpack.Decoder(ToZygote)


def encode(message: msgspec.Struct) -> bytes:
    """One message as a datagram (the host's control socket keeps message boundaries)."""
    return _encoder.encode(message)


def decode_from_host(data: bytes) -> FromHost:
    return _from_host.decode(data)


def decode_spawn(data: bytes) -> SpawnWorker:
    return _spawn.decode(data)


def decode_launch(data: bytes) -> HostLaunch:
    return _launch.decode(data)


def decode_from_zygote(data: bytes) -> FromZygote:
    return _from_zygote.decode(data)


def decode_to_zygote(data: bytes) -> ToZygote:
    return _to_zygote.decode(data)


def frame(message: msgspec.Struct) -> bytes:
    body = _encoder.encode(message)
    return _LENGTH.pack(len(body)) + body


def check_parameters(values: dict[str, Any]) -> None:
    """A request's parameters travel to its worker inside a `RunBatch`; InvalidInputError when they cannot (an
    integer beyond 64 bits, say), so the request is refused before it is queued instead of failing a whole batch."""
    try:
        _encoder.encode(values)
    except (msgspec.EncodeError, OverflowError, TypeError):
        for key, value in values.items():  # name the culprit
            try:
                _encoder.encode(value)
            except (msgspec.EncodeError, OverflowError, TypeError) as exc:
                raise InvalidInputError(f"parameter '{key}' cannot be passed to the model: {exc}") from None
        raise


def write_message(fd: int, message: msgspec.Struct) -> None:
    """Write one whole frame (pipes take writes up to PIPE_BUF atomically; loop for longer ones)."""
    data = memoryview(frame(message))
    while data:
        data = data[os.write(fd, data) :]


def readable(fd: int | socket.socket, timeout_s: float) -> bool:
    """Whether `fd` becomes readable within `timeout_s` (0: now), sleeping meanwhile. `poll`, not `select`: a server
    with many connections hands its children descriptors past `select`'s 1,024, where it raises (a model host did,
    on a cluster node with 8 clients forwarding, and its load failed)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(timeout_s * 1000))


def poll_readable(fd: int, timeout_ns: int) -> bool:
    """Poll `fd` without sleeping until it is readable or `timeout_ns` has passed; whether it is readable.

    A worker does this between batches at low load: a process that sleeps in read() is woken through the
    scheduler (and, on a VM, a halted vCPU), which cost a batch-1 request more than its own compute here. Without
    the yield, a poller sharing a CPU with the frontend held it for a time slice: on two cores elastic's mean at
    1,440 req/s rose from 1.59 to 1.89 ms; with it, 1.39 → 1.32."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    deadline = time.perf_counter_ns() + timeout_ns
    while not poller.poll(0):
        if time.perf_counter_ns() >= deadline:
            return False
        os.sched_yield()  # any other task runnable on this CPU goes first: the poll takes only idle time
    return True


def read_to_worker(fd: int) -> ToWorker | None:
    """Blocking read of the next command; None when the server closed the pipe."""
    header = _read_exact(fd, _LENGTH.size)
    if header is None:
        return None
    body = _read_exact(fd, _LENGTH.unpack(header)[0])
    return None if body is None else _to_worker.decode(body)


#: A CUDA model's stage pipe carries, per request, the rows just written into the pool: (first slot, rows). Fixed
#: size and far below PIPE_BUF, so each write is atomic and the host reads them without framing.
_STAGED = struct.Struct("<II")


def write_staged(fd: int, start: int, rows: int) -> None:
    os.write(fd, _STAGED.pack(start, rows))


def read_staged(fd: int) -> tuple[int, int] | None:
    """Blocking read of the next staged run; None when the server closed the pipe."""
    data = _read_exact(fd, _STAGED.size)
    return None if data is None else _STAGED.unpack(data)


def _read_exact(fd: int, size: int) -> bytes | None:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = os.read(fd, size - len(chunks))
        if not chunk:
            return None
        chunks += chunk
    return bytes(chunks)


class FrameReader:
    """Incremental decoder for the server side, fed by a non-blocking reader callback."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[FromWorker]:
        self._buffer += data
        messages: list[FromWorker] = []
        while len(self._buffer) >= _LENGTH.size:
            (size,) = _LENGTH.unpack_from(self._buffer)
            end = _LENGTH.size + size
            if len(self._buffer) < end:
                break
            messages.append(_from_worker.decode(bytes(self._buffer[_LENGTH.size : end])))
            del self._buffer[:end]
        return messages
