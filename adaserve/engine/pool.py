"""Ebird's input pool in its CPU form: per model, a ring of fixed-size slots in shared memory.

A request's rows are copied into contiguous slots the moment it arrives; a worker reads its batch as a slice of
the ring in place (no per-batch concatenation), and writes its outputs into the same slots of the output ring.

The memory is one anonymous `memfd` per model, passed to worker processes by file descriptor: nothing is named
in /dev/shm, so nothing leaks when the server is killed, and a restarted worker maps the same memory again.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from dataclasses import dataclass

import numpy as np

from adaserve.config import DATATYPES, ModelConfig, TensorSpec


@dataclass(frozen=True)
class TensorRegion:
    """Where one tensor's ring lives inside the shared memory."""

    name: str
    datatype: str
    row_shape: tuple[int, ...]
    offset: int
    row_bytes: int


@dataclass(frozen=True)
class PoolLayout:
    """The byte layout both sides compute from the same config, so only the fd crosses the process boundary."""

    slots: int
    inputs: tuple[TensorRegion, ...]
    outputs: tuple[TensorRegion, ...]
    size: int

    @classmethod
    def for_config(cls, config: ModelConfig, slots: int) -> PoolLayout:
        offset = 0
        regions: list[list[TensorRegion]] = [[], []]
        for kind, specs in enumerate((config.inputs, config.outputs)):
            for spec in specs:
                regions[kind].append(_region(spec, offset))
                offset += _align(spec.row_bytes * slots)
        return cls(slots=slots, inputs=tuple(regions[0]), outputs=tuple(regions[1]), size=max(offset, 1))


def _region(spec: TensorSpec, offset: int) -> TensorRegion:
    return TensorRegion(spec.name, spec.datatype, spec.row_shape, offset, spec.row_bytes)


def _align(nbytes: int, to: int = 64) -> int:
    return (nbytes + to - 1) // to * to


class SharedRings:
    """numpy views of every tensor's ring over one shared mapping; the same class serves the server and workers."""

    def __init__(self, layout: PoolLayout, fd: int) -> None:
        self.layout = layout
        self._map = mmap.mmap(fd, layout.size)
        self.inputs = [self._view(r) for r in layout.inputs]
        self.outputs = [self._view(r) for r in layout.outputs]

    @classmethod
    def create(cls, layout: PoolLayout, label: str) -> tuple[SharedRings, int]:
        """Make the anonymous shared memory; returns the rings and the fd to hand to workers."""
        fd = os.memfd_create(f"adaserve-{label}", flags=0)
        os.ftruncate(fd, layout.size)
        return cls(layout, fd), fd

    def _view(self, region: TensorRegion) -> np.ndarray:
        dtype = DATATYPES[region.datatype]
        count = self.layout.slots * region.row_bytes // dtype.itemsize
        flat = np.frombuffer(self._map, dtype=dtype, count=count, offset=region.offset)
        return flat.reshape((self.layout.slots, *region.row_shape))

    def close(self) -> None:
        self.inputs.clear()
        self.outputs.clear()
        with contextlib.suppress(BufferError):  # a view is still alive somewhere; the mapping goes with the process
            self._map.close()


class SlotRing:
    """Which slots are in use, and contiguous allocation with ring order (pure logic, no memory).

    Allocation starts at the head and wraps; a run that would cross the end starts again at slot 0. Slots are freed
    out of order (workers finish out of order), so allocation looks for the next free run from the head. When the
    last slot in use is freed the head goes back to slot 0: under light load requests keep to the first slots, whose
    pages are resident and warm in cache, where the ring's later slots may never have been touched. A first touch of
    the pool's shared memory costs a page fault and the kernel clearing the page: a 3 MiB row took 1.9 ms to copy
    into untouched slots and 0.12 ms into touched ones, and with a ring of thousands of slots every request of a
    light load landed on untouched ones (`benchmarks/shared_memory.py`).
    """

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._used = bytearray(slots)
        self._head = 0
        self.in_use = 0

    def allocate(self, rows: int) -> int | None:
        """The first slot of `rows` contiguous free slots, or None when no such run exists now."""
        if rows > self.slots or self.in_use + rows > self.slots:
            return None
        start = self._find_run(self._head, rows)
        if start is None:
            return None
        self._used[start : start + rows] = b"\x01" * rows
        self.in_use += rows
        self._head = (start + rows) % self.slots
        return start

    def free(self, start: int, rows: int) -> None:
        self._used[start : start + rows] = bytes(rows)
        self.in_use -= rows
        if not self.in_use:
            self._head = 0

    def _find_run(self, begin: int, rows: int) -> int | None:
        start = begin if begin + rows <= self.slots else 0
        scanned = 0
        while scanned < self.slots + rows:
            busy = self._used.find(1, start, start + rows)
            if busy < 0:
                return start
            scanned += busy + 1 - start
            start = busy + 1
            if start + rows > self.slots:
                scanned += self.slots - start
                start = 0
        return None
