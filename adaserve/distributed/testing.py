"""A node server's control channel driven from this process, standing in for its node actor: the cluster's data path
(routing tables, loads, forwarding) run and measured without Ray.

This process sends what a controller's orders would (`Routes`, `Load`, `Unload`, `Report`) over the same socket pair
`adaserve serve --cluster-control FD` takes from its node actor, and reads what the server reports; a
`FakeController` answers the trace setting changes the servers send up, as the cluster's controller would. The
forwarding tests and `benchmarks/cluster/forwarding.py` start their node servers with `node_server`.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import TypeVar

import msgspec

from adaserve.distributed.messages import (
    FromNode,
    Load,
    Loaded,
    Place,
    Report,
    Requests,
    Resident,
    ToNode,
    TraceChange,
    TraceChanged,
    Traced,
    Tracing,
)
from adaserve.distributed.trace_settings import changed

#: The channel's frame header: each message's length (`control.py`).
_LENGTH = struct.Struct("<I")

Handle = TypeVar("Handle")
#: Starts `adaserve serve` with these further arguments, inheriting these descriptors: a context manager that gives
#: the running server's handle (`tests.server_utils.running_server` on a repository, say).
Starter = Callable[[tuple[str, ...], tuple[int, ...]], AbstractContextManager[Handle]]


class FakeActor:
    """This process's end of one node server's control channel: sends orders, collects what the server reports."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reports: queue.Queue[FromNode] = queue.Queue()
        self.controller: FakeController | None = None  # answers trace setting changes, once it has this node
        self._decoder = msgspec.msgpack.Decoder(FromNode)
        self._closed = False
        self._sending = threading.Lock()  # the test's thread and the reader's (answering a change) both send
        threading.Thread(target=self._read, daemon=True).start()

    def send(self, message: ToNode) -> None:
        body = msgspec.msgpack.encode(message)
        with self._sending:
            self.sock.sendall(_LENGTH.pack(len(body)) + body)

    def _read(self) -> None:
        with self.sock.makefile("rb") as stream:
            while head := stream.read(_LENGTH.size):
                report = self._decoder.decode(stream.read(_LENGTH.unpack(head)[0]))
                if self.controller is None or not isinstance(report, TraceChange | Traced):
                    self.reports.put(report)
                elif isinstance(report, TraceChange):
                    self.controller.change(self, report)

    def expect(self, kind: type, timeout_s: float = 120.0) -> FromNode:
        """The next report of `kind` (request counts, which come every second, and a placement asked again while
        unanswered are skipped); anything else first is an AssertionError, no report in time a `queue.Empty`."""
        deadline = time.monotonic() + timeout_s
        while True:
            report = self.reports.get(timeout=max(0.1, deadline - time.monotonic()))
            if isinstance(report, kind):
                return report
            if not isinstance(report, Requests | Place):
                raise AssertionError(f"expected {kind.__name__}, got {report}")

    def drain(self) -> None:
        """Forget the reports so far (a placement asked again, request counts)."""
        with contextlib.suppress(queue.Empty):
            while True:
                self.reports.get_nowait()

    def load(self, model: str) -> Loaded:
        """Order `model` loaded and wait until it is (an AssertionError if the server could not)."""
        self.send(Load(model))
        loaded = self.expect(Loaded)
        if not isinstance(loaded, Loaded) or loaded.model != model or loaded.error:
            raise AssertionError(f"loading {model} failed: {loaded}")
        return loaded

    def close(self) -> None:
        """Close the channel, as an actor's exit does (shut down first: the reader's file holds the socket open)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):  # the server went first
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class FakeController:
    """The controller's part in the cluster's trace settings, for node servers driven by `FakeActor`s: a change one
    of them sends up is applied to the cluster's settings, sent to every node it has, and answered (the nodes'
    confirmations are not awaited; each node's channel takes the settings before the answer)."""

    def __init__(self, actors: Iterable[FakeActor]) -> None:
        self.actors = list(actors)
        self.tracing: Tracing | None = None
        self._lock = threading.Lock()
        for actor in self.actors:
            actor.controller = self

    def change(self, asking: FakeActor, change: TraceChange) -> None:
        with self._lock:
            self.tracing = changed(self.tracing, change)
            for actor in self.actors:
                actor.send(self.tracing)
        asking.send(TraceChanged(change.ask))


@contextlib.contextmanager
def node_server(start: Starter[Handle], name: str) -> Iterator[tuple[Handle, FakeActor]]:
    """Node server `name`, started with `start`, and this process as its actor; it holds no model yet (checked). On
    leaving, the channel closes, which stops the server (then `start`'s context stops whatever is left)."""
    ours, theirs = socket.socketpair()
    with contextlib.ExitStack() as stack:
        stack.callback(ours.close)
        try:
            args = ("--cluster-node", name, "--cluster-control", str(theirs.fileno()))
            handle = stack.enter_context(start(args, (theirs.fileno(),)))
        finally:
            theirs.close()  # the server holds its own copy
        actor = FakeActor(ours)
        stack.callback(actor.close)
        actor.send(Report())
        resident = actor.expect(Resident)
        if resident != Resident({}):
            raise AssertionError(f"node {name} held models before it was told to load any: {resident}")
        yield handle, actor
