"""Framing of typed messages: length-prefixed msgpack on pipes, fed in arbitrary pieces."""

from __future__ import annotations

import contextlib
import os
import random
import resource
import threading
from collections.abc import Iterator

import msgspec
import pytest

from adaserve.engine.messages import (
    BatchDone,
    FrameReader,
    HostFailed,
    HostReady,
    Rest,
    RowParameters,
    RowsDone,
    RunBatch,
    SpawnWorker,
    Stop,
    WorkerFailed,
    WorkerReady,
    WorkerSpawned,
    decode_from_host,
    decode_spawn,
    encode,
    frame,
    poll_readable,
    read_to_worker,
    readable,
    write_message,
)

FROM_WORKER = [
    WorkerReady(worker_id=3, pid=4242, threads=2, cpus=[0, 1], workspace_bytes=1 << 20),
    BatchDone(batch_id=7, compute_ns=123_456, started_ns=5_000_000_000),
    RowsDone(batch_id=7, answered=[RowParameters(0, 1, {"exit": "layer1"})], started_ns=1, answered_ns=2),
    BatchDone(
        batch_id=8,
        compute_ns=1,
        started_ns=1,
        errors=[None, "RuntimeError: boom"],
        parameters=[RowParameters(offset=2, rows=3, values={"tokens": [1, 2, 3], "note": "é"})],
    ),
    WorkerFailed(worker_id=4, error="cannot load model"),
    BatchDone(batch_id=9, compute_ns=0, started_ns=0, parameters=[RowParameters(0, 1, {"blob": "x" * 70_000})]),
]


def chunks(data: bytes, rng: random.Random) -> Iterator[bytes]:
    """`data` cut at random places, empty pieces included."""
    position = 0
    while position < len(data):
        size = rng.choice((0, 1, 2, 3, 5, 64, 4096, 100_000))
        yield data[position : position + size]
        position += size


def test_frame_is_a_length_then_the_body() -> None:
    data = frame(Stop())
    assert int.from_bytes(data[:4], "little") == len(data) - 4
    assert msgspec.msgpack.decode(data[4:]) == {"type": "stop"}


def test_reader_decodes_whole_frames_fed_at_once() -> None:
    assert FrameReader().feed(b"".join(frame(m) for m in FROM_WORKER)) == FROM_WORKER


@pytest.mark.parametrize("seed", range(40))
def test_reader_decodes_frames_split_at_any_boundary(seed: int) -> None:
    rng = random.Random(seed)
    messages = [rng.choice(FROM_WORKER) for _ in range(rng.randint(1, 8))]
    reader = FrameReader()
    decoded = []
    for piece in chunks(b"".join(frame(m) for m in messages), rng):
        decoded.extend(reader.feed(piece))
    assert decoded == messages


def test_reader_byte_by_byte_yields_each_message_on_its_last_byte() -> None:
    reader = FrameReader()
    data = frame(FROM_WORKER[0])
    for byte in data[:-1]:
        assert reader.feed(bytes([byte])) == []
    assert reader.feed(data[-1:]) == [FROM_WORKER[0]]
    assert reader.feed(b"") == []


def test_reader_refuses_a_message_for_the_other_direction() -> None:
    with pytest.raises(msgspec.ValidationError):
        FrameReader().feed(frame(Stop()))


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read_fd, write_fd = os.pipe()
    yield read_fd, write_fd
    for fd in (read_fd, write_fd):
        with contextlib.suppress(OSError):  # the test closed it already
            os.close(fd)


def test_commands_round_trip_over_a_pipe(pipe: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    commands = [
        RunBatch(batch_id=1, start=10, rows=4, requests=[1, 3]),
        RunBatch(
            batch_id=2, start=0, rows=2, requests=[2], parameters=[RowParameters(offset=1, rows=1, values={"k": 3.5})]
        ),
        RunBatch(batch_id=3, start=4, rows=1, requests=[1], spin_us=5000),
        Rest(),
        Stop(),
    ]
    for command in commands:
        write_message(write_fd, command)
    os.close(write_fd)
    assert [read_to_worker(read_fd) for _ in commands] == commands
    assert read_to_worker(read_fd) is None  # the server closed the pipe


def test_a_frame_larger_than_the_pipe_buffer(pipe: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    command = RunBatch(3, 0, 1, [1], parameters=[RowParameters(0, 1, {"prompt": "y" * 300_000})])
    received: list[object] = []
    reader = threading.Thread(target=lambda: received.append(read_to_worker(read_fd)), daemon=True)
    reader.start()
    write_message(write_fd, command)  # blocks until the reader has taken the first 64 KiB
    reader.join(timeout=30)
    assert received == [command]


def test_a_pipe_closed_in_the_middle_of_a_frame_reads_as_closed(pipe: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    data = frame(RunBatch(1, 2, 3, [3]))
    os.write(write_fd, data[:-1])
    os.close(write_fd)
    assert read_to_worker(read_fd) is None


def test_a_pipe_closed_in_the_middle_of_a_header_reads_as_closed(pipe: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    os.write(write_fd, frame(Stop())[:2])
    os.close(write_fd)
    assert read_to_worker(read_fd) is None


@pytest.mark.parametrize(
    "message",
    [HostReady(pid=10, model_bytes=4096), HostFailed(error="no such file"), WorkerSpawned(worker_id=2, pid=11)],
)
def test_host_datagrams_round_trip(message: msgspec.Struct) -> None:
    assert decode_from_host(encode(message)) == message


def test_spawn_request_round_trips() -> None:
    for message in (SpawnWorker(1, batch=8, threads=2, cpus=[2, 3]), SpawnWorker(2, batch=1, threads=1, cpus=None)):
        assert decode_spawn(encode(message)) == message


def test_polling_sees_a_command_at_once_and_gives_up_after_its_time(pipe: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    assert poll_readable(read_fd, 2_000_000) is False  # nothing came within 2 ms
    write_message(write_fd, Rest())
    assert poll_readable(read_fd, 10**12) is True  # returns as soon as the pipe holds a command
    assert read_to_worker(read_fd) == Rest()


def test_readable_works_past_select_s_1024_descriptors() -> None:
    """A host inherits its control socket from a server with thousands of connections: its descriptor can be past
    1,024, where select() raises."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"the open-file limit ({hard}) allows no descriptor past 2,000")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    read_end, write_end = os.pipe()
    high = os.dup2(read_end, 2000)
    try:
        assert not readable(high, 0)
        os.write(write_end, b"x")
        assert readable(high, 0)
        assert readable(high, 0.01)
    finally:
        for fd in (read_end, write_end, high):
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
