"""Ebird's GPU form (§V–VI): a CUDA model's workers are streams of one process, sharing one copy of the weights.

The host of a `device: cuda` model does not fork (CUDA does not survive a fork). It loads the model onto the GPU
once and keeps a device ring beside the shared input pool. The pool itself is the pinned staging memory: it is
registered with CUDA, so a copy out of it is a DMA with no bounce buffer. The engine writes each request's rows
into the pool and at once names them on the stage pipe; the host's stager thread issues their copy into the device
ring on its input stream and records an event. A worker is a thread with a stream of its own: before a batch the
stream waits on the events of the batch's slots (the GPU waits, the thread only until the copies were issued), the
model reads the device ring in place, and the outputs are copied back into the pool's output ring, pinned too,
before the worker answers.

All of a host's workers launch their kernels from one Python process, so an eager forward pass holds the GIL for
every one of its launches (a ResNet-50 about 300), and workers queue for it rather than for the GPU. With
`cuda_graphs` (the default) each worker captures its model at start as CUDA graphs, one per power of two up to its
granularity on its own stream and memory pool; a batch of r rows is copied into the smallest graph that holds it
(the rows past r keep stale inputs: rows are independent, as the engine already assumes when it splits requests)
and costs one launch.

Without CUDA the same classes run on the CPU with each copy done at once and no events: the tests use that to
check the staging order and the thread workers, since CI has no GPU.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from adaserve.config import ModelConfig
from adaserve.cpu.profiler import batch_grid
from adaserve.engine.messages import read_staged
from adaserve.engine.pool import SharedRings
from adaserve.engine.worker import BatchRunner, as_sequence, resident_bytes
from adaserve.errors import ConfigError

if TYPE_CHECKING:
    from adaserve.adaptive.gati.runtime import EarlyExit

#: How long a batch waits for the engine to name its rows on the stage pipe before it fails (a lost message would
#: otherwise hang its worker for good).
STAGE_TIMEOUT_S = 60.0


def cuda_device() -> torch.device:
    """The GPU a `device: cuda` model runs on; ConfigError on a machine without one."""
    if not torch.cuda.is_available():
        raise ConfigError("device cuda: this machine has no CUDA device (torch.cuda.is_available() is False)")
    return torch.device("cuda", torch.cuda.current_device())


def on_device(stored: Any, device: torch.device) -> Any:
    """The artifact `read_artifact` returned, its weights and constants moved to `device` (once, in the host)."""
    if isinstance(stored, torch.export.ExportedProgram):
        from torch.export.passes import move_to_device_pass

        return move_to_device_pass(stored, device)
    return stored.to(device)


class StagedInputs:
    """The device ring, and for each of its slots the copy that filled it (None: not staged since last used)."""

    def __init__(self, rings: SharedRings, device: torch.device) -> None:
        self.device = device
        self._cuda = device.type == "cuda"
        self._pool = [torch.from_numpy(ring) for ring in rings.inputs]
        self.rings = [torch.empty_like(ring, device=device) for ring in self._pool]
        self._staged: list[Any] = [None] * rings.layout.slots
        self._changed = threading.Condition()
        self._stream = torch.cuda.Stream(device) if self._cuda else None
        if self._cuda:
            _pin(rings)  # for the host's life: the registration goes with the process

    def follow(self, stage_fd: int) -> None:
        """The stager thread's loop: stage each run of rows the engine names, until it closes the pipe."""
        with torch.inference_mode():
            while (run := read_staged(stage_fd)) is not None:
                self.stage(*run)

    def stage(self, start: int, rows: int) -> None:
        """Copy slots [start, start + rows) of the pool into the device ring (issued on the input stream)."""
        end = start + rows
        with on_stream(self._stream):
            for pool, ring in zip(self._pool, self.rings, strict=True):
                ring[start:end].copy_(pool[start:end], non_blocking=True)
            marker: Any = True
            if self._stream is not None:
                marker = torch.cuda.Event()
                marker.record(self._stream)
        with self._changed:
            self._staged[start:end] = [marker] * rows
            self._changed.notify_all()

    def order(self, stream: torch.cuda.Stream | None, start: int, rows: int) -> None:
        """Make `stream` run after the copies of slots [start, start + rows); blocks until they were issued."""
        with self._changed:
            if not self._changed.wait_for(lambda: None not in self._staged[start : start + rows], STAGE_TIMEOUT_S):
                raise RuntimeError(f"slots {start}..{start + rows - 1} were not staged within {STAGE_TIMEOUT_S:g} s")
            copies = {id(marker): marker for marker in self._staged[start : start + rows]}
        if stream is not None:
            for event in copies.values():
                stream.wait_event(event)

    def release(self, start: int, rows: int) -> None:
        """The batch over these slots is done; the engine may reuse them, and names them again when it does."""
        with self._changed:
            self._staged[start : start + rows] = [None] * rows


def _pin(rings: SharedRings) -> None:
    """Register the whole pool (inputs and outputs, one mapping) as pinned memory."""
    address = rings.inputs[0].ctypes.data  # the first region starts the mapping
    error = torch.cuda.cudart().cudaHostRegister(address, rings.layout.size, 0)
    if int(error) != 0:
        raise ConfigError(f"device cuda: cannot pin the input pool ({rings.layout.size} bytes): CUDA error {error}")


def on_stream(stream: torch.cuda.Stream | None) -> contextlib.AbstractContextManager[Any]:
    """`stream` made current (nothing on the CPU, which has none)."""
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


class StreamLane:
    """A CUDA worker's lane (`worker.Lane`): a thread of the host running its batches on a stream of its own."""

    def __init__(self, inputs: StagedInputs) -> None:
        self._inputs = inputs
        self.stream = torch.cuda.Stream(inputs.device) if inputs.device.type == "cuda" else None

    def place(self, threads: int, cpus: Sequence[int] | None) -> tuple[int, list[int]]:
        """Only the thread is pinned (Linux affinity is per thread); one thread drives the stream."""
        if cpus:
            os.sched_setaffinity(0, cpus)
        return 1, sorted(os.sched_getaffinity(0))

    def memory_bytes(self) -> int:
        if self.stream is not None:
            return torch.cuda.memory_allocated(self._inputs.device)
        return resident_bytes()

    @contextlib.contextmanager
    def running(self, start: int, rows: int) -> Iterator[None]:
        """Released only after a batch that ran: when the worker dies instead, the engine runs the rows again
        elsewhere, and they are still staged for it."""
        self._inputs.order(self.stream, start, rows)
        with on_stream(self.stream):
            yield
        if self.stream is not None:
            self.stream.synchronize()  # the outputs are in the pool before the worker answers
        self._inputs.release(start, rows)


def graph_sizes(batch: int) -> list[int]:
    """The batch sizes a worker of granularity `batch` captures: the powers of two Packrat profiles (up to `batch`),
    and `batch` itself."""
    return sorted({*batch_grid(batch), batch})


class PaddedForward:
    """A forward pass run on batches of the sizes in `graph_sizes(batch)` only: a call copies its r rows into the
    buffers of the smallest size that holds them (the rows past r keep stale inputs: rows are independent) and
    returns the first r rows of the outputs. Eager, this is the CPU's stand-in for `GraphedForward`, which replays a
    CUDA graph over the same buffers: the tests check the padding and row bookkeeping of the graphs with it."""

    def __init__(self, forward: Callable[..., Any], batch: int) -> None:
        self._forward = forward
        self._sizes = graph_sizes(batch)
        self._buffers: dict[int, list[torch.Tensor]] = {}

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if not self._buffers:
            self._prepare(inputs)
        rows = inputs[0].shape[0]
        size = self._sizes[bisect.bisect_left(self._sizes, rows)]
        buffers = self._buffers[size]
        for buffer, given in zip(buffers, inputs, strict=True):
            buffer[:rows].copy_(given, non_blocking=True)
        return tuple(output[:rows] for output in self._run(size, buffers))

    def _prepare(self, inputs: Sequence[torch.Tensor]) -> None:
        """Buffers of every size, shaped and typed as the first call's rows."""
        for size in reversed(self._sizes):
            self._buffers[size] = [torch.zeros((size, *x.shape[1:]), dtype=x.dtype, device=x.device) for x in inputs]

    def _run(self, size: int, buffers: list[torch.Tensor]) -> Sequence[torch.Tensor]:
        return as_sequence(self._forward(*buffers))


class GraphedForward(PaddedForward):
    """A worker's model as CUDA graphs of every size in `graph_sizes(batch)`, captured on first call (the worker's
    warm-up, on its thread) on the worker's stream, sharing one memory pool (captured largest first, replayed one at
    a time: the worker runs one batch at a time). A call copies its rows into the smallest graph that holds them and
    replays it on the current stream; the outputs are views of the graph's own, valid until its next replay."""

    #: Captures of different workers one at a time (they share the process's allocator and the stager's copies).
    _capturing = threading.Lock()

    def __init__(self, forward: Callable[..., Any], batch: int, stream: torch.cuda.Stream) -> None:
        super().__init__(forward, batch)
        self._stream = stream
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]] = {}

    def _prepare(self, inputs: Sequence[torch.Tensor]) -> None:
        pool = None
        with self._capturing, torch.cuda.stream(self._stream):
            super()._prepare(inputs)
            for size in reversed(self._sizes):
                static_inputs = self._buffers[size]
                for _ in range(2):  # eager runs first: lazy initialisation (cuDNN, cuBLAS) stays out of the graph
                    self._forward(*static_inputs)
                self._stream.synchronize()
                graph = torch.cuda.CUDAGraph()
                try:
                    with torch.cuda.graph(graph, pool=pool, stream=self._stream, capture_error_mode="thread_local"):
                        static_outputs = tuple(as_sequence(self._forward(*static_inputs)))
                except Exception as exc:
                    raise ConfigError(
                        f"device cuda: cannot capture the model as a CUDA graph of batch {size} "
                        f"({type(exc).__name__}: {exc}); set cuda_graphs: false to run it eagerly"
                    ) from exc
                pool = graph.pool()
                self._graphs[size] = (graph, static_outputs)

    def _run(self, size: int, buffers: list[torch.Tensor]) -> Sequence[torch.Tensor]:
        graph, static_outputs = self._graphs[size]
        graph.replay()
        return static_outputs


def stream_worker(
    config: ModelConfig,
    model: Callable[..., Any],
    rings: SharedRings,
    inputs: StagedInputs,
    batch: int,
    early_exit: EarlyExit | None = None,
) -> tuple[BatchRunner, StreamLane]:
    """A CUDA worker of granularity `batch`: its lane (a stream of its own) and its runner, which reads the device
    ring and, with `cuda_graphs`, replays graphs captured on that stream; with learned caches, it runs its own copy
    of the model's early exit (with `cuda_graphs`, each segment between two exits a graph of its own)."""
    lane = StreamLane(inputs)
    forward = getattr(model, "forward", model)
    graphs = lane.stream if config.cuda_graphs else None
    own = None
    if early_exit is not None:
        own = early_exit.for_worker(batch, graphs) if graphs is not None else early_exit.for_worker()
    elif graphs is not None:
        forward = GraphedForward(forward, batch, graphs)
    return BatchRunner(config, forward, rings, early_exit=own, device_inputs=inputs.rings), lane
