"""Ebird's GPU worker set and MaxInf chosen from the GPU's stream profile (`adaserve.engine.stream_profile`).

A candidate is s streams of granularity b (MaxInf s·b): at high load every stream runs a batch of b beside s − 1
others, so it computes s·b / L(s, b) rows a second, where L is the profile's latency. A row that arrives while
every stream is busy waits for a batch to finish and then runs in the next one, so a candidate meets the latency
target when twice its worst batch latency (any cell of at most s streams and b rows: what a mix of smaller batches
runs at) is within it. Of the candidates that meet it, those within `NEAR_BEST` of the best throughput count as
equal (the profile's noise), and the one with the lowest batch latency wins, then the fewest streams.

One granularity for every stream: on a GPU a worker replays the graph that holds its rows, so a stream of
granularity b runs a smaller batch at that batch's cost, and Algorithm 1's liveness rule hands a lone row to an idle
stream at once. If no candidate meets the target, the set is the fastest (the lowest batch latency: one stream of
the smallest batch), and the choice says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from adaserve.config import WorkerSpec
from adaserve.engine.stream_profile import StreamProfile

#: A row's latency at high load, in batch latencies: one to wait for a busy stream, one for its own batch.
WAIT_AND_RUN = 2.0
#: Throughputs within this fraction of the best count as equal; the lower latency wins among them.
NEAR_BEST = 0.95


@dataclass(frozen=True)
class StreamChoice:
    """The streams' granularities (one stream each), MaxInf, what the profile expects of them, and why."""

    granularities: tuple[int, ...]
    max_inflight: int
    latency_s: float  # the worst batch latency of the set at full concurrency
    rows_per_s: float  # its throughput at high load
    meets_target: bool
    reason: str

    @property
    def workers(self) -> tuple[WorkerSpec, ...]:
        return tuple(WorkerSpec(batch=b) for b in self.granularities)


def choose_streams(profile: StreamProfile, target_ms: float) -> StreamChoice:
    """The set and MaxInf of the highest throughput whose high-load latency stays within `target_ms`."""
    if target_ms <= 0:
        raise ValueError(f"the latency target must be positive, got {target_ms} ms")
    worst = {
        (s, b): max(profile.latency_s(s2, b2) for s2 in profile.streams if s2 <= s for b2 in profile.batches if b2 <= b)
        for s in profile.streams
        for b in profile.batches
    }
    rate = {(s, b): s * b / profile.latency_s(s, b) for s, b in worst}
    meeting = [cell for cell, latency in worst.items() if WAIT_AND_RUN * latency * 1e3 <= target_ms]
    if not meeting:
        s, b = min(worst, key=lambda cell: (worst[cell], cell))
        why = (
            f"no set meets the {target_ms:g} ms target (the fastest batch takes {worst[s, b] * 1e3:.3f} ms, "
            f"{WAIT_AND_RUN:g}× that at high load): the fastest set"
        )
        return _choice(s, b, worst, rate, False, why)
    best = max(rate[cell] for cell in meeting)
    near = [cell for cell in meeting if rate[cell] >= NEAR_BEST * best]
    s, b = min(near, key=lambda cell: (worst[cell], cell))
    why = (
        f"the most rows a second ({rate[s, b]:.0f}; within {100 * (1 - NEAR_BEST):g}% of the best) with "
        f"{WAIT_AND_RUN:g}× the batch latency ({worst[s, b] * 1e3:.3f} ms) within the {target_ms:g} ms target"
    )
    return _choice(s, b, worst, rate, True, why)


def _choice(
    streams: int,
    batch: int,
    worst: dict[tuple[int, int], float],
    rate: dict[tuple[int, int], float],
    meets: bool,
    why: str,
) -> StreamChoice:
    return StreamChoice(
        granularities=(batch,) * streams,
        max_inflight=streams * batch,
        latency_s=worst[streams, batch],
        rows_per_s=rate[streams, batch],
        meets_target=meets,
        reason=f"{streams} stream(s) of batch {batch}, MaxInf {streams * batch}: {why}",
    )
