"""A batch's block chain in a process of its own (`caches.lookup: process`), so that GATI's lookups run beside the
model on a CPU, as the paper has them, and a row no cache answers does not wait for them.

The worker's thread hands a batch's inputs to the model process, which runs the chain; each exit's output, and the
last block's, comes back through shared memory the moment the model process reaches it, and the worker's thread
consults that exit's cache while the model process runs the next blocks (the runtime runs the blocks up to the
first exit on the worker's thread too, and consults that exit's cache on its own output: `runtime._Pass._beside`).
A hit is answered there and then; its rows are marked in shared memory, and the model process drops them at its
next block boundary (it stops once every row is answered). So a hit costs the time to its exit plus its lookup, and
a row no cache answers pays the hand-offs (copying each exit's output), not the lookups.

Why a process: a model thread inside the worker (the earlier `lookup: thread`) took turns with the worker's thread
on the GIL, and each hand-off woke a thread. Here nothing on the path takes a lock or waits for the GIL: each side
spins on numbers in shared memory, yielding its core now and then in case the two share one. Why the model moves
and the lookups stay: a lookup process (tried 2026-11-24) answered each hit a block after its exit, as the worker
read its verdict only between blocks (`benchmarks/README.md` §4).

The model process spins while batches run and for `LINGER_S` after the last (a core that has just slept runs the
next blocks slower); otherwise it sleeps on a pipe, so an idle worker costs no core. It runs on the CPUs the worker
is not pinned to, when there are any. It dies with the worker (PR_SET_PDEATHSIG, and it checks its parent whenever
it wakes); if it dies first, the worker reports it and runs its lookups inline from then on.

The buffers are sized at start for the worker's largest batch. The hand-off relies on the CPU keeping stores in order
(x86): each side writes its data before the number that announces it; elsewhere the worker runs inline. Each model
process has shared memory of its own (anonymous mappings, never multiprocessing's shared heap): a model process whose
worker dropped it without `close` (a runtime replaced) would otherwise keep spinning on memory the heap hands to the
next one, and run or report its jobs (seen as a report with no shape, 2026-12-02). A dropped one is also hung up on.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import mmap
import multiprocessing as mp
import os
import platform
import signal
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from adaserve.adaptive.gati.blocks import BlockChain
from adaserve.engine.messages import readable

__all__ = ["ModelProcess", "ModelProcessDied", "Sizes", "supported"]

log = logging.getLogger("adaserve.gati")

#: Words of the control block (int64 each), read and written as Python ints through a memoryview (a numpy scalar
#: costs more, and right after a block every operator does): the job posted and its first block; the job cancelled,
#: the job finished (or failed); how many outputs have been reported in all; whether a batch runs (spin) or not; the
#: job some of whose rows the worker marked answered (until then the model process need not look at them); a count
#: the worker bumps when it changes the exits to report; whether the model process is awake (spinning), so that a
#: batch need not wake it.
JOB, FIRST, CANCELLED, FINISHED, FAILED, REPORTED, ACTIVE, MARKED, EXITS, AWAKE = range(10)
FIELDS = 10
#: Per report slot and for the input: the block it is the output of; the layout of its tensor (a number its writer
#: gives each dtype and shape it writes there, so the reader makes a view once per layout), then the layout's dtype
#: code, number of dims and shape.
BLOCK, LAYOUT, DTYPE, NDIM, SHAPE = range(5)
MAX_DIMS = 6
SLOT_FIELDS = SHAPE + MAX_DIMS
#: Tensor dtypes by the code the slots carry.
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
#: Bytes of a failed batch's error message carried back to the worker.
ERROR_BYTES = 1024
#: How long the model process keeps spinning after a batch, ready for the next (seconds): from 20 batches a second
#: on it never sleeps. A core that has just slept runs the next blocks slower: on the 2-core VM a 2 ms linger, with
#: batches 10 ms apart, answered the median request in 0.83 ms against 0.65 ms spinning throughout.
LINGER_S = 0.05
#: Spins between two yields of the core while a side waits for the other (about 50 µs): an unpinned model process
#: may share the worker's core, where two processes spinning would wait for each other's time slices (4 ms); a
#: yield each spin would cost each wait a system call, and each system call the caches it evicts.
YIELD_EVERY = 500
#: How often a wait for the model process checks that it is still alive (spins).
CHECK_EVERY = 50_000
#: How long the sleeping model process waits on its pipe before it checks its parent again (seconds).
PARENT_CHECK_S = 1.0
PR_SET_PDEATHSIG = 1


def supported() -> bool:
    """Whether this CPU keeps stores in order, as the hand-off needs."""
    return platform.machine().lower() in ("x86_64", "amd64")


class ModelProcessDied(RuntimeError):
    """The model process exited while the worker waited for it."""


@dataclass(frozen=True)
class Sizes:
    """What the shared buffers must hold: a batch's rows, the largest row (in bytes) of any exit's output or the
    model's, and how many outputs one batch may report (its plans' most exits, plus the last block's)."""

    rows: int
    row_bytes: int
    reports: int


class ModelProcess:
    """The model process and the shared memory the worker talks to it through (see the module docstring).

    Each slot (an exit's output, the last block's, or the input) has one writer, so a layout number means the same
    to both sides. On a request's path the writer copies the tensor in and writes a word or two; the shape is
    written, and the reader makes its view, only when the layout changes. The path is kept this short because each
    operator on it runs with its code out of the CPU's caches (after a block, or after the worker's other work): on
    the 2-core VM a hand-off that wrote every field each time took 0.1 ms before the model process could start, and
    its three reports 0.09 ms of a row that ran to the end (`benchmarks/README.md` §4)."""

    def __init__(self, chain: BlockChain, sizes: Sizes) -> None:
        self.chain = chain
        self.sizes = sizes
        self._words = _shared(8 * (FIELDS + (sizes.reports + 1) * SLOT_FIELDS)).cast("q")
        self._data = _shared((sizes.reports + 1) * self._slot_bytes)
        rows = _shared(8 * (sizes.reports + 1) * sizes.rows)
        self._slot_rows = np.frombuffer(rows, np.int64).reshape(sizes.reports + 1, -1)
        self._answered = np.frombuffer(_shared(sizes.rows), np.bool_)  # by row of the pass
        self._exits = np.frombuffer(_shared(len(chain.blocks)), np.bool_)  # by block: report its output
        self._error = _shared(ERROR_BYTES)  # a failed batch's error, NUL-terminated
        self._job = 0
        self._exits_posted: tuple[int, ...] | None = None  # in the worker: the exits last written
        self._marked = False  # in the worker: whether a job marked rows since `_answered` was last cleared
        self._targets: list[torch.Tensor | None] = [None] * (sizes.reports + 1)  # by slot: what `_put` writes into
        self._layouts: dict[tuple[torch.dtype, torch.Size], int] = {}  # this side's layout numbers
        self._views: dict[tuple[int, int], torch.Tensor] = {}  # by slot and layout: see `_view`
        self._every: dict[int, np.ndarray] = {}  # np.arange(n), by n
        self._exits_seen, self._report_after = 0, set[int]()  # in the model process: `_exits` as of word EXITS
        wake_read, self._wake = os.pipe()
        os.set_blocking(self._wake, False)  # a full pipe means the model process is awake: no need to wake it
        cpus = _cpus_beside(os.sched_getaffinity(0))
        context = mp.get_context("fork")  # the chain's weights are in this process's memory already
        self._process = context.Process(
            target=self._serve,
            args=(os.getpid(), wake_read, cpus, torch.get_num_threads()),
            name="gati-model",
            daemon=True,
        )
        self._process.start()
        os.close(wake_read)
        self._hang_up = weakref.finalize(self, _close_quietly, self._wake)  # dropped without close: it still leaves

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def alive(self) -> bool:
        return self._process.is_alive()

    @property
    def exitcode(self) -> int | None:
        return self._process.exitcode

    def close(self) -> None:
        """End the model process (closing its pipe is its signal to leave)."""
        self._hang_up()
        self._process.join(timeout=5)

    # -- in the worker -----------------------------------------------------------------------------------------
    def begin(self) -> None:
        """A batch begins: the model process spins, ready for its job, until `end` (then it lingers, then sleeps).

        Plain calls, and no system call while the model process spins: with its caches cold after the worker's
        other work, a context manager and a pipe write took 8 of the 21 µs to a job posted on the 2-core VM. A batch
        wakes the model process only when it is not spinning already or when a job is left unfinished there (it may
        have died: the write's broken pipe says so). Should it stop spinning just as the batch begins and miss it,
        the wait for its first report wakes it (`_report`)."""
        words = self._words
        words[ACTIVE] = 1
        if not words[AWAKE] or not self.idle():
            self._wake_up()

    def end(self) -> None:
        """The batch is over (see `begin`)."""
        self._words[ACTIVE] = 0

    def _wake_up(self) -> None:
        try:
            os.write(self._wake, b"\0")
        except BlockingIOError:
            pass  # the pipe is full of wake-ups the model process has not needed: it is awake
        except BrokenPipeError:
            raise ModelProcessDied(f"the model process exited (code {self.exitcode})") from None

    def idle(self) -> bool:
        """No job runs there (an abandoned one may still be finishing its block)."""
        return self._words[FINISHED] == self._job

    def start(self, x: torch.Tensor, block: int, exits: Sequence[int]) -> Job:
        """Run blocks `block`… on every row of `x`, reporting after `exits` (blocks before the last) and the last
        block."""
        words = self._words
        reported = words[REPORTED]
        self._put(self.sizes.reports, x)
        exits = tuple(exits)
        if exits != self._exits_posted:
            if len(exits) >= self.sizes.reports:
                need, sized = len(exits) + 1, self.sizes.reports
                raise ValueError(f"exits {list(exits)} and the last block need {need} reports, {sized} are sized")
            self._exits[:] = False
            self._exits[list(exits)] = True
            self._exits_posted = exits
            words[EXITS] += 1
        self._job += 1
        words[FIRST] = block
        words[JOB] = self._job  # it announces the rest; what follows the model process reads only once marked
        if self._marked:  # the flags are clear unless an earlier job marked some
            self._answered[:] = self._marked = False
        return Job(self, self._job, reported, self._answered[: len(x)], self._all_rows(len(x)))

    @property
    def _slot_bytes(self) -> int:
        return self.sizes.rows * self.sizes.row_bytes

    def _all_rows(self, count: int) -> np.ndarray:
        """np.arange(count), made once (do not change it)."""
        rows = self._every.get(count)
        if rows is None:
            rows = self._every[count] = np.arange(count)
        return rows

    def _put(self, number: int, x: torch.Tensor) -> None:
        """Copy `x` into slot `number` (one `copy_` into a view of the slot: on the 2-core VM, half the time of a
        `ctypes.memmove` with its checks right after a block), describing its layout first when it changed."""
        target = self._targets[number]
        if target is None or target.shape != x.shape or target.dtype != x.dtype:
            target = self._describe(number, x)
        target.copy_(x)

    def _describe(self, number: int, x: torch.Tensor) -> torch.Tensor:
        """Write `x`'s dtype and shape into slot `number`'s fields, under a layout number of this side's; return the
        view of the slot's buffer that `x` is copied into."""
        if x.dim() > MAX_DIMS or x.dtype not in DTYPES:
            raise ValueError(f"the model process carries tensors of up to {MAX_DIMS} dims of {DTYPES}, not {x.dtype}")
        if x.nbytes > self._slot_bytes:
            raise ValueError(
                f"a {list(x.shape)} tensor does not fit the model process's {self._slot_bytes}-byte buffer"
            )
        words, at = self._words, FIELDS + number * SLOT_FIELDS
        words[at + DTYPE], words[at + NDIM] = DTYPES.index(x.dtype), x.dim()
        for dim, size in enumerate(x.shape):
            words[at + SHAPE + dim] = size
        words[at + LAYOUT] = self._layouts.setdefault((x.dtype, x.shape), len(self._layouts) + 1)
        target = self._targets[number] = self._tensor(number, x.dtype, x.shape)
        return target

    def _view(self, number: int) -> torch.Tensor:
        """The tensor slot `number` holds, as its writer described it: a view of its buffer, made once per layout
        (right after a block, making one costs tens of microseconds)."""
        words, at = self._words, FIELDS + number * SLOT_FIELDS
        key = (number, words[at + LAYOUT])
        view = self._views.get(key)
        if view is None:
            shape = words[at + SHAPE : at + SHAPE + words[at + NDIM]].tolist()
            view = self._views[key] = self._tensor(number, DTYPES[words[at + DTYPE]], shape)
        return view

    def _tensor(self, number: int, dtype: torch.dtype, shape: Sequence[int]) -> torch.Tensor:
        """A view of slot `number`'s buffer as a tensor of `dtype` and `shape`."""
        size = self._slot_bytes
        data = memoryview(self._data)[number * size : (number + 1) * size]
        return torch.frombuffer(data, dtype=dtype, count=math.prod(shape)).view(*shape)

    def _report(self, job: Job, number: int) -> tuple[int, torch.Tensor, np.ndarray]:
        """Job `job`'s output number `number` (counting from 0), once there."""
        words, spins, wanted = self._words, 0, job.base + number
        while words[REPORTED] <= wanted:
            if words[FAILED] == job.number:
                message = bytes(self._error).split(b"\0", 1)[0].decode(errors="replace")
                raise RuntimeError(f"in the model process: {message}")
            spins += 1
            if spins % CHECK_EVERY == 0:
                if not self._process.is_alive():
                    raise ModelProcessDied(f"the model process exited (code {self.exitcode}) during a batch")
                if not words[AWAKE]:
                    self._wake_up()  # it went to sleep as the batch began (see `begin`)
            if spins % YIELD_EVERY == 0:
                os.sched_yield()  # the model process may share this core: let it run
        output = self._view(number)
        rows = len(output)
        alive = job.every if rows == len(job.every) else self._slot_rows[number, :rows].copy()
        return words[FIELDS + number * SLOT_FIELDS + BLOCK], output, alive

    # -- in the model process ----------------------------------------------------------------------------------
    def _serve(self, parent: int, wake: int, cpus: set[int] | None, threads: int) -> None:
        _die_with_parent()
        os.close(self._wake)
        if cpus:
            os.sched_setaffinity(0, cpus)
        torch.set_num_threads(threads)
        words, seen = self._words, 0  # not the word: the worker may have posted job 1 already
        with torch.inference_mode():
            while True:
                ready = readable(wake, PARENT_CHECK_S)
                if os.getppid() != parent:
                    return
                if ready and not os.read(wake, 4096):
                    return  # the worker closed the pipe
                if ready or words[ACTIVE]:
                    seen = self._spin(seen)

    def _spin(self, seen: int) -> int:
        """Run the jobs posted while batches run and for `LINGER_S` after the last; return the last job seen."""
        words, spins = self._words, 0
        words[AWAKE] = 1
        while True:
            lingering = time.monotonic() + LINGER_S
            while words[ACTIVE] or time.monotonic() < lingering:
                if words[JOB] != seen:
                    seen = words[JOB]
                    self._run(seen)
                if words[ACTIVE]:
                    lingering = time.monotonic() + LINGER_S
                spins += 1
                if spins % YIELD_EVERY == 0:
                    os.sched_yield()  # the worker may share this core
            words[AWAKE] = 0
            if not words[ACTIVE]:  # a batch that began just now may have seen AWAKE and not woken it
                return seen
            words[AWAKE] = 1

    def _run(self, job: int) -> None:
        words, blocks, last = self._words, self.chain.blocks, len(self.chain.blocks) - 1
        if words[EXITS] != self._exits_seen:
            self._exits_seen, self._report_after = words[EXITS], set(np.flatnonzero(self._exits).tolist())
        answered, report_after = self._answered, self._report_after
        x = self._view(self.sizes.reports)
        every = alive = self._all_rows(len(x))
        number = 0
        try:
            for index in range(words[FIRST], last + 1):
                if words[CANCELLED] == job:
                    break
                if words[MARKED] == job:
                    keep = ~answered[alive]
                    if not keep.any():
                        break
                    if not keep.all():
                        x, alive = x[torch.from_numpy(keep)], alive[keep]
                x = blocks[index](x)
                if index in report_after or index == last:
                    self._put(number, x)
                    if len(alive) < len(every):
                        self._slot_rows[number, : len(alive)] = alive
                    words[FIELDS + number * SLOT_FIELDS + BLOCK] = index
                    number += 1
                    words[REPORTED] += 1  # last: it announces the rest
        except Exception as error:
            log.exception("the model process failed on a batch")
            message = f"{type(error).__name__}: {error}".encode()[: ERROR_BYTES - 1] + b"\0"
            self._error[: len(message)] = message
            words[FAILED] = job
        words[FINISHED] = job


@dataclass(eq=False)
class Job:
    """One batch's blocks in the model process: its outputs in order (`next`), and `answered`, by row of the pass,
    which the worker's thread marks (`mark`) and the model process reads at each block boundary."""

    process: ModelProcess
    number: int
    base: int  # the reports before this job
    answered: np.ndarray
    every: np.ndarray  # np.arange of the pass's rows
    taken: int = 0
    marked: bool = False  # whether any row is marked answered (until then `answered` need not be read)

    def next(self) -> tuple[int, torch.Tensor, np.ndarray]:
        """The next exit's (or the last block's) index, output and rows (the output stays valid until the next
        job); RuntimeError when the model process failed on the batch."""
        report = self.process._report(self, self.taken)
        self.taken += 1
        return report

    def mark(self, rows: np.ndarray) -> None:
        """Rows of the pass answered: the model process drops them at its next block boundary."""
        self.answered[rows] = True
        self.marked = self.process._marked = True
        self.process._words[MARKED] = self.number  # last: it announces them

    def cancel(self) -> None:
        """The batch is done with (answered, or failed): the model process stops at its next block boundary."""
        self.process._words[CANCELLED] = self.number


def _shared(size: int) -> memoryview:
    """`size` zero bytes of memory of this model process's own, shared with it across the fork."""
    return memoryview(mmap.mmap(-1, size))


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def _cpus_beside(own: set[int]) -> set[int] | None:
    """The CPUs for the model process: those the host may use that the worker is not pinned to (None: the worker is
    not pinned, or to every CPU there is; the scheduler places the model process)."""
    try:
        every = os.sched_getaffinity(os.getppid())  # the host's: what the worker's CPU list was taken from
    except OSError:
        return None
    return (every - own) or None


def _die_with_parent() -> None:
    """Have the kernel kill this process when the worker dies (Linux; elsewhere the parent check does it)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
