"""GATI's early exit inside a worker: the model runs block by block and its learned caches answer rows on the way.

After each block that a composition chose, the block's output goes to that block's cache while the model goes on
with the next block. A row the cache's selector accepts is answered at once with the cache's prediction (its request
is reported to the engine the moment all its rows are answered) and leaves the batch: the next blocks run on the
rows that are left. At most one lookup is in flight, as composition assumed.

Where the lookup runs (`caches.lookup`): the paper gives it its own core (a side stream on GPU), so that a miss
costs the request nothing. `inline` runs each lookup before the next block: every row that reaches an exit pays its
lookup. `process` runs the lookups beside the model: the worker's thread hands the batch to a model process on
another core (`model_process`), which runs the chain; the worker's thread runs the blocks up to the first exit as
well, then consults each exit's cache on its output as it comes; a hit is answered the moment its lookup ends, and
the model process drops answered rows at its next block boundary (it stops once every row is answered). A batch that
finds the model process still finishing an abandoned batch runs inline. Earlier forms that moved the lookups instead
(a lookup thread, a lookup process, torch's inter-op pool) acted on a hit a block late, and a model thread inside
the worker paid the GIL at every hand-off: each lost to inline on 2 and on 16 cores. `stream`, on a GPU, needs no
second process: kernels are launched asynchronously, so after an exit the worker's thread launches the lookup on a
side stream (after the block's output, by an event), launches the next block on the worker's stream, and only then
waits for the lookup's flags; its hits leave the batch before the block after that is launched. The GPU runs the
lookup beside the next block, and a hit is acted on one block ahead of where it was found (that block's work on the
answered rows is wasted, not their time). `auto`, the default, is inline on both: it takes no second core, and on an
H100 it beat `stream` (1.15 ms against 1.60 ms mean on the benchmark ResNet-style CNN at batch 1): there each block
is a dozen small kernels, the cost is the CPU's launches, not the GPU's work, and a side stream hides only the GPU's
(`benchmarks/README.md` §4). Either way a lookup is its cache as one TorchScript graph (`LearnedCache.scripted`),
and a hit's bookkeeping is a few operations (see `_Pass`): right after a block every small operator costs several
times what it does back to back.

With `cuda_graphs` on a GPU, the blocks between two exits run as one CUDA graph per batch size (`segments`): the
exit check sits between two replays, the rows still in the batch replay the smallest graph that holds them, and a
batch whose rows all exited replays no more. On the CPU (and on a GPU without graphs) the blocks run eagerly.

The worker runs every row through this chain, the rows with `early_exit: false` too (all blocks, no lookup): one
execution path. A small `verify_fraction` of hits is answered from the cache and also run to the end, so the live
agreement with the base model is counted.

The host loads everything once (`EarlyExit.load`) before forking workers (on a GPU, before starting its worker
threads, each of which takes its own `for_worker` copy: its counts and its side stream); a worker forks its model
process at the end of its warm-up. A cache set that cannot
serve (missing, corrupt, built for other blocks or another artifact) is reported, and the model serves whole.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from adaserve.adaptive.gati.blocks import BlockChain, split_model
from adaserve.adaptive.gati.cacheset import CacheSetError, LearnedCache, load_cache_set
from adaserve.adaptive.gati.model_process import ModelProcess, ModelProcessDied, Sizes, supported
from adaserve.adaptive.gati.requests import exit_target
from adaserve.adaptive.gati.segments import Segments
from adaserve.config import Lookup, ModelConfig
from adaserve.engine.messages import ExitCounts, RowParameters
from adaserve.engine.stats import ExitStats
from adaserve.engine.worker import Answer
from adaserve.errors import ConfigError
from adaserve.repository import ModelSpec, weight_bytes

__all__ = ["EarlyExit", "ExitPlan", "Lookup"]

log = logging.getLogger("adaserve.gati")

#: A lookup under way on the side stream: the exit's block index, its output, and the lookup's flags and logits.
_Looking = tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]

#: Calls of each scripted lookup at warm-up: TorchScript profiles the first runs of a graph and optimizes it after.
WARM_UP_LOOKUPS = 3


@dataclass(frozen=True, eq=False)
class ExitPlan:
    """A composition as the worker runs it: block index → the cache consulted after that block, and beside it the
    cache as the one TorchScript graph a lookup runs (`LearnedCache.scripted`)."""

    target: float
    caches: dict[int, LearnedCache]
    lookups: dict[int, torch.jit.ScriptModule] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "lookups", {index: cache.scripted() for index, cache in self.caches.items()})


class EarlyExit:
    """Runs a batch's rows through the block chain with the plans' caches (see the module docstring)."""

    def __init__(
        self,
        chain: BlockChain,
        plans: Sequence[ExitPlan],
        verify_fraction: float,
        description: str,
        lookup: Lookup = "inline",
        device: torch.device | None = None,
        segments: Segments | None = None,
    ) -> None:
        self.chain = chain
        self.segments = segments or Segments(chain)  # eager, unless a GPU worker's graphs (`for_worker`)
        self.lookup = lookup
        self.device = device or torch.device("cpu")
        self.plans = sorted(plans, key=lambda plan: plan.target)
        last = len(chain.blocks) - 1  # a cache after the last block is never consulted: the model's answer is there
        self._exits = {plan: tuple(sorted(i for i in plan.lookups if i != last)) for plan in self.plans}
        self.default_target = plans[0].target  # the config's first target
        self.verify_fraction = verify_fraction
        self.description = description
        self._running: Lookup = "inline"  # where lookups run now (`start_lookups`, in the worker)
        self._ahead: ModelProcess | None = None  # with `process`; started in the worker, after the fork
        self._side: torch.cuda.Stream | None = None  # with `stream` on a GPU (on CPU the same order runs in turn)
        self._rng = np.random.default_rng()
        self._counts: dict[float, ExitStats] = {}  # by plan target, since the last `take_counts`

    @classmethod
    def load(cls, config: ModelConfig, artifact: Path, stored: Any, device: torch.device | None = None) -> EarlyExit:
        """The model's chain (from the artifact as stored, `read_artifact`, on `device` already) with the caches of
        every configured target's composition loaded onto `device`; ConfigError naming the cause when the caches
        cannot serve it."""
        spec = config.caches
        assert spec is not None
        device = device or torch.device("cpu")
        if len(config.inputs) != 1 or len(config.outputs) != 1:
            raise ConfigError("learned caches serve models with one input and one output")
        chain = split_model(stored, spec.blocks)
        model = ModelSpec(config=config, version=int(artifact.parent.name), artifact=artifact, versions=())
        cache_set = load_cache_set(model, spec.version)
        if cache_set.manifest.blocks != chain.names:
            raise CacheSetError(
                f"{cache_set.directory}: built for blocks {list(cache_set.manifest.blocks)}, but the model is split "
                f"into {list(chain.names)}"
            )
        classes = config.outputs[0].row_shape
        if classes != (cache_set.manifest.num_classes,):
            raise CacheSetError(
                f"{cache_set.directory}: caches predict {cache_set.manifest.num_classes} classes, the output rows "
                f"are {list(classes)}"
            )
        plans = []
        for target in spec.targets:
            composition = cache_set.composition(target)
            caches = [cache.to(device) for cache in cache_set.caches(composition)]
            plans.append(ExitPlan(target, {cache.exit.block_index: cache for cache in caches}))
        exits = "; ".join(
            f"target {plan.target}: after {', '.join(chain.names[i] for i in sorted(plan.caches)) or 'no block'}"
            for plan in plans
        )
        description = f"cache set v{cache_set.version} ({exits})"
        return cls(chain, plans, spec.verify_fraction, description, spec.lookup_at, device)

    def seed(self, seed: int) -> None:
        """Draw the hits that are verified reproducibly from here on, as a benchmark comparing runs on the same rows
        needs: the draws decide which rows the trigger's verified agreement counts (a server draws afresh)."""
        self._rng = np.random.default_rng(seed)

    def for_worker(self, batch: int | None = None, stream: torch.cuda.Stream | None = None) -> EarlyExit:
        """A copy for one worker thread of a GPU host: the same chain and caches, its own counts and side stream,
        and with `batch`, its own segments padded to the sizes a worker of that granularity captures (CUDA graphs
        captured on `stream`; without one, the CPU's eager stand-in)."""
        segments = Segments(self.chain, batch, stream) if batch is not None else None
        return EarlyExit(
            self.chain, self.plans, self.verify_fraction, self.description, self.lookup, self.device, segments
        )

    @property
    def cache_bytes(self) -> int:
        """Parameters of every loaded cache (a cache two targets share is counted once)."""
        caches = {id(cache): cache for plan in self.plans for cache in plan.caches.values()}
        return sum(weight_bytes(cache) for cache in caches.values())

    # -- in the worker ---------------------------------------------------------------------------------------
    def warm_up(self, rows: int, row_shape: tuple[int, ...], dtype: torch.dtype) -> None:
        """Run the chain on zeros of a `rows`-row batch, and every plan's lookups a few times; then start the lookups
        where the config asks (a model process holds what this batch's largest outputs need)."""
        zeros = torch.zeros((rows, *row_shape), dtype=dtype, device=self.device)
        row_bytes = self.chain.run(zeros)[0].nbytes
        for plan in self.plans:
            for index, lookup in plan.lookups.items():
                activation = self.chain.run(zeros, 0, index + 1)
                for _ in range(WARM_UP_LOOKUPS):
                    lookup(activation)
                    lookup(activation[:1])  # batch 1 too: a new shape's first call costs about a millisecond
                row_bytes = max(row_bytes, activation[0].nbytes)
        if self.segments.batch is not None:  # capture every segment a batch can replay now, not on a request
            overlapped = self.lookup == "stream"
            blocks = len(self.chain.blocks)
            for exits in [(), *self._exits.values()]:
                x = zeros
                for start, stop in spans(exits, blocks, overlapped):
                    x = self.segments.run(x, start, stop)
        reports = max(len(plan.caches) for plan in self.plans)  # the exits after the first, and the last block
        self.start_lookups(self.lookup, Sizes(rows, row_bytes, reports))

    @property
    def model_process_pid(self) -> int | None:
        """The model process's pid, while lookups run beside it (`process`)."""
        return self._ahead.pid if self._ahead is not None else None

    @property
    def lookups_run(self) -> Lookup:
        """Where lookups run now (after `start_lookups`)."""
        return self._running

    def start_lookups(self, lookup: Lookup, sizes: Sizes | None = None) -> None:
        """Lookups beside the model (with a model process whose buffers hold `sizes`, or on a side stream) or
        inline; in the worker, after the fork (on a GPU, in the worker's thread)."""
        self.stop_lookups()
        if lookup == "process" and not supported():
            log.warning("caches.lookup: process needs an x86 CPU; lookups run inline")
            lookup = "inline"
        self._running = lookup
        if lookup == "process":
            if sizes is None:
                raise ValueError("a model process needs the sizes of the batch it serves (see warm_up)")
            self._ahead = ModelProcess(self.chain, sizes)
        self._side = torch.cuda.Stream(self.device) if lookup == "stream" and self.device.type == "cuda" else None

    def stop_lookups(self) -> None:
        """End the model process, if there is one; lookups run inline until `start_lookups`."""
        if self._ahead is not None:
            self._ahead.close()
        self._ahead, self._running = None, "inline"

    def take_counts(self) -> list[ExitCounts]:
        """What the caches did since the last call, per target whose plan ran rows."""
        counts, self._counts = self._counts, {}
        return [stats.message(target) for target, stats in sorted(counts.items())]

    def run(
        self,
        inputs: torch.Tensor,
        outputs: np.ndarray,
        requests: Sequence[RowParameters],
        answer: Answer,
    ) -> list[RowParameters]:
        """Compute a batch's rows (`inputs` its slice of the input ring, on the model's device; `outputs` its slice
        of the pool's output ring; `requests` each request's rows and parameters); requests answered early go to
        `answer`; returns the response parameters of the others."""
        ahead = self._ahead
        if ahead is not None:
            try:
                ahead.begin()  # wakes it if need be; a dead one is found here, no waitpid needed
            except ModelProcessDied as died:
                log.error("%s; lookups run inline from now on", died)
                self.stop_lookups()
                ahead = None
        try:
            groups: dict[ExitPlan | None, list[RowParameters]] = {}
            for request in requests:
                groups.setdefault(self._plan(exit_target(request.values, self.default_target)), []).append(request)
            responses: list[RowParameters] = []
            for plan, members in groups.items():
                whole = len(members) == len(requests)  # every row: use the pool's slices as they are, no gather
                if whole:
                    rows, x = np.arange(len(inputs)), inputs
                else:
                    rows = np.concatenate([np.arange(r.offset, r.offset + r.rows) for r in members])
                    x = inputs[torch.from_numpy(rows).to(inputs.device)]
                if plan is None:
                    result = self.segments.run(x, 0, len(self.chain.blocks))
                    _write(outputs, slice(None) if whole else rows, result)
                    continue
                responses += _Pass(self, plan, rows, members, outputs, answer).run(x)
            return responses
        finally:
            if ahead is not None:
                ahead.end()

    def _plan(self, target: float | None) -> ExitPlan | None:
        """The plan for the least target at or above the asked one (the highest when none is that high)."""
        if target is None:
            return None
        return next((plan for plan in self.plans if plan.target >= target), self.plans[-1])


class _Pass:
    """One group of a batch's rows through the chain with one plan; the bookkeeping of who is answered.

    It is kept to few operations: at batch 1 a lookup and its bookkeeping follow a block, where every small operator
    runs several times slower than back to back (on the ResNet-style benchmark CNN the bookkeeping of a hit took
    0.23 ms when each row carried arrays of its state; `benchmarks/README.md` §4). So the per-row state is built on
    the first hit that leaves rows behind, and a hit of every row left, batch 1's only kind, needs none of it."""

    def __init__(
        self,
        runtime: EarlyExit,
        plan: ExitPlan,
        rows: np.ndarray,
        requests: list[RowParameters],
        outputs: np.ndarray,
        answer: Answer,
    ) -> None:
        self.runtime = runtime
        self.plan = plan
        self.rows = rows  # batch row of each row of this pass
        self.outputs = outputs
        self.answer = answer
        self.requests = requests
        self.exits = runtime._exits[plan]  # the blocks whose caches are consulted, in order
        # the segments run between two exit checks: with lookups on the side stream, the block after an exit alone
        self.spans = spans(self.exits, len(runtime.chain.blocks), runtime._running == "stream")
        self.open_rows = [r.rows for r in requests]  # rows not answered yet, per request
        self.deepest = [-1] * len(requests)  # deepest exit block of each request's answered rows
        self.verify_label: dict[int, int] = {}  # row → the cache's class, for rows answered and still running
        counts = runtime._counts.get(plan.target)
        if counts is None:
            counts = runtime._counts[plan.target] = ExitStats()
        self.counts = counts

    @functools.cached_property
    def owner(self) -> np.ndarray:
        """The request of each row."""
        return np.repeat(np.arange(len(self.requests)), [r.rows for r in self.requests])

    def run(self, x: torch.Tensor) -> list[RowParameters]:
        alive = np.arange(len(self.rows))  # rows of this pass still in the batch, in x's order
        ahead = self.runtime._ahead
        if ahead is not None and self.exits and ahead.idle():
            return self._beside(ahead, x, alive)
        return self._from(0, x, alive)

    def _from(self, start: int, x: torch.Tensor, alive: np.ndarray) -> list[RowParameters]:
        """Blocks `start`… (an exit's next block, or 0) on `x` (`alive`: the rows of this pass still in the batch,
        in x's order) on this thread, segment by segment, each lookup inline or on the side stream."""
        segments, last = self.runtime.segments, len(self.runtime.chain.blocks) - 1
        for begin, stop in self.spans:
            if begin < start:
                continue
            x, index = segments.run(x, begin, stop), stop - 1
            if index == last:
                break
            if self.runtime._running == "stream":
                return self._overlapped(index, x, alive)
            x, alive = _leave(x, alive, self._look_up(index, self.plan.lookups[index], x, alive))
            if not len(alive):
                return []  # every row is answered: the blocks left would run on an empty batch
        return self._finish(x, alive)

    def _beside(self, ahead: ModelProcess, inputs: torch.Tensor, every: np.ndarray) -> list[RowParameters]:
        """The model process runs the chain while this thread runs it up to the first exit too and consults that
        exit's cache, then each later exit's as its output comes back; `mark` tells the model process which rows
        left. The first exit's blocks run twice, on two cores: so a row that hits there is answered as fast as
        inline (most hits are at the first exit), and the model process is ahead by the lookup for the rest."""
        chain, last = self.runtime.chain, len(self.runtime.chain.blocks) - 1
        first, later = self.exits[0], self.exits[1:]
        job = ahead.start(inputs, 0, later)
        answered, index, alive = job.answered, first, every
        x = chain.run(inputs, 0, first + 1)
        try:
            while True:
                if index == last:
                    return self._finish(x, alive)
                stay = self._look_up(index, self.plan.lookups[index], x, alive)
                if stay is not None:
                    job.mark(alive[~stay])
                    if answered.all():
                        return []
                index, x, alive = job.next()
                if job.marked:  # rows answered since the model process dropped some
                    x, alive = _leave(x, alive, ~answered[alive])
        except ModelProcessDied as died:  # the rows left go on here, and later batches inline
            log.error("%s; lookups run inline from now on", died)
            self.runtime.stop_lookups()
            return self._from(index + 1, *_leave(x, alive, ~answered[alive]))
        finally:
            job.cancel()

    def _overlapped(self, first: int, x: torch.Tensor, alive: np.ndarray) -> list[RowParameters]:
        """From the first exit on (block `first`, output `x`), lookups on the side stream: each exit's lookup is
        launched there, the next block on the worker's stream, and the lookup's hits leave the batch before the
        block after that is launched."""
        segments, last, side = self.runtime.segments, len(self.runtime.chain.blocks) - 1, self.runtime._side
        looking: _Looking | None = self._launch(first, x, side)
        for begin, stop in self.spans:
            if begin <= first:
                continue
            x, index = segments.run(x, begin, stop), stop - 1
            if looking is not None:
                exit_index, _, found, logits = looking
                with torch.cuda.stream(side):  # None (CPU): no stream to switch to
                    x, alive = _leave(x, alive, self._take_hits(exit_index, found, logits, alive))
                looking = None
                if not len(alive):
                    return []
            if index == last:
                break
            if index in self.plan.lookups:
                looking = self._launch(index, x, side)
        return self._finish(x, alive)

    def _launch(self, index: int, x: torch.Tensor, side: torch.cuda.Stream | None) -> _Looking:
        """Block `index`'s lookup on its output `x`: (index, x, found, logits), launched on the side stream once the
        block is done (x is kept with them: the side stream reads it until the flags are in); on CPU, run at once."""
        lookup = self.plan.lookups[index]
        if side is not None:
            side.wait_stream(torch.cuda.current_stream(side.device))
        with torch.cuda.stream(side):
            found, logits, _ = lookup(x)
        return index, x, found, logits

    def _look_up(
        self, index: int, lookup: torch.jit.ScriptModule, activation: torch.Tensor, alive: np.ndarray
    ) -> np.ndarray | None:
        """Consult the cache after block `index` and take its hits."""
        found, logits, _ = lookup(activation)
        return self._take_hits(index, found, logits, alive)

    def _take_hits(self, index: int, found: torch.Tensor, logits: torch.Tensor, alive: np.ndarray) -> np.ndarray | None:
        """Answer the hits of block `index`'s lookup (`found`, `logits`: of the rows `alive`) at once; return which
        of `alive` stay in the batch (None: all of them, the common case, which then costs no copy). Rows answered
        already (hits kept running to verify them) are not counted again."""
        name = self.runtime.chain.names[index]
        looked_up = len(alive) - len(self.verify_label)
        self.counts.lookups[name] += looked_up
        flags = found.tolist()  # a list, not numpy: a miss, the common case, costs least
        if self.verify_label:  # only then can a row in the batch be answered already
            flags = [flag and int(row) not in self.verify_label for flag, row in zip(flags, alive, strict=True)]
        hits = sum(flags)
        if not hits:
            return None
        hit = np.array(flags, dtype=bool)
        self.counts.hits[name] += hits
        if hits == looked_up and not self.runtime.verify_fraction:
            # every row left hits: its requests are all answered, no per-row bookkeeping
            _write(self.outputs, self.rows[alive], logits)
            self._answer_all(index)
            return np.zeros(len(alive), dtype=bool)
        keep = ~hit
        if self.runtime.verify_fraction:
            self._verify_some(np.flatnonzero(hit), alive, logits, keep)
        leaving = alive[hit]
        _write(self.outputs, self.rows[leaving], logits[torch.from_numpy(hit)])
        done = []
        for row in leaving:
            request = int(self.owner[row])
            self.open_rows[request] -= 1
            self.deepest[request] = max(self.deepest[request], index)
            if self.open_rows[request] == 0:
                done.append(self._response(request))
        if done:
            self.answer(done)
        return keep

    def _answer_all(self, index: int) -> None:
        """Every request with rows still open is answered by the cache after block `index`."""
        done = []
        for request, open_rows in enumerate(self.open_rows):
            if open_rows:
                self.open_rows[request] = 0
                self.deepest[request] = max(self.deepest[request], index)
                done.append(self._response(request))
        self.answer(done)

    def _verify_some(self, positions: np.ndarray, alive: np.ndarray, logits: torch.Tensor, keep: np.ndarray) -> None:
        """Draw the hits (at `positions` of `alive`, `logits` every looked-up row's) that also run to the end, to
        measure the live agreement: they stay in `keep`, and the class the cache answered is remembered."""
        drawn = self.runtime._rng.random(len(positions)) < self.runtime.verify_fraction
        if not drawn.any():
            return
        labels = logits.argmax(1).cpu().numpy()
        for position in positions[drawn]:
            self.verify_label[int(alive[position])] = int(labels[position])
        keep[positions[drawn]] = True

    def _finish(self, x: torch.Tensor, alive: np.ndarray) -> list[RowParameters]:
        """Write the rows that ran to the end; count the verified ones; the responses of requests not yet answered.
        With no row left, `x` is where the loop stopped (not the model's output) and there is nothing to write."""
        if not len(alive):
            return []
        if self.verify_label:
            running = np.array([int(row) not in self.verify_label for row in alive])
            _write(self.outputs, self.rows[alive[running]], x[torch.from_numpy(running)])
            labels = x.argmax(1).cpu().numpy()
            for position, row in enumerate(alive):
                if int(row) in self.verify_label:
                    self.counts.verified += 1
                    self.counts.agreed += int(labels[position] == self.verify_label[int(row)])
            self.counts.whole += int(running.sum())
        else:
            _write(self.outputs, self.rows[alive], x)
            self.counts.whole += len(alive)
        return [self._response(i) for i, open_rows in enumerate(self.open_rows) if open_rows > 0]

    def _response(self, request: int) -> RowParameters:
        """`exit_block`: where the request's answer came from (the last block when any row ran to the end);
        `exited_rows`: its rows a cache answered."""
        names, rows = self.runtime.chain.names, self.requests[request].rows
        exited = rows - self.open_rows[request]
        block = names[self.deepest[request]] if exited == rows else names[-1]
        return RowParameters(self.requests[request].offset, rows, {"exit_block": block, "exited_rows": exited})


@functools.cache
def spans(exits: tuple[int, ...], blocks: int, overlapped: bool) -> tuple[tuple[int, int], ...]:
    """The segments [start, stop) a pass runs over a chain of `blocks` blocks with lookups after `exits`: up to each
    exit, then to the end; `overlapped` (lookups on the side stream) runs the block after each exit alone, so the
    lookup's hits leave the batch after it, as they do block by block."""
    cuts = {index + 1 for index in exits} | ({index + 2 for index in exits} if overlapped else set())
    ends = sorted({cut for cut in cuts if cut < blocks} | {blocks})
    return tuple(zip([0, *ends[:-1]], ends, strict=True))


def _leave(x: torch.Tensor, alive: np.ndarray, keep: np.ndarray | None) -> tuple[torch.Tensor, np.ndarray]:
    """The batch without the rows a lookup answered (`keep`: the rows that stay; None: all)."""
    if keep is None or keep.all():
        return x, alive
    return x[torch.from_numpy(keep)], alive[keep]


def _write(outputs: np.ndarray, rows: np.ndarray | slice, values: torch.Tensor) -> None:
    """Rows of the output ring; a cache's or the model's logits must have the output's row shape."""
    expected = outputs.shape[1:]
    if tuple(values.shape[1:]) != expected:
        raise ValueError(f"the model returned rows shaped {list(values.shape[1:])}, the output's are {list(expected)}")
    outputs[rows] = values.detach().cpu().numpy()
