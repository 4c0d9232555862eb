"""The stretches of a block chain that GATI runs between two exit checks, each as one call.

Eager (the CPU's path, and a GPU's without `cuda_graphs`), a segment is its blocks in turn. With CUDA graphs, each
segment is captured per batch size (`streams.GraphedForward`: the powers of two up to the worker's granularity), so
a GPU worker replays one graph per segment and checks its exit between replays; a segment's rows are copied into the
smallest graph that holds them, so once rows have left at an exit the next segment replays a smaller graph. On the
CPU the same padding runs eagerly (`streams.PaddedForward`), which lets the tests check the graphs' bookkeeping
against the eager chain without a GPU.
"""

from __future__ import annotations

import functools

import torch

from adaserve.adaptive.gati.blocks import BlockChain
from adaserve.engine.streams import GraphedForward, PaddedForward

__all__ = ["Segments"]


class Segments:
    """Blocks [start, stop) of `chain` as one call: eager when `batch` is None, else padded to the sizes a worker of
    granularity `batch` captures, replayed as CUDA graphs captured on `stream` when one is given."""

    def __init__(self, chain: BlockChain, batch: int | None = None, stream: torch.cuda.Stream | None = None) -> None:
        self.chain = chain
        self.batch = batch
        self.stream = stream
        self._padded: dict[tuple[int, int], PaddedForward] = {}

    def run(self, x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        if self.batch is None:
            return self.chain.run(x, start, stop)
        padded = self._padded.get((start, stop))
        if padded is None:
            forward = functools.partial(self.chain.run, start=start, stop=stop)
            padded = (
                GraphedForward(forward, self.batch, self.stream) if self.stream else PaddedForward(forward, self.batch)
            )
            self._padded[(start, stop)] = padded
        return padded(x)[0]
