"""GATI's lookups on a core of their own (`caches.lookup: core`): a lookup process beside the worker, as the paper
runs them on a CPU.

After an exit's block the worker's thread copies the block's output into shared memory, bumps a sequence number and
goes on with the next block; the lookup process, spinning on that number, runs the cache (its TorchScript graph) and
writes the flags and logits back; after the next block the worker reads them. Nothing on that path takes a lock,
makes a system call or waits for the GIL, which is why it works where a lookup thread inside the worker did not: on
the benchmark ResNet-style CNN a thread's hand-offs and GIL cost more than the lookups they moved, while with a
spinning process a row that no cache answers paid nothing for the four lookups (0.02 ms against 0.57 ms inline,
`benchmarks/README.md` §4). A hit is acted on one block after its exit, as with a side stream on a GPU.

The process spins only while a batch runs (`batch()`); between batches it sleeps on a pipe, so an idle worker costs
no core. It runs on the CPUs the worker is not pinned to, when there are any. It dies with the worker
(PR_SET_PDEATHSIG, and it checks its parent whenever it wakes); if it dies first, the worker reports it and the
model goes on with its lookups inline (`EarlyExit.run`).

The shared buffers are sized at start for the largest activation and logits the worker's batch can produce. The
hand-off relies on the CPU keeping stores in order (x86); each side writes its data before the number that
announces it.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing as mp
import os
import select
import signal
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["LookupCore", "LookupProcessDied", "Sizes"]

#: Fields of the control block (int64 each).
SEQUENCE, DONE, FAILED, ACTIVE, PLAN, EXIT, DTYPE, OUT_DTYPE, OUT_COLUMNS, NDIM, SHAPE = range(11)
MAX_DIMS = 6
FIELDS = SHAPE + MAX_DIMS
#: Tensor dtypes by the code the control block carries.
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
#: How often a wait for a result checks that the lookup process is still alive (spins).
CHECK_EVERY = 50_000
#: How long the sleeping lookup process waits on its pipe before it checks its parent again (seconds).
PARENT_CHECK_S = 1.0
PR_SET_PDEATHSIG = 1

log = logging.getLogger("adaserve.gati")


class LookupProcessDied(RuntimeError):
    """The lookup process exited while the worker waited for a lookup."""


@dataclass(frozen=True)
class Sizes:
    """What the shared buffers must hold: a batch's rows, and the largest activation and logits row in bytes."""

    rows: int
    activation_row_bytes: int
    logits_row_bytes: int


class LookupCore:
    """The lookup process and the shared memory the worker talks to it through (see the module docstring)."""

    def __init__(self, lookups: Sequence[Mapping[int, torch.jit.ScriptModule]], sizes: Sizes) -> None:
        self._lookups = lookups  # per plan: block index → the cache's TorchScript graph
        self._control = mp.RawArray(ctypes.c_int64, FIELDS)
        self._activation = mp.RawArray(ctypes.c_uint8, sizes.rows * sizes.activation_row_bytes)
        self._found = mp.RawArray(ctypes.c_uint8, sizes.rows)
        self._logits = mp.RawArray(ctypes.c_uint8, sizes.rows * sizes.logits_row_bytes)
        self._fields = np.frombuffer(memoryview(self._control).cast("B"), np.int64)
        self._sequence = 0
        wake_read, self._wake = os.pipe()
        cpus = _cpus_beside(os.sched_getaffinity(0))
        context = mp.get_context("fork")  # the graphs are in this process's memory already
        self._process = context.Process(
            target=self._serve, args=(os.getpid(), wake_read, cpus), name="gati-lookups", daemon=True
        )
        self._process.start()
        os.close(wake_read)

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def alive(self) -> bool:
        return self._process.is_alive()

    @property
    def exitcode(self) -> int | None:
        return self._process.exitcode

    def close(self) -> None:
        """End the lookup process (closing its pipe is its signal to leave)."""
        os.close(self._wake)
        self._process.join(timeout=5)

    # -- in the worker -----------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """While a batch runs the lookup process spins, ready for its lookups; after it, it sleeps."""
        self._fields[ACTIVE] = 1
        try:
            os.write(self._wake, b"\0")
        except BrokenPipeError:
            raise LookupProcessDied(f"the lookup process has exited (code {self.exitcode})") from None
        try:
            yield
        finally:
            self._fields[ACTIVE] = 0

    def launch(self, plan: int, exit: int, x: torch.Tensor) -> int:
        """Hand block `exit`'s output `x` to plan `plan`'s cache there; returns the lookup's number for `result`."""
        fields = self._fields
        torch.frombuffer(self._activation, dtype=x.dtype, count=x.numel()).view(x.shape).copy_(x)
        fields[PLAN], fields[EXIT], fields[DTYPE], fields[NDIM] = plan, exit, DTYPES.index(x.dtype), x.dim()
        fields[SHAPE : SHAPE + x.dim()] = x.shape
        self._sequence += 1
        fields[SEQUENCE] = self._sequence  # last: it announces the rest
        return self._sequence

    def result(self, sequence: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Lookup `sequence`'s flags and logits (of its `rows` rows), once the lookup process has written them."""
        fields, spins = self._fields, 0
        while fields[DONE] != sequence:
            spins += 1
            if spins % CHECK_EVERY == 0 and not self._process.is_alive():
                raise LookupProcessDied(f"the lookup process exited (code {self.exitcode}) during a lookup")
        if fields[FAILED]:
            raise RuntimeError(f"lookup {sequence} failed in the lookup process (its error is in the worker's log)")
        found = torch.frombuffer(self._found, dtype=torch.bool, count=rows).clone()
        columns, dtype = int(fields[OUT_COLUMNS]), DTYPES[fields[OUT_DTYPE]]
        logits = torch.frombuffer(self._logits, dtype=dtype, count=rows * columns).view(rows, columns).clone()
        return found, logits

    # -- in the lookup process ---------------------------------------------------------------------------------
    def _serve(self, parent: int, wake: int, cpus: set[int] | None) -> None:
        _die_with_parent()
        os.close(self._wake)
        if cpus:
            os.sched_setaffinity(0, cpus)
        torch.set_num_threads(1)
        fields, seen = self._fields, int(self._fields[SEQUENCE])
        with torch.inference_mode():
            while True:
                ready, _, _ = select.select([wake], [], [], PARENT_CHECK_S)
                if os.getppid() != parent:
                    return
                if not ready:
                    continue
                if not os.read(wake, 4096):
                    return  # the worker closed the pipe
                while fields[ACTIVE]:
                    if fields[SEQUENCE] != seen:
                        seen = int(fields[SEQUENCE])
                        self._look_up(seen)

    def _look_up(self, sequence: int) -> None:
        fields = self._fields
        shape = tuple(int(d) for d in fields[SHAPE : SHAPE + fields[NDIM]])
        dtype = DTYPES[fields[DTYPE]]
        x = torch.frombuffer(self._activation, dtype=dtype, count=int(np.prod(shape))).view(shape)
        try:
            found, logits, _ = self._lookups[int(fields[PLAN])][int(fields[EXIT])](x)
            torch.frombuffer(self._found, dtype=torch.bool, count=len(found)).copy_(found)
            torch.frombuffer(self._logits, dtype=logits.dtype, count=logits.numel()).view(logits.shape).copy_(logits)
            fields[OUT_COLUMNS], fields[OUT_DTYPE], fields[FAILED] = logits.shape[1], DTYPES.index(logits.dtype), 0
        except Exception:
            log.exception("lookup %d failed in the lookup process", sequence)
            fields[FAILED] = 1
        fields[DONE] = sequence  # last: it announces the rest


def _cpus_beside(own: set[int]) -> set[int] | None:
    """The CPUs for the lookup process: those this process may use that the worker is not pinned to (None: the
    worker is not pinned, or to every CPU there is; the scheduler places the lookup process)."""
    try:
        every = os.sched_getaffinity(os.getppid())  # the host's: what the worker's CPU list was taken from
    except OSError:
        return None
    beside = every - own
    return beside or None


def _die_with_parent() -> None:
    """Have the kernel kill this process when the worker dies (Linux; elsewhere the parent check does it)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
