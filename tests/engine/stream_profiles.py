"""Hand-written stream profiles shaped like a GPU's, for the chooser's and the planner's tests."""

from __future__ import annotations

from collections.abc import Callable

from adaserve.cpu.profiler import ProfileSettings, Stability
from adaserve.engine.stream_profile import StreamCell, StreamKey, StreamProfile

KEY = StreamKey(device="NVIDIA H200", torch="2.11.0+cu130", artifact_sha256="0" * 64, cuda_graphs=True)
SETTLED = Stability(trials=3, spread_pct=1.0, stable=True)


def profile_of(
    latency_ms: Callable[[int, int], float], streams: int = 4, batches: tuple[int, ...] = (1, 2, 4, 8)
) -> StreamProfile:
    """A profile whose cell ⟨s, b⟩ took `latency_ms(s, b)`."""
    cells = [
        StreamCell(
            streams=s,
            batch=b,
            mean_s=latency_ms(s, b) / 1e3,
            p50_s=latency_ms(s, b) / 1e3,
            std_s=0.0,
            runs=60,
            stability=SETTLED,
        )
        for s in range(1, streams + 1)
        for b in batches
    ]
    return StreamProfile(
        key=KEY,
        model="resnet50",
        version=1,
        created="2026-12-01T00:00:00+00:00",
        settings=ProfileSettings(),
        streams=tuple(range(1, streams + 1)),
        batches=batches,
        cells=tuple(cells),
    )


def gpu_like(streams: int, batch: int) -> float:
    """One stream's batch takes 1 ms up to a knee at 4 rows, 1.6 ms at 8; side by side, streams overlap until the
    SMs are full at 5 rows a millisecond (0.2 ms a row)."""
    alone = 1.0 if batch <= 4 else 1.6
    return max(alone, 0.2 * streams * batch)
