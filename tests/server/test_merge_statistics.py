"""Statistics of several replicas as one (`merge_statistics`): what any node of a cluster answers."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from adaserve.engine.stats import ModelStats
from adaserve.server.documents import merge_statistics, model_statistics

KINDS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")


def _row(name: str, last: int, count: int, batches: dict[int, int]) -> dict[str, Any]:
    """A replica's row: `count` requests of 10 ns each, every kind alike; `batches`: batch size → batches."""
    each = {"count": count, "ns": 10 * count}
    return {
        "name": name,
        "version": "1",
        "last_inference": last,
        "inference_count": count,
        "execution_count": sum(batches.values()),
        "inference_stats": {kind: dict(each) for kind in KINDS},
        "batch_stats": [
            {
                "batch_size": size,
                "compute_input": {"count": n, "ns": 0},
                "compute_infer": {"count": n, "ns": 5 * n},
                "compute_output": {"count": n, "ns": 0},
            }
            for size, n in sorted(batches.items())
        ],
    }


def test_replicas_of_one_model_add_up_and_the_latest_inference_wins() -> None:
    first, second, other = _row("m", 100, 3, {1: 1, 4: 2}), _row("m", 250, 5, {2: 1, 4: 1}), _row("n", 7, 1, {1: 1})
    merged = merge_statistics([first, other, second])
    assert [row["name"] for row in merged] == ["m", "n"]
    assert merged[1] == other
    assert merged[0]["last_inference"] == 250
    assert merged[0]["inference_count"] == 8 and merged[0]["execution_count"] == 5
    assert merged[0]["inference_stats"] == {kind: {"count": 8, "ns": 80} for kind in KINDS}
    infer = {entry["batch_size"]: entry["compute_infer"] for entry in merged[0]["batch_stats"]}
    assert infer == {1: {"count": 1, "ns": 5}, 2: {"count": 1, "ns": 5}, 4: {"count": 3, "ns": 15}}
    assert first == _row("m", 100, 3, {1: 1, 4: 2})  # the rows given are left as they were


def test_a_model_s_row_is_a_snapshot_whose_compute_counts_agree_while_requests_go_on() -> None:
    """A cluster node awaits the other nodes' rows before it merges its own: a row holding the live counts would
    have compute_infer ahead of compute_input and compute_output, which perf_analyzer aborts on."""
    stats = ModelStats()
    stats.record_batch(2, 100)
    stats.record_request(ok=True, total_ns=300, queue_ns=50)
    engine: Any = SimpleNamespace(stats=stats, model=SimpleNamespace(name="m", version=1))
    row = model_statistics(engine)
    stats.record_batch(1, 70)  # requests answered while the other nodes are asked
    stats.record_request(ok=True, total_ns=200, queue_ns=10)
    (merged,) = merge_statistics([row, _row("m", 5, 1, {1: 1})])
    counts = {kind: merged["inference_stats"][kind]["count"] for kind in KINDS}
    assert counts["compute_input"] == counts["compute_infer"] == counts["compute_output"] == 2
    assert counts["success"] == counts["queue"] == 2 and merged["inference_stats"]["compute_infer"]["ns"] == 110
