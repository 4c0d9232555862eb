"""A worker: runs the batches the scheduler gives it, in place in the pool.

On CPU a worker is a process forked by its model's host (`adaserve.engine.host`) with the model already loaded, so
it shares the weights copy-on-write and starts in milliseconds. On CUDA it is a thread of the host with its own
stream (`adaserve.engine.streams`). Either way it reads its batch as a slice of the input rings (no copy) and
writes outputs into the same slots of the output rings, and the loop below is the same: only its `Lane` differs.
An exception in one batch is reported for that batch only; the worker keeps serving.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import numpy as np
import torch

from adaserve.config import ModelConfig
from adaserve.engine.messages import (
    BatchDone,
    ExitCounts,
    Rest,
    RowParameters,
    RowsDone,
    RunBatch,
    SpawnWorker,
    Stop,
    WorkerFailed,
    WorkerReady,
    poll_readable,
    read_to_worker,
    write_message,
)
from adaserve.engine.pool import SharedRings


class RowStrategy(Protocol):
    """Computes, instead of the model, the rows of the requests whose parameters it takes (the SLO-NNs node
    activator takes requests with an `accuracy` or `latency_ms` target) and returns their response parameters."""

    def takes(self, values: Mapping[str, Any]) -> bool: ...

    def run(self, inputs: list[np.ndarray], outputs: list[np.ndarray], values: Mapping[str, Any]) -> dict[str, Any]: ...

    def warm_up(self) -> None: ...


#: Reports requests answered before their batch ends (each a whole request: offset, rows, response parameters).
Answer = Callable[[list[RowParameters]], None]


class EarlyExitStrategy(Protocol):
    """Runs every row of a batch block by block, answering rows early from learned caches (GATI's `EarlyExit`)."""

    def run(
        self, inputs: torch.Tensor, outputs: np.ndarray, requests: Sequence[RowParameters], answer: Answer
    ) -> list[RowParameters]: ...

    def warm_up(self, rows: int, row_shape: tuple[int, ...], dtype: torch.dtype) -> None: ...

    def take_counts(self) -> list[ExitCounts]: ...


class BatchRunner:
    """Runs one batch: inputs viewed in place from the rings, outputs checked against the config and written back.

    Requests a `strategy` takes are handed to it (their rows, in place); the other rows run through the model as
    one batch per contiguous run, exactly as without a strategy. With `early_exit` every row runs through it.
    `device_inputs` replaces the pool's input rings as what the model reads (a CUDA model's device ring)."""

    def __init__(
        self,
        config: ModelConfig,
        model: Callable[..., Any],
        rings: SharedRings,
        strategy: RowStrategy | None = None,
        early_exit: EarlyExitStrategy | None = None,
        device_inputs: list[torch.Tensor] | None = None,
    ) -> None:
        self.config = config
        # `forward` directly: module hooks (the exported program's input checks) are not needed, the engine has
        # validated every input against the config.
        self.forward: Callable[..., Any] = getattr(model, "forward", model)
        self.rings = rings
        self.strategy = strategy
        self.early_exit = early_exit
        # Tensors over the rings' memory: the model reads its rows in place, and outputs are copied into place
        # (on CUDA from the device, asynchronously on the worker's stream, which its lane waits for).
        self.inputs = device_inputs if device_inputs is not None else [torch.from_numpy(r) for r in rings.inputs]
        self.outputs = [torch.from_numpy(r) for r in rings.outputs]

    def run(
        self,
        start: int,
        rows: int,
        parameters: Sequence[RowParameters] = (),
        requests: Sequence[int] | None = None,
        answer: Answer | None = None,
    ) -> list[RowParameters]:
        """Compute rows [start, start + rows) in place, `requests` the rows of each request (default: one request);
        returns the response parameters of the rows a strategy ran, and gives `answer` the requests answered early.
        The caller holds torch.inference_mode for the worker's life."""
        if self.early_exit is not None:
            return self.early_exit.run(
                self.inputs[0][start : start + rows],
                self.rings.outputs[0][start : start + rows],
                _request_rows(rows, requests, parameters),
                answer or (lambda answered: None),
            )
        strategy = self.strategy
        delegated = [p for p in parameters if strategy is not None and strategy.takes(p.values)]
        if strategy is None or not delegated:
            self._forward(start, rows)
            return []
        responses = []
        cursor = 0
        for request in sorted(delegated, key=lambda p: p.offset):
            if request.offset > cursor:
                self._forward(start + cursor, request.offset - cursor)
            low, high = start + request.offset, start + request.offset + request.rows
            values = strategy.run(
                [ring[low:high] for ring in self.rings.inputs],
                [ring[low:high] for ring in self.rings.outputs],
                request.values,
            )
            responses.append(RowParameters(request.offset, request.rows, values))
            cursor = request.offset + request.rows
        if cursor < rows:
            self._forward(start + cursor, rows - cursor)
        return responses

    def _forward(self, start: int, rows: int) -> None:
        result = self.forward(*[ring[start : start + rows] for ring in self.inputs])
        outputs = as_sequence(result)
        if len(outputs) != len(self.config.outputs):
            raise ValueError(f"model returned {len(outputs)} outputs, config declares {len(self.config.outputs)}")
        for spec, ring, tensor in zip(self.config.outputs, self.outputs, outputs, strict=True):
            expected = (rows, *spec.row_shape)
            if tuple(tensor.shape) != expected:
                raise ValueError(
                    f"model returned shape {list(tensor.shape)} for output '{spec.name}', expected {list(expected)}"
                )
            ring[start : start + rows].copy_(tensor, non_blocking=True)

    def warm_up(self, rows: int) -> None:
        """One run on zeros outside the pool, so the first real request does not pay for lazy initialisation."""
        if self.early_exit is not None:
            spec = self.config.inputs[0]
            self.early_exit.warm_up(rows, spec.row_shape, torch_dtype(spec.dtype))
            return
        device = self.inputs[0].device
        zeros = [
            torch.zeros((rows, *s.row_shape), dtype=torch_dtype(s.dtype), device=device) for s in self.config.inputs
        ]
        self.forward(*zeros)
        if self.strategy is not None:
            self.strategy.warm_up()

    def exit_counts(self) -> list[ExitCounts]:
        """What the learned caches did since the last call, per target (none without them)."""
        return self.early_exit.take_counts() if self.early_exit is not None else []


def _request_rows(
    rows: int, requests: Sequence[int] | None, parameters: Sequence[RowParameters]
) -> list[RowParameters]:
    """Each request's rows in the batch with its parameters (empty when it sent none)."""
    values = {p.offset: p.values for p in parameters}
    result, offset = [], 0
    for count in requests if requests is not None else (rows,):
        result.append(RowParameters(offset, count, values.get(offset, {})))
        offset += count
    return result


def as_sequence(result: Any) -> Sequence[torch.Tensor]:
    """A model's outputs in the config's order, whether it returned one tensor, a tuple or a dict."""
    if isinstance(result, torch.Tensor):
        return (result,)
    if isinstance(result, dict):
        return tuple(result.values())
    return tuple(result)


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype of a config tensor's numpy dtype."""
    return torch.from_numpy(np.zeros(0, dtype=dtype)).dtype


def place(threads: int, cpus: Sequence[int] | None) -> list[int]:
    """Pin this process to its CPUs and set its intra-op threads; returns the CPUs it may run on."""
    if cpus:
        os.sched_setaffinity(0, cpus)
    torch.set_num_threads(threads)
    return sorted(os.sched_getaffinity(0))


def resident_bytes() -> int:
    """This process's resident memory (pages shared with the host included; growth is what the worker added)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Lane(Protocol):
    """Where a worker's batches run: its own process on CPU cores, or a CUDA stream of the host's process."""

    def place(self, threads: int, cpus: Sequence[int] | None) -> tuple[int, list[int]]:
        """Take the worker's threads and CPUs; returns the intra-op threads and the CPUs it may run on."""
        ...

    def memory_bytes(self) -> int:
        """Memory held now, read before and after warm-up: the difference is the worker's workspace."""
        ...

    def running(self, start: int, rows: int) -> AbstractContextManager[None]:
        """Around a batch of slots [start, start + rows): its inputs are ready inside, its outputs on exit."""
        ...


class ProcessLane:
    """A CPU worker: a process of its own, pinned to its CPUs; the pool's memory is all it needs."""

    def place(self, threads: int, cpus: Sequence[int] | None) -> tuple[int, list[int]]:
        allowed = place(threads, cpus)
        return torch.get_num_threads(), allowed

    def memory_bytes(self) -> int:
        return resident_bytes()

    def running(self, start: int, rows: int) -> AbstractContextManager[None]:
        return contextlib.nullcontext()


def serve_worker(
    spawn: SpawnWorker, runner: BatchRunner, command_fd: int, result_fd: int, lane: Lane | None = None
) -> int:
    """The worker's life once started: place it, warm up, then run batches until told to stop."""
    with torch.inference_mode():
        return _serve(spawn, runner, command_fd, result_fd, lane or ProcessLane())


def _serve(spawn: SpawnWorker, runner: BatchRunner, command_fd: int, result_fd: int, lane: Lane) -> int:
    try:
        threads, allowed = lane.place(spawn.threads, spawn.cpus)
        before = lane.memory_bytes()
        runner.warm_up(spawn.batch)
        workspace = max(0, lane.memory_bytes() - before)
    except Exception as exc:
        write_message(result_fd, WorkerFailed(spawn.worker_id, f"{type(exc).__name__}: {exc}"))
        return 1
    write_message(result_fd, WorkerReady(spawn.worker_id, os.getpid(), threads, allowed, workspace))
    spin_ns = 0  # how long the last batch's command let this worker poll for the next one
    while True:
        if spin_ns:
            poll_readable(command_fd, spin_ns)
        command = read_to_worker(command_fd)
        if command is None or isinstance(command, Stop):
            return 0
        if isinstance(command, Rest):
            spin_ns = 0
            continue
        write_message(result_fd, _run(runner, command, result_fd, lane))
        spin_ns = command.spin_us * 1000


def _run(runner: BatchRunner, command: RunBatch, result_fd: int, lane: Lane) -> BatchDone:
    """Run the batch; if the model raises, run each request's rows alone so only the culprit gets the error."""
    began = time.perf_counter_ns()
    answer = _answer_to(result_fd, command.batch_id, 0, began)
    errors: list[str | None] | None = None  # None: every request's rows were computed
    with lane.running(command.start, command.rows):
        try:
            responses = runner.run(command.start, command.rows, command.parameters, command.requests, answer)
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            if len(command.requests) == 1:
                errors, responses = [_describe(exc)], []
            else:
                errors, responses = _run_alone(runner, command, result_fd, began)
    compute_ns = time.perf_counter_ns() - began
    return BatchDone(command.batch_id, compute_ns, began, errors, responses, runner.exit_counts())


def _run_alone(
    runner: BatchRunner, command: RunBatch, result_fd: int, began: int
) -> tuple[list[str | None], list[RowParameters]]:
    """Each request's rows (and parameters, offsets made relative to them) on their own."""
    errors: list[str | None] = []
    responses: list[RowParameters] = []
    offset = 0
    for rows in command.requests:
        mine = [
            RowParameters(p.offset - offset, p.rows, p.values)
            for p in command.parameters
            if offset <= p.offset < offset + rows
        ]
        answer = _answer_to(result_fd, command.batch_id, offset, began)
        try:
            for p in runner.run(command.start + offset, rows, mine, None, answer):
                responses.append(RowParameters(p.offset + offset, p.rows, p.values))
            errors.append(None)
        except Exception as exc:
            errors.append(_describe(exc))
        offset += rows
    return errors, responses


def _answer_to(result_fd: int, batch_id: int, offset: int, began: int) -> Answer:
    """Send requests answered early to the engine at once (offsets `offset` rows into the batch, begun at
    `began`)."""

    def answer(answered: list[RowParameters]) -> None:
        moved = [RowParameters(p.offset + offset, p.rows, p.values) for p in answered]
        write_message(result_fd, RowsDone(batch_id, moved, began, time.perf_counter_ns()))

    return answer


def _describe(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"
